"""A digest of a person's notes: what changed in them since the last one, the questions they
could not answer, the notes from this day in earlier years, and related notes that do not
link each other yet. Plain data (``Digest``); the bots render it, the daemon sends it on the
person's plan (``parse_plan``: ``weekly mon 09:00``, ``daily 08:30``, in their time zone).

What it reads: the memory's notes (title, notebook, link, Leanote's ``updated_at``, and when
the index first saw each and last saw its text change) and related pairs (``rag.memory``), the
person's open gaps (``rag.answer.gaps``), and a note's creation time from its id (Leanote's ids
are MongoDB ObjectIds: the first 8 hex digits are the creation time in Unix seconds; a folder's
notes have ids made from their paths, which say nothing of time). Nothing here calls the LLM.

**Added and edited** (``_change``): a Leanote note by its own times (made since the last digest:
added; else updated since: edited). A file of a folder by what the index saw, never by the file's
time or id (a folder copied in a moment ago has every file's time new, and ids made from paths):
the notes its user's first complete pass found are what the notes were, neither added nor edited;
one first seen after that pass is added, one whose text changed after it is edited.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from rag.answer.gaps import Gap, GapStore
from rag.digest_plan import zone

_OBJECT_ID = re.compile(r"^[0-9a-f]{24}$")
_QUOTED = re.compile(r"《([^《》\n]{1,100})》")  # a title named in a note's text: a link to that note
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


def _from_leanote(note: dict) -> bool:
    """Does the note come from Leanote (its id an ObjectId, its updated time Leanote's), not a
    file of a folder (its link a ``file:`` URL)?"""
    return not note.get("url", "").startswith("file:")


def _change(note: dict, since: float, now: float, first_index: float | None) -> tuple[str, float] | None:
    """Whether the note was added or edited in (``since``, ``now``], and when; None: neither."""

    def within(t: float | None) -> bool:
        return t is not None and since < t <= now

    if _from_leanote(note):  # Leanote's own times: when it was made (its id) and last updated
        updated, created = _time_of(note.get("updated_at", "")), created_of(note["note_id"])
        if within(updated):
            return ("added" if created is not None and created > since else "edited"), updated
        return None
    first, changed = note.get("first_seen"), note.get("changed_at")  # a file's: what the index saw
    if first is None or first_index is None:  # kept from before this was kept, or the first pass is not over
        return None
    if first > first_index:
        if within(first):
            return "added", max(first, changed or first)
        return ("edited", changed) if within(changed) else None
    return ("edited", changed) if changed is not None and changed > first_index and within(changed) else None


def compute(memory, gaps: GapStore | None, person: str, user_id: str, since: float, now: float, tz: str,
            min_score: float = 0.0, text_of=None) -> Digest:
    """The digest of ``user_id``'s notes for ``person`` over (``since``, ``now``], days as in
    ``tz``. ``memory`` None (off, not made yet): the gaps alone. ``text_of(note_id)``: a note's
    text, to see the titles it names in 《》 (None: link texts alone)."""
    where = zone(tz)
    digest = Digest(person, user_id, since, now, tz)
    notes = memory.shown_notes(user_id) if memory is not None else []
    shown = {n["note_id"]: n for n in notes}
    first_index = memory.first_index(user_id) if memory is not None else None
    changed = []
    for n in notes:
        found = _change(n, since, now, first_index)
        if found is not None:
            kind, when = found
            changed.append({k: n[k] for k in ("note_id", "title", "notebook", "url", "updated_at")}
                           | {"kind": kind, "updated": when})
    changed.sort(key=lambda c: (-c["updated"], c["note_id"]))
    digest.changed, digest.changed_more = changed[:CHANGED_SHOWN], max(0, len(changed) - CHANGED_SHOWN)

    if gaps is not None:
        open_gaps = gaps.gaps(person, user_id)
        digest.gaps, digest.gaps_more = open_gaps[:GAPS_SHOWN], max(0, len(open_gaps) - GAPS_SHOWN)

    today = datetime.fromtimestamp(now, where)
    earlier = []
    for n in notes:
        created = created_of(n["note_id"]) if _from_leanote(n) else None
        if created is None:
            continue
        day = datetime.fromtimestamp(created, where)
        if (day.month, day.day) == (today.month, today.day) and day.year < today.year:
            earlier.append({k: n[k] for k in ("note_id", "title", "notebook", "url")} | {"year": day.year})
    earlier.sort(key=lambda e: (e["year"], e["title"]))
    digest.this_day = earlier[:THIS_DAY_SHOWN]

    if memory is not None:
        digest.pairs = _unlinked_pairs(memory, user_id, shown, {c["note_id"] for c in changed}, min_score, text_of)
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


def _unlinked_pairs(memory, user_id: str, shown: dict[str, dict], changed: set[str], min_score: float,
                    text_of=None) -> list[dict]:
    """Related pairs whose notes do not link each other (neither's link texts, nor a title it
    names in 《》, name the other: ``names``), those touching a changed note first, then the best.
    Notes' texts are read only for the pairs looked at, until enough are found."""
    links = memory.link_words(user_id)
    quoted: dict[str, set[str]] = {}

    def quotes(note_id: str) -> set[str]:
        if note_id not in quoted:
            quoted[note_id] = set(_QUOTED.findall(text_of(note_id) or "")) if text_of is not None else set()
        return quoted[note_id]

    def names_other(a: str, b: str) -> bool:
        title = shown[b]["title"]
        return any(names(w, title) for w in links.get(a, ())) or any(names(q, title) for q in quotes(a))

    candidates = sorted(((a in changed or b in changed, score, a, b)
                         for a, b, score in memory.best_pairs(user_id, 500, min_score) if a in shown and b in shown),
                        key=lambda f: (not f[0], -f[1], f[2], f[3]))
    found = []
    for _, score, a, b in candidates:
        if not (names_other(a, b) or names_other(b, a)):
            found.append((score, a, b))
            if len(found) == PAIRS_SHOWN:
                break
    return [{"a": {k: shown[a][k] for k in ("note_id", "title", "url")},
             "b": {k: shown[b][k] for k in ("note_id", "title", "url")}, "score": round(score, 4)}
            for score, a, b in found]
