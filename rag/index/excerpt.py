"""The passage of a text that best matches a question: for citations and extractive answers."""

from __future__ import annotations

import re
from pathlib import Path

from rag.index.lexical import tokenize
from rag.index.translate import chinese_terms

EXCERPT_CHARS = 500

_SENTENCE = re.compile(r"[。！？!?；;\n]+|\.(?=\s)|$")
CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_FILLER = set("的了是在要吗呢么吧啊和与及或就都也很还有没不把被让给对从这那哪什怎么样如何为个")


def question_terms(query: str, translate: bool = True, glossary_dir: Path | None = None) -> dict[str, float]:
    """Terms to look for, with weights: Latin words, CJK character pairs, and (weakly)
    single CJK characters, since jieba may glue a verb to a particle ("要炖") that the
    note never writes together. A question in English also looks for the Chinese words its
    words translate to (``rag.index.translate``, its glossary kept in ``glossary_dir``), unless
    ``translate`` is off."""
    terms = {t: 1.0 for t in tokenize(query) if not CJK_RUN.search(t)}
    if translate:
        terms.update(dict.fromkeys(chinese_terms(query, glossary_dir), 1.0))
    for run in CJK_RUN.findall(query):
        for ch in run:
            if ch not in _FILLER:
                terms.setdefault(ch, 0.3)
        for i in range(len(run) - 1):
            terms[run[i : i + 2]] = 1.0
    return terms


def _window(text: str, query: str, width: int, terms: dict[str, float] | None = None) -> tuple[float, int]:
    """(score, start) of the sentence that best matches the query. A term's weight falls
    with how often the text repeats it, so a question's rare words choose the sentence,
    not the topic word that is everywhere. ``terms``: ``question_terms(query)``, when the
    caller has them already."""
    lowered = text.lower()
    weights = question_terms(query) if terms is None else terms
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


def excerpt(text: str, query: str, width: int = EXCERPT_CHARS, terms: dict[str, float] | None = None) -> str:
    """The window of ``text`` (about ``width`` chars) that best matches the query (``terms``:
    as for ``_window``)."""
    text = text.strip()
    if len(text) <= width:
        return text
    _, best = _window(text, query, width, terms)
    start = max(0, min(best - width // 5, len(text) - width))
    # begin on a line or sentence boundary where one is near
    for sep in ("\n", "。", ". "):
        cut = text.rfind(sep, max(0, start - 60), start + 1)
        if cut != -1:
            start = cut + len(sep)
            break
    snippet = text[start : start + width].strip()
    head, tail = open_fence(text, start), open_fence(text, start + width)
    if head is not None:  # begun inside a code block: opened again, so its code reads as code
        snippet = f"{head}\n{snippet}"
    if tail is not None:  # cut inside one: closed, so what follows it (a notice, the sources) is no code
        snippet = f"{snippet}\n{tail.strip()[:fence_len(tail)]}"
    sep = "\n" if head is not None else ""
    return ("…" + sep if start > 0 else "") + snippet + (("\n" if tail is not None else "") + "…"
                                                          if start + width < len(text) else "")


_FENCE_LINE = re.compile(r"^[ \t]*((```+|~~~+)[^\n]*)", re.M)


def fence_len(line: str) -> int:
    line = line.strip()
    return len(line) - len(line.lstrip(line[0]))


def open_fence(text: str, at: int) -> str | None:
    """The line that opened the code block ``at`` is in (a fence of three or more backticks or
    tildes, its language with it), None when ``at`` is in none."""
    opener: str | None = None
    for m in _FENCE_LINE.finditer(text, 0, at):
        fence = m.group(2)
        if opener is None:
            opener = m.group(1).strip()
        elif fence[0] == opener[0] and len(fence) >= fence_len(opener) and not m.group(1)[len(fence):].strip():
            opener = None
    return opener


def closed(text: str) -> str:
    """``text`` with a code block it leaves open closed (what follows it is no code)."""
    opener = open_fence(text, len(text))
    return text if opener is None else f"{text.rstrip()}\n{opener[:fence_len(opener)]}"
