"""Prometheus metrics for monitoring a ``serve`` daemon: sync health, passes, answers, bot errors.

One ``Metrics`` owns a dedicated ``CollectorRegistry`` (never the global one), so several
daemons, or tests, in one process do not collide. It is fed three ways:

- events, as they finish: ``observe_pass`` (a ``SyncService`` observer), ``observe_answer``
  (an ``AnswerService`` observer), ``bot_error`` (the bots' error paths);
- the sync state, read at scrape time by a collector (``add_state_collector``): always
  current, no hooks. The collector takes a callable returning plain data
  (``StateSnapshot``); ``attach_metrics`` gives it one that reads the state through a
  connection of its own, opened by the composition root for each scrape (scrapes come from
  the HTTP server's worker threads while a pass writes and the event loop reads);
- the process collector (CPU, memory, open files), the GC and platform collectors.

``exposition()`` renders the registry for ``GET /metrics``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from prometheus_client import (CollectorRegistry, Counter, GCCollector, Histogram, PlatformCollector, ProcessCollector,
                               disable_created_metrics)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from rag.answer.types import OUTCOMES, Answer

from sync.state import INDEXED, State

if TYPE_CHECKING:
    from bot.root import Parts

log = logging.getLogger(__name__)

PREFIX = "leanote_rag"
# The answer stages of ``Answer.timings_ms``, in pipeline order. Each is a milestone in ms
# since the question arrived; the histogram gets each stage's own duration (the time
# since the previous milestone present), and ``total`` the whole answer.
STAGES = ("rewrite", "retrieve", "rerank", "first_token")
PASS_OUTCOMES = ("ok", "failed", "stopped")
NOTE_CHANGES = ("added", "updated", "moved", "deleted")
PLATFORMS = ("telegram", "discord")
# An idle pass takes ~10 ms, a first full index of thousands of notes many minutes.
PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# Retrieval takes ms; a 7B model on a CPU can take minutes to its first token.
STAGE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)


# --- the sync state as plain data (what ``add_state_collector``'s callable returns) ------------

@dataclass(frozen=True)
class AccountState:
    """One (source, account): for snapshot sources the account is the source's name."""

    source: str
    account: str
    cursor_usn: int = 0
    server_usn: int | None = None  # None: never asked (snapshot sources, or never reached)
    last_success: float | None = None  # unix seconds
    failing: bool = False  # backing off, or stopped on refused credentials
    failing_since: float | None = None  # unix seconds, while failing
    last_error_at: float | None = None  # unix seconds of the last failure, while failing
    notes_indexed: int = 0
    notes_skipped: int = 0  # notes that could not be read, until they are read successfully


@dataclass(frozen=True)
class UserCounts:
    user_id: str
    notes: int
    chunks: int


@dataclass(frozen=True)
class StateSnapshot:
    accounts: list[AccountState] = field(default_factory=list)
    users: list[UserCounts] = field(default_factory=list)


class PassLike(Protocol):
    """What ``observe_pass`` reads of ``sync.service.PassResult``."""

    failures: dict
    stopped: bool
    seconds: float

    @property
    def summary(self): ...


# --- the registry and its instruments ----------------------------------------------------------

class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, process: bool = True):
        # No ``*_created`` series beside each counter and histogram: in the text format they
        # are plain gauges that double the series count. (A process-wide switch.)
        disable_created_metrics()
        self.registry = registry or CollectorRegistry()
        r = self.registry
        if process:
            ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, …
            GCCollector(registry=r)
            PlatformCollector(registry=r)
        self.pass_seconds = Histogram(f"{PREFIX}_sync_pass_duration_seconds", "Duration of sync passes",
                                      buckets=PASS_BUCKETS, registry=r)
        self.passes = Counter(f"{PREFIX}_sync_passes", "Sync passes by outcome (ok, failed: an account or the "
                              "source failed, stopped: cut short by a stop)", ["outcome"], registry=r)
        self.notes = Counter(f"{PREFIX}_sync_notes", "Notes changed in the index by sync passes", ["change"],
                             registry=r)
        self.chunks_embedded = Counter(f"{PREFIX}_sync_chunks_embedded", "Chunks embedded by sync passes (not "
                                       "from the embedding cache)", registry=r)
        self.answers = Counter(f"{PREFIX}_answers", "Answers by outcome (llm: grounded LLM answer, llm_passages: "
                               "the LLM refused or answered from nothing in the evidence, passages instead, "
                               "refused: no evidence or a name no note mentions, no LLM call, fallback: "
                               "the LLM failed, passages instead, extractive: no LLM configured)", ["outcome"],
                               registry=r)
        self.answer_seconds = Histogram(f"{PREFIX}_answer_stage_duration_seconds", "Duration of each answer "
                                        "stage (rewrite, retrieve, rerank, first_token: from the end of the "
                                        "previous stage to the LLM's first token) and of the whole answer (total)",
                                        ["stage"], buckets=STAGE_BUCKETS, registry=r)
        self.bot_errors = Counter(f"{PREFIX}_bot_errors", "Unexpected errors while answering or searching in a "
                                  "chat", ["platform"], registry=r)
        # every known label value from the start: rate() and increase() see the first event
        for outcome in PASS_OUTCOMES:
            self.passes.labels(outcome)
        for change in NOTE_CHANGES:
            self.notes.labels(change)
        for outcome in OUTCOMES:
            self.answers.labels(outcome)
        for platform in PLATFORMS:
            self.bot_errors.labels(platform)
        self._state: _StateCollector | None = None

    # --- events ----------------------------------------------------------------------------

    def observe_pass(self, result: PassLike) -> None:
        """A finished sync pass (a ``SyncService`` observer)."""
        outcome = "failed" if result.failures else "stopped" if result.stopped else "ok"
        self.passes.labels(outcome).inc()
        self.pass_seconds.observe(max(0.0, float(result.seconds)))
        summary = result.summary
        for change in NOTE_CHANGES:
            n = getattr(summary, change, 0)
            if n:
                self.notes.labels(change).inc(n)
        if summary.chunks_embedded:
            self.chunks_embedded.inc(summary.chunks_embedded)

    def observe_answer(self, answer: Answer) -> None:
        """A finished answer (an ``AnswerService`` observer)."""
        outcome = answer.trace.outcome if answer.trace is not None else ""
        if outcome in OUTCOMES:
            self.answers.labels(outcome).inc()
        timings = answer.timings_ms or {}
        previous = 0.0
        for stage in STAGES:
            at = timings.get(stage)
            if at is None:
                continue
            self.answer_seconds.labels(stage).observe(max(0.0, at - previous) / 1000)
            previous = at
        if "total" in timings:
            self.answer_seconds.labels("total").observe(timings["total"] / 1000)

    def bot_error(self, platform: str) -> None:
        self.bot_errors.labels(platform).inc()

    # --- the state, at scrape time ---------------------------------------------------------

    def add_state_collector(self, read_state: Callable[[], StateSnapshot]) -> None:
        """Report the sync state at each scrape, read by ``read_state`` (called from the
        scraping thread; it must be safe there). A second call replaces the reader (a
        daemon that opened its state again)."""
        if self._state is not None:
            self._state.read_state = read_state
            return
        self._state = _StateCollector(read_state)
        self.registry.register(self._state)

    # --- the endpoint ----------------------------------------------------------------------

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The body and Content-Type for ``GET /metrics``; pass the request's Accept header
        to offer OpenMetrics to a scraper that asks for it (else the classic text format)."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type


class _StateCollector(Collector):
    """Per account and per user, from a fresh snapshot at every scrape. A snapshot that
    cannot be read gives ``leanote_rag_state_readable 0`` (logged once) instead of a
    failed scrape: the process metrics still arrive."""

    def __init__(self, read_state: Callable[[], StateSnapshot]):
        self.read_state = read_state
        self._lock = threading.Lock()  # one read at a time, whatever thread scrapes
        self._failing = False

    def describe(self) -> Iterable[Metric]:
        return [_readable(), *(family for family, _ in self._families())]

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            try:
                snap = self.read_state()
            except Exception as err:
                if not self._failing:
                    log.warning("metrics: cannot read the sync state: %s", err, exc_info=True)
                self._failing = True
                snap = None
            else:
                if self._failing:
                    log.info("metrics: the sync state is readable again")
                self._failing = False
        readable = _readable()
        readable.add_metric([], 0.0 if snap is None else 1.0)
        yield readable
        if snap is None:
            return
        for family, value in self._families():
            if family.name.startswith(f"{PREFIX}_user_"):
                for u in snap.users:
                    family.add_metric([u.user_id], value(u))
            else:
                for a in snap.accounts:
                    v = value(a)
                    if v is not None:
                        family.add_metric([a.source, a.account], float(v))
            yield family

    @staticmethod
    def _families():
        acc, user = ["source", "account"], ["user_id"]

        def g(name, doc, labels):
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        return [
            (g("account_lag_usn", "Server USN minus the sync cursor (absent until the server was asked)", acc),
             lambda a: a.server_usn - a.cursor_usn if a.server_usn is not None else None),
            (g("account_last_success_timestamp_seconds", "When the account last synced successfully", acc),
             lambda a: a.last_success),
            (g("account_failing", "1 while the account's sync is failing (backing off, or stopped on refused "
               "credentials)", acc), lambda a: int(a.failing)),
            (g("account_failing_since_timestamp_seconds", "When the current run of failures began (absent when "
               "healthy)", acc), lambda a: a.failing_since),
            (g("account_last_error_timestamp_seconds", "When the account last failed (absent when healthy)", acc),
             lambda a: a.last_error_at),
            (g("account_notes_indexed", "Notes of the account in the index", acc), lambda a: a.notes_indexed),
            (g("account_notes_skipped", "Notes that could not be read or indexed (malformed, not text), until "
               "read successfully", acc), lambda a: a.notes_skipped),
            (g("user_notes_indexed", "Notes in the index per Leanote user", user), lambda u: u.notes),
            (g("user_chunks_indexed", "Chunks in the index per Leanote user", user), lambda u: u.chunks),
        ]


def _readable() -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_state_readable", "1 when the sync state could be read for this scrape")


def state_snapshot(state: State, source: str | None = None) -> StateSnapshot:
    """What the state says of every account of ``source`` (all sources when None; an account of
    a source no longer configured would only show a stale age), and of notes and chunks per user."""
    db = state.db
    skipped = dict(((s, a), n) for s, a, n in db.execute(
        "SELECT source, account, COUNT(*) FROM skipped GROUP BY source, account"))
    accounts = []
    for a in state.accounts():
        if source is not None and a.source != source:
            continue
        # a snapshot source has one account named after it; its notes carry account ""
        key = "" if a.account == a.source else a.account
        failing = a.last_error is not None
        accounts.append(AccountState(
            source=a.source, account=a.account, cursor_usn=a.cursor, server_usn=a.server_usn,
            last_success=a.last_success, failing=failing,
            failing_since=a.failing_since if failing else None,
            last_error_at=a.last_attempt if failing else None,
            notes_indexed=state.indexed_count(a.source, key),
            notes_skipped=skipped.get((a.source, key), 0),
        ))
    chunks = dict(db.execute(
        "SELECT user_id, SUM(json_array_length(point_ids)) FROM notes WHERE status = ? GROUP BY user_id",
        (INDEXED,)))
    users = [UserCounts(u, n, int(chunks.get(u) or 0)) for u, n in sorted(state.counts_by_user().items())]
    return StateSnapshot(accounts, users)


def attach_metrics(metrics: Metrics, parts: "Parts") -> None:
    """Count the passes of ``parts``' sync and the answers of its answer service (when built),
    and report the state at each scrape."""
    sync = parts.sync
    sync.observers.append(metrics.observe_pass)
    if parts.built("answers"):
        parts.answers.observers.append(metrics.observe_answer)
    source = sync.source.name
    metrics.add_state_collector(lambda: parts.read_state(lambda state: state_snapshot(state, source)))
    if parts.settings.memory.enabled and parts.settings.memory.questions != "off":
        metrics.registry.register(_QuestionsCollector(lambda: parts.memory_to_read))


class _QuestionsCollector(Collector):
    """The written questions (``rag.memory.asked``): notes done, waiting, dropped, the ETA."""

    def __init__(self, memory: Callable[[], object]):
        self.memory = memory

    def collect(self) -> Iterable[Metric]:
        memory = self.memory()
        if memory is None:
            return
        try:
            c = memory.asked_counts()
        except Exception as err:  # a scrape never fails for it
            log.debug("metrics: cannot read the written questions: %s", err)
            return
        for name, doc, value in (
                ("questions_notes", "Notes whose questions the LLM has written", c["notes"]),
                ("questions_written", "Written questions in the index's entries", c["questions"]),
                ("questions_jobs_pending", "Notes whose questions wait to be written", c["jobs_pending"]),
                ("questions_generations_dropped", "Generations dropped by the checks (nothing indexed)",
                 c["generations_dropped"]),
                ("questions_output_tokens", "Tokens the LLM wrote for the questions", c["output_tokens"]),
                ("questions_eta_seconds", "Time the waiting notes would take at the measured speed",
                 c["eta_seconds"])):
            if value is not None:
                family = GaugeMetricFamily(f"{PREFIX}_{name}", doc)
                family.add_metric([], float(value))
                yield family
