"""The one line every media job waits in: one job's step at a time on this machine (a
transcription or an OCR takes both cores), people taking turns.

A job is a generator that yields steps (callables run in the line's worker thread, each
under a lock file, so a second process with the same state folder waits too) and is sent
each step's result back; what it returns is the job's result. A long clip is several steps
(its pieces), and after each step the next person with work has their turn: a short clip
waits for at most one piece of each clip ahead of it, never for a whole long one. Someone's
own jobs keep their order.

A piece already running cannot be stopped, and on a busy machine one takes longer than a short
question lasts. So a quick job (one step: a clip no longer than one piece, or an image) does not
wait behind a long job's piece at all: it runs beside it in the line's second lane, the quick
lane (its own lock file). At most two steps run at once, the second always a quick job's; a
quick job behind another quick job waits its turn as before. A job submitted as quick that
turns out long (a clip is decoded in its first step: its header may have said less) yields
``LONG`` after that step, and goes on in the main lane, a step at a time like any long job.

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
from typing import Any, Awaitable, Callable, Generator, Iterator

log = logging.getLogger(__name__)

Job = Generator[Callable[[], Any], Any, Any]
LONG = object()  # yielded by a job (instead of a step) once it knows it is not one quick step; it is sent None


class _Entry:
    def __init__(self, person: str, job: Job, on_wait: Callable[[int], None] | None, quick: bool):
        self.person, self.job, self.on_wait, self.quick = person, job, on_wait, quick
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.step: Callable[[], Any] | None = None  # the next step (None: not started)
        self.told: int | None = None  # the last "ahead" number told


class Line:
    """The line (``lock_path``: the lock file held while a main-lane step runs, the quick lane's
    beside it with ``.quick`` added; None: none)."""

    def __init__(self, lock_path: Path | None = None, after_step: Callable[[], None] | None = None):
        self.lock_path = lock_path
        self.after_step = after_step  # called in the lane's thread after each step (whatever its outcome)
        self.quick_lock_path = lock_path.with_name(lock_path.name + ".quick") if lock_path else None
        self._cond = threading.Condition()
        self._jobs: dict[str, deque[_Entry]] = {}  # person -> their jobs, in order
        self._turns: deque[str] = deque()  # people with jobs, whose turn is next first
        self._order: list[_Entry] = []  # every job in the line, as they joined
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.running: _Entry | None = None  # the main lane's job
        self.quick: _Entry | None = None  # the quick lane's job

    # --- joining ------------------------------------------------------------------------------

    def submit(self, person: str, job: Job, on_wait: Callable[[int], None] | None = None,
               quick: bool = False) -> concurrent.futures.Future:
        """``quick``: the job is one short step (module docstring)."""
        entry = _Entry(person, job, on_wait, quick)
        with self._cond:
            if self._closed:
                raise RuntimeError("the media line is closed")
            if person not in self._jobs:
                self._jobs[person] = deque()
                self._turns.append(person)
            self._jobs[person].append(entry)
            self._order.append(entry)
            if not self._threads:
                self._threads = [threading.Thread(target=self._work, args=(lane,), name=f"media-line-{lane}",
                                                  daemon=True) for lane in ("main", "quick")]
                for thread in self._threads:
                    thread.start()
            self._claim_quick()
            self._tell()
            self._cond.notify_all()
        return entry.future

    async def run(self, person: str, job: Job, on_wait: Callable[[int], Awaitable[None]] | None = None,
                  quick: bool = False) -> Any:
        """The job's result, from the event loop: ``on_wait`` is awaited on this loop; a
        caller cancelled drops the job from the line."""
        loop = asyncio.get_running_loop()
        def tell(n: int) -> None:
            loop.call_soon_threadsafe(lambda: loop.create_task(_quietly(on_wait(n))))

        future = self.submit(person, job, tell if on_wait is not None else None, quick)
        return await asyncio.wrap_future(future)

    def ahead(self) -> int:
        """How many jobs are in the line now (running or waiting)."""
        with self._cond:
            return len(self._order)

    # --- the worker ---------------------------------------------------------------------------

    def _tell(self) -> None:
        """Each waiting job told how many are ahead of it, when that changed (under the lock)."""
        for position, entry in enumerate(self._order):
            n = 0 if self._busy(entry) or entry.step is not None else position
            if entry.on_wait is not None and (entry.told is None or n < entry.told):
                entry.told = n
                try:
                    entry.on_wait(n)
                except Exception:
                    log.exception("telling a media job's place in line failed")

    def _firsts(self) -> Iterator[_Entry]:
        """Each person's first job, whose turn is next first (the cancelled ones dropped, people
        with no job left out of the turns)."""
        for person in list(self._turns):
            jobs = self._jobs[person]
            while jobs and jobs[0].future.cancelled() and not self._busy(jobs[0]):
                self._drop(jobs[0])
            if jobs:
                yield jobs[0]
            else:
                self._turns.remove(person)
                del self._jobs[person]

    def _next(self) -> _Entry | None:
        """The job whose step the main lane runs next: the first job of the person whose turn it
        is (one the quick lane runs is passed over: a person's jobs keep their order)."""
        return next((entry for entry in self._firsts() if not self._busy(entry)), None)

    def _busy(self, entry: _Entry) -> bool:
        """Is a lane running ``entry``?"""
        return entry is self.running or entry is self.quick

    def _claim_quick(self) -> None:
        """A quick job given the quick lane when a long job's piece holds the main one (under the lock)."""
        if self.quick is None and self.running is not None and not self.running.quick:
            entry = next((e for e in self._firsts() if not self._busy(e) and e.quick and e.step is None), None)
            if entry is not None:
                self.quick = entry
                self._cond.notify_all()

    def _drop(self, entry: _Entry) -> None:
        jobs = self._jobs.get(entry.person)
        if jobs and jobs[0] is entry:
            jobs.popleft()
        with contextlib.suppress(ValueError):
            self._order.remove(entry)
        entry.job.close()

    def _work(self, lane: str) -> None:
        while True:
            with self._cond:
                entry = self._take(lane)
                while entry is None and not self._closed:
                    self._cond.wait()
                    entry = self._take(lane)
                if entry is None:
                    return
                if entry.step is None:
                    self._start(entry)
                self._claim_quick()
                self._tell()
            while entry.step is not None and not entry.future.cancelled():
                self._step(entry, lane)
                if lane == "main" or not entry.quick:
                    break  # one step, then the next person's turn; the quick lane runs a quick job to the end
            with self._cond:
                if lane == "main":
                    self.running = None
                else:
                    self.quick = None
                if entry.future.done() or entry.step is None:
                    self._drop(entry)
                if lane == "main" and entry.person in self._jobs:  # their turn is over: everyone else first
                    self._turns.remove(entry.person)
                    self._turns.append(entry.person)
                self._claim_quick()
                self._tell()
                self._cond.notify_all()

    def _take(self, lane: str) -> _Entry | None:
        """The job this lane runs now, or None (under the lock)."""
        if lane == "quick":
            return self.quick
        if self.running is None:
            entry = self._next()
            if entry is not None:
                self.running = entry
            return entry
        return None

    def _start(self, entry: _Entry) -> None:
        self._advance(entry, lambda: entry.job.send(None))

    def _step(self, entry: _Entry, lane: str) -> None:
        """One step of ``entry``, then the job is sent its result (or the error) for the next one."""
        try:
            with self._locked(self.lock_path if lane == "main" else self.quick_lock_path):
                result = entry.step()
        except Exception as err:
            self._after()
            self._advance(entry, lambda failed=err: entry.job.throw(failed))
            return
        self._after()
        self._advance(entry, lambda: entry.job.send(result))

    def _after(self) -> None:
        if self.after_step is not None:
            try:
                self.after_step()
            except Exception:
                log.exception("after a media step")

    @staticmethod
    def _advance(entry: _Entry, resume: Callable[[], Callable[[], Any]]) -> None:
        """The job resumed: its next step, or its end (a result or an error) settled on its future."""
        try:
            step = resume()
            if step is LONG:  # not quick after all: the rest of it in the main lane
                entry.quick = False
                step = entry.job.send(None)
            entry.step = step
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

    @staticmethod
    @contextlib.contextmanager
    def _locked(path: Path | None):
        if path is None:
            yield
            return
        with open(path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def busy(self) -> bool:
        """Is a step running in either lane?"""
        with self._cond:
            return self.running is not None or self.quick is not None

    def close(self) -> None:
        """Jobs still waiting are cancelled; the step running finishes in its thread."""
        with self._cond:
            self._closed = True
            for entry in self._order:
                if not self._busy(entry):
                    entry.future.cancel()
            self._cond.notify_all()


async def _quietly(awaitable: Awaitable[None]) -> None:
    try:
        await awaitable
    except Exception:
        log.warning("telling a person their place in the media line failed", exc_info=True)
