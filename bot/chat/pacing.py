"""Streaming an answer into one chat message at a steady pace: edits at most once per interval,
the platform's wait requests honoured, the sources shown first."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable


class Wait(Exception):
    """The platform asked us to slow down for this many seconds."""

    def __init__(self, seconds: float):
        super().__init__(f"retry in {seconds:g} s")
        self.seconds = seconds


class Pacer:
    """Streams an answer into one message: collects text as it arrives and edits the
    message at most once per ``interval``, honouring the platform's wait requests.

    ``show_first(head)`` puts a head above the text (the sources an answer reads, before
    the LLM's first token): shown at once when no edit went out yet, else as soon as
    the interval allows."""

    CURSOR = " ▌"

    def __init__(self, edit: Callable[[str], Awaitable[None]], interval: float,
                 clock: Callable[[], float] = time.monotonic, sleep=asyncio.sleep):
        self.edit = edit
        self.interval = interval
        self.clock = clock
        self.sleep = sleep
        self.head = ""
        self.text = ""
        self.sent = ""
        self.edits: list[float] = []  # when each edit went out (for tests and the benchmark)
        self._done = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def feed(self, piece: str) -> None:
        self.text += piece

    def show_first(self, head: str) -> None:
        self.head = head
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._pump())

    def _shown(self) -> str:
        if not self.text:
            return f"{self.head}\n\n…" if self.head else ""
        return (f"{self.head}\n\n" if self.head else "") + self.text + self.CURSOR

    async def _pause(self) -> None:
        """The interval, or less when a head came: at once if nothing was edited yet, else
        once the interval since the last edit is over."""
        sleeping = asyncio.ensure_future(self.sleep(self.interval))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeping, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            woken.cancel()
        if self._wake.is_set():
            self._wake.clear()
            if self.edits:
                left = self.interval - (self.clock() - self.edits[-1])
                if left > 0:
                    await self.sleep(left)

    async def _pump(self) -> None:
        while not self._done.is_set():
            await self._pause()
            if self._done.is_set():
                return
            shown = self._shown()
            if shown and shown != self.sent:
                try:
                    await self.edit(shown)
                    self.sent = shown
                    self.edits.append(self.clock())
                except Wait as wait:
                    await self.sleep(wait.seconds)
                except Exception:  # a failed intermediate edit is not worth an answer
                    pass

    async def stop(self) -> None:
        self._done.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


LINE_EDIT_EVERY = 5.0  # seconds between two edits of one "in line" message


class Coalesced:
    """One message that says a changing number (how many jobs are ahead in the media line): shown
    at once the first time, then edited at most once per ``every`` seconds, the changes between two
    edits coalesced into one with the latest (30 clips in line made 210 edits, one per clip ahead
    per message: now a message waiting a minute is edited about 12 times, however many are ahead).
    ``now`` shows a value at once (the job's turn came); ``close`` ends it: nothing is shown after,
    and an edit under way is waited for, so the message's last word is the caller's."""

    def __init__(self, show: Callable[[object], Awaitable[None]], every: float = LINE_EDIT_EVERY,
                 clock: Callable[[], float] = time.monotonic, sleep=asyncio.sleep):
        self.show, self.every, self.clock, self.sleep = show, every, clock, sleep
        self.latest: object = None
        self.shown_at: float | None = None
        self.shows = 0
        self._due: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def __call__(self, value) -> None:
        self.latest = value
        if self._closed or self._due is not None:
            return  # an edit is due: it shows the latest
        left = 0.0 if self.shown_at is None else self.every - (self.clock() - self.shown_at)
        if left <= 0:
            await self._show()
        else:
            self._due = asyncio.create_task(self._later(left))

    async def now(self, value) -> None:
        self.latest = value
        self._cancel()
        await self._show()

    async def close(self) -> None:
        self._closed = True
        self._cancel()
        async with self._lock:  # an edit under way ends first
            pass

    def _cancel(self) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None

    async def _later(self, left: float) -> None:
        await self.sleep(left)
        self._due = None
        await self._show()

    async def _show(self) -> None:
        async with self._lock:
            if self._closed:
                return
            self.shown_at = self.clock()
            self.shows += 1
            await self.show(self.latest)
