"""LLM-assisted retrieval for paraphrased questions (``retrieval.expand``).

A person remembers the idea, not the words: "把一串字节复制几次才能送出去" where the
note says "零拷贝". The offline embedder cannot always bridge the two, but the LLM
can name the terms. One short generation, constrained to a JSON schema (Ollama's
``format``), gives the terms a note answering the question would use and one sentence
such a note could contain. They become rankings of their own in the fusion: the terms
through BM25, the sentence through the dense embedding (a "hypothetical answer").

It runs while the first retrieval runs, is cached per question, and never delays the
answer past its budget: when it is not ready in time it is dropped (the trace says so).
With no LLM it is skipped silently. Fused with the same weights as the question's own
rankings, an expansion that repeats the question changes no ranking at all.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from rag.errors import LeanoteRagError
from rag.speed import Usage

log = logging.getLogger(__name__)

SCHEMA = {
    "type": "object",
    "properties": {
        "terms": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "answer": {"type": "string"},
    },
    "required": ["terms", "answer"],
}
SYSTEM = """You help search a person's own notes (technical notes, recipes, life; mostly Chinese, some English).
Given a question, write:
- "terms": up to 8 words a note that answers it would literally contain: the technical terms, names, commands or \
identifiers for what the question describes in everyday words (in the notes' language, and the English technical \
term where one exists);
- "answer": one short sentence such a note could contain, in the question's language.
Reply with JSON only."""
OUTPUT_TOKENS = 96  # terms and one sentence: a few dozen tokens
CACHE_SIZE = 512


@dataclass
class Expansion:
    terms: list[str] = field(default_factory=list)
    answer: str = ""
    seconds: float = 0.0
    cached: bool = False

    @property
    def empty(self) -> bool:
        return not self.terms and not self.answer

    def describe(self) -> str:
        how = "cached" if self.cached else f"{self.seconds:.2f} s"
        return f"expanded ({how}): terms {', '.join(self.terms) or '-'}; hypothetical answer: {self.answer or '-'}"


def parse(text: str) -> Expansion:
    """The LLM's JSON (constrained by SCHEMA, but checked anyway)."""
    try:
        data = json.loads(text)
    except ValueError:
        return Expansion()
    if not isinstance(data, dict):
        return Expansion()
    terms = [t.strip() for t in data.get("terms") or [] if isinstance(t, str) and t.strip()][:8]
    answer = data.get("answer") if isinstance(data.get("answer"), str) else ""
    return Expansion(terms, answer.strip()[:400])


class Expander:
    """One short LLM call per new question, kept in a small cache per person: the
    trace's "cached" never tells one person that another asked the same."""

    def __init__(self, stream):
        self._stream = stream  # AnswerService._stream: the LLM, with its speed learned
        self._cache: OrderedDict[tuple[str, str], Expansion] = OrderedDict()

    async def expand(self, question: str, timeout: float, person: str = "") -> Expansion:
        key = (person, question)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return Expansion(hit.terms, hit.answer, 0.0, cached=True)
        started = time.monotonic()
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        try:
            text = "".join([piece async for piece in self._stream(
                prompt, Usage(), {"num_predict": OUTPUT_TOKENS, "temperature": 0}, format=SCHEMA, timeout=timeout)])
        except LeanoteRagError as err:
            log.debug("no expansion for %r: %s", question, err)
            return Expansion(seconds=time.monotonic() - started)
        expansion = parse(text)
        expansion.seconds = time.monotonic() - started
        if not expansion.empty:
            self._cache[key] = expansion
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return expansion
