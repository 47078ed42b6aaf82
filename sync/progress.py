"""How far a sync pass has got, for whoever waits for it: per source and account, the page
of changes, notes read and chunks embedded, the share done and the time left.

The indexer and the incremental sync report a ``Step`` as they go (``Progress``); what it
becomes is the caller's: a line kept up to date on a terminal (``leanote-rag index``), a
line a minute otherwise (under systemd, piped, in the daemon's log), NDJSON events on the
API (``POST /sync``).

The share done: a snapshot source knows how many notes it holds; a live source (Leanote's
API, MongoDB) is read in USN order, so how far the USN of the notes read is between the
cursor the pass started from and the server's USN is the share of the changes read (a
first index: of every note). The time left is the time so far stretched to the whole.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)

EVERY = 60.0  # seconds between two lines where no line can be kept up to date


@dataclass
class Step:
    account: str  # a live source's account, or a snapshot source's name
    notes: int = 0  # notes read in this pass (of this account)
    chunks: int = 0  # chunks embedded
    page: int = 0  # pages of changes read (live sources)
    done: float | None = None  # the share of the work done, when it can be told
    total: int | None = None  # the notes there are (a snapshot source)
    started: float = field(default_factory=time.monotonic)

    def left(self, now: float | None = None) -> float | None:
        """Seconds left, estimated from the time so far; None until there is enough to go on."""
        if not self.done or self.done < 0.02 or self.done >= 1:
            return None
        elapsed = (time.monotonic() if now is None else now) - self.started
        return elapsed * (1 - self.done) / self.done

    def line(self) -> str:
        parts = [f"page {self.page}"] if self.page else []
        parts.append(f"{self.notes:,}" + (f"/{self.total:,}" if self.total is not None else "") + " notes read")
        parts.append(f"{self.chunks:,} chunks embedded")
        if self.done is not None:
            parts.append(f"{min(self.done, 1.0):.0%}")
        left = self.left()
        if left is not None:
            parts.append(f"about {_duration(left)} left")
        return f"{self.account}: " + ", ".join(parts)

    def as_json(self) -> dict:
        left = self.left()
        return {"account": self.account, "seen": self.notes, "embedded": self.chunks, "page": self.page,
                "done": None if self.done is None else round(min(self.done, 1.0), 4), "total": self.total,
                "eta_seconds": None if left is None else round(left), "line": self.line()}


Progress = Callable[[Step], None]


def nothing(step: Step) -> None:
    """A progress nobody reads."""


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


class Every:
    """A progress said at most once every ``every`` seconds (and for each new account), by
    ``say``: a log line in the daemon, a line on stderr for ``index`` off a terminal."""

    def __init__(self, say: Callable[[str], None], every: float = EVERY, clock=time.monotonic, first: bool = True):
        self.say, self.every, self.clock, self.first = say, every, clock, first
        self._last: float | None = None  # when the last line was said
        self._started: float | None = None  # the first step
        self._account: str | None = None

    def __call__(self, step: Step) -> None:
        self.say_line(step, step.line())

    def say_line(self, step: Step, line: str) -> None:
        """``line`` (``step`` as said elsewhere) when it is time: an account's first step (with
        ``first``), then a minute after the last line (without ``first``: a minute into the pass)."""
        now = self.clock()
        if self._started is None:
            self._started = now
        new = step.account != self._account
        self._account = step.account
        due = now - (self._last if self._last is not None else self._started) >= self.every
        if (new and self.first) or due:
            self.say(line)
            self._last = now


def in_the_log(level: int = logging.INFO) -> Every:
    """For the daemon's passes: a line a minute while one lasts longer than that."""
    return Every(lambda text: log.log(level, "syncing %s", text), first=False)
