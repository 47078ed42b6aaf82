"""How much of a request any step reads: one size for a question, ``limits.question_chars``.

The doors check before any work: the API answers 413 and the CLI exits 2 (``check``), the
bots cut the message and tell the person (``cut``). Inside, the answer pipeline, the search
and the memory cut again, so whoever calls them, no step (retrieval, the memory's name
matching, the conversation history, the LLM prompt) reads more than the limit, and none
does work in proportion to what it was sent.
"""

from __future__ import annotations

import re
import time
from collections import deque

from rag.errors import TooLarge

SCAN = 4  # characters read per character kept, while collapsing whitespace
_TEXT = re.compile(r"\S")


def cut(text: str | None, limit: int) -> tuple[str, bool]:
    """``text`` as every step sees a question (whitespace collapsed), at most ``limit``
    characters, and whether some of it was left out. However long ``text`` is, about
    ``SCAN * limit`` characters of it are read."""
    text = text or ""
    first = _TEXT.search(text)
    if first is None:
        return "", False
    end = first.start() + SCAN * limit + 1
    words = " ".join(text[first.start() : end].split())
    if len(words) > limit:
        return words[:limit].rstrip(), True
    return words, _TEXT.search(text, end) is not None


def check(text: str | None, limit: int, what: str = "the question") -> str:
    """``text`` as ``cut`` makes it, or ``TooLarge`` when it is longer than ``limit``."""
    kept, over = cut(text, limit)
    if over:
        raise TooLarge(f"{what} is too long: {len(text):,} characters, at most {limit:,} are read "
                       f"(limits.question_chars). Shorten it, or raise limits.question_chars in the config")
    return kept


ECHOED = 64  # characters of what a person sent (an id, a user) that an error message repeats


def echoed(text: object, most: int = ECHOED) -> str:
    """What an error message repeats of something a person sent: all of it when short, else
    its first ``most`` characters and "…". A 5,000-character id repeated whole buries the
    message, on a screen, in a chat and in the log."""
    text = str(text)
    return text if len(text) <= most else text[:most] + "…"


class PerMinute:
    """At most ``most()`` events a minute per key (a token, a person): ``take`` counts one
    when there is room and answers 0, else the seconds until there is; nothing counted."""

    KEYS = 10_000  # keys remembered at most (older ones are forgotten once their minute is over)

    def __init__(self, most, clock=time.monotonic):
        self.most, self.clock = most, clock
        self._seen: dict[str, deque[float]] = {}

    def take(self, key: str) -> float:
        now = self.clock()
        window = self._seen.setdefault(key, deque())
        while window and now - window[0] >= 60:
            window.popleft()
        if len(window) >= self.most():
            return 60 - (now - window[0])
        window.append(now)
        if len(self._seen) > self.KEYS:
            self._seen = {k: w for k, w in self._seen.items() if w and now - w[-1] < 60}
        return 0.0
