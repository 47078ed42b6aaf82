"""Knowledge gaps in Telegram: ``/gaps`` (in the person's private chat, with ✍️ write / ✖ dismiss
under it: ``gap:w:<id>``, ``gap:x:<id>``), ``/forget``, the note written for a gap (the next text
the person sends in their private chat after ✍️), and a gap a note answers now, told privately.
A press is checked against the presser: another person's gap id, forged or forwarded, is refused
and changes nothing; a press on a gap dismissed or answered already says so."""

from __future__ import annotations

import asyncio

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.constants import ChatType
from telegram.error import Forbidden
from telegram.ext import ContextTypes

from rag.answer.gaps import GapDone, UnknownGap
from rag.digest_plan import USAGE, plan_text
from rag.errors import UserError

from bot.chat.digest import plan_reply
from bot.chat.gaps import DISMISSED, FORGOT, GAP_BUTTONS, NOT_YOUR_GAP, GapsReply, gaps_text, writing_text
from bot.chat.texts import NO_CAPTURE
from bot.telegram.bot import NO_PREVIEW, TelegramBot, chunks
from bot.telegram.capturing import after_command, markdown, once_of
from bot.usecases import capture, digest, gaps
from bot.usecases.people import Person


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
    reply = gaps_text(await asyncio.to_thread(gaps.listing, tg.parts, person))
    can_write = capture.offered(tg.parts)
    parts = chunks(reply.text)
    user_id = update.effective_user.id
    message = update.effective_message
    try:
        for i, part in enumerate(parts):
            keys = gap_buttons(reply, can_write) if i == len(parts) - 1 else None
            if update.effective_chat.type == ChatType.PRIVATE:
                await message.reply_text(part, link_preview_options=NO_PREVIEW, reply_markup=keys)
            else:
                await tg.app.bot.send_message(user_id, part, link_preview_options=NO_PREVIEW, reply_markup=keys)
    except Forbidden:  # never opened a private chat with the bot
        await message.reply_text(f"请先私聊我（@{tg.app.bot.username}），再发 /gaps。 / Open a private chat with "
                                 f"@{tg.app.bot.username} and send /gaps there.")
        return
    if update.effective_chat.type != ChatType.PRIVATE:
        await message.reply_text("已私信给你。 / Sent to you privately.")


async def on_forget(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    person = await tg.who(update)
    if person is None:
        return
    gone = await asyncio.to_thread(gaps.forget, tg.parts, person)
    await update.effective_message.reply_text(FORGOT.format(n=gone))


async def on_digest(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """``/digest weekly mon 09:00 [TZ]``, ``daily 08:30``, ``off``; alone: the plan now."""
    person = await tg.who(update)
    if person is None:
        return
    message = update.effective_message
    words = after_command(message.text)
    if not words:
        plan = await asyncio.to_thread(digest.plan_of, tg.parts, person)
        await message.reply_text(f"摘要 digest: {plan_text(plan)}\n" + USAGE.format(tz=plan.tz if plan else "UTC"))
        return
    try:
        plan = await asyncio.to_thread(digest.set_plan, tg.parts, person, words)
    except UserError as err:
        await message.reply_text(str(err))
        return
    await message.reply_text(plan_reply(plan, private=update.effective_chat.type == ChatType.PRIVATE))


async def on_gap_button(tg: TelegramBot, query, act: str, gap_id: str) -> None:
    """✍️ or ✖ under /gaps: the presser's own gap only."""
    person = tg.presser(query.from_user.id)
    if not isinstance(person, Person):
        await query.answer(person[:200], show_alert=True)
        return
    try:
        if act == "x":
            gap = await asyncio.to_thread(gaps.dismiss, tg.parts, person, gap_id)
            await query.answer(DISMISSED.format(q=gap.question)[:200])
            return
        why = NO_CAPTURE if not tg.parts.can_capture else capture.unavailable(tg.parts, person)
        if why:
            await query.answer(why[:200], show_alert=True)
            return
        gap = await asyncio.to_thread(gaps.write, tg.parts, person, gap_id, place_of(query.from_user.id))
    except UnknownGap:
        await query.answer(NOT_YOUR_GAP, show_alert=True)
        return
    except GapDone as err:
        await query.answer(str(err)[:200], show_alert=True)
        return
    await tg.to_presser(query, writing_text(gap))


async def drafted(tg: TelegramBot, update: Update, person: Person) -> bool:
    """A text in a private chat after ✍️: the note for the gap (True), else False (a question)."""
    if not capture.offered(tg.parts):
        return False
    draft = await asyncio.to_thread(gaps.take_draft, tg.parts, person, place_of(update.effective_user.id))
    if draft is None:
        return False
    message = update.effective_message
    receipt = await gaps.write_draft(tg.parts, person, draft, markdown(message.text or "", message.entities),
                                     once=once_of(update))
    await message.reply_text(receipt.message, link_preview_options=NO_PREVIEW)
    return True
