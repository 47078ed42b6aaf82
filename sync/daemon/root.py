"""The composition root: the one place where leanote-rag's parts are put together.

``services()`` names what ``serve`` runs beside the sync (the chat bots and the file
watcher), ``checks()`` what ``doctor`` asks the bots to check. The bots are imported when
``serve`` or ``doctor`` starts, so a one-shot command does not load the chat libraries.
"""

from __future__ import annotations


def services() -> list:
    """What ``serve`` runs beside the sync: the chat bots and the file watcher."""
    from bot.discord import service as discord
    from bot.telegram import service as telegram
    from sync.watch import watch

    return [telegram, discord, watch]


def checks() -> list:
    """What ``doctor`` asks the bots to check (their tokens, chats, channels)."""
    from bot.discord import check as discord
    from bot.telegram import check as telegram

    return [telegram, discord]
