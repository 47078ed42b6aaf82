"""What the answer service remembers of each conversation (``Conversations``)."""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

from rag.answer.types import Trace


class Conversations:
    """What the service remembers of each conversation: recent turns within a character
    budget and the trace of the last answer, forgotten together after an idle time.

    A conversation is keyed by the Leanote user *and* the caller's conversation id (the
    bots make that id per person: platform, chat and chat user), so one person's turns
    and traces can never reach another person's follow-up or ``/why``."""

    def __init__(self, max_chars: int, idle_reset: float, clock: Callable[[], float] = time.monotonic):
        self.max_chars = max_chars
        self.idle_reset = idle_reset
        self.clock = clock
        self._turns: dict[tuple[str, str], deque[tuple[str, str]]] = {}
        self._traces: dict[tuple[str, str], Trace] = {}
        self._seen: dict[tuple[str, str], float] = {}

    def _live(self, key: tuple[str, str]) -> bool:
        seen = self._seen.get(key)
        if seen is None:
            return False
        if self.clock() - seen > self.idle_reset:
            self._forget(key)
            return False
        return True

    def history(self, user_id: str, conversation: str | None) -> list[tuple[str, str]]:
        key = (user_id, conversation or "")
        if conversation is None or not self._live(key):
            return []
        return list(self._turns.get(key, ()))

    def trace(self, user_id: str, conversation: str) -> Trace | None:
        key = (user_id, conversation)
        return self._traces.get(key) if self._live(key) else None

    def record(self, user_id: str, conversation: str | None, trace: Trace, answer: str | None) -> None:
        """Keep the last trace, and the turn when ``answer`` is given (grounded answers)."""
        if conversation is None:
            return
        key = (user_id, conversation)
        self._live(key)  # an idle conversation starts afresh
        self._traces[key] = trace
        self._seen[key] = self.clock()
        if answer is not None and self.max_chars:
            turns = self._turns.setdefault(key, deque())
            turns.append((trace.standalone, answer))
            while turns and sum(len(q) + len(a) for q, a in turns) > self.max_chars:
                turns.popleft()
        self._prune()

    def reset(self, user_id: str, conversation: str) -> None:
        self._forget((user_id, conversation))

    def _forget(self, key: tuple[str, str]) -> None:
        self._turns.pop(key, None)
        self._traces.pop(key, None)
        self._seen.pop(key, None)

    def _prune(self) -> None:
        """Idle conversations go, so memory does not grow with every person ever seen."""
        if len(self._seen) > 256:
            for key in [k for k, seen in self._seen.items() if self.clock() - seen > self.idle_reset]:
                self._forget(key)

