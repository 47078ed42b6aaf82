"""Answers from hits. For now extractive: the best passages, numbered, each cited
with a link back to its note. (The LLM answer builds on this.)"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field

from .index import NoteIndex
from .lexical import tokenize
from .model import HEADING_SEP, Hit
from .retrieve import search

REFUSAL = "我笔记里没有相关内容"
EXCERPT_CHARS = 500
MAX_PASSAGES = 3
# Passages from notes scoring below this share of the best hit's score are left out:
# they are what the search found next, not what answers the question.
MIN_RELATIVE_SCORE = 0.7


@dataclass
class Citation:
    n: int
    note_id: str
    title: str
    notebook: str
    heading: str
    url: str
    excerpt: str
    score: float

    @property
    def label(self) -> str:
        return HEADING_SEP.join(p for p in (self.title, self.heading) if p)


@dataclass
class Answer:
    question: str
    answer: str
    used_llm: bool
    grounded: bool
    citations: list[Citation] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict:
        return asdict(self)


_SENTENCE = re.compile(r"[。！？!?；;\n]+|\.(?=\s)|$")
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_FILLER = set("的了是在要吗呢么吧啊和与及或就都也很还有没不把被让给对从这那哪什怎么样如何为个")


def _excerpt_terms(query: str) -> dict[str, float]:
    """Terms to look for, with weights: Latin words, CJK character pairs, and (weakly)
    single CJK characters, since jieba may glue a verb to a particle ("要炖") that the
    note never writes together."""
    terms = {t: 1.0 for t in tokenize(query) if not _CJK_RUN.search(t)}
    for run in _CJK_RUN.findall(query):
        for ch in run:
            if ch not in _FILLER:
                terms.setdefault(ch, 0.3)
        for i in range(len(run) - 1):
            terms[run[i : i + 2]] = 1.0
    return terms


def _window(text: str, query: str, width: int) -> tuple[float, int]:
    """(score, start) of the sentence that best matches the query. A term's weight falls
    with how often the text repeats it, so a question's rare words choose the sentence,
    not the topic word that is everywhere."""
    lowered = text.lower()
    weights = _excerpt_terms(query)
    counts = {t: lowered.count(t) for t in weights}
    best, best_score = 0, 0.0
    pos = 0
    for m in _SENTENCE.finditer(lowered):
        sentence = lowered[pos : m.end()]
        score = sum(w / counts[t] for t, w in weights.items() if counts[t] and t in sentence)
        if score > best_score:
            best, best_score = pos, score
        pos = m.end()
    return best_score, best


def excerpt(text: str, query: str, width: int = EXCERPT_CHARS) -> str:
    """The window of ``text`` (about ``width`` chars) that best matches the query."""
    text = text.strip()
    if len(text) <= width:
        return text
    _, best = _window(text, query, width)
    start = max(0, min(best - width // 5, len(text) - width))
    # begin on a line or sentence boundary where one is near
    for sep in ("\n", "。", ". "):
        cut = text.rfind(sep, max(0, start - 60), start + 1)
        if cut != -1:
            start = cut + len(sep)
            break
    snippet = text[start : start + width].strip()
    return ("…" if start > 0 else "") + snippet + ("…" if start + width < len(text) else "")


def extractive(question: str, hits: list[Hit], max_passages: int = MAX_PASSAGES) -> Answer:
    """The best passages, one per note, with numbered citations."""
    by_note: dict[str, list[Hit]] = {}
    floor = hits[0].score * MIN_RELATIVE_SCORE if hits else 0.0
    for hit in hits:
        if hit.score >= floor:
            by_note.setdefault(hit.note_id, []).append(hit)
    citations: list[Citation] = []
    for note_hits in by_note.values():
        # the note's chunk whose best window matches the question best
        hit = max(note_hits, key=lambda h: _window(h.text, question, EXCERPT_CHARS)[0])
        citations.append(
            Citation(
                n=len(citations) + 1,
                note_id=hit.note_id,
                title=hit.title,
                notebook=hit.notebook,
                heading=hit.heading,
                url=hit.url,
                excerpt=excerpt(hit.text, question),
                score=round(hit.score, 6),
            )
        )
        if len(citations) >= max_passages:
            break
    if not citations:
        return Answer(question, REFUSAL, used_llm=False, grounded=False)
    body = "\n\n".join(f"[{c.n}] {c.excerpt}" for c in citations)
    return Answer(question, body, used_llm=False, grounded=True, citations=citations)


def ask(index: NoteIndex, question: str, user_id: str) -> Answer:
    started = time.perf_counter()
    hits = search(index, question, user_id)
    retrieved = time.perf_counter()
    answer = extractive(question, hits)
    answer.timings_ms = {
        "retrieve": round((retrieved - started) * 1000, 1),
        "total": round((time.perf_counter() - started) * 1000, 1),
    }
    return answer
