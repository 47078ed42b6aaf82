"""The capture outbox: every capture from chat as a row in ``<state_dir>/capture.sqlite``
until it is written into Leanote (and, briefly, after), with what the writer needs to write
it exactly once: its state and when it is due, the USN before a send, the person it came
from and what it came from (``once``), which login is whose, and the notes ``/append`` and
``/remember`` write to. ``sync.writeback.capture`` writes through it.
"""

from __future__ import annotations

import base64
import json
import secrets
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path

from rag.capture import Attachment
from rag.config import Settings
from rag.state_dir import prepare_state_dir
from rag.sqlite import migrate, wal

FILE = "capture.sqlite"
KEEP_DAYS = 30  # a written or refused capture's row is kept this long, then forgotten
MIGRATIONS = [
    """
    CREATE TABLE items (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL UNIQUE,
        person TEXT NOT NULL,
        user_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        payload TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        next_try REAL NOT NULL DEFAULT 0,
        error TEXT NOT NULL DEFAULT '',
        created REAL NOT NULL,
        finished REAL,
        note_id TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX items_state ON items(state, user_id, id);
    CREATE TABLE targets (
        person TEXT NOT NULL, user_id TEXT NOT NULL, what TEXT NOT NULL, note_id TEXT NOT NULL,
        PRIMARY KEY (person, user_id, what)
    );
    CREATE TABLE notebooks (user_id TEXT NOT NULL, title TEXT NOT NULL, notebook_id TEXT NOT NULL,
        PRIMARY KEY (user_id, title));
    """,
    # sent_at: when the last addNote went out (0: none); usn_before: the user's USN before the
    # first; unanswered: a send got no answer (look for copies once written); check_at: when to
    # look (0: no need); failures: failed tries in a row (the backoff). logins: whose login is whose.
    """
    ALTER TABLE items ADD COLUMN sent_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE items ADD COLUMN usn_before INTEGER;
    ALTER TABLE items ADD COLUMN unanswered INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE items ADD COLUMN check_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE items ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE logins (email TEXT PRIMARY KEY, user_id TEXT NOT NULL);
    """,
    # once: what the capture came from (a chat message, a button's answer), so that the same
    # message delivered again (Telegram re-sends what a poll did not confirm) finds it
    """
    ALTER TABLE items ADD COLUMN once TEXT NOT NULL DEFAULT '';
    CREATE UNIQUE INDEX items_once ON items(person, user_id, once) WHERE once != '';
    """,
    # a login that fails (for ``status``): since when, the error (never the password), whose if known
    """
    CREATE TABLE login_failures (email TEXT PRIMARY KEY, user_id TEXT NOT NULL, error TEXT NOT NULL,
        since REAL NOT NULL);
    """,
    # told: the person got a receipt for it (0: the process ended first; when it is written, they
    # are told then). Captures from before this column were told.
    """
    ALTER TABLE items ADD COLUMN told INTEGER NOT NULL DEFAULT 1;
    """,
]
OPEN_STATES = ("pending", "sending")


@dataclass
class Item:
    id: int
    key: str
    person: str
    user_id: str
    kind: str
    payload: dict
    state: str
    attempts: int
    next_try: float
    error: str
    created: float
    note_id: str = ""
    sent_at: float = 0.0
    usn_before: int | None = None
    unanswered: int = 0
    check_at: float = 0.0
    failures: int = 0
    once: str = ""
    told: int = 1
    files: list[Attachment] = field(default_factory=list)

    def describe(self) -> str:
        what = self.payload.get("title") or self.payload.get("text", "")[:40]
        return f"{self.kind}: {what}"


class Outbox:
    """The captures not yet written (and, briefly, those written), in SQLite."""

    @classmethod
    def counts_at(cls, state_dir: Path, users: list[str] | None = None, accounts: list[str] | None = None) -> dict | None:
        """``counts`` of the outbox in a state directory, and its ``logins_failing`` (of these
        configured accounts); None when there is none (for ``status``)."""
        path = Path(state_dir) / FILE
        if not path.exists():
            return None
        outbox = cls(path)
        try:
            return {**outbox.counts(users), "logins_failing": outbox.login_failures(accounts, users)}
        finally:
            outbox.close()

    @classmethod
    def open_for(cls, settings: Settings) -> "Outbox":
        return cls(prepare_state_dir(Path(settings.state_dir)) / FILE)

    def __init__(self, path: Path):
        self.path = path
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self.lock = threading.RLock()
        with self.lock:
            try:
                wal(self.db, 30)
                migrate(self.db, MIGRATIONS)  # each step under the write lock, also with another opener
            except BaseException:
                self.db.close()
                raise

    def close(self) -> None:
        with self.lock:
            self.db.close()

    def add(self, person: str, user_id: str, kind: str, payload: dict, files: list[Attachment], now: float,
            once: str = "") -> Item:
        """A new capture; ``once``: what it came from (``sqlite3.IntegrityError`` if this person
        and Leanote user have a capture from it already)."""
        key = secrets.token_urlsafe(12)
        stored = {**payload, "files": [{"name": f.filename, "mime": f.mime, "data": base64.b64encode(f.data).decode()}
                                       for f in files]}
        with self.lock:
            cur = self.db.execute(
                "INSERT INTO items (key, person, user_id, kind, payload, created, next_try, once, told) "
                "VALUES (?,?,?,?,?,?,?,?,0)",
                (key, person, user_id, kind, json.dumps(stored, ensure_ascii=False), now, now, once))
            return self.get(cur.lastrowid)

    def from_once(self, person: str, user_id: str, once: str) -> Item | None:
        """The capture this person made into this Leanote user from ``once`` (a message), if any."""
        ids = self._ids("SELECT id FROM items WHERE person = ? AND user_id = ? AND once = ?", (person, user_id, once))
        return self.get(ids[0]) if ids else None

    def told(self, item: Item) -> None:
        """The person has a receipt for it."""
        if not item.told:
            with self.lock:
                self.db.execute("UPDATE items SET told = 1 WHERE id = ?", (item.id,))
            item.told = 1

    def forget(self, item: Item) -> None:
        """A refused capture made again: the new one takes its place (nothing of it was written)."""
        with self.lock:
            self.db.execute("DELETE FROM items WHERE id = ? AND state = 'failed'", (item.id,))

    def get(self, item_id: int) -> Item | None:
        with self.lock:
            row = self.db.execute("SELECT * FROM items WHERE id = ?", (item_id,)).fetchone()
            cols = [d[0] for d in self.db.execute("SELECT * FROM items LIMIT 0").description]
        if row is None:
            return None
        d = dict(zip(cols, row))
        payload = json.loads(d.pop("payload"))
        files = [Attachment(f["name"], base64.b64decode(f["data"]), f["mime"]) for f in payload.pop("files", [])]
        d.pop("finished")
        return Item(payload=payload, files=files, **d)

    def persons(self, prefix: str) -> set[str]:
        """The people whose key starts with ``prefix`` that captures are kept of."""
        with self.lock:
            return {r[0] for r in self.db.execute("SELECT person FROM items UNION SELECT person FROM targets")
                    if r[0].startswith(prefix)}

    def rename_person(self, old: str, new: str) -> int:
        """The captures (and the notes ``/append`` writes to) of person ``old`` become ``new``'s
        (an API token named: ``bot.usecases.people.name_api_people``). How many moved."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                moved = self.db.execute("UPDATE items SET person = ? WHERE person = ?", (new, old)).rowcount
                self.db.execute("UPDATE targets SET person = ? WHERE person = ?", (new, old))
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return moved

    def untold(self, platform: str) -> list[Item]:
        """Captures of a platform's people written or refused whose maker never got a receipt."""
        ids = self._ids("SELECT id FROM items WHERE told = 0 AND state IN ('done', 'failed') AND person LIKE ? "
                        "ORDER BY id", (platform + ":%",))
        return [item for item in map(self.get, ids) if item is not None]

    def _ids(self, sql: str, args=()) -> list[int]:
        with self.lock:
            return [r[0] for r in self.db.execute(sql, args)]

    def due(self, now: float) -> list[Item]:
        """The next capture of each Leanote user, if its time has come: a user's
        captures go in order, and one that waits holds back the ones behind it."""
        ids = self._ids(
            "SELECT MIN(id) FROM items WHERE state IN ('pending', 'sending') GROUP BY user_id")
        items = [self.get(i) for i in ids]
        return [i for i in items if i is not None and i.next_try <= now]

    def head(self, user_id: str, now: float) -> Item | None:
        """This Leanote user's next capture, if its time has come."""
        ids = self._ids("SELECT MIN(id) FROM items WHERE state IN ('pending', 'sending') AND user_id = ?", (user_id,))
        item = self.get(ids[0]) if ids and ids[0] is not None else None
        return item if item is not None and item.next_try <= now else None

    def checks_due(self, now: float, user_id: str | None = None) -> list[Item]:
        """Written captures whose look for a late copy is due."""
        sql = "SELECT id FROM items WHERE state = 'done' AND check_at > 0 AND check_at <= ?"
        args: tuple = (now,)
        if user_id is not None:
            sql += " AND user_id = ?"
            args += (user_id,)
        return [i for i in (self.get(x) for x in self._ids(sql + " ORDER BY id", args)) if i is not None]

    def users_due(self, now: float) -> list[str]:
        """The Leanote users with a capture to write or a write to check now."""
        users = dict.fromkeys(i.user_id for i in self.due(now))
        users.update(dict.fromkeys(i.user_id for i in self.checks_due(now)))
        return list(users)

    def next_due(self, busy: list[str] = ()) -> float | None:
        """When the next capture (the first waiting one of each user) or check is due; users
        in ``busy`` (being written right now) are left out."""
        skip = f" AND user_id NOT IN ({','.join('?' * len(busy))})" if busy else ""
        with self.lock:
            row = self.db.execute(
                f"SELECT MIN(t) FROM (SELECT next_try AS t FROM items WHERE id IN (SELECT MIN(id) FROM items "
                f"WHERE state IN ('pending', 'sending'){skip} GROUP BY user_id) "
                f"UNION ALL SELECT check_at FROM items WHERE state = 'done' AND check_at > 0{skip})",
                (*busy, *busy)).fetchone()
        return row[0]

    def sending(self, item: Item, now: float, adding: bool) -> None:
        """About to send: for a new note (``adding``), when it went out."""
        sent_at = now if adding else 0.0
        with self.lock:
            self.db.execute("UPDATE items SET state = 'sending', attempts = attempts + 1, sent_at = ? WHERE id = ?",
                            (sent_at, item.id))
        item.state, item.sent_at = "sending", sent_at

    def set_usn_before(self, item: Item, usn: int) -> None:
        with self.lock:
            self.db.execute("UPDATE items SET usn_before = ? WHERE id = ?", (usn, item.id))
        item.usn_before = usn

    def mark_unanswered(self, item: Item) -> None:
        """A send of this capture got no answer: once written, it is looked for again (copies)."""
        if not item.unanswered:
            with self.lock:
                self.db.execute("UPDATE items SET unanswered = 1 WHERE id = ?", (item.id,))
            item.unanswered = 1

    def wait_until(self, item: Item, when: float) -> None:
        """Not tried again before ``when`` (an unanswered write may still land); not a failure."""
        with self.lock:
            self.db.execute("UPDATE items SET next_try = ? WHERE id = ?", (when, item.id))
        item.next_try = when

    def done(self, item: Item, note_id: str, now: float, check_at: float = 0.0) -> None:
        """Written: the row stays a while (``/save`` asks where an answer went), its files go.
        ``check_at``: when to look for a late copy of it (a send went unanswered)."""
        with self.lock:
            self.db.execute("UPDATE items SET state = 'done', note_id = ?, finished = ?, error = '', check_at = ?, failures = 0, "
                            "payload = json_remove(payload, '$.files') WHERE id = ?", (note_id, now, check_at, item.id))

    def checked(self, item: Item, again: float = 0.0) -> None:
        """Looked for copies (``again``: could not, look then, backing off)."""
        with self.lock:
            self.db.execute("UPDATE items SET check_at = ?, failures = failures + ? WHERE id = ?",
                            (again, 1 if again else 0, item.id))

    def login_user(self, email: str) -> str | None:
        with self.lock:
            row = self.db.execute("SELECT user_id FROM logins WHERE email = ?", (email,)).fetchone()
        return row[0] if row else None

    def set_login_user(self, email: str, user_id: str) -> None:
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO logins VALUES (?, ?)", (email, user_id))

    def login_failed(self, email: str, user_id: str, error: str, now: float) -> None:
        with self.lock:
            self.db.execute("INSERT INTO login_failures VALUES (?,?,?,?) ON CONFLICT(email) DO UPDATE SET "
                            "error = excluded.error, user_id = CASE WHEN excluded.user_id != '' THEN "
                            "excluded.user_id ELSE login_failures.user_id END", (email, user_id, error, now))

    def login_worked(self, email: str) -> bool:
        """Forget a failing login; whether there was one."""
        with self.lock:
            return self.db.execute("DELETE FROM login_failures WHERE email = ?", (email,)).rowcount > 0

    def login_failures(self, accounts: list[str] | None = None, users: list[str] | None = None) -> list[dict]:
        """The logins that fail, with the captures waiting for them: of these accounts (the
        configured ones), and only these Leanote users' (by user id, or by the account's email
        while its user is not known). A login whose user is not known yet holds the captures of
        every user no login is known for."""
        with self.lock:
            rows = self.db.execute("SELECT email, user_id, error, since FROM login_failures ORDER BY since").fetchall()
            out = []
            for email, user_id, error, since in rows:
                if accounts is not None and email not in accounts:
                    continue
                if users is not None and user_id not in users and email not in {u.lower() for u in users}:
                    continue
                if user_id:
                    waiting = self.db.execute("SELECT COUNT(*) FROM items WHERE state IN ('pending', 'sending') "
                                              "AND user_id = ?", (user_id,)).fetchone()[0]
                else:
                    waiting = self.db.execute("SELECT COUNT(*) FROM items WHERE state IN ('pending', 'sending') "
                                              "AND user_id NOT IN (SELECT user_id FROM logins)").fetchone()[0]
                out.append({"account": email, "user_id": user_id or None, "error": error, "since": since,
                            "waiting": waiting})
        return out

    def prune(self, before: float) -> int:
        """Forget captures written (or refused) before this time."""
        with self.lock:
            return self.db.execute("DELETE FROM items WHERE state IN ('done', 'failed') AND finished < ?",
                                   (before,)).rowcount

    def later(self, item: Item, error: str, when: float) -> None:
        """Not written this time (the outcome is known: nothing was written)."""
        with self.lock:
            self.db.execute("UPDATE items SET state = 'pending', error = ?, next_try = ?, failures = failures + 1 "
                            "WHERE id = ?", (error, when, item.id))

    def unsure(self, item: Item, error: str, when: float) -> None:
        """Not acknowledged: it may have been written; the next try looks first."""
        with self.lock:
            self.db.execute("UPDATE items SET error = ?, next_try = ?, failures = failures + 1, "
                            "unanswered = unanswered OR sent_at > 0 WHERE id = ?", (error, when, item.id))

    def park(self, item: Item, error: str, now: float) -> None:
        with self.lock:
            self.db.execute("UPDATE items SET state = 'failed', error = ?, finished = ? WHERE id = ?",
                            (error, now, item.id))

    def open_items(self, person: str | None = None) -> list[Item]:
        """Waiting and failed captures (a person's, or everyone's), oldest first."""
        sql = "SELECT id FROM items WHERE state IN ('pending', 'sending', 'failed')"
        args: tuple = ()
        if person is not None:
            sql += " AND person = ?"
            args = (person,)
        return [i for i in (self.get(x) for x in self._ids(sql + " ORDER BY id", args)) if i is not None]

    def counts(self, users: list[str] | None = None) -> dict:
        """Captures waiting, parked and written (only these Leanote users' if given)."""
        where, args = "", ()
        if users is not None:
            where, args = f" AND user_id IN ({','.join('?' * len(users))})", tuple(users)
        with self.lock:
            rows = dict(self.db.execute(
                f"SELECT state, COUNT(*) FROM items WHERE 1{where} GROUP BY state", args).fetchall())
            oldest = self.db.execute(
                f"SELECT MIN(created) FROM items WHERE state IN ('pending', 'sending'){where}", args).fetchone()[0]
        return {"waiting": rows.get("pending", 0) + rows.get("sending", 0), "failed": rows.get("failed", 0),
                "written": rows.get("done", 0), "oldest_waiting": oldest}

    def target(self, person: str, user_id: str, what: str) -> str:
        with self.lock:
            row = self.db.execute("SELECT note_id FROM targets WHERE person = ? AND user_id = ? AND what = ?",
                                  (person, user_id, what)).fetchone()
        return row[0] if row else ""

    def set_target(self, person: str, user_id: str, what: str, note_id: str) -> None:
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO targets VALUES (?,?,?,?)", (person, user_id, what, note_id))

    def notebook(self, user_id: str, title: str) -> str:
        with self.lock:
            row = self.db.execute("SELECT notebook_id FROM notebooks WHERE user_id = ? AND title = ?",
                                  (user_id, title)).fetchone()
        return row[0] if row else ""

    def set_notebook(self, user_id: str, title: str, notebook_id: str) -> None:
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO notebooks VALUES (?,?,?)", (user_id, title, notebook_id))

    def waiting_before(self, item: Item) -> bool:
        """An earlier capture of the same Leanote user waits for a retry (so this one waits too)."""
        return bool(self._ids("SELECT id FROM items WHERE user_id = ? AND id < ? AND state IN ('pending', 'sending') "
                              "AND next_try > ? LIMIT 1", (item.user_id, item.id, item.created)))

    def written(self, key: str) -> str:
        """The note a capture went into, once written ("" before, or if unknown)."""
        with self.lock:
            row = self.db.execute("SELECT note_id FROM items WHERE key = ? AND state = 'done'", (key,)).fetchone()
        return row[0] if row else ""

    def has_open(self, person: str, user_id: str, kind: str) -> bool:
        return bool(self._ids("SELECT id FROM items WHERE person = ? AND user_id = ? AND kind = ? "
                              "AND state IN ('pending', 'sending') LIMIT 1", (person, user_id, kind)))
