"""Capture from chat into Leanote: a durable outbox, written through Leanote's API.

The notes stay the single source of truth: a capture becomes a note in the person's
own Leanote account (the login of a ``leanote_api`` source account, or of
``capture.accounts``), and reaches the index like any note, through the next sync
pass, which runs ``capture.sync_after`` after a write.

- **Durable.** Every capture is first a row in ``<state_dir>/capture.sqlite``, then
  written. While Leanote is down or the login fails, it waits there and is tried
  again with backoff (``capture.retry_min`` doubling to ``retry_max``), each Leanote
  user's captures in the order they were made; the person is told it is queued.
- **Exactly once.** Before a write goes out, its row says ``sending``; every note or
  block we write carries the capture's key in a hidden marker line (``rag.capture``).
  A row found ``sending`` (the process died between Leanote's write and our
  acknowledgement) is looked for in Leanote before it is sent again.
- **Never overwrites an edit.** ``/append`` and ``/remember`` read the note and send it
  back with its ``Usn``; when someone changed it meanwhile Leanote answers
  ``conflict`` and changes nothing, and we read it again and retry.
- **Refusals stay small.** Leanote refusing a capture (a file too large) parks that
  one capture with the reason, shown in ``/outbox`` and ``status``; the rest go on.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

from rag.capture import (Attachment, Origin, Quote, Receipt, answer_note, compose, has_marker, md_escape,
                         md_label, with_marker)
from rag.config import Account, Settings, secret
from rag.errors import AuthFailed, LeanoteRagError, Refused, Unavailable

from .sources.leanote_api import LeanoteApi, LeanoteWriter

log = logging.getLogger(__name__)

FILE = "capture.sqlite"
CONFLICT_RETRIES = 5
KEEP_DAYS = 30  # a written or refused capture's row is kept this long, then forgotten
WAIT_FOR_WRITE = 8.0  # a capture answers "written" if Leanote took it within this, else "queued"
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
    files: list[Attachment] = field(default_factory=list)

    def describe(self) -> str:
        what = self.payload.get("title") or self.payload.get("text", "")[:40]
        return f"{self.kind}: {what}"


class Outbox:
    """The captures not yet written (and, briefly, those written), in SQLite."""

    @classmethod
    def counts_at(cls, state_dir: Path, users: list[str] | None = None) -> dict | None:
        """``counts`` of the outbox in a state directory, None when there is none (for ``status``)."""
        path = Path(state_dir) / FILE
        if not path.exists():
            return None
        outbox = cls(path)
        try:
            return outbox.counts(users)
        finally:
            outbox.close()

    def __init__(self, path: Path):
        self.path = path
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self.lock = threading.RLock()
        with self.lock:
            self.db.execute("PRAGMA journal_mode=WAL")
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            for i, step in enumerate(MIGRATIONS[version:], start=version):
                self.db.executescript(f"BEGIN; {step}; PRAGMA user_version = {i + 1}; COMMIT;")

    def close(self) -> None:
        with self.lock:
            self.db.close()

    def add(self, person: str, user_id: str, kind: str, payload: dict, files: list[Attachment], now: float) -> Item:
        key = secrets.token_urlsafe(12)
        stored = {**payload, "files": [{"name": f.filename, "mime": f.mime, "data": base64.b64encode(f.data).decode()}
                                       for f in files]}
        with self.lock:
            cur = self.db.execute(
                "INSERT INTO items (key, person, user_id, kind, payload, created, next_try) VALUES (?,?,?,?,?,?,?)",
                (key, person, user_id, kind, json.dumps(stored, ensure_ascii=False), now, now))
            return self.get(cur.lastrowid)

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

    def next_due(self) -> float | None:
        with self.lock:
            row = self.db.execute("SELECT MIN(next_try) FROM items WHERE state IN ('pending', 'sending')").fetchone()
        return row[0]

    def sending(self, item: Item) -> None:
        with self.lock:
            self.db.execute("UPDATE items SET state = 'sending', attempts = attempts + 1 WHERE id = ?", (item.id,))
        item.state = "sending"

    def done(self, item: Item, note_id: str, now: float) -> None:
        """Written: the row stays a while (``/save`` asks where an answer went), its files go."""
        with self.lock:
            self.db.execute("UPDATE items SET state = 'done', note_id = ?, finished = ?, error = '', "
                            "payload = json_remove(payload, '$.files') WHERE id = ?", (note_id, now, item.id))

    def prune(self, before: float) -> int:
        """Forget captures written (or refused) before this time."""
        with self.lock:
            return self.db.execute("DELETE FROM items WHERE state IN ('done', 'failed') AND finished < ?",
                                   (before,)).rowcount

    def later(self, item: Item, error: str, when: float) -> None:
        """Not written this time (the outcome is known: nothing was written)."""
        with self.lock:
            self.db.execute("UPDATE items SET state = 'pending', error = ?, next_try = ? WHERE id = ?",
                            (error, when, item.id))

    def unsure(self, item: Item, error: str, when: float) -> None:
        """Not acknowledged: it may have been written; the next try looks first."""
        with self.lock:
            self.db.execute("UPDATE items SET error = ?, next_try = ? WHERE id = ?", (error, when, item.id))

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


class Capture:
    """Captures from chat: checked, queued, written in the background (``run``)."""

    def __init__(self, settings: Callable[[], Settings], on_written: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.time):
        """``settings``: read at each use (a reload applies at once); ``on_written``:
        called after each write (the daemon schedules a sync pass)."""
        self._settings = settings
        self.on_written = on_written
        self.clock = clock
        state_dir = Path(settings().state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.outbox = Outbox(state_dir / FILE)
        self._apis: dict[str, LeanoteApi] = {}  # account email -> its connection
        self._users: dict[str, str] = {}  # Leanote user id -> account email
        self._rates: dict[str, deque] = {}
        self._wake = asyncio.Event()
        self._finished: dict[int, asyncio.Event] = {}
        self._lock = threading.Lock()

    @property
    def settings(self) -> Settings:
        return self._settings()

    def close(self) -> None:
        for api in self._apis.values():
            api.stop()
            api.http.close()
        self.outbox.close()

    # --- accounts -------------------------------------------------------------------------

    def _accounts(self) -> list[Account]:
        s = self.settings
        accounts = list(s.capture.accounts)
        if s.source.kind == "leanote_api":
            accounts += [a for a in s.source.accounts if a.email.lower() not in {b.email.lower() for b in accounts}]
        return accounts

    def _base_url(self) -> str:
        s = self.settings
        return (s.capture.api_url or s.source.api_url or s.leanote.base_url).rstrip("/")

    def how_to_enable(self) -> str:
        return ("记录需要你的 Leanote 账号通过 API 登录：请主人在配置里 capture.accounts 加上你的 email 和 password_env。 / "
                "Capture writes through Leanote's API with your account: ask the owner to add your email and "
                "password_env under capture.accounts in the config.")

    def _writer(self, user_id: str) -> LeanoteWriter | None:
        """The login writing as this Leanote user; None when no configured account is
        theirs. Accounts are logged in to learn whose they are (Unavailable if Leanote is down)."""
        with self._lock:
            email = self._users.get(user_id)
            if email is None:
                for account in self._accounts():
                    key = account.email.strip().lower()
                    if key in self._users.values():
                        continue
                    api = self._api(account)
                    if not api.user_id:
                        api.login()
                    self._users[api.user_id] = key
                email = self._users.get(user_id)
            if email is None:
                return None
            account = next((a for a in self._accounts() if a.email.strip().lower() == email), None)
            return LeanoteWriter(self._api(account)) if account is not None else None

    def _api(self, account: Account) -> LeanoteApi:
        key = account.email.strip().lower()
        api = self._apis.get(key)
        if api is None:
            password = secret(account.password_env, f"the password_env of account {account.email}")
            api = LeanoteApi(self._base_url(), key, password, timeout=self.settings.sync.http_timeout)
            self._apis[key] = api
        return api

    # --- asking ---------------------------------------------------------------------------

    def available(self) -> str | None:
        """Why nothing can be captured at all (turned off, no API account), or None. Counts nothing:
        a bot asks before it downloads a file."""
        if not self.settings.capture.enabled:
            return "记录功能已关闭。 / Capture is turned off (capture.enabled)."
        if not self._accounts():
            return self.how_to_enable()
        return None

    def refusal(self, person: str, text: str, files: list[Attachment]) -> str | None:
        """Why this capture cannot be taken (off, too long, too large, too often), or None;
        a capture that may go ahead counts against the person's rate limit."""
        cfg = self.settings.capture
        why = self.available()
        if why:
            return why
        if len(text) > cfg.max_chars:
            return (f"太长了：最多 {cfg.max_chars} 个字符（这条 {len(text)}）。 / Too long: at most {cfg.max_chars} "
                    f"characters ({len(text)} here).")
        for f in files:
            if len(f.data) > cfg.max_file_mb * 1024 * 1024:
                return (f"文件 {f.filename} 太大：最多 {cfg.max_file_mb:g} MB。 / {f.filename} is too large: at most "
                        f"{cfg.max_file_mb:g} MB.")
        now = self.clock()
        window = self._rates.setdefault(person, deque())
        while window and now - window[0] >= 60:
            window.popleft()
        if len(window) >= cfg.rate_limit:
            return (f"慢一点：每分钟最多记录 {cfg.rate_limit} 条。 / Easy there: {cfg.rate_limit} captures a minute; "
                    f"try again in {60 - (now - window[0]):.0f} s.")
        window.append(now)
        return None

    async def note(self, person: str, user_id: str, text: str, *, origin: Origin | None = None,
                   files: list[Attachment] = (), title: str = "", quote: Quote | None = None) -> Receipt:
        """A new note in the inbox notebook: ``text`` is the person's own (their Markdown),
        ``quote`` someone else's text (a forward, a saved message: shown as written)."""
        files = list(files)
        if not text.strip() and not files and not (quote and quote.text.strip()):
            return Receipt("refused", "要记什么？在 /note 后面写上内容。 / What should I note? Write it after /note.")
        if not title and not text.strip() and not (quote and quote.text.strip()) and files:
            title = files[0].filename  # a file alone: its name is the title (and not Markdown in the body)
        draft = compose(text, extra_tags=list(self.settings.capture.tags), origin=origin, title=title,
                        when=datetime.now(), quote=quote)
        payload = {"title": draft.title, "content": draft.content, "tags": draft.tags}
        return await self._submit(person, user_id, "note", payload, files,
                                  "\n\n".join(t for t in (text, quote.text if quote else "") if t))

    async def save_answer(self, person: str, user_id: str, question: str, answer: str,
                          citations: list[dict]) -> Receipt:
        draft = compose(answer_note(question, answer, citations), extra_tags=list(self.settings.capture.tags),
                        title=question)
        payload = {"title": draft.title, "content": draft.content, "tags": draft.tags}
        return await self._submit(person, user_id, "save", payload, [], question + answer)

    async def append(self, person: str, user_id: str, text: str) -> Receipt:
        """More text at the end of the last note this person captured."""
        if not text.strip():
            return Receipt("refused", "要追加什么？在 /append 后面写上内容。 / Append what? Write it after /append.")
        if not (self.outbox.target(person, user_id, "last") or self.outbox.has_open(person, user_id, "note")):
            return Receipt("refused", "还没有可追加的笔记：先用 /note 记一条。 / Nothing to append to yet: "
                                      "capture a note with /note first.")
        return await self._submit(person, user_id, "append", {"text": text.strip()}, [], text)

    async def remember(self, person: str, user_id: str, text: str) -> Receipt:
        """A dated line in this person's memory note."""
        if not text.strip():
            return Receipt("refused", "要记住什么？在 /remember 后面写上。 / Remember what? Write it after /remember.")
        line = f"- {datetime.now().strftime('%Y-%m-%d %H:%M')} {' '.join(text.split())}"
        return await self._submit(person, user_id, "remember", {"text": line}, [], text)

    async def _submit(self, person: str, user_id: str, kind: str, payload: dict, files: list[Attachment],
                      text: str) -> Receipt:
        why = self.refusal(person, text, files)
        if why:
            return Receipt("refused", why)
        item = self.outbox.add(person, user_id, kind, payload, files, self.clock())
        if self.outbox.waiting_before(item):  # behind a capture Leanote did not take yet: queued now
            self._wake.set()
            return self.receipt(item)
        done = self._finished.setdefault(item.id, asyncio.Event())
        self._wake.set()
        try:
            await asyncio.wait_for(done.wait(), WAIT_FOR_WRITE)
        except asyncio.TimeoutError:
            pass
        finally:
            self._finished.pop(item.id, None)
        return self.receipt(self.outbox.get(item.id))

    def receipt(self, item: Item) -> Receipt:
        base = self.settings.leanote.base_url
        if item.state == "done":
            url = f"{base}/note/{item.note_id}"
            what = {"note": "已记下", "save": "已保存", "append": "已追加", "remember": "记住了"}[item.kind]
            return Receipt("written", f"{what} ✅ {url}", item.note_id, url, item.key)
        if item.state == "failed":
            return Receipt("refused", f"没能写入 Leanote：{item.error} / Leanote did not take it: {item.error}", key=item.key)
        reason = f"（{item.error}）" if item.error else ""
        return Receipt("queued", f"Leanote 暂时写不进去{reason}，已排队，稍后自动重试；/outbox 可查看。 / Leanote cannot "
                                 f"take it right now; it is queued and will be retried (see /outbox).", key=item.key)

    def note_for(self, key: str) -> str:
        """The note id a capture (by its receipt's ``key``) was written to; "" until then."""
        return self.outbox.written(key)

    def pending(self, person: str) -> list[Item]:
        return self.outbox.open_items(person)

    def counts(self, users: list[str] | None = None) -> dict:
        return self.outbox.counts(users)

    # --- writing --------------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        """Write what is due, then sleep until the next is due or a capture arrives."""
        while not stopping.is_set():
            self.outbox.prune(self.clock() - KEEP_DAYS * 86400)
            await self.drain(stopping)
            nxt = self.outbox.next_due()
            wait = 30.0 if nxt is None else min(30.0, max(0.05, nxt - self.clock()))
            self._wake.clear()
            waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stopping.wait())]
            await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()

    async def drain(self, stopping: asyncio.Event | None = None) -> int:
        """Write every capture that is due, each user's in order; how many were written.
        A stop is heard between captures (what is not written stays in the outbox)."""
        written = 0
        while True:
            due = self.outbox.due(self.clock())
            if not due:
                return written
            progressed = False
            for item in due:
                if stopping is not None and stopping.is_set():
                    return written
                state = await asyncio.to_thread(self._deliver, item)
                event = self._finished.get(item.id)
                if event is not None:  # the person hears now: written, refused, or queued
                    event.set()
                if state == "done":
                    written += 1
                    self.on_written()
                progressed = progressed or state in ("done", "failed")
            if not progressed:
                return written

    def _deliver(self, item: Item) -> str:
        """Write one capture: "done", "failed" (parked) or "retry" (later)."""
        now = self.clock
        try:
            writer = self._writer(item.user_id)
            if writer is None:
                self.outbox.park(item, "no Leanote API account for this user: " + self.how_to_enable(), now())
                return "failed"
            if item.kind in ("note", "save"):
                note_id = self._write_note(writer, item)
                if item.kind == "note":
                    self.outbox.set_target(item.person, item.user_id, "last", note_id)
            else:
                note_id = self._write_append(writer, item)
            self.outbox.done(item, note_id, now())
            log.info("capture %s (%s) written to note %s", item.key, item.kind, note_id)
            return "done"
        except Refused as err:
            if err.reason in ("conflict",):  # kept conflicting: try again later
                self._retry(item, str(err), sure=True)
                return "retry"
            self.outbox.park(item, str(err), now())
            log.warning("capture %s refused by Leanote: %s", item.key, err)
            return "failed"
        except (Unavailable, AuthFailed, OSError) as err:
            self._retry(item, str(err), sure=item.state != "sending")
            return "retry"
        except LeanoteRagError as err:
            self._retry(item, str(err), sure=item.state != "sending")
            return "retry"

    def _retry(self, item: Item, error: str, sure: bool) -> None:
        cfg = self.settings.capture
        delay = min(cfg.retry_max, cfg.retry_min * 2 ** max(0, item.attempts - 1))
        when = self.clock() + delay
        (self.outbox.later if sure else self.outbox.unsure)(item, error, when)
        log.info("capture %s not written (%s); next try in %.0f s", item.key, error, delay)

    def _inbox(self, writer: LeanoteWriter, user_id: str) -> str:
        """The inbox notebook's id, created once (and again if someone deleted it)."""
        title = self.settings.capture.notebook
        known = self.outbox.notebook(user_id, title)
        books = writer.notebooks()
        alive = {b.get("NotebookId"): b for b in books if not b.get("IsDeleted")}
        if known and known in alive:
            return known
        same = [b for b in alive.values() if (b.get("Title") or "").strip() == title]
        notebook_id = same[0]["NotebookId"] if same else writer.add_notebook(title)
        self.outbox.set_notebook(user_id, title, notebook_id)
        return notebook_id

    def _find(self, writer: LeanoteWriter, notebook_id: str, title: str, key: str) -> str:
        """A note of ours in the notebook carrying capture ``key`` (written before a crash)."""
        for meta in writer.notes_in(notebook_id):
            if (meta.get("Title") or "") == title and not meta.get("IsTrash"):
                got = writer.note(str(meta.get("NoteId")))
                if got is not None and has_marker(got[1], key):
                    return str(meta["NoteId"])
        return ""

    def _write_note(self, writer: LeanoteWriter, item: Item, title: str | None = None, content: str | None = None) -> str:
        notebook_id = self._inbox(writer, item.user_id)
        title = title or item.payload["title"]
        if item.state == "sending":  # the last try may have been written: look before writing again
            found = self._find(writer, notebook_id, title, item.key)
            if found:
                return found
        body = content if content is not None else item.payload["content"]
        files = []
        for f in item.files:
            local_id = secrets.token_hex(12)
            files.append((local_id, f.filename, f.data, f.mime, f.is_image))
            link = "getImage" if f.is_image else "getAttach"
            body += f"\n{'!' if f.is_image else ''}[{md_label(f.filename)}](/api/file/{link}?fileId={local_id})\n"
        self.outbox.sending(item)
        created = writer.add_note(notebook_id, title, with_marker(body, item.key), item.payload.get("tags", []), files)
        return str(created["NoteId"])

    def _write_append(self, writer: LeanoteWriter, item: Item) -> str:
        what = "last" if item.kind == "append" else "memory"
        for _ in range(CONFLICT_RETRIES):
            note_id = self.outbox.target(item.person, item.user_id, what)
            got = writer.note(note_id) if note_id else None
            if got is None:
                if item.kind == "append":
                    raise Refused("the last captured note is gone from Leanote (deleted or in the trash)", "gone")
                # the memory note does not exist (yet, or any more): it starts with this line
                title = self.settings.capture.memory_title
                note_id = self._write_note(writer, item, title=title,
                                           content=f"# {md_escape(title)}\n\n{item.payload['text']}\n")
                self.outbox.set_target(item.person, item.user_id, what, note_id)
                return note_id
            meta, content = got
            if has_marker(content, item.key):
                return note_id  # the last try was written
            self.outbox.sending(item)
            try:
                writer.update_content(note_id, int(meta.get("Usn") or 0),
                                      with_marker(content.rstrip("\n") + "\n\n" + item.payload["text"], item.key),
                                      [f for f in meta.get("Files") or [] if isinstance(f, dict)])
                return note_id
            except Refused as err:
                if err.reason != "conflict":
                    raise
                log.info("note %s changed while appending capture %s; reading it again", note_id, item.key)
        raise Refused(f"note {note_id} kept changing while appending", "conflict")
