"""The questions each note answers, as the LLM wrote them (``rag.index.asked``): their rows,
one per note at the content hash they were written from, and what the status shows of them.

Jobs are queued with the note's entities (``NoteWrites.remember(queue_asked=True)``) in the
memory's job queue (kind ``asked``) and taken by the same worker as the LLM tier's
(``sync.memory_jobs``). A row's questions are the truth; the index's question points are made
from them (``rag.index.asked.index_questions``) and brought in line with them by the worker
(``asked_rows``). A row with no questions is a generation dropped: counted, not asked again
until the note's text changes.

A mixin of ``rag.memory.store.MemoryStore``."""

from __future__ import annotations

import json
import sqlite3

from rag.memory.schema import ASKED_JOB


class WrittenQuestions:
    def store_asked(self, job: dict, questions: list[str], stats: dict, scope: str = "note",
                    ties: list[list[int]] | None = None) -> bool:
        """The job's note's written questions (none: the generation was dropped) of ``scope``, with
        per question the chunks of its section (``ties``; none: the note's), in place of its old
        ones. False (nothing stored, the job dropped) when the note changed or went."""
        stats = {**stats, "at": self.clock()}

        def work(db: sqlite3.Connection) -> bool:
            db.execute("DELETE FROM jobs WHERE note_id = ? AND kind = ? AND content_hash = ?",
                       (job["note_id"], ASKED_JOB, job["content_hash"]))
            if not self._job_current(db, job):
                return False
            db.execute("INSERT OR REPLACE INTO asked(note_id, user_id, content_hash, questions, stats, at, scope, ties) "
                       "VALUES (?,?,?,?,?,?,?,?)", (job["note_id"], job["user_id"], job["content_hash"],
                                                    json.dumps(questions, ensure_ascii=False),
                                                    json.dumps(stats, ensure_ascii=False), stats["at"], scope,
                                                    json.dumps(ties or [])))
            return True

        return self._write(work)

    def queue_missing_asked(self, scope: str = "note") -> int:
        """A job for each processed note with neither written questions of ``scope`` at its text
        nor a job (its notes indexed before the questions were turned on, or written in the other
        scope): their digest is read from the index when the job runs. How many were queued."""
        def work(db: sqlite3.Connection) -> int:
            now = self.clock()
            cur = db.execute(
                "INSERT INTO jobs(note_id, kind, user_id, content_hash, attempts, next_try, error, parked, created, "
                "payload) SELECT n.note_id, ?, n.user_id, n.content_hash, 0, ?, NULL, 0, ?, '{}' FROM notes n "
                "WHERE NOT EXISTS (SELECT 1 FROM asked a WHERE a.note_id = n.note_id AND a.content_hash = n.content_hash "
                "AND a.scope = ?) AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.note_id = n.note_id AND j.kind = ?)",
                (ASKED_JOB, now, now, scope, ASKED_JOB))
            return cur.rowcount

        return self._write(work)

    def asked_rows(self) -> dict[str, tuple[str, str, list[str], list[list[int]]]]:
        """Every note's written questions: note id -> (user, content hash, questions, ties: per
        question the chunks it points to, none: the note's)."""
        with self._lock:
            rows = self.db.execute("SELECT note_id, user_id, content_hash, questions, ties FROM asked").fetchall()
        return {n: (u, h, json.loads(q), json.loads(t)) for n, u, h, q, t in rows}

    def asked_scope(self, note_id: str) -> str | None:
        """The scope a note's questions were written in (None: none written)."""
        with self._lock:
            row = self.db.execute("SELECT scope FROM asked WHERE note_id = ?", (note_id,)).fetchone()
        return row[0] if row else None

    def asked_of(self, note_id: str, user_id: str) -> list[str]:
        """A note's written questions (none when not written, or dropped)."""
        with self._lock:
            row = self.db.execute("SELECT questions FROM asked WHERE note_id = ? AND user_id = ?",
                                  (note_id, user_id)).fetchone()
        return json.loads(row[0]) if row else []

    def asked_counts(self, user_id: str | None = None) -> dict:
        """For the status: notes written, questions, generations dropped (and the questions
        dropped, by reason), jobs pending and parked, the mean seconds and tokens of a note's
        generation, and the notes done in the last hour and day."""
        where, args = (" WHERE user_id = ?", (user_id,)) if user_id is not None else ("", ())
        now = self.clock()
        with self._lock:
            rows = self.db.execute(f"SELECT questions, stats, at FROM asked{where}", args).fetchall()
            and_user = where.replace("WHERE", "AND")
            pending = self.db.execute(f"SELECT COUNT(*) FROM jobs WHERE kind = ? AND parked = 0{and_user}",
                                      (ASKED_JOB, *args)).fetchone()[0]
            parked = self.db.execute(f"SELECT COUNT(*) FROM jobs WHERE kind = ? AND parked = 1{and_user}",
                                     (ASKED_JOB, *args)).fetchone()[0]
        notes = questions = empty = 0
        dropped: dict[str, int] = {}
        seconds, tokens = [], []
        for q, s, _ in rows:
            q, s = json.loads(q), json.loads(s)
            notes += 1
            questions += len(q)
            empty += not q
            for reason, n in (s.get("dropped") or {}).items():
                dropped[reason] = dropped.get(reason, 0) + n
            if s.get("seconds"):
                seconds.append(s["seconds"])
            tokens.append(s.get("output_tokens") or 0)
        mean = sum(seconds) / len(seconds) if seconds else None
        return {"notes": notes - empty, "questions": questions, "generations_dropped": empty, "dropped": dropped,
                "jobs_pending": pending, "jobs_parked": parked,
                "seconds_per_note": round(mean, 1) if mean is not None else None,
                "output_tokens": sum(tokens),
                "eta_seconds": round(mean * pending) if mean is not None else None,
                "done_last_hour": sum(1 for *_, at in rows if at >= now - 3600),
                "done_last_day": sum(1 for *_, at in rows if at >= now - 86400)}
