"""What our SQLite stores share: opening a file with clear errors, and schema migrations
by ``PRAGMA user_version``."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any, Callable, Self
from pathlib import Path

from rag.errors import BrokenState, UserError

OPEN_TIMEOUT = 10.0  # seconds a new connection waits for another's lock


def open_db(path: Path, migrations: list[str], broken: str) -> sqlite3.Connection:
    """A connection in autocommit mode (WAL, shareable across threads behind the caller's
    lock) with the schema brought up to date. A file or folder that cannot be used is a
    ``UserError``; a file that is not a database is ``BrokenState``, with ``broken`` (what
    it should have been, and what to do) in the message."""
    try:
        db = sqlite3.connect(path, timeout=OPEN_TIMEOUT, isolation_level=None, check_same_thread=False)
    except sqlite3.OperationalError as err:
        raise UserError(f"cannot open {path}: {err}. Make its folder writable by this user") from None
    try:
        wal(db, OPEN_TIMEOUT)
        db.execute("PRAGMA synchronous=NORMAL")
        migrate(db, migrations)
    except sqlite3.OperationalError as err:  # a read-only file or folder, a full disk
        db.close()
        raise UserError(f"cannot use {path}: {err}. Make it and its folder writable by this user") from None
    except sqlite3.DatabaseError as err:  # "file is not a database"
        db.close()
        raise BrokenState(f"{path} is not {broken.format(err=err)}") from None
    return db


def wal(db: sqlite3.Connection, timeout: float) -> None:
    """WAL mode. Switching to it answers "database is locked" at once, without waiting, while
    another connection switches the same new file (processes starting together and opening a new
    store at once): asked again until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def migrate(db: sqlite3.Connection, migrations: list[str]) -> None:
    """Take the schema from its ``user_version`` to ``len(migrations)``, each step in a
    transaction of its own (a connection in autocommit mode: ``isolation_level=None``).
    Statements are split on ``;``, so a step holds no trigger bodies."""
    while db.execute("PRAGMA user_version").fetchone()[0] < len(migrations):
        db.execute("BEGIN IMMEDIATE")
        try:
            # read again under the write lock: another process opening the same new file may have
            # taken it through this step while this one waited
            i = db.execute("PRAGMA user_version").fetchone()[0]
            if i < len(migrations):
                for statement in migrations[i].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {i + 1}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


class LockedDB:
    """A store over one ``open_db`` connection shared by threads behind ``_lock``: closed
    under the lock, and usable as a context manager."""

    def __init__(self, path: Path, migrations: list[str], broken: str):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.db = open_db(self.path, migrations, broken)
        self._writes = 0  # this connection's commits through ``_write``

    def _write(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """``work(db)`` in one transaction (BEGIN IMMEDIATE … COMMIT, ROLLBACK when it raises),
        under the lock; what it returns."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                result = work(self.db)
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
            self._writes += 1
            return result

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
