"""Voice messages and photos from chat: read on this machine, then handled as if typed.

- ``hear``: a clip's words; ``read``: an image's text (``rag.media.base.MediaError`` says why
  not: the extra not installed, too long, too large, not audio or not an image, nothing in it);
- ``spoken``: what a transcript asks for: a note ("note …", "笔记 …", "记一下 …"), a line to
  remember ("remember …", "记住 …"), or else a question;
- ``photo_question``: a photo's question: the words sent with it, and apart from them the text
  read from it (searched with them, but what the person saw, not what they ask about);
- ``note``: a capture whose files are read first: a photo's text goes under it in the note
  (marked as recognised), an audio file's words become the note's text; what could not be read
  is said under the receipt, and the capture is made all the same (nothing is lost).

The work waits in the machine's one line (``rag.media.queue``); ``on_wait(n)`` hears how many
jobs are ahead of the person's. The status message a door shows meanwhile is kept on disk from
``shown`` to ``settled``; at the next start ``interrupted`` has the door tell the person of each
one a stop or a crash left behind (``rag.media.inflight``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable

from rag.capture import VOICE_MARK, Attachment, Origin, Quote, Receipt, recognised
from rag.errors import LeanoteRagError
from rag.media.base import MediaError, NoText, Reading, Transcript
from rag.media.inflight import Shown

from bot.usecases import capture
from bot.usecases.people import Person

if TYPE_CHECKING:
    from bot.root import Parts

log = logging.getLogger(__name__)

Waiting = Callable[[int], Awaitable[None]]

_PUNCT = r"[\s,，:：;；.。!！、-]*"
_NOTE = re.compile(rf"^\s*(?:/?note\b|记一下|记个笔记|记笔记|笔记){_PUNCT}", re.I)
_REMEMBER = re.compile(rf"^\s*(?:/?remember\b|请记住|帮我记住|记住){_PUNCT}", re.I)


def speech_problem(parts: "Parts") -> str | None:
    """Why voice cannot be transcribed here (turned off, the extra not installed), or None."""
    return parts.media.speech_problem()


def ocr_problem(parts: "Parts") -> str | None:
    return parts.media.ocr_problem()


async def hear(parts: "Parts", person: Person, data: bytes, on_wait: Waiting | None = None) -> Transcript:
    return await parts.media.hear(person.key, data, on_wait)


async def read(parts: "Parts", person: Person, data: bytes, on_wait: Waiting | None = None) -> Reading:
    return await parts.media.read(person.key, data, on_wait)


def check_image(parts: "Parts", data: bytes) -> None:
    """A ``MediaError`` at once for what is no image, or too large (before any status is shown)."""
    parts.media.check_image(data)


def spoken(text: str) -> tuple[str, str]:
    """("note" | "remember" | "ask", the words without the one that said which)."""
    for kind, pattern in (("note", _NOTE), ("remember", _REMEMBER)):
        m = pattern.match(text)
        if m:
            return kind, text[m.end():].strip() or text.strip()
    return "ask", text.strip()


@dataclass
class PhotoQuestion:
    """A photo's question: ``words``, the person's own (sent with it), and ``seen``, the text
    read from it (what the question is about: an error message, a page). Both are searched;
    only the words are the person's choice: a host name, a prompt or a path on a screenshot is
    no name they ask about (``asking.ask``'s ``seen``)."""

    words: str
    seen: str


def photo_question(caption: str, reading: Reading | None) -> PhotoQuestion:
    return PhotoQuestion(caption.strip(), reading.text.strip() if reading is not None else "")


async def note(parts: "Parts", person: Person, text: str, *, files: list[Attachment] = (),
               origin: Origin | None = None, quote: Quote | None = None, once: str = "",
               on_wait: Waiting | None = None) -> Receipt:
    """``capture.note`` with the files read first: each photo's text under it (marked as
    recognised), each audio file's words as the text after ``text``. A capture made before
    from ``once`` answers at once, reading nothing again."""
    writer = parts.capture() if parts.can_capture else None
    if writer is not None and once:
        again = await writer.made(person.key, person.user_id, once)
        if again is not None:
            return again
    why = capture.unavailable(parts, person)
    if why:  # nowhere to write it: said before any file is read
        return Receipt("refused", why)
    heard, under, notices = [], [], []
    for f in files:
        if not (f.is_image or f.is_audio):
            continue
        problem = ocr_problem(parts) if f.is_image else speech_problem(parts)
        if problem:
            if problem not in notices:
                notices.append(problem)
            continue
        try:
            if f.is_image:
                under.append(recognised(f.filename, (await read(parts, person, f.data, on_wait)).lines))
            else:
                heard.append((await hear(parts, person, f.data, on_wait)).text)
        except NoText:
            continue
        except MediaError as err:
            notices.append(f"{f.filename}: {err}")
    if heard:
        under.append(VOICE_MARK)
    text = "\n\n".join(t for t in (text.strip(), *heard) if t)
    receipt = await capture.note(parts, person, text, origin=origin, files=files, quote=quote, once=once,
                                 after="\n\n".join(under))
    if notices:
        receipt.message = "\n".join([receipt.message, *notices])
    return receipt


@dataclass
class Voice:
    """What a voice message became: ``kind`` "ask" (the door answers ``transcript.text``),
    "note" or "remember" (captured: ``receipt``). ``transcript`` is None when the capture was
    made before (the same message again) or the clip could not be heard (a /note keeps it)."""

    kind: str
    transcript: Transcript | None
    receipt: Receipt | None = None


async def voice(parts: "Parts", person: Person, clip: Attachment, *, command: str = "", typed: str = "",
                once: str = "", on_wait: Waiting | None = None) -> Voice:
    """A voice message or audio file, heard, then handled as if typed: a question, or (said
    "note …" / "remember …", or sent with ``command`` "note") a capture with the words as its
    text and, for a note, the clip attached. ``typed``: words sent with it (the caption after
    /note). ``MediaError`` when it cannot be heard (for a /note: the clip is captured anyway,
    and the receipt says why it has no words)."""
    writer = parts.capture() if parts.can_capture else None
    if writer is not None and once:
        again = await writer.made(person.key, person.user_id, once)
        if again is not None:
            return Voice("note", None, again)
    if command == "note":  # nowhere to write it: said before the clip is heard
        why = capture.unavailable(parts, person)
        if why:
            return Voice("note", None, Receipt("refused", why))
    try:
        transcript = await hear(parts, person, clip.data, on_wait)
    except MediaError as err:
        if command != "note":
            raise
        receipt = await capture.note(parts, person, typed, files=[clip], once=once)
        receipt.message = f"{receipt.message}\n{err}"
        return Voice("note", None, receipt)
    kind, words = ("note", transcript.text) if command == "note" else spoken(transcript.text)
    if kind == "ask":
        return Voice("ask", transcript)
    if kind == "note":
        text = "\n\n".join(t for t in (typed.strip(), words) if t)
        receipt = await capture.note(parts, person, text, files=[clip], once=once, after=VOICE_MARK)
    else:
        receipt = await capture.remember(parts, person, words, once=once)
    return Voice(kind, transcript, receipt)


# --- status messages in flight ---------------------------------------------------------------------


async def shown(parts: "Parts", person: Person, door: str, place: dict) -> int | None:
    """A status message shown for the person's job (``place``: what ``door`` needs to edit it),
    kept until ``settled``. None when it could not be kept (the job goes on all the same)."""
    try:
        return await asyncio.to_thread(parts.media.in_flight.shown, door, person.key, place)
    except (LeanoteRagError, sqlite3.Error) as err:
        log.warning("could not keep a media status message: %s", err)
        return None


async def settled(parts: "Parts", shown_id: int | None) -> None:
    """The job ended, and its status message says what came of it."""
    if shown_id is None:
        return
    try:
        await asyncio.to_thread(parts.media.in_flight.settled, shown_id)
    except (LeanoteRagError, sqlite3.Error) as err:
        log.warning("could not settle a media status message: %s", err)


async def interrupted(parts: "Parts", door: str, tell: Callable[[Shown], Awaitable[None]]) -> int:
    """Each status message of ``door`` whose job a stop or a crash cut off, told (``tell`` edits
    it to say so: ``bot.chat.texts.INTERRUPTED``) and then forgotten, also when telling failed (the
    message deleted, the chat left: said in the log). How many were told."""
    try:
        left = await asyncio.to_thread(parts.media.in_flight.left, door)
    except (LeanoteRagError, sqlite3.Error) as err:
        log.warning("could not read the media status messages in flight: %s", err)
        return 0
    told = 0
    for one in left:
        try:
            await tell(one)
            told += 1
        except Exception as err:  # noqa: BLE001 (whatever the platform said: the next one is told all the same)
            log.info("could not tell %s that their media job was interrupted: %s", one.person, err)
        await settled(parts, one.id)
    if left:
        log.info("%s: %d of %d media status messages left by a stop or a crash now say it was interrupted", door,
                 told, len(left))
    return told
