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
  ``rag.model.ENTITY_KINDS``: the no-LLM tier's and the LLM tier's typed entities
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
- ``jobs``: the LLM tier's queue (``sync.memory_jobs``: extractions and written questions)
  and related-notes recomputes.
- ``asked``: the questions each note answers, written by the LLM (``rag.memory.asked``).
- ``corrections``: verdicts on facts and pairs, per user and keyed by content, not by
  note, so they outlive re-extraction; ``correction_log`` keeps every verdict given.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from rag.config import Settings
from rag.state_dir import prepare_state_dir
from rag.memory.entities import norm
from rag.sqlite import LockedDB

from rag.memory.asked import WrittenQuestions
from rag.memory.corrections import Corrections
from rag.memory.jobs import LlmTier
from rag.memory.pairs import RelatedPairs
from rag.memory.reads import Reads
from rag.memory.schema import FILE, MIGRATIONS
from rag.memory.writes import NoteWrites


def path_for(settings: Settings) -> Path:
    return Path(settings.state_dir) / FILE


class MemoryStore(NoteWrites, RelatedPairs, Corrections, LlmTier, WrittenQuestions, Reads, LockedDB):
    """One connection behind a lock: the sync thread writes, the API and bots read.
    ``busy_timeout``: seconds a write waits for another connection's write before it fails
    (``sqlite3.OperationalError``: the sync logs it and its next pass brings the memory in line)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time, busy_timeout: float = 10.0):
        super().__init__(path, MIGRATIONS, "a readable memory store ({err}). Move it aside: a new one is built "
                         "as notes are indexed (`leanote-rag index --reconcile` processes them all)")
        self.db.execute(f"PRAGMA busy_timeout = {max(0, int(busy_timeout * 1000))}")
        self.clock = clock
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

