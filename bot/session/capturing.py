"""What a session does with captures and media (``Session`` takes these): a note, an addition to the
last one, a line to remember, the outbox; a voice clip or a photo heard or read on this machine.

Each check comes before any file is fetched (``may_capture``, ``too_large``, ``voice_check``,
``photo_check``, ``image_problem``): nothing is downloaded, heard or read to be refused after. What
a clip or a photo came to is a ``views.Heard``; a ``MediaError`` becomes its ``reply``. A status
message a door shows while the work runs is kept from ``shown`` to ``settled`` (a restart says it
was interrupted: ``bot.session.doors.interrupted``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Awaitable, Callable

from rag.capture import Attachment, Origin, Quote
from rag.media.audio import too_long
from rag.media.base import MediaError, NoText

from bot.chat.gaps import not_written_text
from bot.chat.texts import heard_line, outbox_text, seen_line
from bot.session.views import Heard, Reply, refusal
from bot.chat.words import REFUSALS, too_large
from bot.usecases import capture, gaps
from bot.usecases import media as media_case

Waiting = Callable[[int], Awaitable[None]] | None
Ready = Callable[[], Awaitable[None]] | None


class Capturing:
    """(A part of ``bot.session.Session``: it has ``parts``, ``who``, ``may_ask``, ``draft_place``.)"""

    def may_capture(self, files: bool = False) -> Reply | None:
        """None when the person may capture now; else why not (this process writes no captures,
        capture is off or has nowhere to write, or, with ``files``, too many captures this
        minute): asked before any file is fetched."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        if not self.parts.can_capture:
            return refusal("no_capture", REFUSALS["no_capture"], "message")
        why = capture.unavailable(self.parts, person) or (capture.too_often(self.parts, person) if files else None)
        return refusal("capture_unavailable", why, "message") if why else None

    def too_large(self, name: str, size: int | None, max_mb: float | None = None) -> Reply | None:
        """A file refused from the size its door says (``capture.max_file_mb``, or ``max_mb``)."""
        most = self.settings.capture.max_file_mb if max_mb is None else max_mb
        if size is not None and size > most * 1024 * 1024:
            return refusal("too_large", too_large(name, most), "message")
        return None

    async def note(self, text: str, *, origin: Origin | None = None, files: list[Attachment] = (),
                   quote: Quote | None = None, once: str = "", on_wait: Waiting = None, ready: Ready = None,
                   title: str = "") -> Reply:
        """A new note: the person's ``text``, someone else's ``quote``, where it came from
        (``origin``), ``files`` attached (a photo's text and a clip's words read first), its
        ``title`` when not the text's first line. Where the note begun with ✍️ takes the next /note
        (``drafts_by`` "note"), a note of text alone (untitled) is it."""
        why = self.may_capture(files=bool(files))
        if why:
            return why
        person = self.who()
        if ready is not None:
            await ready()
        draft = None
        if self.drafts_by == "note" and not files and origin is None and not title:
            draft = await asyncio.to_thread(gaps.take_draft, self.parts, person, self.draft_place)
        if draft is not None:
            receipt = await gaps.write_draft(self.parts, person, draft, text or "", once=once)
            if receipt.status == "refused":  # said with it: the draft is over (✍️ again to retry)
                receipt = replace(receipt, message=not_written_text(draft, receipt.message))
        elif title:
            receipt = await capture.note(self.parts, person, text or "", title=title, once=once)
        else:
            receipt = await media_case.note(self.parts, person, text or "", origin=origin, files=list(files),
                                            quote=quote, once=once, on_wait=on_wait)
        return Reply(receipt.message, receipt=receipt)

    async def append(self, text: str, once: str = "", ready: Ready = None) -> Reply:
        """More text at the end of the person's last capture."""
        return await self._add(capture.append, text, once, ready)

    async def remember(self, text: str, once: str = "", ready: Ready = None) -> Reply:
        """A dated line in the person's memory note."""
        return await self._add(capture.remember, text, once, ready)

    async def _add(self, how, text: str, once: str, ready: Ready) -> Reply:
        why = self.may_capture()
        if why:
            return why
        if ready is not None:
            await ready()
        return Reply((await how(self.parts, self.who(), text or "", once=once)).message)

    async def outbox(self) -> Reply:
        """``/outbox``: the person's captures not written yet, and those refused; privately."""
        why = self.may_capture()
        if why:
            return why
        return Reply(outbox_text(await capture.outbox(self.parts, self.who())), private=True)

    # --- voice clips and photos ------------------------------------------------------------------

    def voice_check(self, duration: float | None, command: str = "") -> Reply | None:
        """Before a voice clip is fetched: with ``command`` "note" (a /note caption), whether the
        person may capture; else whether it can be heard here, is not too long (from the length
        its door says), and the question's count against the rate limit."""
        if command:
            return self.may_capture(files=True)
        person = self.who()
        if isinstance(person, Reply):
            return person
        problem = media_case.speech_problem(self.parts)
        if problem:
            return refusal("no_speech", problem, "message")
        limit = self.settings.media.max_clip
        if duration and duration > limit:
            return refusal("too_long", too_long(limit), "message")
        return self.may_ask()

    def photo_check(self) -> Reply | None:
        """Before a photo with a question is fetched: it can be read here, and the question's count."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        problem = media_case.ocr_problem(self.parts)
        return refusal("no_ocr", problem, "message") if problem else self.may_ask()

    def media_problem(self, kind: str) -> str | None:
        """Why a clip (``audio``) or an image (``image``) cannot be read here, or None."""
        return media_case.speech_problem(self.parts) if kind == "audio" else media_case.ocr_problem(self.parts)

    def image_problem(self, data: bytes) -> Reply | None:
        """What is no image, or too large, said at once (before any status is shown)."""
        try:
            media_case.check_image(self.parts, data)
        except MediaError as err:
            return refusal("not_readable", str(err), "message")
        return None

    async def voice(self, clip: Attachment, command: str = "", typed: str = "", once: str = "",
                    on_wait: Waiting = None) -> Heard:
        """A voice message heard, then a question (``kind`` "ask": ``text``), or captured ("note …",
        "remember …", a /note caption: ``reply`` is the receipt). ``line``: the words heard."""
        try:
            got = await media_case.voice(self.parts, self.who(), clip, command=command, typed=typed, once=once,
                                         on_wait=on_wait)
        except MediaError as err:
            return Heard(reply=refusal("not_heard", str(err), "message"))
        if got.transcript is None:  # captured before (the same message again), or kept without its words
            return Heard(reply=Reply(got.receipt.message))
        heard = Heard(heard_line(got.transcript.line()), got.transcript.text, got.kind)
        if got.kind != "ask":
            heard.reply = Reply(got.receipt.message)
        return heard

    async def hear(self, data: bytes, on_wait: Waiting = None) -> Heard:
        """A clip's words (``/ask file:``): ``line`` and ``text``, or why not (``reply``)."""
        try:
            transcript = await media_case.hear(self.parts, self.who(), data, on_wait)
        except MediaError as err:
            return Heard(reply=refusal("not_heard", str(err), "message"))
        return Heard(heard_line(transcript.line()), transcript.text, "ask")

    async def read(self, data: bytes, caption: str = "", on_wait: Waiting = None) -> Heard:
        """A photo's question: ``text`` the words sent with it, ``seen`` its text as read, ``line``
        what was read (or, when it holds no text, that it holds none: the words are still asked).
        ``reply``: why it cannot be read (also when it holds no text and nothing was asked)."""
        try:
            reading = await media_case.read(self.parts, self.who(), data, on_wait)
        except NoText as err:
            if not caption.strip():
                return Heard(reply=refusal("no_text", str(err), "message"))
            return Heard(str(err), caption.strip(), "ask")
        except MediaError as err:
            return Heard(reply=refusal("not_readable", str(err), "message"))
        asked = media_case.photo_question(caption, reading)
        return Heard(seen_line(" ".join(reading.lines)[:300]), asked.words, "ask", asked.seen)

    async def shown(self, place: dict) -> int | None:
        """A status message shown for the person's media work (``place``: what the door needs to
        edit it later), kept until ``settled``."""
        return await media_case.shown(self.parts, self.who(), self.platform, place)

    async def settled(self, shown_id: int | None) -> None:
        await media_case.settled(self.parts, shown_id)
