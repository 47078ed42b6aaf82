"""Leanote's MongoDB, read-only (``../shared/leanote-api.md`` §3).

Per user, the cursor is ``users.Usn``: notes and notebooks with ``Usn`` above it are
read in USN order, bodies joined from ``note_contents`` by ``_id`` (a missing body
is an empty note). Root notebooks have ``ParentNotebookId`` absent, ``""`` or null.
``UpdatedTime`` is never a cursor: trash, restore, move and delete do not set it.
"""

from __future__ import annotations

import logging
from datetime import timezone
from typing import Iterator
from urllib.parse import urlparse

from bson import ObjectId
from bson.codec_options import CodecOptions
from bson.errors import InvalidId

from rag.config import Settings, secret
from rag.errors import Unavailable, UserError
from rag.model import Note, Notebook

from . import Page

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


def note_from_doc(d: dict, content: str = "") -> Note:
    return Note(
        id=_id(d.get("_id")),
        user_id=_id(d.get("UserId")),
        title=str(d.get("Title") or "").strip() or "(untitled)",
        content=content if isinstance(content, str) else "",
        is_markdown=bool(d.get("IsMarkdown", False)),
        notebook_id=_id(d.get("NotebookId")),
        tags=tuple(t.strip() for t in (d.get("Tags") or []) if isinstance(t, str) and t.strip()),
        is_trash=bool(d.get("IsTrash", False)),
        is_deleted=bool(d.get("IsDeleted", False)),
        usn=int(d.get("Usn") or 0),
        updated_at=d.get("UpdatedTime"),
        origin=f"note {_id(d.get('_id'))}",
    )


def notebook_from_doc(d: dict) -> Notebook:
    parent = d.get("ParentNotebookId")
    return Notebook(
        id=_id(d.get("_id")),
        user_id=_id(d.get("UserId")),
        title=str(d.get("Title") or ""),
        parent_id=_id(parent) if parent else "",  # absent, "" and null all mean root
        is_deleted=bool(d.get("IsDeleted", False)),
    )


def _unavailable(err: Exception, where: str) -> Unavailable:
    return Unavailable(f"MongoDB at {where} failed: {err}")


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
        return int(doc.get("Usn") or 0)

    def notebooks_since(self, usn: int) -> list[tuple[Notebook, int]]:
        def read():
            cursor = self.db.notebooks.find({"UserId": self._uid, "Usn": {"$gt": usn}}).sort("Usn", 1)
            return [(notebook_from_doc(d), int(d.get("Usn") or 0)) for d in cursor]

        return self._guard(read)

    def notes_since(self, usn: int) -> Iterator[Page]:
        from pymongo.errors import PyMongoError

        try:
            cursor = self.db.notes.find({"UserId": self._uid, "Usn": {"$gt": usn}}, _NOTE_FIELDS).sort("Usn", 1)
            page: list[Note] = []
            for d in cursor:
                page.append(note_from_doc(d))
                if len(page) >= self.page_size:
                    # the next document may share the last USN: cover only what is below it
                    yield Page(page, max(page[-1].usn - 1, usn))
                    page = []
            yield Page(page, max((n.usn for n in page), default=usn))
        except PyMongoError as err:
            raise _unavailable(err, self.where) from None

    def contents(self, note_ids: list[str]) -> dict[str, str | None]:
        def read():
            docs = self.db.note_contents.find({"_id": {"$in": [_oid(i) for i in note_ids]}}, {"Content": 1})
            return {_id(d["_id"]): d.get("Content") or "" for d in docs}

        found = self._guard(read)
        # No note_contents document: the body is missing (tolerated as empty), unless
        # the note itself is gone; the caller decides from the note's flags.
        return {i: found.get(i, "") for i in note_ids}

    def notes_by_id(self, note_ids: list[str]) -> list[Note]:
        def read():
            docs = list(self.db.notes.find({"_id": {"$in": [_oid(i) for i in note_ids]}, "UserId": self._uid}, _NOTE_FIELDS))
            bodies = self.contents([_id(d["_id"]) for d in docs])
            return [note_from_doc(d, bodies.get(_id(d["_id"]), "")) for d in docs]

        return self._guard(read)

    def all_notebooks(self) -> list[Notebook]:
        def read():
            return [notebook_from_doc(d) for d in self.db.notebooks.find({"UserId": self._uid})]

        return self._guard(read)

    def all_notes(self) -> list[Note]:
        def read():
            return [note_from_doc(d) for d in self.db.notes.find({"UserId": self._uid}, _NOTE_FIELDS)]

        return self._guard(read)

    def close(self) -> None:
        """The client is the source's."""


class MongoSource:
    def __init__(self, settings: Settings, client=None):
        self.settings = settings
        cfg = settings.source
        url = secret(cfg.url_env, "source.url_env") if client is None else "mongodb://test"
        parsed = urlparse(url)
        self.where = f"{parsed.hostname or 'localhost'}:{parsed.port or 27017}"
        self.name = f"mongodb:{self.where}"
        dbname = cfg.database or (parsed.path or "").strip("/").split("?")[0] or "leanote"
        if client is None:
            from pymongo import MongoClient

            client = MongoClient(url, serverSelectionTimeoutMS=int(settings.sync.http_timeout * 1000), tz_aware=True)
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
