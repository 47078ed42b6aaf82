"""How often a person may ask, and how often a refusal is said again: what every chat session
shares, kept once per process by the composition root (``bot.root.Parts.rates``).

Each person may ask ``bots.rate_limit`` questions a minute (a search, ``/about`` and ``/related``
count as questions), wherever they ask: the count is kept by the person's key (``telegram:111``),
whatever door or chat they write from. A refusal or a hint to the same person (a stranger, a group
not enabled) is said at most once every ``NOTICE_EVERY`` seconds."""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

NOTICE_EVERY = 600.0  # seconds between two refusals (or hints) to the same person


class Rates:
    def __init__(self, per_minute: Callable[[], int], clock: Callable[[], float] = time.monotonic):
        """``per_minute``: the questions a person may ask a minute, read at each question (a
        reload of ``bots.rate_limit`` applies at once)."""
        self.per_minute = per_minute
        self.clock = clock
        self._asked: dict[str, deque[float]] = {}
        self._noticed: dict[tuple, float] = {}

    def wait(self, person: str) -> float:
        """0 when ``person`` may ask now (and counts the question), else the seconds to wait."""
        now = self.clock()
        window = self._asked.setdefault(person, deque())
        while window and now - window[0] >= 60:
            window.popleft()
        if len(window) >= self.per_minute():
            return 60 - (now - window[0])
        window.append(now)
        if len(self._asked) > 10_000:  # many people: forget those quiet for a minute
            self._asked = {k: w for k, w in self._asked.items() if w and now - w[-1] < 60}
        return 0.0

    def once_in_a_while(self, key: tuple) -> bool:
        """True at most once every ``NOTICE_EVERY`` seconds per key (for refusals and hints)."""
        now = self.clock()
        last = self._noticed.get(key)
        if last is not None and now - last < NOTICE_EVERY:
            return False
        self._noticed[key] = now
        if len(self._noticed) > 10_000:  # many strangers: forget the old ones
            self._noticed = {k: t for k, t in self._noticed.items() if now - t < NOTICE_EVERY}
        return True
