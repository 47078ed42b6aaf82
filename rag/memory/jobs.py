"""The LLM tier in the memory: its job queue (``sync.memory_jobs``), and the summaries, typed
entities and facts it stores, settled so the newest note's facts are the active ones.

A mixin of ``rag.memory.store.MemoryStore``."""

from __future__ import annotations

import json
import sqlite3
from typing import Sequence

from rag.memory.entities import norm

from rag.memory.schema import LLM_JOB
from rag.memory.rows import (fact_key, is_rejected, llm_entities, llm_mentions, llm_payload, queue_llm, settle_all,
                             settle_group)


class LlmTier:
    # --- facts and jobs (the LLM tier: rag.memory.extract, sync.memory_jobs) ----------------------
    #
    # A job per note whose text changed (``enqueue_llm``), carrying that text; the worker
    # takes due jobs oldest first and stores what came back (``store_llm``) only while the
    # note is still at the job's content hash. Facts of a (user, subject, predicate) group:
    # the newest note's (by the note's updated time, ``facts.time``) are active, with any
    # other note's fact of the same object; the others are ``superseded`` and point at the
    # group's newest fact (its note is the other source). ``settle_facts`` repairs groups
    # whose newest fact went with its note: the newest fact left is active again.

    TIER_LLM = "llm"

    def enqueue_llm(self, user_id: str, note_id: str, content_hash: str, text: str, *, title: str = "",
                    updated: float | None = None) -> None:
        """Queue (or replace) the note's LLM extraction, due now."""
        payload = llm_payload(text, title, updated)
        self._write(lambda db: queue_llm(db, note_id, user_id, content_hash, payload, self.clock()))

    def due_job(self, now: float | None = None, kinds: Sequence[str] = (LLM_JOB,)) -> dict | None:
        """The oldest due, unparked job of ``kinds`` (the LLM tier's; ``asked``: written
        questions), or None."""
        now = self.clock() if now is None else now
        if not kinds:
            return None
        marks = ",".join("?" * len(kinds))
        with self._lock:
            row = self.db.execute(
                f"SELECT note_id, user_id, content_hash, attempts, payload, kind FROM jobs WHERE kind IN ({marks}) "
                "AND parked = 0 AND next_try <= ? ORDER BY created, kind DESC, note_id LIMIT 1",
                (*kinds, now)).fetchone()
        if row is None:
            return None
        payload = json.loads(row[4] or "{}")
        return {"note_id": row[0], "user_id": row[1], "content_hash": row[2], "attempts": row[3], "kind": row[5],
                "text": payload.get("text") or "", "title": payload.get("title") or "", "updated": payload.get("updated"),
                "digest": payload.get("digest") or "", "scope": payload.get("scope") or "note",
                "sections": payload.get("sections") or []}

    def next_due(self) -> float | None:
        """When the next unparked LLM job is due, or None."""
        with self._lock:
            return self.db.execute("SELECT MIN(next_try) FROM jobs WHERE kind = ? AND parked = 0",
                                   (LLM_JOB,)).fetchone()[0]

    def job_current(self, job: dict) -> bool:
        """Is the note still at the job's text? If not the job is dropped (a newer job, if
        the note changed again, stays)."""
        def work(db: sqlite3.Connection) -> bool:
            if self._job_current(db, job):
                return True
            db.execute("DELETE FROM jobs WHERE note_id = ? AND kind = ? AND content_hash = ?",
                       (job["note_id"], job.get("kind", LLM_JOB), job["content_hash"]))
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
            (attempts, next_try, error[:500], int(parked), job["note_id"], job.get("kind", LLM_JOB),
             job["content_hash"])))
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
        found, dropped = llm_entities(job.get("text") or "", entities)
        stats["entities_dropped"] = dropped
        stats["at"] = now  # when it was done: the status's jobs done in the last hour

        def work(db: sqlite3.Connection) -> bool:
            db.execute("DELETE FROM jobs WHERE note_id = ? AND kind = ? AND content_hash = ?",
                       (note_id, LLM_JOB, job["content_hash"]))
            if not self._job_current(db, job):
                return False
            llm_mentions(db, user_id, note_id, job.get("text") or "", found)
            groups = set(db.execute("SELECT subject, predicate FROM facts WHERE note_id = ? AND origin = 'llm'",
                                    (note_id,)).fetchall())
            db.execute("DELETE FROM facts WHERE note_id = ? AND origin = 'llm'", (note_id,))
            for f in facts:
                subject, predicate = fact_key(f["subject"], f["predicate"])
                if is_rejected(db, user_id, "fact", subject, predicate, f["object"]):
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
                settle_group(db, user_id, subject, predicate)
            return True

        return self._write(work)

    def settle_facts(self) -> int:
        """Groups whose newest fact went (its note edited, trashed, deleted): the newest
        fact left is active again. How many groups were settled."""
        return self._write(settle_all)

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
                "WHERE kind = ? AND parked = 0", (LLM_JOB,)).fetchone()
        return int(jobs), int(chars)

    def llm_counts(self, user_id: str | None = None) -> dict:
        """Jobs pending and parked (the parked ones with their errors), facts by status, and
        the jobs done in the last hour and day, with when the last was done (``status``)."""
        where, args = (" AND user_id = ?", (user_id,)) if user_id is not None else ("", ())
        now = self.clock()
        with self._lock:
            done_at = "json_extract(llm, '$.at')"
            hour, day, last = self.db.execute(
                f"SELECT COALESCE(SUM({done_at} >= ?), 0), COALESCE(SUM({done_at} >= ?), 0), MAX({done_at}) "
                f"FROM notes WHERE llm IS NOT NULL{where}", (now - 3600, now - 86400, *args)).fetchone()
            jobs = f"FROM jobs WHERE kind = '{LLM_JOB}'{where}"
            pending = self.db.execute(f"SELECT COUNT(*) {jobs} AND parked = 0", args).fetchone()[0]
            parked = self.db.execute(f"SELECT note_id, attempts, error {jobs} AND parked = 1 ORDER BY next_try DESC",
                                     args).fetchall()
            facts = dict(self.db.execute(f"SELECT status, COUNT(*) FROM facts WHERE 1 = 1{where} GROUP BY status",
                                         args))
        return {"jobs_pending": pending, "jobs_parked": len(parked),
                "parked": [{"note_id": n, "attempts": a, "error": e} for n, a, e in parked[:5]],
                "facts": sum(facts.values()), "facts_by_status": facts,
                "done_last_hour": int(hour), "done_last_day": int(day), "last_done": last}
