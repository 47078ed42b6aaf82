"""A question's flow in Telegram: the answer streams into a placeholder message (edits at most
every ``telegram.edit_interval``, ``RetryAfter`` honoured, "message is not modified" ignored,
``typing`` kept alive), the sources it reads shown first; then the final text in HTML parse
mode with everything from the notes escaped, split past 4,096 characters, sources as a
numbered list of links, previews off, plain text if Telegram rejects the HTML. Under it 👍, 👎,
"Why?" and "Save as note" (the answer is kept for them; a button carries only its id)."""

from __future__ import annotations

import asyncio
import logging

from bs4 import BeautifulSoup
from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from telegram.constants import ChatType, ParseMode
from telegram.error import BadRequest, RetryAfter
from telegram.ext import ContextTypes

from rag.language import label
from bot.chat.pacing import Pacer, Wait
from bot.chat.texts import EMPTY, SORRY, cut_message, notes_root, sources_first
from bot.render import NoteLinks, SourceLinks, telegram_messages, telegram_plain, telegram_sources
from bot.telegram import gaps, unasked
from bot.telegram.bot import NO_PREVIEW, TelegramBot, seconds
from bot.usecases import asking, capture

log = logging.getLogger(__name__)


async def on_ask(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    question = " ".join(context.args or [])
    if not question.strip():
        await tg.reply(update.effective_message, "用法 usage: /ask 你的问题")
        return
    await answer(tg, update, question)


async def on_text(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Any text in a private chat; in a group, a mention of the bot or a reply to it."""
    message = update.effective_message
    if update.effective_chat.type != ChatType.PRIVATE:
        me = context.bot.username or ""
        mentioned = f"@{me}".lower() in (message.text or "").lower()
        replied = message.reply_to_message is not None and message.reply_to_message.from_user is not None \
            and message.reply_to_message.from_user.id == context.bot.id
        if not (mentioned or replied):
            return
        question = message.text.replace(f"@{me}", "").strip()
    else:
        question = message.text or ""
        person = await tg.who(update)
        if person is None:
            return
        if await gaps.drafted(tg, update, person):  # after ✍️ under /gaps: the note, not a question
            return
    if await unasked.offer(tg, update, question):  # a reminder, a to-do: not answered as a question
        return
    await answer(tg, update, question)


async def answer(tg: TelegramBot, update: Update, question: str, heard: bool = False, counted: bool = False,
                 seen: str = "") -> None:
    """``heard``: the question is what a voice message was heard as; ``counted``: against the
    person's rate limit already (a clip, a photo: before it was fetched); ``seen``: the text read
    from a photo sent with it (``asking.ask``)."""
    person = await tg.who(update)
    if person is None:
        return
    if not (question or "").strip():  # a blank message, or only the bot's @name
        await tg.reply(update.effective_message, EMPTY)
        return
    if not counted and not await tg.may_search(update):
        return
    question, notice = cut_message(tg.host.settings, question)
    placeholder = await tg.reply(update.effective_message, "…")

    reading = SourceLinks()  # the sources' links, once they are known

    def sources(found) -> None:
        reading.found(found)
        pacer.show_first(sources_first(found, label(question, "reading"), notes_root(tg.host.settings)))

    async def edit(text: str) -> None:  # every link-like token inert, but the sources' own
        try:
            await placeholder.edit_text(telegram_plain(text, reading.links, reading.web),
                                        parse_mode=ParseMode.HTML, link_preview_options=NO_PREVIEW)
        except RetryAfter as err:
            raise Wait(seconds(err)) from None
        except BadRequest as err:
            if "not modified" not in str(err).lower():
                raise

    pacer = Pacer(edit, tg.cfg.edit_interval)
    tg.pacers.append(pacer)
    typing = asyncio.create_task(tg.typing(update.effective_chat.id))
    pacer.start()
    try:
        asked = await asking.ask(tg.parts, person, question, on_token=pacer.feed, on_sources=sources, keep=True,
                                 heard=heard, seen=seen)
    except Exception:
        log.exception("answering a Telegram question failed")
        tg.count_error()
        asked = None
    finally:  # whatever happened, the "typing…" and the streaming edits end here
        await pacer.stop()
        typing.cancel()
    if asked is None:
        await tg.edit(placeholder, SORRY)
        return
    got = asked.answer
    body = got.shown + "".join(f"\n\n*{n}*" for n in (got.notice, notice) if n)
    if got.citations:
        listed = telegram_sources(got.citations, label(question, "sources"), notes_root(tg.host.settings))
    else:
        listed = telegram_sources(got.closest, label(question, "closest"), notes_root(tg.host.settings))
    await final(tg, placeholder, telegram_messages(body, listed, links=NoteLinks(got.citations)),
                markup=buttons(asked, capture.offered(tg.parts)))


def buttons(asked: asking.Asked, can_save: bool = True) -> InlineKeyboardMarkup | None:
    """👍, 👎, "Why?" and, under an answer from the notes where capture has somewhere to write
    (``can_save``), "Save as note"; None when the answer was not kept (its buttons would lead
    nowhere)."""
    if asked.answer_id is None:
        return None
    answer_id = asked.answer_id
    row = [InlineKeyboardButton("👍", callback_data=f"fb:up:{answer_id}"),
           InlineKeyboardButton("👎", callback_data=f"fb:down:{answer_id}"),
           InlineKeyboardButton("Why? / 依据", callback_data=f"why:{answer_id}")]
    if asked.answer.citations and can_save:  # an answer from the notes; "nothing found" is not worth a note
        row.append(InlineKeyboardButton("Save as note / 存为笔记", callback_data=f"save:{answer_id}"))
    return InlineKeyboardMarkup([row[:3], row[3:]] if len(row) > 3 else [row])


async def final(tg: TelegramBot, placeholder: Message, parts: list[str],
                markup: InlineKeyboardMarkup | None = None) -> None:
    """The answer's messages (Telegram HTML, ``bot.render``'s): the first replaces the placeholder;
    the buttons go under the last."""
    for i, part in enumerate(parts):
        mode = ParseMode.HTML
        keys = markup if i == len(parts) - 1 else None

        async def send(text=part, mode=mode, first=(i == 0), keys=keys):
            if first:
                return await placeholder.edit_text(text, parse_mode=mode, link_preview_options=NO_PREVIEW,
                                                   reply_markup=keys)
            return await placeholder.chat.send_message(text, parse_mode=mode, link_preview_options=NO_PREVIEW,
                                                       reply_markup=keys)

        try:
            await tg.retrying(send)
        except BadRequest as err:
            message = str(err).lower()
            if "not modified" in message:
                continue
            log.info("Telegram rejected the HTML (%s); sending its text", err)
            plain = BeautifulSoup(part, "html.parser").get_text()  # as the door's plain text: tokens inert
            if i == 0:
                await tg.edit(placeholder, plain, markup=keys)
            else:
                await tg.send(placeholder.chat.id, plain, markup=keys)
