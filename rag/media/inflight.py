"""The status messages of media jobs in flight ("🎙 Transcribing…", "🔎 Reading the image…"):
a row for each while its job runs, kept on disk, so that a daemon stopped or killed in the
middle (the job dies with it) tells each person, when it starts again, that theirs was
interrupted, instead of leaving the message saying forever that it is at work.

A row names the door, the person, where the message is (``place``: what that door needs to
edit it, e.g. a Telegram chat and message id) and the run of the daemon that showed it (a bot
that reconnects in the same run leaves the messages of jobs still running alone); it goes when
the message is settled (what came of the job shown). One SQLite file,
``<state_dir>/media.sqlite`` (WAL)."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rag.sqlite import LockedDB

FILE = "media.sqlite"
MIGRATIONS = [
    """
    CREATE TABLE shown (
        id INTEGER PRIMARY KEY,
        door TEXT NOT NULL,
        person TEXT NOT NULL,
        place TEXT NOT NULL,
        time REAL NOT NULL,
        run TEXT NOT NULL
    );
    CREATE INDEX shown_door ON shown(door)
    """,
]


@dataclass
class Shown:
    """A status message whose job had not ended when it was last known."""

    id: int
    door: str
    person: str
    place: dict
    time: float


class InFlight(LockedDB):
    """The status messages in flight. One connection behind a lock, called from worker threads;
    one store (one ``run``) for the life of a daemon."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        super().__init__(path, MIGRATIONS, "a readable media store ({err}). Move it aside (a new one is started: "
                         "only the status messages of media jobs in flight are in it)")
        self.clock = clock
        self.run = secrets.token_hex(8)

    def shown(self, door: str, person: str, place: dict) -> int:
        """A status message shown for a job that now runs (or waits): its row's id."""
        return self._write(lambda db: db.execute(
            "INSERT INTO shown (door, person, place, time, run) VALUES (?, ?, ?, ?, ?)",
            (door, person, json.dumps(place, sort_keys=True), self.clock(), self.run)).lastrowid)

    def settled(self, shown_id: int) -> None:
        """Its job ended, and the message says what came of it."""
        self._write(lambda db: db.execute("DELETE FROM shown WHERE id = ?", (shown_id,)))

    def left(self, door: str) -> list[Shown]:
        """The messages of ``door`` whose jobs never ended (an earlier run stopped or killed under
        them), oldest first."""
        with self._lock:
            rows = self.db.execute("SELECT id, door, person, place, time FROM shown WHERE door = ? AND run != ? "
                                   "ORDER BY id", (door, self.run)).fetchall()
        return [Shown(i, d, p, json.loads(place), t) for i, d, p, place, t in rows]

    def forget(self, person: str) -> int:
        return self._write(lambda db: db.execute("DELETE FROM shown WHERE person = ?", (person,)).rowcount)
