"""Signing in to the web chat: one-time codes a bot gives a person, and the sessions a code or
an API token opens (``bot.usecases.signin``).

Only hashes are kept (SHA-256 of a random secret of 32 bytes): whoever reads the file cannot
sign in with what it holds. A code is taken once, in one transaction: of two redeems at once,
one wins; it is dead after its time. A session names its person (``telegram:111``, ``api:me``)
and, for one opened with a token, a hash of that token (``proof``): a token replaced in its
variable ends the sessions it opened.

One SQLite file, ``<state_dir>/signin.sqlite`` (WAL), with a schema version (``PRAGMA user_version``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rag.sqlite import LockedDB
from rag.state_dir import prepare_state_dir

FILE = "signin.sqlite"

MIGRATIONS = [
    """
    CREATE TABLE codes (
        hash TEXT PRIMARY KEY,
        person TEXT NOT NULL,
        expires REAL NOT NULL,
        used REAL
    );
    CREATE TABLE sessions (
        hash TEXT PRIMARY KEY,
        person TEXT NOT NULL,
        proof TEXT NOT NULL,
        created REAL NOT NULL,
        expires REAL NOT NULL
    );
    CREATE INDEX sessions_person ON sessions(person)
    """,
]


@dataclass(frozen=True)
class Signed:
    """A session: whose (``person``), the hash of the token that opened it (``proof``, "" for a
    code), and until when."""

    person: str
    proof: str
    expires: float


class SigninStore(LockedDB):
    """The codes and sessions, hashed. One connection behind a lock."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        super().__init__(path, MIGRATIONS, "a readable sign-in store ({err}). Delete it (everyone signs in to the "
                         "web chat again)")
        self.clock = clock

    @classmethod
    def open_for(cls, settings, clock: Callable[[], float] = time.time) -> "SigninStore":
        prepare_state_dir(settings.state_dir)
        return cls(Path(settings.state_dir) / FILE, clock)

    def add_code(self, hashed: str, person: str, ttl: float) -> float:
        """A code for ``person``, good for ``ttl`` seconds; when it ends. The dead ones go."""
        now = self.clock()

        def add(db):
            db.execute("DELETE FROM codes WHERE expires < ?", (now - 86400,))
            db.execute("INSERT INTO codes(hash, person, expires) VALUES (?, ?, ?)", (hashed, person, now + ttl))

        self._write(add)
        return now + ttl

    def take_code(self, hashed: str) -> tuple[str, str]:
        """(``ok``, person), or (``used`` | ``expired`` | ``unknown``, ""): taken once, whoever tries."""
        now = self.clock()

        def take(db) -> tuple[str, str]:
            row = db.execute("SELECT person, expires, used FROM codes WHERE hash = ?", (hashed,)).fetchone()
            if row is None:
                return "unknown", ""
            person, expires, used = row
            if used is not None:
                return "used", ""
            if expires <= now:
                return "expired", ""
            db.execute("UPDATE codes SET used = ? WHERE hash = ?", (now, hashed))
            return "ok", person

        return self._write(take)

    def add_session(self, hashed: str, person: str, proof: str, ttl: float) -> Signed:
        now = self.clock()

        def add(db):
            db.execute("DELETE FROM sessions WHERE expires < ?", (now,))
            db.execute("INSERT INTO sessions(hash, person, proof, created, expires) VALUES (?, ?, ?, ?, ?)",
                       (hashed, person, proof, now, now + ttl))

        self._write(add)
        return Signed(person, proof, now + ttl)

    def session(self, hashed: str) -> Signed | None:
        """The live session with that hash, or None."""
        with self._lock:
            row = self.db.execute("SELECT person, proof, expires FROM sessions WHERE hash = ? AND expires > ?",
                                  (hashed, self.clock())).fetchone()
        return Signed(*row) if row is not None else None

    def end(self, hashed: str) -> bool:
        return bool(self._write(lambda db: db.execute("DELETE FROM sessions WHERE hash = ?", (hashed,)).rowcount))

    def end_all(self, person: str) -> int:
        """Every session of ``person`` ends (their ``/forget``, or signing out everywhere)."""
        return self._write(lambda db: db.execute("DELETE FROM sessions WHERE person = ?", (person,)).rowcount)
