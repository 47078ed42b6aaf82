"""Voice messages, audio files and photos with a question, in Telegram.

A voice message (or audio file) in a private chat, or in a group as a reply to the bot: a
"🎙 transcribing…" message (with how many are ahead in the machine's line) that becomes the
words heard, on one line, so a mishearing shows and can be corrected by replying with the right
words; then the answer, as for a typed question. Said "note …" / "remember …", or sent with
/note as its caption, it is captured instead (the clip attached to a note). A photo or image
file whose caption is a question (not /note): its text is read, shown on one line, and the
question answered from the caption and that text. What cannot be read is said in one line;
without the extra installed, the reply says what to install."""

from __future__ import annotations

import logging
import re

from telegram import Message, Update
from telegram.constants import ChatType
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from bot.chat.texts import READING_IMAGE, TRANSCRIBING
from bot.session import Session
from bot.telegram import answering
from bot.telegram.bot import TelegramBot
from bot.telegram.capturing import NOT_FETCHED, after_command, fetch_files, in_line

log = logging.getLogger(__name__)

NOTE_CAPTION = re.compile(r"^/note(@\w+)?(\s|$)")


def _for_me(update: Update, context: ContextTypes.DEFAULT_TYPE) -> bool:
    """In a private chat always; in a group, a reply to the bot, or a caption naming it or starting with /note."""
    message = update.effective_message
    if update.effective_chat.type == ChatType.PRIVATE:
        return True
    caption = message.caption or ""
    replied = message.reply_to_message is not None and message.reply_to_message.from_user is not None \
        and message.reply_to_message.from_user.id == context.bot.id
    return replied or f"@{context.bot.username}".lower() in caption.lower() or bool(NOTE_CAPTION.match(caption))


def _caption(message: Message, username: str) -> str:
    return (message.caption or "").replace(f"@{username}", "").strip()


async def on_voice(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A voice message or audio file: heard, then answered or captured."""
    if not _for_me(update, context):
        return
    session = await tg.session(update)
    if session is None:
        return
    message = update.effective_message
    caption = _caption(message, context.bot.username or "")
    command = "note" if NOTE_CAPTION.match(caption) else ""  # (a /note keeps the clip without its words)
    clip = message.voice or message.audio
    why = session.voice_check(clip.duration, command)  # said before the clip is fetched or heard
    if why:
        await tg.show(update, why)
        return
    files = await _fetch(tg, session, message, tg.host.settings.media.max_audio_mb, "a voice message")
    if not files:
        return
    status, wait, shown = await _status(tg, session, message, TRANSCRIBING)
    try:
        heard = await session.voice(files[0], command, typed=after_command(caption),
                                    once=session.once(message.message_id), on_wait=wait)
    finally:
        await wait.close()
    await _settle(tg, session, shown, status, heard.line or heard.reply.text, wait)
    if not heard.line:  # not heard, captured before (the same message again), or kept without its words
        return
    if heard.kind != "ask":
        await tg.reply(message, heard.reply.text)
        return
    said = session.unasked(heard.text, clip=files[0])  # a reminder: not asked
    if said is not None:
        await tg.show(update, said)
    else:
        await answering.answer(tg, update, heard.text, heard=True, counted=True, session=session)


async def on_photo_question(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A photo or image file with a question as its caption: answered from the caption and the image's text."""
    message = update.effective_message
    if not _for_me(update, context):
        return
    question = _caption(message, context.bot.username or "")
    if not question:
        return
    session = await tg.session(update)
    if session is None:
        return
    why = session.photo_check()  # a question's count, before the photo is fetched or read
    if why:
        await tg.show(update, why)
        return
    files = await _fetch(tg, session, message, tg.host.settings.media.max_image_mb, "a photo")
    if not files:
        return
    why = session.image_problem(files[0].data)
    if why:
        await tg.reply(message, why.text)
        return
    status, wait, shown = await _status(tg, session, message, READING_IMAGE)
    try:
        seen = await session.read(files[0].data, question, on_wait=wait)
    finally:
        await wait.close()
    await _settle(tg, session, shown, status, seen.line or seen.reply.text, wait)
    if seen.line:  # (a photo with no text in it: its words are still a question)
        await answering.answer(tg, update, seen.text, counted=True, seen=seen.seen, session=session)


async def _fetch(tg: TelegramBot, session: Session, message: Message, max_mb: float, what: str) -> list:
    """The message's file (at most ``max_mb``, and capture.max_file_mb), or [] when it could
    not be fetched, the person told why."""
    try:
        files, why = await fetch_files(session, message, min(max_mb, tg.host.settings.capture.max_file_mb))
    except TelegramError as err:
        log.warning("could not fetch %s from Telegram: %s", what, err)
        files, why = [], NOT_FETCHED
    if why:
        await tg.reply(message, why)
        return []
    return files


async def _status(tg: TelegramBot, session: Session, message: Message, working: str):
    """The one message that says the job's place in the machine's line (edited at most every few
    seconds), then ``working`` while it runs, then what came of it (``_settle``): the message, the
    ``on_wait`` that keeps it, and its record on disk until then (a restart says the job was
    interrupted: ``TelegramBot.run``)."""
    status = await tg.reply(message, working)
    shown = await session.shown({"chat_id": status.chat_id, "message_id": status.message_id})
    wait = in_line(tg, message, doing=working)
    wait.shown["status"] = status
    return status, wait, shown


async def _settle(tg: TelegramBot, session: Session, shown: int | None, status: Message, text: str,
                  waiting=None) -> None:
    """The status message says what came of its job (``waiting``: its place in line is said no
    more), which has ended."""
    if waiting is not None:
        await waiting.close()
    try:
        await tg.edit(status, text)
    except TelegramError as err:
        log.info("could not edit a media status message: %s", err)
    await session.settled(shown)
