"""The second dense index: a stronger embedder's vectors of the same chunks (``second_index``,
EmbeddingGemma by default), filled in the background while the first index answers.

**Where it lives.** A store of its own beside the first (``open_store(..., name="second")``: the
embedded shard ``<state_dir>/qdrant-second``, or the collection ``<collection>-second`` of a Qdrant
server), its points the first index's point ids with a dense vector and four payload fields
(``user_id``, ``note_id``, ``content_hash``, ``text_hash``). Not a named vector of the first
index's points: a vector added to a collection's points after it was made means rewriting every
point; every write of the first index (a note edited) would have to carry the slow embedder's
vector or lose it; and turning the second off, or changing its output size, would touch the index
that answers. Apart, the first index writes at its own pace, a note edited is searchable at
once, and the second follows; a second index made with another embedder is dropped and filled
again, the first untouched.

**Filling** (``plan``, then ``fill``): ``plan`` compares it with the first index, note by note:
a chunk whose text (its ``text_hash``) has no vector here is to embed; a point here whose note
or chunk went is deleted; a chunk whose text is the same under a note's new content hash only
gets the new hash (nothing embedded again). ``fill(n)`` embeds the next ``n`` chunks (one note's
at a time, in the order ``plan`` found them) and writes them: the worker that calls it
(``sync.second_jobs``) runs it between questions, so a kill loses at most one batch, and the next
``plan`` takes up where it stopped.

**Search** (``ranking``, fused in ``rag.index.retrieve`` as ``dense2`` at
``retrieval.second_weight``): the question embedded by the second model, its candidates among the
notes this index *covers* (each of their chunks has its current vector; a hit whose content hash
is not the first index's is dropped: the note changed since). For the notes it does not cover
yet, the ranking holds the first embedder's candidates, their scores put on this ranking's scale
(as many standard deviations from its mean as they are from theirs): those notes rank as they
would without the second index, and none is pushed down for not being covered yet.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field

from rag.config import Settings
from rag.errors import UserError
from rag.index import embed as embed_mod
from rag.index.lexical import SparseVector, search_text
from rag.index.points import ASKED, PointData, Ranked, point_id
from rag.index.store import Store, open_store

log = logging.getLogger(__name__)

SECOND = "second"
READ_BLOCK = 64  # a note's chunk payloads read at a time
EMPTY = SparseVector([], [])


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


@dataclass
class Todo:
    """One chunk of the first index to embed here."""

    point_id: str
    note_id: str
    user_id: str
    content_hash: str
    chunk_index: int
    text: str  # what the model sees (``search_text`` of the chunk: the first index's own)
    hash: str


@dataclass
class Plan:
    todo: list[Todo] = field(default_factory=list)
    covered: dict[str, set[str]] = field(default_factory=dict)  # user -> notes whose chunks all have their vector
    notes: dict[str, int] = field(default_factory=dict)  # user -> the first index's notes
    chunks: int = 0  # the first index's chunks
    current: int = 0  # of them, those with their current vector here
    deleted: int = 0
    seconds: float = 0.0


def note_chunks(store: Store, note_id: str) -> list[dict]:
    """A note's chunk payloads from a store, in order (its points are chunks 0..n-1)."""
    out: list[dict] = []
    start = 0
    while True:
        ids = [point_id(note_id, i) for i in range(start, start + READ_BLOCK)]
        found = store.payloads(ids)
        out += [found[i] for i in ids if i in found]
        if len(found) < READ_BLOCK:
            return out
        start += READ_BLOCK


class SecondIndex:
    """The second dense index (module docstring): ``store`` its own, ``embedder`` the stronger model."""

    def __init__(self, settings: Settings, store: Store, embedder):
        self.settings = settings
        self.store = store
        self.embedder = embedder
        self._lock = threading.Lock()  # plan and fill, one at a time (the worker's)
        self._cover = threading.Lock()  # the covered notes, read by searches while a fill adds to them
        self.plan_made: Plan | None = None
        self.rate: float | None = None  # chunks embedded per second here (running mean)
        self.filled = 0  # chunks embedded by this process

    @classmethod
    def open(cls, settings: Settings, embedder=None) -> "SecondIndex":
        """Open (make) the second index for ``settings.second_index``; one made with another
        embedder or output size is emptied to be filled again (the first index is untouched)."""
        cfg, first = settings.second_index.embedder, settings.embedder
        if embedder is None and (cfg.kind, cfg.model) == (first.kind, first.model):
            raise UserError(f"second_index.embedder is the index's own ({cfg.kind}): a second index of it adds "
                            f"nothing; set second_index.enabled: off, or embedder.kind back to use")
        embedder = embedder or embed_mod.load(cfg)
        store = open_store(settings.qdrant, settings.state_dir, embedder.dim, create=True, name=SECOND)
        try:
            manifest = store.manifest()
            if manifest is not None and (manifest.get("embedder"), manifest.get("dim")) != (embedder.model_id,
                                                                                             embedder.dim):
                log.info("second index: made with %s (%s dimensions), now %s (%d): emptied, to be filled again",
                         manifest.get("embedder"), manifest.get("dim"), embedder.model_id, embedder.dim)
                store.drop(embedder.dim)
                manifest = None
            if manifest is None:
                store.write_manifest({"schema": 1, "embedder": embedder.model_id, "dim": embedder.dim,
                                      "index_id": hashlib.sha256(str(time.time()).encode()).hexdigest()[:16]})
        except BaseException:
            store.close()
            raise
        return cls(settings, store, embedder)

    def close(self) -> None:
        self.store.close()

    # --- filling ---------------------------------------------------------------------------

    def plan(self, first: Store) -> Plan:
        """What is to embed, per the first index now (module docstring); stale points deleted."""
        began = time.monotonic()
        out = Plan()
        users = [u for u in first.count_by_user() if not u.endswith(ASKED)]
        with self._lock:
            for user in users:
                notes = first.note_ids(user)
                out.notes[user] = len(notes)
                covered = out.covered.setdefault(user, set())
                for note in sorted(notes):
                    chunks = note_chunks(first, note)
                    mine = note_chunks(self.store, note)
                    by_index = {p.get("chunk_index"): p for p in mine}
                    missing = False
                    refreshed = []
                    for p in chunks:
                        text = search_text(p.get("text", ""))
                        h = text_hash(text)
                        here = by_index.get(p.get("chunk_index"))
                        out.chunks += 1
                        pid = point_id(note, p.get("chunk_index", 0))
                        if here is not None and here.get("text_hash") == h:
                            out.current += 1
                            if here.get("content_hash") != p.get("content_hash") or here.get("user_id") != user:
                                refreshed.append(pid)
                            continue
                        missing = True
                        out.todo.append(Todo(pid, note, user, p.get("content_hash", ""), p.get("chunk_index", 0),
                                             text, h))
                    if refreshed:  # the same text under the note's new hash (or owner): nothing to embed
                        content = chunks[0].get("content_hash", "")
                        self.store.set_payload(refreshed, {"content_hash": content, "user_id": user})
                    gone = [point_id(note, i) for i in by_index if i is not None and i >= len(chunks)]
                    if gone:
                        self.store.delete(gone)
                        out.deleted += len(gone)
                    if not missing and chunks:
                        covered.add(note)
                for note in self.store.note_ids(user) - notes:  # notes that left the first index
                    self.store.delete_note(note)
                    out.deleted += 1
            for user in set(self.store.count_by_user()) - set(users):
                for note in self.store.note_ids(user):
                    self.store.delete_note(note)
                    out.deleted += 1
            out.seconds = time.monotonic() - began
            self.plan_made = out
        return out

    def fill(self, n: int, stop=lambda: False) -> int:
        """Embed and write the next ``n`` chunks of the plan, one at a time (a question waits for
        the model at most one chunk's time; ``stop()`` true ends the batch early); how many were
        written."""
        with self._lock:
            plan = self.plan_made
            if plan is None or not plan.todo:
                return 0
            batch = plan.todo[:n]
        points = []
        took, timed = 0.0, 0  # the model's time and its chunks: one the vector cache held took none
        for t in batch:
            if points and stop():
                break
            made = getattr(self.embedder, "computed", None)
            began = time.monotonic()
            vector = self.embedder.embed([t.text])[0]
            if made is None or self.embedder.computed != made:
                took += time.monotonic() - began
                timed += 1
            points.append(PointData(t.point_id, vector, EMPTY, {
                "user_id": t.user_id, "note_id": t.note_id, "content_hash": t.content_hash, "text_hash": t.hash,
                "chunk_index": t.chunk_index}))
        with self._lock:
            self.store.upsert(points)
            del plan.todo[: len(points)]
            plan.current += len(points)
            waiting = {t.note_id for t in plan.todo}
            with self._cover:
                for t in batch[: len(points)]:
                    if t.note_id not in waiting:
                        plan.covered.setdefault(t.user_id, set()).add(t.note_id)
            self.filled += len(points)
            rate = timed / took if timed and took > 0 else None
            if rate:
                self.rate = rate if self.rate is None else 0.7 * self.rate + 0.3 * rate
        return len(points)

    def progress(self) -> dict:
        """How far it is: ``{"embedder", "chunks", "current", "left", "notes_covered", "rate", "seconds_left"}``."""
        plan = self.plan_made
        if plan is None:
            return {"embedder": self.embedder.model_id, "chunks": None, "current": None, "left": None,
                    "notes_covered": None, "rate": self.rate, "seconds_left": None}
        left = len(plan.todo)
        return {"embedder": self.embedder.model_id, "chunks": plan.chunks, "current": plan.current, "left": left,
                "notes_covered": sum(len(v) for v in plan.covered.values()),
                "rate": round(self.rate, 3) if self.rate else None,
                "seconds_left": round(left / self.rate) if self.rate else None}

    # --- search ----------------------------------------------------------------------------

    def dense_weight(self, user_id: str, first: float) -> float:
        """The dense side's weight in a search of ``user_id``'s notes: ``second_index.dense_weight``
        once this index covers every note of theirs, ``first`` (the first index's) while it covers
        none, in between by the share it covers."""
        plan = self.plan_made
        total = plan.notes.get(user_id, 0) if plan is not None else 0
        share = min(1.0, len(self.covered(user_id)) / total) if total else 0.0
        return first + (self.settings.second_index.dense_weight - first) * share

    def describe(self, user_id: str, first_model: str, first_weight: float) -> str:
        """The dense side of a search of ``user_id``'s notes, for the trace: which embedder ranks
        how many of their notes, and the dense weight that follows."""
        plan = self.plan_made
        total = plan.notes.get(user_id, 0) if plan is not None else 0
        covered = min(len(self.covered(user_id)), total)
        weight = self.dense_weight(user_id, first_weight)
        if not covered:
            return f"{first_model} (the second index, {self.embedder.model_id}, covers none of your notes yet)"
        rest = f", {first_model} for the rest" if covered < total else ""
        return f"{self.embedder.model_id} for {covered} of {total} notes{rest}; dense weight {weight:.2f}"

    def covered(self, user_id: str) -> set[str]:
        plan = self.plan_made
        if plan is None:
            return set()
        with self._cover:
            return set(plan.covered.get(user_id, ()))

    def ranking(self, first: Store, query: str, user_id: str, first_dense: list[Ranked], limit: int,
                hnsw_ef: int = 128):
        """The dense ranking of a question (module docstring), and its second look: a function of
        (notes, the first index's candidates among them) giving the same ranking among those notes,
        with the same question vector and scale (``rag.index.retrieve``'s passage step)."""
        covered = self.covered(user_id)
        vector = self.embedder.embed_query([query])[0] if covered else None
        hits = self._hits(first, vector, user_id, limit, hnsw_ef, covered, None)
        scale = _scale(first_dense, hits)

        def second_look(note_ids: list[str], more_first: list[Ranked]) -> list[Ranked]:
            more = self._hits(first, vector, user_id, limit, hnsw_ef, covered, note_ids)
            return _placed(more, more_first, covered, scale)

        return _placed(hits, first_dense, covered, scale), second_look

    def _hits(self, first: Store, vector, user_id: str, limit: int, hnsw_ef: int, covered: set[str],
              note_ids: list[str] | None) -> list[Ranked]:
        """This index's candidates among the covered notes whose content hash is still the first
        index's (a note found changed leaves ``covered`` for this question)."""
        if vector is None or not covered:
            return []
        found, _ = self.store.search(vector, None, user_id, limit, hnsw_ef, note_ids=note_ids)
        found = [h for h in found if h.note_id in covered]
        mine = self.store.payloads([h.id for h in found])
        theirs = first.payloads([h.id for h in found])
        hits = []
        for h in found:
            a, b = mine.get(h.id), theirs.get(h.id)
            if a is not None and b is not None and a.get("content_hash") == b.get("content_hash"):
                hits.append(h)
            else:
                covered.discard(h.note_id)  # changed since: ranked as the first index ranks it
        return [h for h in hits if h.note_id in covered]


def _scale(first_dense: list[Ranked], hits: list[Ranked]):
    """The first ranking's scores put on this index's: as many standard deviations from its mean."""
    if not first_dense or not hits:
        return None
    (m1, s1), (m2, s2) = _spread([c.score for c in first_dense]), _spread([h.score for h in hits])
    return lambda score: m2 + (score - m1) / s1 * s2 if s1 > 0 else m2


def _placed(hits: list[Ranked], first_dense: list[Ranked], covered: set[str], scale) -> list[Ranked]:
    """This index's hits, and the first's candidates of the notes it does not cover, on one scale."""
    rest = [c for c in first_dense if c.note_id not in covered]
    if not hits or scale is None:
        return hits or list(rest)
    placed = [Ranked(c.id, scale(c.score), c.note_id) for c in rest]
    return sorted(hits + placed, key=lambda c: (-c.score, c.id))


def _spread(scores: list[float]) -> tuple[float, float]:
    mean = math.fsum(scores) / len(scores)
    return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in scores) / len(scores))
