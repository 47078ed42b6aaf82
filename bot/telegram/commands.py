"""The Telegram commands that are neither a question nor a capture: ``/help``, ``/search``,
``/reset``, ``/why``, ``/web``, ``/status``, ``/sync``, the memory's ``/about``, ``/related``, ``/reject``,
``/confirm``, and the knowledge gaps' ``/gaps``, ``/forget``, ``/digest``. Each asks the person's
session (``bot.session``) and shows what it says: ``/why``, ``/status`` and ``/gaps`` asked in a
group in the person's private chat; the memory's replies where asked (like ``/search``), each fact
or pair with 👍 confirm / 👎 reject buttons (``mem:<verdict>:<id>``); each gap with ✍️ write / ✖
dismiss (``gap:w|x:<id>``). ``on_command`` runs before every command in a private chat: a note
begun with ✍️ is written (``/note text``) or ends."""

from __future__ import annotations

import re

from telegram import Update
from telegram.constants import ChatType
from telegram.ext import ApplicationHandlerStop, ContextTypes

from bot.chat.texts import VERDICT_USAGE, help_for
from bot.session import Session
from bot.chat.words import stranger
from bot.telegram.bot import TelegramBot
from bot.telegram.capturing import after_command, markdown

_NOTE = re.compile(r"^/note(@\w+)?(\s|$)")


async def on_help(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    text = help_for(tg.parts)
    user = update.effective_user
    if user is not None and update.effective_chat.type == ChatType.PRIVATE \
            and not Session(tg.parts, "telegram", user.id).mapped():
        text += "\n\n" + stranger("telegram", user.id)  # /start: a newcomer learns their id
    await tg.reply(update.effective_message, text)


def _words(context: ContextTypes.DEFAULT_TYPE) -> str:
    return " ".join(context.args or [])


async def _run(tg: TelegramBot, update: Update, what: str, *args) -> None:
    """The session's ``what`` for the person here, shown."""
    session = await tg.session(update)
    if session is not None:
        await tg.show(update, await getattr(session, what)(*args))


async def on_search(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _run(tg, update, "search", _words(context))


async def on_reset(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _run(tg, update, "reset")


async def on_why(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _run(tg, update, "why")


async def on_web(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _run(tg, update, "web")


async def on_status(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _run(tg, update, "status")


async def on_sync(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _run(tg, update, "sync")


async def on_about(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _run(tg, update, "about", _words(context))


async def on_related(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _run(tg, update, "related", _words(context))


async def on_reject(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _verdict(tg, update, context, "rejected")


async def on_confirm(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _verdict(tg, update, context, "confirmed")


async def _verdict(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE, verdict: str) -> None:
    session = await tg.session(update)
    if session is None:
        return
    if len(context.args or []) != 1:
        await tg.reply(update.effective_message, VERDICT_USAGE)
        return
    said = await session.verdict(context.args[0], verdict)
    await tg.reply(update.effective_message, said.text)


async def on_gaps(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _run(tg, update, "gaps")


async def on_forget(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _run(tg, update, "forget")


async def on_digest(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """``/digest weekly mon 09:00 [TZ]``, ``daily 08:30``, ``off``; alone: the plan now."""
    private = update.effective_chat.type == ChatType.PRIVATE
    await _run(tg, update, "digest", after_command(update.effective_message.text), private)


async def on_command(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Before every command in a private chat: while a note begun with ✍️ waits, ``/note text``
    is that note (and nothing else runs), any other command ends it (said, then the command
    runs). ``/note`` alone leaves it waiting."""
    user, message = update.effective_user, update.effective_message
    if user is None or message is None or getattr(tg.host, "parts", None) is None:
        return
    session = Session(tg.parts, "telegram", user.id, update.effective_chat.id)
    note = bool(_NOTE.match(message.text or ""))
    text = after_command(markdown(message.text or "", message.entities)) if note else ""
    said, done = await session.command("note" if note else "other", text, once=session.once(message.message_id))
    if said is not None:
        await tg.reply(message, said.text)
    if done:
        raise ApplicationHandlerStop
