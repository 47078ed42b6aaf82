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
- Errors arrive as HTTP 200 ``{"Ok": false}``; a malformed id gets a non-JSON 500.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterator

import requests

from rag.config import Settings, secret
from rag.errors import AuthFailed, NoteError, Unavailable
from rag.model import Note, Notebook

from . import Page

log = logging.getLogger(__name__)

def parse_time(value: Any) -> datetime | None:
    """RFC 3339 with 0-9 fractional digits; Go's zero time is None."""
    if not isinstance(value, str) or not value or value.startswith("0001-01-01"):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def clean_tags(tags: Any) -> tuple[str, ...]:
    """``Tags`` may be null or hold ""."""
    if not isinstance(tags, list):
        return ()
    return tuple(t.strip() for t in tags if isinstance(t, str) and t.strip())


def note_from_api(d: dict, content: str = "") -> Note:
    return Note(
        id=str(d.get("NoteId") or ""),
        user_id=str(d.get("UserId") or ""),
        title=str(d.get("Title") or "").strip() or "(untitled)",
        content=content,
        is_markdown=bool(d.get("IsMarkdown")),
        notebook_id=str(d.get("NotebookId") or ""),
        tags=clean_tags(d.get("Tags")),
        is_trash=bool(d.get("IsTrash")),
        is_deleted=bool(d.get("IsDeleted")),
        usn=int(d.get("Usn") or 0),
        updated_at=parse_time(d.get("UpdatedTime")),
        origin=f"note {d.get('NoteId')}",
    )


def notebook_from_api(d: dict) -> Notebook:
    return Notebook(
        id=str(d.get("NotebookId") or ""),
        user_id=str(d.get("UserId") or ""),
        title=str(d.get("Title") or ""),
        parent_id=str(d.get("ParentNotebookId") or ""),
        is_deleted=bool(d.get("IsDeleted")),
    )


def usn_pages(fetch: Callable[[int, int], list[dict]], after: int, max_entry: int, key: str) -> Iterator[tuple[list[dict], int]]:
    """Page through a USN-ordered listing: (new items, USN covered so far).

    A full page may end inside a group of items sharing one USN, so the next request
    starts at that USN - 1, items already seen are dropped, and the covered USN stays
    below the group. A page of nothing but seen items (a group larger than a page)
    doubles the page size."""
    seen: set[tuple[str, int]] = set()
    while True:
        page = fetch(after, max_entry)
        fresh = [d for d in page if (str(d.get(key)), int(d.get("Usn") or 0)) not in seen]
        full = len(page) >= max_entry
        if full and not fresh:
            max_entry *= 2
            continue
        seen.update((str(d.get(key)), int(d.get("Usn") or 0)) for d in fresh)
        if not full:
            top = max((int(d.get("Usn") or 0) for d in page), default=after)
            yield fresh, max(top, after)
            return
        last = int(page[-1].get("Usn") or 0)
        covered = max(last - 1, after)
        yield fresh, covered
        after = covered


@dataclass
class _Answer:
    status: int
    body: Any


class LeanoteApi:
    """One account's connection: login, token, the calls the sync needs."""

    def __init__(self, base_url: str, email: str, password: str, timeout: float = 30.0, concurrency: int = 4):
        self.base_url = base_url.rstrip("/")
        self.email = email
        self._password = password
        self.timeout = timeout
        self.concurrency = concurrency
        self.http = requests.Session()
        self.token: str | None = None
        self.user_id: str = ""

    # --- transport ------------------------------------------------------------------------

    def _request(self, action: str, params: dict) -> _Answer:
        url = f"{self.base_url}/api/{action}"
        try:
            r = self.http.post(url, data=params, timeout=self.timeout)
        except requests.Timeout:
            raise Unavailable(f"Leanote at {self.base_url} did not answer {action} within {self.timeout:g} s") from None
        except requests.RequestException as err:
            raise Unavailable(f"cannot reach Leanote at {self.base_url}: {err}") from None
        try:
            body = r.json()
        except ValueError:
            body = None
        return _Answer(r.status_code, body)

    def login(self) -> None:
        answer = self._request("auth/login", {"email": self.email, "pwd": self._password})
        body = answer.body
        if answer.status != 200 or not isinstance(body, dict):
            raise Unavailable(f"Leanote at {self.base_url} answered the login with HTTP {answer.status}")
        if not body.get("Ok") or not body.get("Token"):
            raise AuthFailed(
                f"Leanote refused the login of {self.email}: {body.get('Msg') or 'wrong username or password'}. "
                f"Check the password in the environment variable named by source.accounts"
            )
        self.token = body["Token"]
        self.user_id = str(body.get("UserId") or "")
        log.debug("logged in to %s as %s", self.base_url, self.email)

    def call(self, action: str, **params) -> Any:
        """Call an API action with the token, logging in (again) when needed."""
        for attempt in (1, 2):
            if self.token is None:
                self.login()
            answer = self._request(action, {**params, "token": self.token})
            body = answer.body
            if isinstance(body, dict) and body.get("Ok") is False and body.get("Msg") == "NOTLOGIN":
                self.token = None
                if attempt == 2:
                    raise AuthFailed(f"Leanote keeps answering NOTLOGIN to {self.email} right after a login")
                continue
            if answer.status != 200 or body is None:
                raise Unavailable(f"Leanote at {self.base_url} answered {action} with HTTP {answer.status}")
            if isinstance(body, dict) and body.get("Ok") is False:
                raise Unavailable(f"Leanote refused {action}: {body.get('Msg') or 'no reason given'}")
            return body
        raise AssertionError("unreachable")

    # --- the calls ------------------------------------------------------------------------

    def server_usn(self) -> int:
        body = self.call("user/getSyncState")
        return int(body.get("LastSyncUsn") or 0)

    def _listing(self, action: str) -> Callable[[int, int], list[dict]]:
        def fetch(after: int, max_entry: int) -> list[dict]:
            body = self.call(action, afterUsn=after, maxEntry=max_entry)
            if not isinstance(body, list):
                raise Unavailable(f"Leanote answered {action} with {type(body).__name__}, not a list")
            return body

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
        return body.get("Content") or ""


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
            books.extend((notebook_from_api(d), int(d.get("Usn") or 0)) for d in items)
        return books

    def notes_since(self, usn: int) -> Iterator[Page]:
        for items, covered in usn_pages(self.api._listing("note/getSyncNotes"), usn, self.page_size, "NoteId"):
            yield Page([note_from_api(d) for d in items], covered)

    def contents(self, note_ids: list[str]) -> dict[str, str | None | NoteError]:
        """Bodies by id (None: gone; NoteError: this note cannot be read), a few at a time."""

        def one(note_id: str):
            try:
                return self.api.content(note_id)
            except NoteError as err:
                return err

        with ThreadPoolExecutor(max_workers=self.api.concurrency) as pool:
            return dict(zip(note_ids, pool.map(one, note_ids)))

    def notes_by_id(self, note_ids: list[str]) -> list[Note]:
        """Full notes (metadata and body), for notes whose USN did not change but must be
        indexed now (a notebook left a private subtree). Gone notes are left out."""
        out = []
        for note_id in note_ids:
            body = self.api.call("note/getNoteAndContent", noteId=note_id)
            if isinstance(body, dict) and body.get("NoteId"):
                out.append(note_from_api(body, body.get("Content") or ""))
        return out

    def all_notebooks(self) -> list[Notebook]:
        return [b for b, _ in self.notebooks_since(0)]

    def all_notes(self) -> list[Note]:
        """Every note's metadata (no bodies), for the daily reconcile."""
        return [n for page in self.notes_since(0) for n in page.notes]

    def close(self) -> None:
        """The connection is the source's: it outlives a session."""


class ApiSource:
    """Every configured account of one Leanote server."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.base_url = (settings.source.api_url or settings.leanote.base_url).rstrip("/")
        self.name = f"leanote_api:{self.base_url}"
        self._accounts = {a.email.strip().lower(): a for a in settings.source.accounts}
        self._apis: dict[str, LeanoteApi] = {}  # kept between runs: the token stays valid

    def accounts(self) -> list[str]:
        return list(self._accounts)

    def session(self, account: str) -> ApiSession:
        api = self._apis.get(account)
        if api is None:
            cfg = self._accounts[account]
            password = secret(cfg.password_env, f"the password_env of account {cfg.email}")
            api = LeanoteApi(
                self.base_url,
                account,
                password,
                timeout=self.settings.sync.http_timeout,
                concurrency=self.settings.sync.fetch_concurrency,
            )
            self._apis[account] = api
        return ApiSession(api, self.settings.sync.page_size)

    def close(self) -> None:
        for api in self._apis.values():
            api.http.close()
