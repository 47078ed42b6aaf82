"""Related notes: for a note, the same user's notes that belong with it, and why.

A note's score against another of the user's notes is

    dense + ENTITY_WEIGHT * min(1, Σ idf(shared rare entities) / ENTITY_CAP)  [+ LINK_BOOST when linked]

- ``dense``: every chunk of the note asks the store for its ``NEIGHBOURS`` nearest chunks
  of the same user (the note's own chunks left out); per other note, the mean of its two
  best chunk-pair cosines (one pair: that one). A note that shares rare entities but whose
  chunks were not among the neighbours gets its pairs from one more search restricted to
  those notes (``note_ids`` filter). The chunk vectors are the ones the index holds; the
  sync reads them back from its embedding cache (by text hash), nothing is embedded again.
- shared rare entities (``rag.memory.store``: terms, code, headings, link labels, tags)
  mentioned by 2..``rare_max(N)`` of the user's N notes, each weighted by
  ``idf = ln(N / notes mentioning it)``.
- links (optional, ``links``): notes the note links to explicitly, a reason with a boost.

Pairs under ``min_score`` (``memory.related_min_score``) are not kept; at most ``TOP`` per
note. Each pair keeps its reasons: ``{"similarity", "entities": [{name, kind, notes}],
"passages": {"chunk", "other_chunk", "snippet", "other_snippet", "similarity"}, "link"}``.

A question (``for_text``: ``related QUESTION``, ``/related question``) is scored on the same
scale: the notes a search finds for it by their similarity to it, then those notes' related
notes; under ``memory.related_question_min_score`` they are left out.

Storage (``MemoryStore.replace_related``) is per direction, written both ways: computing a
note replaces its own list and puts itself in the list of each note it found.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from rag.memory.entities import LLM_KINDS, norm
from rag.memory.rows import correction_id, correction_target
from rag.memory.store import MemoryStore
from rag.model import Hit
from rag.index.retrieve import named_entities
from rag.index.store import Store

log = logging.getLogger(__name__)

DEFAULT_MIN_SCORE = 0.7  # USE's: the highest that loses no related note people expect (docs/memory.md)
# related QUESTION: the least similarity to the question a note may have (USE's scale): it keeps
# the notes that answer a question and drops many that merely came up (docs/memory.md). Another
# embedder's: ``rag.sections.SCALES``, through ``question_min_score``.
QUESTION_MIN_SCORE = 0.35
NEIGHBOURS = 20  # chunks each chunk asks for
TOP = 10  # pairs kept per note
ENTITY_WEIGHT = 0.25
ENTITY_CAP = 12.0  # Σ idf that counts as full entity evidence
LINK_BOOST = 0.5
SNIPPET = 120
MAX_TITLE_WORDS = 300  # characters of a target compared with the titles

ChunkVectors = Sequence[tuple[str, np.ndarray]]  # (point id, dense vector) of a note's chunks


def rare_max(notes: int) -> int:
    """The most notes a rare entity may be mentioned by."""
    return max(3, int(notes * 0.02))


@dataclass
class Related:
    note_id: str
    score: float
    similarity: float
    entities: list[dict] = field(default_factory=list)
    passage: tuple[str, str, float] | None = None  # (own chunk, other chunk, cosine)
    link: bool = False

    def reasons(self, snippets: dict[str, str], mirror: bool = False) -> dict:
        out: dict = {"similarity": round(self.similarity, 4), "entities": self.entities}
        if self.passage is not None:
            own, other, sim = self.passage
            if mirror:
                own, other = other, own
            out["passages"] = {"chunk": own, "other_chunk": other, "similarity": round(sim, 4),
                               "snippet": snippets.get(own, ""), "other_snippet": snippets.get(other, "")}
        if self.link:
            out["link"] = True
        return out


def _snip(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= SNIPPET else text[: SNIPPET - 1] + "…"


def compute(store: Store, memory: MemoryStore, user_id: str, note_id: str, chunks: ChunkVectors, *,
            min_score: float = DEFAULT_MIN_SCORE, links: Iterable[str] = (), notes: int | None = None,
            top: int = TOP) -> list[Related]:
    """The note's related notes, best first, at least ``min_score``, never itself or
    another user's."""
    pairs: dict[str, list[tuple[float, str, str]]] = defaultdict(list)  # other note -> (cos, own, theirs)

    def ask(vectors: ChunkVectors, limit: int, only: list[str] | None = None) -> None:
        found = store.nearest([vector for _, vector in vectors], user_id, limit, note_ids=only)
        for (own, _), dense in zip(vectors, found):  # one batch for all the note's chunks
            for hit in dense:
                if hit.note_id != note_id:
                    pairs[hit.note_id].append((hit.score, own, hit.id))

    ask(chunks, NEIGHBOURS + len(chunks))
    n = notes if notes is not None else memory.users().get(user_id, 0)
    shared: dict[str, list[dict]] = defaultdict(list)
    idf: dict[str, float] = defaultdict(float)
    if n:
        rows = memory.shared_entities(user_id, note_id, rare_max(n))
        # a name the LLM typed that the no-LLM tier found too counts once (as the no-LLM's)
        plain = {(other, norm(name)) for other, name, kind, _ in rows if kind not in LLM_KINDS}
        for other, name, kind, df in rows:
            if kind in LLM_KINDS and (other, norm(name)) in plain:
                continue
            shared[other].append({"name": name, "kind": kind, "notes": df})
            idf[other] += math.log(n / df)
    links = {x for x in links if x != note_id}
    missing = sorted((set(shared) | links) - set(pairs))
    if missing:
        ask(chunks, 4 * len(missing), missing)
    found = []
    for other in set(pairs) | set(shared) | links:
        sims = sorted(pairs.get(other, ()), reverse=True)
        best = sims[0] if sims else None
        similarity = (sims[0][0] + sims[1][0]) / 2 if len(sims) > 1 else (sims[0][0] if sims else 0.0)
        score = similarity + ENTITY_WEIGHT * min(1.0, idf.get(other, 0.0) / ENTITY_CAP)
        if other in links:
            score += LINK_BOOST
        if score < min_score:
            continue
        ents = sorted(shared.get(other, []), key=lambda e: (e["notes"], e["name"]))[:8]
        found.append(Related(other, round(score, 4), similarity, ents,
                             (best[1], best[2], best[0]) if best else None, other in links))
    found.sort(key=lambda r: (-r.score, r.note_id))
    return found[:top]


def store_pairs(store: Store, memory: MemoryStore, user_id: str, note_id: str, found: list[Related]) -> None:
    """Save the note's related notes with their reasons (snippets read from the points)."""
    ids = sorted({p for r in found if r.passage for p in r.passage[:2]})
    payloads = store.payloads(ids) if ids else {}
    snippets = {pid: _snip(p.get("text", "")) for pid, p in payloads.items()}
    memory.replace_related(user_id, note_id, [(r.note_id, r.score, r.reasons(snippets), r.reasons(snippets, True))
                                              for r in found])


@dataclass
class Refresh:
    recomputed: list[str] = field(default_factory=list)
    pairs: int = 0
    failed: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return (f"related notes: {len(self.recomputed)} notes recomputed, {self.pairs} pairs"
                + (f", {self.failed} failed" if self.failed else "") + f"; {self.seconds:.2f} s")


def refresh(store: Store, memory: MemoryStore, vectors_of: Callable[[str], ChunkVectors | None], *,
            min_score: float = DEFAULT_MIN_SCORE, should_stop: Callable[[], bool] = lambda: False) -> Refresh:
    """Recompute the notes queued by ``MemoryStore.related_mark`` (changed notes and those
    whose pairs pointed at a changed or removed one), and only those. ``vectors_of`` gives a
    note's chunk vectors (None: the note is not indexed now, its job just goes)."""
    started = time.monotonic()
    result = Refresh()
    counts = memory.users()
    for note_id, user_id in memory.related_jobs():
        if should_stop():
            break
        try:
            chunks = vectors_of(note_id)
            if chunks is not None:
                found = compute(store, memory, user_id, note_id, chunks, min_score=min_score,
                                notes=counts.get(user_id, 0))
                store_pairs(store, memory, user_id, note_id, found)
                result.recomputed.append(note_id)
                result.pairs += len(found)
        except Exception as err:  # one note must not stop the others; its job stays for the next pass
            result.failed += 1
            log.warning("related notes of %s failed: %s", note_id, err, exc_info=True)
            continue
        memory.related_done([note_id])
    result.seconds = round(time.monotonic() - started, 3)
    return result


def for_text(memory: MemoryStore, user_id: str, question: str, hits: Sequence[Hit], k: int,
             min_score: float = QUESTION_MIN_SCORE) -> list[dict]:
    """Notes related to a question, on one scale: their similarity to it.

    A note a search found for it (``hits``, best first) scores its best chunk's dense cosine
    with the question (as ``search`` reports it; 0 for a note only BM25 found) plus, as pairs
    do, ``ENTITY_WEIGHT * min(1, Σ idf / ENTITY_CAP)`` for the rare entities the question
    names that the note mentions; a note related to one of those scores that note's score
    times the pair's (at most 1), so it never outranks the note it came through. Notes under
    ``min_score`` (``memory.related_question_min_score``) are left out; the best ``k``."""
    rank: dict[str, int] = {}
    cosine: dict[str, float] = {}
    for h in hits:
        rank.setdefault(h.note_id, len(rank) + 1)
        if h.dense_score is not None:
            cosine[h.note_id] = max(cosine.get(h.note_id, 0.0), h.dense_score)
    shared = _named_shared(memory, user_id, question, list(rank))
    out: dict[str, dict] = {}
    for note_id, place in rank.items():
        info = memory.note_info(user_id, note_id)
        entities = shared.get(note_id, [])
        idf = sum(e["idf"] for e in entities)
        score = cosine.get(note_id, 0.0) + ENTITY_WEIGHT * min(1.0, idf / ENTITY_CAP)
        if info is None or score < min_score:
            continue
        out[note_id] = {**info, "score": round(score, 4), "reasons": {
            "search": place, "similarity": round(cosine.get(note_id, 0.0), 4),
            "entities": [{k: e[k] for k in ("name", "kind", "notes")} for e in entities]}}
    for note_id, found in list(out.items()):
        for r in memory.related_of(user_id, note_id):
            score = round(found["score"] * min(1.0, r["score"]), 4)
            if score >= min_score and (r["note_id"] not in out or out[r["note_id"]]["score"] < score):
                out[r["note_id"]] = {**r, "score": score, "reasons": {**r["reasons"], "via": note_id},
                                     "pair_id": pair_id(user_id, note_id, r["note_id"])}  # the pair it came through
    return sorted(out.values(), key=lambda x: (-x["score"], x["note_id"]))[:k]


def question_min_score(settings, index, user_id: str) -> float:
    """The least score a note may have in ``related QUESTION`` of ``user_id``'s notes:
    ``memory.related_question_min_score``, else the one measured on the scale of the cosines its
    search gives: the second index's embedder's once that covers any of the user's notes (the
    dense ranking is then on its scale, the notes not covered yet put on it: ``rag.index.second``),
    else the first embedder's."""
    second = getattr(index, "second", None)
    kind = settings.second_index.embedder.kind if second is not None and second.covered(user_id) else None
    return settings.related_question_min_score(kind)


def pair_id(user_id: str, note_id: str, other: str) -> str:
    """The id a correction of the related pair takes (``memory reject|confirm``, the buttons)."""
    return correction_id(user_id, "pair", correction_target("pair", note_id, other))


def of_note(memory: MemoryStore, user_id: str, target: str, k: int) -> tuple[dict, list[dict]] | None:
    """The note ``target`` names (``note_named``: its id, or its title's words) and its best
    ``k`` related notes, each with the id its pair's correction takes; None when ``target``
    names no note of the user (it is then a question: ``for_text``). What every door shows
    for ``related``."""
    info = note_named(memory, user_id, target)
    if info is None:
        return None
    notes = memory.related_of(user_id, info["note_id"], k)
    for n in notes:
        n["pair_id"] = pair_id(user_id, info["note_id"], n["note_id"])
    return info, notes


def _named_shared(memory: MemoryStore, user_id: str, question: str, note_ids: list[str]) -> dict[str, list[dict]]:
    """Per note of ``note_ids``: the rare entities (as pairs count them) the question names
    that it mentions, each with its idf over the user's notes."""
    n = memory.users().get(user_id, 0)
    named = [e for e in named_entities(memory, user_id, question) if e["notes"] <= rare_max(n)] if n else []
    if not named:
        return {}
    by_norm = {e["norm"]: e for e in named}
    wanted = set(note_ids)
    out: dict[str, list[dict]] = {}
    for note_id, norms in memory.notes_for(user_id, by_norm):
        if note_id in wanted:
            out[note_id] = [{"name": by_norm[k]["name"], "kind": by_norm[k]["kinds"][0], "notes": by_norm[k]["notes"],
                             "idf": math.log(n / max(1, by_norm[k]["notes"]))} for k in norms]
    return out


def note_named(store: MemoryStore, user_id: str, target: str) -> dict | None:
    """The user's note ``target`` names (``note_info``): its id; or, as a person writes it
    (``/related 溏心蛋``), the words of its title: the one note whose title is them, else the
    only note whose title holds them. None: no note, or several (then it is a question)."""
    target = " ".join((target or "").split())
    if not target:
        return None
    info = store.note_info(user_id, target) if " " not in target else None
    if info is not None:
        return info
    titled = store.notes_titled(user_id, target[:MAX_TITLE_WORDS])
    exact = [n for n in titled if n["title"].strip().lower() == target.lower()]
    chosen = exact if exact else titled
    if len(chosen) != 1:
        return None
    return store.note_info(user_id, chosen[0]["note_id"])
