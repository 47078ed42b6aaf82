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
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .config import QdrantConfig, not_as_root, prepare_state_dir, secret
from .errors import BrokenState, IndexMismatch, StoreLocked, Unavailable, UserError
from .lexical import SparseVector
from .redact import safe_url

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DENSE = "dense"
SPARSE = "bm25"
KEYWORD_FIELDS = ("user_id", "note_id", "notebook_id", "tags")
MANIFEST = "leanote-rag.json"  # next to an edge shard: embedder id, dimension, schema
_ID_NAMESPACE = uuid.UUID("6f9c3f43-6a53-4f7e-9f5c-2f1d2a7f6c11")


def point_id(note_id: str, chunk_index: int) -> str:
    """Deterministic point id of a note's n-th chunk."""
    return str(uuid.uuid5(_ID_NAMESPACE, f"{note_id}:{chunk_index}"))


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
    def payloads(self, ids: list[str]) -> dict[str, dict]: ...
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


class EdgeStore:
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
            raise UserError(f"no index at {self.path} yet: run `leanote-rag index` first")
        else:
            not_as_root(self.path.parent)
        self._lock = ProcessLock(self.path.parent / (self.path.name + ".lock"), f"the index in {self.path}")
        self._lock.acquire()
        try:
            if fresh and self.path.exists():
                shutil.rmtree(self.path)
            self._shard = self._open(dim, create)
        except BaseException:
            self._lock.release()
            raise

    def _open(self, dim: int, create: bool):
        qe = self._qe
        exists = (self.path / "segments").exists()
        try:
            if exists:
                return qe.EdgeShard.load(str(self.path))
            if not create:
                raise UserError(f"no index at {self.path} yet: run `leanote-rag index` first")
            config = qe.EdgeConfig(
                vectors={DENSE: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)},
                sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
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

    def delete(self, ids: list[str]) -> None:
        if ids:
            self._shard.update(self._qe.UpdateOperation.delete_points(list(ids)))

    def delete_note(self, note_id: str) -> None:
        self._shard.update(self._qe.UpdateOperation.delete_points_by_filter(self._filter(note_id=note_id)))

    def set_payload(self, ids: list[str], payload: dict[str, Any]) -> None:
        if ids:
            self._shard.update(self._qe.UpdateOperation.set_payload(list(ids), payload))

    def search(self, dense, sparse, user_id, limit, hnsw_ef=128, note_ids=None):
        qe = self._qe
        flt = self._filter(note_ids, user_id=user_id)
        requests, kinds = [], []
        if dense is not None:
            requests.append(
                qe.QueryRequest(
                    limit=limit,
                    query=qe.Query.Nearest(dense.tolist(), using=DENSE),
                    filter=flt,
                    with_payload=["note_id"],
                    params=qe.SearchParams(hnsw_ef=hnsw_ef),
                )
            )
            kinds.append(DENSE)
        if sparse is not None and len(sparse):
            requests.append(
                qe.QueryRequest(
                    limit=limit,
                    query=qe.Query.Nearest(qe.SparseVector(sparse.indices, sparse.values), using=SPARSE),
                    filter=flt,
                    with_payload=["note_id"],
                )
            )
            kinds.append(SPARSE)
        results = self._shard.query_batch(qe.QueryBatchRequest(requests)) if requests else []
        ranked = {kind: [Ranked(str(p.id), float(p.score), p.payload["note_id"]) for p in res] for kind, res in zip(kinds, results)}
        return ranked.get(DENSE, []), ranked.get(SPARSE, [])

    def payloads(self, ids: list[str]) -> dict[str, dict]:
        if not ids:
            return {}
        return {str(r.id): r.payload for r in self._shard.retrieve(list(ids), True, False)}

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
        self._shard.close()
        self._shard = None
        shutil.rmtree(self.path)
        self._shard = self._open(dim, create=True)

    def close(self) -> None:
        if getattr(self, "_shard", None) is not None:
            self._shard.flush()
            self._shard.close()
            self._shard = None
        self._lock.release()


# --- Qdrant server (qdrant-client) --------------------------------------------------------


class ServerStore:
    """A Qdrant server through qdrant-client (or its local mode, as a test double)."""

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
            raise UserError(f"no collection {self.collection!r} at {self.location}: run `leanote-rag index` first")
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
        requests, kinds = [], []
        if dense is not None:
            requests.append(
                qm.QueryRequest(
                    query=dense.tolist(),
                    using=DENSE,
                    filter=flt,
                    limit=limit,
                    with_payload=["note_id"],
                    params=qm.SearchParams(hnsw_ef=hnsw_ef),
                )
            )
            kinds.append(DENSE)
        if sparse is not None and len(sparse):
            vector = qm.SparseVector(indices=sparse.indices, values=sparse.values)
            requests.append(qm.QueryRequest(query=vector, using=SPARSE, filter=flt, limit=limit, with_payload=["note_id"]))
            kinds.append(SPARSE)
        results = self._call(self._client.query_batch_points, self.collection, requests) if requests else []
        ranked = {
            kind: [Ranked(str(p.id), float(p.score), p.payload["note_id"]) for p in res.points]
            for kind, res in zip(kinds, results)
        }
        return ranked.get(DENSE, []), ranked.get(SPARSE, [])

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

