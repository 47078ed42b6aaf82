"""The memory's row helpers, shared by the parts of the store: a note's rows removed with
everything derived from it, mentions added, orphans dropped, jobs queued, facts settled, the keys
of corrections. Each takes the connection of a write under way (``MemoryStore._write``)."""

from __future__ import annotations

import bisect
import hashlib
import json
import sqlite3
from dataclasses import dataclass
from typing import Iterable, Sequence

from rag.memory import entities as extraction
from rag import limits
from rag.memory.entities import Entity, Span, norm
from rag.memory.extract import name_spans
from rag.index.note_index import note_meta
from rag.model import Chunk, Note

from rag.memory.schema import ASKED_JOB, LLM_JOB, MATCH_CHARS, RELATED_JOB, IN_BATCH


@dataclass(frozen=True)
class NoteInfo:
    """How a processed note is shown: the fields of a ``search --json`` hit."""

    title: str = ""
    notebook: str = ""
    url: str = ""
    updated_at: str = ""


@dataclass(frozen=True)
class Mention:
    """An entity's place in a note, ready to store: ``start``/``end`` index the note's
    cleaned text (None for tags); ``point_id`` is the chunk holding ``start``."""

    point_id: str | None
    start: int | None
    end: int | None
    snippet: str = ""


def info_of(note: Note, base_url: str) -> NoteInfo:
    meta = note_meta(note, base_url)
    return NoteInfo(note.title, note.notebook_path, meta["url"], meta["updated_at"])


def mentions_of(entity: Entity, text: str, chunks: Sequence[Chunk], point_ids: Sequence[str]) -> list[Mention]:
    """An entity's spans as stored: each with the point id of the chunk it starts in
    (chunks in order, ``point_ids`` alongside) and a snippet."""
    starts = [c.char_start for c in chunks]
    out = []
    for span in entity.spans:
        i = bisect.bisect_right(starts, span.start) - 1
        point = point_ids[i] if i >= 0 and span.start < chunks[i].char_end else None
        out.append(Mention(point, span.start, span.end, extraction.snippet(text, span)))
    return out


def queue_related(db: sqlite3.Connection, changed: dict[str, str], removed: Sequence[str], now: float) -> int:
    """``related_mark`` in a transaction under way."""
    touched = list(dict.fromkeys([*changed, *removed]))
    gone = set(removed)
    todo = {n: u for n, u in changed.items() if n not in gone}
    for i in range(0, len(touched), IN_BATCH):
        part = touched[i : i + IN_BATCH]
        marks = ",".join("?" * len(part))
        for a, user in db.execute(f"SELECT note_a, user_id FROM related WHERE note_b IN ({marks})", part):
            if a not in gone:
                todo.setdefault(a, user)
    db.executemany(
        "INSERT OR IGNORE INTO jobs(note_id, kind, user_id, content_hash, next_try, created) VALUES (?, ?, ?, '', ?, ?)",
        [(n, RELATED_JOB, u, now, now) for n, u in todo.items()],
    )
    return len(todo)


def llm_payload(text: str, title: str, updated: float | None) -> str:
    """What an LLM job carries: the note's text, title and updated time."""
    return json.dumps({"text": text, "title": title, "updated": updated}, ensure_ascii=False)


def queue_llm(db: sqlite3.Connection, note_id: str, user_id: str, content_hash: str, payload: str, now: float,
              kind: str = LLM_JOB) -> None:
    db.execute(
        "INSERT OR REPLACE INTO jobs(note_id, kind, user_id, content_hash, attempts, next_try, error, parked, "
        "created, payload) VALUES (?,?,?,?,0,?,NULL,0,?,?)",
        (note_id, kind, user_id, content_hash, now, now, payload))


def queue_asked(db: sqlite3.Connection, note_id: str, user_id: str, content_hash: str, payload: str,
                now: float, scope: str = "note") -> None:
    """The note's written questions (``rag.index.asked``) as of ``content_hash``: those of another
    text go; unless written at this text and ``scope`` already, a job is queued (questions of the
    other scope stay until the new ones replace them)."""
    db.execute("DELETE FROM asked WHERE note_id = ? AND content_hash != ?", (note_id, content_hash))
    if db.execute("SELECT 1 FROM asked WHERE note_id = ? AND scope = ?", (note_id, scope)).fetchone() is None:
        queue_llm(db, note_id, user_id, content_hash, payload, now, ASKED_JOB)


def forget_note(db: sqlite3.Connection, note_id: str, keep_jobs: bool = False) -> set[int]:
    """Delete what is derived from the note; the ids of the entities it mentioned."""
    entity_ids = {r[0] for r in db.execute("SELECT DISTINCT entity_id FROM mentions WHERE note_id = ?", (note_id,))}
    row = db.execute("SELECT user_id, terms FROM notes WHERE note_id = ?", (note_id,)).fetchone()
    if row is not None:
        user_id, terms = row[0], json.loads(row[1])
        db.executemany("UPDATE df SET notes = notes - 1 WHERE user_id = ? AND term = ?", [(user_id, t) for t in terms])
        db.execute("DELETE FROM df WHERE user_id = ? AND notes <= 0", (user_id,))
    db.execute("DELETE FROM notes WHERE note_id = ?", (note_id,))
    db.execute("DELETE FROM mentions WHERE note_id = ?", (note_id,))
    db.execute("DELETE FROM facts WHERE note_id = ?", (note_id,))
    db.execute("DELETE FROM related WHERE note_a = ? OR note_b = ?", (note_id, note_id))
    if not keep_jobs:  # (kept: the note is processed again at once, which settles its written questions)
        db.execute("DELETE FROM jobs WHERE note_id = ?", (note_id,))
        db.execute("DELETE FROM asked WHERE note_id = ?", (note_id,))
    return entity_ids


def add_mentions(db: sqlite3.Connection, user_id: str, note_id: str,
                  entities: Sequence[tuple[Entity, Sequence[Mention]]]) -> None:
    rows = []
    for ent, mentions in entities:
        key = ent.norm
        if not key:
            continue
        db.execute("INSERT OR IGNORE INTO entities(user_id, name, norm, kind) VALUES (?,?,?,?)",
                   (user_id, ent.name, key, ent.kind))
        entity_id = db.execute("SELECT id FROM entities WHERE user_id = ? AND norm = ? AND kind = ?",
                               (user_id, key, ent.kind)).fetchone()[0]
        for m in mentions or [Mention(None, None, None)]:
            rows.append((entity_id, user_id, note_id, m.point_id, m.start, m.end, m.snippet))
    db.executemany(
        "INSERT INTO mentions(entity_id, user_id, note_id, point_id, char_start, char_end, snippet) VALUES (?,?,?,?,?,?,?)",
        rows,
    )


def drop_orphans(db: sqlite3.Connection, entity_ids: Iterable[int]) -> None:
    """Delete those of ``entity_ids`` that no mention refers to any more."""
    db.executemany(
        "DELETE FROM entities WHERE id = ? AND NOT EXISTS (SELECT 1 FROM mentions m WHERE m.entity_id = ?)",
        [(i, i) for i in entity_ids],
    )


# --- corrections (helpers) ----------------------------------------------------------------------


def fact_key(subject: str, predicate: str) -> tuple[str, str]:
    """How a fact's group is compared: the subject as written (whitespace collapsed), the
    predicate in lower case."""
    return " ".join(subject.split()), " ".join(predicate.split()).casefold()


def settle_group(db: sqlite3.Connection, user_id: str, subject: str, predicate: str) -> None:
    """The newest note's facts in the group are active, and any fact stating one of their
    objects; the others are superseded by the group's newest fact."""
    rows = db.execute(
        "SELECT id, note_id, object FROM facts WHERE user_id = ? AND subject = ? AND predicate = ? "
        "AND status IN ('active', 'superseded') ORDER BY time DESC, id DESC", (user_id, subject, predicate)).fetchall()
    if not rows:
        return
    head_id, head_note = rows[0][0], rows[0][1]
    current = {o.casefold() for _, n, o in rows if n == head_note}
    for fact_id, _note, obj in rows:
        if obj.casefold() in current:
            db.execute("UPDATE facts SET status = 'active', superseded_by = NULL WHERE id = ?", (fact_id,))
        else:
            db.execute("UPDATE facts SET status = 'superseded', superseded_by = ? WHERE id = ?", (head_id, fact_id))


def settle_all(db: sqlite3.Connection) -> int:
    """``settle_facts`` in a transaction under way."""
    groups = db.execute(
        "SELECT DISTINCT user_id, subject, predicate FROM facts f WHERE status = 'superseded' "
        "AND NOT EXISTS (SELECT 1 FROM facts g WHERE g.id = f.superseded_by AND g.status = 'active')"
    ).fetchall()
    for user_id, subject, predicate in groups:
        settle_group(db, user_id, subject, predicate)
    return len(groups)


def llm_mentions(db: sqlite3.Connection, user_id: str, note_id: str, text: str, found: Sequence[Entity]) -> None:
    """The note's LLM-kind mentions replaced by ``found`` (from ``_llm_entities`` over
    ``text``), each with its snippet and the point id of a no-LLM mention of the note whose
    span holds it (the smallest holding all of it first), else none; entities left without
    mentions deleted."""
    marks = ",".join("?" * len(extraction.LLM_KINDS))
    llm_ids = f"SELECT id FROM entities WHERE user_id = ? AND kind IN ({marks})"
    args = (note_id, user_id, *extraction.LLM_KINDS)
    old = {r[0] for r in db.execute(f"SELECT DISTINCT entity_id FROM mentions WHERE note_id = ? "
                                    f"AND entity_id IN ({llm_ids})", args)}
    db.execute(f"DELETE FROM mentions WHERE note_id = ? AND entity_id IN ({llm_ids})", args)
    if found:
        placed = sorted(db.execute(
            "SELECT char_start, char_end, point_id FROM mentions WHERE note_id = ? AND user_id = ? "
            "AND point_id IS NOT NULL AND char_start IS NOT NULL", (note_id, user_id)).fetchall())

        def point_of(a: int, b: int) -> str | None:
            holding = [(b > e, e - s, p) for s, e, p in placed if s <= a < e]
            return min(holding)[2] if holding else None

        add_mentions(db, user_id, note_id, [
            (ent, [Mention(point_of(sp.start, sp.end), sp.start, sp.end, extraction.snippet(text, sp))
                   for sp in ent.spans]) for ent in found])
    drop_orphans(db, old)


def llm_entities(text: str, entities: Sequence[tuple[str, str]]) -> tuple[list[Entity], int]:
    """The LLM's (name, type) pairs as entities of an ``LLM_KINDS`` kind with their spans in
    ``text`` (``name_spans``), and how many names are not in the text (dropped). One
    entity per (norm, kind)."""
    names = [(" ".join(n.split()), extraction.llm_kind(t)) for n, t in entities if isinstance(n, str) and n.strip()]
    where = name_spans([n for n, _ in names], text)
    out: list[Entity] = []
    seen: set[tuple[str, str]] = set()
    dropped = 0
    for name, kind in names:
        spans = [Span(a, b) for a, b in where.get(name, [])]
        if not spans or not norm(name):
            dropped += 1
            continue
        if (norm(name), kind) in seen:
            continue
        seen.add((norm(name), kind))
        out.append(Entity(name, kind, spans))
    return out, dropped


def correction_target(kind: str, *content: str) -> str:
    """The content a verdict is keyed by: a fact's (subject, predicate, object) as ``norm``,
    a pair's two note ids in order; as JSON."""
    if kind == "fact":
        return json.dumps([norm(c) for c in content], ensure_ascii=False)
    return json.dumps(sorted(content), ensure_ascii=False)


def correction_id(user_id: str, kind: str, target: str) -> str:
    """The id the doors show: ``f``/``p`` and 12 hex digits of the user and the content."""
    digest = hashlib.sha1(f"{user_id}\0{kind}\0{target}".encode("utf-8")).hexdigest()[:12]
    return ("f" if kind == "fact" else "p") + digest


def target_fields(kind: str, target: str, shown: str | None = None) -> dict:
    content = json.loads(shown or target)
    if kind == "fact":
        return dict(zip(("subject", "predicate", "object"), content))
    return {"notes": content}


def is_rejected(db: sqlite3.Connection, user_id: str, kind: str, *content: str) -> bool:
    """Has the user rejected this fact or pair? (The write paths skip it.)"""
    return db.execute("SELECT 1 FROM corrections WHERE user_id = ? AND kind = ? AND target = ? AND verdict = 'rejected'",
                      (user_id, kind, correction_target(kind, *content))).fetchone() is not None


def matched_text(text: str) -> str:
    """What of a text the memory compares with names: its first ``MATCH_CHARS``, as ``norm``."""
    return norm(limits.cut(text, MATCH_CHARS)[0])
