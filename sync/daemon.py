"""``leanote-rag serve``: one asyncio process that keeps the index a mirror of Leanote.

APScheduler (``AsyncIOScheduler``) runs the incremental sync every ``sync.interval``
(``max_instances=1``, ``coalesce=True``: a slow sync is never run twice at once)
and the reconcile daily at ``sync.reconcile_at``. Syncs run in a worker thread,
so the event loop stays free for the bots' questions, which are answered from the
existing index while Leanote is down. An account that fails is retried on its
backoff schedule, sooner than the interval when that is shorter.

One process, because the embedded index allows one opener; ``trigger()`` (the bots'
``/sync``) runs a sync now, debounced. SIGTERM/SIGINT stop within seconds: the
scheduler and the bots stop, a running pass is asked to stop (it ends at its next
note, page or embedding batch, HTTP calls in flight are cut; what it committed
stays, and the next start carries on), the index is closed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from datetime import datetime, timedelta
from importlib.metadata import entry_points
from typing import Awaitable, Callable

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from rag.answer import AnswerService
from rag.config import Settings
from rag.errors import UserError
from rag.index import NoteIndex
from rag.redact import safe_url

from .service import PassResult, SyncService
from .state import State

log = logging.getLogger(__name__)

# Extra long-running parts (the chat bots) plug in here: called with the daemon,
# they run until it stops. They are found through the ``leanote_rag.services`` entry
# point group, so sync/ never imports bot/.
Service = Callable[["Daemon"], Awaitable[None]]


def discover_services() -> list[Service]:
    services = []
    for ep in entry_points(group="leanote_rag.services"):
        try:
            services.append(ep.load())
        except Exception as err:  # a broken plugin must not stop the sync
            log.warning("cannot load service %s (%s): %s", ep.name, ep.value, err)
    return services


class Daemon:
    def __init__(self, settings: Settings, services: list[Service] | None = None, clock=time.time):
        self.settings = settings
        self.services = discover_services() if services is None else services
        self.clock = clock
        self.index: NoteIndex | None = None
        self.answers: AnswerService | None = None
        self.state: State | None = None
        self.sync: SyncService | None = None
        self.scheduler: AsyncIOScheduler | None = None
        self.stopping = asyncio.Event()
        self.passes = 0
        self.last_pass: PassResult | None = None
        self.pass_done = asyncio.Condition()
        self._last_trigger = 0.0
        self._rerun = False  # a trigger came while a pass was running

    # --- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        self.state = State(self.settings.state_dir)
        self.index = NoteIndex.open(self.settings, create=True)
        self.sync = SyncService(self.settings, self.index, self.state, clock=self.clock)
        self.answers = AnswerService.from_settings(self.settings, self.index)
        self._reader = State(self.settings.state_dir)  # the event loop's own connection, for reads

    def close(self) -> None:
        if getattr(self, "answers", None):
            self.answers.close()
        if getattr(self, "_reader", None):
            self._reader.close()
        if self.sync:
            self.sync.close()
        if self.index:
            self.index.close()
        if self.state:
            self.state.close()

    async def run(self) -> None:
        """Serve until SIGTERM/SIGINT (or ``stop()``)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError):  # not the main thread (tests)
                pass
        self.open()
        tasks: list[asyncio.Task] = []
        try:
            self.scheduler = AsyncIOScheduler()
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
            self.scheduler.start()
            log.info("serving: sync every %.0f s, reconcile daily at %s, index in %s",
                     cfg.interval, cfg.reconcile_at, self.index.store.location)
            tasks = [asyncio.create_task(self._supervise(service)) for service in self.services]
            await self.stopping.wait()
        finally:
            log.info("stopping")
            if self.scheduler and self.scheduler.running:
                self.scheduler.shutdown(wait=False)
            if self.sync:
                self.sync.request_stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # a pass in its worker thread stops at its next safe point; wait for it before closing
            await asyncio.to_thread(self.sync.lock.acquire) if self.sync else None
            self.close()
            log.info("stopped")

    def stop(self) -> None:
        self.stopping.set()

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
        try:
            result = await asyncio.to_thread(self.sync.run_pass, reconcile, force)
        except asyncio.CancelledError:
            if self.stopping.is_set():  # the scheduler's shutdown: run() waits for the pass
                return None
            raise
        if result.stopped:
            return result
        self.last_pass = result
        self.passes += 1
        summary = result.summary
        if summary.changed or summary.skipped:
            log.info("synced: %s", summary.line())
        self._schedule_retry()
        if self._rerun:
            self._rerun = False
            self.scheduler.modify_job("sync", next_run_time=datetime.now() + timedelta(milliseconds=1))
        job = self.scheduler.get_job("sync")
        if job is not None and job.next_run_time is not None:
            await asyncio.to_thread(self._record_next_run, job.next_run_time.timestamp())
        async with self.pass_done:
            self.pass_done.notify_all()
        return result

    def _schedule_retry(self) -> None:
        """An account in backoff may be due before the next interval run: run then."""
        due = self.sync.next_due()
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

    def trigger(self) -> bool:
        """Run a sync now (e.g. the bots' /sync). Debounced: returns False when a
        trigger came less than ``sync.trigger_debounce`` ago."""
        now = self.clock()
        if now - self._last_trigger < self.settings.sync.trigger_debounce:
            return False
        self._last_trigger = now
        if self.scheduler is None:
            return False
        if self.sync.lock.locked():  # the running pass may have missed the change: once more after it
            self._rerun = True
        else:
            self.scheduler.modify_job("sync", next_run_time=datetime.now() + timedelta(milliseconds=1))
        return True

    # --- for the bots (bot.common.Host) ------------------------------------------------------

    def user_for_email(self, email: str) -> str | None:
        """The Leanote user id of an API account, once it has synced."""
        for acc in self._reader.accounts():
            if acc.account == email and acc.user_id:
                return acc.user_id
        return None

    def status_text(self, user_id: str | None = None) -> str:
        """Sync status for chat: an admin (``user_id`` None) sees every account with its
        last error; anyone else sees only their own account, without error details."""
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
        return "\n".join(lines)

    async def wait_for_pass(self, after: int) -> PassResult:
        """Wait until more than ``after`` passes have completed."""
        async with self.pass_done:
            await self.pass_done.wait_for(lambda: self.passes > after)
        return self.last_pass
