"""Fair shares of the LLM: whoever asks, one caller's many questions never push another
caller's first one behind them.

- ``Turns``: each caller (an API token, a chat person, the local CLI) has at most ``n``
  answers under way at once; the rest wait in that caller's own line, in order. So a
  hundred questions from one token take two places in the search threads and the LLM's
  queue, not a hundred.
- ``FairSlots``: the LLM's slots (``bots.max_concurrent_llm``) go round the callers waiting
  for one, one call each in turn, instead of first come first served.

Both are keyed by ``CALLER`` (a context variable the answer service sets for each question,
so the expansion, the follow-up's rewrite and the answer itself are the same caller's).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import AsyncIterator, Callable

CALLER: ContextVar[str] = ContextVar("leanote_rag_caller", default="")


class FairSlots:
    """``size`` slots, given round-robin between the keys waiting for one (FIFO within a key)."""

    def __init__(self, size: int):
        self.size = size
        self.busy = 0
        self._waiting: OrderedDict[str, deque[asyncio.Future]] = OrderedDict()  # the next key first

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        await self._acquire(key)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, key: str) -> None:
        if self.busy < self.size and not self._waiting:
            self.busy += 1
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(future)
        try:
            await future  # granted: the slot was counted as ours when it was handed over
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # handed over just as it was cancelled
                self._release()
            else:
                self._forget(key, future)
            raise

    def _forget(self, key: str, future: asyncio.Future) -> None:
        line = self._waiting.get(key)
        if line is not None and future in line:
            line.remove(future)
            if not line:
                del self._waiting[key]

    def _release(self) -> None:
        self.busy -= 1
        while self._waiting and self.busy < self.size:
            key, line = next(iter(self._waiting.items()))
            future = line.popleft()
            del self._waiting[key]
            if line:  # its next question goes to the back of the round
                self._waiting[key] = line
            if not future.done():
                self.busy += 1
                future.set_result(None)


class Turns:
    """At most ``n()`` answers under way per key; more wait, in order, in that key's line."""

    def __init__(self, n: Callable[[], int]):
        self.n = n
        self._held: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}

    @asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        semaphore = self._held.get(key)
        if semaphore is None:
            semaphore = self._held[key] = asyncio.Semaphore(self.n())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with semaphore:
                yield
        finally:
            self._users[key] -= 1
            if not self._users[key]:  # nobody holds or waits: forget the key
                del self._users[key]
                del self._held[key]
