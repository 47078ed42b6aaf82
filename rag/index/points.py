"""What a point of the index is, and how candidates are ordered, whatever the backend.

One collection, named vectors ``dense`` (cosine) and ``bm25`` (sparse, IDF), one point per
chunk with a deterministic id (``point_id``), so re-indexing a note overwrites it. A manifest
(embedder id, dimension, schema) is kept with the index.

Candidates come back in an order that depends on the points alone (``settle``). Qdrant
orders equal scores by where the points sit in its segments, and float32 sums taken in
another segment layout differ in their last bit or two; so scores are kept to
``SCORE_DIGITS`` significant digits and equal ones ordered by point id, and when the
cut at ``limit`` falls inside a group of equal scores, more are fetched until the group
is whole.

Dense search is exact for a user with at most ``EXACT_DENSE_UP_TO`` chunks (a scan of a few
milliseconds at 512 dimensions), HNSW above: HNSW's answers depend on how its graph was built,
so two indexes holding the same points, one optimized after an undisturbed sync and one whose
sync was cut short and resumed, would rank apart.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rag.index.lexical import SparseVector

SCHEMA_VERSION = 1
DENSE = "dense"
SPARSE = "bm25"
KEYWORD_FIELDS = ("user_id", "note_id", "notebook_id", "tags")
MANIFEST = "leanote-rag.json"  # next to an edge shard: embedder id, dimension, schema
_ID_NAMESPACE = uuid.UUID("6f9c3f43-6a53-4f7e-9f5c-2f1d2a7f6c11")


# A person's written questions (rag.index.asked) are points of a tenant of their own: their
# ``user_id`` is the person's with this suffix. No search of chunks sees them, BM25's IDF over
# the person's chunks is unchanged, and their own search counts IDF over the questions alone.
ASKED = "#asked"
MAX_ASKED = 24  # written questions per note at most (8 sections x 3): their point ids are the note's q0..q23


def asked_user(user_id: str) -> str:
    """The tenant of a person's written questions."""
    return f"{user_id}{ASKED}"


def asked_point_id(note_id: str, n: int) -> str:
    """Deterministic point id of a note's n-th written question."""
    return _point_key(note_id, f"q{n}")[1]


def asked_point_ids(note_id: str) -> list[str]:
    """Every point id a note's written questions may have (to delete them without a lookup)."""
    return [asked_point_id(note_id, n) for n in range(MAX_ASKED)]


def people(counts: dict[str, int]) -> dict[str, int]:
    """``count_by_user`` without the written questions' tenants."""
    return {u: c for u, c in counts.items() if not u.endswith(ASKED)}


def point_id(note_id: str, chunk_index: int) -> str:
    """Deterministic point id of a note's n-th chunk."""
    return _point_key(note_id, chunk_index)[1]


def _point_key(note_id: str, chunk_index: int | str) -> tuple[int, str]:
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
