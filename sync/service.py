"""One sync pass over the configured source, with per-account failure handling.

- snapshot sources (files, mongodump): one ``Indexer.run`` of the whole snapshot;
- incremental sources (leanote_api, mongodb): ``AccountSync`` per account.

Failures are classified once, here: ``Unavailable`` (down, timing out, HTTP 500)
backs that account off exponentially with jitter, ``backoff_min`` doubling up to
``backoff_max``, logged once when failing starts and once on recovery;
``AuthFailed`` stops that account's sync until the process restarts (the fix is a
new password in the environment) and says so. Any other exception is a bug or bad
data: it fails that account alone, with backoff, logged once with its traceback.
A note that cannot be read is not a failure at all: it is skipped and named. Other
accounts always carry on.

``request_stop()`` (SIGTERM) is heard between notes, pages, embedding batches and
accounts, and cuts HTTP calls in flight: the pass ends within seconds, keeping what
it committed; the next one carries on from there.

What is derived from notes (the memory, related notes, the feedback store) is kept in
line by ``sync.derived.Derived``: the indexer hands it each commit's notes, the service
asks it to align with the index at a process's first pass and after every pass that
changed notes, failed or stopped, and to recompute related notes after each pass.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import sqlite3
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from typing import Callable

from rag.config import Settings
from rag.errors import AuthFailed, BrokenState, DiskFull, LeanoteRagError, Unavailable, UserError
from rag.index.note_index import NoteIndex

from sync.derived import Derived
from sync.faults import check_disk, state_fault
from sync.incremental import AccountResult, AccountSync
from sync.indexer import OPTIMIZE_PENDING, Indexer, Stopped, Summary
from sync.progress import Progress, Step, in_the_log
from sync.sources import IncrementalSource, Known, NoteSource
from sync.state import State

log = logging.getLogger(__name__)


@dataclass
class PassResult:
    """What one pass did, per account (the account key is the source name for snapshots)."""

    results: dict[str, AccountResult] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # backing off, or stopped on auth
    seconds: float = 0.0
    stopped: bool = False  # cut short by request_stop(): the next pass carries on
    related: int = 0  # notes whose related notes were recomputed after the pass
    # What stopped every account (sync.faults): the disk full (DiskFull) or the state file
    # damaged (BrokenState); such a pass also has failures["*"].
    fault: LeanoteRagError | None = None

    @property
    def summary(self) -> Summary:
        total = Summary()
        for r in self.results.values():
            total.add(r.summary)
        total.seconds = self.seconds
        return total

    @property
    def ok(self) -> bool:
        return not self.failures


class SyncService:
    def __init__(self, settings: Settings, index: NoteIndex, state: State, source: NoteSource | IncrementalSource,
                 derived: Derived | None = None, clock=time.time, rng=random.random, scheduled: bool = False):
        """The passes from ``source`` into ``index`` and ``state`` (the service closes the
        source), keeping ``derived`` in line (None: the index alone). The stores are the
        caller's: built and closed by the composition root (``bot.root.Parts``).
        ``scheduled``: passes repeat (the daemon), so a failure says when it is retried; a
        one-shot ``index`` just reports it."""
        self.scheduled = scheduled
        self.settings = settings
        self.index = index
        self.state = state
        self.source = source
        self.derived = derived
        self.clock = clock
        self.rng = rng
        self.lock = threading.Lock()  # one pass at a time
        self._stop = threading.Event()
        self._failures: dict[str, int] = {}
        self._auth_failed: dict[str, str] = {}
        self.fault: LeanoteRagError | None = None  # what stopped the last pass for every account, if anything
        self.fault_until = 0.0  # no pass before then (backoff; math.inf: not until a restart)
        self._faults = 0  # passes in a row that met it
        self._disk_checked = 0.0  # monotonic time of the last look at the free space during a pass
        # Called with every finished pass (metrics), in the pass's thread; one that raises is logged.
        self.observers: list[Callable[[PassResult], None]] = []

    def request_stop(self) -> None:
        """End a running pass as soon as it can with consistent state (from any thread)."""
        self._stop.set()
        stop = getattr(self.source, "stop", None)
        if stop:
            stop()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def incremental(self) -> bool:
        return self.settings.source.incremental

    def accounts(self) -> list[str]:
        return self.source.accounts() if self.incremental else [self.source.name]

    def backoff(self, failures: int) -> float:
        """Seconds to wait after the n-th failure in a row: doubling, capped, ±20 % jitter."""
        cfg = self.settings.sync
        base = min(cfg.backoff_max, cfg.backoff_min * 2 ** (failures - 1))
        return min(cfg.backoff_max, base * (0.8 + 0.4 * self.rng()))

    def next_due(self) -> float | None:
        """The earliest time an account in backoff may run again."""
        dues = [a.next_run for a in self.state.accounts() if a.next_run and a.last_error]
        return min(dues) if dues else None

    def _should_stop(self) -> bool:
        """Between notes, pages and batches: a stop asked for, or (looked at once a second)
        ``DiskFull`` raised when the disk is filling up, before the index writes into it."""
        if self._stop.is_set():
            return True
        now = time.monotonic()
        if now - self._disk_checked >= 1.0:
            self._disk_checked = now
            check_disk(self.settings.state_dir)
        return False

    def run_pass(self, reconcile: bool = False, force: bool = False, rebuild: bool = False,
                 progress: Progress | None = None) -> PassResult:
        """Sync every account once. ``force`` ignores backoff (a manual run); ``rebuild``
        empties the index first and reads every note again; ``progress`` hears how far it
        got (``sync.progress.Step``) as it goes; without one, a pass that lasts says so in
        the log once a minute."""
        with self.lock:
            started = time.monotonic()
            if self.fault is not None and not force and self.clock() < self.fault_until:
                return PassResult(failures={"*": str(self.fault)}, fault=self.fault, skipped={"*": self.waiting()})
            try:
                check_disk(self.settings.state_dir)  # before anything writes: the index's mapped files
                result = self._run_logged(reconcile, force, rebuild, progress, started)
            except Exception as err:
                fault = state_fault(err, self.state.path)
                if fault is None:
                    raise
                return self._faulted(fault, started)
            if self.fault is not None and not result.stopped:
                log.info("%s: syncing resumed", "there is room on the disk again" if isinstance(self.fault, DiskFull)
                         else "the sync state can be written again")
                self.fault, self.fault_until, self._faults = None, 0.0, 0
            return result

    def _run_logged(self, reconcile: bool, force: bool, rebuild: bool, progress: Progress | None,
                    started: float) -> PassResult:
        if rebuild:
            log.info("rebuilding the index: every note is read again")
            self.index.reset()
            if self.derived is not None:
                self.derived.reset()
        run_id = self.state.start_run(self.source.name)
        derived = self.derived
        try:
            if derived is not None:
                derived.begin_pass()
            result = self._run_pass(reconcile, force, progress or in_the_log(), counted=progress is not None)
            if derived is not None:
                summary = result.summary
                derived.end_pass(unsettled=bool(summary.changed or summary.not_indexed) or not result.ok or result.stopped,
                                 complete=result.ok and not result.stopped)
        except BaseException as err:
            if state_fault(err, self.state.path) is not None:  # the run's row cannot be written either
                with contextlib.suppress(sqlite3.Error, OSError):
                    self.state.finish_run(run_id, {}, error=f"{type(err).__name__}: {err}")
                raise
            self.state.finish_run(run_id, {}, error=f"{type(err).__name__}: {err}")
            if isinstance(err, Exception):  # observers hear of it as a failed pass
                self._notify(PassResult(failures={"*": f"{type(err).__name__}: {err}"},
                                        seconds=round(time.monotonic() - started, 3)))
            raise
        if derived is not None:
            result.related = derived.refresh_related(should_stop=self._stop.is_set)
        if not result.stopped and self.state.get_meta(OPTIMIZE_PENDING):  # left by a pass that was stopped
            self.index.store.optimize()
            with self.state.transaction():
                self.state.set_meta(OPTIMIZE_PENDING, "")
        error = "; ".join(f"{a}: {e}" for a, e in result.failures.items()) or None
        summary = result.summary.as_json()
        summary["reconcile"] = reconcile
        summary["stopped"] = result.stopped
        summary["related"] = result.related
        summary["failures"] = result.failures  # by account: `status` shows each caller only their own
        self.state.finish_run(run_id, summary, error=error)
        self._notify(result)
        return result

    def _faulted(self, fault: LeanoteRagError, started: float) -> PassResult:
        """A pass that met a fault of every account's: said once, then retried on backoff (a
        full disk) or not before a restart (a damaged state file: retrying cannot mend it)."""
        self._faults = self._faults + 1 if type(self.fault) is type(fault) else 1
        first = self._faults == 1 and self.scheduled  # (a one-shot `index` prints it as its error)
        self.fault = fault
        if isinstance(fault, BrokenState):
            self.fault_until = math.inf
            if first:
                log.error("sync stopped: %s", fault)
        else:
            delay = self.backoff(self._faults)
            self.fault_until = self.clock() + delay
            if first:
                log.warning("sync paused: %s (trying again in %.0f s, backing off)", fault, delay)
            else:
                log.debug("the disk is still full (%d); next try in %.0f s", self._faults, delay)
        result = PassResult(failures={"*": str(fault)}, fault=fault, seconds=round(time.monotonic() - started, 3))
        self._notify(result)
        return result

    def waiting(self) -> str:
        """Until when passes wait after a fault (``fault``)."""
        if self.fault_until == math.inf:
            return "stopped until the state file is mended and serve restarted"
        return f"waiting until {time.strftime('%H:%M:%S', time.localtime(self.fault_until))}"

    def _notify(self, result: PassResult) -> None:
        for observe in self.observers:
            try:
                observe(result)
            except Exception:
                log.exception("a sync pass observer failed (the sync is not affected)")

    def _run_pass(self, reconcile: bool, force: bool, progress: Progress, counted: bool = False) -> PassResult:
        started = time.monotonic()
        result = PassResult()
        rules = self._exclusion_key()  # as this pass starts: a reload may change them while it runs
        if self._exclusions_changed(rules):
            log.info("privacy rules changed: reconciling every account")
            reconcile = True
        try:
            accounts = self.accounts()
        except Exception as err:
            if not self._failures.get("*"):
                log.warning("cannot list the source's accounts: %s", err,
                            exc_info=not isinstance(err, (LeanoteRagError, OSError)))
            self._failures["*"] = self._failures.get("*", 0) + 1
            result.failures["*"] = str(err)
            result.seconds = round(time.monotonic() - started, 3)
            return result
        if self._failures.pop("*", 0):
            log.info("the source answers again")
        for account in accounts:
            if self.stopping:
                result.stopped = True
                break
            if account in self._auth_failed:
                result.skipped[account] = f"stopped: {self._auth_failed[account]}"
                continue
            acc = self.state.account(self.source.name, account)
            now = self.clock()
            if not force and acc.last_error and acc.next_run and acc.next_run > now:
                result.skipped[account] = f"backing off until {time.strftime('%H:%M:%S', time.localtime(acc.next_run))}"
                continue
            try:
                result.results[account] = self._sync_account(account, reconcile, progress, counted)
            except Exception as err:
                if isinstance(err, Stopped) or self.stopping:  # a call cut off by the stop is no failure
                    result.stopped = True
                    log.info("sync of %s stopped on request; the next pass carries on", account)
                    break
                if state_fault(err, self.state.path) is not None:  # the disk or the state: every account's
                    raise
                self._failed(account, err, result)
            else:
                if self._failures.pop(account, 0):
                    log.info("sync of %s recovered", account)
        result.seconds = round(time.monotonic() - started, 3)
        if not result.stopped:  # the rules this pass applied, so rules changed meanwhile reconcile next
            self._remember_exclusions(rules)
        return result

    def _failed(self, account: str, err: Exception, result: PassResult) -> None:
        """Record an account's failure: refused credentials stop it, anything else backs
        it off. An unexpected error is a bug or bad data: its traceback is logged, once."""
        if isinstance(err, AuthFailed):
            self._auth_failed[account] = str(err)
            log.error("sync of %s stopped: %s", account, err)
            self._record_failure(account, f"auth: {err}", next_run=None)
            result.failures[account] = str(err)
            return
        n = self._failures.get(account, 0) + 1
        self._failures[account] = n
        delay = self.backoff(n)
        expected = isinstance(err, (Unavailable, OSError, UserError))
        message = str(err) if expected else f"{type(err).__name__}: {err}"
        if n == 1 and self.scheduled:
            log.warning("sync of %s failing: %s (retrying in %.0f s, backing off)", account, message, delay,
                        exc_info=None if expected else err)
        elif n == 1:
            log.warning("sync of %s failed: %s", account, message, exc_info=None if expected else err)
        if n == 1 and getattr(err, "details", None):  # the libraries' own words: in the log, and with -v
            log.info("sync of %s: %s", account, err.details)
        else:
            log.debug("sync of %s failed again (%d): %s; next try in %.0f s", account, n, message, delay)
        self._record_failure(account, message, next_run=self.clock() + delay)
        result.failures[account] = message

    def _sync_account(self, account: str, reconcile: bool, progress: Progress, counted: bool = False) -> AccountResult:
        """One account's part of a pass. ``counted``: someone waits for it (``index``, the
        API): a snapshot's notes are counted first, for the share done and the time left."""
        if not self.incremental:
            indexer = Indexer(self.index, self.state, self.source.name, should_stop=self._should_stop,
                              derived=self.derived, settings=self.settings)
            step = Step(self.source.name, total=len(self.source) if counted else None)

            def tick(seen: int, embedded: int) -> None:
                step.notes, step.chunks = seen, embedded
                if step.total:
                    step.done = seen / step.total
                progress(step)

            indexer.progress = tick
            # the source looks at the folder or backup anew and reads only what changed since
            # the last pass; a reconcile (privacy rules changed, the daily one) reads everything
            known = Known() if reconcile else indexer.known()
            with closing(self.source.notes(known)) as items:  # a stop ends it now: temp files go
                summary = indexer.run(items)
            acc = self.state.account(self.source.name, account)
            acc.last_attempt = acc.last_success = self.clock()
            acc.last_error = acc.failing_since = acc.next_run = None
            with self.state.transaction():
                self.state.put_account(acc)
            return AccountResult(account, "", 0, 0, summary)
        session = self.source.session(account)
        try:
            job = AccountSync(self.index, self.state, self.source.name, session, clock=self.clock,
                              should_stop=self._should_stop, derived=self.derived, progress=progress)
            result = job.reconcile() if reconcile else job.run()
            if reconcile:  # a reconcile also catches up with the stream of changes
                more = AccountSync(self.index, self.state, self.source.name, session, clock=self.clock,
                                   should_stop=self._should_stop, derived=self.derived, progress=progress).run()
                more.summary.add(result.summary)
                result = more
            return result
        finally:
            session.close()

    def _record_failure(self, account: str, error: str, next_run: float | None) -> None:
        acc = self.state.account(self.source.name, account)
        acc.last_attempt = self.clock()
        acc.last_error = error
        acc.failing_since = acc.failing_since or self.clock()
        acc.next_run = next_run
        with self.state.transaction():
            self.state.put_account(acc)

    def _exclusion_key(self) -> str:
        return json.dumps(self.settings.exclude.model_dump(), sort_keys=True, ensure_ascii=False)

    def _exclusions_changed(self, rules: str) -> bool:
        seen = self.state.get_meta(f"exclude:{self.source.name}")
        return seen is not None and seen != rules

    def _remember_exclusions(self, rules: str) -> None:
        with self.state.transaction():
            self.state.set_meta(f"exclude:{self.source.name}", rules)

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if close:
            close()

