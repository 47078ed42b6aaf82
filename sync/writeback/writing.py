"""Writing captures into Leanote, each Leanote user's in order by a worker of its own, exactly
once: a write whose answer never came is looked for in Leanote (by the marker every capture
carries) and sent again only when it can no longer be on its way; a copy that lands later is
moved to the trash; ``/append`` and ``/remember`` send the note back with its ``Usn``, so of two
sends only one applies, and an edit made meanwhile is read again, never overwritten. A mixin
of ``sync.writeback.capture.Capture``."""

from __future__ import annotations

import asyncio
import logging
import secrets
from datetime import datetime

from rag.capture import has_marker, md_escape, md_label, with_marker
from rag.errors import AuthFailed, LeanoteRagError, Refused

from sync.sources.leanote_api import LeanoteWriter
from sync.writeback.logins import _LoginFailed
from sync.writeback.outbox import KEEP_DAYS, Item

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5


class _NotYet(Exception):
    """An unanswered write may still land: not sent again before ``when``."""

    def __init__(self, when: float):
        super().__init__(when)
        self.when = when


REMAPPED = ("你现在对应的是另一个 Leanote 用户：这条是给之前那个用户记的，没有写入。 / You are mapped to another Leanote "
            "user now: this capture was for the previous one, and was not written.")


class Writing:
    """The writing of a ``Capture`` (its ``settings``, ``outbox``, ``clock``, the workers
    ``_pool``, ``_wake`` and ``_finished`` events, and its logins)."""

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
        if item.payload.get("after"):  # what was read from the files (a photo's text), under them
            body += "\n" + item.payload["after"]
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
