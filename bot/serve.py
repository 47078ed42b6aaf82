"""``leanote-rag serve``: one asyncio process that keeps the index a mirror of Leanote.

APScheduler (``AsyncIOScheduler``) runs the incremental sync every ``sync.interval``
(``max_instances=1``, ``coalesce=True``: a slow sync is never run twice at once)
and the reconcile daily at ``sync.reconcile_at``. Syncs run in a worker thread,
so the event loop stays free for the bots' questions, which are answered from the
existing index while Leanote is down. An account that fails is retried on its
backoff schedule, sooner than the interval when that is shorter.

One process, because the embedded index allows one opener: the CLI, scripts and
monitoring reach it through its API (``bot.api.app``); ``trigger()`` (the bots' ``/sync``)
runs a sync now, debounced. SIGHUP (``systemctl reload``) re-reads the config: what
can change while running changes at once, the rest is named in the log as needing a
restart. Under systemd (``Type=notify``) it reports READY, RELOADING, STOPPING and
watchdog pings. SIGTERM/SIGINT stop within seconds: the
scheduler and the bots stop, a running pass is asked to stop (it ends at its next
note, page or embedding batch, HTTP calls in flight are cut; what it committed
stays, and the next start carries on), the index is closed.

Long: the daemon's life (open, serve, reload, stop) and the scheduling of passes, which share its
state.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import threading
import time
from datetime import datetime, timedelta
from typing import Awaitable, Callable

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from rag import config as config_mod
from rag.answer.service import AnswerService
from rag.config import Settings
from rag.errors import DiskFull, LeanoteRagError, StoreLocked, UserError
from rag.answer.feedback import KEEP_DAYS, FeedbackStore
from rag.index.note_index import NoteIndex
from rag.index import embed as embed_mod
from rag.index import lexical
from rag.redact import safe_url

from bot.api import app as api
from sync.writeback.capture import Capture
from bot.api.client import find_daemon
from bot.api.metrics import Metrics
from sync.faults import ServeLock, check_disk, state_fault
from sync.memory_jobs import MemoryJobs
from bot.api.metrics_wiring import attach_metrics
from bot.notify import Notifier
from bot.root import Parts
from sync.service import PassResult, SyncService
from sync.state import State

log = logging.getLogger(__name__)
SCHEDULER_LOG = "apscheduler.scheduler.serve"  # one per process, as every logger

# The long-running parts beside the sync (the chat bots, the file watcher): called with
# the daemon, they run until it stops. ``bot.root.services()`` names them.
Service = Callable[["Daemon"], Awaitable[None]]


ROOM_LOOK = 2.0  # seconds between looks at the free space while the disk is full
CHAT_SYNC_WAIT = 600.0  # seconds /sync waits for its pass before it says "still syncing"

class Daemon:
    def __init__(self, settings: Settings, services: list[Service], clock=time.time):
        self.settings = settings
        self.services = list(services)  # what runs beside the sync (``bot.root.services``)
        self.clock = clock
        self.index: NoteIndex | None = None
        self.answers: AnswerService | None = None
        self.state: State | None = None
        self.sync: SyncService | None = None
        self.scheduler: AsyncIOScheduler | None = None
        self._long_pass: logging.Filter | None = None  # on APScheduler's logger while serving
        self.stopping = asyncio.Event()
        self.passes = 0
        self.last_pass: PassResult | None = None
        self.pass_done = asyncio.Condition()
        self._last_trigger = 0.0
        self._rerun = False  # a trigger came while a pass was running
        self._in_pass = False  # a scheduled pass (the job) is under way, from start to bookkeeping
        self.not_ready: str | None = None  # why the index is not open yet (the API's health says it)
        self.systemd = Notifier()  # never waits; a no-op outside systemd (no NOTIFY_SOCKET)
        self.metrics = Metrics()  # GET /metrics answers even while the index is still opening
        self._reader: State | None = None  # for reads in worker threads, behind _reader_lock
        self._reader_lock = threading.Lock()
        self._user_ids: dict[str, str] = {}  # API account email -> Leanote user id, read after each pass
        self.parts: Parts | None = None  # what open() builds (bot.root), closed together
        self.capture: Capture | None = None  # writing from chat into Leanote (sync.writeback.capture)
        self.feedback: FeedbackStore | None = None  # the bots' answers, and each asker's 👍/👎
        self._sync_after_write: asyncio.TimerHandle | None = None
        self.memory_jobs: MemoryJobs | None = None  # the memory's LLM tier (sync.memory_jobs)
        self._room_watch: asyncio.Task | None = None  # while the disk is full: looks for room (_watch_for_room)

    # --- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        try:
            self.parts = parts = Parts(self.settings, create=True, scheduled=True, clock=self.clock)
            self.state = parts.state
            self.state.verify()  # a file with damaged pages would fail every pass: said now, and serve exits
            self._reader = parts.reader  # for reads in worker threads
            self.index = parts.index
            embed_mod.warm(self.index.embedder)  # the model loaded before ready, even behind a vector cache
            lexical.warm()  # and the CJK tokenizer
            self.sync = parts.sync
            self.answers = parts.answers
            self.capture = parts.capture(on_written=self._written)
            self.feedback = parts.feedback
            self._forget_old_feedback()
            attach_metrics(self.metrics, self.sync, self.answers, self.settings.state_dir)
        except BaseException:
            self.close()
            raise

    async def _open_when_free(self) -> bool:
        """Open the index, waiting while another process (a one-shot `leanote-rag index`)
        holds it; the API meanwhile says why it is not ready. False when stopped first."""
        while not self.stopping.is_set():
            try:
                await asyncio.to_thread(self.open)  # loading the model may take a while: the API answers meanwhile
                if self.stopping.is_set():
                    return False
                self._user_ids = await asyncio.to_thread(self._read_user_ids)
                self.not_ready = None
                return True
            except StoreLocked as err:
                if self.not_ready is None:
                    log.warning("waiting for the index: %s", err)
                self.not_ready = str(err)
            try:
                await asyncio.wait_for(self.stopping.wait(), timeout=2.0)
            except asyncio.TimeoutError:
                pass
        return False

    @property
    def memory(self):
        """The memory as the bots and the API read it (None while off or not made yet)."""
        return self.parts.memory_to_read if self.parts is not None else None

    def close(self) -> None:
        with self._reader_lock:
            for part in ("capture", "feedback", "answers", "_reader", "sync", "index", "state"):
                setattr(self, part, None)
            if self.parts is not None:
                self.parts.close()
                self.parts = None

    async def run(self) -> None:
        """Serve until SIGTERM/SIGINT (or ``stop()``)."""
        loop = asyncio.get_running_loop()
        for sig, handler in ((signal.SIGTERM, self.stop), (signal.SIGINT, self.stop), (signal.SIGHUP, self.reload)):
            try:
                loop.add_signal_handler(sig, handler)
            except (NotImplementedError, RuntimeError):  # not the main thread (tests)
                pass
        # One serve per state directory, decided before anything is opened or bound: an OS lock
        # (two started at the same instant cannot both pass it). Then enough room on the disk.
        lock = ServeLock(self.settings.state_dir).acquire()
        try:
            check_disk(self.settings.state_dir)  # the index writes through mapped files: no room is a crash
            if await asyncio.to_thread(find_daemon, self.settings) is not None:  # another state dir, this socket
                raise UserError(f"leanote-rag serve already runs with the API socket {self.settings.api.socket}: "
                                f"stop it first (systemctl stop leanote-rag), or give this one another api.socket")
            await self._serve()
        finally:
            lock.release()

    async def _measure_llm(self) -> None:
        """The LLM's speed, measured once at start when it is not known yet, so the first
        question's evidence is sized to it (``AnswerService.measure``)."""
        if self.answers is None:
            return
        try:
            line = await self.answers.measure()
        except LeanoteRagError as err:
            log.info("could not measure the LLM's speed at start (%s): the first answer measures it", err)
            return
        if line:
            log.info("%s", line)

    async def _serve(self) -> None:
        tasks: list[asyncio.Task] = []
        try:
            if self.settings.api.enabled:  # first: it says "not ready" while the index is busy
                tasks.append(asyncio.create_task(self._supervise(api.service)))
            if not await self._open_when_free():
                return
            # A job that comes due while the loop is busy (a loaded machine) still runs, once:
            # APScheduler's default grace of 1 s would skip it, the first pass until the next interval.
            self.scheduler = AsyncIOScheduler(job_defaults={"misfire_grace_time": None, "coalesce": True},
                                              logger=self._scheduler_log())
            cfg = self.settings.sync
            hour, minute = (int(x) for x in cfg.reconcile_at.split(":"))
            self.scheduler.add_job(
                self._pass, IntervalTrigger(seconds=cfg.interval), id="sync", name="incremental sync",
                max_instances=1, coalesce=True, next_run_time=datetime.now(),
            )
            self.scheduler.add_job(
                self._pass, CronTrigger(hour=hour, minute=minute), id="reconcile", name="daily reconcile",
                kwargs={"reconcile": True}, max_instances=1, coalesce=True,
            )
            self.scheduler.add_job(
                self._forget_old_feedback, CronTrigger(hour=hour, minute=minute), id="feedback",
                name="forget old answers", max_instances=1, coalesce=True,
            )
            self.scheduler.start()
            log.info("serving: sync every %g s, reconcile daily at %s, index in %s",
                     cfg.interval, cfg.reconcile_at, self.index.store.location)
            tasks += [asyncio.create_task(self._supervise(service)) for service in self.services]
            tasks.append(asyncio.create_task(self._watchdog()))
            tasks.append(asyncio.create_task(self.capture.run(self.stopping)))
            # the memory's LLM tier: never while an answer holds the LLM (sync.memory_jobs)
            self.memory_jobs = self.parts.memory_jobs
            tasks.append(asyncio.create_task(self.memory_jobs.run(self.stopping)))
            tasks.append(asyncio.create_task(self._measure_llm()))
            self.systemd.notify("READY=1\nSTATUS=serving")
            await self.stopping.wait()
        finally:
            log.info("stopping")
            self.systemd.notify("STOPPING=1")
            self.stopping.set()
            if self._sync_after_write is not None:
                self._sync_after_write.cancel()
            if self.scheduler and self.scheduler.running:
                self.scheduler.shutdown(wait=False)
            if self._long_pass is not None:
                logging.getLogger(SCHEDULER_LOG).removeFilter(self._long_pass)
                self._long_pass = None
            # a pass in its worker thread stops at its next safe point; meanwhile the services see
            # `stopping` and end on their own (the API answers what it is answering), and whatever
            # is still running after a moment is cancelled. Then the pass is waited for, and closed.
            wound_down = None
            if self.sync:
                self.sync.request_stop()
                wound_down = asyncio.ensure_future(asyncio.to_thread(self.sync.lock.acquire))
            if tasks:
                _, late = await asyncio.wait(tasks, timeout=3.0)
                for task in late:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            if wound_down is not None:
                await wound_down
            self.close()
            self.systemd.close()
            log.info("stopped")

    def stop(self) -> None:
        self.stopping.set()

    def _scheduler_log(self) -> logging.Logger:
        """APScheduler's logger, less its WARNING at every interval a pass outruns: said once
        per pass that does, at INFO (the next pass starts when it ends; nothing is wrong). The
        filter is this daemon's: it comes off the logger (one per process) when the daemon stops
        (a filter left by a daemon before, in the same process, said a later one's long passes
        with its own interval, once, and then held them back)."""
        daemon = self
        said: set[int] = set()

        class LongPass(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                if "maximum number of running instances" not in record.getMessage():
                    return True
                if daemon.passes not in said:
                    said.add(daemon.passes)
                    log.info("a sync pass is taking longer than sync.interval (%g s): the next starts when it ends",
                             daemon.settings.sync.interval)
                return False

        logger, self._long_pass = logging.getLogger(SCHEDULER_LOG), LongPass()
        logger.addFilter(self._long_pass)
        return logger

    async def _watchdog(self) -> None:
        """Under systemd's WatchdogSec=: a ping every half period while the event loop runs
        (a loop that hangs stops pinging, and systemd restarts the service)."""
        usec = os.environ.get("WATCHDOG_USEC")
        if not usec or not usec.isdigit() or os.environ.get("WATCHDOG_PID", str(os.getpid())) != str(os.getpid()):
            return
        while not self.stopping.is_set():
            self.systemd.notify("WATCHDOG=1")
            try:
                await asyncio.wait_for(self.stopping.wait(), timeout=int(usec) / 2e6)
            except asyncio.TimeoutError:
                pass

    def reload(self) -> None:
        """SIGHUP: read the config file again and apply what can change while running."""
        self.systemd.notify("RELOADING=1")
        try:
            path = self.settings.config_path
            if path is None:
                log.error("reload: this daemon was not started from a config file; nothing to re-read")
                return
            try:
                new = config_mod.load(path)
            except UserError as err:
                log.error("reload refused, the running configuration stays: %s", err)
                return
            merged, live, restart = self.settings.reloaded(new)
            self._apply(merged, live)
            if live or restart:
                log.info("reloaded %s: %s%s", path, ", ".join(live) or "nothing that applies while running",
                         f"; needs a restart to apply: {', '.join(restart)}" if restart else "")
            else:
                log.info("reloaded %s: no change", path)
        finally:
            self.systemd.notify("READY=1\nSTATUS=serving")

    def _apply(self, settings: Settings, live: list[str]) -> None:
        self.settings = settings
        if self.parts is not None:
            self.parts.apply(settings)
        if "log_level" in live:
            logging.getLogger().setLevel(settings.log_level)
        if self.scheduler is not None and self.scheduler.running:
            if "sync.interval" in live:
                self.scheduler.reschedule_job("sync", trigger=IntervalTrigger(seconds=settings.sync.interval))
            if "sync.reconcile_at" in live:
                hour, minute = (int(x) for x in settings.sync.reconcile_at.split(":"))
                self.scheduler.reschedule_job("reconcile", trigger=CronTrigger(hour=hour, minute=minute))
            if "exclude" in live:  # the next pass sees new rules and reconciles: run it now, or right
                self.trigger(debounce=False)  # after the one running (the scheduler would drop it)

    async def _supervise(self, service: Service) -> None:
        """Run a service; if it fails (network down), retry with backoff without stopping
        the sync or the other services. A service whose configuration is wrong (a token
        missing or refused) stops with one clear error: retrying cannot fix it."""
        name = getattr(service, "label", None) or f"{service.__module__}.{getattr(service, '__name__', service)}"
        failures = 0
        while not self.stopping.is_set():
            try:
                await service(self)
                return
            except asyncio.CancelledError:
                raise
            except UserError as err:
                log.error("%s stopped: %s", name, err)
                return
            except Exception as err:
                failures += 1
                delay = self.sync.backoff(failures) if self.sync else 30.0
                log.warning("%s failed (%s); restarting in %.0f s", name, safe_url(str(err)) or type(err).__name__, delay)
                try:
                    await asyncio.wait_for(self.stopping.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass

    # --- syncing --------------------------------------------------------------------------

    async def _pass(self, reconcile: bool = False, force: bool = False) -> PassResult | None:
        """A scheduled pass (the interval, the daily reconcile, a trigger); a trigger that
        came while it ran gets one more pass right after (the first may have missed it)."""
        self._in_pass = True
        try:
            while True:
                result = await asyncio.to_thread(self.sync.run_pass, reconcile, force)
                await self._after_pass(result)
                if not self._rerun or self.stopping.is_set():
                    return result
                self._rerun, reconcile = False, False
        except asyncio.CancelledError:
            if self.stopping.is_set():  # the scheduler's shutdown: run() waits for the pass itself
                return None
            raise
        finally:
            self._in_pass = False

    async def sync_now(self, reconcile: bool = False, rebuild: bool = False, progress=None) -> PassResult:
        """A pass now, whatever the backoff says (the API's /sync, `leanote-rag index`);
        it waits for a pass already running."""
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
                self._user_ids = await asyncio.to_thread(self._read_user_ids)
            self._schedule_retry(due)
            job = self.scheduler.get_job("sync")
            if result.fault is None and job is not None and job.next_run_time is not None:
                await asyncio.to_thread(self._record_next_run, job.next_run_time.timestamp())
        except (sqlite3.Error, OSError) as err:  # bookkeeping for `status`: the next pass says what is wrong
            log.debug("after the pass: %s", err)
        async with self.pass_done:
            self.pass_done.notify_all()

    async def _watch_for_room(self) -> None:
        """While passes wait for room on the disk: look at the free space every ``ROOM_LOOK``
        seconds (one statvfs), and as soon as there is room again, sync then rather than at
        the next backoff step, which may be half an hour away."""
        while not self.stopping.is_set() and self.sync is not None and isinstance(self.sync.fault, DiskFull):
            try:
                await asyncio.wait_for(self.stopping.wait(), timeout=ROOM_LOOK)
                return
            except asyncio.TimeoutError:
                pass
            try:
                await asyncio.to_thread(check_disk, self.settings.state_dir)
            except DiskFull:
                continue
            if self.sync is not None and isinstance(self.sync.fault, DiskFull):
                log.info("there is room on the disk again: syncing now")
                self.sync.fault_until = 0.0
                self.trigger(debounce=False)
            return

    def reading(self, work):
        """``work(state)`` on the daemon's reading connection to the state (in a worker
        thread; one reader at a time), or None while the daemon starts or stops."""
        with self._reader_lock:
            if self._reader is None:
                return None
            return work(self._reader)

    def _next_due(self) -> float | None:
        """The earliest time an account in backoff may run again (in a worker thread)."""
        with self._reader_lock:
            if self._reader is None:
                return None
            dues = [a.next_run for a in self._reader.accounts() if a.next_run and a.last_error]
        return min(dues) if dues else None

    def _read_user_ids(self) -> dict[str, str]:
        """API accounts' emails and their Leanote user ids, as synced (in a worker thread)."""
        with self._reader_lock:
            if self._reader is None:
                return {}
            return {a.account: a.user_id for a in self._reader.accounts() if a.user_id}

    def _schedule_retry(self, due: float | None) -> None:
        """An account in backoff may be due before the next interval run: run then (also
        passes held back by a full disk: ``sync.fault_until``)."""
        if self.sync is not None and self.sync.fault is not None and self.sync.fault_until != float("inf"):
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

    def paused(self) -> bool:
        """Whether the sync waits out a fault of every account's (the disk full, the state file
        damaged): no pass runs before ``sync.fault_until``, whoever asks."""
        sync = self.sync
        return sync is not None and sync.fault is not None and self.clock() < sync.fault_until

    def trigger(self, debounce: bool = True) -> bool:
        """Run a sync now (the bots' /sync, the file watcher). Debounced unless told not to:
        False when a trigger came less than ``sync.trigger_debounce`` ago, or while the sync
        is paused (``paused``: its retry is scheduled; a trigger would be a pass for nothing)."""
        now = self.clock()
        if self.paused():
            return False
        if debounce and now - self._last_trigger < self.settings.sync.trigger_debounce:
            return False
        self._last_trigger = now
        if self.scheduler is None:
            return False
        if self._in_pass:  # the running pass may have missed the change: once more right after it
            self._rerun = True
        else:  # (a pass started through the API holds the lock: this one waits for it)
            self.scheduler.modify_job("sync", next_run_time=datetime.now() + timedelta(milliseconds=1))
        return True

    async def sync_for_chat(self, wait: float = CHAT_SYNC_WAIT) -> str:
        """The bots' ``/sync`` (admins): a pass now, and what it did, in words for chat; or why
        none runs (paused by a fault, or one just ran)."""
        if self.paused():
            problems = "; ".join(p["problem"] for p in self.problems())
            return f"同步暂停中，没有开始。 / The sync is paused, nothing started: {problems}"
        after = self.passes + (1 if self._in_pass else 0)  # a pass under way: the one after it
        if not self.trigger():
            return "刚刚同步过，稍等再试。 / A sync just ran; try again shortly."
        try:
            async with self.pass_done:
                await asyncio.wait_for(self.pass_done.wait_for(lambda: self.passes > after), wait)
        except asyncio.TimeoutError:
            return (f"还在同步（已超过 {wait / 60:.0f} 分钟）；/status 会显示结果。 / Still syncing after "
                    f"{wait / 60:.0f} min; /status shows how it ends.")
        result = self.last_pass
        if result is None or result.stopped:
            return "服务正在停止，同步没做完。 / The service is stopping: the sync did not finish."
        if result.fault is not None:
            return f"同步暂停 / The sync is paused: {result.fault}"
        line = result.summary.line()
        if result.ok:
            return f"同步完成 ✅ / Synced: {line}"
        failures = "; ".join(f"{account}: {error}" for account, error in result.failures.items())
        return f"同步有失败 / The sync failed for some: {failures}. ({line})"

    def _forget_old_feedback(self) -> None:
        if self.feedback is not None:
            gone = self.feedback.forget(time.time() - KEEP_DAYS * 86400)
            if gone:
                log.info("forgot %d answers older than %d days (feedback)", gone, KEEP_DAYS)

    def _written(self) -> None:
        """A capture reached Leanote: a pass soon, so it is searchable within seconds
        (writes close together share one pass)."""
        if self._sync_after_write is not None or self.stopping.is_set():
            return

        def go() -> None:
            self._sync_after_write = None
            if not self.stopping.is_set() and self.scheduler is not None and self.scheduler.running:
                self.trigger(debounce=False)

        self._sync_after_write = asyncio.get_running_loop().call_later(self.settings.capture.sync_after, go)

    # --- for the bots (bot.chat.common.Host) ------------------------------------------------------

    def problems(self) -> list[dict]:
        """What keeps the sync from working, for ``status``: ``{"kind", "problem"}``, the
        problem saying the fix."""
        fault = self.sync.fault if self.sync is not None else None
        if fault is None:
            return []
        kind = "disk_full" if isinstance(fault, DiskFull) else "state_broken"
        return [{"kind": kind, "problem": f"{fault} (sync {self.sync.waiting()})"}]

    def resolve_user_name(self, name: str) -> str:
        """A Leanote user id, given an id or the email (login name) of an API account, as
        ``users:`` and ``--user`` take them."""
        return self.user_for_email(name.strip().lower()) or name

    def user_for_email(self, email: str) -> str | None:
        """The Leanote user id of an API account, once it has synced (as of the last pass:
        asked on every message and request, it reads no file)."""
        return self._user_ids.get(email)

    def status_text(self, user_id: str | None = None) -> str:
        """Sync status for chat: an admin (``user_id`` None) sees every account with its
        last error; anyone else sees only their own account, without error details.
        It reads the state: call it in a worker thread (``asyncio.to_thread``)."""
        with self._reader_lock:
            if self._reader is None:
                return "the daemon is starting or stopping: try again in a moment"
            try:
                return self._status_text(user_id)
            except sqlite3.DatabaseError as err:  # damaged: the admin is told what to do
                fault = state_fault(err, self._reader.path)
                if fault is None:
                    raise
                return f"problem: {fault}" if user_id is None else "the sync status cannot be read now (the admin can see why)"

    def _status_text(self, user_id: str | None) -> str:
        lines = []
        for a in self._reader.accounts():
            mine = a.user_id == user_id or (not self.settings.source.incremental and user_id is not None)
            if user_id is not None and not mine:
                continue
            when = time.strftime("%m-%d %H:%M", time.localtime(a.last_success)) if a.last_success else "never"
            if user_id is None:
                lag = f"USN {a.cursor}/{a.server_usn} " if a.server_usn is not None else ""
                line = f"{a.account}: {lag}last sync {when}"
                if a.last_error:
                    line += f"; failing: {a.last_error[:200]}"
            else:
                line = f"last sync {when}"
                if a.last_error:
                    line += "; the last sync failed (the admin can see why)"
            lines.append(line)
        counts = self._reader.counts_by_user()
        if user_id is None:
            lines.append("notes indexed: " + (", ".join(f"{u}: {n}" for u, n in counts.items()) or "0"))
            skipped = self._reader.skipped()
            if skipped:
                lines.append(f"not indexed: {len(skipped)} unreadable note(s), e.g. {skipped[0]['origin']}: "
                             f"{skipped[0]['reason'][:150]}")
        else:
            lines.append(f"your notes indexed: {counts.get(user_id, 0)}")
        if self.capture is not None:  # (each person's own captures, an admin's all)
            lines += self.capture.status_lines(user_id)
        if user_id is None:  # the disk full, the state damaged: with the fix
            lines += [f"problem: {p['problem']}" for p in self.problems()]
        return "\n".join(lines)

    async def wait_for_pass(self, after: int) -> PassResult:
        """Wait until more than ``after`` passes have completed."""
        async with self.pass_done:
            await self.pass_done.wait_for(lambda: self.passes > after)
        return self.last_pass
