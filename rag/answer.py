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
EXCERPT_CHARS = 300
MAX_PASSAGES = 3


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


def excerpt(text: str, query: str, width: int = EXCERPT_CHARS) -> str:
    """The window of ``text`` (about ``width`` chars) holding the most query terms."""
    text = text.strip()
    if len(text) <= width:
        return text
    lowered = text.lower()
    positions = sorted(
        m.start() for term in set(tokenize(query)) if len(term) > 1 for m in re.finditer(re.escape(term), lowered)
    )
    best, best_count = 0, 0
    for i, start in enumerate(positions):
        count = sum(1 for p in positions[i:] if p < start + width)
        if count > best_count:
            best, best_count = start, count
    start = max(0, min(best - width // 5, len(text) - width))
    # begin and end on line or sentence boundaries where one is near
    for sep in ("\n", "。", ". "):
        cut = text.rfind(sep, max(0, start - 60), start + 1)
        if cut != -1:
            start = cut + len(sep)
            break
    snippet = text[start : start + width].strip()
    return ("…" if start > 0 else "") + snippet + ("…" if start + width < len(text) else "")


def extractive(question: str, hits: list[Hit], max_passages: int = MAX_PASSAGES) -> Answer:
    """The best passages, one per note, with numbered citations."""
    citations: list[Citation] = []
    seen: set[str] = set()
    for hit in hits:
        if hit.note_id in seen:
            continue
        seen.add(hit.note_id)
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
