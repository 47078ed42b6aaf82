"""Every answer a bot sends, and what the person who asked thought of it.

The bots put 👍, 👎, "Why?" and "Save as note" under an answer. A button carries only
the answer's id (Telegram allows 64 bytes of callback data), so the answer is recorded
here when it is sent, and a press looks it up by that id. Ids are random and
unguessable, and every change is checked against the person who asked (``telegram:111``,
``discord:222``): in a group chat nobody can vote on, read or save another person's
answer. Only the operator's ``leanote-rag feedback`` reads everyone's, to tune retrieval
and the prompt with the questions that went wrong.

One SQLite file, ``<state_dir>/feedback.sqlite`` (WAL: the CLI reads it while the daemon
writes), with a schema version (``PRAGMA user_version``) so later versions migrate it.
Records older than ``KEEP_DAYS`` are the daemon's to ``forget``; a person's ``/forget`` takes
all of theirs at once (``forget_person``).

An answer is derived from the notes it cites, and goes with them: ``named`` lists the
notes each answer names (its citations, the candidates in its trace), and once the index
no longer holds one of them (trashed, deleted, excluded by the privacy rules) the sync
calls ``forget_notes``: the record keeps the question and the verdict, but no longer the
note's title, link or heading, nor the answer's text or the facts that rested on it.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from rag.answer.types import Answer
from rag.config import Settings
from rag.state_dir import prepare_state_dir
from rag.errors import UserError
from rag.sqlite import LockedDB

FILE = "feedback.sqlite"
KEEP_DAYS = 180
VERDICTS = ("up", "down")
# 8 random bytes: 11 url-safe characters, room to spare in a button's callback data.
ID_BYTES = 8

# Each step takes the schema from version i to i + 1 (PRAGMA user_version).
MIGRATIONS = [
    """
    CREATE TABLE answers (
        id TEXT PRIMARY KEY,
        time REAL NOT NULL,
        person TEXT NOT NULL,
        user_id TEXT NOT NULL,
        conversation TEXT,
        question TEXT NOT NULL,
        standalone TEXT NOT NULL,
        answer TEXT NOT NULL,
        cited TEXT NOT NULL,
        outcome TEXT NOT NULL,
        used_llm INTEGER NOT NULL,
        grounded INTEGER NOT NULL,
        trace TEXT,
        verdict TEXT,
        reason TEXT,
        updated REAL,
        saved_note_id TEXT
    );
    CREATE INDEX answers_time ON answers(time);
    CREATE INDEX answers_user_time ON answers(user_id, time);
    """,
    # the notes each answer names, for ``forget_notes``; filled from the answers already kept
    """
    CREATE TABLE named (
        note_id TEXT NOT NULL,
        answer_id TEXT NOT NULL,
        PRIMARY KEY (note_id, answer_id)
    ) WITHOUT ROWID;
    CREATE INDEX named_answer ON named(answer_id);
    INSERT OR IGNORE INTO named(note_id, answer_id)
        SELECT json_extract(c.value, '$.note_id'), a.id FROM answers a, json_each(a.cited) c
        WHERE json_extract(c.value, '$.note_id') IS NOT NULL;
    INSERT OR IGNORE INTO named(note_id, answer_id)
        SELECT json_extract(c.value, '$.note_id'), a.id FROM answers a, json_each(a.trace, '$.candidates') c
        WHERE a.trace IS NOT NULL AND json_extract(c.value, '$.note_id') IS NOT NULL
    """,
]
# What an answer says once a note it cited has left the index.
FORGOTTEN = ("（这个回答引用的笔记已不在索引中，回答的文字不再保留。）/ (A note this answer cited is no longer "
             "indexed: the answer's text is not kept.)")
GONE_TITLE = "（已不在索引中）/ (no longer indexed)"  # in place of such a note's title

_COLUMNS = (
    "id, time, person, user_id, conversation, question, standalone, answer, cited, outcome, used_llm, grounded, "
    "trace, verdict, reason, updated, saved_note_id"
)


class UnknownAnswer(UserError):
    """No answer with that id: never sent, or forgotten after ``KEEP_DAYS``."""


class NotYours(UserError):
    """Someone pressed a button under an answer to another person's question."""


@dataclass
class Record:
    """An answer as it was sent, and the asker's verdict on it."""

    id: str
    time: float
    person: str
    user_id: str
    conversation: str | None
    question: str
    standalone: str  # the question as searched (a follow-up rewritten)
    answer: str
    cited: list[dict]  # {note_id, title, url} per citation, in the answer's order
    outcome: str  # Trace.outcome ("llm", "refused", ...), "" when the answer had no trace
    used_llm: bool
    grounded: bool
    trace: dict | None
    verdict: str | None = None  # "up", "down", or None before any press
    reason: str | None = None
    updated: float | None = None  # the asker's last change: verdict, reason or save
    saved_note_id: str | None = None  # the note "Save as note" wrote

    def as_json(self) -> dict:
        return asdict(self)


def _record(row) -> Record:
    (id_, at, person, user_id, conversation, question, standalone, answer, cited, outcome, used_llm, grounded,
     trace, verdict, reason, updated, saved) = row
    return Record(id_, at, person, user_id, conversation, question, standalone, answer, json.loads(cited), outcome,
                  bool(used_llm), bool(grounded), json.loads(trace) if trace else None, verdict, reason, updated, saved)


def path_for(settings: Settings) -> Path:
    return Path(settings.state_dir) / FILE


class FeedbackStore(LockedDB):
    """The answers sent and their verdicts. One connection behind a lock: the bots call
    it from their event loop and from worker threads, each call is a few milliseconds."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        super().__init__(path, MIGRATIONS, "a readable feedback store ({err}). Move it aside (a new one is "
                         "started) or restore it from a backup")
        self.clock = clock

    @classmethod
    def open_for(cls, settings: Settings) -> "FeedbackStore":
        prepare_state_dir(settings.state_dir)
        return cls(path_for(settings))

    # --- what the bots call -----------------------------------------------------------------

    def record(self, person: str, user_id: str, answer: Answer, conversation: str | None = None) -> str:
        """Remember an answer as sent to ``person``; its id, for the buttons under it."""
        trace = answer.trace
        question = trace.question if trace is not None else answer.question
        cited = [{"n": c.n, "note_id": c.note_id, "title": c.title, "url": c.url} for c in answer.citations]
        answer_id = secrets.token_urlsafe(ID_BYTES)
        named = {c["note_id"] for c in cited} | {c.note_id for c in (trace.candidates if trace is not None else [])}
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute(
                    f"INSERT INTO answers({_COLUMNS}) VALUES ({','.join('?' * 17)})",
                    (answer_id, self.clock(), person, user_id, conversation, question,
                     trace.standalone if trace is not None else question, answer.answer,
                     json.dumps(cited, ensure_ascii=False), trace.outcome if trace is not None else "",
                     int(answer.used_llm), int(answer.grounded),
                     json.dumps(asdict(trace), ensure_ascii=False) if trace is not None else None,
                     None, None, None, None),
                )
                self.db.executemany("INSERT OR IGNORE INTO named(note_id, answer_id) VALUES (?, ?)",
                                    [(n, answer_id) for n in sorted(named) if n])
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return answer_id

    def withdraw(self, answer_id: str, person: str) -> bool:
        """The answer never reached ``person`` (the platform refused it): its record goes, with
        the notes it names. Whether there was one of theirs to remove."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                gone = self.db.execute("DELETE FROM answers WHERE id = ? AND person = ?",
                                       (answer_id, person)).rowcount
                if gone:
                    self.db.execute("DELETE FROM named WHERE answer_id = ?", (answer_id,))
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return bool(gone)

    def get(self, answer_id: str, person: str | None = None) -> Record | None:
        """The answer with that id, None when there is none. The bots pass ``person``
        ("Why?", "Save as note"): another person's answer raises ``NotYours``. Without
        it (the operator's tools) any answer is returned."""
        with self._lock:
            row = self.db.execute(f"SELECT {_COLUMNS} FROM answers WHERE id = ?", (answer_id,)).fetchone()
        if row is None:
            return None
        rec = _record(row)
        if person is not None and rec.person != person:
            raise NotYours("only the person who asked can use the buttons under this answer")
        return rec

    def verdict(self, answer_id: str, person: str, verdict: str, reason: str | None = None) -> Record:
        """The asker's 👍 ("up") or 👎 ("down"); a later press replaces it. A reason given
        for the old verdict does not stay attached to a new, different one."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, not {verdict!r}")
        return self._change(
            answer_id, person,
            "verdict = :verdict, reason = CASE WHEN :reason IS NOT NULL THEN :reason "
            "WHEN verdict IS :verdict THEN reason END",
            {"verdict": verdict, "reason": reason},
        )

    def reason(self, answer_id: str, person: str, text: str) -> Record:
        """Why the asker voted as they did, typed after the press ("" clears it)."""
        return self._change(answer_id, person, "reason = :reason", {"reason": text.strip() or None})

    def mark_saved(self, answer_id: str, person: str, note_id: str) -> Record:
        """The answer became note ``note_id``, so a second "Save as note" can say so."""
        return self._change(answer_id, person, "saved_note_id = :note_id", {"note_id": note_id})

    def _change(self, answer_id: str, person: str, assignments: str, params: dict) -> Record:
        """One update of the asker's own record, checked and applied in one transaction."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                row = self.db.execute("SELECT person FROM answers WHERE id = ?", (answer_id,)).fetchone()
                if row is None:
                    raise UnknownAnswer("this answer is no longer remembered: ask the question again")
                if row[0] != person:
                    raise NotYours("only the person who asked can use the buttons under this answer")
                self.db.execute(f"UPDATE answers SET {assignments}, updated = :now WHERE id = :id",
                                {**params, "now": self.clock(), "id": answer_id})
                row = self.db.execute(f"SELECT {_COLUMNS} FROM answers WHERE id = ?", (answer_id,)).fetchone()
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return _record(row)

    # --- what the operator and the daemon call ------------------------------------------------

    def export(self, user_id: str | None = None, since: float | None = None) -> list[dict]:
        """Every recorded answer (of ``user_id``; sent at or after ``since``, a
        ``time.time()``), newest first, with its verdict: the material for tuning."""
        where, args = [], []
        if user_id is not None:
            where.append("user_id = ?")
            args.append(user_id)
        if since is not None:
            where.append("time >= ?")
            args.append(since)
        sql = f"SELECT {_COLUMNS} FROM answers"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._lock:
            rows = self.db.execute(sql + " ORDER BY time DESC, rowid DESC", args).fetchall()
        return [_record(r).as_json() for r in rows]

    def forget(self, before: float) -> int:
        """Delete answers sent before ``before`` (``clock() - KEEP_DAYS * 86400`` for the
        retention period); how many went."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute("DELETE FROM named WHERE answer_id IN (SELECT id FROM answers WHERE time < ?)",
                                (before,))
                gone = self.db.execute("DELETE FROM answers WHERE time < ?", (before,)).rowcount
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return gone

    def persons(self, prefix: str) -> set[str]:
        """The people whose key starts with ``prefix`` that answers are kept of."""
        with self._lock:
            return {r[0] for r in self.db.execute("SELECT DISTINCT person FROM answers") if r[0].startswith(prefix)}

    def rename_person(self, old: str, new: str) -> int:
        """The answers of person ``old`` (and their conversations, ``old:<id>``) become ``new``'s
        (an API token named: ``bot.usecases.people.name_api_people``). How many moved."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                moved = self.db.execute("UPDATE answers SET person = ? WHERE person = ?", (new, old)).rowcount
                self.db.execute("UPDATE answers SET conversation = ? || substr(conversation, ?) "
                                "WHERE substr(conversation, 1, ?) = ?", (new + ":", len(old) + 2, len(old) + 1,
                                                                         old + ":"))
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return moved

    def forget_person(self, person: str) -> int:
        """Every answer sent to ``person`` (their questions, verdicts and reasons), now: their
        ``/forget``. How many went."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute("DELETE FROM named WHERE answer_id IN (SELECT id FROM answers WHERE person = ?)",
                                (person,))
                gone = self.db.execute("DELETE FROM answers WHERE person = ?", (person,)).rowcount
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return gone

    # --- the notes answers name (what the sync calls) -------------------------------------------

    def named_notes(self) -> set[str]:
        """Every note some kept answer still names."""
        with self._lock:
            return {r[0] for r in self.db.execute("SELECT DISTINCT note_id FROM named")}

    def forget_notes(self, note_ids) -> int:
        """The notes left the index: the answers naming them keep the question and the
        verdict, but lose those notes' titles, links and headings (citations and trace),
        the facts that rested on them and, if they cited one, their text (``FORGOTTEN``).
        In one transaction; how many answers changed."""
        gone = set(note_ids)
        if not gone:
            return 0
        ids = sorted(gone)
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                answers: set[str] = set()
                for i in range(0, len(ids), 500):
                    part = ids[i : i + 500]
                    answers.update(r[0] for r in self.db.execute(
                        f"SELECT answer_id FROM named WHERE note_id IN ({','.join('?' * len(part))})", part))
                for answer_id in sorted(answers):
                    row = self.db.execute("SELECT answer, cited, trace FROM answers WHERE id = ?",
                                          (answer_id,)).fetchone()
                    if row is not None:
                        self.db.execute("UPDATE answers SET answer = ?, cited = ?, trace = ? WHERE id = ?",
                                        (*_without(gone, *row), answer_id))
                    self.db.executemany("DELETE FROM named WHERE note_id = ? AND answer_id = ?",
                                        [(n, answer_id) for n in ids])
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return len(answers)


def _without(gone: set[str], answer: str, cited: str, trace: str | None) -> tuple[str, str, str | None]:
    """An answer's text, citations and trace (as stored) without the notes in ``gone``."""
    citations = json.loads(cited)
    blocks = set()  # evidence blocks of the notes that went: a citation [n] is block n
    for c in citations:
        if c.get("note_id") in gone:
            blocks.add(c.get("n"))
            c["title"], c["url"] = GONE_TITLE, ""
    if blocks:
        answer = FORGOTTEN
    if trace is not None:
        t = json.loads(trace)
        for c in t.get("candidates") or []:
            if c.get("note_id") in gone:
                c["title"], c["heading"] = GONE_TITLE, ""
                if c.get("evidence") is not None:
                    blocks.add(c["evidence"])
        # "[n] subject — predicate — object": a fact of a block that went
        t["facts"] = [f for f in t.get("facts") or [] if not any(f.startswith(f"[{n}]") for n in blocks)]
        # the evidence the LLM read, and its reply read against it, hold the note's text
        t["evidence"] = {n: text for n, text in (t.get("evidence") or {}).items() if int(n) not in blocks}
        if blocks and (t.get("reply") or t.get("units")):
            t["reply"], t["units"] = "", []
        trace = json.dumps(t, ensure_ascii=False)
    return answer, json.dumps(citations, ensure_ascii=False), trace
