"""The Discord slash commands that are neither a question nor a capture: ``/search``,
``/reset``, ``/status``, ``/sync`` (admins), ``/why``, and the memory's ``/about`` and
``/related`` (each fact or pair with 👍 confirm / 👎 reject buttons). Every reply is ephemeral:
only the asker sees it (and so only they can press its buttons)."""

from __future__ import annotations

import logging

import discord

from bot.chat.texts import (ADMINS_ONLY, FRESH_START, SYNCING, about_text, cut_message, hits_text, notes_root,
                            memory_unavailable_text, related_text, status_reply, sync_text, trace_text, with_notice)
from bot.discord.bot import DiscordBot
from bot.discord.buttons import memory_view
from bot.usecases import asking, memory as memory_case, syncing

log = logging.getLogger(__name__)


async def search(bot: DiscordBot, interaction: discord.Interaction, query: str) -> None:
    person = await bot.person(interaction)
    if person is None:
        return
    if not (query or "").strip():
        await bot.say(interaction, "请写下关键词。 / Please write what to search for.")
        return
    if not await bot.may_search(interaction):
        return
    query, notice = cut_message(bot.host.settings, query)
    await interaction.response.defer(thinking=True, ephemeral=True)
    found = await asking.search(bot.parts, person, query, 8)
    await bot.say(interaction, with_notice(hits_text(found.hits, query, notes_root(bot.host.settings)), notice))


async def reset(bot: DiscordBot, interaction: discord.Interaction) -> None:
    person = await bot.person(interaction)
    if person is None:
        return
    asking.reset(bot.parts, person)
    await bot.say(interaction, FRESH_START)


async def status(bot: DiscordBot, interaction: discord.Interaction) -> None:
    person = await bot.person(interaction)
    if person is None:
        return
    await bot.say(interaction, await status_reply(bot.parts, person))


async def sync(bot: DiscordBot, interaction: discord.Interaction) -> None:
    person = await bot.person(interaction)
    if person is None:
        return
    if not person.admin:
        await bot.say(interaction, ADMINS_ONLY)
        return
    await bot.say(interaction, SYNCING)
    done = sync_text(await syncing.request_sync(bot.parts, person))  # what the pass did, when it is done
    try:
        await bot.edit(interaction, done)
    except discord.HTTPException as err:  # (an interaction's token lasts 15 minutes)
        log.info("could not say what /sync did: %s", err)


async def why(bot: DiscordBot, interaction: discord.Interaction) -> None:
    person = await bot.person(interaction)
    if person is None:
        return
    await bot.say(interaction, trace_text(asking.why(bot.parts, person)))


async def memory(bot: DiscordBot, interaction: discord.Interaction, what: str, target: str) -> None:
    """``/about`` or ``/related`` for the asker's Leanote user, with 👍 / 👎 buttons."""
    person = await bot.person(interaction)
    if person is None:
        return
    try:
        memory_case.memory_of(bot.parts)
        problem = None
    except memory_case.MemoryUnavailable as err:
        problem = memory_unavailable_text(err)
    if problem or not (target or "").strip():
        await bot.say(interaction, problem or "请写下名称或问题。 / Please write a name or a question.")
        return
    if not await bot.may_search(interaction):
        return
    target, notice = cut_message(bot.host.settings, target)
    await interaction.response.defer(thinking=True, ephemeral=True)
    if what == "about":
        reply = about_text(await memory_case.about(bot.parts, person, target))
    else:
        reply = related_text(await memory_case.related(bot.parts, person, target))
    await bot.say(interaction, with_notice(reply.text, notice), view=memory_view(reply) if reply.items else None)
