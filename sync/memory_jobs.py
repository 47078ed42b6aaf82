"""The memory's LLM tier in the daemon: a worker that takes the jobs the indexer queued
(``MemoryStore.enqueue_llm``), oldest first, and stores what ``rag.memory.extract`` finds:
the summary, the facts and the typed entities (``MemoryStore.store_llm``).

- A job whose note changed or went since it was queued is dropped (its content hash);
  the note's newer text has a job of its own.
- A failed attempt (Ollama down, a reply that is not the schema's JSON) is retried after
  ``delays`` (0, 2, 10, 30 minutes), then the job is parked with its error (``status``).
- ``memory.llm: off`` runs nothing; ``on`` runs whenever an LLM is configured; ``auto``
  also waits while the LLM's last call failed (an answer's or ours), trying again at
  most every ``probe`` seconds, and stays off where the backlog would take longer than
  ``memory.llm_auto_max`` (a day) here: the estimate (``outlook``: the queued notes'
  text at the LLM's measured reading and writing speed, or the extractions' own measured
  time once some ran) is logged when it decides, and shown by ``status``.
- **Answers come first.** The worker never takes one of the answers' LLM slots (with
  one slot an answer would wait minutes behind an extraction on a CPU). It starts a job
  only when no answer has wanted the LLM (``AnswerService.answers_waiting_or_writing``:
  holding a slot or waiting for one) for ``quiet`` seconds, and while its call runs it
  looks every ``poll`` seconds: when an answer wants the LLM, the extraction is cancelled
  at once (closing the stream stops Ollama's generation) and the job goes back to the
  queue as it was, no attempt counted. The sections of a long note already read are
  kept: the next try reads only the rest. The price is the work of the cancelled call;
  the answer waits at most ``poll`` seconds longer. ``auto`` pauses when ``GIVE_UP_AFTER``
  tries in a row gave way and not one section was read meanwhile: work that cannot finish
  between questions here only burns the CPU. It resumes once no question has come for
  ``RESUME_IDLE`` (the box idle, at night): the questions that stopped it are gone.
- **The status** shows the jobs done in the last hour and day (each note's result carries
  when it was done) and, from the daemon, this run's counts and why the tier does not run.
- **The log** says what the tier did in one line per batch (when nothing is due any more,
  or the LLM may not be used now), at most one per ``report_every`` seconds (5 minutes):
  ``memory: extracted 40 notes in 5 min, 2 failed (last: …), 120 waiting``. A job that is
  parked is named once, as a warning; each note's attempt is a debug line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import Callable

from rag.index import asked as asked_mod
from rag.index import asked_scopes
from rag.memory import extract as extract_mod
from rag.config import Settings
from rag.errors import LeanoteRagError
from rag.memory.schema import ASKED_JOB, LLM_JOB
from rag.memory.store import MemoryStore
from rag.sections import window

log = logging.getLogger(__name__)

DELAYS = (0.0, 120.0, 600.0, 1800.0)  # after the 1st, 2nd, 3rd, 4th failure; the 5th parks
OUTLOOK_EVERY = 600.0  # seconds between two estimates of the backlog's time
REPLY_TOKENS = 400  # what an extraction writes per call, for the estimate before one ran


def wanted(settings: Settings) -> bool:
    """Are LLM jobs queued at all (``memory.llm`` not off and an LLM configured)?"""
    return settings.memory.enabled and settings.memory.llm != "off" and settings.ollama.enabled


def questions_wanted(settings: Settings) -> bool:
    """Are the notes' questions to be written (``memory.questions`` not off and an LLM configured)?"""
    return settings.memory.enabled and settings.memory.questions != "off" and settings.ollama.enabled


def in_window(spec: str, when: float) -> bool:
    """Is ``when`` (epoch seconds) inside the daily window ``spec`` of local time ("" : always)?"""
    span = window(spec)
    if span is None:
        return True
    t = time.localtime(when)
    minute = t.tm_hour * 60 + t.tm_min
    start, end = span
    return start <= minute < end if start < end else (minute >= start or minute < end)


def answers_busy(answers) -> bool:
    """Does an answer hold one of the LLM slots, or wait for one?"""
    return answers.answers_waiting_or_writing > 0


GIVE_UP_AFTER = 3  # auto: extractions cancelled by questions in a row, none finished: paused
RESUME_IDLE = 1800.0  # ... until no question has come for this long (seconds, the worker's clock)


class Preempted(Exception):
    """An answer wanted the LLM: the extraction gave way."""


class MemoryJobs:
    def __init__(self, settings: Settings, memory: Callable[[], MemoryStore | None], answers,
                 *, clock: Callable[[], float] = time.time, delays=DELAYS, poll: float = 0.05,
                 quiet: float = 2.0, idle: float = 5.0, probe: float = 300.0, report_every: float = 300.0,
                 index: Callable[[], object] = lambda: None):
        self.settings = settings
        self.memory = memory
        self.index = index  # the NoteIndex the written questions go into (None: aligned later)
        self.answers = answers  # rag.answer.service.AnswerService: its chat model, _stream, answers_waiting_or_writing
        self.clock = clock
        self.delays = tuple(delays)
        self.poll, self.quiet, self.idle, self.probe = poll, quiet, idle, probe
        self._busy_until = 0.0  # monotonic: when the answers were last seen using the LLM, + quiet
        self._failing = False  # our own last call failed (Ollama unreachable)
        self._probed = float("-inf")  # monotonic: when the last job was started
        self.done = self.failed = self.parked = self.dropped = self.preempted = 0
        self.last: dict | None = None  # the last extraction's stats
        self.report_every = report_every
        self._tally: Counter = Counter()  # since the last log line: done, failed, parked
        self._since: float | None = None  # self.clock() of the first of them ...
        self._until = 0.0  # ... and of the last
        self._reported = float("-inf")  # self.clock() of the last log line
        self._last_error = ""
        # the backlog's estimated time here: {"jobs", "seconds", "basis", "too_long"} (None: not estimated)
        self.outlook: dict | None = None
        self._outlook_at = float("-inf")
        self._job_seconds: float | None = None  # running mean of an extraction's time here
        self.gave_up = False  # auto: paused, every extraction having given way (GIVE_UP_AFTER) ...
        self._asked_at = clock()  # ... until RESUME_IDLE after the last question seen (self.clock())
        self._fruitless = 0  # extractions in a row that gave way with no section read
        self._remeasured = float("-inf")  # self.clock() of the last speed measurement when idle
        if answers is not None and hasattr(answers, "observers"):
            answers.observers.append(self._answered)  # every finished question, however short
        # the sections of a note read before a question cut its extraction off: ((note, hash), replies)
        # (rag.memory.extract); the next try of that job goes on from there
        self._partial: tuple[tuple[str, str], list] | None = None
        self.sections_done = 0  # sections read (a job of several makes progress before it ends)
        # written questions (rag.index.asked): this run's counts, and when the index was last aligned
        self.asked = Counter()  # done, dropped (bad generations), failed, preempted, stale
        self._aligned_at = float("-inf")

    # --- when it may run --------------------------------------------------------------------

    def _busy(self) -> bool:
        busy = answers_busy(self.answers)
        if busy:
            self._busy_until = time.monotonic() + self.quiet
            self._asked_at = self.clock()
        return busy or time.monotonic() < self._busy_until

    def _idle(self) -> bool:
        """Has no question come for ``RESUME_IDLE`` (the worker's clock)?"""
        return self.clock() - self._asked_at >= RESUME_IDLE

    async def _remeasure(self) -> None:
        """The LLM's speed measured again (``rag.answer.sizing.measure_speed``: one short reply),
        giving way to a question as a job does."""
        from rag.answer.sizing import measure_speed

        try:
            line = await self._preemptible(lambda: measure_speed(self.answers.chat, self.answers.speeds,
                                                                 self.settings))
            log.info("memory: the box is quiet, the LLM's speed measured again: %s", line)
        except Preempted:
            pass
        except LeanoteRagError as err:
            log.info("memory: the LLM's speed could not be measured again: %s", err)

    def _answered(self, _answer) -> None:
        """An answer finished (``AnswerService.observers``): someone is asking."""
        self._asked_at = self.clock()

    def ready(self, switch: str | None = None) -> bool:
        """May the LLM tier (``switch``: another job's switch, ``memory.questions``) call the
        LLM now (apart from the answers' priority)?"""
        settings = self.settings
        switch = settings.memory.llm if switch is None else switch
        if not settings.memory.enabled or switch == "off" or not settings.ollama.enabled \
                or self.answers is None or self.answers.chat is None:
            return False
        if switch == "on":
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
        with contextlib.suppress(Exception):  # what the last batch did, before the daemon stops
            await self.report(self.memory(), force=True)

    def _count(self, outcome: str, error: str = "") -> None:
        if self._since is None:
            self._since = self.clock()
        self._until = self.clock()
        self._tally[outcome] += 1
        if error:
            self._last_error = error

    async def report(self, memory: MemoryStore | None, force: bool = False) -> None:
        """One log line for the jobs since the last one: at the end of a batch (``force``),
        unless the last line is less than ``report_every`` seconds old (retries that come
        due one by one are not a line each), or once a batch has run that long."""
        if self._since is None or memory is None:
            return
        now = self.clock()
        if now - self._since < self.report_every and not (force and now - self._reported >= self.report_every):
            return
        took = self._until - self._since
        waiting = (await asyncio.to_thread(memory.llm_counts))["jobs_pending"]
        t = self._tally
        parts = [f"extracted {t['done']} note{'s' if t['done'] != 1 else ''} in {_duration(took)}",
                 f"{t['failed']} failed" + (f" (last: {self._last_error[:200]})" if t["failed"] else ""),
                 f"{waiting} waiting"]
        if t["parked"]:
            parts.append(f"{t['parked']} parked (`leanote-rag status` lists them)")
        log.info("memory: %s", ", ".join(parts))
        self._tally.clear()
        self._since = None
        self._reported = now

    def _pause(self) -> float:
        if self._busy_until > time.monotonic():
            return max(self.poll, self._busy_until - time.monotonic())
        return self.idle

    def _asking(self) -> bool:
        """May the notes' questions be written now (``memory.questions``, its window)?"""
        return self.ready(self.settings.memory.questions) and in_window(self.settings.memory.questions_window,
                                                                        self.clock())

    async def step(self) -> bool:
        """Run the oldest due job if the LLM may be used now; True when one was taken."""
        memory = self.memory()
        kinds = [] if memory is None else [k for k, ok in ((LLM_JOB, self.ready()), (ASKED_JOB, self._asking())) if ok]
        if not kinds:
            await self.report(memory, force=True)  # the batch ends here: the LLM may not be used now
            return False
        if self._busy():
            return False
        if LLM_JOB in kinds and not await self._worth_it(memory):
            kinds.remove(LLM_JOB)
        if not kinds:
            return False
        if ASKED_JOB in kinds:
            await self._align(memory)
        await asyncio.to_thread(memory.settle_facts)
        job = await asyncio.to_thread(memory.due_job, self.clock(), kinds)
        if job is None:
            await self.report(memory, force=True)  # nothing due any more
            return False
        if not await asyncio.to_thread(memory.job_current, job):
            self.dropped += 1
            log.debug("memory jobs: %s changed or went; its job is dropped", job["note_id"])
            return True
        self._probed = time.monotonic()
        if job["kind"] == ASKED_JOB:
            return await self._ask(memory, job)
        began = time.monotonic()
        try:
            result = await self._extract(job)
        except Preempted:
            self.preempted += 1
            log.debug("memory jobs: %s gave way to an answer", job["note_id"])
            return False
        except (LeanoteRagError, ValueError) as err:
            self.failed += 1
            self._failing = not isinstance(err, extract_mod.ExtractError)
            await self._failed(memory, job, err, "extraction")
            return True
        self._failing = False
        stats = result.stats()
        stored = await asyncio.to_thread(memory.store_llm, job, result.summary,
                                         [r.as_fact() for r in result.relations], stats, result.entities)
        took = time.monotonic() - began
        self._job_seconds = took if self._job_seconds is None else 0.8 * self._job_seconds + 0.2 * took
        if stored:
            self.done += 1
            self.last = stats
            self._count("done")
            log.debug("memory: extracted %s", job["note_id"])
        else:
            self.dropped += 1
        await self.report(memory)
        return True

    async def _failed(self, memory: MemoryStore, job: dict, err: Exception, what: str) -> None:
        """An attempt failed: retried later, or parked once its delays are spent."""
        self._count("failed", str(err))
        if await asyncio.to_thread(memory.fail_job, job, str(err), self.delays):
            self.parked += 1
            self._count("parked")
            log.warning("memory: %s of %s parked after %d attempts: %s", what, job["note_id"], job["attempts"] + 1, err)
        else:
            log.debug("memory: %s of %s failed (attempt %d), retried later: %s", what, job["note_id"],
                      job["attempts"] + 1, err)
        await self.report(memory)

    async def _ask(self, memory: MemoryStore, job: dict) -> bool:
        """Write the questions of the job's note (``rag.index.asked``), store them and put them in
        the index; a generation that fails the checks is stored empty (counted, not asked again
        at this text). Gives way to answers as an extraction does. In ``memory.questions_scope``: a
        job queued in the other scope (or without its digest) reads the note from the index."""
        scope = self.settings.memory.questions_scope
        if not job["digest"] or job["scope"] != scope:  # (``queue_missing_asked``, or the scope changed)
            index = self.index()
            found = None if index is None else await asyncio.to_thread(asked_mod.chunks_from_index, index.store,
                                                                        job["note_id"])
            if found is None:
                await self._failed(memory, job, LeanoteRagError("the note's chunks are not in the index (yet)"),
                                   "writing the questions")
                return True
            job.update(asked_scopes.job(scope, found[0], found[1]))

        def call():
            return asked_scopes.write(self.answers._stream, job, timeout=self.settings.ollama.timeout)

        try:
            written = await self._preemptible(call)
        except Preempted:
            self.asked["preempted"] += 1
            log.debug("memory jobs: the questions of %s gave way to an answer", job["note_id"])
            return False
        except (LeanoteRagError, ValueError) as err:
            self.asked["failed"] += 1
            self._failing = True
            await self._failed(memory, job, err, "writing the questions")
            return True
        self._failing = False
        stored = await asyncio.to_thread(memory.store_asked, job, written.questions, written.stats(), scope,
                                         written.ties)
        if not stored:
            self.asked["stale"] += 1
            return True
        self.asked["done" if written.ok else "dropped"] += 1
        if not written.ok:
            log.debug("memory: the questions written for %s were dropped: %s", job["note_id"], written.dropped)
        index = self.index()
        if index is not None and written.ok:
            await asyncio.to_thread(asked_mod.index_questions, index, job["note_id"], job["user_id"],
                                    job["content_hash"], written.questions, written.ties)
        return True

    async def _align(self, memory: MemoryStore) -> None:
        """Now and then (at the first job, then every ``OUTLOOK_EVERY``): the notes processed
        without a job get one (``queue_missing_asked``), and the index's question points are
        brought in line with the rows (``rag.index.asked.align``): a kill in between repaired."""
        index = self.index()
        if index is None or time.monotonic() - self._aligned_at < OUTLOOK_EVERY:
            return
        self._aligned_at = time.monotonic()

        def work() -> tuple[int, int, int]:
            queued = memory.queue_missing_asked(self.settings.memory.questions_scope)
            rows = memory.asked_rows()
            users = set(index.store.count_by_user()) | {row[0] for row in rows.values()}
            return (*asked_mod.align(index, rows, users), queued)

        try:
            added, removed, queued = await asyncio.to_thread(work)
        except Exception as err:  # the index is busy or gone: tried again later
            log.warning("memory: aligning the written questions with the index failed: %s", err)
            return
        if added or removed or queued:
            log.info("memory: written questions: %d note(s) put in the index, %d taken out, %d queued (indexed "
                     "before the questions were on)", added, removed, queued)

    def state(self) -> dict:
        """The worker as the status shows it (this run's counts): ``{"done", "failed", "parked",
        "preempted", "gave_up", "text"}``; text says why it does not run, when it does not."""
        text = ""
        if self.gave_up:
            quiet = max(0.0, RESUME_IDLE - (self.clock() - self._asked_at))
            text = (f"paused: questions kept coming before a note was read, so none was finished; resumes after "
                    f"{_duration(RESUME_IDLE)} without a question (~{_duration(quiet)} from now if none comes; "
                    "memory.llm: on runs it anyway)")
        elif self.outlook and self.outlook["too_long"]:
            text = f"not run: {self.outlook['text']}"
        questions = dict(self.asked)
        if self.settings.memory.questions != "off" and not in_window(self.settings.memory.questions_window,
                                                                      self.clock()):
            questions["text"] = f"written only {self.settings.memory.questions_window} (memory.questions_window)"
        return {"done": self.done, "failed": self.failed, "parked": self.parked, "preempted": self.preempted,
                "sections_done": self.sections_done, "gave_up": self.gave_up, "text": text, "questions": questions}

    def estimate(self, memory: MemoryStore) -> dict:
        """How long the backlog would take here (in a thread: it reads the queue)."""
        jobs, chars = memory.llm_backlog()
        chat = self.answers.chat if self.answers is not None else None
        speed = self.answers.speeds.get(chat.model) if chat is not None else None
        measured = self._job_seconds_used
        return outlook(self.settings, jobs, chars, chat.model if chat else "", speed, measured, self.done)

    @property
    def _job_seconds_used(self) -> float | None:
        """The extractions' own mean time, once enough ran to estimate the backlog by."""
        return self._job_seconds if self.done >= 3 else None

    async def _worth_it(self, memory: MemoryStore) -> bool:
        """auto: not where the backlog would take longer than memory.llm_auto_max here
        (estimated every OUTLOOK_EVERY seconds; the decision is logged when it changes)."""
        settings = self.settings
        if settings.memory.llm != "auto":
            return True
        if self.gave_up and self._idle():
            # the questions that stopped it are gone (the box idle, at night): another go
            self.gave_up, self._fruitless = False, 0
            log.info("memory: summaries and facts resume: no question for %s", _duration(RESUME_IDLE))
        if self.gave_up or self._fruitless >= GIVE_UP_AFTER:
            # The last jobs all gave way to a question before one section was read (on 2 cores a
            # 3,000-token job restarted from the beginning after each one: 5 cancels in 4 minutes,
            # none done). Work that cannot finish between questions here burns the CPU for nothing.
            if not self.gave_up:
                self.gave_up = True
                log.info("memory: summaries and facts paused: a question came before each of the last %d notes "
                         "was read, and none was finished; they resume after %s without a question "
                         "(memory.llm: on runs them anyway)", self._fruitless, _duration(RESUME_IDLE))
            return False
        if self.outlook and self.outlook["too_long"] and self._job_seconds_used is None and self._idle() \
                and self._remeasured < self._asked_at:
            # The backlog looked too long at a speed measured while the box was busy: measured again
            # now that it is quiet (once per quiet stretch), and estimated again at once.
            self._remeasured = self.clock()
            await self._remeasure()
            self._outlook_at = float("-inf")
        if time.monotonic() - self._outlook_at >= OUTLOOK_EVERY:
            self._outlook_at = time.monotonic()
            before = self.outlook
            self.outlook = await asyncio.to_thread(self.estimate, memory)
            if self.outlook["too_long"] and not (before and before["too_long"]):
                log.info("memory: LLM extraction of the %d queued notes would take ~%s here (%s): not run "
                         "(memory.llm: auto, memory.llm_auto_max %s); memory.llm: on runs it anyway",
                         self.outlook["jobs"], _duration(self.outlook["seconds"]), self.outlook["basis"],
                         _duration(settings.memory.llm_auto_max))
            elif before and before["too_long"] and not self.outlook["too_long"]:
                log.info("memory: LLM extraction resumes: ~%s for the %d queued notes here",
                         _duration(self.outlook["seconds"]), self.outlook["jobs"])
        return not (self.outlook and self.outlook["too_long"])

    async def _extract(self, job: dict) -> extract_mod.Extraction:
        """The extraction, cancelled as soon as an answer wants the LLM; the sections it read
        are kept, and its next try reads only the rest."""
        key = (job["note_id"], job["content_hash"])
        if self._partial is None or self._partial[0] != key:  # another job's sections go
            self._partial = (key, [])
        replies = self._partial[1]
        before = len(replies)
        preempted = False
        try:
            return await self._preemptible(lambda: extract_mod.extract(
                self.answers._stream, job["text"], job["title"], timeout=self.settings.ollama.timeout, replies=replies))
        except Preempted:
            preempted = True  # the sections read are kept for the next try
            raise
        finally:
            self.sections_done += len(replies) - before
            # a try that read nothing before a question cut it off; any progress ends the streak
            self._fruitless = self._fruitless + 1 if preempted and len(replies) == before else 0
            if not preempted:
                self._partial = None

    async def _preemptible(self, work: Callable):
        """``work()``'s result, its task cancelled (``Preempted``) as soon as an answer wants the LLM."""
        task = asyncio.create_task(work())
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


def outlook(settings: Settings, jobs: int, chars: int, model: str, speed, job_seconds: float | None = None,
            done: int = 0) -> dict:
    """The LLM tier's backlog (``jobs`` holding ``chars`` of note text) in time here:
    ``{"jobs", "seconds", "text", "basis", "too_long"}``; seconds None when nothing is
    measured yet. From the extractions' own mean time once some ran (``job_seconds``),
    else from the model's reading and writing speed (``rag.speed``)."""
    out = {"jobs": jobs, "seconds": None, "text": "", "basis": "", "too_long": False}
    if job_seconds is not None:
        out["seconds"], out["basis"] = jobs * job_seconds, f"{done} extractions here so far"
    elif speed is not None and speed.read_tps and speed.write_tps:
        calls = max(jobs, -(-chars // extract_mod.SECTION_CHARS))
        reading = (calls * speed.tokens(extract_mod.SYSTEM) + speed.tokens("字") * chars) / speed.read_tps
        out["seconds"] = reading + calls * REPLY_TOKENS / speed.write_tps
        out["basis"] = f"{model} reads ~{speed.read_tps:.0f} tok/s, writes ~{speed.write_tps:.1f} tok/s here"
    if out["seconds"] is not None:
        bound = settings.memory.llm_auto_max
        out["too_long"] = settings.memory.llm == "auto" and out["seconds"] > bound
        out["text"] = f"~{_duration(out['seconds'])} to read {jobs} notes ({out['basis']})" + (
            f": not run, as that is longer than memory.llm_auto_max ({_duration(bound)}); measured again when the "
            "box is quiet (memory.llm: on runs it anyway)" if out["too_long"] else "")
    return out


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


duration = _duration  # for the status's lines
