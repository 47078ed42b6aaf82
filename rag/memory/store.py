"""The memory of the notes: what each note is about, kept beside the index.

One SQLite file, ``<state_dir>/memory.sqlite`` (WAL: the CLI reads it while the daemon
writes), with a schema version (``PRAGMA user_version``) and migrations. Everything in it
is derived from a note and carries that note's id, so it changes or goes in the same
step as the note's chunks (``sync.indexer`` calls ``replace_note``/``remove_note`` right
after it commits the note's state row), and everything is keyed by the Leanote user:
no call made for one user reaches another's rows.

- ``notes``: one row per processed note: its user, the content hash and extraction
  version it was processed at, the tier done (``terms``: the no-LLM tier), when, the
  title/notebook/url/updated time to show it (from the ``Note``), its candidate terms
  (for ``df``), a summary and what its LLM extraction cost (the LLM tier).
- ``entities``: (user, kind, norm) -> id and the name as first written; kinds are
  ``rag.memory.entities.KINDS``: the no-LLM tier's and the LLM tier's typed entities
  (``LLM_KINDS``, stored by ``store_llm`` at their places in the text). An entity no note
  mentions any more is deleted.
- ``mentions``: an entity in a note: the chunk (point id) it falls in, its span as
  offsets into the note's *cleaned* text (``rag.index.clean``, the text the chunks are cut
  from; NULL for tags, which are not in the text) and a one-line snippet.
- ``df``: per user and term, how many of the user's notes hold it (the IDF of
  distinctive terms).
- ``facts``: the LLM tier's relations, each with the quote it rests on, its note, time,
  status (active or superseded) and what superseded it.
- ``related``: related note pairs with their score and reasons (``rag.memory.related``).
- ``jobs``: the LLM tier's queue (``sync.memory_jobs``) and related-notes recomputes.
- ``corrections``: verdicts on facts and pairs, per user and keyed by content, not by
  note, so they outlive re-extraction; ``correction_log`` keeps every verdict given.

``remove_note`` clears a note's mentions, facts, pairs and jobs in one transaction.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from rag.memory import entities as extraction
from rag import limits
from rag.config import Settings, prepare_state_dir
from rag.memory.entities import VERSION, Entity, Span, norm
from rag.errors import UserError
from rag.memory.extract import name_spans
from rag.index.note_index import PreparedNote, note_meta
from rag.model import Chunk, Note
from rag.sqlite import LockedDB

FILE = "memory.sqlite"
TIER_TERMS = "terms"
_IN_BATCH = 500  # SQLite's variable limit is far above; keeps statements small
# The most of a text (a question) the memory compares with names: what a question may hold
# (limits.question_chars at most), so however long the text, the matching's work is bounded.
MATCH_CHARS = 20_000

MIGRATIONS = [
    """
    CREATE TABLE notes (
        note_id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        version INTEGER NOT NULL,
        tier TEXT NOT NULL,
        processed_at REAL NOT NULL,
        title TEXT NOT NULL DEFAULT '',
        notebook TEXT NOT NULL DEFAULT '',
        url TEXT NOT NULL DEFAULT '',
        updated_at TEXT NOT NULL DEFAULT '',
        terms TEXT NOT NULL DEFAULT '[]',
        summary TEXT
    );
    CREATE INDEX notes_user ON notes(user_id);
    CREATE TABLE entities (
        id INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        name TEXT NOT NULL,
        norm TEXT NOT NULL,
        kind TEXT NOT NULL,
        UNIQUE (user_id, norm, kind)
    );
    CREATE TABLE mentions (
        entity_id INTEGER NOT NULL REFERENCES entities(id),
        user_id TEXT NOT NULL,
        note_id TEXT NOT NULL,
        point_id TEXT,
        char_start INTEGER,
        char_end INTEGER,
        snippet TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX mentions_note ON mentions(note_id);
    CREATE INDEX mentions_entity ON mentions(entity_id, note_id);
    CREATE TABLE df (
        user_id TEXT NOT NULL,
        term TEXT NOT NULL,
        notes INTEGER NOT NULL,
        PRIMARY KEY (user_id, term)
    ) WITHOUT ROWID;
    CREATE TABLE facts (
        id INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        subject TEXT NOT NULL,
        predicate TEXT NOT NULL,
        object TEXT NOT NULL,
        quote TEXT NOT NULL,
        note_id TEXT NOT NULL,
        point_id TEXT,
        char_start INTEGER,
        char_end INTEGER,
        time REAL,
        origin TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'active',
        superseded_by INTEGER,
        created REAL NOT NULL
    );
    CREATE INDEX facts_note ON facts(note_id);
    CREATE INDEX facts_subject ON facts(user_id, subject, predicate);
    CREATE TABLE related (
        user_id TEXT NOT NULL,
        note_a TEXT NOT NULL,
        note_b TEXT NOT NULL,
        score REAL NOT NULL,
        reasons TEXT NOT NULL DEFAULT '{}',
        computed_at REAL NOT NULL,
        PRIMARY KEY (note_a, note_b)
    );
    CREATE INDEX related_b ON related(note_b);
    CREATE TABLE jobs (
        note_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        user_id TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_try REAL NOT NULL,
        error TEXT,
        parked INTEGER NOT NULL DEFAULT 0,
        created REAL NOT NULL,
        PRIMARY KEY (note_id, kind)
    );
    CREATE INDEX jobs_next ON jobs(parked, next_try);
    CREATE TABLE corrections (
        id INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        verdict TEXT NOT NULL,
        comment TEXT,
        at REAL NOT NULL,
        UNIQUE (user_id, kind, target)
    );
    """,
    # facts and jobs (the LLM tier): a job carries what it extracts from (the note's text,
    # title and updated time), a note what its LLM extraction cost (calls, tokens, drops)
    """
    ALTER TABLE jobs ADD COLUMN payload TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE notes ADD COLUMN llm TEXT
    """,
    # the log of verdicts (corrections). IF NOT EXISTS: before this migration the table was
    # created on first use (by a ``_corrections_ready`` since removed), so a store that
    # recorded a verdict already holds it, with this very shape, and keeps its rows
    """
    CREATE TABLE IF NOT EXISTS correction_log (
        id INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        verdict TEXT NOT NULL,
        by TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS correction_log_target ON correction_log(user_id, kind, target)
    """,
    # facts by their subject as compared (``norm``), for the facts about what a question
    # names (``facts_named``) without reading all the user's facts. Rows written before
    # this migration get theirs when the store is opened (``_norm_subjects``: SQL has no
    # ``norm``)
    """
    ALTER TABLE facts ADD COLUMN subject_norm TEXT;
    CREATE INDEX facts_subject_norm ON facts(user_id, status, subject_norm)
    """,
]


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


def path_for(settings: Settings) -> Path:
    return Path(settings.state_dir) / FILE


class MemoryStore(LockedDB):
    """One connection behind a lock: the sync thread writes, the API and bots read.
    ``busy_timeout``: seconds a write waits for another connection's write before it fails
    (``sqlite3.OperationalError``: the sync logs it and its next pass brings the memory in line)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time, busy_timeout: float = 10.0):
        super().__init__(path, MIGRATIONS, "a readable memory store ({err}). Move it aside: a new one is built "
                         "as notes are indexed (`leanote-rag index --reconcile` processes them all)")
        self.db.execute(f"PRAGMA busy_timeout = {max(0, int(busy_timeout * 1000))}")
        self.clock = clock
        self._writes = 0  # this connection's commits (``_names``)
        self._name_index: dict[str, tuple[tuple[int, int], dict[str, list[str]]]] = {}
        self._norm_subjects()

    @classmethod
    def open_for(cls, settings: Settings) -> "MemoryStore":
        prepare_state_dir(settings.state_dir)
        return cls(path_for(settings), busy_timeout=settings.memory.busy_timeout)

    def _norm_subjects(self) -> None:
        """Facts without ``subject_norm`` (written before the migration that added it) get it."""
        with self._lock:
            rows = self.db.execute("SELECT id, subject FROM facts WHERE subject_norm IS NULL").fetchall()
        if rows:
            self._write(lambda db: db.executemany("UPDATE facts SET subject_norm = ? WHERE id = ?",
                                                  [(norm(s), i) for i, s in rows]))

    def _write(self, work: Callable[[sqlite3.Connection], object]):
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                result = work(self.db)
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
            self._writes += 1
            return result

    # --- what the indexer calls ---------------------------------------------------------------

    def known(self, note_id: str) -> str | None:
        """The content hash the note was processed at by this extraction version, else None."""
        with self._lock:
            row = self.db.execute("SELECT content_hash, version FROM notes WHERE note_id = ?", (note_id,)).fetchone()
        return row[0] if row is not None and row[1] == VERSION else None

    def hashes(self) -> dict[str, str]:
        """Every note processed by this extraction version, with the content hash it was at."""
        with self._lock:
            return dict(self.db.execute("SELECT note_id, content_hash FROM notes WHERE version = ?", (VERSION,)))

    def processed(self) -> set[str]:
        """The notes processed by this extraction version (any user)."""
        with self._lock:
            return {r[0] for r in self.db.execute("SELECT note_id FROM notes WHERE version = ?", (VERSION,))}

    def holdings(self) -> dict[str, str]:
        """Every note anything here is derived from, with its user as processed ("" when
        only facts or pairs name it: they are written with their note's row, so that is
        left over): processed notes, queued jobs, facts, related pairs on either side.
        (Mentions and the terms' counts are written and deleted with their note's row, in
        one transaction.) What the sync compares with the notes the index holds
        (``sync.service``); each query reads an index, none a table."""
        with self._lock:
            held = dict(self.db.execute("SELECT note_id, user_id FROM jobs"))
            held.update(self.db.execute("SELECT note_id, user_id FROM notes"))
            for sql in ("SELECT DISTINCT note_id FROM facts", "SELECT DISTINCT note_a FROM related",
                        "SELECT DISTINCT note_b FROM related"):
                for (note_id,) in self.db.execute(sql):
                    held.setdefault(note_id, "")
        return held

    def labels(self) -> dict[str, tuple[str, str, str, frozenset[str]]]:
        """How each processed note is shown: note id -> (user, title, notebook, its tags as
        ``norm``), for the sync to compare with the index (a retag whose write failed)."""
        with self._lock:
            rows = self.db.execute("SELECT note_id, user_id, title, notebook FROM notes").fetchall()
            tags: dict[str, set[str]] = {}
            # the tag entities first, then their mentions by index (not every mention)
            for note_id, key in self.db.execute("SELECT m.note_id, e.norm FROM entities e CROSS JOIN mentions m "
                                                "ON m.entity_id = e.id WHERE e.kind = 'tag'"):
                tags.setdefault(note_id, set()).add(key)
        return {n: (u, t, nb, frozenset(tags.get(n, ()))) for n, u, t, nb in rows}

    def relabel(self, user_id: str, note_id: str, title: str, notebook: str, tags: Iterable[str]) -> None:
        """``update_meta`` with the title, notebook and tags given; the link and the updated
        time stay as they are."""
        with self._lock:
            row = self.db.execute("SELECT url, updated_at FROM notes WHERE note_id = ? AND user_id = ?",
                                  (note_id, user_id)).fetchone()
        if row is not None:
            self.update_meta(user_id, note_id, NoteInfo(title, notebook, row[0], row[1]), extraction.tags(tags))

    def term_stats(self, user_id: str, note_id: str, terms: Sequence[str]) -> tuple[dict[str, int], int]:
        """Document frequencies of ``terms`` over the user's notes other than ``note_id``,
        and how many those notes are."""
        with self._lock:
            row = self.db.execute("SELECT user_id, terms FROM notes WHERE note_id = ?", (note_id,)).fetchone()
            own = set(json.loads(row[1])) if row is not None and row[0] == user_id else set()
            notes = self.db.execute("SELECT COUNT(*) FROM notes WHERE user_id = ?", (user_id,)).fetchone()[0]
            df: dict[str, int] = {}
            terms = list(terms)
            for i in range(0, len(terms), _IN_BATCH):
                part = terms[i : i + _IN_BATCH]
                sql = f"SELECT term, notes FROM df WHERE user_id = ? AND term IN ({','.join('?' * len(part))})"
                for term, n in self.db.execute(sql, (user_id, *part)):
                    df[term] = n - (term in own)
        return {t: n for t, n in df.items() if n > 0}, notes - (row is not None and row[0] == user_id)

    def replace_note(
        self,
        user_id: str,
        note_id: str,
        content_hash: str,
        entities: Sequence[tuple[Entity, Sequence[Mention]]],
        *,
        terms: Iterable[str] = (),
        info: NoteInfo = NoteInfo(),
        llm_job: str | None = None,
    ) -> None:
        """The note's entities as of ``content_hash``, in one transaction: its old mentions
        go, the new ones come, entities left without mentions are deleted; with ``llm_job``
        (``_llm_payload``) its LLM extraction is queued in the same transaction."""
        terms = sorted(set(terms))

        def work(db: sqlite3.Connection) -> None:
            old = _forget(db, note_id, keep_jobs=True)
            db.execute(
                "INSERT INTO notes(note_id, user_id, content_hash, version, tier, processed_at, title, notebook, url, "
                "updated_at, terms) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (note_id, user_id, content_hash, VERSION, TIER_TERMS, self.clock(), info.title, info.notebook,
                 info.url, info.updated_at, json.dumps(terms, ensure_ascii=False)),
            )
            db.executemany(
                "INSERT INTO df(user_id, term, notes) VALUES (?, ?, 1) "
                "ON CONFLICT(user_id, term) DO UPDATE SET notes = notes + 1",
                [(user_id, t) for t in terms],
            )
            _add_mentions(db, user_id, note_id, entities)
            _drop_orphans(db, old)
            if llm_job is not None:
                _queue_llm(db, note_id, user_id, content_hash, llm_job, self.clock())

        self._write(work)

    def update_meta(self, user_id: str, note_id: str, info: NoteInfo, tag_entities: Sequence[Entity]) -> None:
        """A note moved, renamed or retagged without a change of text: how it is shown, and
        its tags. Nothing when the note was never processed."""

        def work(db: sqlite3.Connection) -> None:
            if db.execute("SELECT 1 FROM notes WHERE note_id = ? AND user_id = ?", (note_id, user_id)).fetchone() is None:
                return
            db.execute("UPDATE notes SET title = ?, notebook = ?, url = ?, updated_at = ? WHERE note_id = ?",
                       (info.title, info.notebook, info.url, info.updated_at, note_id))
            tag_ids = "SELECT id FROM entities WHERE kind = 'tag' AND user_id = ?"
            old = {r[0] for r in db.execute(f"SELECT entity_id FROM mentions WHERE note_id = ? AND entity_id IN ({tag_ids})",
                                            (note_id, user_id))}
            db.execute(f"DELETE FROM mentions WHERE note_id = ? AND entity_id IN ({tag_ids})", (note_id, user_id))
            _add_mentions(db, user_id, note_id, [(e, [Mention(None, None, None)]) for e in tag_entities])
            _drop_orphans(db, old)

        self._write(work)

    def reset(self) -> None:
        """Forget everything derived (the index is being rebuilt: it all comes back from the
        notes); the people's corrections stay."""
        def work(db: sqlite3.Connection) -> None:
            for table in ("mentions", "entities", "notes", "df", "facts", "related", "jobs"):
                db.execute(f"DELETE FROM {table}")

        self._write(work)

    def remove_note(self, note_id: str) -> None:
        """Everything derived from the note goes: mentions, its terms' counts, facts,
        related pairs on either side, jobs; entities left without mentions too."""

        def work(db: sqlite3.Connection) -> None:
            _drop_orphans(db, _forget(db, note_id))

        self._write(work)

    def remove_notes(self, note_ids: Iterable[str]) -> int:
        """Notes the index no longer holds lose everything derived from them, all in one
        transaction: as ``remove_note`` for each, the notes whose pairs pointed at them
        queued for their related notes, the fact groups they led settled. How many notes
        had anything here."""
        ids = sorted(set(note_ids))

        def work(db: sqlite3.Connection) -> int:
            _queue_related(db, {}, ids, self.clock())
            had, orphans = 0, set()
            for note_id in ids:
                before = db.total_changes
                orphans |= _forget(db, note_id)
                had += db.total_changes > before
            _drop_orphans(db, orphans)
            _settle_all(db)
            return had

        return self._write(work) if ids else 0

    def remember(self, prepared: PreparedNote, base_url: str, *, queue_llm: bool = False) -> int:
        """Extract a prepared note's entities (the no-LLM tier) and put them in place of
        its old ones (with ``queue_llm``, its LLM extraction queued in the same
        transaction); how many entities it has."""
        note = prepared.note
        chunks = [pc.chunk for pc in prepared.chunks]
        points = [pc.point_id for pc in prepared.chunks]
        text = extraction.text_of(chunks)
        found = extraction.extract(
            text, title=note.title, tag_names=note.tags,
            stats=lambda terms: self.term_stats(note.user_id, note.id, terms),
        )
        rows = [(ent, mentions_of(ent, text, chunks, points)) for ent in found.entities]
        job = None
        if queue_llm:
            updated = note.updated_at.timestamp() if note.updated_at is not None else None
            job = _llm_payload(text, note.title, updated)
        self.replace_note(note.user_id, note.id, prepared.content_hash, rows, terms=found.terms,
                          info=info_of(note, base_url), llm_job=job)
        return len(rows)

    def remember_meta(self, note: Note, base_url: str) -> None:
        """A note moved, renamed or retagged (same text): ``update_meta`` from the note."""
        self.update_meta(note.user_id, note.id, info_of(note, base_url), extraction.tags(note.tags))

    # --- related notes (rag.memory.related) ------------------------------------------------------------
    # Pairs are stored per direction: a row (note_a, note_b) puts note_b in note_a's list. Computing
    # a note writes its own list and the mirror rows, so a new note shows up in its neighbours'
    # lists without recomputing them. Notes to recompute wait as jobs of kind ``related``.

    RELATED_JOB = "related"

    def related_mark(self, changed: dict[str, str], removed: Iterable[str] = ()) -> int:
        """Before the memory follows a transaction (``_forget`` drops pairs on both sides):
        queue the ``changed`` notes (note id -> user) and every note whose stored pairs point
        at a changed or ``removed`` note. How many notes are queued."""
        removed = list(removed)
        if not changed and not removed:
            return 0
        return self._write(lambda db: _queue_related(db, changed, removed, self.clock()))

    def related_jobs(self) -> list[tuple[str, str]]:
        """Notes waiting for their related notes: (note id, user), oldest first."""
        with self._lock:
            return self.db.execute("SELECT note_id, user_id FROM jobs WHERE kind = ? ORDER BY created, note_id",
                                   (self.RELATED_JOB,)).fetchall()

    def related_done(self, note_ids: Iterable[str]) -> None:
        self._write(lambda db: db.executemany("DELETE FROM jobs WHERE note_id = ? AND kind = ?",
                                              [(n, self.RELATED_JOB) for n in note_ids]))

    def note_users(self, note_ids: Iterable[str]) -> dict[str, str]:
        """Processed notes among ``note_ids``: note id -> user."""
        ids = list(note_ids)
        out: dict[str, str] = {}
        with self._lock:
            for i in range(0, len(ids), _IN_BATCH):
                part = ids[i : i + _IN_BATCH]
                sql = f"SELECT note_id, user_id FROM notes WHERE note_id IN ({','.join('?' * len(part))})"
                out.update(self.db.execute(sql, part))
        return out

    def shared_entities(self, user_id: str, note_id: str, max_notes: int) -> list[tuple[str, str, str, int]]:
        """The note's entities mentioned by 2..``max_notes`` of the user's notes, with the
        other notes mentioning them: (other note id, entity name, kind, notes mentioning it)."""
        with self._lock:
            return self.db.execute(
                "WITH mine AS (SELECT DISTINCT entity_id FROM mentions WHERE note_id = ? AND user_id = ?), "
                "rare AS (SELECT m.entity_id, COUNT(DISTINCT m.note_id) AS n FROM mentions m "
                "  JOIN mine ON mine.entity_id = m.entity_id WHERE m.user_id = ? GROUP BY m.entity_id "
                "  HAVING n BETWEEN 2 AND ?) "
                "SELECT DISTINCT m.note_id, e.name, e.kind, rare.n FROM rare "
                "JOIN mentions m ON m.entity_id = rare.entity_id JOIN entities e ON e.id = rare.entity_id "
                "WHERE m.note_id != ? AND m.user_id = ? ORDER BY m.note_id, e.name",
                (note_id, user_id, user_id, max_notes, note_id, user_id),
            ).fetchall()

    def replace_related(self, user_id: str, note_id: str, pairs: Sequence[tuple[str, float, dict, dict]]) -> None:
        """The note's related notes: (other note, score, reasons seen from the note, reasons
        seen from the other), in place of its old list; mirror rows for the others. Notes
        not in the memory as the same user's are left out."""

        def work(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM related WHERE note_a = ?", (note_id,))
            if db.execute("SELECT 1 FROM notes WHERE note_id = ? AND user_id = ?", (note_id, user_id)).fetchone() is None:
                return
            now = self.clock()
            for other, score, reasons, mirror in pairs:
                if other == note_id or db.execute("SELECT 1 FROM notes WHERE note_id = ? AND user_id = ?",
                                                  (other, user_id)).fetchone() is None:
                    continue
                if _rejected(db, user_id, "pair", note_id, other):
                    continue  # a person rejected the pair (corrections)
                db.execute("INSERT OR REPLACE INTO related(user_id, note_a, note_b, score, reasons, computed_at) "
                           "VALUES (?,?,?,?,?,?)",
                           (user_id, note_id, other, score, json.dumps(reasons, ensure_ascii=False), now))
                db.execute("INSERT OR REPLACE INTO related(user_id, note_a, note_b, score, reasons, computed_at) "
                           "VALUES (?,?,?,?,?,?)",
                           (user_id, other, note_id, score, json.dumps(mirror, ensure_ascii=False), now))

        self._write(work)

    def related_of(self, user_id: str, note_id: str, limit: int | None = None, min_score: float = 0.0) -> list[dict]:
        """The note's stored related notes, best first, with the fields of a ``search --json``
        hit plus ``reasons``."""
        sql = ("SELECT r.note_b, n.title, n.notebook, n.url, r.score, r.reasons FROM related r "
               "JOIN notes n ON n.note_id = r.note_b AND n.user_id = r.user_id "
               "WHERE r.note_a = ? AND r.user_id = ? AND r.score >= ? ORDER BY r.score DESC, r.note_b")
        args: list = [note_id, user_id, min_score]
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        with self._lock:
            rows = self.db.execute(sql, args).fetchall()
        return [{"note_id": b, "title": t, "notebook": nb, "url": u, "score": round(s, 4), "reasons": json.loads(r)}
                for b, t, nb, u, s, r in rows]

    def notes_titled(self, user_id: str, words: str, limit: int = 20) -> list[dict]:
        """The user's notes whose title holds ``words`` (as written, case aside): note id and title."""
        with self._lock:
            rows = self.db.execute("SELECT note_id, title FROM notes WHERE user_id = ? AND instr(lower(title), lower(?)) > 0 "
                                   "ORDER BY length(title), note_id LIMIT ?", (user_id, words, limit)).fetchall()
        return [{"note_id": n, "title": t} for n, t in rows]

    def note_info(self, user_id: str, note_id: str) -> dict | None:
        """How a processed note of the user is shown, or None."""
        with self._lock:
            row = self.db.execute("SELECT title, notebook, url FROM notes WHERE note_id = ? AND user_id = ?",
                                  (note_id, user_id)).fetchone()
        return None if row is None else {"note_id": note_id, "title": row[0], "notebook": row[1], "url": row[2]}

    # --- end of related notes ----------------------------------------------------------------

    # --- corrections --------------------------------------------------------------------------
    # A person's verdict on a fact or a related pair, per Leanote user, keyed by content and
    # not by row id, so it outlives re-extraction: a fact by its (subject, predicate, object),
    # a pair by its two notes in either order (``correction_target``). ``rejected`` is a
    # tombstone: the rows go now and ``store_llm``/``replace_related`` never write them
    # again. ``confirmed`` marks the fact or pair; a confirmed fact is still superseded by a
    # newer note stating another object (the notes are the truth), and the doors show it as
    # confirmed and superseded, never dropped quietly. The ids the doors show
    # (``correction_id``) are derived from the user and the content, so they are stable
    # across re-extraction and no other user's id resolves. Every verdict is logged in
    # ``correction_log``.

    def resolve_correction(self, user_id: str, item_id: str) -> dict:
        """What a fact or pair id of the user names: kind, target (content), id; the fact
        rows or pair it covers now (none once rejected). UserError when it is not the user's."""
        item_id = item_id.strip()
        kind = {"f": "fact", "p": "pair"}.get(item_id[:1])
        if kind is None or len(item_id) != 13:
            raise UserError(f"{item_id!r} is not a fact or pair id (f… or p…, 13 characters, as `leanote-rag memory "
                            f"ENTITY` and `leanote-rag related` show them)")
        with self._lock:
            if kind == "fact":
                rows = self.db.execute("SELECT subject, predicate, object FROM facts WHERE user_id = ?",
                                       (user_id,)).fetchall()
                targets = [(correction_target("fact", *r), list(r)) for r in rows]
            else:
                rows = self.db.execute("SELECT note_a, note_b FROM related WHERE user_id = ? AND note_a < note_b",
                                       (user_id,)).fetchall()
                targets = [(correction_target("pair", *r), list(r)) for r in rows]
            targets += [(t, json.loads(c) if c else None) for t, c in self.db.execute(
                "SELECT target, comment FROM corrections WHERE user_id = ? AND kind = ?", (user_id, kind))]
        for target, shown in targets:
            if correction_id(user_id, kind, target) == item_id:
                return {"id": item_id, "kind": kind, "target": target, "user_id": user_id, "shown": shown}
        raise UserError(f"no {kind} {item_id} in the memory of user {user_id} (ids are per user: "
                        f"`leanote-rag memory ENTITY --user {user_id}` lists the facts, `related` the pairs)")

    def correct(self, user_id: str, item_id: str, verdict: str, by: str = "cli") -> dict:
        """Reject or confirm the user's fact or pair ``item_id``; what was done (``changed``
        False when it already had that verdict, ``removed`` the rows a rejection deleted)."""
        found = self.resolve_correction(user_id, item_id)
        return self.apply_correction(user_id, found["kind"], found["target"], verdict, by=by, shown=found["shown"])

    def apply_correction(self, user_id: str, kind: str, target: str, verdict: str, *, by: str = "cli",
                         at: float | None = None, shown: Sequence[str] | None = None) -> dict:
        """Record a verdict on a target (``correction_target``; ``shown``: the content as
        written, kept to show it); a rejection deletes the fact rows (their groups settled
        again) or both rows of the pair."""
        if verdict not in ("rejected", "confirmed") or kind not in ("fact", "pair"):
            raise UserError(f"cannot record {verdict!r} on a {kind!r}")
        when = self.clock() if at is None else at

        def work(db: sqlite3.Connection) -> dict:
            row = db.execute("SELECT verdict, comment FROM corrections WHERE user_id = ? AND kind = ? AND target = ?",
                             (user_id, kind, target)).fetchone()
            changed = row is None or row[0] != verdict
            comment = json.dumps(list(shown), ensure_ascii=False) if shown else (row[1] if row else None)
            if changed:
                db.execute("INSERT OR REPLACE INTO corrections(user_id, kind, target, verdict, comment, at) "
                           "VALUES (?,?,?,?,?,?)", (user_id, kind, target, verdict, comment, when))
                db.execute("INSERT INTO correction_log(user_id, kind, target, verdict, by, at) VALUES (?,?,?,?,?,?)",
                           (user_id, kind, target, verdict, by, when))
            removed = 0
            if verdict == "rejected":
                content = json.loads(target)
                if kind == "fact":
                    ids = [(i, s, p) for i, s, p, o in db.execute(
                        "SELECT id, subject, predicate, object FROM facts WHERE user_id = ?", (user_id,))
                        if correction_target("fact", s, p, o) == target]
                    db.executemany("DELETE FROM facts WHERE id = ?", [(i,) for i, _, _ in ids])
                    for subject, predicate in {(s, p) for _, s, p in ids}:
                        _settle_group(db, user_id, subject, predicate)
                    removed = len(ids)
                else:
                    a, b = content
                    removed = db.execute("DELETE FROM related WHERE user_id = ? AND ((note_a = ? AND note_b = ?) "
                                         "OR (note_a = ? AND note_b = ?))", (user_id, a, b, b, a)).rowcount
            return {"id": correction_id(user_id, kind, target), "kind": kind, "user_id": user_id,
                    "verdict": verdict, "changed": changed, "removed": removed,
                    **_target_fields(kind, target, comment)}

        return self._write(work)

    def verdicts(self, user_id: str, kind: str) -> dict[str, str]:
        """The user's verdicts on facts or pairs: target -> verdict."""
        with self._lock:
            return dict(self.db.execute("SELECT target, verdict FROM corrections WHERE user_id = ? AND kind = ?",
                                        (user_id, kind)))

    def correction_history(self, user_id: str, item_id: str) -> dict:
        """A fact's or pair's verdict and its log (who, when, what); for a fact also its rows now
        and its group's supersession history (same subject and predicate, newest first, each
        with its source note), for a pair its rows now."""
        found = self.resolve_correction(user_id, item_id)
        kind, target = found["kind"], found["target"]
        with self._lock:
            row = self.db.execute("SELECT verdict, at FROM corrections WHERE user_id = ? AND kind = ? AND target = ?",
                                  (user_id, kind, target)).fetchone()
            log = [{"verdict": v, "by": b, "at": a} for v, b, a in self.db.execute(
                "SELECT verdict, by, at FROM correction_log WHERE user_id = ? AND kind = ? AND target = ? ORDER BY at, id",
                (user_id, kind, target))]
        shown = json.dumps(found["shown"], ensure_ascii=False) if found["shown"] else None
        out = {"id": item_id, "kind": kind, "user_id": user_id, **_target_fields(kind, target, shown),
               "verdict": row[0] if row else None, "verdict_at": row[1] if row else None, "log": log}
        if kind == "fact":
            subject, predicate, _ = json.loads(target)
            group = [f for f in self.facts_about(user_id, subject) if norm(f["predicate"]) == predicate]
            out["rows"] = [f for f in group if f["fact_id"] == item_id]
            out["supersession"] = group
        else:
            a, b = json.loads(target)
            with self._lock:
                rows = self.db.execute("SELECT note_a, note_b, score, computed_at FROM related WHERE user_id = ? "
                                       "AND note_a = ? AND note_b = ?", (user_id, a, b)).fetchall()
            out["rows"] = [{"note_a": x, "note_b": y, "score": round(s, 4), "computed_at": c} for x, y, s, c in rows]
            out["notes"] = [self.note_info(user_id, n) or {"note_id": n} for n in (a, b)]
        return out

    def facts_about(self, user_id: str, name: str) -> list[dict]:
        """The user's facts whose subject or object is ``name`` (compared as ``norm``), newest
        first: the fact and its quote, ``fact_id``, its source note (title, notebook, url,
        updated_at), status, what superseded it, and ``confirmed``."""
        key = _matched(name)
        with self._lock:
            rows = self.db.execute(
                "SELECT f.subject, f.predicate, f.object, f.quote, f.note_id, f.time, f.status, s.note_id, "
                "n.title, n.notebook, n.url, n.updated_at FROM facts f LEFT JOIN facts s ON s.id = f.superseded_by "
                "LEFT JOIN notes n ON n.note_id = f.note_id AND n.user_id = f.user_id WHERE f.user_id = ? "
                "ORDER BY f.time DESC, f.id DESC", (user_id,)).fetchall()
            confirmed = {t for (t,) in self.db.execute(
                "SELECT target FROM corrections WHERE user_id = ? AND kind = 'fact' AND verdict = 'confirmed'",
                (user_id,))}
        out = []
        for subject, predicate, obj, quote, note_id, when, status, by_note, title, notebook, url, updated in rows:
            if key not in (norm(subject), norm(obj)):
                continue
            target = correction_target("fact", subject, predicate, obj)
            out.append({"fact_id": correction_id(user_id, "fact", target), "subject": subject, "predicate": predicate,
                        "object": obj, "quote": quote, "note_id": note_id, "title": title or "",
                        "notebook": notebook or "", "url": url or "", "updated_at": updated or "", "time": when,
                        "status": status, "superseded_by_note": by_note, "confirmed": target in confirmed})
        return out

    def export_corrections(self, user_id: str | None = None) -> dict:
        """Every verdict (of one user, or all), with its log: the ``memory export`` file."""
        where, args = (" WHERE user_id = ?", (user_id,)) if user_id is not None else ("", ())
        with self._lock:
            rows = self.db.execute(f"SELECT user_id, kind, target, verdict, at, comment FROM corrections{where} "
                                   f"ORDER BY user_id, at, id", args).fetchall()
            logs: dict[tuple, list] = {}
            for u, k, t, v, b, a in self.db.execute(
                    f"SELECT user_id, kind, target, verdict, by, at FROM correction_log{where} ORDER BY at, id", args):
                logs.setdefault((u, k, t), []).append({"verdict": v, "by": b, "at": a})
        return {"version": CORRECTIONS_VERSION, "corrections": [
            {"user_id": u, "kind": k, **_target_fields(k, t, c), "verdict": v, "at": a, "log": logs.get((u, k, t), [])}
            for u, k, t, v, a, c in rows]}

    def import_corrections(self, data: object, user_id: str | None = None, by: str = "import") -> dict:
        """Apply an export (all of it, or one user's records): validated first (UserError
        naming the bad record, nothing applied), then each verdict recorded unless it is
        already there. Counts of applied and unchanged records, and the applied ones."""
        records = parse_corrections(data)
        if user_id is not None:
            records = [r for r in records if r["user_id"] == user_id]
        applied, unchanged = [], 0
        for r in records:
            done = self.apply_correction(r["user_id"], r["kind"], r["target"], r["verdict"], by=by, at=r["at"],
                                         shown=r["shown"])
            if done["changed"]:
                applied.append(done)
            else:
                unchanged += 1
        return {"records": len(records), "applied": len(applied), "unchanged": unchanged, "changes": applied}

    # --- end of corrections ----------------------------------------------------------------------

    # --- what the doors read ------------------------------------------------------------------

    def users(self) -> dict[str, int]:
        """Users with processed notes, and how many (the shape of ``store.count_by_user``)."""
        with self._lock:
            return dict(self.db.execute("SELECT user_id, COUNT(*) FROM notes GROUP BY user_id"))

    def entities(self, user_id: str, top: int | None = None, kind: str | None = None) -> list[dict]:
        """The user's entities, those mentioned by the most notes first, with counts."""
        sql = (
            "SELECT e.name, e.kind, COUNT(DISTINCT m.note_id) AS notes, COUNT(*) AS mentions "
            "FROM entities e JOIN mentions m ON m.entity_id = e.id "
            "WHERE e.user_id = ?" + (" AND e.kind = ?" if kind else "") +
            " GROUP BY e.id ORDER BY notes DESC, mentions DESC, e.norm, e.kind"
        )
        args: list = [user_id] + ([kind] if kind else [])
        if top is not None:
            sql += " LIMIT ?"
            args.append(top)
        with self._lock:
            rows = self.db.execute(sql, args).fetchall()
        return [{"name": n, "kind": k, "notes": c, "mentions": m} for n, k, c, m in rows]

    def entity(self, user_id: str, name: str) -> list[dict]:
        """The user's notes that mention ``name`` (any kind, compared by ``norm``), the most
        mentions first, each with its mentions."""
        with self._lock:
            rows = self.db.execute(
                "SELECT m.note_id, e.name, e.kind, m.point_id, m.char_start, m.char_end, m.snippet, "
                "n.title, n.notebook, n.url, n.updated_at "
                "FROM entities e JOIN mentions m ON m.entity_id = e.id JOIN notes n ON n.note_id = m.note_id "
                "WHERE e.user_id = ? AND m.user_id = ? AND e.norm = ? ORDER BY m.note_id, m.char_start",
                (user_id, user_id, _matched(name)),
            ).fetchall()
        notes: dict[str, dict] = {}
        for note_id, ename, kind, point_id, start, end, snip, title, notebook, url, updated in rows:
            note = notes.setdefault(note_id, {"note_id": note_id, "title": title, "notebook": notebook, "url": url,
                                              "updated_at": updated, "kinds": [], "mentions": []})
            if kind not in note["kinds"]:
                note["kinds"].append(kind)
            note["mentions"].append({"name": ename, "kind": kind, "point_id": point_id, "char_start": start,
                                     "char_end": end, "snippet": snip})
        return sorted(notes.values(), key=lambda n: (-len(n["mentions"]), n["title"], n["note_id"]))

    def notes_for(self, user_id: str, names: Iterable[str]) -> list[tuple[str, list[str]]]:
        """The user's notes mentioning any of ``names``: (note id, the names it mentions),
        those mentioning the most names first."""
        keys = sorted({norm(n) for n in names if norm(n)})
        if not keys:
            return []
        with self._lock:
            rows = self.db.execute(
                f"SELECT DISTINCT m.note_id, e.norm FROM entities e JOIN mentions m ON m.entity_id = e.id "
                f"WHERE e.user_id = ? AND m.user_id = ? AND e.norm IN ({','.join('?' * len(keys))})",
                (user_id, user_id, *keys),
            ).fetchall()
        found: dict[str, list[str]] = {}
        for note_id, key in rows:
            found.setdefault(note_id, []).append(key)
        return sorted(((n, sorted(k)) for n, k in found.items()), key=lambda p: (-len(p[1]), p[0]))

    def counts(self, user_id: str | None = None) -> dict:
        """Notes processed by tier, entities, mentions (``status``)."""
        where, args = ("WHERE user_id = ?", (user_id,)) if user_id is not None else ("", ())
        with self._lock:
            tiers = dict(self.db.execute(f"SELECT tier, COUNT(*) FROM notes {where} GROUP BY tier", args))
            entities = self.db.execute(f"SELECT COUNT(*) FROM entities {where}", args).fetchone()[0]
            mentions = self.db.execute(f"SELECT COUNT(*) FROM mentions {where}", args).fetchone()[0]
        return {"notes": tiers, "entities": entities, "mentions": mentions}

    # --- facts and jobs (the LLM tier: rag.memory.extract, sync.memory_jobs) ----------------------
    #
    # A job per note whose text changed (``enqueue_llm``), carrying that text; the worker
    # takes due jobs oldest first and stores what came back (``store_llm``) only while the
    # note is still at the job's content hash. Facts of a (user, subject, predicate) group:
    # the newest note's (by the note's updated time, ``facts.time``) are active, with any
    # other note's fact of the same object; the others are ``superseded`` and point at the
    # group's newest fact (its note is the other source). ``settle_facts`` repairs groups
    # whose newest fact went with its note: the newest fact left is active again.

    LLM_JOB = "llm"
    TIER_LLM = "llm"

    def enqueue_llm(self, user_id: str, note_id: str, content_hash: str, text: str, *, title: str = "",
                    updated: float | None = None) -> None:
        """Queue (or replace) the note's LLM extraction, due now."""
        payload = _llm_payload(text, title, updated)
        self._write(lambda db: _queue_llm(db, note_id, user_id, content_hash, payload, self.clock()))

    def due_job(self, now: float | None = None) -> dict | None:
        """The oldest due, unparked LLM job, or None."""
        now = self.clock() if now is None else now
        with self._lock:
            row = self.db.execute(
                "SELECT note_id, user_id, content_hash, attempts, payload FROM jobs WHERE kind = ? AND parked = 0 "
                "AND next_try <= ? ORDER BY created, note_id LIMIT 1", (self.LLM_JOB, now)).fetchone()
        if row is None:
            return None
        payload = json.loads(row[4] or "{}")
        return {"note_id": row[0], "user_id": row[1], "content_hash": row[2], "attempts": row[3],
                "text": payload.get("text") or "", "title": payload.get("title") or "", "updated": payload.get("updated")}

    def next_due(self) -> float | None:
        """When the next unparked LLM job is due, or None."""
        with self._lock:
            return self.db.execute("SELECT MIN(next_try) FROM jobs WHERE kind = ? AND parked = 0",
                                   (self.LLM_JOB,)).fetchone()[0]

    def job_current(self, job: dict) -> bool:
        """Is the note still at the job's text? If not the job is dropped (a newer job, if
        the note changed again, stays)."""
        def work(db: sqlite3.Connection) -> bool:
            if self._job_current(db, job):
                return True
            db.execute("DELETE FROM jobs WHERE note_id = ? AND kind = ? AND content_hash = ?",
                       (job["note_id"], self.LLM_JOB, job["content_hash"]))
            return False

        return self._write(work)

    @staticmethod
    def _job_current(db: sqlite3.Connection, job: dict) -> bool:
        row = db.execute("SELECT user_id, content_hash FROM notes WHERE note_id = ?", (job["note_id"],)).fetchone()
        return row is not None and row[0] == job["user_id"] and row[1] == job["content_hash"]

    def fail_job(self, job: dict, error: str, delays: Sequence[float]) -> bool:
        """An attempt failed: retry after ``delays[attempts - 1]``, or park the job with its
        error once the delays are spent. True when it was parked."""
        now = self.clock()
        attempts = job["attempts"] + 1
        parked = attempts > len(delays)
        next_try = now if parked else now + delays[attempts - 1]
        self._write(lambda db: db.execute(
            "UPDATE jobs SET attempts = ?, next_try = ?, error = ?, parked = ? WHERE note_id = ? AND kind = ? "
            "AND content_hash = ?",
            (attempts, next_try, error[:500], int(parked), job["note_id"], self.LLM_JOB, job["content_hash"])))
        return parked

    def store_llm(self, job: dict, summary: str, facts: Sequence[dict], stats: dict,
                  entities: Sequence[tuple[str, str]] = ()) -> bool:
        """The LLM tier's result for the job's note: its summary, its facts (each a dict of
        subject, predicate, object, quote, char_start, char_end) in place of its old LLM
        facts, supersession settled, and its typed ``entities`` ((name, type), the LLM's) in
        place of its old ones (``_llm_mentions``). ``stats`` gets ``entities_dropped`` (names
        not in the job's text) and is stored with the note. False (nothing stored, the job
        dropped) when the note changed or went meanwhile."""
        now = self.clock()
        when = job.get("updated") or now
        user_id, note_id = job["user_id"], job["note_id"]
        found, dropped = _llm_entities(job.get("text") or "", entities)
        stats["entities_dropped"] = dropped

        def work(db: sqlite3.Connection) -> bool:
            db.execute("DELETE FROM jobs WHERE note_id = ? AND kind = ? AND content_hash = ?",
                       (note_id, self.LLM_JOB, job["content_hash"]))
            if not self._job_current(db, job):
                return False
            _llm_mentions(db, user_id, note_id, job.get("text") or "", found)
            groups = set(db.execute("SELECT subject, predicate FROM facts WHERE note_id = ? AND origin = 'llm'",
                                    (note_id,)).fetchall())
            db.execute("DELETE FROM facts WHERE note_id = ? AND origin = 'llm'", (note_id,))
            for f in facts:
                subject, predicate = fact_key(f["subject"], f["predicate"])
                if _rejected(db, user_id, "fact", subject, predicate, f["object"]):
                    continue  # a person rejected it (corrections): never revived
                db.execute(
                    "INSERT INTO facts(user_id, subject, subject_norm, predicate, object, quote, note_id, char_start, "
                    "char_end, time, origin, status, created) VALUES (?,?,?,?,?,?,?,?,?,?,'llm','active',?)",
                    (user_id, subject, norm(subject), predicate, " ".join(f["object"].split()), f["quote"], note_id,
                     f.get("char_start"), f.get("char_end"), when, now))
                groups.add((subject, predicate))
            db.execute("UPDATE notes SET summary = ?, tier = ?, llm = ? WHERE note_id = ?",
                       (summary or None, self.TIER_LLM, json.dumps(stats, ensure_ascii=False), note_id))
            for subject, predicate in groups:
                _settle_group(db, user_id, subject, predicate)
            return True

        return self._write(work)

    def settle_facts(self) -> int:
        """Groups whose newest fact went (its note edited, trashed, deleted): the newest
        fact left is active again. How many groups were settled."""
        return self._write(_settle_all)

    def facts(self, user_id: str, subject: str | None = None, status: str | None = None) -> list[dict]:
        """The user's facts (about ``subject``), the newest first, each with its source note
        and, when superseded, the fact (and note) that superseded it."""
        sql = ("SELECT f.id, f.subject, f.predicate, f.object, f.quote, f.note_id, f.char_start, f.char_end, f.time, "
               "f.origin, f.status, f.superseded_by, s.note_id FROM facts f LEFT JOIN facts s ON s.id = f.superseded_by "
               "WHERE f.user_id = ?")
        args: list = [user_id]
        if subject is not None:
            sql += " AND f.subject = ?"
            args.append(fact_key(subject, "")[0])
        if status is not None:
            sql += " AND f.status = ?"
            args.append(status)
        with self._lock:
            rows = self.db.execute(sql + " ORDER BY f.time DESC, f.id DESC", args).fetchall()
        keys = ("id", "subject", "predicate", "object", "quote", "note_id", "char_start", "char_end", "time",
                "origin", "status", "superseded_by", "superseded_by_note")
        return [dict(zip(keys, r)) for r in rows]

    def summary(self, note_id: str, user_id: str) -> str | None:
        with self._lock:
            row = self.db.execute("SELECT summary FROM notes WHERE note_id = ? AND user_id = ?",
                                  (note_id, user_id)).fetchone()
        return row[0] if row else None

    def llm_backlog(self) -> tuple[int, int]:
        """Unparked LLM jobs and the characters of note text they hold (an estimate's input)."""
        with self._lock:
            jobs, chars = self.db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(json_extract(payload, '$.text'))), 0) FROM jobs "
                "WHERE kind = ? AND parked = 0", (self.LLM_JOB,)).fetchone()
        return int(jobs), int(chars)

    def llm_counts(self, user_id: str | None = None) -> dict:
        """Jobs pending and parked (the parked ones with their errors), facts by status (``status``)."""
        where, args = (" AND user_id = ?", (user_id,)) if user_id is not None else ("", ())
        with self._lock:
            jobs = f"FROM jobs WHERE kind = '{self.LLM_JOB}'{where}"
            pending = self.db.execute(f"SELECT COUNT(*) {jobs} AND parked = 0", args).fetchone()[0]
            parked = self.db.execute(f"SELECT note_id, attempts, error {jobs} AND parked = 1 ORDER BY next_try DESC",
                                     args).fetchall()
            facts = dict(self.db.execute(f"SELECT status, COUNT(*) FROM facts WHERE 1 = 1{where} GROUP BY status",
                                         args))
        return {"jobs_pending": pending, "jobs_parked": len(parked),
                "parked": [{"note_id": n, "attempts": a, "error": e} for n, a, e in parked[:5]],
                "facts": sum(facts.values()), "facts_by_status": facts}

    # --- for answers (rag.answer.service: entities named in a question, their notes and facts) ------

    def named_in(self, user_id: str, text: str) -> list[dict]:
        """The user's entities whose key (``norm``) occurs in ``text`` (compared as ``norm``;
        its first ``MATCH_CHARS``), one row per key: its name, kinds, how many notes and
        mentions it has.

        The names are found by walking the text once, looking each position's two characters
        up among the user's names (``_names``), so the work grows with the text, not with the
        text times the number of names; then only the names found are read."""
        key = _matched(text)
        if not key:
            return []
        names = self._names(user_id)
        found = set()
        for i in range(len(key)):
            for start in {key[i : i + 2], key[i]}:
                found.update(n for n in names.get(start, ()) if key.startswith(n, i))
        rows: list[tuple] = []
        keys = sorted(found)
        with self._lock:
            for at in range(0, len(keys), _IN_BATCH):
                batch = keys[at : at + _IN_BATCH]
                rows += self.db.execute(
                    "SELECT e.norm, MIN(e.name), GROUP_CONCAT(DISTINCT e.kind), COUNT(DISTINCT m.note_id), COUNT(*) "
                    "FROM entities e JOIN mentions m ON m.entity_id = e.id "
                    f"WHERE e.user_id = ? AND m.user_id = ? AND e.norm IN ({','.join('?' * len(batch))}) GROUP BY e.norm",
                    (user_id, user_id, *batch),
                ).fetchall()
        return [{"norm": k, "name": n, "kinds": sorted(set(kinds.split(","))), "notes": c, "mentions": m}
                for k, n, kinds, c, m in sorted(rows)]

    def _names(self, user_id: str) -> dict[str, list[str]]:
        """The user's entity keys by their first two characters (a one-character key by its
        character), kept until the file changes (``PRAGMA data_version`` tells another
        connection's commits; ``_writes`` this one's)."""
        with self._lock:
            version = (self.db.execute("PRAGMA data_version").fetchone()[0], self._writes)
            cached = self._name_index.get(user_id)
            if cached is not None and cached[0] == version:
                return cached[1]
            keys = [k for (k,) in self.db.execute("SELECT DISTINCT norm FROM entities WHERE user_id = ?", (user_id,))]
        names: dict[str, list[str]] = {}
        for k in keys:
            if k:
                names.setdefault(k[:2], []).append(k)
        self._name_index[user_id] = (version, names)
        return names

    def chunks_mentioning(self, user_id: str, norms: Iterable[str]) -> list[tuple[str, str, str, int]]:
        """The chunks holding a mention of any of ``norms``: (point id, note id, norm, mentions
        of it in that chunk). Mentions without a chunk (tags) are left out."""
        keys = sorted({norm(n) for n in norms if norm(n)})
        if not keys:
            return []
        llm = ",".join(f"'{k}'" for k in extraction.LLM_KINDS)
        with self._lock:
            return self.db.execute(
                f"SELECT m.point_id, m.note_id, e.norm, COUNT(*) FROM entities e JOIN mentions m ON m.entity_id = e.id "
                f"WHERE e.user_id = ? AND m.user_id = ? AND m.point_id IS NOT NULL "
                f"AND e.norm IN ({','.join('?' * len(keys))}) "
                # a place the LLM typed that the no-LLM tier holds too counts once (as the no-LLM's)
                f"AND NOT (e.kind IN ({llm}) AND EXISTS (SELECT 1 FROM mentions o JOIN entities oe ON oe.id = o.entity_id "
                f"  WHERE o.note_id = m.note_id AND o.char_start = m.char_start AND oe.norm = e.norm "
                f"  AND oe.kind NOT IN ({llm}))) "
                f"GROUP BY m.point_id, m.note_id, e.norm",
                (user_id, user_id, *keys),
            ).fetchall()

    def notes_mentioning(self, user_id: str, norms: Iterable[str]) -> list[dict]:
        """The user's notes mentioning any of ``norms``, newest (updated) first: the fields of
        a ``search --json`` hit plus ``updated_at``, ``mentions`` and one ``snippet``."""
        keys = sorted({norm(n) for n in norms if norm(n)})
        if not keys:
            return []
        with self._lock:
            rows = self.db.execute(
                f"SELECT n.note_id, n.title, n.notebook, n.url, n.updated_at, COUNT(*), "
                f"MAX(CASE WHEN m.snippet != '' THEN m.snippet END) "
                f"FROM entities e JOIN mentions m ON m.entity_id = e.id "
                f"JOIN notes n ON n.note_id = m.note_id AND n.user_id = m.user_id "
                f"WHERE e.user_id = ? AND m.user_id = ? AND e.norm IN ({','.join('?' * len(keys))}) "
                f"GROUP BY n.note_id ORDER BY n.updated_at DESC, n.title, n.note_id",
                (user_id, user_id, *keys),
            ).fetchall()
        return [{"note_id": i, "title": t, "notebook": nb, "url": u, "updated_at": up, "mentions": c,
                 "snippet": snip or ""} for i, t, nb, u, up, c, snip in rows]

    def facts_named(self, user_id: str, text: str, subjects: Iterable[str] = (), limit: int = 20) -> list[dict]:
        """Active facts whose subject is one of ``subjects`` (compared as ``norm``) or occurs
        in ``text``, the newest first, each with its source note's title, notebook and url.

        One query on ``facts_subject_norm``: only the user's active facts' subject keys are
        compared with the text, and only the facts that match are read. Not by ``named_in``:
        a fact's subject (the LLM's) need not be an entity the no-LLM tier found."""
        keys = sorted({norm(s) for s in subjects if norm(s)})
        key = _matched(text)
        if not keys and not key:
            return []
        listed = f"f.subject_norm IN ({','.join('?' * len(keys))}) OR " if keys else ""
        with self._lock:
            rows = self.db.execute(
                "SELECT f.id, f.subject, f.predicate, f.object, f.quote, f.note_id, f.time, "
                "n.title, n.notebook, n.url FROM facts f JOIN notes n ON n.note_id = f.note_id AND n.user_id = f.user_id "
                "WHERE f.user_id = ? AND f.status = 'active' AND f.subject_norm != '' "
                f"AND ({listed}instr(?, f.subject_norm) > 0) AND length(f.subject) >= 2 "
                "ORDER BY f.time DESC, f.id DESC LIMIT ?", (user_id, *keys, key, limit),
            ).fetchall()
        return [{"id": fid, "subject": subject, "predicate": predicate, "object": obj, "quote": quote,
                 "note_id": note_id, "time": when, "title": title, "notebook": notebook, "url": url}
                for fid, subject, predicate, obj, quote, note_id, when, title, notebook, url in rows]

    # --- end of for answers ---------------------------------------------------------------------

    # --- for the explorer (rag.memory.explore, served by the daemon's API) ------------------------------

    def find(self, user_id: str, text: str, limit: int = 20) -> dict:
        """What a search box finds: the user's entities (and fact subjects and objects) whose
        name contains ``text`` (as ``norm``), the exact name first, then those in most notes;
        and the notes whose title contains it or whose id it is (``text``: its first ``MATCH_CHARS``)."""
        text = limits.cut(text, MATCH_CHARS)[0]
        key = norm(text)
        if not key:
            return {"entities": [], "notes": []}
        like = "%" + key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._lock:
            entities = self.db.execute(
                "SELECT e.name, e.kind, COUNT(DISTINCT m.note_id) AS notes FROM entities e "
                "JOIN mentions m ON m.entity_id = e.id WHERE e.user_id = ? AND e.norm LIKE ? ESCAPE '\\' "
                "GROUP BY e.id ORDER BY e.norm = ? DESC, notes DESC, length(e.norm), e.norm LIMIT ?",
                (user_id, like, key, limit)).fetchall()
            named = self.db.execute(
                "SELECT name, COUNT(DISTINCT note_id) FROM (SELECT subject AS name, note_id FROM facts WHERE user_id = ? "
                "UNION ALL SELECT object, note_id FROM facts WHERE user_id = ?) GROUP BY name", (user_id, user_id)
            ).fetchall()
            notes = self.db.execute(
                "SELECT note_id, title, notebook, url, updated_at FROM notes WHERE user_id = ? AND "
                "(note_id = ? OR lower(title) LIKE lower(?) ESCAPE '\\') ORDER BY note_id = ? DESC, updated_at DESC "
                "LIMIT ?", (user_id, text.strip(), like, text.strip(), limit)).fetchall()
        found = {norm(n): {"name": n, "kind": k, "notes": c} for n, k, c in entities}
        for name, count in named:  # what only the LLM tier's facts name
            if key in norm(name) and norm(name) not in found:
                found[norm(name)] = {"name": name, "kind": "fact", "notes": count}
        ranked = sorted(found.items(), key=lambda kv: (kv[0] != key, -kv[1]["notes"], len(kv[0]), kv[0]))
        return {"entities": [e for _, e in ranked[:limit]],
                "notes": [{"note_id": i, "title": t, "notebook": nb, "url": u, "updated_at": up}
                          for i, t, nb, u, up in notes]}

    def note_entities(self, user_id: str, note_id: str, limit: int = 12) -> list[dict]:
        """The entities a note mentions, the most mentioned in it first and, among equals, the
        rarest in the user's notes (the most telling)."""
        with self._lock:
            rows = self.db.execute(
                "SELECT e.name, e.kind, COUNT(*) AS here, (SELECT COUNT(DISTINCT o.note_id) FROM mentions o "
                "WHERE o.entity_id = e.id) AS notes FROM entities e JOIN mentions m ON m.entity_id = e.id "
                "WHERE e.user_id = ? AND m.user_id = ? AND m.note_id = ? GROUP BY e.id "
                "ORDER BY here DESC, notes, e.norm LIMIT ?", (user_id, user_id, note_id, limit)).fetchall()
        return [{"name": n, "kind": k, "mentions": here, "notes": c} for n, k, here, c in rows]

    def note_facts(self, user_id: str, note_id: str) -> list[dict]:
        """The facts that rest on a note (every status), with the fields of ``facts_about``."""
        with self._lock:
            rows = self.db.execute(
                "SELECT f.subject, f.predicate, f.object, f.quote, f.time, f.status, s.note_id FROM facts f "
                "LEFT JOIN facts s ON s.id = f.superseded_by WHERE f.user_id = ? AND f.note_id = ? "
                "ORDER BY f.char_start, f.id", (user_id, note_id)).fetchall()
            verdicts = dict(self.db.execute(
                "SELECT target, verdict FROM corrections WHERE user_id = ? AND kind = 'fact'", (user_id,)).fetchall())
        out = []
        for subject, predicate, obj, quote, when, status, by_note in rows:
            target = correction_target("fact", subject, predicate, obj)
            out.append({"fact_id": correction_id(user_id, "fact", target), "subject": subject, "predicate": predicate,
                        "object": obj, "quote": quote, "note_id": note_id, "time": when, "status": status,
                        "superseded_by_note": by_note, "confirmed": verdicts.get(target) == "confirmed"})
        return out

    def note_card(self, user_id: str, note_id: str) -> dict | None:
        """A processed note of the user as the explorer shows it, or None."""
        with self._lock:
            row = self.db.execute(
                "SELECT title, notebook, url, updated_at, summary, tier FROM notes WHERE note_id = ? AND user_id = ?",
                (note_id, user_id)).fetchone()
        if row is None:
            return None
        title, notebook, url, updated, summary, tier = row
        return {"note_id": note_id, "title": title, "notebook": notebook, "url": url, "updated_at": updated,
                "summary": summary, "tier": tier}

    # --- end of for the explorer --------------------------------------------------------------------


def _matched(text: str) -> str:
    """What of a text the memory compares with names: its first ``MATCH_CHARS``, as ``norm``."""
    return norm(limits.cut(text, MATCH_CHARS)[0])


def fact_key(subject: str, predicate: str) -> tuple[str, str]:
    """How a fact's group is compared: the subject as written (whitespace collapsed), the
    predicate in lower case."""
    return " ".join(subject.split()), " ".join(predicate.split()).casefold()


def _settle_group(db: sqlite3.Connection, user_id: str, subject: str, predicate: str) -> None:
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


def _settle_all(db: sqlite3.Connection) -> int:
    """``settle_facts`` in a transaction under way."""
    groups = db.execute(
        "SELECT DISTINCT user_id, subject, predicate FROM facts f WHERE status = 'superseded' "
        "AND NOT EXISTS (SELECT 1 FROM facts g WHERE g.id = f.superseded_by AND g.status = 'active')"
    ).fetchall()
    for user_id, subject, predicate in groups:
        _settle_group(db, user_id, subject, predicate)
    return len(groups)


def _queue_related(db: sqlite3.Connection, changed: dict[str, str], removed: Sequence[str], now: float) -> int:
    """``related_mark`` in a transaction under way."""
    touched = list(dict.fromkeys([*changed, *removed]))
    gone = set(removed)
    todo = {n: u for n, u in changed.items() if n not in gone}
    for i in range(0, len(touched), _IN_BATCH):
        part = touched[i : i + _IN_BATCH]
        marks = ",".join("?" * len(part))
        for a, user in db.execute(f"SELECT note_a, user_id FROM related WHERE note_b IN ({marks})", part):
            if a not in gone:
                todo.setdefault(a, user)
    db.executemany(
        "INSERT OR IGNORE INTO jobs(note_id, kind, user_id, content_hash, next_try, created) VALUES (?, ?, ?, '', ?, ?)",
        [(n, MemoryStore.RELATED_JOB, u, now, now) for n, u in todo.items()],
    )
    return len(todo)


def _llm_payload(text: str, title: str, updated: float | None) -> str:
    """What an LLM job carries: the note's text, title and updated time."""
    return json.dumps({"text": text, "title": title, "updated": updated}, ensure_ascii=False)


def _queue_llm(db: sqlite3.Connection, note_id: str, user_id: str, content_hash: str, payload: str, now: float) -> None:
    db.execute(
        "INSERT OR REPLACE INTO jobs(note_id, kind, user_id, content_hash, attempts, next_try, error, parked, "
        "created, payload) VALUES (?,?,?,?,0,?,NULL,0,?,?)",
        (note_id, MemoryStore.LLM_JOB, user_id, content_hash, now, now, payload))


def _forget(db: sqlite3.Connection, note_id: str, keep_jobs: bool = False) -> set[int]:
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
    if not keep_jobs:
        db.execute("DELETE FROM jobs WHERE note_id = ?", (note_id,))
    return entity_ids


def _add_mentions(db: sqlite3.Connection, user_id: str, note_id: str,
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


def _llm_entities(text: str, entities: Sequence[tuple[str, str]]) -> tuple[list[Entity], int]:
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


def _llm_mentions(db: sqlite3.Connection, user_id: str, note_id: str, text: str, found: Sequence[Entity]) -> None:
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

        _add_mentions(db, user_id, note_id, [
            (ent, [Mention(point_of(sp.start, sp.end), sp.start, sp.end, extraction.snippet(text, sp))
                   for sp in ent.spans]) for ent in found])
    _drop_orphans(db, old)


def _drop_orphans(db: sqlite3.Connection, entity_ids: Iterable[int]) -> None:
    """Delete those of ``entity_ids`` that no mention refers to any more."""
    db.executemany(
        "DELETE FROM entities WHERE id = ? AND NOT EXISTS (SELECT 1 FROM mentions m WHERE m.entity_id = ?)",
        [(i, i) for i in entity_ids],
    )


# --- corrections (helpers) ----------------------------------------------------------------------

CORRECTIONS_VERSION = 1


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


def _target_fields(kind: str, target: str, shown: str | None = None) -> dict:
    content = json.loads(shown or target)
    if kind == "fact":
        return dict(zip(("subject", "predicate", "object"), content))
    return {"notes": content}


def _rejected(db: sqlite3.Connection, user_id: str, kind: str, *content: str) -> bool:
    """Has the user rejected this fact or pair? (The write paths skip it.)"""
    return db.execute("SELECT 1 FROM corrections WHERE user_id = ? AND kind = ? AND target = ? AND verdict = 'rejected'",
                      (user_id, kind, correction_target(kind, *content))).fetchone() is not None


def parse_corrections(data: object) -> list[dict]:
    """Check an export's shape; its records with their ``target``. UserError naming the
    first bad record."""
    if not isinstance(data, dict) or data.get("version") != CORRECTIONS_VERSION or not isinstance(
            data.get("corrections"), list):
        raise UserError(f"not a corrections file: expected {{\"version\": {CORRECTIONS_VERSION}, \"corrections\": "
                        f"[...]}} as `leanote-rag memory export` writes it")
    out = []
    for i, r in enumerate(data["corrections"], start=1):
        def bad(why: str) -> UserError:
            return UserError(f"correction {i}: {why}; nothing was imported")

        if not isinstance(r, dict):
            raise bad("not an object")
        user, kind, verdict, at = r.get("user_id"), r.get("kind"), r.get("verdict"), r.get("at", 0.0)
        if not isinstance(user, str) or not user:
            raise bad("user_id missing")
        if verdict not in ("rejected", "confirmed"):
            raise bad(f"verdict must be rejected or confirmed, not {verdict!r}")
        if not isinstance(at, (int, float)) or isinstance(at, bool):
            raise bad("at must be a time in seconds")
        if kind == "fact":
            content = [r.get(k) for k in ("subject", "predicate", "object")]
            if not all(isinstance(c, str) and norm(c) for c in content):
                raise bad("a fact needs subject, predicate and object (text)")
        elif kind == "pair":
            content = r.get("notes")
            if (not isinstance(content, list) or len(content) != 2 or not all(isinstance(n, str) and n for n in content)
                    or content[0] == content[1]):
                raise bad("a pair needs notes: two different note ids")
        else:
            raise bad(f"kind must be fact or pair, not {kind!r}")
        out.append({"user_id": user, "kind": kind, "verdict": verdict, "at": float(at),
                    "target": correction_target(kind, *content), "shown": list(content)})
    return out
