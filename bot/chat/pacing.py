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


LINE_EDIT_EVERY = 5.0  # seconds, per job ahead, between two edits of an "in line" message
LINE_EDIT_MOST = 60.0  # ... and never longer than this


class Coalesced:
    """One message that says how many jobs are ahead in the media line, as that number falls: shown
    at once the first time, then edited at most once per ``every`` seconds for each job that was ahead
    when it last said so (5 s with one ahead, a minute with twelve or more: ``most``), the changes in
    between coalesced into one edit with the latest. Told at each change, 30 clips sent at once made one
    edit per clip ahead per message, 465 (the square of the clips); paced so, a message far back in line
    says its number again only when it has fallen by a good part: 59 edits when the line moves every
    2 s, and however long it moves, under one a second for the chat (tests/test_door_costs.py). ``now`` shows a value at once (the job's turn came);
    ``close`` ends it: nothing is shown after, and an edit under way is waited for, so the message's
    last word is the caller's."""

    def __init__(self, show: Callable[[int], Awaitable[None]], every: float = LINE_EDIT_EVERY,
                 most: float = LINE_EDIT_MOST, clock: Callable[[], float] = time.monotonic, sleep=asyncio.sleep):
        self.show, self.every, self.most, self.clock, self.sleep = show, every, most, clock, sleep
        self.latest = 0
        self.said: int | None = None  # the number it shows
        self.said_at = 0.0
        self._due: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def __call__(self, ahead: int) -> None:
        self.latest = ahead
        if self._closed or self._due is not None:
            return  # an edit is due: it shows the latest
        if self.said is None:
            await self._show()
            return
        left = min(self.most, self.every * max(1, self.said)) - (self.clock() - self.said_at)
        if left <= 0:
            await self._show()
        else:
            self._due = asyncio.create_task(self._later(left))

    async def now(self, ahead: int) -> None:
        self.latest = ahead
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

    async def _later(self, wait: float) -> None:
        await self.sleep(wait)
        self._due = None
        await self._show()

    async def _show(self) -> None:
        async with self._lock:
            if self._closed:
                return
            self.said, self.said_at = self.latest, self.clock()
            await self.show(self.latest)
