"""A Qdrant server through qdrant-client (``qdrant.url``), or qdrant-client's local mode
(``qdrant.local_path``) as a test double. What a point is and how candidates are ordered:
``rag.index.points``."""

from __future__ import annotations

import logging
import re
from typing import Any

import numpy as np

from rag.config import QdrantConfig, secret
from rag.errors import NotIndexed, StoreLocked, Unavailable, UserError
from rag.index.points import DENSE, KEYWORD_FIELDS, SPARSE, PointData, Ranked, _Counts, people, settle
from rag.redact import safe_url

log = logging.getLogger(__name__)


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
        return people({str(h.value): h.count for h in response.hits})

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
