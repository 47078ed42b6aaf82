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

from rag.media.base import MediaError, NoText
from rag.media.audio import too_long

from bot.chat.texts import NO_CAPTURE, READING_IMAGE, TRANSCRIBING, heard_line, seen_line
from bot.telegram import answering, unasked
from bot.telegram.bot import TelegramBot
from bot.telegram.capturing import fetch_files, after_command, in_line, once_of
from bot.usecases import capture
from bot.usecases import media as media_case

log = logging.getLogger(__name__)

NOTE_CAPTION = re.compile(r"^/note(@\w+)?(\s|$)")
NOT_FETCHED = "没能从 Telegram 取到这个文件，请再发一次。 / Could not fetch the file from Telegram; please send it again."


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
    person = await tg.who(update)
    if person is None:
        return
    message = update.effective_message
    caption = _caption(message, context.bot.username or "")
    command = "note" if NOTE_CAPTION.match(caption) else ""
    if command:  # nowhere to write, or too often: said before the clip is fetched or heard
        why = NO_CAPTURE if not tg.parts.can_capture else (capture.unavailable(tg.parts, person)
                                                          or capture.too_often(tg.parts, person))
        if why:
            await tg.reply(message, why)
            return
    problem = media_case.speech_problem(tg.parts)
    if problem and not command:  # a /note keeps the clip without its words
        await tg.reply(message, problem)
        return
    clip = message.voice or message.audio
    limit = tg.host.settings.media.max_clip
    if clip.duration and clip.duration > limit and not command:
        await tg.reply(message, too_long(limit))  # said from what Telegram tells, before any download
        return
    if not command and not await tg.may_search(update):  # a question's count, before it is fetched or heard
        return
    files = await _fetch(tg, message, tg.host.settings.media.max_audio_mb, "a voice message")
    if not files:
        return
    status, wait, shown = await _status(tg, person, message, TRANSCRIBING)
    try:
        got = await media_case.voice(tg.parts, person, files[0], command=command, typed=after_command(caption),
                                     once=once_of(update), on_wait=wait)
    except MediaError as err:
        await _settle(tg, shown, status, str(err), wait)
        return
    finally:
        await wait.close()
    if got.transcript is None:  # captured before (the same message again), or kept without its words
        await _settle(tg, shown, status, got.receipt.message, wait)
        return
    await _settle(tg, shown, status, heard_line(got.transcript.line()), wait)
    if got.kind == "ask":
        if not await unasked.offer(tg, update, got.transcript.text, clip=files[0]):  # a reminder: not asked
            await answering.answer(tg, update, got.transcript.text, heard=True, counted=True)
        return
    await tg.reply(message, got.receipt.message)


async def on_photo_question(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A photo or image file with a question as its caption: answered from the caption and the image's text."""
    message = update.effective_message
    if not _for_me(update, context):
        return
    question = _caption(message, context.bot.username or "")
    if not question:
        return
    person = await tg.who(update)
    if person is None:
        return
    problem = media_case.ocr_problem(tg.parts)
    if problem:
        await tg.reply(message, problem)
        return
    if not await tg.may_search(update):  # a question's count, before the photo is fetched or read
        return
    files = await _fetch(tg, message, tg.host.settings.media.max_image_mb, "a photo")
    if not files:
        return
    try:
        media_case.check_image(tg.parts, files[0].data)
    except MediaError as err:
        await tg.reply(message, str(err))
        return
    status, wait, shown = await _status(tg, person, message, READING_IMAGE)
    try:
        reading = await media_case.read(tg.parts, person, files[0].data, on_wait=wait)
    except NoText as err:  # the words sent with it are still a question
        await _settle(tg, shown, status, str(err), wait)
        reading = None
    except MediaError as err:
        await _settle(tg, shown, status, str(err), wait)
        return
    finally:
        await wait.close()
    if reading is not None:
        await _settle(tg, shown, status, seen_line(" ".join(reading.lines)[:300]), wait)
    asked = media_case.photo_question(question, reading)
    await answering.answer(tg, update, asked.words, counted=True, seen=asked.seen)


async def _fetch(tg: TelegramBot, message: Message, max_mb: float, what: str) -> list:
    """The message's file (at most ``max_mb``, and capture.max_file_mb), or [] when it could
    not be fetched, the person told why."""
    try:
        files, why = await fetch_files(message, min(max_mb, tg.host.settings.capture.max_file_mb))
    except TelegramError as err:
        log.warning("could not fetch %s from Telegram: %s", what, err)
        files, why = [], NOT_FETCHED
    if why:
        await tg.reply(message, why)
        return []
    return files


async def _status(tg: TelegramBot, person, message: Message, working: str):
    """The one message that says the job's place in the machine's line (edited at most every few
    seconds), then ``working`` while it runs, then what came of it (``_settle``): the message, the
    ``on_wait`` that keeps it, and its record on disk until then (a restart says the job was
    interrupted: ``TelegramBot.run``)."""
    status = await tg.reply(message, working)
    shown = await media_case.shown(tg.parts, person, "telegram", {"chat_id": status.chat_id,
                                                                  "message_id": status.message_id})
    wait = in_line(tg, message, doing=working)
    wait.shown["status"] = status
    return status, wait, shown


async def _settle(tg: TelegramBot, shown: int | None, status: Message, text: str, waiting=None) -> None:
    """The status message says what came of its job, which has ended."""
    await _edit(tg, status, text, waiting)
    await media_case.settled(tg.parts, shown)


async def _edit(tg: TelegramBot, message: Message, text: str, waiting=None) -> None:
    """The status says what came of the work (``waiting``: its place in line is said no more)."""
    if waiting is not None:
        await waiting.close()
    try:
        await tg.edit(message, text)
    except TelegramError as err:
        log.info("could not edit a media status message: %s", err)
