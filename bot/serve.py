"""``leanote-rag serve``: one asyncio process for the sync's schedule and every door.

The daemon builds the parts (``bot.root.Parts``), opens the index (waiting while a one-shot
``leanote-rag index`` holds it; the API meanwhile says why it is not ready), starts the
schedule of passes (``sync.schedule``), and runs the services beside it: the API first, then
the chat bots and the file watcher (``services()``), the capture writer, the memory's
LLM tier and the LLM's first speed measurement. A service that fails is restarted with backoff
without stopping the others; one whose configuration is wrong stops with one clear error.

One process, because the embedded index allows one opener: the CLI, scripts and monitoring
reach it through its API (``bot.api``). SIGHUP (``systemctl reload``) re-reads the config:
what can change while running changes at once, the rest is named in the log as needing a
restart. Under systemd (``Type=notify``) it reports READY, RELOADING, STOPPING and watchdog
pings. SIGTERM/SIGINT stop within seconds: the schedule and the services stop, a running pass
is asked to stop (it ends at its next note, page or embedding batch, HTTP calls in flight are
cut; what it committed stays, and the next start carries on), the parts are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from typing import Awaitable, Callable

from rag import config as config_mod
from rag.config import Settings
from rag.errors import LeanoteRagError, StoreLocked, UserError
from rag.index import embed as embed_mod
from rag.index import lexical
from rag.redact import safe_url

from sync.faults import ServeLock, check_disk
from sync.schedule import Schedule
from sync.service import PassResult
from sync.second_jobs import wanted as second_wanted

from bot.api import server as api
from bot.api.client import find_daemon
from bot.api.metrics import Metrics, attach_metrics
from bot.notify import Notifier
from bot.digests import DigestJobs
from bot.root import Parts
from bot.usecases import people, syncing

log = logging.getLogger(__name__)

# The long-running parts beside the sync (the chat doors, the file watcher): called with
# the daemon, they run until it stops. ``services()`` names them.
Service = Callable[["Daemon"], Awaitable[None]]


def services(settings: Settings | None = None) -> list[Service]:
    """What ``serve`` runs beside the sync: the chat doors the config opens (``doors:``, else each
    section with ``enabled: true``; without ``settings``, every door, each running when open) and
    the file watcher."""
    from sync.watch import watch

    return [DOORS[name] for name in (settings.open_doors if settings is not None else DOORS)] + [watch]


# A bot's library (python-telegram-bot, discord.py: a third of a second each to import) is
# imported when that bot is enabled, not by every daemon.

async def telegram(daemon: "Daemon") -> None:
    if daemon.settings.telegram.enabled:
        from bot.telegram import service

        await service(daemon)


async def discord(daemon: "Daemon") -> None:
    if daemon.settings.discord.enabled:
        from bot.discord import service

        await service(daemon)


telegram.label = "Telegram bot"
discord.label = "Discord bot"
DOORS: dict[str, Service] = {"telegram": telegram, "discord": discord}  # a chat door's service, by its name in doors:


class Daemon:
    """The process ``serve`` runs. The doors it hosts reach the parts through ``parts`` (the use
    cases take it) and read ``settings`` (a reload changes them), ``stopping`` and ``metrics``."""

    def __init__(self, settings: Settings, services: list[Service], clock=time.time):
        self.settings = settings
        self.services = list(services)  # what runs beside the sync (``services()``)
        self.clock = clock
        self.parts: Parts | None = None  # what open() builds, closed together
        self.stopping = asyncio.Event()
        self.not_ready: str | None = None  # why the index is not open yet (the API's health says it)
        self.systemd = Notifier()  # never waits; a no-op outside systemd (no NOTIFY_SOCKET)
        self.metrics = Metrics()  # GET /metrics answers even while the index is still opening
        self._started = asyncio.Event()  # the schedule runs
        self.digests: DigestJobs | None = None  # each person's digest job (``bot.digests``)
        self._following: set[asyncio.Task] = set()  # the digest jobs following a reload
        self.unfinished = False  # closed with media work still running in its thread (``exit``)

    # --- what the doors and the tests read ----------------------------------------------------

    def _part(self, name: str):
        parts = self.parts
        return getattr(parts, name) if parts is not None and parts.built(name) else None

    @property
    def index(self):
        return self._part("index")

    @property
    def answers(self):
        return self._part("answers")

    @property
    def feedback(self):
        return self._part("feedback")

    @property
    def schedule(self) -> Schedule | None:
        return self._part("schedule")

    @property
    def capture(self):
        parts = self.parts
        return parts.capture() if parts is not None and parts.built("capture") else None

    @property
    def memory(self):
        """The memory as the doors read it (None while off or not made yet)."""
        return self.parts.memory_to_read if self.parts is not None else None

    @property
    def ready(self) -> bool:
        return self.index is not None and self.answers is not None

    @property
    def passes(self) -> int:
        return self.schedule.passes if self.schedule is not None else 0

    @property
    def last_pass(self) -> PassResult | None:
        return self.schedule.last_pass if self.schedule is not None else None

    async def wait_for_pass(self, after: int) -> PassResult:
        """Wait until more than ``after`` passes have completed (the first once the index is open)."""
        await self._started.wait()
        return await self.schedule.wait_for_pass(after)

    # --- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        try:
            self.parts = parts = Parts(self.settings, create=True, scheduled=True, clock=self.clock)
            parts.state.verify()  # a file with damaged pages would fail every pass: said now, and serve exits
            parts.reader  # for reads in worker threads
            embed_mod.warm(parts.index.embedder)  # the model loaded before ready, even behind a vector cache
            lexical.warm()  # and the CJK tokenizer
            parts.sync
            parts.answers
            parts.capture()
            parts.feedback
            people.name_api_people(parts)  # once: an API caller kept by its place in api.tokens is its name's
            parts.forget_old_answers()
            attach_metrics(self.metrics, parts)
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

    def close(self) -> None:
        if self.parts is not None:
            if self.parts.built("schedule"):
                self.parts.schedule.close()
            media = self.parts.media if self.parts.built("media") else None
            self.parts.close()
            self.parts = None
            # a transcription or an OCR cannot be stopped: still running, the process must not be torn down
            # under it (its engine's threads destroyed at the interpreter's exit: std::terminate, rc 134)
            self.unfinished = media is not None and media.busy()

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
        try:
            line = await self.parts.answers.measure()
        except LeanoteRagError as err:
            log.info("could not measure the LLM's speed at start (%s): the first answer measures it", err)
            return
        if line:
            log.info("%s", line)

    async def _serve(self) -> None:
        tasks: list[asyncio.Task] = []
        schedule: Schedule | None = None
        try:
            if self.settings.api.enabled:  # first: it says "not ready" while the index is busy
                tasks.append(asyncio.create_task(self._supervise(api.service)))
            if not await self._open_when_free():
                return
            schedule = self.parts.schedule
            parts = self.parts
            schedule.after.append(lambda: syncing.after_pass(parts))  # as after a pass made by `index` alone
            await schedule.start()
            self.digests = DigestJobs(parts, schedule, self.clock)  # on the sync's scheduler
            parts.replan = self.digests.replan
            self._started.set()
            cfg = self.settings.sync
            log.info("serving: sync every %g s, reconcile daily at %s, index in %s",
                     cfg.interval, cfg.reconcile_at, self.parts.index.store.location)
            tasks += [asyncio.create_task(self._supervise(service)) for service in self.services]
            tasks.append(asyncio.create_task(self._watchdog()))
            tasks.append(asyncio.create_task(self.parts.capture().run(self.stopping)))
            # the memory's LLM tier: never while an answer holds the LLM (sync.memory_jobs)
            tasks.append(asyncio.create_task(self.parts.memory_jobs.run(self.stopping)))
            if second_wanted(self.settings):  # the second dense index, between questions (sync.second_jobs)
                fill = parts.second_fill
                schedule.after.append(lambda: fill.after_pass(parts.schedule.last_pass))
                tasks.append(asyncio.create_task(fill.run(self.stopping)))
            tasks.append(asyncio.create_task(self._measure_llm()))
            tasks.append(asyncio.create_task(self.digests.start()))  # (a missed one waits for its bot)
            self.systemd.notify("READY=1\nSTATUS=serving")
            await self.stopping.wait()
        finally:
            log.info("stopping")
            self.systemd.notify("STOPPING=1")
            self.stopping.set()
            if schedule is not None:
                schedule.stop()
            # a pass in its worker thread stops at its next safe point; meanwhile the services see
            # `stopping` and end on their own (the API answers what it is answering), and whatever
            # is still running after a moment is cancelled. Then the pass is waited for, and closed.
            wound_down = asyncio.ensure_future(schedule.wound_down()) if schedule is not None else None
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

    def exit(self) -> None:
        """After ``run``: when media work was still running as it closed (a transcription, an OCR:
        native code that cannot be interrupted; its job was dropped, and the person is told at the
        next start), the process ends here, its state closed, without the interpreter's teardown,
        which would destroy the engine under it. Otherwise nothing: the process ends as usual."""
        if not self.unfinished:
            return
        log.info("a transcription or image reading was still running: it ends with the process")
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)

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
        if self.schedule is not None:
            self.schedule.apply(settings, live)
        if self.digests is not None and "users" in live:  # the digest jobs follow who is in users: now
            task = asyncio.get_running_loop().create_task(self.digests.follow())
            self._following.add(task)
            task.add_done_callback(self._following.discard)

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
                sync = self._part("sync")
                delay = sync.backoff(failures) if sync is not None else 30.0
                log.warning("%s failed (%s); restarting in %.0f s", name, safe_url(str(err)) or type(err).__name__, delay)
                try:
                    await asyncio.wait_for(self.stopping.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass
