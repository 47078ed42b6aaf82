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

With a ``Derived`` (``sync.derived``), each commit also hands the notes of its transaction
to it, right after it, to bring the memory in line (entities of a note with new text,
tags and notebook of a moved one, everything of one that left the index); notes indexed
at a text the memory lacks are read again (``known()`` asks snapshot sources to read them,
``sync.incremental`` reads them by id). What fails there never fails the sync
(``sync.derived`` says how it is repaired).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import numpy as np

from rag.config import ExcludeConfig, Settings
from rag.errors import NoteError, UserError
from rag.index.note_index import MAX_NOTE_CHARS, NoteIndex, PreparedNote, note_meta
from rag.model import Note, rule_key

from sync.derived import Derived
from sync.sources import Checkpoint, Known, SnapshotItem, Skipped, Unchanged
from sync.state import INDEXED, AccountRecord, NoteRecord, State

log = logging.getLogger(__name__)

PIPELINE_VERSION = 1  # bump when cleaning/chunking/term code changes what an index holds
BATCH_CHUNKS = 256
# A snapshot pass (``Indexer.run``) makes every note searchable first and derives from them
# (the memory's entities and facts) at its end; past this many chunks of prepared notes held
# for that, it derives at the next commit instead (a first index of a large source).
DEFER_CHUNKS = 20_000
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
    embed_seconds: float = 0.0  # of them in the embedder
    searchable_seconds: float = 0.0  # from the start until every note was in the index, before the memory's part
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
        searchable = (f" (searchable after {self.searchable_seconds:.2f} s)"
                      if 0 < self.searchable_seconds < self.seconds - 1 else "")
        return (
            f"notes: {', '.join(parts)}; chunks: {self.chunks_embedded} embedded, "
            f"{self.chunks_cached} from cache; {self.seconds:.2f} s{searchable}"
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
    def __init__(self, index: NoteIndex, state: State, source_name: str, account: str = "",
                 should_stop: Callable[[], bool] = lambda: False, derived: Derived | None = None,
                 settings: Settings | None = None):
        """``derived``: what follows each commit (None: the index alone); ``settings``: the
        running settings (the index's by default)."""
        self.index = index
        self.derived = derived if derived is not None and derived.memory is not None else None
        self.state = state
        self.source_name = source_name
        self.account = account
        self.pipeline = pipeline_id(index)
        settings = settings or index.settings
        self.base_url = settings.leanote.base_url
        self.private_books, self.private_tags = privacy_rules(settings.exclude)
        self.should_stop = should_stop
        self.summary = Summary()
        self._batch: list[tuple[PreparedNote, NoteRecord | None]] = []
        self._batch_chunks = 0
        self._pending: dict[str, NoteRecord | None] = {}  # note id -> row to write, or None to delete
        self._remember: dict[str, PreparedNote] = {}  # derived: notes to process after the commit
        self._retagged: dict[str, Note] = {}  # derived: notes whose metadata alone changed
        # committed, not yet followed by the derived stores (a snapshot pass: ``run``)
        self._later: tuple[dict[str, NoteRecord | None], dict[str, PreparedNote], dict[str, Note]] = ({}, {}, {})
        self._later_chunks = 0
        self._defer = False
        self._uncommitted = 0  # chunks written to the store since the last commit of their rows
        self._started = time.monotonic()
        self._skips: list[tuple[str, str, str]] = []  # (note id, origin, reason) to record
        self._skips_seen: list[tuple[str, str, str]] = []  # every skip of this run
        self._rows: dict[str, tuple[str, str, str]] | None = None  # snapshot: this source's rows before the run
        self.progress: Progress = lambda seen, embedded: None
        if self.state.bind_index(self.index.index_id):
            log.info("the state described another index; every note will be indexed anew")

    def _follow(self) -> None:
        """The derived stores follow what was committed and not yet followed."""
        pending, remember, retagged = self._later
        if self.derived is None or not (pending or remember or retagged):
            return
        self._later, self._later_chunks = ({}, {}, {}), 0
        self.derived.follow(pending, remember, retagged, should_stop=self._stop_asked)

    # --- a snapshot -----------------------------------------------------------------------

    def known(self) -> Known:
        """What earlier passes recorded for this source, for it to skip what did not change:
        the fingerprints of notes this pipeline prepared, and the last complete pass's
        checkpoint while the rows are still the ones it left."""
        rows = self._snapshot_rows()
        fingerprints = {note_id: fp for note_id, (fp, _, pipeline) in rows.items() if fp and pipeline == self.pipeline}
        if self.derived is not None:  # notes indexed at a text the memory lacks are read again
            indexed = self.state.indexed_notes()
            behind = self.derived.behind({n: indexed[n].content_hash for n in rows if n in indexed})
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
        """Index a full snapshot. With remove_missing, notes it lacks leave the index. Every
        note is made searchable first; what derives from the notes follows at the end of the
        pass (``_follow``), also when it stops or fails: what it leaves, the next pass repairs
        (``Derived.behind``, ``Derived.align``)."""
        started = self._started = time.monotonic()
        self._defer = self.derived is not None
        try:
            self._run(items, remove_missing)
        finally:
            self._defer = False
            self._follow()
        self.summary.seconds = round(time.monotonic() - started, 3)
        return self.summary

    def _run(self, items: Iterable[SnapshotItem], remove_missing: bool) -> None:
        seen: set[str] = set()
        checkpoint: str | None = None
        keep_skips = False  # a snapshot not read again still has the notes it could not read
        read = 0  # notes, as the source counts them (``len``): a checkpoint is none, an unchanged file its notes
        for item in items:
            self.check_stop()
            if isinstance(item, Unchanged):
                keep_skips |= item.note_ids is None
                read += self._unchanged(item, seen)
            elif isinstance(item, Checkpoint):
                checkpoint = item.mark
                continue
            elif isinstance(item, Skipped):
                read += 1
                self.skip(item.origin, item.reason, item.note_id)
                if item.note_id:
                    seen.add(item.note_id)  # unreadable now is not gone: its last good version stays
            elif item.id in seen:
                read += 1
                self.skip(item.origin or item.id, f"duplicate note id {item.id}")
            else:
                read += 1
                seen.add(item.id)
                self.apply(item)
            if self._uncommitted >= BATCH_CHUNKS:  # what was written so far stays, whatever comes next
                self.commit()
            self.progress(read, self.summary.chunks_embedded)
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

    def _unchanged(self, item: Unchanged, seen: set[str]) -> int:
        """Notes the source did not read again: seen, and as the last pass left them; how many."""
        rows = self._snapshot_rows()
        count = 0
        for note_id in rows if item.note_ids is None else item.note_ids:
            if note_id in seen:
                continue
            seen.add(note_id)
            count += 1
            row = rows.get(note_id)
            if row is None:
                continue
            if row[1] == INDEXED:
                self.summary.unchanged += 1
            else:
                self.summary.not_indexed += 1
        return count

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
        self.summary.searchable_seconds = round(time.monotonic() - self._started, 3)

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
                if self.derived is not None and rec.meta_hash != row.meta_hash:
                    self._retagged[note.id] = note
            if self.derived is not None and self.derived.lacks(note.id, content_hash):
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
            t = time.monotonic()
            new = dict(zip(keys_todo[i : i + step], self.index.embed(texts[i : i + step])))
            self.summary.embed_seconds = round(self.summary.embed_seconds + time.monotonic() - t, 3)
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
            self._uncommitted += len(prepared.chunks)
            if not prepared.chunks:
                self.summary.empty += 1
            elif rec is None or rec.status != INDEXED:
                self.summary.added += 1
            else:
                self.summary.updated += 1
            if self.derived is not None:
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
        self._uncommitted = 0
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
        if self.derived is not None:
            later_pending, later_remember, later_retagged = self._later
            later_pending.update(pending)
            later_remember.update(remember)
            later_retagged.update(retagged)
            self._later_chunks += sum(len(p.chunks) for p in remember.values())
            if not self._defer or self._later_chunks >= DEFER_CHUNKS:
                self._follow()
        for note_id, origin, reason in skips:
            if (note_id, origin, reason) in news:
                log.warning("skipped %s: %s", origin, reason)
            else:
                log.debug("skipped %s again: %s", origin, reason)
