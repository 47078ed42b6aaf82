"""What the buttons under a sent answer do: 👍 / 👎, "Why?", "Save as note".

A button carries only the answer's id; the answer was kept when it was sent (``asking.ask``
with ``keep``). ``pressed`` looks it up and checks it is the presser's own before anything
else (nothing changes, nothing is shown of another person's answer); the door then checks the
presser may still use the bot, and calls the action with the record.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from rag.answer.feedback import Record, UnknownAnswer
from rag.answer.types import Trace
from rag.capture import Receipt
from rag.errors import UserError

from bot.usecases import gaps
from bot.usecases.people import Person
from bot.usecases.results import NotSaved, Why

if TYPE_CHECKING:
    from bot.root import Parts


class Remapped(UserError):
    """The answer came from another Leanote user's notes than the presser's now (``users``
    changed since): neither its trace nor a save into their account."""


def pressed(parts: "Parts", presser: str, answer_id: str) -> Record:
    """The answer under the button, checked to be ``presser``'s (``NotYours`` otherwise);
    ``UnknownAnswer`` when it was never kept or is forgotten. In a worker thread: a read."""
    store = parts.feedback_if_made()
    record = store.get(answer_id, presser) if store is not None else None
    if record is None:
        raise UnknownAnswer("this answer is no longer remembered: ask again")
    return record


def rate(parts: "Parts", person: Person, record: Record, verdict: str) -> Record:
    """The asker's 👍 (``up``) or 👎 (``down``); a later press replaces it. In a worker thread.
    A 👎 keeps the question as one of the person's gaps; a 👍 after it takes it back."""
    done = parts.feedback.verdict(record.id, person.key, verdict)
    if person.user_id == done.user_id:  # (not into another Leanote user's gaps)
        gaps.rated(parts, person, done, verdict)
    return done


def why(person: Person, record: Record) -> Why | None:
    """Why the answer is what it is, from its kept trace (None: none was kept)."""
    if person.user_id != record.user_id:
        raise Remapped("this answer came from another Leanote account's notes: its trace is no longer shown to you")
    if not record.trace:
        return None
    try:
        return Why.of(Trace.from_json(record.trace))
    except TypeError:  # a trace kept by a version whose Trace had other required fields
        return None


async def save_blocked(parts: "Parts", person: Person, record: Record) -> NotSaved | None:
    """Why pressing "Save as note" now saves nothing, or None: ``save_answer`` may go.

    The answer goes into the presser's Leanote once, however often and whenever it is
    pressed: while it is being written, while it waits in the outbox for Leanote, and after
    (``FeedbackStore.mark_saved``). The outbox makes the write itself exactly once (``once``);
    ``parts.saving`` keeps the person told what happened meanwhile."""
    capture = parts.capture() if parts.can_capture else None
    if capture is None:
        return NotSaved("no_capture")
    why = capture.refused_for(person.user_id)
    if why:
        return NotSaved("no_capture", reason=why)
    if record.saved_note_id:
        return NotSaved("saved", capture.link(record.saved_note_id)[1])
    if person.user_id != record.user_id:  # the mapping changed since: not into another account
        return NotSaved("remapped")
    saving = parts.saving
    key = saving.get(record.id)
    if key is None:
        return None
    if key == "":  # a double tap while the first is being written
        return NotSaved("saving")
    waiting = {i.key: i.state for i in await asyncio.to_thread(capture.pending, person.key)}
    if key in waiting:
        if waiting[key] != "failed":
            return NotSaved("queued")
        saving.pop(record.id, None)  # Leanote refused it: another try is the person's to make
        return None
    saving.pop(record.id, None)  # queued then, written since
    note_id = await asyncio.to_thread(capture.note_for, key)
    if note_id:
        await asyncio.to_thread(parts.feedback.mark_saved, record.id, person.key, note_id)
    return NotSaved("saved", capture.link(note_id)[1] if note_id else "")


async def save_answer(parts: "Parts", person: Person, record: Record) -> Receipt:
    """Write the answer as a note into the person's Leanote (after ``save_blocked`` said
    None); the receipt's message is for the person."""
    saving = parts.saving
    saving[record.id] = ""
    try:
        receipt = await parts.capture().save_answer(person.key, record.user_id, record.question, record.answer,
                                                    [dict(c) for c in record.cited], once=f"answer:{record.id}")
    except BaseException:
        saving.pop(record.id, None)
        raise
    if receipt.status == "written" and receipt.note_id:
        await asyncio.to_thread(parts.feedback.mark_saved, record.id, person.key, receipt.note_id)
    if receipt.status == "queued" and receipt.key:
        saving[record.id] = receipt.key  # a second press while it waits says so
    else:
        saving.pop(record.id, None)
    return receipt


def kept(parts: "Parts", person: Person, user_id: str | None = None, since: float | None = None) -> list[dict] | None:
    """The answers the bots sent and the verdicts they got, newest first (for tuning): every
    Leanote user's for an admin (``user_id``'s when given), else the person's own user's; only
    those sent after ``since``. None when no answer was ever kept. In a worker thread: a read."""
    store = parts.feedback_if_made()
    if store is None:
        return None
    if not person.admin:
        user_id = person.user_id
    return store.export(user_id, since)
