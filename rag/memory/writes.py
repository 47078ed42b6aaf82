"""The memory's writes as notes are indexed: a note's entities and mentions replaced, its
labels, its removal with everything derived from it (``sync.indexer`` calls them).

A mixin of ``rag.memory.store.MemoryStore``: it writes through ``self._write``."""

from __future__ import annotations

import json
import sqlite3
from typing import Iterable, Sequence

from rag.index import asked_scopes
from rag.memory import entities as extraction
from rag.memory.entities import VERSION, Entity
from rag.index.note_index import PreparedNote
from rag.model import Note

from rag.memory.schema import TIER_TERMS, IN_BATCH
from rag.memory.rows import (Mention, NoteInfo, add_mentions, drop_orphans, forget_note, info_of, llm_payload,
                             mentions_of, queue_asked, queue_llm, queue_related, settle_all)


class NoteWrites:
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
            for i in range(0, len(terms), IN_BATCH):
                part = terms[i : i + IN_BATCH]
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
        asked_job: str | None = None,
    ) -> None:
        """The note's entities as of ``content_hash``, in one transaction: its old mentions
        go, the new ones come, entities left without mentions are deleted; with ``llm_job``
        (``_llm_payload``) its LLM extraction is queued in the same transaction."""
        terms = sorted(set(terms))

        def work(db: sqlite3.Connection) -> None:
            now = self.clock()
            # when the index first saw the note (a row from before this was kept: long ago) and
            # when its text last changed (processed again at the same text: unchanged)
            seen = db.execute("SELECT content_hash, first_seen, changed_at FROM notes WHERE note_id = ? AND user_id = ?",
                              (note_id, user_id)).fetchone()
            first, changed = (now, now) if seen is None else (
                seen[1] if seen[1] is not None else 0.0, seen[2] if seen[0] == content_hash else now)
            old = forget_note(db, note_id, keep_jobs=True)
            db.execute(
                "INSERT INTO notes(note_id, user_id, content_hash, version, tier, processed_at, title, notebook, url, "
                "updated_at, terms, first_seen, changed_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (note_id, user_id, content_hash, VERSION, TIER_TERMS, now, info.title, info.notebook,
                 info.url, info.updated_at, json.dumps(terms, ensure_ascii=False), first, changed),
            )
            db.executemany(
                "INSERT INTO df(user_id, term, notes) VALUES (?, ?, 1) "
                "ON CONFLICT(user_id, term) DO UPDATE SET notes = notes + 1",
                [(user_id, t) for t in terms],
            )
            add_mentions(db, user_id, note_id, entities)
            drop_orphans(db, old)
            if llm_job is not None:
                queue_llm(db, note_id, user_id, content_hash, llm_job, self.clock())
            if asked_job is not None:  # the note's written questions, unless written at this text
                queue_asked(db, note_id, user_id, content_hash, asked_job, self.clock(),
                            json.loads(asked_job).get("scope") or "note")
            else:
                db.execute("DELETE FROM asked WHERE note_id = ? AND content_hash != ?", (note_id, content_hash))

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
            add_mentions(db, user_id, note_id, [(e, [Mention(None, None, None)]) for e in tag_entities])
            drop_orphans(db, old)

        self._write(work)

    def reset(self) -> None:
        """Forget everything derived (the index is being rebuilt: it all comes back from the
        notes); the people's corrections stay."""
        def work(db: sqlite3.Connection) -> None:
            for table in ("mentions", "entities", "notes", "df", "facts", "related", "jobs", "asked", "first_index"):
                db.execute(f"DELETE FROM {table}")

        self._write(work)

    def first_indexed(self) -> None:
        """A complete pass ended: each user whose notes the memory holds and whose first one
        this is gets its time (``first_index``): the notes seen until now are what their notes
        were, neither added nor edited (``rag.digest``)."""
        now = self.clock()
        self._write(lambda db: db.execute("INSERT OR IGNORE INTO first_index(user_id, at) "
                                          "SELECT DISTINCT user_id, ? FROM notes", (now,)))

    def remove_note(self, note_id: str) -> None:
        """Everything derived from the note goes: mentions, its terms' counts, facts,
        related pairs on either side, jobs; entities left without mentions too."""

        def work(db: sqlite3.Connection) -> None:
            drop_orphans(db, forget_note(db, note_id))

        self._write(work)

    def remove_notes(self, note_ids: Iterable[str]) -> int:
        """Notes the index no longer holds lose everything derived from them, all in one
        transaction: as ``remove_note`` for each, the notes whose pairs pointed at them
        queued for their related notes, the fact groups they led settled. How many notes
        had anything here."""
        ids = sorted(set(note_ids))

        def work(db: sqlite3.Connection) -> int:
            queue_related(db, {}, ids, self.clock())
            had, orphans = 0, set()
            for note_id in ids:
                before = db.total_changes
                orphans |= forget_note(db, note_id)
                had += db.total_changes > before
            drop_orphans(db, orphans)
            settle_all(db)
            return had

        return self._write(work) if ids else 0

    def remember(self, prepared: PreparedNote, base_url: str, *, queue_llm: bool = False,
                 queue_asked: bool = False, asked_scope: str = "note") -> int:
        """Extract a prepared note's entities (the no-LLM tier) and put them in place of
        its old ones (with ``queue_llm``, its LLM extraction queued in the same
        transaction; with ``queue_asked``, its written questions of ``asked_scope``);
        how many entities it has."""
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
            job = llm_payload(text, note.title, updated)
        asked_job = None
        if queue_asked:
            asked_job = json.dumps(asked_scopes.job(asked_scope, note.title, chunks), ensure_ascii=False)
        self.replace_note(note.user_id, note.id, prepared.content_hash, rows, terms=found.terms,
                          info=info_of(note, base_url), llm_job=job, asked_job=asked_job)
        return len(rows)

    def remember_meta(self, note: Note, base_url: str) -> None:
        """A note moved, renamed or retagged (same text): ``update_meta`` from the note."""
        self.update_meta(note.user_id, note.id, info_of(note, base_url), extraction.tags(note.tags))
