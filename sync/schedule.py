"""The daemon's schedule: when the sync passes run.

APScheduler (``AsyncIOScheduler``, on the daemon's event loop) runs the incremental pass every
``sync.interval`` (``max_instances=1``, ``coalesce=True``: a slow pass is never run twice at
once) and the reconcile daily at ``sync.reconcile_at``, with the daily chores it is given
beside it. A pass runs in a worker thread, so the event loop stays free for the doors. An
account that fails is retried on its backoff schedule, sooner than the interval when that is
shorter; while a fault of every account's holds (the disk full, the state damaged) no pass
runs before it is due, and a full disk is looked at every ``ROOM_LOOK`` seconds so the sync
resumes as soon as there is room.

``trigger()`` asks for a pass now (a chat's ``/sync``, the file watcher, a capture written):
debounced, and once more right after a running pass that may have missed the change.
``sync_now()`` runs one now whatever the backoff says (the API's ``/sync``, ``index``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from datetime import datetime, timedelta
from typing import Awaitable, Callable

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from rag.config import Settings
from rag.errors import DiskFull

from sync.faults import check_disk
from sync.service import PassResult, SyncService
from sync.state import State

log = logging.getLogger(__name__)


def cron(day: str, at: str, tz) -> CronTrigger:
    """A trigger at ``at`` (HH:MM) every day (``day`` "*") or on one weekday (mon..sun), in the
    time zone ``tz`` (a ``ZoneInfo``): the wall clock's time there, across DST changes."""
    hour, minute = (int(x) for x in at.split(":"))
    return CronTrigger(day_of_week=day, hour=hour, minute=minute, timezone=tz)


SCHEDULER_LOG = "apscheduler.scheduler.serve"  # one per process, as every logger
ROOM_LOOK = 2.0  # seconds between looks at the free space while the disk is full


class Schedule:
    """The passes of one daemon: scheduled, triggered, retried, and what the last one did.

    ``reader``: a connection to the state for reads off the event loop (the backoff's due
    times, the accounts' Leanote users), one reader at a time (``reading``). ``chores``: what
    runs daily at ``sync.reconcile_at`` beside the reconcile (forgetting old answers)."""

    def __init__(self, settings: Settings, sync: SyncService, state: State, reader: State,
                 chores: list[Callable[[], None]] = (), clock=None):
        self.settings = settings
        self.sync = sync
        self.state = state
        self._reader: State | None = reader
        self._reader_lock = threading.Lock()
        self.chores = list(chores)
        self.clock = clock or sync.clock
        self.scheduler: AsyncIOScheduler | None = None
        self._long_pass: logging.Filter | None = None  # on APScheduler's logger while running
        self.stopping = asyncio.Event()
        self.passes = 0
        self.last_pass: PassResult | None = None
        self.pass_done = asyncio.Condition()
        self._last_trigger = 0.0
        self._rerun = False  # a trigger came while a pass was running
        self.in_pass = False  # a scheduled pass (the job) is under way, from start to bookkeeping
        self.user_ids: dict[str, str] = {}  # API account email -> Leanote user id, read after each pass
        self._soon: asyncio.TimerHandle | None = None  # a pass asked for after a write (``soon``)
        self._room_watch: asyncio.Task | None = None  # while the disk is full: looks for room
        # what runs after each pass that did not fail (the knowledge gaps' check), one at a time,
        # off the pass's bookkeeping: a slow one never delays the next pass
        self.after: list[Callable[[], Awaitable[object]]] = []
        self._after_task: asyncio.Task | None = None

    # --- start and stop -------------------------------------------------------------------

    async def start(self) -> None:
        """Schedule the passes (the first at once) and the daily chores."""
        self.user_ids = await asyncio.to_thread(self._read_user_ids)
        # A job that comes due while the loop is busy (a loaded machine) still runs, once:
        # APScheduler's default grace of 1 s would skip it, the first pass until the next interval.
        self.scheduler = AsyncIOScheduler(job_defaults={"misfire_grace_time": None, "coalesce": True},
                                          logger=self._scheduler_log())
        cfg = self.settings.sync
        self.scheduler.add_job(self._pass, IntervalTrigger(seconds=cfg.interval), id="sync", name="incremental sync",
                               max_instances=1, coalesce=True, next_run_time=datetime.now())
        self.scheduler.add_job(self._pass, self._daily(), id="reconcile", name="daily reconcile",
                               kwargs={"reconcile": True}, max_instances=1, coalesce=True)
        for i, chore in enumerate(self.chores):
            self.scheduler.add_job(chore, self._daily(), id=f"chore{i}", name=getattr(chore, "__name__", "a chore"),
                                   max_instances=1, coalesce=True)
        self.scheduler.start()

    def _daily(self) -> CronTrigger:
        hour, minute = (int(x) for x in self.settings.sync.reconcile_at.split(":"))
        return CronTrigger(hour=hour, minute=minute)

    def stop(self) -> None:
        """No more passes: the scheduler stops, a pass asked for goes; a running pass is asked
        to stop at its next safe point (``wound_down`` waits for it)."""
        self.stopping.set()
        if self._soon is not None:
            self._soon.cancel()
        if self._after_task is not None:
            self._after_task.cancel()
        if self.scheduler and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self._long_pass is not None:
            logging.getLogger(SCHEDULER_LOG).removeFilter(self._long_pass)
            self._long_pass = None
        self.sync.request_stop()

    async def wound_down(self) -> None:
        """Until a pass under way has stopped (it holds the sync's lock while it runs)."""
        await asyncio.to_thread(self.sync.lock.acquire)

    def close(self) -> None:
        with self._reader_lock:
            self._reader = None

    def apply(self, settings: Settings, live: list[str]) -> None:
        """New settings (a reload): the interval and the reconcile's time at once; new privacy
        rules mean a reconcile, run now or right after the pass under way."""
        self.settings = settings
        if self.scheduler is None or not self.scheduler.running:
            return
        if "sync.interval" in live:
            self.scheduler.reschedule_job("sync", trigger=IntervalTrigger(seconds=settings.sync.interval))
        if "sync.reconcile_at" in live:
            self.scheduler.reschedule_job("reconcile", trigger=self._daily())
        if "exclude" in live:  # (the scheduler would drop a run asked for while one runs)
            self.trigger(debounce=False)

    def _scheduler_log(self) -> logging.Logger:
        """APScheduler's logger, less its WARNING at every interval a pass outruns: said once
        per pass that does, at INFO (the next pass starts when it ends; nothing is wrong). The
        filter is this schedule's: it comes off the logger (one per process) when it stops (a
        filter left by a daemon before, in the same process, said a later one's long passes
        with its own interval, once, and then held them back)."""
        schedule = self
        said: set[int] = set()

        class LongPass(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                if "maximum number of running instances" not in record.getMessage():
                    return True
                if schedule.passes not in said:
                    said.add(schedule.passes)
                    log.info("a sync pass is taking longer than sync.interval (%g s): the next starts when it ends",
                             schedule.settings.sync.interval)
                return False

        logger, self._long_pass = logging.getLogger(SCHEDULER_LOG), LongPass()
        logger.addFilter(self._long_pass)
        return logger

    # --- other timed work on the same scheduler (the digests: ``bot.digests``) ------------------

    def add_cron(self, job_id: str, work, args: list, day: str, at: str, tz, grace: float) -> None:
        """``work(*args)`` at ``at`` on ``day`` in ``tz`` (``cron``), one run at a time; runs missed
        while the loop was busy are one run (``coalesce``), a late one within ``grace`` seconds
        still runs. Replaces a job of that id. Safe from a worker thread."""
        self.scheduler.add_job(work, cron(day, at, tz), args=args, id=job_id, name=job_id, coalesce=True,
                               max_instances=1, misfire_grace_time=int(grace), replace_existing=True)

    def remove_cron(self, job_id: str) -> None:
        if self.scheduler.get_job(job_id) is not None:
            self.scheduler.remove_job(job_id)

    def next_run(self, job_id: str) -> datetime | None:
        job = self.scheduler.get_job(job_id) if self.scheduler is not None else None
        return job.next_run_time if job is not None else None

    # --- passes ---------------------------------------------------------------------------

    async def _pass(self, reconcile: bool = False, force: bool = False) -> PassResult | None:
        """A scheduled pass (the interval, the daily reconcile, a trigger); a trigger that
        came while it ran gets one more pass right after (the first may have missed it)."""
        self.in_pass = True
        try:
            while True:
                result = await asyncio.to_thread(self.sync.run_pass, reconcile, force)
                await self._after_pass(result)
                if not self._rerun or self.stopping.is_set():
                    return result
                self._rerun, reconcile = False, False
        except asyncio.CancelledError:
            if self.stopping.is_set():  # the scheduler's shutdown: the daemon waits for the pass itself
                return None
            raise
        finally:
            self.in_pass = False

    async def sync_now(self, reconcile: bool = False, rebuild: bool = False, progress=None) -> PassResult:
        """A pass now, whatever the backoff says; it waits for a pass already running."""
        result = await asyncio.to_thread(self.sync.run_pass, reconcile, True, rebuild, progress)
        await self._after_pass(result)
        return result

    async def _after_pass(self, result: PassResult) -> None:
        if result.stopped:
            return
        if isinstance(result.fault, DiskFull) and (self._room_watch is None or self._room_watch.done()):
            self._room_watch = asyncio.create_task(self._watch_for_room())
        self.last_pass = result
        self.passes += 1
        summary = result.summary
        if summary.changed or summary.skipped:
            log.info("synced: %s", summary.line())
        due = None
        try:
            if result.fault is None:  # (a state that cannot be read or written is the pass's to report)
                due = await asyncio.to_thread(self._next_due)
                self.user_ids = await asyncio.to_thread(self._read_user_ids)
            self._schedule_retry(due)
            job = self.scheduler.get_job("sync") if self.scheduler else None
            if result.fault is None and job is not None and job.next_run_time is not None:
                await asyncio.to_thread(self._record_next_run, job.next_run_time.timestamp())
        except (sqlite3.Error, OSError) as err:  # bookkeeping for `status`: the next pass says what is wrong
            log.debug("after the pass: %s", err)
        if result.fault is None and self.after and (self._after_task is None or self._after_task.done()):
            self._after_task = asyncio.create_task(self._run_after())
        async with self.pass_done:
            self.pass_done.notify_all()

    async def _run_after(self) -> None:
        for work in self.after:
            if self.stopping.is_set():
                return
            try:
                await work()
            except Exception:  # what follows a pass never stops the sync; the next pass tries again
                log.exception("after the pass: %s failed", getattr(work, "__name__", "a step"))

    async def wait_for_pass(self, after: int) -> PassResult:
        """Wait until more than ``after`` passes have completed."""
        async with self.pass_done:
            await self.pass_done.wait_for(lambda: self.passes > after)
        return self.last_pass

    async def _watch_for_room(self) -> None:
        """While passes wait for room on the disk: look at the free space every ``ROOM_LOOK``
        seconds (one statvfs), and as soon as there is room again, sync then rather than at
        the next backoff step, which may be half an hour away."""
        while not self.stopping.is_set() and isinstance(self.sync.fault, DiskFull):
            try:
                await asyncio.wait_for(self.stopping.wait(), timeout=ROOM_LOOK)
                return
            except asyncio.TimeoutError:
                pass
            try:
                await asyncio.to_thread(check_disk, self.settings.state_dir)
            except DiskFull:
                continue
            if isinstance(self.sync.fault, DiskFull):
                log.info("there is room on the disk again: syncing now")
                self.sync.fault_until = 0.0
                self.trigger(debounce=False)
            return

    # --- reads of the state, off the event loop -----------------------------------------------

    def reading(self, work):
        """``work(state)`` on the schedule's reading connection to the state (in a worker
        thread; one reader at a time), or None once the daemon closes."""
        with self._reader_lock:
            if self._reader is None:
                return None
            return work(self._reader)

    def _next_due(self) -> float | None:
        """The earliest time an account in backoff may run again (in a worker thread)."""
        dues = self.reading(lambda state: [a.next_run for a in state.accounts() if a.next_run and a.last_error])
        return min(dues) if dues else None

    def _read_user_ids(self) -> dict[str, str]:
        """API accounts' emails and their Leanote user ids, as synced (in a worker thread)."""
        return self.reading(lambda state: {a.account: a.user_id for a in state.accounts() if a.user_id}) or {}

    def _schedule_retry(self, due: float | None) -> None:
        """An account in backoff may be due before the next interval run: run then (also
        passes held back by a full disk: ``sync.fault_until``)."""
        if self.sync.fault is not None and self.sync.fault_until != float("inf"):
            due = min(due or self.sync.fault_until, self.sync.fault_until)
        job = self.scheduler.get_job("sync") if self.scheduler else None
        if due is None or job is None or job.next_run_time is None:
            return
        when = datetime.fromtimestamp(due, tz=job.next_run_time.tzinfo)
        if when < job.next_run_time:
            self.scheduler.modify_job("sync", next_run_time=when)

    def _record_next_run(self, when: float) -> None:
        """For `status`: when healthy accounts sync next. Under the sync lock: the state's
        connection is used by one thread at a time."""
        with self.sync.lock, self.state.transaction():
            for acc in self.state.accounts():
                if not acc.last_error:
                    acc.next_run = when
                    self.state.put_account(acc)

    # --- asking for a pass ------------------------------------------------------------------

    def paused(self) -> bool:
        """Whether the sync waits out a fault of every account's (the disk full, the state file
        damaged): no pass runs before ``sync.fault_until``, whoever asks."""
        return self.sync.fault is not None and self.clock() < self.sync.fault_until

    def problems(self) -> list[dict]:
        """What keeps the sync from working: ``{"kind", "problem"}``, the problem saying the fix."""
        fault = self.sync.fault
        if fault is None:
            return []
        kind = "disk_full" if isinstance(fault, DiskFull) else "state_broken"
        return [{"kind": kind, "problem": f"{fault} (sync {self.sync.waiting()})"}]

    def trigger(self, debounce: bool = True) -> bool:
        """Run a pass now. Debounced unless told not to: False when a trigger came less than
        ``sync.trigger_debounce`` ago, or while the sync is paused (``paused``: its retry is
        scheduled; a trigger would be a pass for nothing)."""
        now = self.clock()
        if self.paused():
            return False
        if debounce and now - self._last_trigger < self.settings.sync.trigger_debounce:
            return False
        self._last_trigger = now
        if self.scheduler is None:
            return False
        if self.in_pass:  # the running pass may have missed the change: once more right after it
            self._rerun = True
        else:  # (a pass started through the API holds the lock: this one waits for it)
            self.scheduler.modify_job("sync", next_run_time=datetime.now() + timedelta(milliseconds=1))
        return True

    def soon(self) -> None:
        """A pass in ``capture.sync_after`` seconds (a capture reached Leanote: searchable within
        seconds; writes close together share one pass)."""
        if self._soon is not None or self.stopping.is_set():
            return

        def go() -> None:
            self._soon = None
            if not self.stopping.is_set() and self.scheduler is not None and self.scheduler.running:
                self.trigger(debounce=False)

        self._soon = asyncio.get_running_loop().call_later(self.settings.capture.sync_after, go)
