"""Capture in Telegram: ``/note``, a message (text, photo or document) forwarded to the bot in
a private chat, ``/save`` replying to any message, ``/append``, ``/remember``, and ``/outbox``
for what is still waiting. A file is checked against ``capture.max_file_mb`` before it is
downloaded. The person's own words keep their Markdown; someone else's text (a forward,
``/save`` on another's message) goes in as they wrote it (``rag.capture.Quote``)."""

from __future__ import annotations

import logging
import re
from contextlib import suppress
from datetime import datetime

from telegram import (Message, MessageEntity, MessageOriginChannel, MessageOriginChat, MessageOriginHiddenUser,
                      MessageOriginUser, Update)
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from rag.capture import Attachment, Origin, Quote, md_escape, md_label, md_url

from bot.chat.pacing import Coalesced
from bot.chat.texts import waiting_text
from bot.session import Session
from bot.telegram.bot import TelegramBot

log = logging.getLogger(__name__)

SAVE_USAGE = ("用法 usage: 回复一条消息，发送 /save（可加标题或 #标签） / reply to a message with /save "
              "(a title or #tags may follow)")
MEDIA_HINT = ("要把它存成笔记吗？把 /note 写在说明里，或回复它 /save。 / To save it as a note, put /note in its "
              "caption or reply to it with /save.")
UNSUPPORTED = ("这种消息还存不了：只能存文字、图片和文件。 / This kind of message cannot be saved yet: only text, "
               "photos and documents.")
NOT_FETCHED = "没能从 Telegram 取到这个文件，请再发一次。 / Could not fetch the file from Telegram; please send it again."
_COMMAND = re.compile(r"^/\w+(@\w+)?(?=\s|$)")


async def on_note(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    message = update.effective_message
    await _capture(tg, update, after_command(markdown(message.text or "", message.entities)))


async def on_media_note(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A photo or document with "/note ..." as its caption."""
    message = update.effective_message
    await _capture(tg, update, after_command(markdown(message.caption or "", message.caption_entities)),
                   source=message)


async def on_forward(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Forwarded to the bot in a private chat: a capture, with where it came from."""
    message = update.effective_message
    if capturable(message):
        await _capture(tg, update, "", origin=origin_of(message), source=message, quote=quote_of(message))
    elif await tg.session(update) is not None:
        await tg.reply(message, UNSUPPORTED)


async def on_media_hint(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A photo or document in a private chat, neither forwarded nor with /note: how to keep it
    (or, where nothing can be captured, why)."""
    session = await tg.session(update)
    if session is not None:
        why = session.may_capture()
        await tg.reply(update.effective_message, why.text if why else MEDIA_HINT)


async def on_save(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """``/save`` replying to a message: that message (its text, files and origin) as a note;
    words after /save go first (a title, #tags)."""
    message = update.effective_message
    target = message.reply_to_message
    if target is None or not capturable(target):
        if await tg.session(update) is not None:
            await tg.reply(message, SAVE_USAGE if target is None else UNSUPPORTED)
        return
    extra = after_command(message.text)
    own = target.forward_origin is None and target.from_user is not None and \
        target.from_user.id == update.effective_user.id
    if own:  # their own message: their words, as they wrote them
        text = "\n\n".join(t for t in (extra, message_text(target)) if t.strip())
        await _capture(tg, update, text, origin=origin_of(target), source=target)
    else:  # someone else's: shown as they wrote it
        await _capture(tg, update, extra, origin=origin_of(target), source=target, quote=quote_of(target))


async def on_append(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _add_text(tg, update, "append")


async def on_remember(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    await _add_text(tg, update, "remember")


async def _add_text(tg: TelegramBot, update: Update, how: str) -> None:
    """``/append`` or ``/remember``: the command's text."""
    session = await tg.session(update)
    if session is not None:
        message = update.effective_message
        await tg.show(update, await getattr(session, how)(after_command(message.text), session.once(message.message_id)))


async def on_outbox(tg: TelegramBot, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    session = await tg.session(update)
    if session is not None:
        await tg.show(update, await session.outbox())


async def _capture(tg: TelegramBot, update: Update, text: str, *, origin: Origin | None = None,
                   source: Message | None = None, quote: Quote | None = None) -> None:
    """A new note from ``text`` and the photo or document of ``source``; the receipt as the reply."""
    session = await tg.session(update)
    if session is None:
        return
    message = update.effective_message
    why = session.may_capture(files=source is not None)
    if why:  # said before any file is fetched
        await tg.show(update, why)
        return
    files: list[Attachment] = []
    if source is not None:
        try:
            files, problem = await fetch_files(session, source, tg.host.settings.capture.max_file_mb)
        except TelegramError as err:
            log.warning("could not fetch a file from Telegram: %s", err)
            problem = NOT_FETCHED
        if problem:
            await tg.reply(message, problem)
            return
    waiting = in_line(tg, message)
    try:
        said = await session.note(text, origin=origin, files=files, quote=quote, once=session.once(message.message_id),
                                  on_wait=waiting)
    finally:
        await waiting.close()
    await tg.reply(message, said.text)


def in_line(tg: TelegramBot, message: Message, doing: str = ""):
    """``on_wait`` for media work: a message saying how many are ahead, edited as that falls, at
    most every few seconds (``Coalesced``; none is sent when nothing is ahead; ``doing`` then says
    what is being done, when given, else the message goes once its turn comes). ``close`` it before
    the message says what came of the work."""
    shown: dict[str, Message] = {}

    async def show(ahead: int) -> None:
        text = waiting_text(ahead) if ahead else doing
        with suppress(TelegramError):
            if not text:  # its turn came: the "in line" message has said what it had to
                if "status" in shown:
                    await shown.pop("status").delete()
            elif "status" in shown:
                await tg.edit(shown["status"], text)
            else:
                shown["status"] = await tg.reply(message, text)

    paced = Coalesced(show)

    async def tell(ahead: int) -> None:
        await (paced(ahead) if ahead else paced.now(0))

    tell.shown, tell.close, tell.paced = shown, paced.close, paced
    return tell


async def fetch_files(session: Session, message: Message, max_mb: float) -> tuple[list[Attachment], str | None]:
    """The photo (its largest size) or document of a message, fetched; or why not (too
    large: refused from the size Telegram tells, before any download)."""
    if message.photo:
        item = message.photo[-1]
        name, mime = f"photo_{item.file_unique_id}.jpg", "image/jpeg"
    elif message.voice:
        item = message.voice
        name, mime = f"voice_{item.file_unique_id}.ogg", item.mime_type or "audio/ogg"
    elif message.audio:
        item = message.audio
        name = item.file_name or f"audio_{item.file_unique_id}"
        mime = item.mime_type or "audio/mpeg"
    elif message.document:
        item = message.document
        name = item.file_name or f"file_{item.file_unique_id}"
        mime = item.mime_type or "application/octet-stream"
    else:
        return [], None
    refused = session.too_large(name, item.file_size, max_mb)
    if refused is None:
        got = await item.get_file()
        refused = session.too_large(name, got.file_size, max_mb)
        if refused is None:
            data = bytes(await got.download_as_bytearray())
            refused = session.too_large(name, len(data), max_mb)
            if refused is None:
                return [Attachment(name, data, mime)], None
    return [], refused.text


# --- a Telegram message, read for a capture ------------------------------------------------------

def after_command(text: str | None) -> str:
    """What follows ``/command`` (or ``/command@bot``), newlines kept."""
    return _COMMAND.sub("", (text or "").lstrip(), count=1).strip()


def markdown(text: str, entities, literal: bool = False) -> str:
    """The text with its hidden links (``text_link``: words that link somewhere) as Markdown
    links, their words shown as written; the rest as written: the person's own Markdown, or
    with ``literal`` (someone else's text) escaped so that it shows as written. Offsets are
    in UTF-16 code units."""
    links = sorted((e for e in (entities or ()) if e.type == MessageEntity.TEXT_LINK and e.url),
                   key=lambda e: e.offset)
    plain = md_escape if literal else (lambda part: part)
    units = text.encode("utf-16-le")
    out, pos = [], 0
    for e in links:
        start, end = e.offset * 2, (e.offset + e.length) * 2
        if start < pos or end > len(units):
            continue
        out.append(plain(units[pos:start].decode("utf-16-le", "replace")))
        out.append(f"[{md_label(units[start:end].decode('utf-16-le', 'replace'))}]({md_url(e.url)})")
        pos = end
    out.append(plain(units[pos:].decode("utf-16-le", "replace")))
    return "".join(out)


def capturable(message: Message) -> bool:
    """Text, a caption, a photo, a document or a voice message: what a capture can hold (not a
    sticker, a poll...)."""
    return bool(message_text(message).strip() or message.photo or message.document or message.voice or message.audio)


def message_text(message: Message) -> str:
    if message.text is not None:
        return markdown(message.text, message.entities)
    return markdown(message.caption or "", message.caption_entities)


def quote_of(message: Message) -> Quote:
    """Someone else's message (its text or caption) for a capture: as they wrote it, links kept."""
    text, entities = ((message.text, message.entities) if message.text is not None
                      else (message.caption or "", message.caption_entities))
    return Quote(text, markdown(text, entities, literal=True))


def _name(user) -> str:
    return user.full_name + (f" (@{user.username})" if user.username else "")


def origin_of(message: Message) -> Origin | None:
    """Where a forwarded message came from: who, which chat, when, and a link when the chat is public."""
    o = message.forward_origin
    if o is None:
        return None
    when = o.date.astimezone() if isinstance(o.date, datetime) else None
    if isinstance(o, MessageOriginUser):
        return Origin(who=_name(o.sender_user), when=when)
    if isinstance(o, MessageOriginHiddenUser):
        return Origin(who=o.sender_user_name, when=when)
    if isinstance(o, MessageOriginChat):
        chat = o.sender_chat
        link = f"https://t.me/{chat.username}" if chat.username else ""
        return Origin(who=o.author_signature or "", chat=chat.title or chat.username or "", when=when, link=link)
    if isinstance(o, MessageOriginChannel):
        chat = o.chat
        link = f"https://t.me/{chat.username}/{o.message_id}" if chat.username else ""
        return Origin(who=o.author_signature or "", chat=chat.title or chat.username or "", when=when, link=link)
    return Origin(when=when)
