"""A press on a button in Telegram. Under an answer (``fb:up|down:<id>``, ``why:<id>``,
``save:<id>``): only the person who asked may use them; "Why?" and the saved note's link go to
the presser's private chat, and "Save as note" writes only into the presser's current Leanote
user: the one the answer came from. Under ``/gaps`` (``gap:w|x:<id>``) and a note begun for a gap
(``gap:c|s|a:<id>``): ``bot.telegram.gaps``.
Under ``/about`` and ``/related`` (``mem:<verdict>:<id>``):
the presser's own memory, whoever asked; an id of another Leanote user's memory does not
resolve in the presser's, so nothing changes."""

from __future__ import annotations

import asyncio
from contextlib import suppress

from telegram import InlineKeyboardMarkup, Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from rag.answer.feedback import NotYours, UnknownAnswer

from bot.chat.texts import (NO_TRACE_KEPT, REMAPPED_WHY, SAVING, not_saved_text, trace_text, verdict_reply)
from bot.telegram.answering import answer
from bot.telegram.bot import TelegramBot
from bot.telegram.gaps import on_gap_button
from bot.telegram.unasked import on_button as on_unasked_button
from bot.usecases import answers
from bot.usecases.people import Person, person_key

NOT_YOURS = "这是别人的回答 / This is someone else's answer"
EXPIRED = "这个回答已经过期了，请再问一次。 / This answer has expired: ask again."
THANKS = "谢谢 / Thanks"


async def on_button(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    query = update.callback_query
    if (query.data or "").startswith("mem:"):  # under /about or /related
        _, verdict, item_id = query.data.split(":", 2) if query.data.count(":") == 2 else ("", "", "")
        if verdict in ("rejected", "confirmed"):
            await _memory_button(tg, query, verdict, item_id)
        else:
            await query.answer(EXPIRED, show_alert=True)
        return
    if (query.data or "").startswith("nq:"):  # under the reply to a message that asked nothing
        await on_unasked_button(tg, query, query.data[3:])
        return
    if (query.data or "").startswith("gap:"):  # under /gaps, and under the note begun for a gap
        _, act, gap_id = query.data.split(":", 2) if query.data.count(":") == 2 else ("", "", "")
        if act in ("w", "x", "c", "s", "a") and gap_id:
            question = await on_gap_button(tg, query, act, gap_id)
            if question is not None:  # ❓ under a question typed while a draft waited: answered now
                await answer(tg, update, question)
        else:
            await query.answer(EXPIRED, show_alert=True)
        return
    kind, _, answer_id = (query.data or "").rpartition(":")
    if kind not in ("fb:up", "fb:down", "why", "save"):
        await query.answer(EXPIRED, show_alert=True)
        return
    try:
        record = await asyncio.to_thread(answers.pressed, tg.parts, person_key("telegram", query.from_user.id),
                                         answer_id)
    except NotYours:
        await query.answer(NOT_YOURS, show_alert=True)
        return
    except UnknownAnswer:
        await query.answer(EXPIRED, show_alert=True)
        return
    person = tg.presser(query.from_user.id)  # as the config says now
    if not isinstance(person, Person):
        await query.answer(person[:200], show_alert=True)
        return
    try:
        if kind.startswith("fb:"):
            await asyncio.to_thread(answers.rate, tg.parts, person, record, kind[3:])
            await query.answer(THANKS)
        elif kind == "why":
            try:
                why = answers.why(person, record)
            except answers.Remapped:  # another Leanote user's notes now
                await query.answer(REMAPPED_WHY[:200], show_alert=True)
                return
            await tg.to_presser(query, trace_text(why) if why is not None else
                                f"问题 question: {record.question}\n{NO_TRACE_KEPT}")
        else:
            await _save_answer(tg, query, person, record)
    except NotYours:
        await query.answer(NOT_YOURS, show_alert=True)
    except UnknownAnswer:
        await query.answer(EXPIRED, show_alert=True)


async def _save_answer(tg: TelegramBot, query, person: Person, record) -> None:
    why_not = await answers.save_blocked(tg.parts, person, record)
    if why_not is not None:
        text, how = not_saved_text(why_not)
        if how == "alert":
            await query.answer(text[:200], show_alert=True)
        elif how == "brief":
            await query.answer(text)
        else:
            await tg.to_presser(query, text)
        return
    await query.answer(SAVING)
    receipt = await answers.save_answer(tg.parts, person, record)
    await tg.to_presser(query, receipt.message, answered=True)


async def _memory_button(tg: TelegramBot, query, verdict: str, item_id: str) -> None:
    """👍 / 👎 under /about or /related: the presser's own memory, whoever asked."""
    person = tg.presser(query.from_user.id)
    if not isinstance(person, Person):
        await query.answer(person[:200], show_alert=True)
        return
    changed, text = await verdict_reply(tg.parts, person, item_id, verdict)
    await query.answer(text[:200], show_alert=not changed)
    if changed and verdict == "rejected" and query.message is not None:  # its buttons go with it
        markup = query.message.reply_markup
        rows = [[b for b in row if not (b.callback_data or "").endswith(f":{item_id}")]
                for row in (markup.inline_keyboard if markup else ())]
        rows = [r for r in rows if r]
        with suppress(TelegramError):
            await query.edit_message_reply_markup(InlineKeyboardMarkup(rows) if rows else None)
