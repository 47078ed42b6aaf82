"""The Telegram commands that are neither a question nor a capture: ``/help``, ``/search``,
``/reset``, ``/why``, ``/status``, ``/sync`` and the memory's ``/about``, ``/related``,
``/reject``, ``/confirm``. ``/why`` and ``/status`` asked in a group are answered in the
person's private chat; the memory's replies where asked (like ``/search``), each fact or pair
with 👍 confirm / 👎 reject buttons (``mem:<verdict>:<id>``)."""

from __future__ import annotations

from contextlib import suppress

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.constants import ChatType
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from bot.chat.access import STRANGER
from bot.chat.texts import (ABOUT_USAGE, ADMINS_ONLY, FRESH_START, help_for, RELATED_USAGE, SYNCING, VERDICT_BUTTONS,
                            VERDICT_USAGE, MemoryReply, about_text, cut_message, hits_text, memory_unavailable_text, notes_root,
                            related_text, status_reply, sync_text, trace_text, verdict_reply, with_notice)
from bot.telegram.bot import TelegramBot
from bot.usecases import asking, memory, syncing


async def on_help(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    text = help_for(tg.parts)
    user = update.effective_user
    if user is not None and update.effective_chat.type == ChatType.PRIVATE \
            and tg.access.person("telegram", user.id) is None:
        text += "\n\n" + STRANGER["telegram"].format(id=user.id)  # /start: a newcomer learns their id
    await tg.reply(update.effective_message, text)


async def on_search(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    person = await tg.who(update)
    query = " ".join(context.args or [])
    if person is None:
        return
    if not query.strip():
        await tg.reply(update.effective_message, "用法 usage: /search 关键词")
        return
    if not await tg.may_search(update):
        return
    query, notice = cut_message(tg.host.settings, query)
    found = await asking.search(tg.parts, person, query, 8)
    root = notes_root(tg.host.settings)
    await tg.reply(update.effective_message, with_notice(hits_text(found.hits, query, root), notice))


async def on_reset(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    person = await tg.who(update)
    if person is None:
        return
    asking.reset(tg.parts, person)
    await tg.reply(update.effective_message, FRESH_START)


async def on_why(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    person = await tg.who(update)
    if person is None:
        return
    await tg.privately(update, trace_text(asking.why(tg.parts, person)))


async def on_status(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    person = await tg.who(update)
    if person is None:
        return
    await tg.privately(update, await status_reply(tg.parts, person))


async def on_sync(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    person = await tg.who(update)
    if person is None:
        return
    if not person.admin:
        await tg.reply(update.effective_message, ADMINS_ONLY)
        return
    said = await tg.reply(update.effective_message, SYNCING)
    done = sync_text(await syncing.request_sync(tg.parts, person))  # what the pass did, when it is done
    with suppress(TelegramError):
        await tg.edit(said, done)


# --- the memory of the notes ---------------------------------------------------------------

async def on_about(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _memory(tg, update, "about", " ".join(context.args or []))


async def on_related(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _memory(tg, update, "related", " ".join(context.args or []))


async def _memory(tg: TelegramBot, update: Update, what: str, target: str) -> None:
    """``/about`` or ``/related``: answered where asked (as ``/search``), with the buttons."""
    person = await tg.who(update)
    if person is None:
        return
    message = update.effective_message
    if not target.strip():
        await tg.reply(message, ABOUT_USAGE if what == "about" else RELATED_USAGE)
        return
    try:
        memory.memory_of(tg.parts)
    except memory.MemoryUnavailable as err:
        await tg.reply(message, memory_unavailable_text(err))
        return
    if not await tg.may_search(update):
        return
    target, notice = cut_message(tg.host.settings, target)
    if what == "about":
        reply = about_text(await memory.about(tg.parts, person, target))
    else:
        reply = related_text(await memory.related(tg.parts, person, target))
    await tg.reply(message, with_notice(reply.text, notice), markup=memory_buttons(reply))


def memory_buttons(reply: MemoryReply) -> InlineKeyboardMarkup | None:
    """👍 n confirm / 👎 n reject for each fact or pair with an id (a row each)."""
    if not reply.items:
        return None
    return InlineKeyboardMarkup([[InlineKeyboardButton(f"{icon} {n} {word}", callback_data=f"mem:{verdict}:{item_id}")
                                  for verdict, icon, word in VERDICT_BUTTONS] for n, item_id in reply.items])


async def on_reject(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _verdict(tg, update, context, "rejected")


async def on_confirm(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _verdict(tg, update, context, "confirmed")


async def _verdict(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE, verdict: str) -> None:
    person = await tg.who(update)
    if person is None:
        return
    args = context.args or []
    if len(args) != 1:
        await tg.reply(update.effective_message, VERDICT_USAGE)
        return
    _, text = await verdict_reply(tg.parts, person, args[0], verdict)
    await tg.reply(update.effective_message, text)
