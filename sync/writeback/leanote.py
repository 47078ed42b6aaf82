"""Captures written into Leanote through its API, exactly once (the ``leanote`` capture target,
``sync.writeback.targets``): each into the person's own account (``logins`` knows which login is
whose). A note whose send got no answer is looked for in Leanote by the marker every capture
carries (``rag.capture``) and sent again only when it can no longer be on its way
(``capture.resend_after``); a copy that lands later is moved to the trash. ``/append`` and
``/remember`` send the note back with its ``Usn``, so of two sends only one applies, and an edit
made meanwhile is read again, never overwritten."""

from __future__ import annotations

import logging
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from rag.capture import has_marker, md_escape, md_label, with_marker
from rag.config import Settings
from rag.errors import AuthFailed, LeanoteRagError, Refused

from sync.sources.leanote_api import LeanoteApi, LeanoteWriter
from sync.writeback.logins import Logins
from sync.writeback.outbox import Item, Outbox
from sync.writeback.targets import LoginFailed, NotYet

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5


class LeanoteTarget(Logins):
    """Writes captures into Leanote, each with the login of its Leanote user."""

    kind = "leanote"
    where = ("Leanote", "Leanote")

    def __init__(self, settings: Settings, outbox: Outbox, clock: Callable[[], float]):
        self.settings = settings
        self.outbox = outbox
        self.clock = clock
        self._apis: dict[str, LeanoteApi] = {}  # account email -> its connection
        self._users: dict[str, str] = {}  # account email -> the Leanote user it logs in as
        self._account_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._failing: dict[str, str] = {}  # what fails ("login:<email>", "user:<id>") -> the kind of error
        self._logins = ThreadPoolExecutor(max_workers=8, thread_name_prefix="capture-login")
        self._closing = False

    def describe(self) -> str:
        emails = ", ".join(a.email for a in self._accounts()) or "no account"
        return f"Leanote at {self._base_url()}, notebook {self.settings.capture.notebook!r}, as {emails}"

    def unavailable(self) -> str | None:
        return None if self._accounts() else self.how_to_enable()

    def refusal(self, user_id: str) -> str | None:
        return None  # which login is whose is learnt by logging in

    def user_of(self, email: str) -> str | None:
        return self._user_of(email)

    def who(self, user_id: str) -> str:
        return self._who(user_id)

    def grace(self) -> float:
        """How long after an unanswered write it may still land: ``capture.resend_after``, and
        at least twice the client's own deadline."""
        return max(self.settings.capture.resend_after, 2 * self.settings.sync.http_timeout)

    def link(self, note_id: str) -> tuple[str, str]:
        url = f"{self.settings.leanote.base_url}/note/{note_id}"
        return url, url

    def resume(self) -> None:
        for api in list(self._apis.values()):
            api.stopping = False  # this target ran before (and was stopped): its connections serve again

    def stop(self) -> None:
        for api in list(self._apis.values()):
            api.stop()

    def close(self) -> None:
        """Cut the calls in flight (what they carried stays in the outbox), then close."""
        self._closing = True
        self.stop()
        self._logins.shutdown(wait=True, cancel_futures=True)
        for api in list(self._apis.values()):
            api.http.close()

    def write(self, item: Item) -> str:
        writer = self._writer(item.user_id)
        if writer is None:
            log.warning("capture %s not written: no capture account logs in as Leanote user %s (capture.accounts)",
                        item.key, item.user_id)
            raise Refused("no Leanote API account for this user: " + self.how_to_enable(), "no_account")
        try:
            if item.kind in ("note", "save"):
                note_id = self._write_note(writer, item)
                if item.kind == "note":
                    self.outbox.set_target(item.person, item.user_id, "last", note_id)
            else:
                note_id = self._write_append(writer, item)
        except AuthFailed as err:  # logged in again during a call, refused: the login's trouble
            self._login_failed(writer.api.email, err)
            raise LoginFailed(str(err)) from err
        self._login_worked(writer.api.email)  # (it may have logged in again during a call)
        self._works_again(f"user:{item.user_id}")  # (its login may have been another user's before)
        return note_id

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
            settle = item.sent_at + self.grace()
            if item.sent_at and self.clock() < settle:
                raise NotYet(settle)
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

    def check(self, item: Item) -> None:
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
