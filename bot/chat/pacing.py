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
