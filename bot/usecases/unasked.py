"""A message that asks nothing: "Remind me to call the dentist tomorrow", said or typed
(``rag.answer.intent``). It is not answered as a question (no LLM, no knowledge gap); the door
says so and, where capture works, offers "Save as note" under its reply. The message (and a
voice message's clip) is kept here for that button, per person, for ``KEEP`` seconds; a press
captures it once, as a note (``capture.note``, the clip attached), however often it is pressed.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rag.answer.intent import not_a_question
from rag.capture import VOICE_MARK, Attachment, Receipt
from rag.errors import UserError

from bot.usecases import capture
from bot.usecases.people import Person

if TYPE_CHECKING:
    from bot.root import Parts

KEEP = 24 * 3600.0  # how long "Save as note" under the reply works
PER_PERSON = 5  # the newest kept per person (a clip may be megabytes); older ones go
MOST = 200  # and at most this many in all


class Gone(UserError):
    """The message is no longer kept (too old, or the service restarted), or not the presser's."""


@dataclass
class Unasked:
    id: str
    person: str  # the person's key
    text: str
    clip: Attachment | None
    at: float


def check(parts: "Parts", person: Person, text: str, clip: Attachment | None = None,
          clock=time.time) -> Unasked | None:
    """``text`` kept for "Save as note" when it asks nothing (a reminder, a to-do); None when it
    is (or may be) a question, to be answered as one."""
    if not_a_question(text) is None:
        return None
    held: dict[str, Unasked] = parts.unasked
    now = clock()
    for key in [k for k, u in held.items() if now - u.at > KEEP]:
        del held[key]
    mine = sorted((u for u in held.values() if u.person == person.key), key=lambda u: u.at)
    for old in mine[: max(0, len(mine) - PER_PERSON + 1)]:
        del held[old.id]
    for old in sorted(held.values(), key=lambda u: u.at)[: max(0, len(held) - MOST + 1)]:
        del held[old.id]
    item = Unasked(secrets.token_hex(6), person.key, text.strip(), clip, now)
    held[item.id] = item
    return item


def can_save(parts: "Parts") -> bool:
    """May "Save as note" be offered (this process writes captures, and capture is set up)?"""
    return parts.can_capture and capture.unavailable(parts) is None


def kept(parts: "Parts", person: Person, item_id: str) -> Unasked:
    """The message ``item_id`` as kept for ``person``; ``Gone`` when it is no longer kept or is
    someone else's."""
    item = parts.unasked.get(item_id)
    if item is None or item.person != person.key:
        raise Gone("这条消息已经不在了，请用 /note 再发一次。 / That message is no longer kept: send it again "
                   "with /note.")
    return item


async def save(parts: "Parts", person: Person, item: Unasked) -> Receipt:
    """The kept message (``kept``) as a note of ``person`` (its clip attached, marked as
    transcribed); the first note's receipt again on a second press."""
    files = [item.clip] if item.clip is not None else []
    return await capture.note(parts, person, item.text, files=files, once=f"unasked:{item.id}",
                              after=VOICE_MARK if item.clip is not None else "")
