"""Whether the notes may hold an answer: before the LLM (``too_weak``: refuse without asking
it) and after it (``plausible``: are the best passages about the question, so that they may
stand in for a reply that failed?). Every signal is relative to what the asker's notes hold,
so a collection of 15 notes and one of 50,000 are judged alike.
"""

from __future__ import annotations

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
# top notes holds at least this share of the question's words (its title and heading count).
# Below, the person is told the notes hold no answer, with the closest notes' titles only.
PLAUSIBLE_COVER = 0.35
PLAUSIBLE_NOTES = 3


def about(question: str, hits: list[Hit]) -> float | None:
    """The largest share of the question's own words (``specifics.terms``, less the words of
    asking) that a passage of the best ``PLAUSIBLE_NOTES`` notes holds; None when the question
    has no words of its own."""
    asked = specifics.terms(question) - _ASKING
    if not asked:
        return None
    best, seen = 0.0, set()
    for h in hits:
        if h.note_id in seen:
            continue
        seen.add(h.note_id)
        body = specifics.Body(f"{h.title}\n{h.heading}\n{h.text}")
        best = max(best, body.share(asked))
        if len(seen) >= PLAUSIBLE_NOTES:
            break
    return best


def plausible(question: str, hits: list[Hit]) -> tuple[bool, str]:
    """Whether the best passages are about the question, and why (for the trace). An English
    question's Chinese words (``rag.index.translate``) are not counted here: their share in the
    best passage tells the notes that answer it from the others no better than chance
    (docs/answers.md, "English questions about Chinese notes")."""
    best = about(question, hits)
    if best is None:
        return bool(hits), "the question has no words of its own to look for"
    return best >= PLAUSIBLE_COVER, f"the best passage holds {best:.0%} of the question's words"


# Words that ask rather than say what about (left out of ``plausible``'s count).
_ASKING = frozenset("""什么 怎么 怎样 如何 为什么 哪些 哪个 哪里 多少 几个 是否 是不是 能不能 可不可以 有没有 要不要
请问 一下 应该 需要 时候 什么样 吗 呢 方法 办法 问题 笔记 我的 记得 之前 以前 写过 记过
how what which why when where does should could would need way ways notes note""".split())
