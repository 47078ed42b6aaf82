"""Whether the notes may hold an answer: before the LLM (``too_weak``: refuse without asking
it) and after it (``plausible``: are the best passages about the question, so that they may
stand in for a reply that failed?). Every signal is relative to what the asker's notes hold,
so a collection of 15 notes and one of 50,000 are judged alike.
"""

from __future__ import annotations

import math
import statistics

from rag.answer import specifics
from rag.config import AnswerConfig
from rag.index.lexical import search_text, tokenize
from rag.model import Hit


def relevance(question: str, hits: list[Hit], translated: frozenset[str] = frozenset()) -> tuple[float, float]:
    """Two signals that the notes may hold an answer, both comparable across corpora
    of any size: the best dense similarity among the candidates, and the largest share
    of the question's terms found in one of the top five chunks. ``translated``: an English
    question's Chinese words (``rag.index.translate``), counted as its own."""
    dense = max((h.dense_score for h in hits if h.dense_score is not None), default=0.0)
    terms = set(tokenize(question)) | translated
    cover = 0.0
    if terms:
        for h in hits[:5]:
            found = terms & set(tokenize(f"{h.title}\n{h.heading}\n{search_text(h.text)}"))
            cover = max(cover, len(found) / len(terms))
    return dense, cover


def dense_outlier(hits: list[Hit]) -> float:
    """How far the best dense score stands above the other candidates', in standard
    deviations: a relative signal, whatever the collection's size or the embedder's scale."""
    scores = sorted(h.dense_score for h in hits if h.dense_score is not None)
    if len(scores) < 3:
        return float("inf")  # too few to tell: do not refuse on this
    rest = scores[:-1]
    spread = statistics.pstdev(rest) or 1e-9
    return (scores[-1] - statistics.fmean(rest)) / spread


def signals(question: str, hits: list[Hit], translated: frozenset[str], unknown: list[str]) -> dict:
    """What the gate weighs, for the trace (and the answer eval, which draws the gate's
    trade-off from it): the best dense score, the best term coverage, how far the best dense
    score stands out (σ; None: too few candidates to tell), the share of the question's own
    words the best passage holds (``about``), and the names no note mentions."""
    dense, cover = relevance(question, hits, translated)
    z = dense_outlier(hits)
    share = about(question, hits)
    return {"dense": round(dense, 4), "cover": round(cover, 3), "z": round(z, 2) if z != float("inf") else None,
            "about": round(share, 3) if share is not None else None, "unknown": unknown}


def too_weak(cfg: AnswerConfig, question: str, hits: list[Hit], rerank_scores: dict[str, float],
             translated: frozenset[str] = frozenset()) -> str:
    """Why the evidence is too weak to ask the LLM, or "" when it is worth a try.

    Refused here: nothing retrieved; with a reranker, a best score below
    ``answer.min_rerank``; otherwise only when nothing plausible came back: no top-5
    chunk shares a single word with the question, and no candidate stands out by
    meaning (the best dense score is within ``answer.outlier_z`` standard deviations of
    the others'). Both signals are relative to what this user's notes hold, so a
    collection of 15 notes and one of 50,000 are judged alike; everything else is left
    to the LLM's instructed refusal. ``answer.min_dense`` with ``answer.min_coverage``
    adds an absolute rule for those who calibrate one."""
    if not hits:
        return "nothing matched"
    if rerank_scores and cfg.min_rerank is not None:
        best = max(rerank_scores.values())
        if best < cfg.min_rerank:
            return f"best rerank score {best:.3f} < answer.min_rerank {cfg.min_rerank}"
        return ""
    dense, cover = relevance(question, hits, translated)
    z = dense_outlier(hits)
    if cover == 0 and z < cfg.outlier_z:
        return (f"no top-5 chunk shares a word with the question, and the best dense match stands out by "
                f"only {z:.1f} σ (< answer.outlier_z {cfg.outlier_z:g})")
    if cfg.min_dense is not None and cfg.min_coverage is not None and dense < cfg.min_dense \
            and cover < cfg.min_coverage:
        return (f"best dense score {dense:.3f} < answer.min_dense {cfg.min_dense} and best term coverage "
                f"{cover:.2f} < answer.min_coverage {cfg.min_coverage}")
    return ""


# Passages replace an answer only when they are about the question: the best passage of the
# top notes holds at least this share of what the question says (its words, each weighted by
# how rare it is in the person's notes: ``rarity``; the passage's title and heading count).
# Below, the person is told the notes hold no answer, and only the closest notes that are about
# the question by the same measure are named (none, when none is).
PLAUSIBLE_COVER = 0.35
PLAUSIBLE_NOTES = 3
RARITY_CAP = 500  # chunks counted per word at most: a word in more is common, whatever the count


def asked(question: str) -> set[str]:
    """The question's own words: ``specifics.terms``, less the words of asking."""
    return specifics.terms(question) - _ASKING


def weight(chunks: int, holding: int) -> float:
    """BM25's IDF of a word held by ``holding`` of ``chunks`` chunks (``holding`` counted up to
    ``RARITY_CAP``): a word no note holds weighs most, one in every other chunk least."""
    return math.log((chunks - holding + 0.5) / (holding + 0.5) + 1)


class Rarity(dict):
    """word -> weight (``weight``); for an English question also ``renderings`` (word -> how
    Chinese writes it: ``rag.index.translate.renderings``) and ``rendered`` (word -> its weight
    as Chinese writes it: its most common rendering's, so that 年 for "year" weighs little and
    狂犬 for "rabies" much; ``rag.answer.refusing.rarity``)."""

    renderings: dict[str, frozenset[str]] = {}
    rendered: dict[str, float] = {}


def share(words: set[str], rarity: dict[str, float] | None, hit: Hit, rendered: bool = False) -> float:
    """The share of ``words`` a passage (with its title and heading) holds, each word weighted
    by ``rarity`` (word -> weight; None: all alike). ``rendered``: the larger of that and the
    share of the words Chinese can write and the names it cannot (``Rarity.renderings``), held
    as written or as Chinese writes them, each weighted as Chinese writes it (``Rarity.rendered``)."""
    body = specifics.Body(f"{hit.title}\n{hit.heading}\n{hit.text}")
    if rarity is None:
        return body.share(words)
    total = sum(rarity.get(w, 1.0) for w in words)
    plain = sum(rarity.get(w, 1.0) for w in words if body.has(w)) / total if total else 0.0
    other, weights = getattr(rarity, "renderings", {}), getattr(rarity, "rendered", {})
    writable = [w for w in words if w in other] if rendered else []
    total = sum(weights.get(w, 1.0) for w in writable)
    if not total:
        return plain
    held = sum(weights.get(w, 1.0) for w in writable if body.has(w) or any(map(body.has, other[w])))
    return max(plain, held / total)


def by_note(question: str, hits: list[Hit], rarity: dict[str, float] | None = None,
            notes: int = PLAUSIBLE_NOTES, rendered: bool = False) -> list[tuple[Hit, float]]:
    """The best ``notes`` notes of ``hits``, in their order, each as its best passage (its first
    hit) and the share of what the question says that passage holds (``share``); [] when the
    question has no words of its own."""
    words = asked(question)
    if not words:
        return []
    out, seen = [], set()
    for h in hits:
        if h.note_id in seen:
            continue
        seen.add(h.note_id)
        out.append((h, share(words, rarity, h, rendered)))
        if len(out) >= notes:
            break
    return out


def about(question: str, hits: list[Hit], rarity: dict[str, float] | None = None) -> float | None:
    """The largest share of what the question says (``share``) that a passage of the best
    ``PLAUSIBLE_NOTES`` notes holds; None when the question has no words of its own."""
    if not asked(question):
        return None
    return max((held for _, held in by_note(question, hits, rarity)), default=0.0)


def plausible(question: str, hits: list[Hit], rarity: dict[str, float] | None = None) -> tuple[bool, str]:
    """Whether the best passages are about the question, and why (for the trace). An English
    question's Chinese words (``rag.index.translate``) are not counted here: their share in the
    best passage tells the notes that answer it from the others no better than chance
    (docs/answers.md, "English questions about Chinese notes")."""
    best = about(question, hits, rarity)
    if best is None:
        return bool(hits), "the question has no words of its own to look for"
    what = "of what the question says (its words weighted by rarity)" if rarity is not None else \
        "of the question's words"
    return best >= PLAUSIBLE_COVER, f"the best passage holds {best:.0%} {what}"


def closest(question: str, hits: list[Hit], rarity: dict[str, float] | None, most: int) -> list[Hit]:
    """The notes a refusal names as the closest (one passage each, at most ``most``): of the best
    notes, those whose passage is about the question as ``plausible`` measures it; none when
    none is (a car-service question is shown no storage table). An English question's words count
    as held in a Chinese passage that holds how Chinese writes them (``Rarity.renderings``: "rabies
    shot" → 狂犬疫苗), though ``plausible`` does not count them. A question with no words of its
    own to look for: the best notes as they came."""
    if not asked(question):
        out, seen = [], set()
        for h in hits:
            if h.note_id not in seen and len(out) < most:
                seen.add(h.note_id)
                out.append(h)
        return out
    return [h for h, held in by_note(question, hits, rarity, notes=most, rendered=True) if held >= PLAUSIBLE_COVER]


# Words that ask rather than say what about (left out of ``plausible``'s count).
_ASKING = frozenset("""什么 怎么 怎样 如何 为什么 哪些 哪个 哪里 多少 几个 是否 是不是 能不能 可不可以 有没有 要不要
请问 一下 应该 需要 时候 什么样 吗 呢 方法 办法 问题 笔记 我的 记得 之前 以前 写过 记过
how what which why when where does should could would need way ways notes note""".split())


def asked_words(question: str) -> set[str]:
    """The words a question says what it is about with (``plausible`` counts these)."""
    return specifics.terms(question) - _ASKING
