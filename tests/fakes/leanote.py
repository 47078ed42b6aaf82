"""A fake Leanote server on 127.0.0.1 following the shared ``leanote-api.md`` (the team's notes on the real API)
and, for the write calls, Leanote's Go source (``app/controllers/api/ApiNoteController.go`` and friends).

Read calls: ``/api/auth/login`` (email or username), ``/api/user/getSyncState``,
``/api/notebook/getSyncNotebooks``, ``/api/note/getSyncNotes`` (``afterUsn``/``maxEntry``,
USN order, no content, tombstones and trash included), ``/api/note/getNoteContent``
and ``/api/note/getNoteAndContent`` (``NoteId: ""`` when not found; a malformed id
gets a non-JSON HTTP 500, like the Go panic), ``/api/note/getNote`` (``noteIdInvalid``,
``notExists``), ``/api/note/getNotes?notebookId=&page=`` and ``/api/note/getTrashNotes``
(not deleted, not in / in the trash, newest ``UpdatedTime`` first, 1000 a page,
``notebookIdInvalid``), ``/api/notebook/getNotebooks`` (all, deleted ones too).

Write calls, as the Go code does them (every one stamps the user's next USN, so
``getSyncNotes`` sees written notes like the real server's):

- ``/api/note/addNote``: ``NotebookId`` (only checked to be 24 hex, as in Leanote: an id
  of no notebook is accepted), ``Title``, ``Content``, ``IsMarkdown``, ``Tags[i]``,
  ``Files[i][LocalFileId|IsAttach|HasBody|Type|Title|FileId]`` and file parts
  ``FileDatas[<LocalFileId>]``. Uploads get new ids, which replace ``fileId=<LocalFileId>``
  in the content. Errors come as ``info.Re`` (``Ok, Code, Msg, Id, List, Item``):
  ``notebookIdNotExists``; ``fileUploadError`` for a failed upload (also a too large one:
  ``max_upload_mb``); ``Msg: ""`` for an empty file or a ``HasBody`` file without
  ``LocalFileId``; a ``HasBody`` file with no part is a Go panic (HTTP 500). The answer is
  the request's ``ApiNote`` with ``NoteId``, ``Usn``, ``UserId`` and times filled in and
  ``Content``/``Abstract`` emptied.
- ``/api/note/updateNote``: ``NoteId`` (``noteIdNotExists``; not hex: HTTP 500), ``Usn``
  (``usnNotExists`` if <= 0; ``conflict`` if not the note's Usn, nothing changed),
  ``notExists``; errors as ``info.ReUpdate`` (``Ok, Msg, Usn``). Only the fields sent change
  (``Title``, ``Desc``, ``Content``, ``IsTrash``, ``IsBlog``, ``Tags`` when ``Tags[0]`` is
  sent, ``NotebookId`` when it is hex). Leanote's quirks are kept: attachments the request's
  ``Files`` do not list are deleted, each with a USN of its own; a content-only update keeps
  the note's ``UpdatedTime``; nothing to change answers ``{"Ok":false,"Msg":"","Usn":0}``;
  a too large upload answers ``fileIsTooLarge``.
- ``/api/notebook/addNotebook``: ``title``, ``parentNotebookId``, ``seq``; answers the ApiNotebook.

Answers carry times as Go writes ``time.Now()`` (microseconds here, +08:00); stored ones
have Mongo's millisecond precision. Parameters come from the query string and the body
(``application/x-www-form-urlencoded`` or ``multipart/form-data``; the last value of a
name wins); uploads are kept in ``files`` (id -> ``UserId``, ``NoteId``, ``IsAttach``,
``Title``, ``Type``, ``Data``, ``ContentType``). ``NOTLOGIN`` as HTTP 200 for an unknown token.

Test controls: ``fail(action, times, status, body, content_type)`` (a raw answer instead of
Leanote's), ``stall(action, seconds)``,
``expire_tokens()``, ``calls`` per action; ``hold(action, user_id=None)`` (the next such call
waits, received and not yet handled, until the test sets the returned event: a slow Leanote
that applies a write after the client gave up); ``down(refuse=False)`` / ``up()`` (the proxy
answers every request with an HTML 502, or with ``refuse`` the port is closed);
``after(action, callback)`` (once, after Leanote handled the call, before it answers:
``callback(params, body)``); ``drop_response(action, times)`` (handle the call, then close
the connection without answering); ``writes`` (``(action, params)`` of every logged-in
write call, token left out, file parts as ``Upload``); ``max_upload_mb``; and data edits
that stamp USNs like the server (``put_note``, ``put_notebook``, ``apply_change`` for
``changes.jsonl`` lines, ``edit_note`` for someone else's edit), ``notes_titled``; ``backup()`` and
``restore(backup)`` (Leanote put back to an older backup, its USN counters with it).
"""

from __future__ import annotations

import copy
import email.policy
import itertools
import json
import os
import re
import secrets
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from email.parser import BytesParser
from pathlib import Path
from typing import Callable, NamedTuple
from urllib.parse import parse_qs, urlparse

from . import LocalServer, QuietHandler

HEX24 = re.compile(r"^[0-9a-f]{24}$")
NOTE_KEYS = ["NoteId", "NotebookId", "UserId", "Title", "Desc", "Tags", "Abstract", "Content", "IsMarkdown",
             "IsBlog", "IsTrash", "IsDeleted", "Usn", "Files", "CreatedTime", "UpdatedTime", "PublicTime"]
NOTEBOOK_KEYS = ["NotebookId", "UserId", "ParentNotebookId", "Seq", "Title", "UrlTitle", "IsBlog", "CreatedTime",
                 "UpdatedTime", "Usn", "IsDeleted"]
NOTE_FILE = {"FileId": "", "LocalFileId": "", "Type": "", "Title": "", "HasBody": False, "IsAttach": False}
READS = ("user/getSyncState", "notebook/getSyncNotebooks", "note/getSyncNotes", "note/getNoteContent",
         "note/getNoteAndContent", "note/getNote", "note/getNotes", "note/getTrashNotes", "notebook/getNotebooks")
WRITES = ("note/addNote", "note/updateNote", "notebook/addNotebook")
PAGE_SIZE = 1000  # app/controllers/api/init.go
SERVER_TZ = timezone(timedelta(hours=8))
ZERO_TIME = "0001-01-01T00:00:00Z"
TAG_KEY = re.compile(r"^Tags\[(\d+)\]$")
FILE_KEY = re.compile(r"^Files\[(\d+)\]\[(\w+)\]$")
IMAGE_REF = re.compile(r"(outputImage|getImage)\?fileId=([0-9a-f]{24})")  # NoteImageService.UpdateNoteImages
BAD_GATEWAY = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
               b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
_object_ids = itertools.count(secrets.randbelow(1 << 20))


class Upload(NamedTuple):
    """A file part of a multipart body."""
    filename: str
    data: bytes
    content_type: str


class Params(dict):
    """A request's parameters (query string and form, the last value of a name wins) and,
    in ``files``, the file parts of a multipart body by name."""

    def __init__(self, values=()):
        super().__init__(values)
        self.files: dict[str, Upload] = {}


class _Panic(Exception):
    """What makes Leanote's Go code panic: Revel answers a non-JSON HTTP 500."""


class FakeLeanote(LocalServer):
    def __init__(self):
        self.users: dict[str, dict] = {}  # user id -> {Email, Username, password, Usn}
        self.notebooks: dict[str, dict] = {}
        self.notes: dict[str, dict] = {}  # with "Content"
        self.files: dict[str, dict] = {}  # uploads by FileId
        self.tokens: dict[str, str] = {}  # token -> user id
        self.calls: Counter = Counter()
        self.writes: list[tuple[str, dict]] = []
        self.max_upload_mb: float = 1000  # Leanote's uploadImageSize / uploadAttachSize default
        self._faults: dict[str, list] = {}
        self._stalls: dict[str, float] = {}
        self._holds: list[tuple[str, str | None, threading.Event]] = []
        self._hold_events: list[threading.Event] = []  # every hold's, to let go at the end
        self._after: dict[str, Callable[[dict, object], None]] = {}
        self._drops: Counter = Counter()
        self._down: str | None = None  # None, "502" or "refuse"
        self._port_open = True
        self.lock = threading.RLock()
        fake = self

        class Handler(QuietHandler):
            def _params(self) -> Params:
                url = urlparse(self.path)
                params = Params({k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()})
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                content_type = self.headers.get("Content-Type", "")
                if content_type.startswith("multipart/form-data"):
                    fields, params.files = _multipart(content_type, body)
                    params.update(fields)
                elif body:
                    params.update({k: v[-1] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()})
                return params

            def _send(self, status: int, body, raw: bool = False, content_type: str = "text/plain") -> None:
                data = body if raw else json.dumps(body, ensure_ascii=True).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type if raw else "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self):
                action = urlparse(self.path).path.removeprefix("/api/")
                params = self._params()
                with fake.lock:
                    down = fake._down
                if down == "refuse":  # a connection kept alive from before: closed unanswered
                    self.close_connection = True
                    return
                if down:
                    return self._send(502, BAD_GATEWAY, raw=True, content_type="text/html")
                with fake.lock:
                    fake.calls[action] += 1
                    fault = fake._faults.get(action)
                    stall = fake._stalls.get(action, 0)
                if stall:
                    time.sleep(stall)
                held = fake._held(action, params)
                if held is not None:
                    held.wait(120)  # released by the test (or when the fake stops)
                if fault and fault[0] > 0:
                    fault[0] -= 1
                    return self._send(fault[1], fault[2], raw=True, content_type=fault[3])
                status, body, raw = fake.dispatch(action, params)
                with fake.lock:
                    callback = fake._after.pop(action, None)
                    drop = fake._drops[action] > 0
                    if drop:
                        fake._drops[action] -= 1
                if callback:
                    callback(params, body)
                if drop:
                    self.close_connection = True
                    return
                self._send(status, body, raw)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle  # the route is "* /api/:controller/:action"

        self.url = self._listen(Handler)
        self._thread = self._serving_thread()

    # --- controls ---------------------------------------------------------------------------

    def fail(self, action: str, times: int = 1, status: int = 500, body: bytes = b"Internal Server Error: injected",
             content_type: str = "text/plain") -> None:
        self._faults[action] = [times, status, body, content_type]

    def stall(self, action: str, seconds: float) -> None:
        self._stalls[action] = seconds

    def hold(self, action: str, user_id: str | None = None) -> threading.Event:
        """The next ``action`` call (of this user, if given) is received and then waits until
        the returned event is set; only then does Leanote handle it (a write is applied) and
        answer, to whoever still listens: a client that gave up meanwhile does not stop it,
        as with the real server, which goes on with a request whose client hung up."""
        event = threading.Event()
        with self.lock:
            self._holds.append((action, user_id, event))
            self._hold_events.append(event)
        return event

    def _held(self, action: str, params: dict) -> threading.Event | None:
        with self.lock:
            if action == "auth/login":
                who = (params.get("email") or "").strip().lower()
                user = next((u for u, d in self.users.items() if who in (d["Email"], d["Username"])), None)
            else:
                user = self.tokens.get(params.get("token", ""))
            for i, (held_action, held_user, event) in enumerate(self._holds):
                if held_action == action and held_user in (None, user):
                    del self._holds[i]
                    return event
        return None

    def before_stop(self) -> None:
        """Calls still held are let go: the server can stop."""
        with self.lock:
            events, self._holds = list(self._hold_events), []
        for event in events:
            event.set()

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def down(self, refuse: bool = False) -> None:
        """Leanote is down behind its proxy: every request gets an HTML 502 at once. With
        ``refuse``, the port itself closes: new connections are refused, kept-alive ones are
        closed unanswered at their next request."""
        with self.lock:
            self._down = "refuse" if refuse else "502"
        self._set_port(open_=not refuse)

    def up(self) -> None:
        """Leanote is back, on the same URL."""
        self._set_port(open_=True)
        with self.lock:
            self._down = None

    def after(self, action: str, callback) -> None:
        """Run ``callback(params, body)`` once, after the next ``action`` call was handled (and
        applied, if Leanote accepted it) but before the answer ``body`` is sent."""
        with self.lock:
            self._after[action] = callback

    def drop_response(self, action: str, times: int = 1) -> None:
        """The next ``times`` ``action`` calls are handled (a write is applied), then the
        connection closes without an answer, as if Leanote or the network died just then."""
        with self.lock:
            self._drops[action] = times

    def _serving_thread(self) -> threading.Thread:
        """The server loop, looking for a stop every 50 ms rather than 0.5 s: stopping the
        fake and closing its port are quick."""
        return threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def _set_port(self, open_: bool) -> None:
        """Close the listening socket, or listen again on the same port."""
        if open_ == self._port_open:
            return
        if open_:
            self.server = type(self.server)(self.server.server_address, self.server.RequestHandlerClass)
            self.server.daemon_threads = True
            self._thread = self._serving_thread()
            self._thread.start()
        else:
            self.server.shutdown()
            self.server.server_close()
        self._port_open = open_

    # --- data ------------------------------------------------------------------------------

    def add_user(self, user_id: str, email: str, password: str, username: str | None = None) -> None:
        self.users[user_id] = {"Email": email.lower(), "Username": (username or email.split("@")[0]).lower(),
                               "password": password, "Usn": 0}

    def _stamp(self, user_id: str, usn: int | None) -> int:
        """The user's next USN, or the one given (which may be shared with other items)."""
        user = self.users[user_id]
        if usn is None:
            user["Usn"] += 1
            return user["Usn"]
        user["Usn"] = max(user["Usn"], usn)
        return usn

    def put_notebook(self, book: dict, usn: int | None = None) -> dict:
        with self.lock:
            book = {**{"ParentNotebookId": "", "Seq": 0, "UrlTitle": book.get("Title", ""), "IsBlog": False,
                       "CreatedTime": "2024-01-01T00:00:00.000+08:00", "UpdatedTime": "2024-01-01T00:00:00.000+08:00",
                       "IsDeleted": False}, **book}
            book["Usn"] = self._stamp(book["UserId"], usn)
            self.notebooks[book["NotebookId"]] = book
            return book

    def put_note(self, note: dict, usn: int | None = None) -> dict:
        """Store a note (with Content) and give it the user's next USN, or the one given."""
        with self.lock:
            note = {**{"Desc": "", "Abstract": "", "Tags": None, "IsBlog": False, "IsTrash": False, "IsDeleted": False,
                       "Files": [], "CreatedTime": "2024-01-01T00:00:00.000+08:00",
                       "UpdatedTime": "2024-01-01T00:00:00.000+08:00", "PublicTime": "0001-01-01T00:00:00Z",
                       "Content": "", "IsMarkdown": True}, **note}
            note["Usn"] = self._stamp(note["UserId"], usn)
            self.notes[note["NoteId"]] = note
            return note

    def edit_note(self, note_id: str, content: str | None = None, title: str | None = None) -> dict:
        """Someone else (the web UI, another client) edits the note: it gets a new USN and
        UpdatedTime, so an ``updateNote`` still carrying the old Usn meets a ``conflict``."""
        with self.lock:
            note = self.notes[note_id]
            if title is not None:
                note["Title"] = title
            if content is not None:
                self._set_content(note, content)
            note["Usn"] = self._stamp(note["UserId"], None)
            note["UpdatedTime"] = _go_time(_stored(datetime.now(SERVER_TZ)))
            return note

    def notes_titled(self, user_id: str, title: str) -> list[dict]:
        """The user's notes (not permanently deleted) with this title, in USN order: one per
        ``addNote`` that Leanote applied, answered or not."""
        with self.lock:
            return sorted((n for n in self.notes.values()
                           if n["UserId"] == user_id and n["Title"] == title and not n["IsDeleted"]),
                          key=lambda n: n["Usn"])

    def backup(self) -> dict:
        """Everything the server holds, as a backup would (``restore`` puts it back)."""
        with self.lock:
            return copy.deepcopy({"users": self.users, "notebooks": self.notebooks, "notes": self.notes,
                                  "files": self.files})

    def restore(self, backup: dict) -> None:
        """Leanote restored from an older backup: its data, users' USN counters included, are
        as they were then (logins stay valid: a client is not told)."""
        with self.lock:
            for key, value in copy.deepcopy(backup).items():
                setattr(self, key, value)

    def malformed_batch(self, corpus: Path, user_id: str, rnd, pairs: int = 8) -> None:
        """A batch of the shared corpus's kind of trouble for ``user_id``: ``pairs`` notes whose
        fields have the wrong types (tags, title, markdown flag, content in turn), each beside a
        good note of growing size, and an edit that cuts one long note to 400 characters (its
        later chunks' points go). Note ids come from ``rnd``."""
        book = next(b["NotebookId"] for b in json.loads((corpus / "notebooks.json").read_text(encoding="utf-8"))
                    if b["UserId"] == user_id)
        bad = [{"Tags": [7]}, {"Title": {"zh": "x"}}, {"IsMarkdown": "perhaps"}, {"Content": ["x"]}]
        for i in range(pairs):
            self.put_note({"NoteId": "%024x" % rnd.getrandbits(96), "UserId": user_id, "NotebookId": book,
                           "Title": f"坏笔记 {i}", "Content": f"MALFORMED-{i} 线程池", **bad[i % 4]})
            self.put_note({"NoteId": "%024x" % rnd.getrandbits(96), "UserId": user_id, "NotebookId": book,
                           "Title": f"好笔记 {i}", "Content": f"GOOD-{i} 线程池 Redis 缓存 " * (5 + 20 * i)})
        shortened = next(n for n in self.notes.values() if n["UserId"] == user_id and not n["IsTrash"]
                         and len(n["Content"]) > 3000)
        self.edit_note(shortened["NoteId"], content=shortened["Content"][:400])

    def load_corpus(self, corpus: Path, passwords=("one-secret", "two-secret"), keep=lambda note: True) -> None:
        """The shared corpus: two users, their notebooks and notes with their own USNs
        (only the notes ``keep`` accepts)."""
        facts = json.loads((corpus / "facts.json").read_text(encoding="utf-8"))
        self.add_user(facts["users"]["user_one"], "one@example.com", passwords[0])
        self.add_user(facts["users"]["user_two"], "two@example.com", passwords[1])
        for book in json.loads((corpus / "notebooks.json").read_text(encoding="utf-8")):
            self.put_notebook(book, usn=book["Usn"])
        with open(corpus / "notes.jsonl", encoding="utf-8") as f:
            for line in f:
                note = json.loads(line)
                note.pop("Source", None)
                if keep(note):
                    self.put_note(note, usn=note["Usn"])

    def apply_change(self, change: dict) -> None:
        """One ``changes.jsonl`` line: the note after the change, USN included."""
        note = dict(change["note"])
        note.pop("Source", None)
        self.put_note(note, usn=note["Usn"])

    def _set_content(self, note: dict, content: str) -> None:
        """New content; the note's images are the user's images it links to, as Leanote's
        ``UpdateNoteImages`` finds them (attachments stay)."""
        mine = {file_id for file_id, f in self.files.items() if f["UserId"] == note["UserId"] and not f["IsAttach"]}
        mine |= {f["FileId"] for n in self.notes.values() if n["UserId"] == note["UserId"]
                 for f in n["Files"] or [] if not f.get("IsAttach")}
        linked = dict.fromkeys(m[2] for m in IMAGE_REF.finditer(content))
        note["Content"] = content
        note["Files"] = ([{**NOTE_FILE, "FileId": file_id} for file_id in linked if file_id in mine]
                         + [f for f in note["Files"] or [] if f.get("IsAttach")])

    # --- the API --------------------------------------------------------------------------

    def dispatch(self, action: str, p: dict):
        with self.lock:
            if action == "auth/login":
                return self._login(p)
            user_id = self.tokens.get(p.get("token", ""))
            if action not in READS + WRITES:
                return 404, b"404 page not found", True
            if user_id is None:
                return 200, {"Ok": False, "Msg": "NOTLOGIN"}, False
            if action in WRITES:
                self.writes.append((action, {**{k: v for k, v in p.items() if k != "token"},
                                             **getattr(p, "files", {})}))
            handler = {"user/getSyncState": self._sync_state,
                       "notebook/getSyncNotebooks": self._sync_rows,
                       "note/getSyncNotes": self._sync_rows,
                       "notebook/getNotebooks": self._sync_rows,
                       "note/getNoteContent": self._note_content,
                       "note/getNoteAndContent": self._note_content,
                       "note/getNote": self._get_note,
                       "note/getNotes": self._list_notes,
                       "note/getTrashNotes": self._list_notes,
                       "note/addNote": self._add_note,
                       "note/updateNote": self._update_note,
                       "notebook/addNotebook": self._add_notebook}[action]
            try:
                return handler(action, user_id, p)
            except _Panic as panic:
                return 500, f"runtime error: {panic}".encode(), True

    def _login(self, p: dict):
        who = (p.get("email") or "").strip().lower()
        field = "Email" if "@" in who else "Username"
        for user_id, user in self.users.items():
            if user[field] == who and user["password"] == p.get("pwd"):
                token = secrets.token_hex(12)
                self.tokens[token] = user_id
                return 200, {"Ok": True, "Token": token, "UserId": user_id, "Email": user["Email"],
                             "Username": user["Username"]}, False
        return 200, {"Ok": False, "Msg": "Wrong username or password"}, False

    def _sync_state(self, action: str, user_id: str, p: dict):
        return 200, {"LastSyncTime": int(time.time()), "LastSyncUsn": self.users[user_id]["Usn"]}, False

    def _sync_rows(self, action: str, user_id: str, p: dict):
        """getSyncNotebooks / getSyncNotes, and getNotebooks (the same query from USN 0)."""
        after, limit = (0, 99999) if action == "notebook/getNotebooks" else (_int(p.get("afterUsn")),
                                                                             _int(p.get("maxEntry")) or 100)
        pool = self.notebooks if action.startswith("notebook") else self.notes
        rows = sorted((d for d in pool.values() if d["UserId"] == user_id and d["Usn"] > after),
                      key=lambda d: d["Usn"])[:limit]
        if pool is self.notebooks:
            return 200, [{k: d.get(k) for k in NOTEBOOK_KEYS} for d in rows], False
        return 200, [_api_note(d) for d in rows], False

    def _note_content(self, action: str, user_id: str, p: dict):
        note_id = p.get("noteId", "")
        if not HEX24.match(note_id):
            raise _Panic("invalid input to ObjectIdHex")
        note = self.notes.get(note_id)
        if note is None or note["UserId"] != user_id:
            empty = {"NoteId": "", "UserId": "", "Content": ""}
            return 200, (empty if action == "note/getNoteContent" else {k: _zero(k) for k in NOTE_KEYS}), False
        content = "" if note["IsDeleted"] else note["Content"]
        if action == "note/getNoteContent":
            return 200, {"NoteId": note_id, "UserId": user_id, "Content": content}, False
        return 200, {**_api_note(note), "Content": content}, False

    def _get_note(self, action: str, user_id: str, p: dict):
        note_id = p.get("noteId", "")
        if not HEX24.match(note_id):
            return 200, {"Ok": False, "Msg": "noteIdInvalid"}, False
        note = self.notes.get(note_id)
        if note is None or note["UserId"] != user_id:
            return 200, {"Ok": False, "Msg": "notExists"}, False
        return 200, _api_note(note), False

    def _list_notes(self, action: str, user_id: str, p: dict):
        """getNotes (one notebook, or all with no ``notebookId``) and getTrashNotes:
        ``NoteService.ListNotes`` sorted by ``-UpdatedTime``, a page of 1000."""
        book = "" if action == "note/getTrashNotes" else p.get("notebookId", "")
        if book and not HEX24.match(book):
            return 200, {"Ok": False, "Msg": "notebookIdInvalid"}, False
        trash = action == "note/getTrashNotes"
        rows = sorted((n for n in self.notes.values() if n["UserId"] == user_id and n["IsTrash"] == trash
                       and not n["IsDeleted"] and (not book or n["NotebookId"] == book)),
                      key=lambda n: datetime.fromisoformat(n["UpdatedTime"]), reverse=True)
        skip = (max(_int(p.get("page")), 1) - 1) * PAGE_SIZE
        return 200, [_api_note(n) for n in rows[skip:skip + PAGE_SIZE]], False

    def _upload(self, user_id: str, note_id: str, file: dict, parts: dict[str, Upload]) -> tuple[bool, str, str]:
        """``ApiBaseController.upload``: store ``FileDatas[<LocalFileId>]`` as an image or an
        attachment of the note. Returns (ok, msg, file id)."""
        part = parts.get(f"FileDatas[{file['LocalFileId']}]")
        if part is None:
            raise _Panic("index out of range [0] with length 0")  # c.Params.Files[name][0]
        if not part.data:
            return False, "", ""
        if len(part.data) > (self.max_upload_mb if self.max_upload_mb > 0 else 1000) * 1024 * 1024:
            return False, "fileIsTooLarge", ""
        file_id = _object_id()
        ext = os.path.splitext(part.filename)[1]
        self.files[file_id] = {"UserId": user_id, "NoteId": note_id, "IsAttach": file["IsAttach"],
                               "Title": part.filename, "Type": ext[1:].lower() if file["IsAttach"] else "",
                               "Data": part.data, "ContentType": part.content_type}
        return True, "", file_id

    def _attachment(self, file_id: str) -> dict:
        """An uploaded attachment as a note lists it in ``Files``."""
        return {**NOTE_FILE, "FileId": file_id, "Type": self.files[file_id]["Type"],
                "Title": self.files[file_id]["Title"], "IsAttach": True}

    def _add_note(self, action: str, user_id: str, p: dict):
        """``ApiNote.AddNote``."""
        sent = _bind_note(p)
        if not HEX24.match(sent["NotebookId"]):
            return _re("notebookIdNotExists")
        note_id = _object_id()
        attachments = []
        for file in sent["Files"] or []:
            if not file["HasBody"]:
                continue
            if not file["LocalFileId"]:
                return _re("")
            ok, msg, file_id = self._upload(user_id, note_id, file, getattr(p, "files", {}))
            if not ok:
                return _re("fileUploadError" if msg else "")
            file["FileId"] = file_id
            if file["IsAttach"]:
                attachments.append(self._attachment(file_id))
        now = datetime.now(SERVER_TZ)
        stored = _go_time(_stored(now))
        note = {"NoteId": note_id, "NotebookId": sent["NotebookId"], "UserId": user_id, "Title": sent["Title"],
                "Tags": sent["Tags"], "IsMarkdown": sent["IsMarkdown"], "IsBlog": sent["IsBlog"], "Files": attachments,
                "CreatedTime": stored, "UpdatedTime": stored, "PublicTime": stored}
        self._set_content(note, _fix_post_content(sent["Content"], sent["Files"]))
        note = self.put_note(note)
        return 200, {**sent, "NoteId": note_id, "UserId": user_id, "Usn": note["Usn"], "Content": "",
                     "Abstract": "", "CreatedTime": _go_time(now), "UpdatedTime": _go_time(now)}, False

    def _update_note(self, action: str, user_id: str, p: dict):
        """``ApiNote.UpdateNote``."""
        sent = _bind_note(p)
        if not sent["NoteId"]:
            return _re_update("noteIdNotExists")
        if sent["Usn"] <= 0:
            return _re_update("usnNotExists")
        if not HEX24.match(sent["NoteId"]):
            raise _Panic("invalid input to ObjectIdHex")
        note = self.notes.get(sent["NoteId"])
        if note is None or note["UserId"] != user_id:
            return _re_update("notExists")
        if note["Usn"] != sent["Usn"]:
            return _re_update("conflict")
        if "Files[0][LocalFileId]" in p:
            for file in sent["Files"] or []:
                if not file["HasBody"]:
                    continue
                if not file["LocalFileId"]:
                    return _re_update("")
                ok, msg, file_id = self._upload(user_id, note["NoteId"], file, getattr(p, "files", {}))
                if not ok:
                    return _re_update(msg or "fileUploadError")
                file["FileId"] = file_id
                if file["IsAttach"] and not note["IsDeleted"]:
                    note["Files"].append(self._attachment(file_id))
        now = _go_time(_stored(datetime.now(SERVER_TZ)))
        kept = {f["FileId"] for f in sent["Files"] or [] if f["IsAttach"] and f["FileId"]}
        for gone in [] if note["IsDeleted"] else [f for f in note["Files"] if f.get("IsAttach")
                                                  and f["FileId"] not in kept]:
            # AttachService.UpdateOrDeleteAttachApi: each deletion is a note change of its own
            note["Files"].remove(gone)
            self.files.pop(gone["FileId"], None)
            note.update(Usn=self._stamp(user_id, None), UpdatedTime=now)
        changes = {key: sent[key] for key in ("Desc", "Title", "IsTrash", "IsBlog") if key in p}
        if "Tags[0]" in p:
            changes["Tags"] = sent["Tags"]
        if HEX24.match(p.get("NotebookId", "")):
            changes["NotebookId"] = sent["NotebookId"]
        if "Content" not in p and not changes:
            return _re_update("")
        if note["IsDeleted"]:
            return _re_update("notExists")
        if changes:
            if changes.get("IsBlog") and not note["IsBlog"]:
                changes["PublicTime"] = now
            note.update(changes, Usn=self._stamp(user_id, None), UpdatedTime=now)
        if "Content" in p:
            if not changes:  # UpdateNoteContent checks the Usn again, and leaves UpdatedTime alone
                if note["Usn"] != sent["Usn"]:
                    return _re_update("conflict")
                note["Usn"] = self._stamp(user_id, None)
            sent["Content"] = _fix_post_content(sent["Content"], sent["Files"])
            sent["Abstract"] = sent["Abstract"] or sent["Content"][:200]  # Leanote cuts HTML more carefully
            self._set_content(note, sent["Content"])
        return 200, {**sent, "UserId": user_id, "Usn": note["Usn"], "Content": "",
                     "UpdatedTime": _go_time(datetime.now(SERVER_TZ))}, False

    def _add_notebook(self, action: str, user_id: str, p: dict):
        """``ApiNotebook.AddNotebook``: the parent is only checked to be hex."""
        parent = p.get("parentNotebookId", "")
        now = datetime.now(SERVER_TZ)
        book = self.put_notebook({"NotebookId": _object_id(), "UserId": user_id, "Title": p.get("title", ""),
                                  "ParentNotebookId": parent if HEX24.match(parent) else "",
                                  "Seq": _int(p.get("seq")), "CreatedTime": _go_time(_stored(now)),
                                  "UpdatedTime": _go_time(_stored(now))})
        return 200, {**{k: book[k] for k in NOTEBOOK_KEYS}, "CreatedTime": _go_time(now),
                     "UpdatedTime": _go_time(now)}, False


def _multipart(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, Upload]]:
    """The fields and file parts of a ``multipart/form-data`` body."""
    message = BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    fields, files = {}, {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True) or b""
        if name is None:
            continue
        if part.get_filename() is None:
            fields[name] = data.decode("utf-8", "replace")
        else:
            files[name] = Upload(part.get_filename(), data, part.get_content_type())
    return fields, files


def _bind_note(p: dict) -> dict:
    """The ``info.ApiNote`` Revel binds from the parameters: absent fields are Go zero
    values, and ``Tags`` / ``Files`` stay null unless ``Tags[i]`` / ``Files[i][...]`` are sent."""
    note = {k: _zero(k) for k in NOTE_KEYS}
    for key in ("NoteId", "NotebookId", "Title", "Desc", "Abstract", "Content"):
        note[key] = p.get(key, "")
    for key in ("IsMarkdown", "IsBlog", "IsTrash", "IsDeleted"):
        note[key] = _bool(p.get(key, ""))
    note["Usn"] = _int(p.get("Usn"))
    tags = {int(m[1]): value for key, value in p.items() if (m := TAG_KEY.match(key))}
    if tags:
        note["Tags"] = [tags.get(i, "") for i in range(max(tags) + 1)]
    files: dict[int, dict] = {}
    for key, value in p.items():
        if (m := FILE_KEY.match(key)) and m[2] in NOTE_FILE:
            file = files.setdefault(int(m[1]), dict(NOTE_FILE))
            file[m[2]] = _bool(value) if m[2] in ("HasBody", "IsAttach") else value
    note["Files"] = [files.get(i, dict(NOTE_FILE)) for i in range(max(files) + 1)] if files else None
    return note


def _fix_post_content(content: str, files: list[dict] | None) -> str:
    """``fixPostNotecontent``: ``fileId=<LocalFileId>`` becomes ``fileId=<FileId>``."""
    for file in files or []:
        if file["LocalFileId"]:
            content = content.replace("fileId=" + file["LocalFileId"], "fileId=" + file["FileId"])
    return content


def _api_note(note: dict) -> dict:
    """A stored note as the API lists it: no content, no Desc or Abstract."""
    return {k: ("" if k in ("Content", "Desc", "Abstract") else note.get(k)) for k in NOTE_KEYS}


def _re(msg: str):
    """``info.Re``, which addNote answers its errors with."""
    return 200, {"Ok": False, "Code": 0, "Msg": msg, "Id": "", "List": None, "Item": None}, False


def _re_update(msg: str):
    """``info.ReUpdate``, which updateNote answers its errors with."""
    return 200, {"Ok": False, "Msg": msg, "Usn": 0}, False


def _object_id() -> str:
    """A new Mongo ObjectId: seconds, 5 random bytes, a counter."""
    return f"{int(time.time()):08x}{secrets.token_hex(5)}{next(_object_ids) % (1 << 24):06x}"


def _stored(moment: datetime) -> datetime:
    """A time after a round trip through Mongo: milliseconds."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def _go_time(moment: datetime) -> str:
    """A time as Go's encoding/json writes it: RFC 3339, trailing fractional zeros dropped."""
    text = moment.isoformat(timespec="microseconds")
    return text[:-6].rstrip("0").rstrip(".") + text[-6:]


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0  # Revel's binder: missing or unparsable is 0


def _bool(value: str) -> bool:
    return value.strip().lower() in ("true", "on", "1")  # Revel's binder


def _zero(key: str):
    if key in ("IsMarkdown", "IsBlog", "IsTrash", "IsDeleted"):
        return False
    if key == "Usn":
        return 0
    if key == "Files":
        return []
    if key == "Tags":
        return None
    if key.endswith("Time"):
        return ZERO_TIME
    return ""
