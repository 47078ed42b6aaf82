"""The second dense index's fill in the daemon (``second_index``, ``rag.index.second``): a worker
that embeds the first index's chunks with the stronger model, a small batch at a time, while
nobody asks.

- **Nobody waits for it.** The first index answers from the first minute: the second embedder is
  loaded by this worker, after the daemon is ready, and a search uses the second index for the
  notes it covers once it has covered some. A batch starts only when no search has run and no
  answer has wanted the LLM for ``quiet`` seconds (``second_index.batch`` chunks: a few seconds
  of the CPU, the most a question can wait behind it), and only in ``second_index.window``.
- **Resumable.** What is written stays; after a stop or a kill the next ``plan`` (at start, after
  each sync pass that changed something, and every ``REPLAN`` seconds) finds what is left, and
  the chunks whose notes changed meanwhile.
- **auto** (``second_index.enabled: auto``): filled only where the [gemma] extra and the model are
  here and the box can fill the whole index within a night (``NIGHT``, or the window's length):
  the rate is measured as it fills (and kept in ``<state_dir>/second_index.json`` for ``doctor``,
  every ``MEASURE_CHUNKS`` chunks); a box too slow is told so once in the log and by ``status``,
  and stops filling. A service whose memory limit (``MemoryMax``) cannot hold the model beside
  the rest (``RUN_MEMORY``; ``EXPORT_MEMORY`` while its ONNX export is still to be made) never
  loads it under auto, and says why.
  ``on`` fills whatever the time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Callable

from rag.config import Settings
from rag.errors import LeanoteRagError
from rag.index import gemma
from rag.index.gemma import backend
from rag.sections import window
from sync.faults import memory_limit
from sync.memory_jobs import duration, in_window

log = logging.getLogger(__name__)

REPLAN = 600.0  # seconds between two comparisons with the first index (and after each pass that changed it)
NIGHT = 8 * 3600.0  # the time a box without a window has to fill the index, for auto and doctor
MEASURE_CHUNKS = 32  # chunks embedded between two judgements of the rate (kept for doctor; auto may stop)
RATE_FILE = "second_index.json"
# The memory limit (systemd's MemoryMax) under which auto leaves the second index off: the daemon with
# voice and photos at work peaks at ~1.5 GB, EmbeddingGemma adds 1.2–1.4 GB resident, and making its
# ONNX export peaks at 5.7 GB (docs/performance.md). A process killed at its limit restarts and tries again.
RUN_MEMORY = 4 << 30
EXPORT_MEMORY = 7 << 30


def wanted(settings: Settings) -> bool:
    """Is the second index to be filled here: ``on``, or ``auto`` with its model and its extra
    here (a machine that never fetched the model hears nothing of it)?"""
    cfg = settings.second_index
    if cfg.enabled == "off":
        return False
    if cfg.enabled == "on":
        return True
    from importlib import util

    model = Path(cfg.embedder.model or "")
    return (cfg.embedder.kind != "gemma" or (model / "modules.json").is_file()) \
        and util.find_spec("sentence_transformers") is not None


def night_seconds(settings: Settings) -> float:
    """How long a night is for the fill: the window's length, else ``NIGHT``."""
    span = window(settings.second_index.window)
    if span is None:
        return NIGHT
    start, end = span
    return ((end - start) % (24 * 60)) * 60.0


def saved_rate(settings: Settings) -> dict | None:
    """The fill rate measured here on the second embedder's backend (``embedder.backend``: onnx
    fills several times as fast as torch): ``{"rate", "chunks", "embedder", "backend", "at"}``, or
    None (none kept, or one measured on another backend)."""
    try:
        saved = json.loads((Path(settings.state_dir) / RATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("backend") != backend(settings.second_index.embedder):
        return None
    return saved


def rate_record(settings: Settings, rate: float, chunks: int | None, embedder: str, at: float) -> str:
    """What ``saved_rate`` reads: the rate, the embedder and its backend."""
    return json.dumps({"rate": rate, "chunks": chunks, "embedder": embedder,
                       "backend": backend(settings.second_index.embedder), "at": at})


def too_slow(settings: Settings, rate: float | None, chunks: int | None) -> str | None:
    """Why the box cannot fill ``chunks`` within a night at ``rate`` chunks a second, or None."""
    if not rate or not chunks:
        return None
    need, night = chunks / rate, night_seconds(settings)
    if need <= night:
        return None
    return (f"this machine embeds {rate:.2f} chunks/s with the second embedder: the index's {chunks} chunks take "
            f"~{duration(need)}, longer than a night ({duration(night)})")


def memory_short(settings: Settings, limit: int | None) -> str | None:
    """Why a process limited to ``limit`` bytes should not load the second embedder, or None."""
    if limit is None:
        return None
    cfg = settings.second_index.embedder
    exporting = backend(cfg) == "onnx" and not gemma.exported(cfg)
    need = EXPORT_MEMORY if exporting else RUN_MEMORY
    if limit >= need:
        return None
    fix = ("make its ONNX export once outside the service (`leanote-rag doctor` does), or raise MemoryMax"
           if exporting else "raise MemoryMax")
    return (f"the service may use {limit / 2**30:.1f} GB (its memory limit), less than the {need >> 30} GB the second "
            f"embedder needs beside the rest{' while its ONNX export is made' if exporting else ''}: {fix} "
            f"(`systemctl edit leanote-rag`, docs/server.md)")


class SecondFill:
    """The worker (module docstring). ``second``: opens the second index (None: it cannot be
    opened here, said once); ``first``: the first index's store; ``answers``: the answer service
    (its searches and LLM use say when someone asks)."""

    def __init__(self, settings: Settings, second: Callable[[], object], first: Callable[[], object], answers,
                 *, clock: Callable[[], float] = time.time, quiet: float = 2.0, idle: float = 5.0,
                 limit: Callable[[], int | None] = memory_limit):
        self.settings = settings
        self.second = second
        self.first = first
        self.answers = answers
        self.clock = clock
        self.quiet, self.idle = quiet, idle
        self.limit = limit  # the process's memory limit (auto leaves the model unloaded under a small one)
        self._planned = float("-inf")  # monotonic
        self._tried = float("-inf")  # monotonic: when the second index was last opened (or tried)
        self.dirty = True  # a pass changed the first index: plan again
        self._busy_until = 0.0
        self.why = ""  # why it does not fill now ("" : it does, or has nothing to do)
        self.gave_up = ""  # auto: too slow here (said once)
        self.opened: object | None = None
        self._measured = 0  # chunks embedded since start (auto judges the rate after MEASURE_CHUNKS)
        self._stopping: asyncio.Event | None = None

    async def after_pass(self, result) -> None:
        """After a sync pass (``Schedule.after``): one that changed the first index's notes makes
        the next step compare the two again."""
        s = getattr(result, "summary", None)
        if s is None or s.added or s.updated or s.deleted or s.chunks_written:
            self.dirty = True

    def _busy(self) -> bool:
        answers = self.answers
        busy = answers is not None and (getattr(answers, "answers_waiting_or_writing", 0) > 0
                                        or getattr(answers, "searching", 0) > 0)
        if busy:
            self._busy_until = time.monotonic() + self.quiet
        return busy or time.monotonic() < self._busy_until

    def _busy_now(self) -> bool:
        """Between two chunks of a batch: a question came, or the daemon stops."""
        return self._stopping is not None and self._stopping.is_set() or self._busy()

    async def run(self, stopping: asyncio.Event) -> None:
        self._stopping = stopping
        while not stopping.is_set():
            try:
                ran = await self.step()
            except Exception:
                if stopping.is_set():  # its store closed under the last chunk: nothing lost but that chunk
                    return
                log.exception("second index: a step failed (the worker goes on)")
                ran = False
            if not ran:
                pause = max(0.05, self._busy_until - time.monotonic()) if self._busy_until > time.monotonic() \
                    else self.idle
                try:
                    await asyncio.wait_for(stopping.wait(), timeout=pause)
                except asyncio.TimeoutError:
                    pass

    async def step(self) -> bool:
        """One batch if one may run now; True when one was written."""
        cfg = self.settings.second_index
        if cfg.enabled == "off" or self.gave_up:
            return False
        if not in_window(cfg.window, self.clock()):
            self.why = f"filled only {cfg.window} (second_index.window)"
            return False
        if self._busy():
            return False
        second = self.opened
        if second is None:
            if time.monotonic() - self._tried < REPLAN:
                return False
            short = memory_short(self.settings, self.limit()) if cfg.enabled == "auto" else None
            if short:  # checked again every REPLAN: an export made meanwhile, a limit raised and restarted
                self._tried = time.monotonic()
                if self.why != short:
                    log.warning("second index: %s; not filled (second_index.enabled: auto)", short)
                self.why = short
                return False
            self._tried = time.monotonic()  # (a model fetched later is found at the next try)
            second = self.opened = await asyncio.to_thread(self.second)
            if second is None:
                self.why = f"the second embedder cannot be loaded here (see the log); tried again every {duration(REPLAN)}"
                return False
        first = self.first()
        if first is None:
            return False
        if self.dirty or time.monotonic() - self._planned >= REPLAN:
            self.dirty = False
            self._planned = time.monotonic()
            plan = await asyncio.to_thread(second.plan, first)
            if cfg.enabled == "auto" and self._too_slow(second, plan.chunks):
                return False
            if plan.todo or plan.deleted:
                log.info("second index: %d of %d chunks to embed, %d removed (compared in %.1f s)",
                         len(plan.todo), plan.chunks, plan.deleted, plan.seconds)
        if self._busy():
            return False
        try:
            done = await asyncio.to_thread(second.fill, cfg.batch, self._busy_now)
        except LeanoteRagError as err:
            self.why = f"embedding failed: {err}"
            log.warning("second index: %s", self.why)
            self._busy_until = time.monotonic() + 60.0  # tried again in a minute
            return False
        self.why = ""
        if not done:
            return False
        self._measured += done
        if self._measured // MEASURE_CHUNKS != (self._measured - done) // MEASURE_CHUNKS:
            await asyncio.to_thread(self._judge, second)  # every MEASURE_CHUNKS chunks: the rate kept up to date
        if not second.progress()["left"]:
            log.info("second index: filled (%d chunks)", second.progress()["chunks"])
        return True

    def _too_slow(self, second, chunks: int) -> bool:
        """auto: is this machine known (a rate measured here with this embedder) to be too slow?"""
        saved = saved_rate(self.settings) or {}
        if saved.get("embedder") != second.embedder.model_id:
            return False
        why = too_slow(self.settings, saved.get("rate"), chunks)
        if why:
            self.gave_up = f"{why}: not filled (second_index.enabled: auto; on fills it anyway)"
            log.info("second index: %s", self.gave_up)
        return bool(why)

    def _judge(self, second) -> None:
        """The rate, kept for ``doctor``; auto stops a box too slow to fill the index in a night."""
        progress = second.progress()
        data = rate_record(self.settings, progress["rate"], progress["chunks"], second.embedder.model_id, self.clock())
        path = Path(self.settings.state_dir) / RATE_FILE
        try:
            path.write_text(data)
        except OSError as err:
            log.debug("second index: the rate could not be kept in %s: %s", path, err)
        why = too_slow(self.settings, progress["rate"], progress["chunks"])
        if why and self.settings.second_index.enabled == "auto":
            self.gave_up = f"{why}: not filled (second_index.enabled: auto; on fills it anyway)"
            log.info("second index: %s", self.gave_up)

    def state(self) -> dict:
        """What ``status`` shows: how far it is and the time left, or why it does not fill."""
        second = self.opened
        progress = second.progress() if second is not None else {}
        return {"enabled": self.settings.second_index.enabled, "embedder": None, **progress,
                "text": self.gave_up or self.why}
