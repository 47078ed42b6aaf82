"""Hybrid retrieval: dense and BM25 candidates for one user, fused into one ranking.

Both retrievers run in one batched store call, filtered to the asking user's
notes (trashed and deleted notes are never in the index). Fusion happens here,
not in the store, so the two backends rank identically and every hit keeps its
dense and sparse ranks and scores for ``--trace``. A cap on chunks per note stops
one long note from crowding out the rest.

Two fusions (``retrieval.fusion``):
- ``dbsf`` (default): distribution-based score fusion, as Qdrant's ``Fusion.Dbsf``:
  each retriever's scores are normalised over its candidates (mean ± 3σ -> 0..1),
  then summed with the retriever weights. Score gaps survive: a candidate far
  ahead of the rest of its list keeps that lead, where rank fusion gives it only
  the step from one rank to the next.
- ``rrf``: reciprocal-rank fusion, ``sum(weight / (k + rank))``. Rank-only: with
  k=60 a dense-only first place ties a sparse-only 31st place at weights 1 : 1.5.
dbsf is the default because rank fusion cannot tell a runaway winner from a photo finish, and
this embedder's sparse side is the stronger one (docs/how-it-works.md, "Decisions": dbsf beats
rrf at every weight tried, and either retriever alone).

The passage step (``retrieval.passages``, hybrid only). The first ranking usually
finds the right note; which of its chunks holds the answer is harder: the chunk
may sit below the first query's candidates of one retriever (and get nothing from
it) or below other chunks of its note. So, for the best ``passage_notes`` notes:

1. a second store query over those notes' chunks only (a ``note_id`` filter), as
   many candidates per retriever as the first, so their chunks get the dense and
   sparse scores the first query cut off; the two lists are merged into the first
   ones and fused again;
2. each chunk's passage score is that fused score times ``1 + coverage / best``:
   coverage is the question's words the chunk holds (Latin words, CJK character
   pairs and, weakly, single characters, as in excerpts), each weighted by BM25's
   IDF over the note's own chunks, so a word the whole note repeats (its topic)
   counts for nearly nothing and the question's rarer words pick the passage;
   ``best`` is the note's highest coverage: its best-covering chunk's fused score
   doubles. No weight to tune, and a long chunk is not penalised for its length;
3. the notes keep their places: the places each of those notes holds in the first
   ranking (up to ``passage_chunks`` of them instead of ``max_chunks_per_note``)
   are filled, in order, with its chunks by passage score. A hit placed so
   carries the fused score of the place it takes (the list stays sorted, the
   note's standing is unchanged) and its own dense and sparse ranks and scores,
   ranks counted in the merged lists (so above ``candidates`` for a chunk only the
   second query found).

Which notes come first is untouched; a best note's extra places can only push the last notes
further down (docs/how-it-works.md, "Decisions", has the step's measure).

Entities named in the question (``rag.memory.store``, hybrid only). The question's text is
matched against the user's entity names (``named_entities``: a whole name of at least two
CJK characters or three Latin letters, Latin names on word boundaries, a name inside a
longer matched one dropped, entities in more than ``ENTITY_MAX_SHARE`` of the notes left
out, the rarest ``MAX_ENTITIES`` kept). The chunks holding their mentions are one more
ranking, "entities" (``entity_ranking``: per chunk, each entity's IDF over the notes
times ``1 + ln(mentions in the chunk)``), fused at ``ENTITY_WEIGHT``.

Written questions (``rag.index.asked``, hybrid only, ``retrieval.questions_weight`` above 0):
the questions each note answers, written by the LLM ahead of time, searched dense and BM25
like the chunks; each hit counts for the chunk its question points to, two more rankings
fused at the dense and sparse weights times ``questions_weight``.

The second dense index (``rag.index.second``, ``second_index: on``): the dense ranking is the
stronger embedder's for the notes it covers, the first embedder's for the others (put on the
same scale); the passage step's second look the same. The dense weight moves from
``retrieval.dense_weight`` towards ``second_index.dense_weight`` by the share of the person's
notes it covers (the sparse weight takes the rest of the same total).
"""

from __future__ import annotations

import logging
import math
import re
import string
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from rag import limits
from rag.config import RetrievalConfig
from rag.errors import UserError
from rag.index import asked
from rag.index.excerpt import CJK_RUN, question_terms
from rag.index.note_index import NoteIndex
from rag.index.lexical import CJK_CHAR, LATIN_WORDS, norm, query_vector, tokenize
from rag.index.translate import chinese_terms
from rag.model import HEADING_SEP, RETRIEVERS, Hit
from rag.index.points import Ranked

log = logging.getLogger(__name__)



@dataclass
class Fused:
    id: str
    note_id: str
    score: float
    ranks: dict[str, int]
    scores: dict[str, float]


def rrf(rankings: dict[str, list[Ranked]], k: int = 60, weights: dict[str, float] | None = None) -> list[Fused]:
    """Reciprocal-rank fusion: score = sum over retrievers of weight / (k + rank), rank from 1."""
    weights = weights or {}
    fused: dict[str, Fused] = {}
    for name, ranked in rankings.items():
        w = weights.get(name, 1.0)
        for rank, cand in enumerate(ranked, start=1):
            f = fused.get(cand.id)
            if f is None:
                f = fused[cand.id] = Fused(cand.id, cand.note_id, 0.0, {}, {})
            f.score += w / (k + rank)
            f.ranks[name] = rank
            f.scores[name] = cand.score
    return sorted(fused.values(), key=lambda f: (-f.score, min(f.ranks.values()), f.id))


def _mean_sd(scores: list[float]) -> tuple[float, float]:
    """Mean and population standard deviation, in floats (``statistics.pstdev`` counts in
    exact fractions, slow for what it is asked twice a search; the two agree to the last bit or two)."""
    mean = math.fsum(scores) / len(scores)
    return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in scores) / len(scores))


def dbsf(rankings: dict[str, list[Ranked]], weights: dict[str, float] | None = None) -> list[Fused]:
    """Distribution-based score fusion: per retriever, scores scaled so mean-3σ..mean+3σ
    maps to 0..1 (clipped), then a weighted sum."""
    weights = weights or {}
    fused: dict[str, Fused] = {}
    for name, ranked in rankings.items():
        if not ranked:
            continue
        w = weights.get(name, 1.0)
        mean, sd = _mean_sd([c.score for c in ranked])
        lo, hi = mean - 3 * sd, mean + 3 * sd
        for rank, cand in enumerate(ranked, start=1):
            norm = 1.0 if hi <= lo else min(1.0, max(0.0, (cand.score - lo) / (hi - lo)))
            f = fused.get(cand.id)
            if f is None:
                f = fused[cand.id] = Fused(cand.id, cand.note_id, 0.0, {}, {})
            f.score += w * norm
            f.ranks[name] = rank
            f.scores[name] = cand.score
    return sorted(fused.values(), key=lambda f: (-f.score, min(f.ranks.values()), f.id))


# The ranking of chunks mentioning entities named in the question: its weight in the fusion
# (dense 0.35 and sparse 0.65 by default), and which entities make it. Light: it orders the notes
# the question names first without pushing paraphrases out of the top five (docs/memory.md).
ENTITY_WEIGHT = 0.1
MAX_ENTITIES = 5
ENTITY_MAX_SHARE = 0.05  # of the user's notes (at least ENTITY_MIN_NOTES): commoner names say little
ENTITY_MIN_NOTES = 3
_LATIN_LETTER = re.compile(r"[a-z]")
_WORDISH = re.compile(r"[0-9a-z_]")


def _long_enough(key: str) -> bool:
    return len("".join(CJK_RUN.findall(key))) >= 2 or len(_LATIN_LETTER.findall(key)) >= 3


def _whole(key: str, text: str) -> bool:
    """Does ``key`` occur in ``text`` (both as ``norm``) not inside a longer Latin word?"""
    start = text.find(key)
    while start >= 0:
        end = start + len(key)
        before = start > 0 and _WORDISH.match(key[0]) and _WORDISH.match(text[start - 1])
        after = end < len(text) and _WORDISH.match(key[-1]) and _WORDISH.match(text[end])
        if not before and not after:
            return True
        start = text.find(key, start + 1)
    return False


def named_entities(memory, user_id: str, text: str, limit: int = MAX_ENTITIES, common: bool = False) -> list[dict]:
    """The user's entities named in ``text`` (module docstring), rarest first; each a
    ``MemoryStore.named_in`` row. ``common``: keep those in many notes too. ``memory``
    None or empty: none."""
    if memory is None:
        return []
    key = norm(text)
    found = [e for e in memory.named_in(user_id, text) if _long_enough(e["norm"]) and _whole(e["norm"], key)]
    found = [e for e in found if not any(e["norm"] != o["norm"] and e["norm"] in o["norm"] for o in found)]
    if not found:
        return []
    if not common:
        most = max(ENTITY_MIN_NOTES, int(memory.users().get(user_id, 0) * ENTITY_MAX_SHARE))
        found = [e for e in found if e["notes"] <= most]
    return sorted(found, key=lambda e: (e["notes"], -len(e["norm"]), e["norm"]))[:limit]


def entity_ranking(memory, user_id: str, entities: list[dict], limit: int) -> list[Ranked]:
    """The chunks mentioning ``entities``, best first (module docstring)."""
    if memory is None or not entities:
        return []
    n = max(1, memory.users().get(user_id, 0))
    idf = {e["norm"]: math.log(1 + n / max(1, e["notes"])) for e in entities}
    scores: dict[tuple[str, str], float] = {}
    for point_id, note_id, key, count in memory.chunks_mentioning(user_id, idf):
        if key in idf:
            scores[point_id, note_id] = scores.get((point_id, note_id), 0.0) + idf[key] * (1 + math.log(count))
    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    return [Ranked(point_id, score, note_id) for (point_id, note_id), score in ranked]




def side_weights(cfg: RetrievalConfig, query: str | None = None) -> tuple[float, float]:
    """The dense and sparse weights for ``query``: the configured ones; for a question with no
    CJK character, when ``latin_dense_share`` is set, the same total split by it. Asked in
    English about Chinese notes without ``translate_english``, BM25 matches only the question's
    Latin words (names, code) and is mostly silent, while the multilingual embedding still
    places the question near its note: at the usual weights BM25's few chance matches bury it
    (docs/performance.md); with the translation BM25 finds the notes' words again."""
    if query is None or cfg.latin_dense_share is None or CJK_CHAR.search(query):
        return cfg.dense_weight, cfg.sparse_weight
    total = cfg.dense_weight + cfg.sparse_weight
    return total * cfg.latin_dense_share, total * (1 - cfg.latin_dense_share)


def fuse(rankings: dict[str, list[Ranked]], cfg: RetrievalConfig, query: str | None = None) -> list[Fused]:
    # An expansion's rankings (rag.answer.expand) weigh as the question's own of the same kind,
    # so an expansion that repeats the question changes no ranking.
    dense, sparse = side_weights(cfg, query)
    weights = {"dense": dense, "sparse": sparse, "hypothesis": dense, "terms": sparse, "entities": ENTITY_WEIGHT,
               "asked_dense": dense * cfg.questions_weight, "asked_sparse": sparse * cfg.questions_weight}
    if cfg.fusion == "rrf":
        return rrf(rankings, cfg.rrf_k, weights)
    return dbsf(rankings, weights)


def cap_per_note(
    candidates: list[Fused], per_note: int, limit: int, caps: dict[str, int] | None = None
) -> list[Fused]:
    """The best candidates, at most ``per_note`` of one note (``caps``: other caps for some notes)."""
    caps = caps or {}
    kept: list[Fused] = []
    seen: dict[str, int] = {}
    for cand in candidates:
        if seen.get(cand.note_id, 0) >= caps.get(cand.note_id, per_note):
            continue
        seen[cand.note_id] = seen.get(cand.note_id, 0) + 1
        kept.append(cand)
        if len(kept) >= limit:
            break
    return kept


@lru_cache(maxsize=50_000)
def _word_terms(word: str) -> frozenset[str]:
    """The terms BM25 makes of one Latin word or identifier (whole and split)."""
    return frozenset(tokenize(word))


def _words(text: str) -> set[str]:
    """The terms of a text's Latin words and identifiers, as BM25 cuts them (no jieba needed)."""
    return set().union(*map(_word_terms, set(LATIN_WORDS.findall(text))))


_WORD_CHARS = frozenset(string.ascii_letters + string.digits + "_.-'")  # what LATIN_WORDS' words are made of


def _latin_held(text: str, lowered: str, maybe: list[str]) -> set[str]:
    """Which of ``maybe`` (Latin terms found in ``lowered``, ``text.lower()``) are terms of the
    text's words as BM25 cuts them (``_words(text)``'s, found the same): each looked at only
    where it occurs, in the word around it, instead of cutting every word of the text (a third
    of a search's time went into that)."""
    if len(lowered) != len(text):  # a character whose lower case is longer: positions differ
        words = _words(text)
        return {t for t in maybe if t in words}
    held = set()
    for term in maybe:
        at = lowered.find(term)
        while at >= 0:
            lo, hi = at, at + len(term)
            while lo and lowered[lo - 1] in _WORD_CHARS:
                lo -= 1
            while hi < len(lowered) and lowered[hi] in _WORD_CHARS:
                hi += 1
            if any(term in _word_terms(m.group()) for m in LATIN_WORDS.finditer(text, lo, hi)):
                held.add(term)
                break
            at = lowered.find(term, hi)
    return held


def coverage(texts: list[str], query: str, terms: dict[str, float] | None = None) -> list[float]:
    """How much of the question each text holds, each text being one chunk of the same note.

    The question's words are those excerpts look for (``rag.index.excerpt``): Latin words and
    identifiers (matched as words: ``i`` is not found inside ``assertI2I``), CJK character
    pairs, and single CJK characters at 0.3. Each counts with BM25's IDF over these texts:
    a word in every chunk of the note weighs almost nothing, a word in one chunk the most.
    ``terms``: ``question_terms(query)``, when the caller has them already."""
    terms = question_terms(query) if terms is None else terms
    cjk = [t for t in terms if CJK_RUN.search(t)]
    latin = [t for t in terms if not CJK_RUN.search(t)]
    chars = list(dict.fromkeys(ch for t in cjk for ch in t))
    present = []
    for text in texts:
        lowered = text.lower()
        # A CJK term is looked for only where each of its characters is (one character is found
        # much faster than two together): the same terms, 0.8x the time.
        there = {ch for ch in chars if ch in lowered}
        held = {t for t in cjk if (t in there if len(t) == 1 else (there.issuperset(t) and t in lowered))}
        maybe = [t for t in latin if t in lowered]  # a word's terms are substrings of the lowered text
        if maybe:
            held |= _latin_held(text, lowered, maybe)
        present.append(held)
    n = len(texts)
    df = Counter(t for held in present for t in held)
    idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
    return [sum(terms[t] * idf[t] for t in held) for held in present]


def _merged(first: list[Ranked], more: list[Ranked]) -> list[Ranked]:
    """One retriever's candidates from both queries, best first (each chunk once)."""
    seen = {c.id for c in first}
    return sorted(first + [c for c in more if c.id not in seen], key=lambda c: -c.score)


def passage_step(
    index: NoteIndex,
    query: str,
    user_id: str,
    dense,
    sparse,
    rankings: dict[str, list[Ranked]],
    fused: list[Fused],
    k: int,
    cfg: RetrievalConfig,
    extra: tuple = (None, None),
    second_look=None,
) -> tuple[list[Fused], dict[str, dict]]:
    """The first ranking with the best notes' places filled by their best passages (module
    docstring, "The passage step"). Returns the chosen candidates and the payloads fetched."""
    top = list(dict.fromkeys(c.note_id for c in fused))[: cfg.passage_notes]
    per_top = max(cfg.passage_chunks, cfg.max_chunks_per_note)
    chosen = cap_per_note(fused, cfg.max_chunks_per_note, k, caps=dict.fromkeys(top, per_top))
    placed = {c.note_id for c in chosen}
    top = [note for note in top if note in placed]  # a small k may not reach them all
    if not top:
        return chosen, index.store.payloads([c.id for c in chosen])
    limit = max(cfg.candidates, k)
    more_dense, more_sparse = index.store.search(dense, sparse, user_id, limit, cfg.hnsw_ef, note_ids=top)
    if second_look is not None:  # the dense side is the second index's: its second look too
        more_dense = second_look(top, more_dense)
    merged = {
        **rankings,
        "dense": _merged(rankings["dense"], more_dense),
        "sparse": _merged(rankings["sparse"], more_sparse),
    }
    hypothesis, terms = extra  # an expansion's rankings get the same second look
    if hypothesis is not None or terms is not None:
        more_h, more_t = index.store.search(hypothesis, terms, user_id, limit, cfg.hnsw_ef, note_ids=top)
        if hypothesis is not None:
            merged["hypothesis"] = _merged(rankings["hypothesis"], more_h)
        if terms is not None:
            merged["terms"] = _merged(rankings["terms"], more_t)
    tops = set(top)
    pool = [c for c in fuse(merged, cfg, query) if c.note_id in tops]
    payloads = index.store.payloads(list({c.id for c in pool} | {c.id for c in chosen}))
    passages: dict[str, list[Fused]] = {}
    terms = question_terms(query, cfg.translate_english, index.settings.state_dir)
    for note in top:
        chunks = [c for c in pool if c.note_id == note and c.id in payloads]  # not deleted meanwhile
        cover = coverage([payloads[c.id].get("text", "") for c in chunks], query, terms)
        best = max(cover, default=0.0) or 1.0
        score = {c.id: c.score * (1 + cv / best) for c, cv in zip(chunks, cover)}
        passages[note] = sorted(chunks, key=lambda c: (-score[c.id], c.id))
    out: list[Fused] = []
    taken: set[str] = set()
    for place in chosen:
        # A best note's place: its best passage not yet placed, with the place's fused score.
        pick = next((c for c in passages.get(place.note_id, []) if c.id not in taken), place)
        if pick.id in taken:
            continue
        taken.add(pick.id)
        out.append(pick if pick is place else Fused(pick.id, pick.note_id, place.score, pick.ranks, pick.scores))
    return out, payloads


def _sparse(text: str, index: NoteIndex):
    """BM25's query of a text: its terms, and an English text's Chinese words (``rag.index.translate``)."""
    if not index.settings.retrieval.translate_english:
        return query_vector(text)
    return query_vector(text, chinese_terms(text, index.settings.state_dir))


def normalise_query(query: str, cfg: RetrievalConfig) -> str:
    """The query with its whitespace collapsed, cut to ``retrieval.max_query_chars`` (reading
    no more of it than that needs, however long it is)."""
    query, _ = limits.cut(query, cfg.max_query_chars)
    if not query:
        raise UserError("the question is empty")
    return query


def display_heading(title: str, path: list[str]) -> str:
    """The heading path to show: a first heading that repeats the note title is dropped."""
    if path and path[0].strip() == title.strip():
        path = path[1:]
    return HEADING_SEP.join(path)


def search(
    index: NoteIndex,
    query: str,
    user_id: str,
    k: int | None = None,
    retriever: str = "hybrid",
    expansion: tuple[list[str], str] | None = None,
    entities: list[Ranked] | None = None,
) -> list[Hit]:
    """The top-k chunks of this user's notes for a query. ``expansion`` (hybrid only): the
    terms and the hypothetical answer an LLM wrote for it (``rag.answer.expand``), fused in as
    two more rankings: the terms through BM25, the answer through the dense embedding.
    ``entities`` (hybrid only): the chunks mentioning entities named in the query
    (``entity_ranking``), one more ranking; none or empty: the search as without a memory."""
    cfg = index.settings.retrieval
    query = normalise_query(query, cfg)
    k = k or cfg.top_k
    if retriever not in RETRIEVERS:
        raise UserError(f"unknown retriever {limits.echoed(retriever)!r}; choose one of {', '.join(RETRIEVERS)}")
    terms, hypothesis = expansion if expansion and retriever == "hybrid" else ([], "")
    dense = hypothesis_vector = None
    if retriever in ("hybrid", "dense"):
        dense = index.embed_query([query])[0]
        if hypothesis:  # a hypothetical answer is written like the notes: embedded as they are
            hypothesis_vector = index.embed([hypothesis])[0]
    sparse = _sparse(query, index) if retriever in ("hybrid", "sparse") else None
    limit = max(cfg.candidates, k)
    dense_hits, sparse_hits = index.store.search(dense, sparse, user_id, limit, cfg.hnsw_ef)
    rankings = {}
    if dense is not None:
        rankings["dense"] = dense_hits
    if sparse is not None:
        rankings["sparse"] = sparse_hits
    extra = (hypothesis_vector, _sparse(" ".join(terms), index) if terms else None)
    if terms or hypothesis:
        more_dense, more_sparse = index.store.search(*extra, user_id, limit, cfg.hnsw_ef)
        if hypothesis:
            rankings["hypothesis"] = more_dense
        if terms:
            rankings["terms"] = more_sparse
    if entities and retriever == "hybrid":
        rankings["entities"] = entities
    if cfg.questions_weight > 0 and retriever == "hybrid":  # the notes' written questions (rag.index.asked)
        rankings.update(asked.rankings(index.store, dense, sparse, user_id, limit, cfg.hnsw_ef))
    second_look = None
    if getattr(index, "second", None) is not None and dense is not None:  # the stronger embedder (rag.index.second)
        rankings["dense"], second_look = index.second.ranking(index.store, query, user_id, dense_hits, limit,
                                                              cfg.hnsw_ef)
        weight = index.second.dense_weight(user_id, cfg.dense_weight)  # its own, by the share it covers
        if weight != cfg.dense_weight:
            total = cfg.dense_weight + cfg.sparse_weight
            cfg = cfg.model_copy(update={"dense_weight": weight, "sparse_weight": max(0.0, total - weight)})
    fused = fuse(rankings, cfg, query)
    if cfg.passages and retriever == "hybrid":
        chosen, payloads = passage_step(index, query, user_id, dense, sparse, rankings, fused, k, cfg, extra,
                                        second_look)
    else:
        chosen = cap_per_note(fused, cfg.max_chunks_per_note, k)
        payloads = index.store.payloads([c.id for c in chosen])
    hits = []
    for cand in chosen:
        p = payloads.get(cand.id)
        if p is None:  # deleted between the two calls
            continue
        hits.append(
            Hit(
                point_id=cand.id,
                note_id=p["note_id"],
                user_id=p["user_id"],
                title=p.get("title", ""),
                notebook=p.get("notebook", ""),
                heading=display_heading(p.get("title", ""), p.get("heading_path") or []),
                url=p.get("url", ""),
                text=p.get("text", ""),
                chunk_index=p.get("chunk_index", 0),
                char_start=p.get("char_start", 0),
                char_end=p.get("char_end", 0),
                score=cand.score,
                dense_rank=cand.ranks.get("dense"),
                dense_score=cand.scores.get("dense"),
                sparse_rank=cand.ranks.get("sparse"),
                sparse_score=cand.scores.get("sparse"),
                tags=list(p.get("tags") or []),
                updated_at=p.get("updated_at", ""),
            )
        )
    return hits
