"""The vector store: Qdrant, two backends behind one small interface (``Store``), chosen by
``qdrant.kind``.

- ``edge`` (default, ``rag.index.store_edge``): Qdrant Edge, the Qdrant engine embedded in this
  process (HNSW, sparse vectors with the IDF modifier, payload indexes, WAL) under
  ``state_dir/qdrant``. One process may open it at a time.
- ``server`` (``rag.index.store_server``): a Qdrant server through qdrant-client
  (``qdrant.url``), for more than one machine or process. ``qdrant.local_path`` runs the same
  code against qdrant-client's local mode, which is a test double, not a store.

BM25's IDF is counted over the asking user's live points, and nobody else's. Every
sparse query names its IDF corpus, the filter of the user's points
(``IdfParams(corpus=Filter(user_id))``; Qdrant 1.19's per-tenant IDF), so:

- one person's notes never move another's scores or order: a word rare in my notes is
  rare for my searches however often someone else writes it, and the scores ``search
  --json`` and the API show say nothing of another person's words;
- the statistics are those of the points that are there, the same for any history that
  left the same points. Qdrant's collection-wide statistics (``Modifier.Idf`` alone) come
  from posting lists that keep a deleted point, and the old copy of a point updated out
  of an optimized segment, until the segment is rebuilt: an index that went through
  deletes, or through a crash and the pass that repeated its work, would rank otherwise
  than one with the same points that did not.

Nothing is kept besides the points: Qdrant counts, at query time, the user's points
(N) and those of them holding each query term (its document frequency), so an index
built before this needs no migration, and a crashed write leaves nothing to repair.
The passage step's restriction to some notes (``note_ids``) narrows which points come
back, not the corpus: their scores are those of the search over all the user's notes.
What a point is and how candidates are ordered: ``rag.index.points``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rag.config import QdrantConfig
from rag.index.lexical import SparseVector
from rag.index.points import PointData, Ranked
from rag.index.store_edge import EdgeStore
from rag.index.store_server import ServerStore


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


def open_store(cfg: QdrantConfig, state_dir: Path, dim: int, *, create: bool = True, fresh: bool = False,
               name: str = "") -> Store:
    """The configured store; ``fresh`` starts the embedded one anew (a server's
    collection is emptied by ``drop`` instead). ``name``: another store beside the index
    (``rag.index.second``): the shard ``qdrant-<name>``, or the collection ``<collection>-<name>``."""
    if cfg.kind == "edge":
        folder = f"qdrant-{name}" if name else "qdrant"
        return EdgeStore(Path(state_dir) / folder, dim, create=create or fresh, fresh=fresh)
    if name:
        cfg = cfg.model_copy(update={"collection": f"{cfg.collection}-{name}"})
    return ServerStore(cfg, dim, create=create)
