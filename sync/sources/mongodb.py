"""Leanote's MongoDB, read-only (``../shared/leanote-api.md`` §3).

Per user, the cursor is ``users.Usn``: notes and notebooks with ``Usn`` above it are
read in USN order, bodies joined from ``note_contents`` by ``_id`` (a missing body
is an empty note). Root notebooks have ``ParentNotebookId`` absent, ``""`` or null.
``UpdatedTime`` is never a cursor: trash, restore, move and delete do not set it.
"""

from __future__ import annotations

import logging
from datetime import timezone
from typing import Any, Iterator

from bson import ObjectId
from bson.codec_options import CodecOptions
from bson.errors import InvalidId

from rag.config import Settings, secret
from rag.errors import NoteError, Unavailable, UserError
from rag.model import Note, Notebook
from rag.redact import safe_url

from sync.sources.base import Page, Skipped
from sync.sources import fields

log = logging.getLogger(__name__)

_CODEC = CodecOptions(tz_aware=True, tzinfo=timezone.utc, unicode_decode_error_handler="replace")
_NOTE_FIELDS = {
    "_id": 1, "UserId": 1, "NotebookId": 1, "Title": 1, "Tags": 1, "IsMarkdown": 1,
    "IsTrash": 1, "IsDeleted": 1, "Usn": 1, "UpdatedTime": 1,
}


def _id(value) -> str:
    return "" if value is None else str(value)


def _oid(value: str):
    try:
        return ObjectId(value)
    except (InvalidId, TypeError):
        return value


def note_from_doc(d: dict, content: Any = "") -> Note:
    return fields.note(d, "_id", content)


def notebook_from_doc(d: dict) -> Notebook:
    return fields.notebook(d, "_id")


def _read_notes(docs) -> tuple[list[Note], list[Skipped]]:
    notes, skipped = [], []
    for d in docs:
        try:
            notes.append(note_from_doc(d))
        except NoteError as err:
            skipped.append(Skipped(f"note {_id(d.get('_id'))}", str(err), _id(d.get("_id"))))
    return notes, skipped


def read_notebooks(docs) -> list[tuple[Notebook, int]]:
    books = []
    for d in docs:
        try:
            books.append((notebook_from_doc(d), fields.usn(d.get("Usn"))))
        except NoteError as err:
            log.warning("skipped a notebook: %s", err)
    return books


def parse_url(url: str) -> tuple[str, str | None]:
    """(where, database) from a mongodb:// URL, read with pymongo's own parser: several
    hosts (a replica set) and options are fine; credentials never reach ``where``."""
    from pymongo import uri_parser
    from pymongo.errors import InvalidURI

    if url.startswith("mongodb+srv://"):  # resolving it would need DNS: name the service
        rest = url[len("mongodb+srv://"):].rsplit("@", 1)[-1]
        host, _, path = rest.partition("/")
        return host, (path.split("?")[0] or None)
    try:
        parsed = uri_parser.parse_uri(url, validate=False)
    except (InvalidURI, ValueError) as err:
        raise UserError(f"the MongoDB URL in the variable named by source.url_env is not valid: {safe_url(str(err))}") from None
    where = ",".join(f"{h}:{p}" for h, p in parsed["nodelist"])
    return where, parsed.get("database")


def _unavailable(err: Exception, where: str) -> Unavailable:
    return Unavailable(f"MongoDB at {where} failed: {err}")


def _page(docs: list[dict], covered: int) -> Page:
    notes, skipped = _read_notes(docs)
    return Page(notes, covered, skipped)


def _body(value: Any) -> "str | NoteError":
    try:
        return fields.content(value)
    except NoteError as err:
        return err


class MongoSession:
    """One Leanote user, read straight from the database."""

    def __init__(self, db, user_oid, page_size: int, where: str):
        self.db = db
        self._uid = user_oid
        self.user_id = _id(user_oid)
        self.account = self.user_id
        self.page_size = page_size
        self.where = where

    def _guard(self, fn, *args):
        from pymongo.errors import PyMongoError

        try:
            return fn(*args)
        except PyMongoError as err:
            raise _unavailable(err, self.where) from None

    def server_usn(self) -> int:
        doc = self._guard(self.db.users.find_one, {"_id": self._uid}, {"Usn": 1})
        if doc is None:
            raise Unavailable(f"user {self.user_id} is no longer in {self.where}")
        return fields.usn(doc.get("Usn"), "users.Usn")

    def notebooks_since(self, usn: int) -> list[tuple[Notebook, int]]:
        def read():
            cursor = self.db.notebooks.find({"UserId": self._uid, "Usn": {"$gt": usn}}).sort("Usn", 1)
            return read_notebooks(cursor)

        return self._guard(read)

    def notes_since(self, usn: int) -> Iterator[Page]:
        from pymongo.errors import PyMongoError

        try:
            cursor = self.db.notes.find({"UserId": self._uid, "Usn": {"$gt": usn}}, _NOTE_FIELDS).sort("Usn", 1)
            page: list[dict] = []
            top = usn
            for d in cursor:
                page.append(d)
                if len(page) >= self.page_size:
                    # the next document may share the last USN: cover only what is below it
                    last = fields.usn_or_zero(page[-1].get("Usn"))
                    top = max(last - 1, top)
                    yield _page(page, top)
                    page = []
            yield _page(page, max([top, *(fields.usn_or_zero(d.get("Usn")) for d in page)]))
        except PyMongoError as err:
            raise _unavailable(err, self.where) from None

    def contents(self, note_ids: list[str]) -> dict[str, str | None]:
        def read():
            docs = self.db.note_contents.find({"_id": {"$in": [_oid(i) for i in note_ids]}}, {"Content": 1})
            return {_id(d["_id"]): _body(d.get("Content")) for d in docs}

        found = self._guard(read)
        # No note_contents document: the body is missing (tolerated as empty), unless
        # the note itself is gone; the caller decides from the note's flags.
        return {i: found.get(i, "") for i in note_ids}

    def usn_of(self, note_id: str) -> int | None:
        """A note's USN in the database now, or None when it holds no such note."""
        try:
            oid = _oid(note_id)
        except Exception:
            return None
        doc = self._guard(self.db.notes.find_one, {"_id": oid, "UserId": self._uid}, {"Usn": 1})
        return None if doc is None else fields.usn_or_zero(doc.get("Usn"))

    def notes_by_id(self, note_ids: list[str]) -> list[Note | Skipped]:
        def read():
            docs = list(self.db.notes.find({"_id": {"$in": [_oid(i) for i in note_ids]}, "UserId": self._uid}, _NOTE_FIELDS))
            bodies = self.contents([_id(d["_id"]) for d in docs])
            out: list[Note | Skipped] = []
            for d in docs:
                try:
                    out.append(note_from_doc(d, bodies.get(_id(d["_id"]), "")))
                except NoteError as err:
                    out.append(Skipped(f"note {_id(d['_id'])}", str(err), _id(d["_id"])))
            return out

        return self._guard(read)

    def all_notebooks(self) -> list[Notebook]:
        def read():
            return [b for b, _ in read_notebooks(self.db.notebooks.find({"UserId": self._uid}))]

        return self._guard(read)

    def all_notes(self) -> list[Note | Skipped]:
        def read():
            notes, skipped = _read_notes(self.db.notes.find({"UserId": self._uid}, _NOTE_FIELDS))
            return [*notes, *skipped]

        return self._guard(read)

    def close(self) -> None:
        """The client is the source's."""


class MongoSource:
    def __init__(self, settings: Settings, client=None):
        self.settings = settings
        cfg = settings.source
        url = secret(cfg.url_env, "source.url_env") if client is None else "mongodb://test"
        self.where, url_db = parse_url(url)
        self.name = f"mongodb:{self.where}"
        dbname = cfg.database or url_db or "leanote"
        if client is None:
            from pymongo import MongoClient

            # Every wait is bounded: finding a server, connecting, and each read or write
            # on the socket (a server that accepts and then says nothing fails the pass).
            ms = int(settings.sync.http_timeout * 1000)
            client = MongoClient(url, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms,
                                 tz_aware=True)
        self.client = client
        self.db = client.get_database(dbname, codec_options=_CODEC)
        self.dbname = dbname

    def accounts(self) -> list[str]:
        """User ids to sync: source.users (ids or emails), else every user."""
        from pymongo.errors import PyMongoError

        wanted = self.settings.source.users
        try:
            users = list(self.db.users.find({}, {"_id": 1, "Email": 1, "Username": 1}))
        except PyMongoError as err:
            raise _unavailable(err, self.where) from None
        if not wanted:
            return [_id(u["_id"]) for u in users]
        picked, unknown = [], []
        for w in wanted:
            match = next((u for u in users if w in (_id(u["_id"]), u.get("Email"), u.get("Username"))), None)
            (picked if match else unknown).append(_id(match["_id"]) if match else w)
        if unknown:
            raise UserError(f"source.users names users not in database {self.dbname}: {', '.join(unknown)}")
        return picked

    def session(self, account: str) -> MongoSession:
        return MongoSession(self.db, _oid(account), self.settings.sync.page_size, self.where)

    def close(self) -> None:
        self.client.close()
