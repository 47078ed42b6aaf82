"""Qdrant Edge: the Qdrant engine embedded in this process, one shard under
``state_dir/qdrant``, held by one process at a time (``ProcessLock``). What a point is and how
candidates are ordered: ``rag.index.points``."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from rag.state_dir import not_as_root, prepare_state_dir
from rag.errors import BrokenState, IndexMismatch, NotIndexed, StoreLocked, Unavailable, UserError
from rag.index.points import (DENSE, KEYWORD_FIELDS, MANIFEST, SPARSE, PointData, _Counts, _point_key, people,
                              settle)

log = logging.getLogger(__name__)

# Qdrant Edge searches a query's segments on this many threads of its own. One: handing a small
# query's work to a pool costs more than it saves, and two callers' searches still run side by side
# (docs/performance.md, "The store's part of a search").
SEARCH_THREADS = 1


PAYLOADS_KEPT = 4096  # points whose payloads the embedded store keeps in memory (~3 KB each)


class _Payloads:
    """The payloads a store read last, up to ``size`` points, the least recently used dropped
    first: a search's passage step reads some fifty, and a person's next question often lands on
    the same notes. Only for a store no other process writes (the
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
        its chunks 0..n-1, so no point is read. Otherwise a fresh process's first searches would ask
        the store for each new candidate's note, which costs most on a large index. A point it
        misses (a note whose chunks are not 0..n-1) is looked up as before."""
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
        candidate from the payloads costs as much as the query itself on a large index."""
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
        return people({str(h.value): h.count for h in response.hits if h.count > 0})

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
