"""Sync state in SQLite under ``state_dir``: what is in the index, and why.

- ``notes``: one row per indexed note: its content hash, the hash of its metadata,
  the pipeline that prepared it, and the ids of its points in the store.
- ``embeddings``: a cache of dense vectors keyed by (embedder, embedded text) hash,
  so an edited note re-embeds only the chunks whose text changed.
- ``runs``: sync history. ``meta``: which index these rows describe.

A note's row is written only after its points are in the store, so a crash
leaves at worst a note that is processed again; deterministic point ids make
that harmless.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

SCHEMA = """
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
"""


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


class State:
    def __init__(self, state_dir: Path):
        state_dir = Path(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / "state.db"
        self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

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
        """Tie the note rows to one index. Returns True when rows were for another index
        (a rebuild, or an index deleted by hand) and were dropped."""
        if self.get_meta("index_id") == index_id:
            return False
        had_rows = self.db.execute("SELECT 1 FROM notes LIMIT 1").fetchone() is not None
        with self.transaction():
            self.db.execute("DELETE FROM notes")
            self.set_meta("index_id", index_id)
        return had_rows

    # --- notes ----------------------------------------------------------------------------

    def note(self, note_id: str) -> NoteRecord | None:
        row = self.db.execute(
            "SELECT note_id, source, user_id, title, notebook, content_hash, meta_hash, pipeline, "
            "point_ids, chunk_keys, usn FROM notes WHERE note_id = ?",
            (note_id,),
        ).fetchone()
        if row is None:
            return None
        return NoteRecord(*row[:8], json.loads(row[8]), json.loads(row[9]), row[10])

    def note_ids(self, source: str | None = None) -> set[str]:
        if source is None:
            rows = self.db.execute("SELECT note_id FROM notes")
        else:
            rows = self.db.execute("SELECT note_id FROM notes WHERE source = ?", (source,))
        return {r[0] for r in rows}

    def put_note(self, rec: NoteRecord) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO notes(note_id, source, user_id, title, notebook, content_hash, meta_hash, "
            "pipeline, point_ids, chunk_keys, usn, indexed_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
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
                time.time(),
            ),
        )

    def delete_note(self, note_id: str) -> None:
        self.db.execute("DELETE FROM notes WHERE note_id = ?", (note_id,))

    def counts_by_user(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT user_id, COUNT(*) FROM notes GROUP BY user_id"))

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
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb):
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        return False
