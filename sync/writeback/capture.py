"""Capture from chat into Leanote: a durable outbox, written through Leanote's API.

The notes stay the single source of truth: a capture becomes a note in the person's
own Leanote account (the login of a ``leanote_api`` source account, or of
``capture.accounts``), and reaches the index like any note, through the next sync
pass, which runs ``capture.sync_after`` after a write.

- **Durable.** Every capture is first a row in ``<state_dir>/capture.sqlite``, then
  written. While Leanote is down or the login fails, it waits there and is tried
  again with backoff (``capture.retry_min`` doubling to ``retry_max`` with each
  failed try), each Leanote user's captures in the order they were made; the person
  is told it is queued.
- **One account's trouble is its own.** Each Leanote user's captures are written by a
  worker of their own: a login that hangs or is refused, or a Leanote that stalls for
  one user, delays nobody else, and its error is only in that user's captures. Which
  login is whose is learnt by logging in (all unknown ones at once) and kept in the
  outbox, so a login that fails later is known to be its own user's.
- **Exactly once.** Before a write goes out, its row says ``sending`` with the time it
  was sent and the user's USN before it; every note or block we write carries the
  capture's key in a hidden marker line (``rag.capture``). A write whose answer never
  came (a timeout, a cut connection, the process killed) is looked for in Leanote
  (the notes changed since that USN, by their marker) and sent again only
  ``capture.resend_after`` after it went out, when it can no longer be on its way.
  If a copy lands even later, the capture is looked for once more after that grace,
  and the copy the person was not given is moved to the trash. ``/append`` and
  ``/remember`` onto an existing note need none of this: an update carries the note's
  ``Usn``, so of two sends only one can apply.
- **Once per message.** A capture made from a chat message (or a press on one) carries
  what it came from (``once``: the platform's chat and message id, the interaction, or the
  answer under a "Save as note" button). The same message delivered again (Telegram sends
  an update again until a later poll confirms it, e.g. after a ``kill -9``) or a menu
  pressed twice finds the first capture and answers with its receipt ("already saved",
  with its link) instead of writing again. A capture Leanote refused wrote nothing: the
  same message again is a new try.
- **Never overwrites an edit.** ``/append`` and ``/remember`` read the note and send it
  back with its ``Usn``; when someone changed it meanwhile Leanote answers
  ``conflict`` and changes nothing, and we read it again and retry.
- **Every capture gets its answer.** A capture made just before the process ended (a
  ``kill -9`` between taking it and answering) is written when the daemon is back, and its
  maker is told then, by the bot of their platform (``announcers``), in the chat it came from.
- **Refusals stay small.** Leanote refusing a capture (a file too large) parks that
  one capture with the reason, shown in ``/outbox`` and ``status``; the rest go on.

Long: the capture writer, whose parts (logins and whose they are, the workers per Leanote user,
exactly-once checks, receipts) share its connections and locks; the outbox it writes through is
``sync.writeback.outbox``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sqlite3
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures import as_completed
from datetime import datetime
from typing import Awaitable, Callable

from rag.capture import (Attachment, Origin, Quote, Receipt, answer_note, compose, has_marker, md_escape,
                         md_label, with_marker)
from rag.config import Account, Settings, secret
from rag.errors import AuthFailed, LeanoteRagError, Refused, Unavailable

from sync.writeback.outbox import KEEP_DAYS, OPEN_STATES, Item, Outbox
from sync.sources.leanote_api import LeanoteApi, LeanoteWriter

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5
WAIT_FOR_WRITE = 8.0  # a capture answers "written" if Leanote took it within this, else "queued"

def accounts_of(settings: Settings) -> list[Account]:
    """The accounts capture logs in with: ``capture.accounts``, then the ``leanote_api``
    source's accounts it does not name."""
    accounts = list(settings.capture.accounts)
    if settings.source.kind == "leanote_api":
        accounts += [a for a in settings.source.accounts if a.email.lower() not in {b.email.lower() for b in accounts}]
    return accounts


def account_emails(settings: Settings) -> list[str]:
    return [a.email.strip().lower() for a in accounts_of(settings)]


class _LoginFailed(Unavailable):
    """A capture waits for a login (its account's, or one that may be its account's): the
    login's own trouble, logged as such, not as the user's writes failing."""


class _NotYet(Exception):
    """An unanswered write may still land: not sent again before ``when``."""

    def __init__(self, when: float):
        super().__init__(when)
        self.when = when


NOT_IDENTIFIED = ("还没能确认哪个 Leanote 登录是你的：有一个登录失败了（主人可在日志里看到原因），稍后自动重试。 / Could not "
                  "tell yet which Leanote login is yours: a login failed (the owner sees why in the log); "
                  "retried later.")
REMAPPED = ("你现在对应的是另一个 Leanote 用户：这条是给之前那个用户记的，没有写入。 / You are mapped to another Leanote "
            "user now: this capture was for the previous one, and was not written.")


class Capture:
    """Captures from chat: checked, queued, written in the background (``run``)."""

    def __init__(self, settings: Settings, outbox: Outbox, on_written: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.time):
        """``settings``: read at each use (a reload sets new ones, ``bot.root.Parts.apply``);
        ``outbox``: where the captures wait (the composition root builds and closes it);
        ``on_written``: called after each write (the daemon schedules a sync pass)."""
        self.settings = settings
        self.on_written = on_written
        self.clock = clock
        self.outbox = outbox
        self._apis: dict[str, LeanoteApi] = {}  # account email -> its connection
        self._users: dict[str, str] = {}  # account email -> the Leanote user it logs in as
        self._account_locks: dict[str, threading.Lock] = {}
        self._rates: dict[str, deque] = {}
        self._wake = asyncio.Event()
        self._finished: dict[int, asyncio.Event] = {}
        self._lock = threading.Lock()
        # each Leanote user's captures in a thread of its own; logins to learn whose is whose apart
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="capture")
        self._logins = ThreadPoolExecutor(max_workers=8, thread_name_prefix="capture-login")
        self._closing = False
        self._failing: dict[str, str] = {}  # what fails ("login:<email>", "user:<id>") -> the kind of error
        # platform -> how its bot tells a person (person key, ``once``, text): registered by the bots
        self.announcers: dict[str, Callable[[str, str, str], Awaitable[None]]] = {}
        self._telling: set[asyncio.Task] = set()
        self._told_now: set[int] = set()  # the captures whose receipt is being sent

    def close(self) -> None:
        """Cut the calls in flight (what they carried stays in the outbox), then close."""
        self._closing = True
        for api in list(self._apis.values()):
            api.stop()
        self._logins.shutdown(wait=True, cancel_futures=True)
        self._pool.shutdown(wait=True, cancel_futures=True)
        for api in list(self._apis.values()):
            api.http.close()

    # --- accounts -------------------------------------------------------------------------

    def _accounts(self) -> list[Account]:
        return accounts_of(self.settings)

    def _base_url(self) -> str:
        s = self.settings
        return (s.capture.api_url or s.source.api_url or s.leanote.base_url).rstrip("/")

    def how_to_enable(self) -> str:
        return ("记录需要你的 Leanote 账号通过 API 登录：请主人在配置里 capture.accounts 加上你的 email 和 password_env。 / "
                "Capture writes through Leanote's API with your account: ask the owner to add your email and "
                "password_env under capture.accounts in the config.")

    def _user_of(self, email: str) -> str | None:
        """The Leanote user an account logs in as, once known (learnt this run, or kept from before)."""
        user_id = self._users.get(email)
        if user_id is None:
            user_id = self.outbox.login_user(email)
            if user_id is not None:
                self._users[email] = user_id
        return user_id

    def _learn(self, email: str, user_id: str) -> None:
        if user_id and self._users.get(email) != user_id:
            self._users[email] = user_id
            self.outbox.set_login_user(email, user_id)

    def _account_lock(self, email: str) -> threading.Lock:
        with self._lock:
            return self._account_locks.setdefault(email, threading.Lock())

    def _writer(self, user_id: str) -> LeanoteWriter | None:
        """The login writing as this Leanote user; None when no configured account is
        theirs. Its own login's failure is raised (it is this user's); other accounts are
        only logged in to learn whose they are, side by side, and their errors go to the log."""
        accounts = {a.email.strip().lower(): a for a in self._accounts()}
        email = next((e for e in accounts if self._user_of(e) == user_id), None)
        if email is None:
            email = self._identify(user_id, accounts)
            if email is None:
                return None
        try:
            api = self._sign_in(accounts[email])
        except (LeanoteRagError, OSError) as err:
            raise _LoginFailed(str(err)) from err
        if api.user_id != user_id:  # the account logs in as someone else now: never write as them
            self._learn(email, api.user_id)
            if self._starts_failing(f"user:{user_id}", "another user"):
                log.warning("captures for Leanote user %s: %s logs in as Leanote user %s now; they wait for a "
                            "login of theirs (capture.accounts)", user_id, email, api.user_id)
            raise _LoginFailed(NOT_IDENTIFIED)
        self._learn(email, api.user_id)
        return LeanoteWriter(api)

    def _sign_in(self, account: Account) -> LeanoteApi:
        """The account's connection, logged in: a failure (its password not set, Leanote
        refusing it or not answering) is kept for ``status`` and logged once when this
        account's login starts failing (or fails in another way), and once when it works again."""
        email = account.email.strip().lower()
        api = None
        with self._account_lock(email):
            try:
                api = self._api(account)
                if api.user_id:
                    return api
                api.login()
            except (LeanoteRagError, OSError) as err:
                if not (self._closing or (api is not None and api.stopping)):  # not cut off by a stop
                    self._login_failed(email, err)
                raise
        self._login_worked(email)
        return api

    def _login_failed(self, email: str, err: BaseException) -> None:
        self.outbox.login_failed(email, self._user_of(email) or "", str(err), self.clock())
        if self._starts_failing(f"login:{email}", err):
            log.warning("captures: cannot log in to Leanote as %s: %s. Its captures wait, tried again with backoff",
                        email, err)
        else:
            log.debug("captures: cannot log in to Leanote as %s: %s", email, err)

    def _login_worked(self, email: str) -> None:
        was = self.outbox.login_worked(email)
        if self._works_again(f"login:{email}") or was:
            log.info("captures: logged in to Leanote as %s again", email)

    def _starts_failing(self, what: str, err: BaseException | str) -> bool:
        """Note that ``what`` fails; True when this is news (it worked, or failed otherwise)."""
        kind = type(err).__name__ if isinstance(err, BaseException) else str(err)
        with self._lock:
            was, self._failing[what] = self._failing.get(what), kind
        return was != kind

    def _works_again(self, what: str) -> bool:
        with self._lock:
            return self._failing.pop(what, None) is not None

    def _who(self, user_id: str) -> str:
        """A Leanote user as the log names it: its account's email too, when known."""
        email = next((e for e, u in list(self._users.items()) if u == user_id), None)
        return f"Leanote user {user_id} ({email})" if email else f"Leanote user {user_id}"

    def _identify(self, user_id: str, accounts: dict[str, Account]) -> str | None:
        """Log in every account not known yet, all at once, until one turns out to be this
        user's: its email; None when none is (every login worked). ``Unavailable`` (saying no
        other account's name or error) when some login failed, so it may have been theirs."""
        unknown = [e for e in accounts if self._user_of(e) is None]
        if not unknown:
            return None
        try:
            futures = {self._logins.submit(self._login, accounts[e]): e for e in unknown}
        except RuntimeError:  # closing
            raise _LoginFailed("capture is stopping") from None
        failed = False
        try:
            for future in as_completed(futures, timeout=2 * self.settings.sync.http_timeout + 5):
                got = None if future.cancelled() else future.result()
                if got == user_id:
                    return futures[future]
                failed = failed or got is None
        except FuturesTimeout:
            failed = True
        if failed:
            raise _LoginFailed(NOT_IDENTIFIED)
        return None

    def _login(self, account: Account) -> str | None:
        """Log in to learn whose account this is: the Leanote user, or None (logged)."""
        email = account.email.strip().lower()
        try:
            api = self._sign_in(account)
            self._learn(email, api.user_id)
            return api.user_id or None
        except (LeanoteRagError, OSError):  # logged by _sign_in
            return None

    def _api(self, account: Account) -> LeanoteApi:
        key = account.email.strip().lower()
        with self._lock:
            api = self._apis.get(key)
            if api is None:
                if self._closing:
                    raise Unavailable("capture is stopping")
                where = self._config_key(key)
                password = secret(account.password_env, where)
                api = LeanoteApi(self._base_url(), key, password, timeout=self.settings.sync.http_timeout,
                                 password_from=f"{where} ({account.password_env})")
                self._apis[key] = api
        return api

    def _config_key(self, email: str) -> str:
        """Where the config names this account's password: ``capture.accounts[i].password_env``,
        or the source's for an account capture borrows from ``source.accounts``."""
        s = self.settings
        for section, accounts in (("capture", s.capture.accounts), ("source", s.source.accounts)):
            for i, a in enumerate(accounts):
                if a.email.strip().lower() == email:
                    return f"{section}.accounts[{i}].password_env"
        return "capture.accounts"

    def _mapped_elsewhere(self, item: Item) -> bool:
        """The person who captured this is mapped (``users:``) to another Leanote user now."""
        platform, _, who = item.person.partition(":")
        if platform not in ("telegram", "discord") or not who.lstrip("-").isdigit():
            return False
        for entry in self.settings.users:
            if int(who) in (entry.telegram_ids if platform == "telegram" else entry.discord_ids):
                now = entry.leanote_user_id or self._user_of(entry.leanote_email.strip().lower())
                return bool(now) and now != item.user_id
        return False

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
                   files: list[Attachment] = (), title: str = "", quote: Quote | None = None,
                   once: str = "") -> Receipt:
        """A new note in the inbox notebook: ``text`` is the person's own (their Markdown),
        ``quote`` someone else's text (a forward, a saved message: shown as written).
        ``once``: what the capture comes from (a chat message, a menu press on a message):
        the same again, from the same person into the same Leanote user, makes no second
        note but answers with the first one's receipt (for every kind of capture)."""
        again = await self._again(person, user_id, once)
        if again is not None:
            return again
        files = list(files)
        if not text.strip() and not files and not (quote and quote.text.strip()):
            return Receipt("refused", "要记什么？在 /note 后面写上内容。 / What should I note? Write it after /note.")
        if not title and not text.strip() and not (quote and quote.text.strip()) and files:
            title = files[0].filename  # a file alone: its name is the title (and not Markdown in the body)
        draft = compose(text, extra_tags=list(self.settings.capture.tags), origin=origin, title=title,
                        when=datetime.now(), quote=quote)
        payload = {"title": draft.title, "content": draft.content, "tags": draft.tags}
        return await self._submit(person, user_id, "note", payload, files,
                                  "\n\n".join(t for t in (text, quote.text if quote else "") if t), once)

    async def save_answer(self, person: str, user_id: str, question: str, answer: str,
                          citations: list[dict], once: str = "") -> Receipt:
        again = await self._again(person, user_id, once)
        if again is not None:
            return again
        draft = compose(answer_note(question, answer, citations), extra_tags=list(self.settings.capture.tags),
                        title=question)
        payload = {"title": draft.title, "content": draft.content, "tags": draft.tags}
        return await self._submit(person, user_id, "save", payload, [], question + answer, once)

    async def append(self, person: str, user_id: str, text: str, once: str = "") -> Receipt:
        """More text at the end of the last note this person captured."""
        again = await self._again(person, user_id, once)
        if again is not None:
            return again
        if not text.strip():
            return Receipt("refused", "要追加什么？在 /append 后面写上内容。 / Append what? Write it after /append.")
        if not (self.outbox.target(person, user_id, "last") or self.outbox.has_open(person, user_id, "note")):
            return Receipt("refused", "还没有可追加的笔记：先用 /note 记一条。 / Nothing to append to yet: "
                                      "capture a note with /note first.")
        return await self._submit(person, user_id, "append", {"text": text.strip()}, [], text, once)

    async def remember(self, person: str, user_id: str, text: str, once: str = "") -> Receipt:
        """A dated line in this person's memory note."""
        again = await self._again(person, user_id, once)
        if again is not None:
            return again
        if not text.strip():
            return Receipt("refused", "要记住什么？在 /remember 后面写上。 / Remember what? Write it after /remember.")
        line = f"- {datetime.now().strftime('%Y-%m-%d %H:%M')} {' '.join(text.split())}"
        return await self._submit(person, user_id, "remember", {"text": line}, [], text, once)

    async def _again(self, person: str, user_id: str, once: str) -> Receipt | None:
        """The receipt of the capture already made from ``once`` (written: "already", with its
        link; on its way: once the write is answered, as for the first); None when there is
        none, or Leanote refused it (it wrote nothing: this is a new try). Counts nothing
        against the rate limit."""
        if not once:
            return None
        item = self.outbox.from_once(person, user_id, once)
        if item is None:
            return None
        if item.state == "failed":
            self.outbox.forget(item)
            return None
        if item.state in OPEN_STATES and item.next_try <= self.clock():  # being written: its answer
            item = await self._written_soon(item)
        self.outbox.told(item)
        return self.receipt(item, again=True)

    async def _submit(self, person: str, user_id: str, kind: str, payload: dict, files: list[Attachment],
                      text: str, once: str = "") -> Receipt:
        why = self.refusal(person, text, files)
        if why:
            return Receipt("refused", why)
        try:
            item = self.outbox.add(person, user_id, kind, payload, files, self.clock(), once)
        except sqlite3.IntegrityError:  # made from the same message meanwhile
            return await self._again(person, user_id, once) or Receipt("refused", "请再试一次。 / Please try again.")
        if self.outbox.waiting_before(item):  # behind a capture Leanote did not take yet: queued now
            self._wake.set()
            self.outbox.told(item)
            return self.receipt(item)
        item = await self._written_soon(item)
        self.outbox.told(item)
        return self.receipt(item)

    async def _written_soon(self, item: Item) -> Item:
        """The capture once its write was answered (written, refused, or to be retried), or
        after ``WAIT_FOR_WRITE`` (still on its way: queued)."""
        done = self._finished.setdefault(item.id, asyncio.Event())
        self._wake.set()
        try:
            await asyncio.wait_for(done.wait(), WAIT_FOR_WRITE)
        except asyncio.TimeoutError:
            pass
        finally:
            if self._finished.get(item.id) is done:
                self._finished.pop(item.id, None)
        return self.outbox.get(item.id) or item

    def receipt(self, item: Item, again: bool = False) -> Receipt:
        """What to tell the person; ``again``: the capture was made before (a message delivered
        twice, a menu pressed twice): written, it says so with its link."""
        base = self.settings.leanote.base_url
        if item.state == "done":
            url = f"{base}/note/{item.note_id}"
            if again:
                return Receipt("written", f"这条之前已经记下了 ✅ {url} / Already saved: {url}", item.note_id, url,
                               item.key, again=True)
            what = {"note": "已记下", "save": "已保存", "append": "已追加", "remember": "记住了"}[item.kind]
            return Receipt("written", f"{what} ✅ {url}", item.note_id, url, item.key)
        if item.state == "failed":
            return Receipt("refused", f"没能写入 Leanote：{item.error} / Leanote did not take it: {item.error}", key=item.key)
        reason = f"（{item.error}）" if item.error else ""
        return Receipt("queued", f"Leanote 暂时写不进去{reason}，已排队，稍后自动重试；/outbox 可查看。 / Leanote cannot "
                                 f"take it right now; it is queued and will be retried (see /outbox).", key=item.key,
                       again=again)

    def announce_with(self, platform: str, announce: Callable[[str, str, str], Awaitable[None]]) -> None:
        """A platform's bot tells its people of their captures from now on (``announcers``); the
        captures written meanwhile, while it was still starting, are told now."""
        self.announcers[platform] = announce
        for item in self.outbox.untold(platform):
            self._tell(item)

    def stop_announcing(self, platform: str, announce: Callable[[str, str, str], Awaitable[None]]) -> None:
        if self.announcers.get(platform) == announce:
            del self.announcers[platform]

    def _tell(self, item: Item) -> None:
        """The receipt of a capture whose maker was never given one (the process ended between
        taking it and answering: a ``kill -9``), sent to them by their platform's bot when it
        runs (``announcers``); else it waits in the outbox, and ``/outbox`` shows it."""
        announce = self.announcers.get(item.person.partition(":")[0])
        fresh = self.outbox.get(item.id)
        if announce is None or fresh is None or fresh.told or fresh.id in self._told_now:
            return
        receipt = self.receipt(fresh)
        self._told_now.add(fresh.id)

        async def send() -> None:
            try:
                await announce(fresh.person, fresh.once, receipt.message)
            except Exception as err:  # the person is not reachable now: /outbox still shows it
                log.info("capture %s: could not tell %s it was %s: %s", fresh.key, fresh.person, receipt.status, err)
                return
            finally:
                self._told_now.discard(fresh.id)
            self.outbox.told(fresh)

        task = asyncio.get_running_loop().create_task(send())
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    def note_for(self, key: str) -> str:
        """The note id a capture (by its receipt's ``key``) was written to; "" until then."""
        return self.outbox.written(key)

    def pending(self, person: str) -> list[Item]:
        return self.outbox.open_items(person)

    def counts(self, users: list[str] | None = None) -> dict:
        return self.outbox.counts(users)

    def status_lines(self, user_id: str | None = None) -> list[str]:
        """Capture in the bots' ``/status``: an admin (None) sees everyone's captures and each
        login that fails, with its error (never a password); anyone else only their own
        captures, and that their login fails, without the error."""
        users = None if user_id is None else [user_id]
        c = self.outbox.counts(users)
        lines = []
        if c["waiting"] or c["failed"]:
            lines.append(f"{'' if users is None else 'your '}captures waiting for Leanote: {c['waiting']}, "
                         f"not taken: {c['failed']} (/outbox)")
        for f in self.outbox.login_failures(account_emails(self.settings), users):
            since = time.strftime("%m-%d %H:%M", time.localtime(f["since"]))
            if users is None:
                lines.append(f"capture login of {f['account']} failing since {since}, {f['waiting']} capture(s) "
                             f"waiting for it: {f['error'][:300]}")
            else:
                lines.append(f"the Leanote login of your account fails since {since}, so your captures wait "
                             "(the admin can see why)")
        return lines

    # --- writing --------------------------------------------------------------------------

    def _grace(self) -> float:
        """How long after an unanswered write it may still land: ``capture.resend_after``, and
        at least twice the client's own deadline."""
        return max(self.settings.capture.resend_after, 2 * self.settings.sync.http_timeout)

    async def run(self, stopping: asyncio.Event) -> None:
        """Write what is due, each Leanote user's captures by a worker of its own, and sleep
        until the next is due or a capture arrives. At a stop, calls still in flight after a
        moment are cut (what they carried stays in the outbox, looked for at the next start)."""
        self._wake = asyncio.Event()
        for api in list(self._apis.values()):
            api.stopping = False  # this Capture ran before (and was stopped): its connections serve again
        workers: dict[str, asyncio.Task] = {}
        try:
            while not stopping.is_set():
                self.outbox.prune(self.clock() - KEEP_DAYS * 86400)
                self._wake.clear()
                for user_id in self.outbox.users_due(self.clock()):
                    if user_id not in workers or workers[user_id].done():
                        workers[user_id] = asyncio.create_task(self._work(user_id, stopping))
                busy = [u for u, t in workers.items() if not t.done()]
                nxt = self.outbox.next_due(busy)
                wait = 30.0 if nxt is None else min(30.0, max(0.05, nxt - self.clock()))
                waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stopping.wait())]
                await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
        finally:
            running = [t for t in workers.values() if not t.done()]
            if running:
                _, late = await asyncio.wait(running, timeout=1.0)
                if late:
                    for api in list(self._apis.values()):
                        api.stop()
                    await asyncio.wait(late, timeout=1.5)

    async def _work(self, user_id: str, stopping: asyncio.Event) -> None:
        try:
            await self._drain_user(user_id, stopping)
        except Exception:
            log.exception("capture: writing the captures of Leanote user %s failed", user_id)
        finally:
            self._wake.set()

    async def drain(self, stopping: asyncio.Event | None = None) -> int:
        """Write every capture that is due, each user's in order and the users side by side
        (one slow account holds nobody else); how many were written. A stop is heard between
        captures (what is not written stays in the outbox)."""
        users = self.outbox.users_due(self.clock())
        return sum(await asyncio.gather(*(self._drain_user(u, stopping) for u in users)))

    async def _drain_user(self, user_id: str, stopping: asyncio.Event | None) -> int:
        loop = asyncio.get_running_loop()
        written = 0
        while stopping is None or not stopping.is_set():
            for item in self.outbox.checks_due(self.clock(), user_id):
                await loop.run_in_executor(self._pool, self._check, item)
            item = self.outbox.head(user_id, self.clock())
            if item is None:
                return written
            state = await loop.run_in_executor(self._pool, self._deliver, item)
            event = self._finished.get(item.id)
            if event is not None:  # the person hears now: written, refused, or queued
                event.set()
            elif state in ("done", "failed") and not item.told:  # nobody heard of it (the process ended first)
                self._tell(item)
            if state == "done":
                written += 1
                self.on_written()
            elif state == "retry":
                return written
        return written

    def _deliver(self, item: Item) -> str:
        """Write one capture: "done", "failed" (parked) or "retry" (later). The log says once
        when a user's captures start failing and once when they are written again; each
        try is a DEBUG line, a parked capture a WARNING of its own."""
        now = self.clock
        writer = None
        user = f"user:{item.user_id}"
        try:
            if self._mapped_elsewhere(item):
                self.outbox.park(item, REMAPPED, now())
                log.warning("capture %s not written: %s is mapped to another Leanote user now", item.key, item.person)
                return "failed"
            writer = self._writer(item.user_id)
            if writer is None:
                self.outbox.park(item, "no Leanote API account for this user: " + self.how_to_enable(), now())
                log.warning("capture %s not written: no capture account logs in as Leanote user %s (capture.accounts)",
                            item.key, item.user_id)
                return "failed"
            if item.kind in ("note", "save"):
                note_id = self._write_note(writer, item)
                if item.kind == "note":
                    self.outbox.set_target(item.person, item.user_id, "last", note_id)
            else:
                note_id = self._write_append(writer, item)
            self.outbox.done(item, note_id, now(), now() + self._grace() if item.unanswered else 0.0)
            log.debug("capture %s (%s) written to note %s", item.key, item.kind, note_id)
            self._login_worked(writer.api.email)  # (it may have logged in again during a call)
            if self._works_again(user):
                log.info("captures for %s: Leanote takes them again", self._who(item.user_id))
            return "done"
        except _NotYet as wait:
            self.outbox.wait_until(item, wait.when)
            log.debug("capture %s: not in Leanote yet; sent again at %s unless it lands by then", item.key,
                      datetime.fromtimestamp(wait.when).strftime("%H:%M:%S"))
            return "retry"
        except Refused as err:
            if err.reason in ("conflict",):  # kept conflicting: try again later
                self._retry(item, str(err), sure=True)
                return "retry"
            self.outbox.park(item, str(err), now())
            log.warning("capture %s refused by Leanote: %s", item.key, err)
            return "failed"
        except _LoginFailed as err:  # the login's trouble, logged as such
            self._retry(item, str(err), sure=item.state != "sending")
            return "retry"
        except (LeanoteRagError, OSError) as err:
            if isinstance(err, AuthFailed) and writer is not None:  # logged in again during a call, refused
                self._login_failed(writer.api.email, err)
            elif self._starts_failing(user, err):
                log.warning("captures for %s: %s; tried again with backoff", self._who(item.user_id), err)
            self._retry(item, str(err), sure=item.state != "sending")
            return "retry"
        except Exception as err:  # a bug: this capture backs off, the others go on
            if self._starts_failing(user, err):
                log.exception("captures for %s: capture %s failed unexpectedly; tried again with backoff",
                              self._who(item.user_id), item.key)
            else:
                log.debug("capture %s failed unexpectedly", item.key, exc_info=True)
            self._retry(item, f"unexpected error ({type(err).__name__}); the owner can see it in the log",
                        sure=item.state != "sending")
            return "retry"

    def _retry(self, item: Item, error: str, sure: bool) -> None:
        """Tried again after ``retry_min``, doubling with each failed try up to ``retry_max``
        (the first capture of a Leanote user holds the ones behind it: the user's backoff)."""
        cfg = self.settings.capture
        delay = min(cfg.retry_max, cfg.retry_min * 2 ** item.failures)
        when = self.clock() + delay
        (self.outbox.later if sure else self.outbox.unsure)(item, error, when)
        log.debug("capture %s not written (%s); next try in %.0f s", item.key, error, delay)

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

    def _marked(self, writer: LeanoteWriter, item: Item, title: str, notebook_id: str) -> list[dict]:
        """The notes carrying capture ``item``'s marker (in the trash too), among those changed
        since the USN before its first send that have its title or are in its notebook; the
        ones not in the trash first, then by USN."""
        found = []
        for meta in writer.notes_since(item.usn_before or 0):
            if meta.get("IsDeleted") or not meta.get("NoteId"):
                continue
            if (meta.get("Title") or "") != title and meta.get("NotebookId") != notebook_id:
                continue
            content = writer.content(str(meta["NoteId"]))
            if content is not None and has_marker(content, item.key):
                found.append(meta)
        return sorted(found, key=lambda m: (bool(m.get("IsTrash")), int(m.get("Usn") or 0)))

    def _write_note(self, writer: LeanoteWriter, item: Item, title: str | None = None, content: str | None = None) -> str:
        notebook_id = self._inbox(writer, item.user_id)
        title = title or item.payload["title"]
        if item.state == "sending":  # an earlier send got no answer: it may have been written
            self.outbox.mark_unanswered(item)
            found = self._marked(writer, item, title, notebook_id)
            if found:
                return str(found[0]["NoteId"])
            settle = item.sent_at + self._grace()
            if item.sent_at and self.clock() < settle:
                raise _NotYet(settle)
        if item.usn_before is None:  # where to look from, if this send goes unanswered
            self.outbox.set_usn_before(item, writer.server_usn())
        body = content if content is not None else item.payload["content"]
        files = []
        for f in item.files:
            local_id = secrets.token_hex(12)
            files.append((local_id, f.filename, f.data, f.mime, f.is_image))
            link = "getImage" if f.is_image else "getAttach"
            body += f"\n{'!' if f.is_image else ''}[{md_label(f.filename)}](/api/file/{link}?fileId={local_id})\n"
        self.outbox.sending(item, self.clock(), adding=True)
        created = writer.add_note(notebook_id, title, with_marker(body, item.key), item.payload.get("tags", []), files)
        return str(created["NoteId"])

    def _check(self, item: Item) -> None:
        """A written capture one of whose sends got no answer, looked for once more after the
        grace: a late copy (not the note the person was given) is moved to the trash."""
        try:
            writer = self._writer(item.user_id)
            if writer is None:
                self.outbox.checked(item)
                return
            title = item.payload.get("title") or self.settings.capture.memory_title
            notebook_id = self.outbox.notebook(item.user_id, self.settings.capture.notebook)
            for meta in self._marked(writer, item, title, notebook_id):
                copy = str(meta["NoteId"])
                if copy == item.note_id or meta.get("IsTrash"):
                    continue
                got = writer.note(copy)
                if got is None:
                    continue
                writer.trash(copy, int(got[0].get("Usn") or 0),
                             [f for f in got[0].get("Files") or [] if isinstance(f, dict)])
                log.warning("capture %s: Leanote wrote it twice (a send went unanswered); moved the copy %s to "
                            "the trash, kept %s", item.key, copy, item.note_id)
            self.outbox.checked(item)
        except (LeanoteRagError, OSError) as err:
            cfg = self.settings.capture
            delay = min(cfg.retry_max, cfg.retry_min * 2 ** item.failures)
            log.debug("capture %s: could not look for a late copy (%s); again in %.0f s", item.key, err, delay)
            self.outbox.checked(item, self.clock() + delay)
        except Exception:
            log.exception("capture %s: looking for a late copy failed unexpectedly; not looked for again", item.key)
            self.outbox.checked(item)

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
            self.outbox.sending(item, self.clock(), adding=False)
            try:
                writer.update_content(note_id, int(meta.get("Usn") or 0),
                                      with_marker(content.rstrip("\n") + "\n\n" + item.payload["text"], item.key),
                                      [f for f in meta.get("Files") or [] if isinstance(f, dict)])
                return note_id
            except Refused as err:
                if err.reason != "conflict":
                    raise
                log.debug("note %s changed while appending capture %s; reading it again", note_id, item.key)
        raise Refused(f"note {note_id} kept changing while appending", "conflict")
