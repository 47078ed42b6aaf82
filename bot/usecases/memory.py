"""The memory of the notes, as a person reads and corrects it: what it knows about a name, the
notes related to a note or a question, a verdict on a fact or a related pair, and the
explorer page's search, graph and note card.

Always the person's own Leanote user: ``MemoryStore`` keys every row by it, and a correction
id is derived from the user, so another user's id never resolves. Nothing is shown of a note
the index no longer holds (``held_only``): the sync takes a note out of the memory in the pass
it leaves the index, unless that write fails (the memory locked); until the next pass repairs
it, no door names the note.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from rag.errors import UserError
from rag.limits import echoed
from rag.memory import explore
from rag.memory import related as related_mod
from rag.memory.store import MemoryStore

from bot.usecases.people import Person
from bot.usecases.results import About, RelatedNotes, Verdict

if TYPE_CHECKING:
    from bot.root import Parts

VERDICTS = ("rejected", "confirmed")
_ITEM_ID = re.compile(r"^[fp][0-9a-f]{12}$")


class MemoryUnavailable(UserError):
    """The memory cannot be read now: ``reason`` is ``off`` (``memory.enabled: false``) or
    ``not_yet`` (the first sync pass makes it)."""

    def __init__(self, reason: str):
        super().__init__("the memory is off (memory.enabled: false in the config): set it to true and run "
                         "`leanote-rag index`" if reason == "off"
                         else "no memory yet: the first sync pass makes it (`leanote-rag index`, or the service)")
        self.reason = reason


class NotAnItemId(UserError):
    """What was given is not a fact's or pair's id (``f…`` or ``p…``, 13 characters)."""


class UnknownItem(UserError):
    """No fact or pair with that id in the person's memory (another person's, or mistyped)."""


def memory_of(parts: "Parts") -> MemoryStore:
    """The memory as the doors read it, or ``MemoryUnavailable`` saying why not."""
    if not parts.settings.memory.enabled:
        raise MemoryUnavailable("off")
    store = parts.memory_to_read
    if store is None:
        raise MemoryUnavailable("not_yet")
    return store


async def _read(parts: "Parts", work, *args):
    """``work(memory, *args)`` in a worker thread (SQLite WAL: cheap, never blocks the loop)."""
    store = memory_of(parts)
    return await asyncio.to_thread(work, store, *args)


async def held(parts: "Parts", user_id: str, note_ids) -> set[str]:
    """Those of ``note_ids`` the index holds for the user (none while nothing is indexed)."""
    ids = sorted(set(note_ids))
    store = parts.store()
    if not ids or store is None:
        return set()
    if parts.built("answers"):  # on the threads answers search on
        return await parts.answers.in_search_thread(store.holding, user_id, ids)
    return await asyncio.to_thread(store.holding, user_id, ids)


async def held_only(parts: "Parts", user_id: str, *rows, also: tuple[str, ...] = ()) -> list:
    """Each of ``rows`` (notes, facts, a card, a graph) less what names a note the index no
    longer holds; every row list None when a note of ``also`` is not held."""
    found = await held(parts, user_id, explore.note_ids_in(list(rows)) | set(also))
    if any(a not in found for a in also):
        return [None for _ in rows]
    return [explore.indexed_only(r, found) for r in rows]


async def about(parts: "Parts", person: Person, name: str) -> About:
    """The facts about ``name`` and the notes that mention it."""
    facts, notes = await _read(parts, lambda store: (store.facts_about(person.user_id, name),
                                                     store.entity(person.user_id, name)))
    facts, notes = await held_only(parts, person.user_id, facts, notes)
    return About(name, person.user_id, facts, notes)


async def related(parts: "Parts", person: Person, target: str, k: int = 8) -> RelatedNotes:
    """The notes related to ``target``: a note of the person's (its id, or its title's words)
    and its pairs; else a question: the notes a search finds for it, then theirs."""
    user_id = person.user_id
    named = await _read(parts, related_mod.of_note, user_id, target, k)
    if named is not None:
        info, notes = named
        notes, = await held_only(parts, user_id, notes, also=(info["note_id"],))
        if notes is None:
            return RelatedNotes(user_id, [], note_id=info["note_id"], title=info["title"], gone=True)
        return RelatedNotes(user_id, notes, note_id=info["note_id"], title=info["title"])
    hits = await parts.answers.search(target, user_id, k)
    min_score = related_mod.question_min_score(parts.settings, parts.index, user_id)
    notes = await _read(parts, related_mod.for_text, user_id, target, hits, k, min_score)
    notes, = await held_only(parts, user_id, notes)
    return RelatedNotes(user_id, notes, query=target, title=target)


def valid_item_id(item_id: str) -> bool:
    return bool(_ITEM_ID.match((item_id or "").strip()))


async def verdict(parts: "Parts", person: Person, item_id: str, verdict: str) -> Verdict:
    """Reject (it goes, and extraction never brings it back) or confirm a fact or related pair
    of the person's memory. An id of another user's memory changes nothing: ``UnknownItem``."""
    if verdict not in VERDICTS:
        raise UserError(f"verdict must be 'rejected' or 'confirmed', not {echoed(verdict)!r}")
    memory_of(parts)  # the memory's own trouble first
    item_id = (item_id or "").strip()
    if not valid_item_id(item_id):
        raise NotAnItemId(f"{echoed(item_id)!r} is not a fact or pair id (f… or p…, 13 characters, as `leanote-rag memory "
                          f"ENTITY` and `leanote-rag related` show them)")

    def work(store: MemoryStore) -> Verdict:
        try:
            done = store.correct(person.user_id, item_id, verdict, by=person.key)
        except UserError as err:
            raise UnknownItem(str(err)) from None
        titles = [(store.note_info(person.user_id, n) or {}).get("title") or n for n in done.get("notes", [])]
        return Verdict(done, titles)

    return await _read(parts, work)


# --- the explorer page ---------------------------------------------------------------------------

async def find(parts: "Parts", person: Person, text: str, limit: int = 20) -> dict:
    """The person's entities and notes whose name or title holds ``text`` (or a note's id):
    ``{"entities": [{"name", "kind", "notes"}], "notes": [...]}``; an entity only notes that
    left the index name goes too."""
    user_id = person.user_id

    def work(store: MemoryStore) -> dict:  # with the notes each entity stands on
        found = store.find(user_id, text, limit)
        for e in found["entities"]:
            e["_notes"] = {n["note_id"] for n in store.entity(user_id, e["name"])} | \
                {f["note_id"] for f in store.facts_about(user_id, e["name"])}
        return found

    found = await _read(parts, work)
    kept = await held(parts, user_id, {n for e in found["entities"] for n in e["_notes"]}
                      | explore.note_ids_in(found["notes"]))
    entities = []
    for e in found["entities"]:
        mine = e.pop("_notes")
        if mine & kept or not mine:
            entities.append({**e, "notes": len(mine & kept) if mine else e["notes"]})
    return {"entities": entities, "notes": explore.indexed_only(found["notes"], kept)}


async def graph(parts: "Parts", person: Person, entity: str | None = None, note: str | None = None) -> dict | None:
    """The neighbourhood of an entity or of a note (``{"nodes", "edges", ...}``); None when the
    person has no such note."""
    if (entity is None) == (note is None):
        raise UserError("give entity=NAME or note=NOTE_ID")
    user_id = person.user_id
    if entity is not None:
        found = await _read(parts, explore.entity_graph, user_id, entity)
    elif note in await held(parts, user_id, [note]):
        found = await _read(parts, explore.note_graph, user_id, note)
    else:
        memory_of(parts)  # (the memory's own trouble first, as for an entity)
        found = None
    if found is None:
        return None
    return (await held_only(parts, user_id, found))[0]


async def note_card(parts: "Parts", person: Person, note_id: str) -> dict | None:
    """A note as the explorer shows it: title, link, summary, the facts resting on it, its
    entities and related notes with their pair ids; None when the person has no such note."""
    user_id = person.user_id
    if note_id not in await held(parts, user_id, [note_id]):
        memory_of(parts)
        return None
    card = await _read(parts, explore.note_card, user_id, note_id)
    return None if card is None else (await held_only(parts, user_id, card))[0]


# --- the operator's: what the notes are about, and the corrections' history, export and import ---

def memory_users(parts: "Parts") -> dict[str, int]:
    """Notes processed per Leanote user in the memory."""
    return memory_of(parts).users()


def entities(parts: "Parts", person: Person, top: int | None = None, kind: str | None = None) -> list[dict]:
    """What the person's notes are about: the entities most notes mention (``kind``: only those)."""
    return memory_of(parts).entities(person.user_id, top, kind)


def history(parts: "Parts", person: Person, item_id: str) -> dict:
    """A fact's or pair's verdicts (who, when, what) and, for a fact, its supersession history."""
    return memory_of(parts).correction_history(person.user_id, item_id)


def corrections(parts: "Parts", person: Person, user_id: str | None = None) -> dict:
    """Every correction (verdicts and their log) as JSON: ``user_id``'s only, else (an admin)
    every user's."""
    if user_id is None and not person.admin:
        user_id = person.user_id
    return memory_of(parts).export_corrections(user_id)


def apply_corrections(parts: "Parts", person: Person, data: object, user_id: str | None = None) -> dict:
    """Apply corrections as ``corrections`` gave them (``user_id``'s only, else, for an
    admin, every user's); records already there are left as they are."""
    if user_id is None and not person.admin:
        user_id = person.user_id
    return memory_of(parts).import_corrections(data, user_id)
