"""What a door does that is no one person's: the port through which the house tells a person
something unasked, the messages a restart interrupted, what the door offers here.

The port (``tell_with``): while it runs, each door gives the house one ``tell(person, text, once)``
(``person``: ``telegram:111``; ``once``: the message a capture came from, ``telegram:<chat>:<msg>``,
"" when the words answer none). Through it the house tells a person

- of a capture whose receipt they never got (the process ended between taking it and answering:
  ``sync.writeback.capture``), in the chat it came from where the door can, else privately;
- that a note of theirs answers a question their notes could not (``bot.usecases.gaps``), and
  their digest (``bot.usecases.digest``), privately;

each only while the config in force still maps them to the Leanote user it is about
(``bot.usecases.people.reaches``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable

from bot.usecases import capture, gaps
from bot.usecases import media as media_case

if TYPE_CHECKING:
    from bot.root import Parts

Tell = Callable[[str, str, str], Awaitable[None]]  # (person, text, once)


@dataclass(frozen=True)
class _Receipts:
    """The port as the capture writer calls it: ``(person, once, text)`` (equal for the same port)."""

    tell: Tell

    async def __call__(self, person: str, once: str, text: str) -> None:
        await self.tell(person, text, once)


@dataclass(frozen=True)
class _Private:
    """The port as gaps and digests call it: ``(person, text)``."""

    tell: Tell

    async def __call__(self, person: str, text: str) -> None:
        await self.tell(person, text, "")


def tell_with(parts: "Parts", platform: str, tell: Tell) -> None:
    """``platform``'s door tells its people through ``tell`` from now on; the captures written
    while it was not running are told now."""
    gaps.announce_with(parts, platform, _Private(tell))
    capture.announce_with(parts, platform, _Receipts(tell))


def stop_telling(parts: "Parts | None", platform: str, tell: Tell) -> None:
    if parts is not None:
        gaps.stop_announcing(parts, platform, _Private(tell))
        capture.stop_announcing(parts, platform, _Receipts(tell))


async def interrupted(parts: "Parts", platform: str, tell: Callable[[object], Awaitable[None]]) -> int:
    """At a door's start: each status message of its media work a stop or a crash cut off
    (``shown.place``: what the door kept to edit it; ``shown.time``: when), told by ``tell``."""
    return await media_case.interrupted(parts, platform, tell)


def capture_offered(parts: "Parts") -> bool:
    """Whether the doors offer capture here (the capture commands, "Save as note", ✍️)."""
    return capture.offered(parts)


def capture_target(parts: "Parts") -> str:
    """Where captures go, in a word: "leanote", "folder", or "" (nowhere)."""
    return capture.target(parts)
