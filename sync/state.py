"""Sync state in SQLite under ``state_dir``: what is in the index, and why.

- ``notes``: one row per note seen: its status (indexed, or why not), Usn, content
  hash, metadata hash, the pipeline that prepared it, its point ids in the store,
  and for snapshot sources the fingerprint of the file it was read from.
- ``accounts``: per (source, account): the USN cursors (notebooks, notes), the
  server's USN when last asked, last success, last error, next run.
- ``notebooks``: the notebook tree of incremental sources, to resolve paths and
  privacy rules without asking the server.
- ``embeddings``: dense vectors keyed by (embedder, embedded text) hash, so an
  edited note re-embeds only the chunks whose text changed.
- ``runs``: sync history. ``meta``: which index these rows describe, the privacy
  rules last applied, and per snapshot source what its last complete pass read
  (``checkpoint:<source>``, e.g. the backup file's path, size and mtime).
- ``skipped``: notes that could not be read or indexed (a malformed field, a file that
  is not text), and why, until they are read again successfully or go away.

A note's row and the cursor that covers it are written in one transaction, after
its points are in the store: a crash leaves at worst notes that are processed
again, and deterministic point ids make that harmless.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np

from rag.state_dir import prepare_state_dir
from rag.errors import BrokenState, UserError
from rag.model import Notebook
from rag.sqlite import migrate, wal

from sync.faults import broken_state

log = logging.getLogger(__name__)

# Each step takes the schema from version i to i + 1 (PRAGMA user_version).
MIGRATIONS = [
    """
    CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS notes (
        note_id TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        user_id TEXT NOT NULL,
        title TEXT NOT NULL,
        notebook TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        meta_hash TEXT NOT NULL,
        pipeline TEXT NOT NULL,
        point_ids TEXT NOT NULL,
        chunk_keys TEXT NOT NULL,
        usn INTEGER NOT NULL DEFAULT 0,
        indexed_at REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS notes_source ON notes(source);
    CREATE TABLE IF NOT EXISTS embeddings (key TEXT PRIMARY KEY, vector BLOB NOT NULL);
    CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        source TEXT NOT NULL,
        started REAL NOT NULL,
        finished REAL,
        summary TEXT,
        error TEXT
    );
    """,
    """
    ALTER TABLE notes ADD COLUMN account TEXT NOT NULL DEFAULT '';
    ALTER TABLE notes ADD COLUMN status TEXT NOT NULL DEFAULT 'indexed';
    ALTER TABLE notes ADD COLUMN notebook_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE notes ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
    CREATE INDEX IF NOT EXISTS notes_notebook ON notes(notebook_id);
    CREATE TABLE accounts (
        source TEXT NOT NULL,
        account TEXT NOT NULL,
        user_id TEXT NOT NULL DEFAULT '',
        notebooks_usn INTEGER NOT NULL DEFAULT 0,
        notes_usn INTEGER NOT NULL DEFAULT 0,
        server_usn INTEGER,
        last_attempt REAL,
        last_success REAL,
        last_error TEXT,
        failing_since REAL,
        next_run REAL,
        PRIMARY KEY (source, account)
    );
    CREATE TABLE notebooks (
        source TEXT NOT NULL,
        notebook_id TEXT NOT NULL,
        account TEXT NOT NULL,
        user_id TEXT NOT NULL,
        title TEXT NOT NULL,
        parent_id TEXT NOT NULL,
        deleted INTEGER NOT NULL,
        usn INTEGER NOT NULL,
        PRIMARY KEY (source, notebook_id)
    );
    """,
    """
    ALTER TABLE accounts ADD COLUMN synced_usn INTEGER;
    """,
    """
    CREATE TABLE skipped (
        source TEXT NOT NULL,
        note_id TEXT NOT NULL,
        account TEXT NOT NULL,
        origin TEXT NOT NULL,
        reason TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (source, note_id)
    );
    """,
    """
    ALTER TABLE notes ADD COLUMN fingerprint TEXT NOT NULL DEFAULT '';
    """,
]

INDEXED = "indexed"  # other statuses: "trash", "deleted", "excluded" (known, not in the index)


@dataclass
class NoteRecord:
    note_id: str
    source: str
    user_id: str
    title: str
    notebook: str
    content_hash: str
    meta_hash: str
    pipeline: str
    point_ids: list[str]
    chunk_keys: list[str]
    usn: int
    account: str = ""
    status: str = INDEXED  # or "trash", "deleted", "excluded": known, not in the index
    notebook_id: str = ""
    tags: list[str] = field(default_factory=list)
    # Snapshot sources: what the note was read from (a file's size and mtime); "" when
    # unknown. The next pass does not read a file whose fingerprint is the same.
    fingerprint: str = ""


@dataclass
class AccountRecord:
    source: str
    account: str
    user_id: str = ""
    notebooks_usn: int = 0
    notes_usn: int = 0
    server_usn: int | None = None
    last_attempt: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    failing_since: float | None = None
    next_run: float | None = None
    # The server's USN read before the last complete pass: everything up to it was
    # seen then. Only the idle check uses it; cursors stay "highest USN received".
    synced_usn: int | None = None

    @property
    def cursor(self) -> int:
        """The highest USN received (notebooks and notes share the user's counter)."""
        return max(self.notebooks_usn, self.notes_usn)


_ACCOUNT_COLUMNS = (
    "source, account, user_id, notebooks_usn, notes_usn, server_usn, last_attempt, last_success, "
    "last_error, failing_since, next_run, synced_usn"
)
_NOTE_COLUMNS = (
    "note_id, source, user_id, title, notebook, content_hash, meta_hash, pipeline, point_ids, chunk_keys, "
    "usn, account, status, notebook_id, tags, fingerprint"
)


class Indexed(NamedTuple):
    """A note the index holds: whose it is, the text it is at, how it is shown."""

    user_id: str
    content_hash: str
    title: str
    notebook: str
    tags: tuple[str, ...]


def _note(row) -> NoteRecord:
    return NoteRecord(
        *row[:8], json.loads(row[8]), json.loads(row[9]), row[10], row[11], row[12], row[13], json.loads(row[14]),
        row[15],
    )


PAGE_SIZE = 16384


class State:
    def __init__(self, state_dir: Path, *, replace_broken: bool = False):
        """Open (or create) ``state_dir/state.db``. A file that is not a readable database
        is an error naming it and the fix; with ``replace_broken`` (``index --rebuild``) it
        is set aside as ``state.db.broken-<time>`` and a new one is started, also when only
        some of its pages are damaged (SQLite's quick check)."""
        self.path = prepare_state_dir(state_dir) / "state.db"
        try:
            self._open()
            if replace_broken and (problem := self.problem()) is not None:
                self.db.close()
                raise sqlite3.DatabaseError(problem)
        except sqlite3.DatabaseError as err:
            if isinstance(err, sqlite3.OperationalError) and "unable to open" in str(err):
                raise UserError(f"cannot open {self.path}: {err}. Make it readable and writable by this user") from None
            if not replace_broken:
                raise BrokenState(
                    f"{self.path} is not a readable sync state ({err}). Run `leanote-rag index --rebuild` "
                    f"(it sets the file aside and reads every note again from the source), or restore the "
                    f"file from a backup"
                ) from None
            aside = self.path.with_name(f"state.db.broken-{time.strftime('%Y%m%d-%H%M%S')}")
            for suffix in ("-wal", "-shm"):
                self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
            self.path.rename(aside)
            log.warning("%s was not a readable database (%s): set aside as %s, starting anew", self.path, err, aside)
            self._open()

    def _open(self) -> None:
        self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            # A new file gets 16 KiB pages (an existing one keeps its own): a cached vector is a
            # 2 KiB row, and 4 KiB pages hold one such row each, half the page empty (the cache
            # took twice its vectors' size)
            self.db.execute(f"PRAGMA page_size={PAGE_SIZE}")
            wal(self.db, 30)
            self.db.execute("PRAGMA synchronous=NORMAL")
            migrate(self.db, MIGRATIONS)  # each step under the write lock, also with another opener
        except BaseException:
            self.db.close()
            raise

    def check(self) -> str:
        """SQLite's own consistency check: "ok", or what is wrong."""
        rows = self.db.execute("PRAGMA quick_check").fetchall()
        return "; ".join(r[0] for r in rows[:5])

    def problem(self) -> str | None:
        """What SQLite's check finds damaged in the file (it reads every page), or None."""
        try:
            result = self.check()
        except sqlite3.DatabaseError as err:
            if isinstance(err, sqlite3.OperationalError) and "locked" in str(err):
                return None  # busy, not broken
            return str(err)
        return None if result == "ok" else result

    def verify(self) -> None:
        """``BrokenState`` naming the file and the fix when some of its pages are damaged."""
        problem = self.problem()
        if problem is not None:
            raise broken_state(self.path, problem)

    def close(self) -> None:
        self.db.close()

    def transaction(self):
        return _Transaction(self.db)

    # --- meta -----------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def bind_index(self, index_id: str) -> bool:
        """Tie the rows to one index. When they describe another one (a rebuild, an index
        deleted by hand) they are dropped, cursors included, so everything is pulled anew.
        Returns True when rows were dropped."""
        if self.get_meta("index_id") == index_id:
            return False
        had_rows = self.db.execute("SELECT 1 FROM notes LIMIT 1").fetchone() is not None
        with self.transaction():
            self.db.execute("DELETE FROM notes")
            self.db.execute("DELETE FROM skipped")
            self.db.execute("UPDATE accounts SET notebooks_usn = 0, notes_usn = 0, synced_usn = NULL")
            self.db.execute("DELETE FROM notebooks")
            self.set_meta("index_id", index_id)
        return had_rows

    # --- notes ----------------------------------------------------------------------------

    def note(self, note_id: str) -> NoteRecord | None:
        row = self.db.execute(f"SELECT {_NOTE_COLUMNS} FROM notes WHERE note_id = ?", (note_id,)).fetchone()
        return _note(row) if row else None

    def notes_in(self, notebook_ids: Iterable[str]) -> list[NoteRecord]:
        ids = list(notebook_ids)
        out: list[NoteRecord] = []
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            marks = ",".join("?" * len(part))
            rows = self.db.execute(f"SELECT {_NOTE_COLUMNS} FROM notes WHERE notebook_id IN ({marks})", part)
            out.extend(_note(r) for r in rows)
        return out

    def notes_of(self, source: str, account: str) -> list[NoteRecord]:
        rows = self.db.execute(f"SELECT {_NOTE_COLUMNS} FROM notes WHERE source = ? AND account = ?", (source, account))
        return [_note(r) for r in rows]

    def latest_note(self, source: str, account: str, most_usn: int) -> tuple[str, int] | None:
        """The note of ``account`` seen last in the stream of changes, at a USN of at most
        ``most_usn``: (note id, its USN), or None."""
        row = self.db.execute("SELECT note_id, usn FROM notes WHERE source = ? AND account = ? AND usn > 0 "
                              "AND usn <= ? ORDER BY usn DESC LIMIT 1", (source, account, most_usn)).fetchone()
        return (row[0], row[1]) if row else None

    def note_ids(self, source: str | None = None) -> set[str]:
        if source is None:
            rows = self.db.execute("SELECT note_id FROM notes")
        else:
            rows = self.db.execute("SELECT note_id FROM notes WHERE source = ?", (source,))
        return {r[0] for r in rows}

    def put_note(self, rec: NoteRecord) -> None:
        self.db.execute(
            f"INSERT OR REPLACE INTO notes({_NOTE_COLUMNS}, indexed_at) VALUES ({','.join('?' * 17)})",
            (
                rec.note_id,
                rec.source,
                rec.user_id,
                rec.title,
                rec.notebook,
                rec.content_hash,
                rec.meta_hash,
                rec.pipeline,
                json.dumps(rec.point_ids),
                json.dumps(rec.chunk_keys),
                rec.usn,
                rec.account,
                rec.status,
                rec.notebook_id,
                json.dumps(rec.tags, ensure_ascii=False),
                rec.fingerprint,
                time.time(),
            ),
        )

    def indexed_notes(self) -> dict[str, "Indexed"]:
        """Every note the index holds, as it is indexed. What the stores derived from notes
        (the memory, the feedback store) are brought in line with."""
        rows = self.db.execute("SELECT note_id, user_id, content_hash, title, notebook, tags FROM notes "
                               "WHERE status = ?", (INDEXED,))
        return {r[0]: Indexed(r[1], r[2], r[3], r[4], tuple(json.loads(r[5]))) for r in rows}

    def snapshot_rows(self, source: str) -> dict[str, tuple[str, str, str]]:
        """A snapshot source's notes: note id -> (fingerprint, status, pipeline)."""
        rows = self.db.execute("SELECT note_id, fingerprint, status, pipeline FROM notes WHERE source = ?", (source,))
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    def delete_note(self, note_id: str) -> None:
        self.db.execute("DELETE FROM notes WHERE note_id = ?", (note_id,))

    # --- notes that could not be indexed ----------------------------------------------------

    def skip(self, source: str, account: str, note_id: str, origin: str, reason: str) -> bool:
        """Remember a skipped note; True when this is news (not the same reason as last time)."""
        key = note_id or origin
        row = self.db.execute("SELECT reason FROM skipped WHERE source = ? AND note_id = ?", (source, key)).fetchone()
        self.db.execute(
            "INSERT OR REPLACE INTO skipped(source, note_id, account, origin, reason, at) VALUES (?,?,?,?,?,?)",
            (source, key, account, origin, reason, time.time()),
        )
        return row is None or row[0] != reason

    def unskip(self, source: str, keys: Iterable[str]) -> None:
        self.db.executemany("DELETE FROM skipped WHERE source = ? AND note_id = ?", [(source, k) for k in keys])

    def skipped(self, source: str | None = None) -> list[dict]:
        """Notes skipped and not read successfully since, newest first."""
        where, args = ("WHERE source = ?", (source,)) if source else ("", ())
        rows = self.db.execute(
            f"SELECT source, account, note_id, origin, reason, at FROM skipped {where} ORDER BY at DESC", args
        )
        return [dict(zip(("source", "account", "note_id", "origin", "reason", "at"), r)) for r in rows]

    def counts_by_user(self) -> dict[str, int]:
        """Indexed notes per user."""
        return dict(self.db.execute("SELECT user_id, COUNT(*) FROM notes WHERE status = ? GROUP BY user_id", (INDEXED,)))

    def indexed_count(self, source: str, account: str) -> int:
        row = self.db.execute(
            "SELECT COUNT(*) FROM notes WHERE source = ? AND account = ? AND status = ?", (source, account, INDEXED)
        ).fetchone()
        return row[0]

    # --- accounts and notebooks ------------------------------------------------------------

    def account(self, source: str, account: str) -> AccountRecord:
        row = self.db.execute(
            f"SELECT {_ACCOUNT_COLUMNS} FROM accounts WHERE source = ? AND account = ?",
            (source, account),
        ).fetchone()
        return AccountRecord(*row) if row else AccountRecord(source, account)

    def accounts(self) -> list[AccountRecord]:
        rows = self.db.execute(
            f"SELECT {_ACCOUNT_COLUMNS} FROM accounts ORDER BY source, account"
        )
        return [AccountRecord(*r) for r in rows]

    def put_account(self, rec: AccountRecord) -> None:
        self.db.execute(
            f"INSERT OR REPLACE INTO accounts({_ACCOUNT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                rec.source,
                rec.account,
                rec.user_id,
                rec.notebooks_usn,
                rec.notes_usn,
                rec.server_usn,
                rec.last_attempt,
                rec.last_success,
                rec.last_error,
                rec.failing_since,
                rec.next_run,
                rec.synced_usn,
            ),
        )

    def notebooks(self, source: str) -> dict[str, Notebook]:
        rows = self.db.execute(
            "SELECT notebook_id, user_id, title, parent_id, deleted FROM notebooks WHERE source = ?", (source,)
        )
        return {r[0]: Notebook(r[0], r[1], r[2], r[3], bool(r[4])) for r in rows}

    def put_notebook(self, source: str, account: str, book: Notebook, usn: int) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO notebooks(source, notebook_id, account, user_id, title, parent_id, deleted, usn) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (source, book.id, account, book.user_id, book.title, book.parent_id, int(book.is_deleted), usn),
        )

    def delete_notebook(self, source: str, notebook_id: str) -> None:
        self.db.execute("DELETE FROM notebooks WHERE source = ? AND notebook_id = ?", (source, notebook_id))

    # --- embedding cache ------------------------------------------------------------------

    def cached_vectors(self, keys: Iterable[str]) -> dict[str, np.ndarray]:
        keys = list(dict.fromkeys(keys))
        found: dict[str, np.ndarray] = {}
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            marks = ",".join("?" * len(part))
            for key, blob in self.db.execute(f"SELECT key, vector FROM embeddings WHERE key IN ({marks})", part):
                found[key] = np.frombuffer(blob, dtype=np.float32)
        return found

    def cache_vectors(self, vectors: dict[str, np.ndarray]) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO embeddings(key, vector) VALUES (?, ?)",
            [(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in vectors.items()],
        )

    def prune_cache(self) -> int:
        """Drop cached vectors no indexed chunk uses any more."""
        used = set()
        for (keys,) in self.db.execute("SELECT chunk_keys FROM notes"):
            used.update(json.loads(keys))
        stale = [k for (k,) in self.db.execute("SELECT key FROM embeddings") if k not in used]
        with self.transaction():
            self.db.executemany("DELETE FROM embeddings WHERE key = ?", [(k,) for k in stale])
        return len(stale)

    # --- runs -----------------------------------------------------------------------------

    def start_run(self, source: str) -> int:
        cur = self.db.execute("INSERT INTO runs(source, started) VALUES (?, ?)", (source, time.time()))
        return cur.lastrowid

    def finish_run(self, run_id: int, summary: dict, error: str | None = None) -> None:
        self.db.execute(
            "UPDATE runs SET finished = ?, summary = ?, error = ? WHERE id = ?",
            (time.time(), json.dumps(summary, ensure_ascii=False), error, run_id),
        )

    def runs_since(self, since: float, limit: int = 100) -> list[dict]:
        """Runs that started at or after ``since`` (time.time()), newest first, among the
        last ``limit``: ``finished`` is None while one is under way."""
        rows = self.db.execute("SELECT started, finished FROM runs ORDER BY id DESC LIMIT ?", (limit,))
        return [{"started": started, "finished": finished} for started, finished in rows if started >= since]

    def last_run(self, ok_only: bool = False) -> dict | None:
        where = "WHERE finished IS NOT NULL AND error IS NULL" if ok_only else "WHERE finished IS NOT NULL"
        row = self.db.execute(
            f"SELECT source, started, finished, summary, error FROM runs {where} ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is None:
            return None
        return {
            "source": row[0],
            "started": row[1],
            "finished": row[2],
            "summary": json.loads(row[3]) if row[3] else None,
            "error": row[4],
        }


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an exception. Nested use joins the outer one."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.outer = False

    def __enter__(self):
        self.outer = not self.db.in_transaction
        if self.outer:
            self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb):
        if self.outer:
            if exc_type is None:
                try:
                    self.db.execute("COMMIT")
                except sqlite3.Error:  # e.g. no room for the commit: nothing half-done stays open
                    if self.db.in_transaction:
                        self.db.execute("ROLLBACK")
                    raise
            elif self.db.in_transaction:  # SQLite may have rolled back itself (a full disk): its error stands
                self.db.execute("ROLLBACK")
        return False
