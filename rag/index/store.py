"""The vector store: Qdrant, two backends behind one small interface.

- ``edge`` (default): Qdrant Edge, the Qdrant engine embedded in this process
  (HNSW, sparse vectors with the IDF modifier, payload indexes, WAL) under
  ``state_dir/qdrant``. One process may open it at a time.
- ``server``: a Qdrant server through qdrant-client (``qdrant.url``), for more than
  one machine or process. ``qdrant.local_path`` runs the same code against
  qdrant-client's local mode, which is a test double, not a store.

One collection, named vectors ``dense`` (cosine) and ``bm25`` (sparse, IDF), one
point per chunk with a deterministic id, so re-indexing a note overwrites it.
A manifest (embedder id, dimension, schema) is kept with the index.

BM25's IDF is counted over the asking user's live points, and nobody else's. Every
sparse query names its IDF corpus, the filter of the user's points
(``IdfParams(corpus=Filter(user_id))``; Qdrant 1.19's per-tenant IDF), so:

- one person's notes never move another's scores or order: a word rare in my notes is
  rare for my searches however often someone else writes it, and the scores ``search
  --json`` and the API show say nothing of another person's words;
- the statistics are those of the points that are there, the same for any history that
  left the same points. Qdrant's collection-wide statistics (``Modifier.Idf`` alone) come
  from posting lists that keep a deleted point, and the old copy of a point updated out
  of an optimized segment, until the segment is rebuilt (an in-memory segment on the next
  load, an optimized one only when a vacuum runs at 20 % deleted): an index that went
  through deletes, or through a crash and the pass that repeated its work, would rank
  otherwise than one with the same points that did not.

Nothing is kept besides the points: Qdrant counts, at query time, the user's points
(N) and those of them holding each query term (its document frequency), so an index
built before this needs no migration, and a crashed write leaves nothing to repair.
The passage step's restriction to some notes (``note_ids``) narrows which points come
back, not the corpus: their scores are those of the search over all the user's notes.

Candidates come back in an order that depends on the points alone (``settle``). Qdrant
orders equal scores by where the points sit in its segments, and float32 sums taken in
another segment layout differ in their last bit or two; so scores are kept to
``SCORE_DIGITS`` significant digits and equal ones ordered by point id, and when the
cut at ``limit`` falls inside a group of equal scores, more are fetched until the group
is whole.

Long: two backends (Qdrant Edge and a Qdrant server) behind one interface, each with the same
queries written in its own client's terms, and the lock an embedded index needs.

Dense search is exact for a user with at most ``EXACT_DENSE_UP_TO`` chunks (a scan of a
few milliseconds at 512 dimensions), HNSW above. HNSW's answers depend on how its graph
was built, so two indexes holding the same points, one optimized after an undisturbed sync
and one whose sync was cut short and resumed (which writes less in its last run and is
optimized later or not at all), would rank apart: with the tests' fake embedder at 512
dimensions, 24 of the 70 dev questions' dense top-10 lists from HNSW differ from exact ones.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from rag.config import QdrantConfig, not_as_root, prepare_state_dir, secret
from rag.errors import BrokenState, IndexMismatch, NotIndexed, StoreLocked, Unavailable, UserError
from rag.index.lexical import SparseVector
from rag.redact import safe_url

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DENSE = "dense"
SPARSE = "bm25"
KEYWORD_FIELDS = ("user_id", "note_id", "notebook_id", "tags")
MANIFEST = "leanote-rag.json"  # next to an edge shard: embedder id, dimension, schema
_ID_NAMESPACE = uuid.UUID("6f9c3f43-6a53-4f7e-9f5c-2f1d2a7f6c11")


def point_id(note_id: str, chunk_index: int) -> str:
    """Deterministic point id of a note's n-th chunk."""
    return _point_key(note_id, chunk_index)[1]


def _point_key(note_id: str, chunk_index: int) -> tuple[int, str]:
    """``point_id``'s UUID, ``uuid5(_ID_NAMESPACE, "{note_id}:{chunk_index}")``, as (its int, its
    text), made in a quarter of ``uuid5``'s time (what it does: SHA-1 of the namespace and the
    name, version and variant bits set)."""
    digest = bytearray(hashlib.sha1(_ID_NAMESPACE.bytes + f"{note_id}:{chunk_index}".encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return int(h, 16), f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass
class PointData:
    id: str
    dense: np.ndarray
    sparse: SparseVector
    payload: dict[str, Any]


@dataclass
class Ranked:
    """One candidate from one retriever: its id, score and note."""

    id: str
    score: float
    note_id: str


SCORE_DIGITS = 5  # float32 noise between segment layouts is ~2e-7 of a score
MAX_FETCH = 4096  # candidates one query may grow to while a group of equal scores goes on


EXACT_DENSE_UP_TO = 20_000  # a user's chunks the dense side searches exactly; HNSW above
# Qdrant Edge searches a query's segments on this many threads of its own. One: handing the work
# to a pool cost more than it saved (the corpus's dense + BM25 batch 0.65 against 0.91 ms), and two
# callers' searches still run side by side as fast as with two (docs/performance.md).
SEARCH_THREADS = 1


PAYLOADS_KEPT = 4096  # points whose payloads the embedded store keeps in memory (~3 KB each)


class _Payloads:
    """The payloads a store read last, up to ``size`` points, the least recently used dropped
    first: a search's passage step reads ~50 (~1 ms through the binding), and a person's next
    question often lands on the same notes. Only for a store no other process writes (the
    embedded one holds its lock): each write here empties it, after the write, and what a read
    that began before a write brings back is not kept. The rows are shared: callers read them."""

    def __init__(self, size: int):
        self._rows: OrderedDict[str, dict] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        self._writes = 0

    def get(self, ids: list[str]) -> tuple[dict[str, dict], list[str], int]:
        """(the rows kept of ``ids``, the ids not kept, the count of writes to pass to ``keep``)."""
        found: dict[str, dict] = {}
        missing: list[str] = []
        with self._lock:
            rows = self._rows
            for pid in ids:
                row = rows.get(pid)
                if row is None:
                    missing.append(pid)
                else:
                    rows.move_to_end(pid)
                    found[pid] = row
            return found, missing, self._writes

    def keep(self, rows: dict[str, dict], writes: int) -> None:
        with self._lock:
            if writes != self._writes:  # a write came in between: these may be older than it
                return
            self._rows.update(rows)
            while len(self._rows) > self._size:
                self._rows.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._writes += 1
            self._rows.clear()


class _Counts:
    """Chunks per user, for whether a user's dense search is exact (module docstring):
    counted again after this process changed the store, or (``_shared``: other processes
    write too) for every search."""

    _counts: dict[str, int] | None = None
    _writes = 0
    _shared = False

    def _changed(self) -> None:
        self._writes += 1
        self._counts = None

    def _exact_dense(self, user_id: str) -> bool:
        counts, writes = self._counts, self._writes
        if counts is None:
            counts = self.count_by_user()
            if writes == self._writes and not self._shared:  # no write since: keep it
                self._counts = counts
        return counts.get(user_id, 0) <= EXACT_DENSE_UP_TO


def rounded(score: float) -> float:
    """A score as rankings compare it (module docstring)."""
    return float(f"{score:.{SCORE_DIGITS}g}")


def settle(run: Callable[[dict[str, int]], dict[str, list[tuple[str, str, float]]]], kinds: list[str],
           limit: int) -> dict[str, list[Ranked]]:
    """The best ``limit`` candidates of each kind of query, scores rounded, equal scores by
    id, whole groups of equal scores at the cut. ``run({kind: n})`` asks the store for the
    best ``n`` of each kind, as ``(point id, note id, score)`` tuples."""
    out: dict[str, list[Ranked]] = {}
    fetch = dict.fromkeys(kinds, limit + 1)
    while fetch:
        more: dict[str, int] = {}
        for kind, found in run(fetch).items():
            # (-score, id, note id) tuples sort as the candidates should, with no key to call
            found = sorted([(-rounded(score), pid, note) for pid, note, score in found])
            n = fetch[kind]
            if len(found) == n > limit and found[-1][0] == found[limit - 1][0] and n < MAX_FETCH:
                more[kind] = min(2 * n, MAX_FETCH)  # the group at the cut goes on past what came back
            else:
                out[kind] = [Ranked(pid, -score, note) for score, pid, note in found[:limit]]
        fetch = more
    return out


class Store(Protocol):
    location: str

    def manifest(self) -> dict | None: ...
    def write_manifest(self, manifest: dict) -> None: ...
    def upsert(self, points: list[PointData]) -> None: ...
    def delete(self, ids: list[str]) -> None: ...
    def delete_note(self, note_id: str) -> None: ...
    def set_payload(self, ids: list[str], payload: dict[str, Any]) -> None: ...
    def search(
        self,
        dense: np.ndarray | None,
        sparse: SparseVector | None,
        user_id: str,
        limit: int,
        hnsw_ef: int = 128,
        note_ids: list[str] | None = None,
    ) -> tuple[list[Ranked], list[Ranked]]:
        """Dense and sparse candidates among the user's chunks (with ``note_ids``: only
        those notes' chunks), best first, ``limit`` each."""
        ...
    def nearest(self, vectors: list[np.ndarray], user_id: str, limit: int,
                note_ids: list[str] | None = None) -> list[list[Ranked]]:
        """Each vector's dense candidates as ``search`` gives them, asked in one batch."""
        ...
    def payloads(self, ids: list[str]) -> dict[str, dict]:
        """The payloads of those of ``ids`` that exist, by id (rows to read, not to change)."""
        ...
    def count_by_user(self) -> dict[str, int]: ...
    def note_ids(self, user_id: str | None = None) -> set[str]: ...
    def holding(self, user_id: str, note_ids: list[str]) -> set[str]: ...
    def optimize(self) -> None: ...
    def drop(self, dim: int) -> None:
        """Delete every point and the manifest: an empty index of this dimension."""
        ...
    def close(self) -> None: ...


class ProcessLock:
    """An advisory lock (flock) on a file, holding the owner's pid for messages."""

    def __init__(self, path: Path, what: str):
        self.path = path
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StoreLocked(
                f"{self.what} is open in another process (pid {owner}), e.g. `leanote-rag serve`. "
                f"Stop it, or run the command inside it, or set qdrant.url to a Qdrant server so "
                f"several processes can share the index"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


# --- Qdrant Edge ------------------------------------------------------------------------


class EdgeStore(_Counts):
    """Qdrant Edge: the Qdrant engine in-process, one shard under a folder. With ``fresh``
    (``index --rebuild``) whatever is in the folder is deleted first, readable or not."""

    def __init__(self, path: Path, dim: int, *, create: bool = True, fresh: bool = False):
        import qdrant_edge as qe

        self._qe = qe
        self.path = Path(path)
        self.location = str(self.path)
        if create or fresh:
            prepare_state_dir(self.path.parent)
        elif not self.path.exists():
            raise NotIndexed(f"no index at {self.path} yet: run `leanote-rag index` first")
        else:
            not_as_root(self.path.parent)
        self._known: dict[int, tuple[str, str]] = {}  # a point id's int -> (point id, note id) (``_settled``)
        self._kept = _Payloads(PAYLOADS_KEPT)
        self._reading = threading.Lock()  # held by ``_learn_ids`` while it reads the shard: ``close`` waits
        self._lock = ProcessLock(self.path.parent / (self.path.name + ".lock"), f"the index in {self.path}")
        self._lock.acquire()
        try:
            if fresh and self.path.exists():
                shutil.rmtree(self.path)
            existed = (self.path / "segments").exists()
            self._shard = self._open(dim, create)
        except BaseException:
            self._lock.release()
            raise
        if existed:
            threading.Thread(target=self._learn_ids, name="leanote-rag-point-ids", daemon=True).start()

    def _learn_ids(self) -> None:
        """Fill ``_known`` with every point's note, in the background of an opened index: its
        notes and their chunk counts come from one facet, and a note's points are ``point_id``s of
        its chunks 0..n-1, so no point is read. Otherwise a fresh process's first searches ask the
        store for each new candidate's note (18 ms a search over the corpus ×18, ~2 ms over the
        corpus); this takes ~15 ms for the corpus, 0.5 s for the ×18 replica. A point it misses
        (a note whose chunks are not 0..n-1) is looked up as before."""
        with self._reading:
            shard = self._shard
            if shard is None:
                return
            try:
                response = shard.facet(self._qe.FacetRequest(key="note_id", limit=10_000_000, exact=True))
            except Exception as err:  # the binding raises plain Exception
                log.debug("point ids not learnt ahead (%s): looked up as searches need them", err)
                return
        known = self._known
        for hit in response.hits:
            note = str(hit.value)
            for i in range(hit.count):
                key, point = _point_key(note, i)
                known.setdefault(key, (point, note))

    def _open(self, dim: int, create: bool):
        qe = self._qe
        exists = (self.path / "segments").exists()
        sparse = {SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)}
        try:
            if exists:  # the dense vectors as they are: a new dimension is the manifest's to report
                return qe.EdgeShard.load(str(self.path), qe.EdgeConfig(sparse_vectors=sparse,
                                                                      max_search_threads=SEARCH_THREADS))
            if not create:
                raise NotIndexed(f"no index at {self.path} yet: run `leanote-rag index` first")
            config = qe.EdgeConfig(
                vectors={DENSE: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)},
                sparse_vectors=sparse,
                max_search_threads=SEARCH_THREADS,
            )
            shard = qe.EdgeShard.create(str(self.path), config)
            for name in KEYWORD_FIELDS:
                params = qe.KeywordIndexParams(is_tenant=True) if name == "user_id" else qe.PayloadSchemaType.Keyword
                shard.update(qe.UpdateOperation.create_field_index(name, params))
            return shard
        except UserError:
            raise
        except Exception as err:  # the binding raises plain Exception
            if "WouldBlock" in str(err):
                raise StoreLocked(f"the index in {self.path} is open in another process") from None
            if exists:
                raise BrokenState(
                    f"the index in {self.path} cannot be read ({err}). Run `leanote-rag index --rebuild` "
                    f"(it deletes the index and builds it again from the source)"
                ) from None
            raise Unavailable(f"cannot create the index in {self.path}: {err}") from None

    # manifest lives next to the shard
    @property
    def _manifest_path(self) -> Path:
        return self.path / MANIFEST

    def manifest(self) -> dict | None:
        try:
            return json.loads(self._manifest_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise IndexMismatch(
                f"{self._manifest_path} is unreadable ({err}): run `leanote-rag index --rebuild`"
            ) from None

    def write_manifest(self, manifest: dict) -> None:
        tmp = self._manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, self._manifest_path)

    def _filter(self, note_ids: list[str] | None = None, **match: str):
        qe = self._qe
        must = [qe.FieldCondition(key=k, match=qe.MatchValue(v)) for k, v in match.items()]
        if note_ids is not None:
            must.append(qe.FieldCondition(key="note_id", match=qe.MatchAny(list(note_ids))))
        return qe.Filter(must=must)

    def upsert(self, points: list[PointData]) -> None:
        qe = self._qe
        if not points:
            return
        self._shard.update(
            qe.UpdateOperation.upsert_points(
                [
                    qe.Point(
                        p.id,
                        {DENSE: p.dense.tolist(), SPARSE: qe.SparseVector(p.sparse.indices, p.sparse.values)},
                        p.payload,
                    )
                    for p in points
                ]
            )
        )
        for p in points:
            if "note_id" in p.payload:
                self._know(p.id, p.payload["note_id"])
        self._changed()  # after the write: a count taken meanwhile is not kept

    def _changed(self) -> None:
        super()._changed()
        self._kept.clear()

    def delete(self, ids: list[str]) -> None:
        if ids:
            self._shard.update(self._qe.UpdateOperation.delete_points(list(ids)))
            self._changed()

    def delete_note(self, note_id: str) -> None:
        self._shard.update(self._qe.UpdateOperation.delete_points_by_filter(self._filter(note_id=note_id)))
        self._changed()

    def set_payload(self, ids: list[str], payload: dict[str, Any]) -> None:
        if ids:
            self._shard.update(self._qe.UpdateOperation.set_payload(list(ids), payload))
            self._kept.clear()

    def search(self, dense, sparse, user_id, limit, hnsw_ef=128, note_ids=None):
        qe = self._qe
        flt = self._filter(note_ids, user_id=user_id)
        queries = {}
        if dense is not None:
            queries[DENSE] = (qe.Query.Nearest(dense.tolist(), using=DENSE),
                              qe.SearchParams(hnsw_ef=hnsw_ef, exact=self._exact_dense(user_id)))
        if sparse is not None and len(sparse):
            # BM25's IDF over this user's points (module docstring)
            queries[SPARSE] = (qe.Query.Nearest(qe.SparseVector(sparse.indices, sparse.values), using=SPARSE),
                               qe.SearchParams(idf=qe.IdfParams(corpus=self._filter(user_id=user_id))))

        ranked = self._settled(queries, flt, limit)
        return ranked.get(DENSE, []), ranked.get(SPARSE, [])

    def nearest(self, vectors, user_id, limit, note_ids=None, hnsw_ef=128):
        qe = self._qe
        params = qe.SearchParams(hnsw_ef=hnsw_ef, exact=self._exact_dense(user_id))
        queries = {i: (qe.Query.Nearest(np.asarray(v, dtype=np.float32).tolist(), using=DENSE), params)
                   for i, v in enumerate(vectors)}
        ranked = self._settled(queries, self._filter(note_ids, user_id=user_id), limit)
        return [ranked[i] for i in range(len(vectors))]

    def _settled(self, queries: dict, flt, limit: int) -> dict:
        """``settle`` over the store's queries (key -> (query, params)), asked in one batch.
        A candidate's note comes from ``_known`` (point id -> note id), read from the points
        only for ids it lacks: a point's id is made of its note's id and its chunk's place
        (``point_id``), so once known the pair never changes, and reading the note id of each
        candidate from the payloads took as long as the query itself (corpus ×18, HNSW)."""
        qe = self._qe

        def run(fetch: dict) -> dict[str, list[tuple[str, str, float]]]:
            requests = [qe.QueryRequest(limit=n, query=queries[key][0], filter=flt, with_payload=False,
                                        params=queries[key][1]) for key, n in fetch.items()]
            # The binding returns ids as uuid.UUID: looked up by their int, not made into text
            # again (``str`` of a UUID took a tenth of a search's Python).
            results = [[(p.id, p.score) for p in res]
                       for res in self._shard.query_batch(qe.QueryBatchRequest(requests))]
            known = self._known
            missing = list({str(u) for res in results for u, _ in res if u.int not in known})
            if missing:
                for r in self._shard.retrieve(missing, ["note_id"], False):
                    self._know(str(r.id), r.payload["note_id"], r.id.int)
            # (a point deleted between the two calls by another thread is left out)
            return {key: [(*known[u.int], score) for u, score in res if u.int in known]
                    for key, res in zip(fetch, results)}

        return settle(run, list(queries), limit) if queries else {}

    def _know(self, point: str, note_id: str, key: int | None = None) -> None:
        """Remember a point's note (``_settled``); ``key``: the point id's int, when known."""
        self._known[uuid.UUID(point).int if key is None else key] = (point, note_id)

    def payloads(self, ids: list[str]) -> dict[str, dict]:
        if not ids:
            return {}
        found, missing, writes = self._kept.get(ids)
        if missing:
            read = {}
            for r in self._shard.retrieve(missing, True, False):
                pid, payload = str(r.id), r.payload
                read[pid] = payload
                if "note_id" in payload:
                    self._know(pid, payload["note_id"], r.id.int)
            self._kept.keep(read, writes)
            found.update(read)
        return found

    def count_by_user(self) -> dict[str, int]:
        qe = self._qe
        response = self._shard.facet(qe.FacetRequest(key="user_id", limit=100_000, exact=True))
        # An exact facet can list a value whose points were all deleted, with count 0.
        return {str(h.value): h.count for h in response.hits if h.count > 0}

    def note_ids(self, user_id: str | None = None) -> set[str]:
        qe = self._qe
        flt = self._filter(user_id=user_id) if user_id else None
        response = self._shard.facet(qe.FacetRequest(key="note_id", limit=10_000_000, exact=True, filter=flt))
        return {str(h.value) for h in response.hits if h.count > 0}

    def holding(self, user_id: str, note_ids: list[str]) -> set[str]:
        """Those of ``note_ids`` the user has points of (a few ids: one facet over their points)."""
        ids = sorted(set(note_ids))
        if not ids:
            return set()
        qe = self._qe
        response = self._shard.facet(qe.FacetRequest(key="note_id", limit=len(ids), exact=True,
                                                     filter=self._filter(ids, user_id=user_id)))
        return {str(h.value) for h in response.hits if h.count > 0}

    def optimize(self) -> None:
        self._shard.optimize()

    def drop(self, dim: int) -> None:
        with self._reading:
            self._shard.close()
            self._shard = None
            shutil.rmtree(self.path)
            self._shard = self._open(dim, create=True)
        self._known.clear()
        self._changed()

    def close(self) -> None:
        with self._reading:
            if getattr(self, "_shard", None) is not None:
                self._shard.flush()
                self._shard.close()
                self._shard = None
        self._lock.release()


# --- Qdrant server (qdrant-client) --------------------------------------------------------


class ServerStore(_Counts):
    """A Qdrant server through qdrant-client (or its local mode, as a test double)."""

    _shared = True

    def __init__(self, cfg: QdrantConfig, dim: int, *, create: bool = True):
        from qdrant_client import QdrantClient
        from qdrant_client import models as qm

        self._qm = qm
        self.collection = cfg.collection
        try:
            if cfg.local_path is not None:
                self.location = f"{cfg.local_path} (qdrant-client local mode)"
                self._client = QdrantClient(path=str(cfg.local_path))
            else:
                self.location = f"{safe_url(cfg.url)} collection {cfg.collection}"
                api_key = secret(cfg.api_key_env, "qdrant.api_key_env") if cfg.api_key_env else None
                self._client = QdrantClient(url=cfg.url, api_key=api_key, timeout=30)
        except RuntimeError as err:
            if "already accessed" in str(err):
                raise StoreLocked(f"the index in {cfg.local_path} is open in another process") from None
            raise
        self._call(self._ensure_collection, dim, create)
        self._idf_corpus = self._call(self._takes_idf_corpus)

    def _takes_idf_corpus(self) -> bool:
        """Whether the server counts BM25's IDF over a corpus the query names (module docstring):
        Qdrant servers do from 1.19 on; an older one counts every point, and gets a warning."""
        version = str(self._client.info().version or "")
        found = re.match(r"v?(\d+)\.(\d+)", version)
        if found is None or (int(found[1]), int(found[2])) < (1, 19):
            log.warning(
                "the Qdrant server at %s (version %s) counts every user's notes in BM25's IDF, and deleted "
                "points until it rebuilds their segment: one person's notes change another's sparse scores "
                "and order, and rankings drift after notes are deleted or changed. Qdrant 1.19 or later "
                "counts only the asking user's notes that are there: upgrade the server",
                self.location, version or "unknown")
            return False
        return True

    def _idf_params(self, user_id: str):
        """The search params of a sparse query: BM25's IDF over this user's points."""
        if not self._idf_corpus:
            return None
        return self._qm.SearchParams(idf=self._qm.IdfCorpusParams(corpus=self._filter(user_id=user_id)))

    def _call(self, fn, *args, **kwargs):
        """Run a client call, turning transport failures into Unavailable."""
        try:
            return fn(*args, **kwargs)
        except (UserError, Unavailable):
            raise
        except Exception as err:
            name = type(err).__name__
            if name in ("ResponseHandlingException", "UnexpectedResponse", "ConnectError", "ConnectTimeout") or isinstance(err, OSError):
                raise Unavailable(safe_url(f"Qdrant at {self.location} failed: {err}")) from None
            raise

    def _ensure_collection(self, dim: int, create: bool) -> None:
        qm = self._qm
        if self._client.collection_exists(self.collection):
            return
        if not create:
            raise NotIndexed(f"no collection {self.collection!r} at {self.location}: run `leanote-rag index` first")
        self._client.create_collection(
            self.collection,
            vectors_config={DENSE: qm.VectorParams(size=dim, distance=qm.Distance.COSINE)},
            sparse_vectors_config={SPARSE: qm.SparseVectorParams(modifier=qm.Modifier.IDF)},
        )
        for name in KEYWORD_FIELDS:
            schema = qm.KeywordIndexParams(type="keyword", is_tenant=(name == "user_id"))
            self._client.create_payload_index(self.collection, name, schema)

    def manifest(self) -> dict | None:
        info = self._call(self._client.get_collection, self.collection)
        meta = info.config.metadata or {}
        return dict(meta) if "embedder" in meta else None

    def write_manifest(self, manifest: dict) -> None:
        self._call(self._client.update_collection, self.collection, metadata=manifest)

    def _filter(self, note_ids: list[str] | None = None, **match: str):
        qm = self._qm
        must = [qm.FieldCondition(key=k, match=qm.MatchValue(value=v)) for k, v in match.items()]
        if note_ids is not None:
            must.append(qm.FieldCondition(key="note_id", match=qm.MatchAny(any=list(note_ids))))
        return qm.Filter(must=must)

    def upsert(self, points: list[PointData]) -> None:
        qm = self._qm
        if not points:
            return
        structs = [
            qm.PointStruct(
                id=p.id,
                vector={DENSE: p.dense.tolist(), SPARSE: qm.SparseVector(indices=p.sparse.indices, values=p.sparse.values)},
                payload=p.payload,
            )
            for p in points
        ]
        self._call(self._client.upsert, self.collection, structs, wait=True)

    def delete(self, ids: list[str]) -> None:
        if ids:
            self._call(self._client.delete, self.collection, points_selector=self._qm.PointIdsList(points=list(ids)))

    def delete_note(self, note_id: str) -> None:
        selector = self._qm.FilterSelector(filter=self._filter(note_id=note_id))
        self._call(self._client.delete, self.collection, points_selector=selector)

    def set_payload(self, ids: list[str], payload: dict[str, Any]) -> None:
        if ids:
            self._call(self._client.set_payload, self.collection, payload=payload, points=list(ids))

    def search(self, dense, sparse, user_id, limit, hnsw_ef=128, note_ids=None):
        qm = self._qm
        flt = self._filter(note_ids, user_id=user_id)
        queries = {}
        if dense is not None:
            queries[DENSE] = (dense.tolist(), qm.SearchParams(hnsw_ef=hnsw_ef, exact=self._exact_dense(user_id)))
        if sparse is not None and len(sparse):
            queries[SPARSE] = (qm.SparseVector(indices=sparse.indices, values=sparse.values), self._idf_params(user_id))

        ranked = self._settled({kind: (*query, kind) for kind, query in queries.items()}, flt, limit)
        return ranked.get(DENSE, []), ranked.get(SPARSE, [])

    def nearest(self, vectors, user_id, limit, note_ids=None, hnsw_ef=128):
        params = self._qm.SearchParams(hnsw_ef=hnsw_ef, exact=self._exact_dense(user_id))
        queries = {i: (np.asarray(v, dtype=np.float32).tolist(), params, DENSE) for i, v in enumerate(vectors)}
        ranked = self._settled(queries, self._filter(note_ids, user_id=user_id), limit)
        return [ranked[i] for i in range(len(vectors))]

    def _settled(self, queries: dict, flt, limit: int) -> dict:
        """``settle`` over the queries (key -> (query, params, vector name)), asked in one batch."""
        qm = self._qm

        def run(fetch: dict) -> dict[str, list[Ranked]]:
            requests = [qm.QueryRequest(query=queries[key][0], using=queries[key][2], filter=flt, limit=n,
                                        with_payload=["note_id"], params=queries[key][1]) for key, n in fetch.items()]
            results = self._call(self._client.query_batch_points, self.collection, requests)
            return {key: [(str(p.id), p.payload["note_id"], float(p.score)) for p in res.points]
                    for key, res in zip(fetch, results)}

        return settle(run, list(queries), limit) if queries else {}

    def payloads(self, ids: list[str]) -> dict[str, dict]:
        if not ids:
            return {}
        records = self._call(self._client.retrieve, self.collection, ids=list(ids), with_payload=True)
        return {str(r.id): r.payload for r in records}

    def count_by_user(self) -> dict[str, int]:
        response = self._call(self._client.facet, self.collection, "user_id", limit=100_000, exact=True)
        return {str(h.value): h.count for h in response.hits}

    def note_ids(self, user_id: str | None = None) -> set[str]:
        flt = self._filter(user_id=user_id) if user_id else None
        response = self._call(
            self._client.facet, self.collection, "note_id", facet_filter=flt, limit=10_000_000, exact=True
        )
        return {str(h.value) for h in response.hits}

    def holding(self, user_id: str, note_ids: list[str]) -> set[str]:
        ids = sorted(set(note_ids))
        if not ids:
            return set()
        response = self._call(self._client.facet, self.collection, "note_id", facet_filter=self._filter(ids, user_id=user_id),
                              limit=len(ids), exact=True)
        return {str(h.value) for h in response.hits if h.count > 0}

    def optimize(self) -> None:
        """The server optimizes on its own."""

    def drop(self, dim: int) -> None:
        self._call(self._client.delete_collection, self.collection)
        self._call(self._ensure_collection, dim, True)

    def close(self) -> None:
        self._client.close()


def open_store(cfg: QdrantConfig, state_dir: Path, dim: int, *, create: bool = True, fresh: bool = False) -> Store:
    """The configured store; ``fresh`` starts the embedded one anew (a server's
    collection is emptied by ``drop`` instead)."""
    if cfg.kind == "edge":
        return EdgeStore(Path(state_dir) / "qdrant", dim, create=create or fresh, fresh=fresh)
    return ServerStore(cfg, dim, create=create)

