"""A press on a button in Telegram: whatever button it is (under an answer, ``/about``,
``/related``, ``/gaps``, a note begun for a gap, a message that asked nothing), the presser's session
(``bot.session.presses``) says what it does, and this shows it: an alert the presser must see, a
passing word, or a message in the presser's private chat (a group sees nothing of it: "Why?", the
saved note's link, the note begun with ✍️). 💾 and ❓ under a question typed while a draft waited
read that question from the message the bot's reply answers; ❓ then answers it."""

from __future__ import annotations

from contextlib import suppress

from telegram import InlineKeyboardMarkup, Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from bot.session import Session
from bot.telegram.answering import answer
from bot.telegram.bot import TelegramBot
from bot.telegram.capturing import markdown


async def on_button(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    query = update.callback_query
    asked = query.message.reply_to_message if query.message is not None else None
    text = markdown(asked.text or "", asked.entities) if asked is not None else ""
    once = f"telegram:{asked.chat.id}:{asked.message_id}" if asked is not None else ""
    said = await Session(tg.parts, "telegram", query.from_user.id).press(query.data or "", text=text, once=once)
    if said.how == "message":
        await tg.to_presser(query, said.text, markup=tg.markup(said.buttons))
    else:
        await query.answer(said.text[:200] or None, show_alert=said.how == "alert")
    if said.unbutton:
        await _unbutton(query, said.unbutton)
    if said.then is not None:
        done = await said.then()
        await tg.to_presser(query, done.text, answered=True)
    if said.ask:  # ❓ under a question typed while a draft waited: answered now
        await answer(tg, update, said.ask)


async def _unbutton(query, which: str) -> None:
    """The pressed message's buttons go: all ("*"), or those of one item (a fact rejected)."""
    markup = getattr(query.message, "reply_markup", None) if query.message is not None else None
    if not markup:
        return
    rows = [] if which == "*" else [r for r in ([b for b in row if not (b.callback_data or "").endswith(f":{which}")]
                                                for row in markup.inline_keyboard) if r]
    with suppress(TelegramError):
        await query.edit_message_reply_markup(InlineKeyboardMarkup(rows) if rows else None)
