"""Leanote's HTTP sync API, per account (``../shared/leanote-api.md`` §1, §2, §6).

- ``/api/auth/login`` (email or username + password) gives a token, passed as
  ``token=`` on every call. ``{"Ok": false, "Msg": "NOTLOGIN"}`` means log in again
  (once); a refused login is ``AuthFailed`` and stops this account's sync.
- ``getSyncState`` says the user's USN: equal to our cursor, nothing to do.
- ``getSyncNotebooks`` / ``getSyncNotes`` page by ``afterUsn``/``maxEntry``. Leanote
  can stamp one USN on many notes, so a full page is followed by a request from its
  last USN - 1 (results deduplicated), and the cursor only covers USNs below the
  last one until a page comes back short.
- Bodies come one by one from ``getNoteContent`` (a bounded number in flight); an
  empty ``NoteId`` in the answer means the note is gone.
- Errors arrive as HTTP 200 ``{"Ok": false}``; a malformed id gets a non-JSON 500. An
  HTTP 200 that is not JSON (a proxy's page, a PHP error) is ``Unavailable`` (the account
  backs off), named by its first bytes.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import requests
import requests.adapters
import urllib3
import urllib3.connection

from rag.config import Settings, secret
from rag.errors import AuthFailed, NoteError, Refused, Unavailable
from rag.redact import safe_url
from rag.model import Note, Notebook

from sync.sources.base import Page, Skipped
from sync.sources import fields

log = logging.getLogger(__name__)

def note_from_api(d: dict, content: Any = "") -> Note:
    return fields.note(d, "NoteId", content)


def notebook_from_api(d: dict) -> Notebook:
    return fields.notebook(d, "NotebookId")


def usn_pages(fetch: Callable[[int, int], list[dict]], after: int, max_entry: int, key: str) -> Iterator[tuple[list[dict], int]]:
    """Page through a USN-ordered listing: (new items, USN covered so far).

    A full page may end inside a group of items sharing one USN, so the next request
    starts at that USN - 1, items already seen are dropped, and the covered USN stays
    below the group. A page of nothing but seen items (a group larger than a page)
    doubles the page size."""
    seen: set[tuple[str, int]] = set()
    while True:
        page = fetch(after, max_entry)
        fresh = [d for d in page if (str(d.get(key)), fields.usn_or_zero(d.get("Usn"))) not in seen]
        full = len(page) >= max_entry
        if full and not fresh:
            max_entry *= 2
            continue
        seen.update((str(d.get(key)), fields.usn_or_zero(d.get("Usn"))) for d in fresh)
        if not full:
            top = max((fields.usn_or_zero(d.get("Usn")) for d in page), default=after)
            yield fresh, max(top, after)
            return
        last = fields.usn_or_zero(page[-1].get("Usn"))
        covered = max(last - 1, after)
        yield fresh, covered
        after = covered


def why_unreachable(err: BaseException) -> str:
    """Why a connection failed, in a person's words, from the error at the bottom of what the
    HTTP libraries raise (requests wraps urllib3, which wraps the socket's error)."""
    stack, seen = [err], set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, socket.gaierror):
            return "its name does not resolve (check the host name, or DNS)"
        if isinstance(e, ConnectionRefusedError):
            return "the connection was refused (is Leanote running, on that port?)"
        if isinstance(e, ConnectionResetError):
            return "the connection was reset"
        if isinstance(e, ssl.SSLCertVerificationError):
            return f"its TLS certificate is not trusted ({e.verify_message})"
        if isinstance(e, ssl.SSLError):
            return f"TLS failed ({e.reason or e})"
        if isinstance(e, OSError) and e.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN):
            return "no route to it (is the network up?)"
        if isinstance(e, (TimeoutError, socket.timeout)):
            return "it did not answer in time"
        for inner in (getattr(e, "reason", None), e.__cause__, e.__context__, *e.args):
            if isinstance(inner, BaseException):
                stack.append(inner)
    return "the connection failed"


@dataclass
class _Answer:
    status: int
    body: Any  # the parsed JSON; None when it was not JSON
    raw: bytes = b""

    def not_json(self, where: str, action: str) -> str | None:
        """What is wrong with an answer that is not JSON, or None: an HTTP 200 saying
        what it said (a proxy's page, a PHP error...), another status by its number."""
        if self.body is not None:
            return None
        if self.status != 200:
            return f"Leanote at {where} answered {action} with HTTP {self.status}"
        text = " ".join(self.raw[:200].decode("utf-8", "replace").split())
        shown = text[:80] + ("…" if len(text) > 80 or len(self.raw) > 200 else "")
        return (f"Leanote at {where} answered /api/{action} with something that is not JSON: "
                + (shown or "an empty body"))


# --- HTTP with a total deadline ------------------------------------------------------------
# requests' timeouts bound each wait for a byte, so a server that drips one byte a second
# never times out. Each call here also gets a total deadline: when it passes (or the sync
# is asked to stop), a watchdog shuts the call's socket down and the call fails at once.

_current = threading.local()  # the call this thread is making


class _Call:
    def __init__(self):
        self.lock = threading.Lock()
        self.conn = None  # the pooled connection carrying it, once it has one
        self.done = False
        self.aborted = False

    def abort(self) -> None:
        with self.lock:
            if self.done:
                return
            self.aborted = True
            conn = self.conn
            # a connection goes back to the pool after a call: only cut it while it is ours
            sock = getattr(conn, "sock", None) if getattr(conn, "_call", None) is self else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def finish(self) -> None:
        with self.lock:
            self.done = True


class _Tracked:
    """A urllib3 connection that tells the call using it which connection it is."""

    def request(self, *args, **kwargs):
        call = getattr(_current, "call", None)
        if call is not None:
            with call.lock:
                if call.aborted:
                    raise OSError("the call was cut off")
                self._call, call.conn = call, self
        return super().request(*args, **kwargs)


class _TrackedHTTP(_Tracked, urllib3.connection.HTTPConnection):
    pass


class _TrackedHTTPS(_Tracked, urllib3.connection.HTTPSConnection):
    pass


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _TrackedHTTP


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPS


class _Adapter(requests.adapters.HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}


class LeanoteApi:
    """One account's connection: login, token, the calls the sync needs. Every call has
    a total deadline of ``timeout`` seconds; ``stop()`` cuts the calls in flight."""

    def __init__(self, base_url: str, email: str, password: str, timeout: float = 30.0, concurrency: int = 4,
                 password_from: str = "source.accounts"):
        """``password_from``: the config key naming the password's variable, for the message
        when Leanote refuses the login (``capture.accounts[0].password_env``)."""
        self.base_url = base_url.rstrip("/")
        self.password_from = password_from
        self.where = safe_url(self.base_url)  # for messages
        self.email = email
        self._password = password
        self.timeout = timeout
        self.concurrency = concurrency
        self.http = requests.Session()
        adapter = _Adapter(pool_maxsize=max(10, concurrency))
        self.http.mount("http://", adapter)
        self.http.mount("https://", adapter)
        self.token: str | None = None
        self.user_id: str = ""
        self._inflight: set[_Call] = set()
        self._inflight_lock = threading.Lock()
        self.stopping = False

    # --- transport ------------------------------------------------------------------------

    def stop(self) -> None:
        """Cut every call in flight, and refuse new ones (the sync is stopping)."""
        self.stopping = True
        with self._inflight_lock:
            calls = list(self._inflight)
        for call in calls:
            call.abort()

    def _request(self, action: str, params: dict, files: list | None = None) -> _Answer:
        url = f"{self.base_url}/api/{action}"
        if self.stopping:
            raise Unavailable("the sync is stopping")
        call = _Call()
        watchdog = threading.Timer(self.timeout, call.abort)
        watchdog.daemon = True
        with self._inflight_lock:
            self._inflight.add(call)
        _current.call = call
        watchdog.start()
        try:
            r = self.http.post(url, data=params, files=files or None, timeout=(min(10.0, self.timeout), self.timeout))
            content = r.content  # the whole body, under the same deadline
        except requests.RequestException as err:
            if call.aborted:
                if self.stopping:
                    raise Unavailable(f"{action} to Leanote at {self.where} was cut off: the sync is stopping") from None
                raise Unavailable(f"Leanote at {self.where} did not answer {action} completely within "
                                  f"{self.timeout:g} s") from None
            if isinstance(err, requests.Timeout):
                raise Unavailable(f"Leanote at {self.where} did not answer {action} within {self.timeout:g} s") from None
            failure = Unavailable(f"cannot reach Leanote at {self.where}: {why_unreachable(err)}")
            failure.details = safe_url(f"{type(err).__name__}: {err}")  # the library's words: shown with -v
            raise failure from None
        finally:
            watchdog.cancel()
            call.finish()
            _current.call = None
            with self._inflight_lock:
                self._inflight.discard(call)
        try:
            body = json.loads(content)
        except ValueError:
            body = None
        return _Answer(r.status_code, body, content)

    def login(self) -> None:
        answer = self._request("auth/login", {"email": self.email, "pwd": self._password})
        body = answer.body
        if answer.status != 200 or not isinstance(body, dict):
            raise Unavailable(answer.not_json(self.where, "auth/login") or (
                f"Leanote at {self.where} answered the login with HTTP {answer.status}" if answer.status != 200
                else f"Leanote at {self.where} answered /api/auth/login with JSON that is not a login answer"))
        if not body.get("Ok") or not body.get("Token"):
            raise AuthFailed(
                f"Leanote refused the login of {self.email}: {body.get('Msg') or 'wrong username or password'}. "
                f"Check the password in the environment variable named by {self.password_from}"
            )
        self.token = str(body["Token"])
        self.user_id = str(body.get("UserId") or "")
        log.debug("logged in to %s as %s", self.where, self.email)

    def call(self, action: str, *, _files: list | None = None, _refusals: bool = False, **params) -> Any:
        """Call an API action with the token, logging in (again) when needed. With
        ``_refusals``, Leanote's ``Ok: false`` is ``Refused`` with its reason (a write
        that must not be retried as is); ``_files``: multipart parts."""
        for attempt in (1, 2):
            if self.token is None:
                self.login()
            answer = self._request(action, {**params, "token": self.token}, _files)
            body = answer.body
            if isinstance(body, dict) and body.get("Ok") is False and body.get("Msg") == "NOTLOGIN":
                self.token = None
                if attempt == 2:
                    raise AuthFailed(f"Leanote keeps answering NOTLOGIN to {self.email} right after a login")
                continue
            if answer.status != 200 or body is None:
                raise Unavailable(answer.not_json(self.where, action)
                                  or f"Leanote at {self.where} answered {action} with HTTP {answer.status}")
            if isinstance(body, dict) and body.get("Ok") is False:
                if _refusals:
                    reason = str(body.get("Msg") or "")
                    raise Refused(f"Leanote refused {action}: {reason or 'no reason given'}", reason)
                raise Unavailable(f"Leanote refused {action}: {body.get('Msg') or 'no reason given'}")
            return body
        raise AssertionError("unreachable")

    # --- the calls ------------------------------------------------------------------------

    def server_usn(self) -> int:
        body = self.call("user/getSyncState")
        if not isinstance(body, dict):
            raise Unavailable(f"Leanote answered getSyncState with {type(body).__name__}, not an object")
        try:
            return fields.usn(body.get("LastSyncUsn"), "LastSyncUsn")
        except NoteError as err:
            raise Unavailable(f"Leanote answered getSyncState with a bad {err}") from None

    def _listing(self, action: str) -> Callable[[int, int], list[dict]]:
        def fetch(after: int, max_entry: int) -> list[dict]:
            body = self.call(action, afterUsn=after, maxEntry=max_entry)
            if not isinstance(body, list):
                raise Unavailable(f"Leanote answered {action} with {type(body).__name__}, not a list")
            return [d if isinstance(d, dict) else {"_malformed": d} for d in body]

        return fetch

    def content(self, note_id: str) -> str | None:
        """A note's body; None when the note is gone. A malformed id is a NoteError."""
        try:
            body = self.call("note/getNoteContent", noteId=note_id)
        except Unavailable as err:
            if "HTTP 500" in str(err):
                raise NoteError(f"Leanote failed on note {note_id!r}: {err}") from None
            raise
        if not isinstance(body, dict) or not body.get("NoteId"):
            return None
        return fields.content(body.get("Content"))


class LeanoteWriter:
    """The write calls capture needs, for one account (``../shared/leanote-api.md`` §1.12):
    notebooks, a new note (Markdown, tags, files), a note's metadata and body, and an
    update that carries the note's ``Usn`` (Leanote answers ``conflict`` when someone
    changed it meanwhile, and changes nothing)."""

    def __init__(self, api: LeanoteApi):
        self.api = api

    @property
    def user_id(self) -> str:
        if not self.api.user_id:
            self.api.login()
        return self.api.user_id

    def notebooks(self) -> list[dict]:
        body = self.api.call("notebook/getNotebooks")
        if not isinstance(body, list):
            raise Unavailable(f"Leanote answered getNotebooks with {type(body).__name__}, not a list")
        return [d for d in body if isinstance(d, dict)]

    def add_notebook(self, title: str) -> str:
        body = self.api.call("notebook/addNotebook", _refusals=True, title=title, parentNotebookId="", seq=-1)
        if not isinstance(body, dict) or not body.get("NotebookId"):
            raise Unavailable("Leanote answered addNotebook without a NotebookId")
        return str(body["NotebookId"])

    def notes_in(self, notebook_id: str) -> list[dict]:
        """The notebook's notes (no bodies), newest first."""
        body = self.api.call("note/getNotes", notebookId=notebook_id)
        if not isinstance(body, list):
            raise Unavailable(f"Leanote answered getNotes with {type(body).__name__}, not a list")
        return [d for d in body if isinstance(d, dict)]

    def add_note(self, notebook_id: str, title: str, content: str, tags: list[str],
                 files: list[tuple[str, str, bytes, str, bool]] = ()) -> dict:
        """A new Markdown note; ``files``: (local id, file name, bytes, mime, is_image).
        An image's ``fileId=<local id>`` in the content becomes Leanote's file id."""
        params: dict[str, Any] = {"NotebookId": notebook_id, "Title": title, "Content": content, "IsMarkdown": "true"}
        for i, tag in enumerate(tags):
            params[f"Tags[{i}]"] = tag
        parts = []
        for i, (local_id, name, data, mime, is_image) in enumerate(files):
            params.update({f"Files[{i}][LocalFileId]": local_id, f"Files[{i}][HasBody]": "true",
                           f"Files[{i}][IsAttach]": "false" if is_image else "true",
                           f"Files[{i}][Type]": name.rsplit(".", 1)[-1].lower() if "." in name else "",
                           f"Files[{i}][Title]": name})
            parts.append((f"FileDatas[{local_id}]", (name, data, mime)))
        body = self.api.call("note/addNote", _files=parts, _refusals=True, **params)
        if not isinstance(body, dict) or not body.get("NoteId"):
            raise Unavailable("Leanote answered addNote without a NoteId")
        return body

    def server_usn(self) -> int:
        return self.api.server_usn()

    def notes_since(self, usn: int, page_size: int = 100) -> list[dict]:
        """Every note changed after ``usn`` (metadata, trashed and deleted ones too), by getSyncNotes."""
        return [d for page, _ in usn_pages(self.api._listing("note/getSyncNotes"), usn, page_size, "NoteId")
                for d in page]

    def content(self, note_id: str) -> str | None:
        """A note's body (also in the trash); None when it is gone."""
        return self.api.content(note_id)

    def trash(self, note_id: str, usn: int, files: list[dict] = ()) -> int:
        """Move a note to the trash (``updateNote`` with ``IsTrash``), if it is still at ``usn``;
        its attachments are listed again so Leanote keeps them. ``Refused`` ``conflict`` otherwise."""
        params: dict[str, Any] = {"NoteId": note_id, "Usn": usn, "IsTrash": "true"}
        for i, f in enumerate(files):
            params.update({f"Files[{i}][FileId]": f.get("FileId") or "", f"Files[{i}][HasBody]": "false",
                           f"Files[{i}][IsAttach]": "true" if f.get("IsAttach") else "false",
                           f"Files[{i}][Type]": f.get("Type") or "", f"Files[{i}][Title]": f.get("Title") or ""})
        body = self.api.call("note/updateNote", _refusals=True, **params)
        if not isinstance(body, dict):
            raise Unavailable("Leanote answered updateNote with no object")
        return fields.usn_or_zero(body.get("Usn"))

    def note(self, note_id: str) -> tuple[dict, str] | None:
        """A note's metadata (with its ``Usn``) and body; None when it is gone or trashed."""
        body = self.api.call("note/getNoteAndContent", noteId=note_id)
        if not isinstance(body, dict) or not body.get("NoteId") or body.get("IsDeleted") or body.get("IsTrash"):
            return None
        return body, fields.content(body.get("Content"))

    def update_content(self, note_id: str, usn: int, content: str, files: list[dict] = ()) -> int:
        """Replace the body, if the note is still at ``usn``; the new USN. ``Refused``
        with reason ``conflict`` when it is not. ``files``: the note's ``Files`` as read:
        Leanote deletes every attachment an update does not list, so they are sent back."""
        params: dict[str, Any] = {"NoteId": note_id, "Usn": usn, "Content": content}
        for i, f in enumerate(files):
            params.update({f"Files[{i}][FileId]": f.get("FileId") or "", f"Files[{i}][HasBody]": "false",
                           f"Files[{i}][IsAttach]": "true" if f.get("IsAttach") else "false",
                           f"Files[{i}][Type]": f.get("Type") or "", f"Files[{i}][Title]": f.get("Title") or ""})
        body = self.api.call("note/updateNote", _refusals=True, **params)
        if not isinstance(body, dict):
            raise Unavailable("Leanote answered updateNote with no object")
        return fields.usn_or_zero(body.get("Usn"))


def _notes(items: list[dict]) -> tuple[list[Note], list[Skipped]]:
    """A listing's notes, and the ones whose fields cannot be used (skipped, named)."""
    notes, skipped = [], []
    for d in items:
        try:
            notes.append(note_from_api(d))
        except NoteError as err:
            note_id = str(d.get("NoteId") or "")
            skipped.append(Skipped(f"note {note_id}" if note_id else "a note", str(err), note_id))
    return notes, skipped


def _notebooks(items: list[dict]) -> list[tuple[Notebook, int]]:
    books = []
    for d in items:
        try:
            books.append((notebook_from_api(d), fields.usn(d.get("Usn"))))
        except NoteError as err:
            log.warning("skipped a notebook: %s", err)
    return books


class ApiSession:
    """The incremental-sync view of one Leanote account (see ``sync.incremental``)."""

    def __init__(self, api: LeanoteApi, page_size: int):
        self.api = api
        self.page_size = page_size

    @property
    def account(self) -> str:
        return self.api.email

    @property
    def user_id(self) -> str:
        if not self.api.user_id:
            self.api.login()
        return self.api.user_id

    def server_usn(self) -> int:
        return self.api.server_usn()

    def notebooks_since(self, usn: int) -> list[tuple[Notebook, int]]:
        books: list[tuple[Notebook, int]] = []
        for items, _ in usn_pages(self.api._listing("notebook/getSyncNotebooks"), usn, self.page_size, "NotebookId"):
            books.extend(_notebooks(items))
        return books

    def notes_since(self, usn: int) -> Iterator[Page]:
        for items, covered in usn_pages(self.api._listing("note/getSyncNotes"), usn, self.page_size, "NoteId"):
            notes, skipped = _notes(items)
            yield Page(notes, covered, skipped)

    def contents(self, note_ids: list[str]) -> dict[str, str | None | NoteError]:
        """Bodies by id (None: gone; NoteError: this note cannot be read), a few at a time."""
        if not note_ids:
            return {}

        def one(note_id: str):
            try:
                return self.api.content(note_id)
            except NoteError as err:
                return err

        with ThreadPoolExecutor(max_workers=self.api.concurrency) as pool:
            return dict(zip(note_ids, pool.map(one, note_ids)))

    def notes_by_id(self, note_ids: list[str]) -> list[Note | Skipped]:
        """Full notes (metadata and body), for notes whose USN did not change but must be
        indexed now (a notebook left a private subtree). Gone notes are left out."""
        out: list[Note | Skipped] = []
        for note_id in note_ids:
            body = self.api.call("note/getNoteAndContent", noteId=note_id)
            if isinstance(body, dict) and body.get("NoteId"):
                try:
                    out.append(note_from_api(body, body.get("Content")))
                except NoteError as err:
                    out.append(Skipped(f"note {note_id}", str(err), note_id))
        return out

    def usn_of(self, note_id: str) -> int | None:
        """A note's USN on the server now (metadata only: ``getNote``), or None when the server
        has no such note (not even a deleted one)."""
        try:
            body = self.api.call("note/getNote", noteId=note_id, _refusals=True)
        except Refused as err:
            if err.reason in ("notExists", "noteIdInvalid"):
                return None
            raise Unavailable(str(err)) from None
        if not isinstance(body, dict) or not body.get("NoteId"):
            return None
        try:
            return fields.usn(body.get("Usn"), "Usn")
        except NoteError as err:
            raise Unavailable(f"Leanote answered getNote with a bad {err}") from None

    def all_notebooks(self) -> list[Notebook]:
        return [b for b, _ in self.notebooks_since(0)]

    def all_notes(self) -> list[Note | Skipped]:
        """Every note's metadata (no bodies), for the daily reconcile."""
        return [n for page in self.notes_since(0) for n in [*page.notes, *page.skipped]]

    def close(self) -> None:
        """The connection is the source's: it outlives a session."""


class ApiSource:
    """Every configured account of one Leanote server."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.base_url = (settings.source.api_url or settings.leanote.base_url).rstrip("/")
        self.name = f"leanote_api:{safe_url(self.base_url)}"
        self._accounts = {a.email.strip().lower(): a for a in settings.source.accounts}
        self._apis: dict[str, LeanoteApi] = {}  # kept between runs: the token stays valid

    def accounts(self) -> list[str]:
        return list(self._accounts)

    def session(self, account: str) -> ApiSession:
        api = self._apis.get(account)
        if api is None:
            cfg = self._accounts[account]
            password = secret(cfg.password_env, f"the password_env of account {cfg.email}")
            i = next(i for i, a in enumerate(self.settings.source.accounts) if a.email.strip().lower() == account)
            api = LeanoteApi(
                self.base_url,
                account,
                password,
                timeout=self.settings.sync.http_timeout,
                concurrency=self.settings.sync.fetch_concurrency,
                password_from=f"source.accounts[{i}].password_env ({cfg.password_env})",
            )
            self._apis[account] = api
        return ApiSession(api, self.settings.sync.page_size)

    def stop(self) -> None:
        """Cut every call in flight: the sync is stopping."""
        for api in self._apis.values():
            api.stop()

    def close(self) -> None:
        for api in self._apis.values():
            api.http.close()
