"""A digest of a person's notes: what changed in them since the last one, the questions they
could not answer, the notes from this day in earlier years, and related notes that do not
link each other yet. Plain data (``Digest``); the bots render it, the daemon sends it on the
person's plan (``parse_plan``: ``weekly mon 09:00``, ``daily 08:30``, in their time zone).

What it reads: the memory's notes (title, notebook, link, Leanote's ``updated_at``) and
related pairs (``rag.memory``), the person's open gaps (``rag.answer.gaps``), and a note's
creation time from its id (Leanote's ids are MongoDB ObjectIds: the first 8 hex digits are
the creation time in Unix seconds). Nothing here calls the LLM.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from rag.answer.gaps import Gap, GapStore
from rag.digest_plan import zone

_OBJECT_ID = re.compile(r"^[0-9a-f]{24}$")
_NOT_WORD = re.compile(r"[\W_]+")
_HEAD = re.compile(r"[（(：:—]")

CHANGED_SHOWN = 20  # notes listed as added or edited; the rest counted
GAPS_SHOWN = 5
THIS_DAY_SHOWN = 5
PAIRS_SHOWN = 3


def created_of(note_id: str) -> float | None:
    """When a Leanote note was made, from its id (an ObjectId); None for other ids."""
    return float(int(note_id[:8], 16)) if _OBJECT_ID.match(note_id) else None


def _time_of(updated_at: str) -> float | None:
    if not updated_at:
        return None
    try:
        when = datetime.fromisoformat(updated_at)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


@dataclass
class Digest:
    person: str
    user_id: str
    since: float
    until: float
    tz: str
    changed: list[dict] = field(default_factory=list)  # {note_id, title, notebook, url, kind, updated}, newest first
    changed_more: int = 0
    gaps: list[Gap] = field(default_factory=list)
    gaps_more: int = 0
    this_day: list[dict] = field(default_factory=list)  # {note_id, title, notebook, url, year}
    pairs: list[dict] = field(default_factory=list)  # {a: {note_id, title, url}, b: {...}, score}

    @property
    def empty(self) -> bool:
        return not (self.changed or self.gaps or self.this_day or self.pairs)

    def as_json(self) -> dict:
        data = asdict(self)
        data["empty"] = self.empty
        return data


def compute(memory, gaps: GapStore | None, person: str, user_id: str, since: float, now: float, tz: str,
            min_score: float = 0.0) -> Digest:
    """The digest of ``user_id``'s notes for ``person`` over (``since``, ``now``], days as in
    ``tz``. ``memory`` None (off, not made yet): the gaps alone."""
    where = zone(tz)
    digest = Digest(person, user_id, since, now, tz)
    notes = memory.shown_notes(user_id) if memory is not None else []
    shown = {n["note_id"]: n for n in notes}
    changed = []
    for n in notes:
        updated = _time_of(n["updated_at"])
        if updated is None or not since < updated <= now:
            continue
        created = created_of(n["note_id"])
        kind = "added" if created is not None and created > since else "edited"
        changed.append({**n, "kind": kind, "updated": updated})
    changed.sort(key=lambda c: (-c["updated"], c["note_id"]))
    digest.changed, digest.changed_more = changed[:CHANGED_SHOWN], max(0, len(changed) - CHANGED_SHOWN)

    if gaps is not None:
        open_gaps = gaps.gaps(person, user_id)
        digest.gaps, digest.gaps_more = open_gaps[:GAPS_SHOWN], max(0, len(open_gaps) - GAPS_SHOWN)

    today = datetime.fromtimestamp(now, where)
    earlier = []
    for n in notes:
        created = created_of(n["note_id"])
        if created is None:
            continue
        day = datetime.fromtimestamp(created, where)
        if (day.month, day.day) == (today.month, today.day) and day.year < today.year:
            earlier.append({k: n[k] for k in ("note_id", "title", "notebook", "url")} | {"year": day.year})
    earlier.sort(key=lambda e: (e["year"], e["title"]))
    digest.this_day = earlier[:THIS_DAY_SHOWN]

    if memory is not None:
        digest.pairs = _unlinked_pairs(memory, user_id, shown, {c["note_id"] for c in changed}, min_score)
    return digest


def _bare(text: str) -> str:
    return _NOT_WORD.sub("", text.lower())


def names(label: str, title: str) -> bool:
    """Does a link's text name a note of this title? Its words (two characters or more) are in the
    title, or the title's head (before a bracket, a colon or a dash) is in them: "焯水" names
    "焯水", "Java 内存区域详解" names "Java内存区域详解（重点）". On the corpus's own cross-links
    (bench/related_links.json) this finds 124 of the 137 linked pairs, and a link's text names
    another note of its user 14 times in 77,035 (docs/gaps.md)."""
    words, whole = _bare(label), _bare(title)
    head = _bare(_HEAD.split(title)[0])
    return len(words) >= 2 and (words in whole or (len(head) >= 2 and head in words))


def _unlinked_pairs(memory, user_id: str, shown: dict[str, dict], changed: set[str], min_score: float) -> list[dict]:
    """Related pairs whose notes do not link each other (neither's link texts name the other,
    ``names``), those touching a changed note first, then the best."""
    links = memory.link_words(user_id)

    def linked(a: str, b: str) -> bool:
        return any(names(w, shown[b]["title"]) for w in links.get(a, ())) or \
            any(names(w, shown[a]["title"]) for w in links.get(b, ()))

    found = []
    for a, b, score in memory.best_pairs(user_id, 500, min_score):
        if a in shown and b in shown and not linked(a, b):
            found.append((a in changed or b in changed, score, a, b))
    found.sort(key=lambda f: (not f[0], -f[1], f[2], f[3]))
    return [{"a": {k: shown[a][k] for k in ("note_id", "title", "url")},
             "b": {k: shown[b][k] for k in ("note_id", "title", "url")}, "score": round(score, 4)}
            for _, score, a, b in found[:PAIRS_SHOWN]]
