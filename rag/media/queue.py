"""The one line every media job waits in: one job's step at a time on this machine (a
transcription or an OCR takes both cores), people taking turns.

A job is a generator that yields steps (callables run in the line's worker thread, each
under a lock file, so a second process with the same state folder waits too) and is sent
each step's result back; what it returns is the job's result. A long clip is several steps
(its pieces), and after each step the next person with work has their turn: a short clip
waits for at most one piece of each clip ahead of it, never for a whole long one. Someone's
own jobs keep their order.

Whoever waits is told how many jobs are ahead of theirs (``on_wait(n)``) when it joins and
each time that number falls, until it starts (``on_wait(0)``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import logging
import threading
from collections import deque
from pathlib import Path
from typing import Any, Awaitable, Callable, Generator

log = logging.getLogger(__name__)

Job = Generator[Callable[[], Any], Any, Any]


class _Entry:
    def __init__(self, person: str, job: Job, on_wait: Callable[[int], None] | None):
        self.person, self.job, self.on_wait = person, job, on_wait
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.step: Callable[[], Any] | None = None  # the next step (None: not started)
        self.told: int | None = None  # the last "ahead" number told


class Line:
    """The line (``lock_path``: the lock file held while a step runs; None: none)."""

    def __init__(self, lock_path: Path | None = None):
        self.lock_path = lock_path
        self._cond = threading.Condition()
        self._jobs: dict[str, deque[_Entry]] = {}  # person -> their jobs, in order
        self._turns: deque[str] = deque()  # people with jobs, whose turn is next first
        self._order: list[_Entry] = []  # every job in the line, as they joined
        self._thread: threading.Thread | None = None
        self._closed = False
        self.running: _Entry | None = None

    # --- joining ------------------------------------------------------------------------------

    def submit(self, person: str, job: Job, on_wait: Callable[[int], None] | None = None) -> concurrent.futures.Future:
        entry = _Entry(person, job, on_wait)
        with self._cond:
            if self._closed:
                raise RuntimeError("the media line is closed")
            if person not in self._jobs:
                self._jobs[person] = deque()
                self._turns.append(person)
            self._jobs[person].append(entry)
            self._order.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="media-line", daemon=True)
                self._thread.start()
            self._tell()
            self._cond.notify_all()
        return entry.future

    async def run(self, person: str, job: Job, on_wait: Callable[[int], Awaitable[None]] | None = None) -> Any:
        """The job's result, from the event loop: ``on_wait`` is awaited on this loop; a
        caller cancelled drops the job from the line."""
        loop = asyncio.get_running_loop()
        def tell(n: int) -> None:
            loop.call_soon_threadsafe(lambda: loop.create_task(_quietly(on_wait(n))))

        future = self.submit(person, job, tell if on_wait is not None else None)
        return await asyncio.wrap_future(future)

    def ahead(self) -> int:
        """How many jobs are in the line now (running or waiting)."""
        with self._cond:
            return len(self._order)

    # --- the worker ---------------------------------------------------------------------------

    def _tell(self) -> None:
        """Each waiting job told how many are ahead of it, when that changed (under the lock)."""
        for position, entry in enumerate(self._order):
            n = 0 if entry is self.running or entry.step is not None else position
            if entry.on_wait is not None and (entry.told is None or n < entry.told):
                entry.told = n
                try:
                    entry.on_wait(n)
                except Exception:
                    log.exception("telling a media job's place in line failed")

    def _next(self) -> _Entry | None:
        """The job whose step runs next: the first job of the person whose turn it is."""
        while self._turns:
            person = self._turns[0]
            jobs = self._jobs[person]
            while jobs and jobs[0].future.cancelled():
                self._drop(jobs[0])
            if jobs:
                return jobs[0]
            self._turns.popleft()
            del self._jobs[person]
        return None

    def _drop(self, entry: _Entry) -> None:
        jobs = self._jobs.get(entry.person)
        if jobs and jobs[0] is entry:
            jobs.popleft()
        with contextlib.suppress(ValueError):
            self._order.remove(entry)
        entry.job.close()

    def _work(self) -> None:
        while True:
            with self._cond:
                entry = self._next()
                while entry is None and not self._closed:
                    self._cond.wait()
                    entry = self._next()
                if entry is None:
                    return
                self.running = entry
                if entry.step is None:
                    self._start(entry)
                self._tell()
            if entry.step is not None and not entry.future.cancelled():
                self._step(entry)
            with self._cond:
                self.running = None
                if entry.future.done() or entry.step is None:
                    self._drop(entry)
                if entry.person in self._jobs:  # their turn is over: everyone else with work goes first
                    self._turns.remove(entry.person)
                    self._turns.append(entry.person)
                self._tell()

    def _start(self, entry: _Entry) -> None:
        self._advance(entry, lambda: entry.job.send(None))

    def _step(self, entry: _Entry) -> None:
        """One step of ``entry``, then the job is sent its result (or the error) for the next one."""
        try:
            with self._locked():
                result = entry.step()
        except Exception as err:
            self._advance(entry, lambda failed=err: entry.job.throw(failed))
            return
        self._advance(entry, lambda: entry.job.send(result))

    @staticmethod
    def _advance(entry: _Entry, resume: Callable[[], Callable[[], Any]]) -> None:
        """The job resumed: its next step, or its end (a result or an error) settled on its future."""
        try:
            entry.step = resume()
            return
        except StopIteration as done:
            outcome = ("result", done.value)
        except Exception as err:
            outcome = ("error", err)
        entry.step = None
        if not entry.future.cancelled():
            if outcome[0] == "result":
                entry.future.set_result(outcome[1])
            else:
                entry.future.set_exception(outcome[1])

    @contextlib.contextmanager
    def _locked(self):
        if self.lock_path is None:
            yield
            return
        with open(self.lock_path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def close(self) -> None:
        """Jobs still waiting are cancelled; the step running finishes in its thread."""
        with self._cond:
            self._closed = True
            for entry in self._order:
                if entry is not self.running:
                    entry.future.cancel()
            self._cond.notify_all()


async def _quietly(awaitable: Awaitable[None]) -> None:
    try:
        await awaitable
    except Exception:
        log.warning("telling a person their place in the media line failed", exc_info=True)
