"""A message that asks nothing, in Telegram (``bot.usecases.unasked``): typed in a chat where the
bot answers, or heard from a voice message. The reply says it is not a question and, where
capture works, carries "Save as note" (``nq:<id>``); a press saves it as a note of the presser
(only the sender's own message: another person's press is told it is gone), the clip attached,
and the button goes."""

from __future__ import annotations

from contextlib import suppress

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.error import TelegramError

from rag.answer.intent import not_a_question
from rag.capture import Attachment

from bot.chat.texts import SAVING
from bot.chat.unasked import ASK_ANYWAY_TELEGRAM, SAVE_BUTTON
from bot.chat.unasked import not_a_question as reply_text
from bot.telegram.bot import TelegramBot
from bot.usecases import unasked as unasked_case
from bot.usecases.people import Person


async def offer(tg: TelegramBot, update: Update, text: str, clip: Attachment | None = None) -> bool:
    """True when ``text`` asks nothing and the reply went out instead of an answer (or the
    person may not use the bot, and was told); False: answer it as a question."""
    if not_a_question(text) is None:  # said first: a question never waits on anything here
        return False
    person = await tg.who(update)
    if person is None:
        return True
    item = unasked_case.check(tg.parts, person, text, clip)
    if item is None:
        return False
    can = unasked_case.can_save(tg.parts)
    keys = InlineKeyboardMarkup([[InlineKeyboardButton(SAVE_BUTTON, callback_data=f"nq:{item.id}")]]) if can else None
    await tg.reply(update.effective_message, reply_text(can, ASK_ANYWAY_TELEGRAM), markup=keys)
    return True


async def on_button(tg: TelegramBot, query, item_id: str) -> None:
    """"Save as note" under the reply: the message saved as the presser's note, the receipt sent
    to them privately, the button gone."""
    person = tg.presser(query.from_user.id)
    if not isinstance(person, Person):
        await query.answer(person[:200], show_alert=True)
        return
    try:
        item = unasked_case.kept(tg.parts, person, item_id)
    except unasked_case.Gone as err:
        await query.answer(str(err)[:200], show_alert=True)
        return
    await query.answer(SAVING)
    receipt = await unasked_case.save(tg.parts, person, item)
    await tg.to_presser(query, receipt.message, answered=True)
    if query.message is not None:
        with suppress(TelegramError):
            await query.edit_message_reply_markup(None)
