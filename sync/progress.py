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
import unicodedata
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
    eta: float | None = None  # the seconds left as the process making the pass told them (the API's events)

    def left(self, now: float | None = None) -> float | None:
        """Seconds left, estimated from the time so far; None until there is enough to go on."""
        if self.eta is not None:
            return self.eta
        if not self.done or self.done < 0.02 or self.done >= 1:
            return None
        elapsed = (time.monotonic() if now is None else now) - self.started
        return elapsed * (1 - self.done) / self.done

    def line(self, width: int | None = None, before: str = "") -> str:
        """``before``, the account and how far it got; in ``width`` columns when given: the
        counts, the share done and the time left are what a person waits for, so the account
        (a long path, say) is shortened in its middle first, then the chunks and the page
        go, then the account."""
        page = f"page {self.page}" if self.page else ""
        notes = f"{self.notes:,}" + (f"/{self.total:,}" if self.total is not None else "") + " notes read"
        chunks = f"{self.chunks:,} chunks embedded"
        share = f"{min(self.done, 1.0):.0%}" if self.done is not None else ""
        left = self.left()
        eta = f"about {_duration(left)} left" if left is not None else ""
        rest = _join(page, notes, chunks, share, eta)
        full = f"{before}{self.account}: {rest}"
        if width is None or columns(full) <= width:
            return full
        for rest in (rest, _join(page, notes, share, eta), _join(notes, share, eta)):
            room = width - columns(before) - 2 - columns(rest)
            if room >= MIN_ACCOUNT:
                return f"{before}{middle(self.account, room)}: {rest}"
        return cut(f"{before}{rest}", width)

    def as_json(self) -> dict:
        left = self.left()
        return {"account": self.account, "seen": self.notes, "embedded": self.chunks, "page": self.page,
                "done": None if self.done is None else round(min(self.done, 1.0), 4), "total": self.total,
                "eta_seconds": None if left is None else round(left), "line": self.line()}

    @classmethod
    def from_json(cls, event: dict) -> "Step":
        """A step another process told (``as_json``: the API's ``progress`` events)."""
        return cls(event.get("account") or "", event.get("seen") or 0, event.get("embedded") or 0,
                   event.get("page") or 0, event.get("done"), event.get("total"), eta=event.get("eta_seconds"))


MIN_ACCOUNT = 16  # columns: less of a path or an address says nothing of which it is


def _join(*parts: str) -> str:
    return ", ".join(p for p in parts if p)


def columns(text: str) -> int:
    """The columns ``text`` takes on a terminal: a Chinese character takes two."""
    return sum(_width(ch) for ch in text)


def _width(ch: str) -> int:
    return 2 if unicodedata.east_asian_width(ch) in "FW" else 1


def _fitting(chars, width: int) -> int:
    """How many of ``chars`` fit in ``width`` columns."""
    used = n = 0
    for ch in chars:
        used += _width(ch)
        if used > width:
            break
        n += 1
    return n


def middle(text: str, width: int) -> str:
    """``text`` in ``width`` columns, its middle replaced by "…" when it is longer: a path
    keeps its start and its last folders."""
    if columns(text) <= width:
        return text
    head = _fitting(text, (width - 1) // 2)
    tail = _fitting(reversed(text), width - 1 - columns(text[:head]))
    return f"{text[:head]}…{text[len(text) - tail:]}"


def cut(text: str, width: int) -> str:
    """``text`` in ``width`` columns, its end replaced by "…" when it is longer."""
    if columns(text) <= width:
        return text
    return text[:_fitting(text, width - 1)] + "…"


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
