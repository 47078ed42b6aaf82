"""A question's flow in Telegram: the answer streams into a placeholder message (edits at most
every ``telegram.edit_interval``, ``RetryAfter`` honoured, "message is not modified" ignored,
``typing`` kept alive), the sources it reads shown first; then the final text in HTML parse
mode with everything from the notes escaped, split past 4,096 characters, sources as a
numbered list of links, previews off, plain text if Telegram rejects the HTML. Under it 👍, 👎,
"Why?" and "Save as note" (the answer is kept for them; a button carries only its id). The
session (``bot.session``) says whether the question is let through and gives the answer's view."""

from __future__ import annotations

import asyncio
import logging

from bs4 import BeautifulSoup
from telegram import InlineKeyboardMarkup, Message, Update
from telegram.constants import ChatType, ParseMode
from telegram.error import BadRequest, RetryAfter
from telegram.ext import ContextTypes

from bot.chat.pacing import Pacer, Wait
from bot.chat.texts import SORRY
from bot.render import NoteLinks, SourceLinks, telegram_messages, telegram_plain, telegram_sources
from bot.session import AnswerView, Session
from bot.telegram.bot import NO_PREVIEW, TelegramBot, seconds
from bot.telegram.capturing import markdown

log = logging.getLogger(__name__)


async def on_ask(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    question = " ".join(context.args or [])
    if not question.strip():
        await tg.reply(update.effective_message, "用法 usage: /ask 你的问题")
        return
    await answer(tg, update, question)


async def on_text(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Any text in a private chat (after ✍️ under /gaps: the note for the gap); in a group, a
    mention of the bot or a reply to it. A message that asks nothing is not answered."""
    message = update.effective_message
    private = update.effective_chat.type == ChatType.PRIVATE
    if not private:
        me = context.bot.username or ""
        mentioned = f"@{me}".lower() in (message.text or "").lower()
        replied = message.reply_to_message is not None and message.reply_to_message.from_user is not None \
            and message.reply_to_message.from_user.id == context.bot.id
        if not (mentioned or replied):
            return
        question = message.text.replace(f"@{me}", "").strip()
    else:
        question = message.text or ""
    session = await tg.session(update)
    if session is None:
        return
    text = markdown(message.text or "", message.entities) if private else question
    said = await session.message(text, drafts=private, once=session.once(message.message_id))
    if said is not None:
        await tg.show(update, said)
        return
    await answer(tg, update, question, session=session)


async def answer(tg: TelegramBot, update: Update, question: str, heard: bool = False, counted: bool = False,
                 seen: str = "", session: Session | None = None) -> None:
    """``heard``: the question is what a voice message was heard as; ``counted``: against the
    person's rate limit already (a clip, a photo: before it was fetched); ``seen``: the text read
    from a photo sent with it."""
    session = session or await tg.session(update)
    if session is None:
        return
    placeholder: Message | None = None
    reading = SourceLinks()  # the sources' links, once they are known

    def sources(found, head: str) -> None:
        reading.found(found)
        pacer.show_first(head)

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
    typing: list[asyncio.Task] = []

    async def ready() -> None:  # let through: the placeholder the answer streams into
        nonlocal placeholder
        placeholder = await tg.reply(update.effective_message, "…")
        typing.append(asyncio.create_task(tg.typing(update.effective_chat.id)))
        pacer.start()

    try:
        got = await session.ask(question, on_token=pacer.feed, on_sources=sources, heard=heard, seen=seen,
                                counted=counted, ready=ready)
    except Exception:
        if placeholder is None:
            raise  # (before anything was shown: the error handler says so)
        log.exception("answering a Telegram question failed")
        tg.count_error()
        got = None
    finally:  # whatever happened, the "typing…" and the streaming edits end here
        await pacer.stop()
        for task in typing:
            task.cancel()
    if not isinstance(got, AnswerView):
        if got is None:
            await tg.edit(placeholder, SORRY)
        else:
            await tg.show(update, got)
        return
    body = got.text + "".join(f"\n\n*{n}*" for n in got.notices)
    listed = telegram_sources(got.sources, got.sources_title, got.root)
    await final(tg, placeholder, telegram_messages(body, listed, links=NoteLinks(got.citations)),
                markup=tg.markup(got.buttons))


async def final(tg: TelegramBot, placeholder: Message, parts: list[str],
                markup: InlineKeyboardMarkup | None = None) -> None:
    """The answer's messages (Telegram HTML, ``bot.render``'s): the first replaces the placeholder;
    the buttons go under the last."""
    for i, part in enumerate(parts):
        keys = markup if i == len(parts) - 1 else None

        async def send(text=part, first=(i == 0), keys=keys):
            if first:
                return await placeholder.edit_text(text, parse_mode=ParseMode.HTML, link_preview_options=NO_PREVIEW,
                                                   reply_markup=keys)
            return await placeholder.chat.send_message(text, parse_mode=ParseMode.HTML,
                                                       link_preview_options=NO_PREVIEW, reply_markup=keys)

        try:
            await tg.retrying(send)
        except BadRequest as err:
            if "not modified" in str(err).lower():
                continue
            log.info("Telegram rejected the HTML (%s); sending its text", err)
            plain = BeautifulSoup(part, "html.parser").get_text()  # as the door's plain text: tokens inert
            if i == 0:
                await tg.edit(placeholder, plain, markup=keys)
            else:
                await tg.send(placeholder.chat.id, plain, markup=keys)
