"""Feed a ``bot.api.metrics.Metrics`` from the sync side: the state read at scrape time, and
the sync passes and answers as they finish.

``state_snapshot(state_dir, source)`` gives the collector a callable that reads the
state through a connection of its own, opened for each scrape: scrapes come from the
HTTP server's worker threads while a pass writes and the event loop reads.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Callable

from rag.answer.service import AnswerService
from bot.api.metrics import AccountState, Metrics, StateSnapshot, UserCounts

from sync.service import SyncService
from sync.state import INDEXED, State


def state_snapshot(state_dir: Path, source: str | None = None) -> Callable[[], StateSnapshot]:
    """A snapshot of the state: every account of ``source`` (all sources when None; an
    account of a source no longer configured would only show a stale age), and notes and
    chunks per user."""

    def snapshot() -> StateSnapshot:
        with closing(State(state_dir)) as state:
            return _read(state, source)

    return snapshot


def _read(state: State, source: str | None) -> StateSnapshot:
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


def attach_metrics(metrics: Metrics, sync: SyncService, answers: AnswerService | None, state_dir: Path) -> None:
    """Count ``sync``'s passes and ``answers``' answers, and report the state in ``state_dir``."""
    sync.observers.append(metrics.observe_pass)
    if answers is not None:
        answers.observers.append(metrics.observe_answer)
    metrics.add_state_collector(state_snapshot(state_dir, sync.source.name))
