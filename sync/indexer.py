"""Apply a source's snapshot to the index, doing work only for what changed.

fetch -> (unchanged? skip) -> (metadata only? set payload) -> clean -> chunk ->
embed the chunks the cache lacks -> upsert -> delete stale points -> record.

The store is written first and the state row after it, so a crash between the
two leaves a note that is simply processed again (deterministic point ids make
that idempotent). Notes the snapshot no longer holds, and trashed or deleted
notes, leave the index.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Union

import numpy as np

from rag.errors import NoteError
from rag.index import MAX_NOTE_CHARS, NoteIndex, PreparedNote, note_meta
from rag.model import Note

from .sources import Skipped
from .state import NoteRecord, State

log = logging.getLogger(__name__)

PIPELINE_VERSION = 1  # bump when cleaning/chunking/term code changes what an index holds
BATCH_CHUNKS = 256


@dataclass
class Summary:
    added: int = 0
    updated: int = 0
    moved: int = 0  # metadata only (notebook, tags, time): no re-embedding
    deleted: int = 0
    unchanged: int = 0
    not_indexed: int = 0  # trashed or deleted at the source, never indexed
    empty: int = 0
    skipped: list[dict] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # indexed, but only their first MAX_NOTE_CHARS
    chunks_embedded: int = 0
    chunks_cached: int = 0
    chunks_written: int = 0
    optimize_seconds: float = 0.0
    seconds: float = 0.0

    def line(self) -> str:
        parts = [
            f"{self.added} added",
            f"{self.updated} updated",
            f"{self.deleted} deleted",
            f"{self.unchanged} unchanged",
        ]
        if self.moved:
            parts.append(f"{self.moved} moved/retagged")
        if self.empty:
            parts.append(f"{self.empty} empty")
        if self.skipped:
            parts.append(f"{len(self.skipped)} skipped")
        if self.truncated:
            parts.append(f"{len(self.truncated)} truncated")
        return (
            f"notes: {', '.join(parts)}; chunks: {self.chunks_embedded} embedded, "
            f"{self.chunks_cached} from cache; {self.seconds:.2f} s"
        )

    def as_json(self) -> dict:
        return asdict(self)


def pipeline_id(index: NoteIndex) -> str:
    """Everything besides the note itself that decides what a note's points hold."""
    s = index.settings
    key = json.dumps(
        [PIPELINE_VERSION, index.embedder.model_id, s.chunking.model_dump(), s.bm25.model_dump()], sort_keys=True
    )
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def meta_hash(note: Note, base_url: str) -> str:
    return hashlib.sha256(json.dumps(note_meta(note, base_url), sort_keys=True).encode()).hexdigest()[:16]


Progress = Callable[[int, int], None]  # (notes seen, chunks embedded so far)


class Indexer:
    def __init__(self, index: NoteIndex, state: State, source_name: str):
        self.index = index
        self.state = state
        self.source_name = source_name
        self.pipeline = pipeline_id(index)
        self.base_url = index.settings.leanote.base_url
        self.summary = Summary()
        self._batch: list[tuple[PreparedNote, NoteRecord | None]] = []
        self._batch_chunks = 0
        self.progress: Progress = lambda seen, embedded: None

    def run(self, items: Iterable[Union[Note, Skipped]], *, remove_missing: bool = True) -> Summary:
        """Index a full snapshot. With remove_missing, notes it lacks leave the index."""
        started = time.monotonic()
        if self.state.bind_index(self.index.index_id):
            log.info("state did not match this index; every note will be indexed anew")
        seen: set[str] = set()
        for n, item in enumerate(items, start=1):
            if isinstance(item, Skipped):
                self._skip(item.origin, item.reason)
            elif item.id in seen:
                self._skip(item.origin or item.id, f"duplicate note id {item.id}")
            else:
                seen.add(item.id)
                self._apply(item)
            self.progress(n, self.summary.chunks_embedded)
        self._flush()
        if remove_missing:
            for note_id in sorted(self.state.note_ids() - seen):
                self._remove(note_id)
        if self.summary.chunks_written >= self.index.settings.qdrant.optimize_after:
            t = time.monotonic()
            self.index.store.optimize()
            self.summary.optimize_seconds = round(time.monotonic() - t, 3)
        self.state.prune_cache()
        self.summary.seconds = round(time.monotonic() - started, 3)
        return self.summary

    # --- one note -------------------------------------------------------------------------

    def _skip(self, origin: str, reason: str) -> None:
        log.warning("skipped %s: %s", origin, reason)
        self.summary.skipped.append({"note": origin, "reason": reason})

    def _remove(self, note_id: str) -> None:
        rec = self.state.note(note_id)
        if rec is None:
            return
        self.index.delete(rec.point_ids)
        self.state.delete_note(note_id)
        self.summary.deleted += 1

    def _apply(self, note: Note) -> None:
        rec = self.state.note(note.id)
        if not note.searchable:
            if rec is not None:
                self._remove(note.id)
            else:
                self.summary.not_indexed += 1
            return
        content_hash = note.content_hash()
        if rec is not None and rec.content_hash == content_hash and rec.pipeline == self.pipeline:
            mhash = meta_hash(note, self.base_url)
            if rec.meta_hash == mhash:
                self.summary.unchanged += 1
                return
            self.index.update_meta(note, rec.point_ids)
            rec.meta_hash, rec.notebook, rec.usn = mhash, note.notebook_path, note.usn
            rec.user_id = note.user_id
            self.state.put_note(rec)
            self.summary.moved += 1
            return
        try:
            prepared = self.index.prepare(note)
        except NoteError as err:
            self._skip(note.origin or note.id, str(err))
            return
        except Exception as err:  # one bad note never stops the run
            log.debug("preparing %s failed", note.id, exc_info=True)
            self._skip(note.origin or note.id, f"{type(err).__name__}: {err}")
            return
        if prepared.truncated:
            log.warning("%s is over %d characters: only its beginning is indexed", note.origin or note.id, MAX_NOTE_CHARS)
            self.summary.truncated.append(note.origin or note.id)
        self._batch.append((prepared, rec))
        self._batch_chunks += len(prepared.chunks)
        if self._batch_chunks >= BATCH_CHUNKS:
            self._flush()

    # --- a batch of notes -----------------------------------------------------------------

    def _flush(self) -> None:
        if not self._batch:
            return
        batch, self._batch, self._batch_chunks = self._batch, [], 0
        keys = [pc.text_hash for prepared, _ in batch for pc in prepared.chunks]
        vectors = self.state.cached_vectors(keys)
        self.summary.chunks_cached += sum(1 for k in keys if k in vectors)
        todo: dict[str, str] = {}
        for prepared, _ in batch:
            for pc in prepared.chunks:
                if pc.text_hash not in vectors:
                    todo.setdefault(pc.text_hash, pc.embed_text)
        if todo:
            fresh = self.index.embed(list(todo.values()))
            new = dict(zip(todo.keys(), fresh))
            with self.state.transaction():
                self.state.cache_vectors(new)
            vectors.update(new)
            self.summary.chunks_embedded += len(todo)
        for prepared, rec in batch:
            note = prepared.note
            rows = [vectors[pc.text_hash] for pc in prepared.chunks]
            matrix = np.stack(rows) if rows else np.zeros((0, self.index.embedder.dim), dtype=np.float32)
            self.index.write(prepared, matrix, stale_ids=rec.point_ids if rec else [])
            self.summary.chunks_written += len(prepared.chunks)
            if not prepared.chunks:
                self.summary.empty += 1
            elif rec is None:
                self.summary.added += 1
            else:
                self.summary.updated += 1
        with self.state.transaction():
            for prepared, _ in batch:
                note = prepared.note
                self.state.put_note(
                    NoteRecord(
                        note_id=note.id,
                        source=self.source_name,
                        user_id=note.user_id,
                        title=note.title,
                        notebook=note.notebook_path,
                        content_hash=prepared.content_hash,
                        meta_hash=meta_hash(note, self.base_url),
                        pipeline=self.pipeline,
                        point_ids=[pc.point_id for pc in prepared.chunks],
                        chunk_keys=[pc.text_hash for pc in prepared.chunks],
                        usn=note.usn,
                    )
                )
