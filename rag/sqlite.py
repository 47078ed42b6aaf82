"""What our SQLite files share: schema migrations by ``PRAGMA user_version``."""

from __future__ import annotations

import sqlite3


def migrate(db: sqlite3.Connection, migrations: list[str]) -> None:
    """Take the schema from its ``user_version`` to ``len(migrations)``, each step in a
    transaction of its own (a connection in autocommit mode: ``isolation_level=None``).
    Statements are split on ``;``, so a step holds no trigger bodies."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    for i in range(version, len(migrations)):
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in migrations[i].split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {i + 1}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
