"""The memory's LLM tier in the daemon: a worker that takes the jobs the indexer queued
(``MemoryStore.enqueue_llm``), oldest first, and stores what ``rag.extract`` finds:
the summary, the facts and the typed entities (``MemoryStore.store_llm``).

- A job whose note changed or went since it was queued is dropped (its content hash);
  the note's newer text has a job of its own.
- A failed attempt (Ollama down, a reply that is not the schema's JSON) is retried after
  ``delays`` (0, 2, 10, 30 minutes), then the job is parked with its error (``status``).
- ``memory.llm: off`` runs nothing; ``on`` runs whenever an LLM is configured; ``auto``
  also waits while the LLM's last call failed (an answer's or ours), trying again at
  most every ``probe`` seconds.
- **Answers come first.** The worker never takes one of the answers' LLM slots (with
  one slot an answer would wait minutes behind an extraction on a CPU). It starts a job
  only when no answer has wanted the LLM (``AnswerService.answers_waiting_or_writing``:
  holding a slot or waiting for one) for ``quiet`` seconds, and while its call runs it
  looks every ``poll`` seconds: when an answer wants the LLM, the extraction is cancelled
  at once (closing the stream stops Ollama's generation) and the job goes back to the
  queue as it was, no attempt counted. The price is the work of the cancelled call; the
  answer waits at most ``poll`` seconds longer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from rag import extract as extract_mod
from rag.config import Settings
from rag.errors import LeanoteRagError
from rag.memory import MemoryStore

log = logging.getLogger(__name__)

DELAYS = (0.0, 120.0, 600.0, 1800.0)  # after the 1st, 2nd, 3rd, 4th failure; the 5th parks


def wanted(settings: Settings) -> bool:
    """Are LLM jobs queued at all (``memory.llm`` not off and an LLM configured)?"""
    return settings.memory.enabled and settings.memory.llm != "off" and settings.ollama.enabled


def answers_busy(answers) -> bool:
    """Does an answer hold one of the LLM slots, or wait for one?"""
    return answers.answers_waiting_or_writing > 0


class Preempted(Exception):
    """An answer wanted the LLM: the extraction gave way."""


class MemoryJobs:
    def __init__(self, settings: Callable[[], Settings], memory: Callable[[], MemoryStore | None], answers,
                 *, clock: Callable[[], float] = time.time, delays=DELAYS, poll: float = 0.05,
                 quiet: float = 2.0, idle: float = 5.0, probe: float = 300.0):
        self.settings = settings
        self.memory = memory
        self.answers = answers  # rag.answer.AnswerService: its chat model, _stream, answers_waiting_or_writing
        self.clock = clock
        self.delays = tuple(delays)
        self.poll, self.quiet, self.idle, self.probe = poll, quiet, idle, probe
        self._busy_until = 0.0  # monotonic: when the answers were last seen using the LLM, + quiet
        self._failing = False  # our own last call failed (Ollama unreachable)
        self._probed = float("-inf")  # monotonic: when the last job was started
        self.done = self.failed = self.parked = self.dropped = self.preempted = 0
        self.last: dict | None = None  # the last extraction's stats

    # --- when it may run --------------------------------------------------------------------

    def _busy(self) -> bool:
        busy = answers_busy(self.answers)
        if busy:
            self._busy_until = time.monotonic() + self.quiet
        return busy or time.monotonic() < self._busy_until

    def ready(self) -> bool:
        """May the LLM tier call the LLM now (apart from the answers' priority)?"""
        settings = self.settings()
        if not wanted(settings) or self.answers is None or self.answers.chat is None:
            return False
        if settings.memory.llm == "on":
            return True
        if not (getattr(self.answers, "_llm_failing", False) or self._failing):
            return True
        return time.monotonic() - self._probed >= self.probe  # auto: try again now and then

    # --- the loop ----------------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        log.debug("memory jobs: worker started")
        while not stopping.is_set():
            try:
                ran = await self.step()
            except Exception:
                log.exception("memory jobs: a step failed (the worker goes on)")
                ran = False
            if not ran:
                try:
                    await asyncio.wait_for(stopping.wait(), timeout=self._pause())
                except asyncio.TimeoutError:
                    pass

    def _pause(self) -> float:
        if self._busy_until > time.monotonic():
            return max(self.poll, self._busy_until - time.monotonic())
        return self.idle

    async def step(self) -> bool:
        """Run the oldest due job if the LLM may be used now; True when one was taken."""
        memory = self.memory()
        if memory is None or not self.ready() or self._busy():
            return False
        await asyncio.to_thread(memory.settle_facts)
        job = await asyncio.to_thread(memory.due_job, self.clock())
        if job is None:
            return False
        if not await asyncio.to_thread(memory.job_current, job):
            self.dropped += 1
            log.debug("memory jobs: %s changed or went; its job is dropped", job["note_id"])
            return True
        self._probed = time.monotonic()
        try:
            result = await self._extract(job)
        except Preempted:
            self.preempted += 1
            log.debug("memory jobs: %s gave way to an answer", job["note_id"])
            return False
        except (LeanoteRagError, ValueError) as err:
            self.failed += 1
            self._failing = not isinstance(err, extract_mod.ExtractError)
            if await asyncio.to_thread(memory.fail_job, job, str(err), self.delays):
                self.parked += 1
                log.warning("memory: extraction of %s parked after %d attempts: %s", job["note_id"],
                            job["attempts"] + 1, err)
            else:
                log.info("memory: extraction of %s failed (attempt %d), retried later: %s", job["note_id"],
                         job["attempts"] + 1, err)
            return True
        self._failing = False
        stats = result.stats()
        stored = await asyncio.to_thread(memory.store_llm, job, result.summary,
                                         [r.as_fact() for r in result.relations], stats, result.entities)
        if stored:
            self.done += 1
            self.last = stats
        else:
            self.dropped += 1
        return True

    async def _extract(self, job: dict) -> extract_mod.Extraction:
        """The extraction, cancelled as soon as an answer wants the LLM."""
        task = asyncio.create_task(extract_mod.extract(
            self.answers._stream, job["text"], job["title"], timeout=self.settings().ollama.timeout))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.poll)
                if done:
                    return task.result()
                if self._busy():
                    task.cancel()
                    try:
                        await task
                    except BaseException:
                        pass
                    raise Preempted()
        finally:
            if not task.done():
                task.cancel()
                try:
                    await task
                except BaseException:
                    pass
