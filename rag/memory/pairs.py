"""Related notes in the memory: the queue of notes whose pairs are due, and the pairs
themselves (``rag.memory.related`` computes them).

A mixin of ``rag.memory.store.MemoryStore``."""

from __future__ import annotations

import json
import sqlite3
from typing import Iterable, Sequence


from rag.memory.schema import RELATED_JOB, IN_BATCH
from rag.memory.rows import is_rejected, queue_related


class RelatedPairs:
    # --- related notes (rag.memory.related) ------------------------------------------------------------
    # Pairs are stored per direction: a row (note_a, note_b) puts note_b in note_a's list. Computing
    # a note writes its own list and the mirror rows, so a new note shows up in its neighbours'
    # lists without recomputing them. Notes to recompute wait as jobs of kind ``related``.


    def related_mark(self, changed: dict[str, str], removed: Iterable[str] = ()) -> int:
        """Before the memory follows a transaction (``_forget`` drops pairs on both sides):
        queue the ``changed`` notes (note id -> user) and every note whose stored pairs point
        at a changed or ``removed`` note. How many notes are queued."""
        removed = list(removed)
        if not changed and not removed:
            return 0
        return self._write(lambda db: queue_related(db, changed, removed, self.clock()))

    def related_jobs(self) -> list[tuple[str, str]]:
        """Notes waiting for their related notes: (note id, user), oldest first."""
        with self._lock:
            return self.db.execute("SELECT note_id, user_id FROM jobs WHERE kind = ? ORDER BY created, note_id",
                                   (RELATED_JOB,)).fetchall()

    def related_done(self, note_ids: Iterable[str]) -> None:
        self._write(lambda db: db.executemany("DELETE FROM jobs WHERE note_id = ? AND kind = ?",
                                              [(n, RELATED_JOB) for n in note_ids]))

    def note_users(self, note_ids: Iterable[str]) -> dict[str, str]:
        """Processed notes among ``note_ids``: note id -> user."""
        ids = list(note_ids)
        out: dict[str, str] = {}
        with self._lock:
            for i in range(0, len(ids), IN_BATCH):
                part = ids[i : i + IN_BATCH]
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
                if is_rejected(db, user_id, "pair", note_id, other):
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

    # --- for a digest (rag.digest) ----------------------------------------------------------------

    def shown_notes(self, user_id: str) -> list[dict]:
        """Every processed note of the user as it is shown: id, title, notebook, link and
        Leanote's ``updated_at`` (ISO 8601, "" when the source gives none); and what the index
        saw of it: ``first_seen``, ``changed_at`` (its text; None: from before this was kept)."""
        with self._lock:
            rows = self.db.execute("SELECT note_id, title, notebook, url, updated_at, first_seen, changed_at FROM notes "
                                   "WHERE user_id = ?", (user_id,)).fetchall()
        return [{"note_id": n, "title": t, "notebook": nb, "url": u, "updated_at": up, "first_seen": fs,
                 "changed_at": ch} for n, t, nb, u, up, fs, ch in rows]

    def first_index(self, user_id: str) -> float | None:
        """When the user's first complete pass ended (None: not yet)."""
        with self._lock:
            row = self.db.execute("SELECT at FROM first_index WHERE user_id = ?", (user_id,)).fetchone()
        return row[0] if row else None

    def best_pairs(self, user_id: str, limit: int, min_score: float = 0.0) -> list[tuple[str, str, float]]:
        """The user's related pairs, each once (a < b), the best first."""
        with self._lock:
            rows = self.db.execute("SELECT note_a, note_b, score FROM related WHERE user_id = ? AND note_a < note_b "
                                   "AND score >= ? ORDER BY score DESC, note_a, note_b LIMIT ?",
                                   (user_id, min_score, limit)).fetchall()
        return [(a, b, s) for a, b, s in rows]

    def link_words(self, user_id: str) -> dict[str, set[str]]:
        """The words of each note's links (Markdown link texts, normalised), by note."""
        with self._lock:
            rows = self.db.execute("SELECT m.note_id, e.norm FROM mentions m JOIN entities e ON e.id = m.entity_id "
                                   "WHERE m.user_id = ? AND e.kind = 'link'", (user_id,)).fetchall()
        out: dict[str, set[str]] = {}
        for note_id, words in rows:
            out.setdefault(note_id, set()).add(words)
        return out

    # --- end of related notes ----------------------------------------------------------------
