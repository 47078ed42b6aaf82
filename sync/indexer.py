"""Apply notes to the index, doing work only for what changed.

For each note: (unchanged? skip) -> (trashed, deleted or private? take it out) ->
(metadata only? set payload) -> clean -> chunk -> embed the chunks the cache lacks
-> upsert -> delete stale points. State rows are buffered and written by
``commit()`` in one transaction, after the store writes, together with the
cursor that covers them (incremental sources). A crash before the commit leaves
notes that are processed again; deterministic point ids make that idempotent.

``run()`` applies a whole snapshot (files, mongodump): notes it lacks leave. What
the source did not read again (``Unchanged``: same file fingerprint, same backup)
counts as seen and unchanged; ``known()`` tells the source what earlier passes
recorded, and a ``Checkpoint`` is kept once the whole snapshot is through.
``sync.incremental`` drives ``apply``/``commit`` page by page for live sources.

With a ``MemoryStore`` (``rag.memory.store``), each commit also brings the memory in line for
exactly the notes of its transaction, right after it: a note (re)indexed with new text
gets its entities extracted anew, a note moved or retagged gets its tags and notebook
updated, a note that left the index (gone, trashed, deleted, made private) loses
everything derived from it. A failure there never fails the sync: it is logged every
time, naming the notes left out, and once the memory cannot be written (locked by another
process, a full disk) the rest of the run leaves it alone instead of waiting on every
note. The next pass repairs both ways: a note the memory holds and the index does not
is removed by ``sync.service`` (before and after every pass); a note indexed at a text
the memory lacks is processed again (``memory_behind``: ``known()`` asks snapshot
sources to read such notes again, ``sync.incremental`` reads them by id).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import numpy as np

from rag.config import ExcludeConfig
from rag.errors import LeanoteRagError, NoteError, UserError
from rag.index.note_index import MAX_NOTE_CHARS, NoteIndex, PreparedNote, note_meta
from rag.memory.store import MemoryStore
from rag.model import Note, rule_key

from sync.memory_jobs import wanted as llm_wanted
from sync.sources import Checkpoint, Known, SnapshotItem, Skipped, Unchanged
from sync.state import INDEXED, AccountRecord, NoteRecord, State

log = logging.getLogger(__name__)

_FAILED = object()  # what a failed memory step returns
PIPELINE_VERSION = 1  # bump when cleaning/chunking/term code changes what an index holds
BATCH_CHUNKS = 256
OPTIMIZE_PENDING = "optimize_pending"  # meta: a stop came before the search index was optimized


@dataclass
class Summary:
    added: int = 0
    updated: int = 0
    moved: int = 0  # metadata only (notebook, tags, time): no re-embedding
    deleted: int = 0  # left the index: gone, trashed, deleted or made private
    unchanged: int = 0
    not_indexed: int = 0  # trashed, deleted or private, and not in the index before either
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

    def add(self, other: "Summary") -> None:
        for name, value in asdict(other).items():
            if isinstance(value, list):
                getattr(self, name).extend(value)
            else:
                setattr(self, name, getattr(self, name) + value)

    @property
    def changed(self) -> int:
        return self.added + self.updated + self.moved + self.deleted


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


class Stopped(Exception):
    """The sync was asked to stop (SIGTERM). Raised between notes, pages, embedding
    batches and accounts; what was committed stays, the rest is done on the next run."""


def privacy_rules(exclude: ExcludeConfig) -> tuple[frozenset[str], frozenset[str]]:
    """The rules in the form ``Note.excluded_by`` compares: notebook ids as written, notebook
    titles and tags without regard to case."""
    books = frozenset(n.strip() for n in exclude.notebooks) | frozenset(rule_key(n) for n in exclude.notebooks)
    return books, frozenset(rule_key(t) for t in exclude.tags)


class Indexer:
    _memory_down: str | None = None  # why the memory cannot be written in this run

    def __init__(self, index: NoteIndex, state: State, source_name: str, account: str = "",
                 should_stop: Callable[[], bool] = lambda: False, memory: MemoryStore | None = None):
        self.index = index
        self.memory = memory
        self.state = state
        self.source_name = source_name
        self.account = account
        self.pipeline = pipeline_id(index)
        settings = index.settings
        self.base_url = settings.leanote.base_url
        self.private_books, self.private_tags = privacy_rules(settings.exclude)
        self.should_stop = should_stop
        self.summary = Summary()
        self._batch: list[tuple[PreparedNote, NoteRecord | None]] = []
        self._batch_chunks = 0
        self._pending: dict[str, NoteRecord | None] = {}  # note id -> row to write, or None to delete
        self._remember: dict[str, PreparedNote] = {}  # memory: notes to extract after the commit
        self._retagged: dict[str, Note] = {}  # memory: notes whose metadata alone changed
        self.memory_seconds = 0.0
        self._memory_errors: set[str] = set()  # kinds of error whose traceback was logged
        self._skips: list[tuple[str, str, str]] = []  # (note id, origin, reason) to record
        self._skips_seen: list[tuple[str, str, str]] = []  # every skip of this run
        self._rows: dict[str, tuple[str, str, str]] | None = None  # snapshot: this source's rows before the run
        self.progress: Progress = lambda seen, embedded: None
        if self.state.bind_index(self.index.index_id):
            log.info("the state described another index; every note will be indexed anew")

    # --- a snapshot -----------------------------------------------------------------------

    def known(self) -> Known:
        """What earlier passes recorded for this source, for it to skip what did not change:
        the fingerprints of notes this pipeline prepared, and the last complete pass's
        checkpoint while the rows are still the ones it left."""
        rows = self._snapshot_rows()
        fingerprints = {note_id: fp for note_id, (fp, _, pipeline) in rows.items() if fp and pipeline == self.pipeline}
        if self.memory is not None:  # notes indexed at a text the memory lacks are read again
            indexed = self.state.indexed_notes()
            behind = self.memory_behind({n: indexed[n].content_hash for n in rows if n in indexed})
            if behind:
                fingerprints = {n: fp for n, fp in fingerprints.items() if n not in behind}
        checkpoint = None
        saved = self.state.get_meta(self._checkpoint_key())
        if saved:
            try:
                saved = json.loads(saved)
                if saved["context"] == self._context() and saved["notes"] == len(rows):
                    checkpoint = saved["mark"]
            except (ValueError, KeyError, TypeError):
                checkpoint = None
        return Known(fingerprints, checkpoint)

    def _snapshot_rows(self) -> dict[str, tuple[str, str, str]]:
        if self._rows is None:
            self._rows = self.state.snapshot_rows(self.source_name)
        return self._rows

    def _checkpoint_key(self) -> str:
        return f"checkpoint:{self.source_name}"

    def _context(self) -> str:
        """Besides the source's own mark, what decides the rows a snapshot leaves."""
        return f"{self.pipeline}|{self.base_url}"

    def run(self, items: Iterable[SnapshotItem], *, remove_missing: bool = True) -> Summary:
        """Index a full snapshot. With remove_missing, notes it lacks leave the index."""
        started = time.monotonic()
        seen: set[str] = set()
        checkpoint: str | None = None
        keep_skips = False  # a snapshot not read again still has the notes it could not read
        for n, item in enumerate(items, start=1):
            self.check_stop()
            if isinstance(item, Unchanged):
                keep_skips |= item.note_ids is None
                self._unchanged(item, seen)
            elif isinstance(item, Checkpoint):
                checkpoint = item.mark
            elif isinstance(item, Skipped):
                self.skip(item.origin, item.reason, item.note_id)
                if item.note_id:
                    seen.add(item.note_id)  # unreadable now is not gone: its last good version stays
            elif item.id in seen:
                self.skip(item.origin or item.id, f"duplicate note id {item.id}")
            else:
                seen.add(item.id)
                self.apply(item)
            if self._batch_chunks >= BATCH_CHUNKS:
                self.commit()
            self.progress(n, self.summary.chunks_embedded)
        if remove_missing:
            missing = self.state.note_ids() - seen
            if not seen and not self._skips_seen and missing:
                ours = len(self.state.note_ids(self.source_name))
                if ours:  # an unmounted share or a folder emptied by mistake must not empty the index
                    raise UserError(
                        f"{self.source_name} holds no notes now, but {ours} of its notes are indexed: nothing "
                        f"was deleted. If every note is really gone, run `leanote-rag index --rebuild`"
                    )
            for note_id in sorted(missing):
                self.remove(note_id)
        self.commit()
        # a complete snapshot: a note skipped before and not now was read, or is gone
        if not keep_skips:
            keys = {note_id or origin for note_id, origin, _ in self._skips_seen}
            stale = [r["note_id"] for r in self.state.skipped(self.source_name) if r["note_id"] not in keys]
            with self.state.transaction():
                self.state.unskip(self.source_name, stale)
        if checkpoint is not None:
            self._rows = None
            mark = {"mark": checkpoint, "context": self._context(), "notes": len(self._snapshot_rows())}
            with self.state.transaction():
                self.state.set_meta(self._checkpoint_key(), json.dumps(mark, ensure_ascii=False))
        self.finish()
        self.summary.seconds = round(time.monotonic() - started, 3)
        return self.summary

    def _unchanged(self, item: Unchanged, seen: set[str]) -> None:
        """Notes the source did not read again: seen, and as the last pass left them."""
        rows = self._snapshot_rows()
        for note_id in rows if item.note_ids is None else item.note_ids:
            if note_id in seen:
                continue
            seen.add(note_id)
            row = rows.get(note_id)
            if row is None:
                continue
            if row[1] == INDEXED:
                self.summary.unchanged += 1
            else:
                self.summary.not_indexed += 1

    def finish(self) -> None:
        """After a run: build the HNSW index if much was written (left to the next pass when
        a stop was asked for: it may take long), drop unused cached vectors."""
        if self.summary.chunks_written >= self.index.settings.qdrant.optimize_after:
            if self._stop_asked():
                with self.state.transaction():
                    self.state.set_meta(OPTIMIZE_PENDING, "1")
                log.info("stopping: the search index is optimized on the next pass")
            else:
                t = time.monotonic()
                self.index.store.optimize()
                self.summary.optimize_seconds = round(time.monotonic() - t, 3)
        self.state.prune_cache()

    def _stop_asked(self) -> bool:
        try:
            return bool(self.should_stop())
        except Exception:  # a full disk: stop writing as well
            return True

    # --- one note -------------------------------------------------------------------------

    def check_stop(self) -> None:
        if self.should_stop():
            raise Stopped()

    def skip(self, origin: str, reason: str, note_id: str = "") -> None:
        """A note that cannot be indexed: counted, recorded (``status`` lists it) and logged
        once per reason; its last good version, if any, stays in the index."""
        self.summary.skipped.append({"note": origin, "reason": reason})
        self._skips.append((note_id, origin, reason))
        self._skips_seen.append((note_id, origin, reason))

    def record(self, note_id: str) -> NoteRecord | None:
        """The note's row as this run leaves it (pending writes first)."""
        if note_id in self._pending:
            return self._pending[note_id]
        return self.state.note(note_id)

    def status_of(self, note: Note) -> str:
        if note.is_deleted:
            return "deleted"
        if note.is_trash:
            return "trash"
        if note.excluded_by(self.private_books, self.private_tags):
            return "excluded"
        return INDEXED

    def remove(self, note_id: str) -> None:
        """The note is gone from the source: out of the index, row dropped."""
        rec = self.record(note_id)
        if rec is None:
            return
        if rec.status == INDEXED:
            self.index.delete(rec.point_ids)
            self.summary.deleted += 1
        self._pending[note_id] = None

    def _row(self, note: Note, status: str, content_hash: str = "", point_ids=(), chunk_keys=()) -> NoteRecord:
        return NoteRecord(
            note_id=note.id,
            source=self.source_name,
            user_id=note.user_id,
            title=note.title,
            notebook=note.notebook_path,
            content_hash=content_hash,
            meta_hash=meta_hash(note, self.base_url),
            pipeline=self.pipeline,
            point_ids=list(point_ids),
            chunk_keys=list(chunk_keys),
            usn=note.usn,
            account=self.account,
            status=status,
            notebook_id=note.notebook_id,
            tags=list(note.tags),
            fingerprint=note.fingerprint,
        )

    def apply(self, note: Note) -> None:
        """Bring one note (with its body) into the index, or take it out."""
        self.check_stop()
        rec = self.record(note.id)
        status = self.status_of(note)
        if status != INDEXED:
            if rec is not None and rec.status == INDEXED:
                self.index.delete(rec.point_ids)
                self.summary.deleted += 1
            else:
                self.summary.not_indexed += 1
            # a trashed or private note keeps its cached vectors: restoring it embeds nothing
            keep = rec.chunk_keys if rec is not None and status != "deleted" else []
            self._pending[note.id] = self._row(note, status, chunk_keys=keep)
            return
        content_hash = note.content_hash()
        if rec is not None and rec.status == INDEXED and rec.content_hash == content_hash and rec.pipeline == self.pipeline:
            row = self._row(note, INDEXED, content_hash, rec.point_ids, rec.chunk_keys)
            if rec.meta_hash == row.meta_hash:
                self.summary.unchanged += 1
            else:
                self.index.update_meta(note, rec.point_ids)
                self.summary.moved += 1
            if row != rec:
                self._pending[note.id] = row
                if self.memory is not None and rec.meta_hash != row.meta_hash:
                    self._retagged[note.id] = note
            if self.memory is not None and self._memory_call(self.memory.known, note.id, default=content_hash) != content_hash:
                self._prepare_for_memory(note)  # indexed before the memory was: its entities only
            return
        try:
            prepared = self.index.prepare(note)
        except NoteError as err:
            self.skip(note.origin or note.id, str(err), note.id)
            return
        except Exception as err:  # one bad note never stops the run
            log.debug("preparing %s failed", note.id, exc_info=True)
            self.skip(note.origin or note.id, f"{type(err).__name__}: {err}", note.id)
            return
        if prepared.truncated:
            log.warning("%s is over %d characters: only its beginning is indexed", note.origin or note.id, MAX_NOTE_CHARS)
            self.summary.truncated.append(note.origin or note.id)
        self._batch.append((prepared, rec))
        self._batch_chunks += len(prepared.chunks)
        if self._batch_chunks >= BATCH_CHUNKS:
            self._flush()

    def _prepare_for_memory(self, note: Note) -> None:
        try:
            self._remember[note.id] = self.index.prepare(note)
        except Exception:  # it is indexed as it is; the memory tries again on the next pass
            log.debug("preparing %s for the memory failed", note.id, exc_info=True)

    # --- writing --------------------------------------------------------------------------

    def _flush(self) -> None:
        """Embed what the cache lacks and write the batch's points to the store."""
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
        keys_todo, texts = list(todo), list(todo.values())
        step = max(1, self.index.embedder.batch_size)
        for i in range(0, len(texts), step):  # a stop request is heard between batches
            self.check_stop()
            new = dict(zip(keys_todo[i : i + step], self.index.embed(texts[i : i + step])))
            with self.state.transaction():
                self.state.cache_vectors(new)  # kept even if the run stops before the batch is written
            vectors.update(new)
            self.summary.chunks_embedded += len(new)
        for prepared, rec in batch:
            rows = [vectors[pc.text_hash] for pc in prepared.chunks]
            matrix = np.stack(rows) if rows else np.zeros((0, self.index.embedder.dim), dtype=np.float32)
            stale = rec.point_ids if rec is not None and rec.status == INDEXED else []
            self.index.write(prepared, matrix, stale_ids=stale)
            self.summary.chunks_written += len(prepared.chunks)
            if not prepared.chunks:
                self.summary.empty += 1
            elif rec is None or rec.status != INDEXED:
                self.summary.added += 1
            else:
                self.summary.updated += 1
            if self.memory is not None:
                self._remember[prepared.note.id] = prepared
            self._pending[prepared.note.id] = self._row(
                prepared.note,
                INDEXED,
                prepared.content_hash,
                [pc.point_id for pc in prepared.chunks],
                [pc.text_hash for pc in prepared.chunks],
            )

    def commit(self, account: AccountRecord | None = None) -> None:
        """Write everything applied so far: points first, then the rows (and the
        account's cursors) in one transaction."""
        self._flush()
        if not self._pending and not self._skips and account is None and not self._remember:
            return
        pending, self._pending = self._pending, {}
        remember, self._remember = self._remember, {}
        retagged, self._retagged = self._retagged, {}
        skips, self._skips = self._skips, []
        with self.state.transaction():
            for note_id, rec in pending.items():
                if rec is None:
                    self.state.delete_note(note_id)
                else:
                    self.state.put_note(rec)
            self.state.unskip(self.source_name, pending)  # read (or gone) at last
            news = [s for s in skips if self.state.skip(self.source_name, self.account, *s)]
            if account is not None:
                self.state.put_account(account)
        if self.memory is not None:
            self._update_memory(pending, remember, retagged)
        for note_id, origin, reason in skips:
            if (note_id, origin, reason) in news:
                log.warning("skipped %s: %s", origin, reason)
            else:
                log.debug("skipped %s again: %s", origin, reason)

    # --- the memory -----------------------------------------------------------------------

    def memory_behind(self, indexed: dict[str, str]) -> set[str] | None:
        """Among notes indexed at a content hash (note id -> hash), those the memory lacks
        or holds at another text (or extraction version): to be processed again. None when
        the memory cannot be read now."""
        hashes = self._memory_call(self.memory.hashes, default=None)
        if hashes is None:
            return None
        return {n for n, h in indexed.items() if hashes.get(n) != h}

    def _update_memory(self, pending: dict[str, NoteRecord | None], remember: dict[str, PreparedNote],
                       retagged: dict[str, Note]) -> None:
        """The memory follows the notes of the transaction just committed."""
        started = time.monotonic()
        llm_jobs = llm_wanted(self.index.settings)
        steps: list[tuple[str, str, Callable[[], object]]] = []  # (note id or "", what, the call)
        # related notes (rag.memory.related): queue the changed notes and those whose pairs point at a
        # changed or removed one, before the memory drops those pairs; recomputed after the pass
        removed = [n for n, rec in pending.items() if rec is None or rec.status != INDEXED]
        changed = {n: p.note.user_id for n, p in remember.items()}
        steps.append(("", "queueing related notes", lambda: self.memory.related_mark(changed, removed)))
        for note_id, rec in pending.items():
            if rec is None or rec.status != INDEXED:
                steps.append((note_id, "removing", lambda n=note_id: self.memory.remove_note(n)))
            elif note_id in retagged and note_id not in remember:  # (the next pass: ``sync.service``)
                steps.append((note_id, "updating",
                              lambda n=note_id: self.memory.remember_meta(retagged[n], self.base_url)))
        for note_id, prepared in remember.items():
            if self._stop_asked():  # the rest on the next pass: it catches up what the memory missed
                break
            rec = pending.get(note_id, self.state.note(note_id) if note_id not in pending else None)
            if rec is not None and rec.status == INDEXED and rec.content_hash == prepared.content_hash:
                # with the LLM tier on, its job is queued with the entities (sync.memory_jobs)
                steps.append((note_id, "processing", lambda p=prepared: self.memory.remember(
                    p, self.base_url, queue_llm=llm_jobs)))
        if pending or remember:  # facts whose newest statement went: the one before is active again
            steps.append(("", "settling facts", self.memory.settle_facts))
        self._memory_steps(steps)
        self.memory_seconds += time.monotonic() - started

    def _memory_steps(self, steps: list[tuple[str, str, Callable[[], object]]]) -> None:
        """Run the steps; each failure is logged with its note. Once the memory cannot be
        written (``sqlite3.OperationalError``: locked by another process, a full disk) the
        rest of this run leaves it alone, and says which notes wait for the next pass."""
        for i, (note_id, what, call) in enumerate(steps):
            if self._memory_down is None:
                if self._memory_call(call, what=what, note=note_id, default=_FAILED) is not _FAILED:
                    continue
                if self._memory_down is None:
                    continue  # this note's own problem: the others go on
                left = steps[i + 1:]
            else:
                left = steps[i:]
            notes = list(dict.fromkeys(n for n, _, _ in left if n))
            if notes:
                shown = ", ".join(notes[:10]) + (f" and {len(notes) - 10} more" if len(notes) > 10 else "")
                log.warning("memory: not brought in line with %d more note(s) (%s): %s; the next pass does it",
                            len(notes), shown, self._memory_down)
            return

    def _memory_call(self, fn, *args, default=None, what: str = "", note: str = ""):
        """A call into the memory that must not fail the sync: every failure is logged (with
        the note it was for; the traceback of an unexpected kind of error once per run) and
        ``default`` returned. A ``sqlite3.OperationalError`` marks the memory as not
        writable for the rest of the run (``_memory_steps``)."""
        try:
            return fn(*args)
        except Exception as err:
            key = f"{type(err).__name__}: {err}"
            expected = isinstance(err, (OSError, LeanoteRagError, sqlite3.OperationalError))
            trace = not expected and key not in self._memory_errors
            self._memory_errors.add(key)
            if isinstance(err, sqlite3.OperationalError):
                self._memory_down = f"{err} ({self.memory.path})"
            log.warning("memory: %s%s failed: %s; the next pass tries again", what or getattr(fn, "__name__", fn),
                        f" note {note}" if note else "", key, exc_info=trace)
            return default
