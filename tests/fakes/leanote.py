"""A fake Leanote server on 127.0.0.1 following the shared ``leanote-api.md`` (the team's notes on the real API).

Implemented: ``/api/auth/login`` (email or username), ``/api/user/getSyncState``,
``/api/notebook/getSyncNotebooks``, ``/api/note/getSyncNotes`` (``afterUsn``/``maxEntry``,
USN order, no content, tombstones and trash included), ``/api/note/getNoteContent``
and ``/api/note/getNoteAndContent`` (``NoteId: ""`` when not found; a malformed id
gets a non-JSON HTTP 500, like the Go panic), ``NOTLOGIN`` as HTTP 200 for an
unknown token. Parameters come from the query string or a form body.

Test controls: ``fail(action, times, status)``, ``stall(action, seconds)``,
``expire_tokens()``, ``calls`` per action, and data edits that stamp USNs like the
server (``put_note``, ``put_notebook``, ``apply_change`` for ``changes.jsonl`` lines).
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from . import LocalServer, QuietHandler

HEX24 = re.compile(r"^[0-9a-f]{24}$")
NOTE_KEYS = ["NoteId", "NotebookId", "UserId", "Title", "Desc", "Tags", "Abstract", "Content", "IsMarkdown",
             "IsBlog", "IsTrash", "IsDeleted", "Usn", "Files", "CreatedTime", "UpdatedTime", "PublicTime"]
NOTEBOOK_KEYS = ["NotebookId", "UserId", "ParentNotebookId", "Seq", "Title", "UrlTitle", "IsBlog", "CreatedTime",
                 "UpdatedTime", "Usn", "IsDeleted"]


class FakeLeanote(LocalServer):
    def __init__(self):
        self.users: dict[str, dict] = {}  # user id -> {Email, Username, password, Usn}
        self.notebooks: dict[str, dict] = {}
        self.notes: dict[str, dict] = {}  # with "Content"
        self.tokens: dict[str, str] = {}  # token -> user id
        self.calls: Counter = Counter()
        self._faults: dict[str, list] = {}
        self._stalls: dict[str, float] = {}
        self.lock = threading.RLock()
        fake = self

        class Handler(QuietHandler):
            def _params(self) -> dict:
                url = urlparse(self.path)
                params = {k: v[-1] for k, v in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    body = self.rfile.read(length).decode()
                    params.update({k: v[-1] for k, v in parse_qs(body).items()})
                return params

            def _send(self, status: int, body, raw: bool = False) -> None:
                data = body if raw else json.dumps(body, ensure_ascii=True).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if raw else "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self):
                action = urlparse(self.path).path.removeprefix("/api/")
                params = self._params()
                with fake.lock:
                    fake.calls[action] += 1
                    fault = fake._faults.get(action)
                    stall = fake._stalls.get(action, 0)
                if stall:
                    time.sleep(stall)
                if fault and fault[0] > 0:
                    fault[0] -= 1
                    return self._send(fault[1], b"Internal Server Error: injected", raw=True)
                status, body, raw = fake.dispatch(action, params)
                self._send(status, body, raw)

            do_GET = _handle
            do_POST = _handle

        self.url = self._listen(Handler)

    # --- controls ---------------------------------------------------------------------------

    def fail(self, action: str, times: int = 1, status: int = 500) -> None:
        self._faults[action] = [times, status]

    def stall(self, action: str, seconds: float) -> None:
        self._stalls[action] = seconds

    def expire_tokens(self) -> None:
        self.tokens.clear()

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

    # --- the API --------------------------------------------------------------------------

    def dispatch(self, action: str, p: dict):
        with self.lock:
            if action == "auth/login":
                return self._login(p)
            user_id = self.tokens.get(p.get("token", ""))
            if action not in ("user/getSyncState", "notebook/getSyncNotebooks", "note/getSyncNotes",
                              "note/getNoteContent", "note/getNoteAndContent"):
                return 404, b"404 page not found", True
            if user_id is None:
                return 200, {"Ok": False, "Msg": "NOTLOGIN"}, False
            if action == "user/getSyncState":
                return 200, {"LastSyncTime": int(time.time()), "LastSyncUsn": self.users[user_id]["Usn"]}, False
            if action in ("notebook/getSyncNotebooks", "note/getSyncNotes"):
                after = _int(p.get("afterUsn"))
                limit = _int(p.get("maxEntry")) or 100
                pool = self.notebooks if action.startswith("notebook") else self.notes
                keys = NOTEBOOK_KEYS if action.startswith("notebook") else NOTE_KEYS
                rows = sorted((d for d in pool.values() if d["UserId"] == user_id and d["Usn"] > after),
                              key=lambda d: d["Usn"])[:limit]
                return 200, [{k: ("" if k in ("Content", "Desc", "Abstract") else d.get(k)) for k in keys} for d in rows], False
            note_id = p.get("noteId", "")
            if not HEX24.match(note_id):
                return 500, b"runtime error: invalid input to ObjectIdHex", True
            note = self.notes.get(note_id)
            if note is None or note["UserId"] != user_id:
                empty = {"NoteId": "", "UserId": "", "Content": ""}
                return 200, (empty if action == "note/getNoteContent" else {k: _zero(k) for k in NOTE_KEYS}), False
            content = "" if note["IsDeleted"] else note["Content"]
            if action == "note/getNoteContent":
                return 200, {"NoteId": note_id, "UserId": user_id, "Content": content}, False
            return 200, {**{k: note.get(k) for k in NOTE_KEYS}, "Content": content, "Abstract": "", "Desc": ""}, False

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


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0  # Revel's binder: missing or unparsable is 0


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
        return "0001-01-01T00:00:00Z"
    return ""
