"""Knowledge gaps in Telegram: ``/gaps`` (in the person's private chat, with ✍️ write / ✖ dismiss
under it: ``gap:w:<id>``, ``gap:x:<id>``), ``/forget``, the note written for a gap (the next text
the person sends in their private chat after ✍️, or their next ``/note``), and a gap a note
answers now, told privately. A press is checked against the presser: another person's gap id,
forged or forwarded, is refused and changes nothing; a press on a gap dismissed or answered
already says so.

The note begun with ✍️ (``bot.usecases.gaps``) says what happens next, with ✖ cancel under it
(``gap:c:<id>``); any other command in the private chat ends it, and says so (``on_command``,
which runs before every command); a question typed while it waits is asked about, with
💾 save as the note (``gap:s:<id>``) and ❓ answer it (``gap:a:<id>``) under the bot's reply to
it: the question's text is read back from that reply's ``reply_to_message`` when pressed."""

from __future__ import annotations

import asyncio
import re

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.constants import ChatType
from telegram.error import Forbidden, TelegramError
from telegram.ext import ApplicationHandlerStop, ContextTypes

from rag.answer.gaps import Draft, GapDone, UnknownGap
from rag.digest_plan import USAGE, plan_text
from rag.errors import UserError

from bot.chat.digest import plan_reply
from bot.chat.gaps import (CANCEL_BUTTON, CONFIRM_BUTTONS, DISMISSED, GAP_BUTTONS, NOT_YOUR_GAP,
                           NOTHING_WAITS, GapsReply, confirm_text, ended_text, forgot_text, gaps_text, not_written_text,
                           writing_text)
from bot.chat.texts import NO_CAPTURE
from bot.telegram.bot import TelegramBot
from bot.telegram.capturing import after_command, markdown, once_of
from bot.usecases import capture, digest, gaps
from bot.usecases.people import Person

_NOTE = re.compile(r"^/note(@\w+)?(\s|$)")


def place_of(user_id: int) -> str:
    """Where a Telegram person's note for a gap is written: their private chat with the bot."""
    return f"telegram:{user_id}"


def gap_buttons(reply: GapsReply, can_write: bool = True) -> InlineKeyboardMarkup | None:
    """✍️ write (where capture has somewhere to write) and ✖ dismiss, for each gap."""
    if not reply.items:
        return None
    return InlineKeyboardMarkup([[InlineKeyboardButton(f"{icon} {n}", callback_data=f"gap:{act}:{gap_id}")
                                  for act, icon, _ in GAP_BUTTONS if can_write or act != "w"]
                                 for n, gap_id in reply.items])


async def on_gaps(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The person's open gaps, in their private chat (a group sees nothing of them)."""
    person = await tg.who(update)
    if person is None:
        return
    reply = gaps_text(await asyncio.to_thread(gaps.shown, tg.parts, person))
    keys = gap_buttons(reply, capture.offered(tg.parts))
    message = update.effective_message
    try:  # (a flood limit met half-way is waited out: the list arrives whole, its buttons under it)
        if update.effective_chat.type == ChatType.PRIVATE:
            await tg.reply(message, reply.text, markup=keys)
        else:
            await tg.send(update.effective_user.id, reply.text, markup=keys)
    except Forbidden:  # never opened a private chat with the bot
        await tg.reply(message, f"请先私聊我（@{tg.app.bot.username}），再发 /gaps。 / Open a private chat with "
                                f"@{tg.app.bot.username} and send /gaps there.")
        return
    if update.effective_chat.type != ChatType.PRIVATE:
        await tg.reply(message, "已私信给你。 / Sent to you privately.")


async def on_forget(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    person = await tg.who(update)
    if person is None:
        return
    gone = await asyncio.to_thread(gaps.forget, tg.parts, person)
    await tg.reply(update.effective_message, forgot_text(gone))


async def on_digest(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """``/digest weekly mon 09:00 [TZ]``, ``daily 08:30``, ``off``; alone: the plan now."""
    person = await tg.who(update)
    if person is None:
        return
    message = update.effective_message
    words = after_command(message.text)
    if not words:
        plan = await asyncio.to_thread(digest.plan_of, tg.parts, person)
        await tg.reply(message, f"摘要 digest: {plan_text(plan)}\n" + USAGE.format(tz=plan.tz if plan else "UTC"))
        return
    try:
        plan = await asyncio.to_thread(digest.set_plan, tg.parts, person, words)
    except UserError as err:
        await tg.reply(message, str(err))
        return
    await tg.reply(message, plan_reply(plan, private=update.effective_chat.type == ChatType.PRIVATE))


def _buttons(gap_id: str, which) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup([[InlineKeyboardButton(f"{icon} {word}", callback_data=f"gap:{act}:{gap_id}")
                                  for act, icon, word in which]])


async def on_gap_button(tg: TelegramBot, query, act: str, gap_id: str) -> str | None:
    """✍️ or ✖ under /gaps, ✖ cancel under the ✍️ reply, 💾 / ❓ under a question typed while
    a draft waits: the presser's own gap and draft only. The question to answer after ❓, else
    None."""
    person = tg.presser(query.from_user.id)
    if not isinstance(person, Person):
        await query.answer(person[:200], show_alert=True)
        return None
    if act in ("c", "s", "a"):
        return await _draft_button(tg, query, person, act, gap_id)
    try:
        if act == "x":
            gap = await asyncio.to_thread(gaps.dismiss, tg.parts, person, gap_id)
            await query.answer(DISMISSED.format(q=gap.question)[:200])
            return None
        why = NO_CAPTURE if not tg.parts.can_capture else capture.unavailable(tg.parts, person)
        if why:  # said now: a note that cannot be written is never begun
            await query.answer(why[:200], show_alert=True)
            return None
        gap = await asyncio.to_thread(gaps.write, tg.parts, person, gap_id, place_of(query.from_user.id))
    except UnknownGap:
        await query.answer(NOT_YOUR_GAP, show_alert=True)
        return None
    except GapDone as err:
        await query.answer(str(err)[:200], show_alert=True)
        return None
    await tg.to_presser(query, writing_text(gap, tg.host.settings.capture.draft_wait),
                        markup=_buttons(gap_id, [CANCEL_BUTTON]))
    return None


async def _draft_button(tg: TelegramBot, query, person: Person, act: str, gap_id: str) -> str | None:
    if act == "c":
        ended = await asyncio.to_thread(gaps.end_draft, tg.parts, person, gap_id)
        await query.answer((ended_text(ended) if ended is not None else NOTHING_WAITS)[:200],
                           show_alert=ended is None)
        await _no_buttons(query)
        return None
    asked = query.message.reply_to_message if query.message is not None else None
    text = markdown(asked.text or "", asked.entities) if asked is not None else ""
    if act == "a":  # answer it: the draft ends (said), the question is answered
        ended = await asyncio.to_thread(gaps.end_draft, tg.parts, person, gap_id)
        await query.answer(ended_text(ended)[:200] if ended is not None else None)
        await _no_buttons(query)
        if not text.strip():
            await tg.to_presser(query, "请再发一次这个问题。 / Please send the question again.", answered=True)
            return None
        return text
    draft = await asyncio.to_thread(gaps.take_draft, tg.parts, person, place_of(query.from_user.id))
    if draft is None or draft.gap_id != gap_id:
        await query.answer(NOTHING_WAITS[:200], show_alert=True)
        await _no_buttons(query)
        return None
    if not text.strip():
        await query.answer("找不到那条消息了：请再发一次。 / That message is gone: please send it again.",
                           show_alert=True)
        return None
    await query.answer()
    await _no_buttons(query)
    said = await _write(tg, person, draft, text, f"telegram:{asked.chat.id}:{asked.message_id}")
    await tg.to_presser(query, said, answered=True)
    return None


async def _no_buttons(query) -> None:
    """The buttons under a message go once pressed (its draft ended)."""
    if query.message is not None and getattr(query.message, "reply_markup", None):
        try:
            await query.edit_message_reply_markup(None)
        except TelegramError:
            pass


async def _write(tg: TelegramBot, person: Person, draft: Draft, text: str, once: str) -> str:
    """The note for the draft's gap; what to tell the person (refused: why, and that it ended)."""
    receipt = await gaps.write_draft(tg.parts, person, draft, text, once=once)
    return not_written_text(draft, receipt.message) if receipt.status == "refused" else receipt.message


async def drafted(tg: TelegramBot, update: Update, person: Person) -> bool:
    """A text in a private chat after ✍️: the note for the gap (True); one that looks like a
    question is asked about first (True); else False (no draft waits: a question)."""
    if not capture.offered(tg.parts):
        return False
    draft = await asyncio.to_thread(gaps.take_draft, tg.parts, person, place_of(update.effective_user.id))
    if draft is None:
        return False
    message = update.effective_message
    text = markdown(message.text or "", message.entities)
    if gaps.looks_like_question(text):
        await tg.reply(message, confirm_text(draft), quote=True,
                       markup=_buttons(draft.gap_id, CONFIRM_BUTTONS + (CANCEL_BUTTON,)))
        return True
    said = await _write(tg, person, draft, text, once_of(update))
    await tg.reply(message, said)
    return True


async def on_command(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Before every command in a private chat: while a note begun with ✍️ waits, ``/note text``
    is that note (and nothing else runs), any other command ends it (said, then the command
    runs). ``/note`` alone leaves it waiting."""
    user, message = update.effective_user, update.effective_message
    if user is None or message is None or getattr(tg.host, "parts", None) is None or \
            tg.parts.gaps_if_made() is None:
        return
    person = tg.presser(user.id)
    if not isinstance(person, Person):
        return
    if _NOTE.match(message.text or ""):
        text = after_command(markdown(message.text or "", message.entities))
        if not text or not tg.parts.can_capture:
            return
        draft = await asyncio.to_thread(gaps.take_draft, tg.parts, person, place_of(user.id))
        if draft is None:
            return
        said = await _write(tg, person, draft, text, once_of(update))
        await tg.reply(message, said)
        raise ApplicationHandlerStop
    ended = await asyncio.to_thread(gaps.end_draft, tg.parts, person)
    if ended is not None:
        await tg.reply(message, ended_text(ended))
