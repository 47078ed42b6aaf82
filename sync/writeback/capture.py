"""Capture from chat into the notes: a durable outbox, written by the capture target
(``sync.writeback.targets``): through Leanote's API, or as Markdown files into a folder of notes.

The notes stay the single source of truth: a capture becomes a note in the person's
own Leanote account (the login of a ``leanote_api`` source account, or of
``capture.accounts``), or a file in the notes folder (``sync.writeback.folder``), and reaches
the index like any note, through the next sync pass, which runs ``capture.sync_after`` after a
write (a folder's watcher sees the file too). What follows is said of Leanote; the folder's
writer keeps the same promises with files.

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
  maker is told then, by the bot of their platform (``announcers``), in the chat it came from,
  if the config still maps them to the Leanote user it went into (``may_tell``).
- **Refusals stay small.** Leanote refusing a capture (a file too large) parks that
  one capture with the reason, shown in ``/outbox`` and ``status``; the rest go on.

This module takes the captures and answers for them (receipts, and the announcements of
those whose answer a kill cut off); ``writing`` writes them in order through the target
(``leanote``, whose ``logins`` know which login writes as whom, or ``folder``); the outbox they
share is ``sync.writeback.outbox``.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Awaitable, Callable

from rag.capture import Attachment, Origin, Quote, Receipt, answer_note, compose
from rag.config import Settings

from sync.writeback.folder import FolderTarget
from sync.writeback.leanote import LeanoteTarget
from sync.writeback.outbox import OPEN_STATES, Item, Outbox
from sync.writeback.targets import Failures, Target, kind_of, why_none
from sync.writeback.writing import Writing

log = logging.getLogger(__name__)

WAIT_FOR_WRITE = 8.0  # a capture answers "written" if its target took it within this, else "queued"
TARGETS: dict[str, Callable[[Settings, Outbox, Callable[[], float]], Target]] = {
    "leanote": LeanoteTarget, "folder": FolderTarget}


def open_target(settings: Settings, outbox: Outbox, clock: Callable[[], float]) -> Target | None:
    """The target ``capture.target`` chooses (``sync.writeback.targets.kind_of``); None: nowhere to write."""
    kind = kind_of(settings)
    return TARGETS[kind](settings, outbox, clock) if kind else None


class Capture(Failures, Writing):
    """Captures from chat: checked, queued, written in the background (``run``) by the
    configured target (``target``: Leanote or a folder; None: nowhere to write)."""

    def __init__(self, settings: Settings, outbox: Outbox, on_written: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.time):
        """``settings``: read at each use (a reload sets new ones, ``bot.root.Parts.apply``);
        ``outbox``: where the captures wait (the composition root builds and closes it);
        ``on_written``: called after each write (the daemon schedules a sync pass)."""
        self.on_written = on_written
        self.clock = clock
        self.outbox = outbox
        self.target: Target | None = open_target(settings, outbox, clock)
        self.settings = settings
        self._rates: dict[str, deque] = {}
        self._wake = asyncio.Event()
        self._finished: dict[int, asyncio.Event] = {}
        self._lock = threading.Lock()
        # each Leanote user's captures in a thread of its own
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="capture")
        self._failing: dict[str, str] = {}  # the users whose writes fail ("user:<id>") -> the kind of error
        # platform -> how its bot tells a person (person key, ``once``, text): registered by the bots
        self.announcers: dict[str, Callable[[str, str, str], Awaitable[None]]] = {}
        self._telling: set[asyncio.Task] = set()
        # whether a person may still hear of a capture into a Leanote user (person, user_id): the
        # doors' rule, set with the announcers (``bot.usecases.capture``); a late receipt goes to
        # nobody the config no longer maps to that user
        self.may_tell: Callable[[str, str], bool] = lambda person, user_id: True
        self._told_now: set[int] = set()  # the captures whose receipt is being sent

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        """New settings (a reload) for the target too (what it writes into needs a restart)."""
        self._settings = settings
        if self.target is not None:
            self.target.settings = settings

    def close(self) -> None:
        """Cut the calls in flight (what they carried stays in the outbox), then close."""
        if self.target is not None:
            self.target.close()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def describe(self) -> str:
        """Where captures go (``doctor``, the log)."""
        return self.target.describe() if self.target is not None else "nowhere: " + why_none(self.settings)

    # --- asking ---------------------------------------------------------------------------

    def available(self) -> str | None:
        """Why nothing can be captured at all (turned off, no API account), or None. Counts nothing:
        a bot asks before it downloads a file."""
        if not self.settings.capture.enabled:
            return "记录功能已关闭。 / Capture is turned off (capture.enabled)."
        if self.target is None:
            return why_none(self.settings)
        return self.target.unavailable()

    def refused_for(self, user_id: str) -> str | None:
        """Why nothing can be captured for this Leanote user (``available``, or the target's
        reason: a folder holds another user's notes), or None."""
        return self.available() or (self.target.refusal(user_id) if user_id else None)

    def refusal(self, person: str, text: str, files: list[Attachment], user_id: str = "") -> str | None:
        """Why this capture cannot be taken (off, nowhere to write, too long, too large, too
        often), or None; a capture that may go ahead counts against the person's rate limit."""
        cfg = self.settings.capture
        why = self.refused_for(user_id)
        if why:
            return why
        if len(text) > cfg.max_chars:
            return (f"太长了：最多 {cfg.max_chars} 个字符（这条 {len(text)}）。 / Too long: at most {cfg.max_chars} "
                    f"characters ({len(text)} here).")
        for f in files:
            if len(f.data) > cfg.max_file_mb * 1024 * 1024:
                return (f"文件 {f.filename} 太大：最多 {cfg.max_file_mb:g} MB。 / {f.filename} is too large: at most "
                        f"{cfg.max_file_mb:g} MB.")
        why = self.too_often(person)
        if why is None:
            self._rates[person].append(self.clock())
        return why

    def too_often(self, person: str) -> str | None:
        """Why this person may not capture now (their ``capture.rate_limit`` a minute is used up),
        or None; counts nothing (a door asks before it downloads or reads a file)."""
        cfg = self.settings.capture
        now = self.clock()
        window = self._rates.setdefault(person, deque())
        while window and now - window[0] >= 60:
            window.popleft()
        if len(window) >= cfg.rate_limit:
            return (f"慢一点：每分钟最多记录 {cfg.rate_limit} 条。 / Easy there: {cfg.rate_limit} captures a minute; "
                    f"try again in {60 - (now - window[0]):.0f} s.")
        return None

    async def note(self, person: str, user_id: str, text: str, *, origin: Origin | None = None,
                   files: list[Attachment] = (), title: str = "", quote: Quote | None = None,
                   once: str = "", after: str = "") -> Receipt:
        """A new note in the inbox notebook: ``text`` is the person's own (their Markdown),
        ``quote`` someone else's text (a forward, a saved message: shown as written).
        ``once``: what the capture comes from (a chat message, a menu press on a message):
        the same again, from the same person into the same Leanote user, makes no second
        note but answers with the first one's receipt (for every kind of capture). ``after``:
        Markdown that goes under the files (the text read from a photo, marked as such)."""
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
        if after.strip():
            payload["after"] = after.strip() + "\n"
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
        why = self.refused_for(user_id)
        if why:
            return Receipt("refused", why)
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

    async def made(self, person: str, user_id: str, once: str) -> Receipt | None:
        """The receipt of the capture already made from ``once``, or None: a door asks before it
        reads a file again (a voice message Telegram sends twice is transcribed once)."""
        return await self._again(person, user_id, once)

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
        why = self.refusal(person, text, files, user_id)
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
        zh, en = self.target.where if self.target is not None else ("Leanote", "Leanote")
        if item.state == "done":
            url, shown = self.link(item.note_id)
            if again:
                return Receipt("written", f"这条之前已经记下了 ✅ {shown} / Already saved: {shown}", item.note_id, url,
                               item.key, again=True)
            what = {"note": "已记下", "save": "已保存", "append": "已追加", "remember": "记住了"}[item.kind]
            return Receipt("written", f"{what} ✅ {shown}", item.note_id, url, item.key)
        if item.state == "failed":
            return Receipt("refused", f"没能写入 {zh}：{item.error} / {en[0].upper() + en[1:]} did not take it: "
                                      f"{item.error}", key=item.key)
        reason = f"（{item.error}）" if item.error else ""
        return Receipt("queued", f"{zh} 暂时写不进去{reason}，已排队，稍后自动重试；/outbox 可查看。 / {en[0].upper() + en[1:]} "
                                 f"cannot take it right now; it is queued and will be retried (see /outbox).", key=item.key,
                       again=again)

    def link(self, note_id: str) -> tuple[str, str]:
        """Where a written capture opens (a URL) and how a chat names it (a folder's file: its path
        in the folder)."""
        if self.target is not None:
            return self.target.link(note_id)
        url = f"{self.settings.leanote.base_url}/note/{note_id}"
        return url, url

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
        if not self.may_tell(fresh.person, fresh.user_id):  # kept untold: told if access comes back
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
