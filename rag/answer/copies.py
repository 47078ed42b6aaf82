"""How much of a note's own text an answer to a question in another language may copy.

Asked in English about Chinese notes, a small model is told to copy the sentences that answer
first and then answer in English (``answer.prompt_english: quote``); the 1.5B often pastes the
note's Chinese wholesale instead (every sentence of it stands on its block, so the check shows
all of it): a page of Chinese is no answer to an English question. ``Bound`` passes a reply's
checked units on as ``rag.answer.support.Gate`` does, and once the units in the notes' script it
passed hold ``COPY_CHARS`` characters, leaves the rest of them out (``Verdict.cut``; the model's
English sentences still pass): the note's words that answer come first, and the whole note is
one link away, under the answer. A question in Chinese gets its answer in the notes' words, as
long as the note says it: nothing is bounded there.
"""

from __future__ import annotations

import re

from rag.answer.support import Check, Checker, Gate, shown
from rag.language import chinese

COPY_CHARS = 300  # characters of the notes' script an answer to a question in another language may copy

_CJK = re.compile(r"[\u3400-\u9fff]")
_LATIN = re.compile(r"[A-Za-z]")


def foreign(text: str) -> bool:
    """Is a unit in the notes' script: more CJK characters than Latin letters?"""
    return len(_CJK.findall(text)) > len(_LATIN.findall(text))


class Bound:
    """A ``Gate`` whose units in the notes' script, past ``limit`` characters, are left out
    (for a question not asked in Chinese; any other question passes as the gate has it)."""

    def __init__(self, gate: Gate, question: str, limit: int = COPY_CHARS):
        self.gate = gate
        self.limit = None if chinese(question) else limit
        self.copied = 0  # characters of the notes' script passed on
        self.seen = 0  # the gate's verdicts read so far

    def feed(self, piece: str) -> str:
        out = self.gate.feed(piece)
        return self._bounded(out)

    def flush(self) -> str:
        return self._bounded(self.gate.flush())

    def _bounded(self, out: str) -> str:
        new = self.gate.verdicts[self.seen:]
        self.seen = len(self.gate.verdicts)
        if self.limit is None:
            return out
        for v in new:
            if v.kind != "supported" or v.code or not foreign(v.text):
                continue
            if self.copied >= self.limit:
                v.cut = True
            else:
                self.copied += len(v.text.strip())
        return "".join(shown(v) for v in new)

    def cut(self) -> str:
        """The reply was stopped mid-unit (``Gate.cut``): that unit left out, the rest bounded."""
        return self._bounded(self.gate.cut())

    @property
    def verdicts(self):
        return self.gate.verdicts

    @property
    def result(self) -> Check:
        return self.gate.result


def check(reply: str, question: str, blocks: dict[int, tuple[str, str]], translate=None) -> Check:
    """``rag.answer.support.check``, bounded as the service bounds a reply it streams."""
    bound = Bound(Gate(Checker(question, blocks, translate)), question)
    bound.feed(reply)
    bound.flush()
    return bound.result
