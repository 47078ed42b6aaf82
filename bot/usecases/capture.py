"""Writing from chat into the person's own Leanote: a note, more text for the last one, a line
to remember, and what still waits in the outbox. The writing itself, exactly once and in
order through a durable outbox, is ``sync.writeback``'s.

Every call answers with a ``rag.capture.Receipt`` whose ``message`` is ready to show:
written (with the note's link), queued (Leanote is down; retried), or refused (and why).
``once`` names what the capture comes from (``telegram:<chat>:<message>``, a Discord
interaction or message): the same one again writes nothing new and answers with the first
capture's receipt.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Awaitable, Callable

from rag.capture import Attachment, Origin, Quote, Receipt
from rag.errors import UserError

from sync.writeback.targets import kind_of

from bot.usecases.people import Person, reaches

if TYPE_CHECKING:
    from bot.root import Parts
    from sync.writeback.capture import Capture
    from sync.writeback.outbox import Item


class NoCapture(UserError):
    """This process cannot write to Leanote (it is not the daemon)."""

    def __init__(self):
        super().__init__("writing to Leanote is not available here")


def _writer(parts: "Parts") -> "Capture":
    if not parts.can_capture:
        raise NoCapture()
    return parts.capture()


def unavailable(parts: "Parts", person: Person | None = None) -> str | None:
    """Why nothing can be captured (turned off, nowhere to write: a read-only source and no
    Leanote account; for ``person``: a folder holding another user's notes), or None; a door
    asks before it downloads or reads a file. ``NoCapture`` when this process cannot write."""
    return _writer(parts).refused_for(person.user_id if person is not None else "")


def too_often(parts: "Parts", person: Person) -> str | None:
    """Why the person may not capture now (``capture.rate_limit`` a minute used up), or None:
    asked before a file is downloaded or read (a clip is not heard to be refused after). Counts
    nothing: the capture counts when it is made."""
    return _writer(parts).too_often(person.key)


def offered(parts: "Parts") -> bool:
    """Whether the doors offer capture here ("Save as note", ✍️ under /gaps, the capture
    commands): this process writes, capture is on and has somewhere to write."""
    return parts.can_capture and parts.capture().available() is None


def target(parts: "Parts") -> str:
    """Where captures go, in a word for people: "leanote", "folder", or "" (nowhere)."""
    return (kind_of(parts.settings) or "") if parts.settings.capture.enabled else ""


def link(parts: "Parts", note_id: str) -> str:
    """How a chat names a note a capture wrote: its Leanote link, or its path in the notes folder."""
    return parts.capture().link(note_id)[1] if parts.can_capture else parts.note_url(note_id)


async def note(parts: "Parts", person: Person, text: str, *, origin: Origin | None = None,
               files: list[Attachment] = (), quote: Quote | None = None, title: str = "", once: str = "",
               after: str = "") -> Receipt:
    """A new note in the person's inbox notebook: ``text`` is their own (kept as their
    Markdown), ``quote`` someone else's text (a forward, a saved message: shown as written),
    ``origin`` where it came from, ``files`` attached, ``after`` (Markdown) under them: what
    was read from them (``bot.usecases.media.note``); ``title`` when not the text's first line."""
    return await _writer(parts).note(person.key, person.user_id, text, origin=origin, files=list(files), quote=quote,
                                     title=title, once=once, after=after)


def note_once(once: str) -> str:
    """What a note asked for by the command line or the API comes from: the caller's own id for
    it (``--once``), the same with a daemon or without."""
    return f"note:{once}" if once else ""


async def note_here(parts: "Parts", person: Person, text: str, title: str = "", once: str = "") -> Receipt:
    """A note taken and written by this process (the command line with no daemon running): the
    writer runs until the note is written, or found queued (then it waits in the outbox, and the
    daemon writes it when it runs)."""
    writer = parts.capture()
    stopping = asyncio.Event()
    running = asyncio.create_task(writer.run(stopping))
    try:
        return await writer.note(person.key, person.user_id, text, title=title, once=once)
    finally:
        stopping.set()
        await running


async def append(parts: "Parts", person: Person, text: str, once: str = "") -> Receipt:
    """More text at the end of the last note the person captured."""
    return await _writer(parts).append(person.key, person.user_id, text, once=once)


async def remember(parts: "Parts", person: Person, text: str, once: str = "") -> Receipt:
    """A dated line in the person's memory note."""
    return await _writer(parts).remember(person.key, person.user_id, text, once=once)


async def outbox(parts: "Parts", person: Person) -> list["Item"]:
    """The person's captures not yet in Leanote, and those Leanote refused."""
    return await asyncio.to_thread(_writer(parts).pending, person.key)


Announce = Callable[[str, str, str], Awaitable[None]]


def announce_with(parts: "Parts", platform: str, announce: Announce) -> None:
    """``announce(person, once, text)`` tells a person of a capture whose receipt they never
    got (the process ended between taking it and answering): a platform's bot registers it
    while it runs, and the captures written meanwhile are told now. Only to a person the config
    in force still maps to the Leanote user the capture went into (``people.reaches``)."""
    if parts.can_capture:
        writer = parts.capture()
        writer.may_tell = lambda person, user_id: reaches(parts, person, user_id)
        writer.announce_with(platform, announce)


def stop_announcing(parts: "Parts", platform: str, announce: Announce) -> None:
    if parts.can_capture and parts.built("capture"):
        parts.capture().stop_announcing(platform, announce)
