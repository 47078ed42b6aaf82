"""Every field read from Leanote (its API's JSON or its MongoDB documents) is checked
here, and nowhere else, before it becomes a ``Note`` or a ``Notebook``.

Leanote writes these fields with known types, but a database edited by hand, an old
import or a bug can leave anything behind: ``Usn: "abc"``, ``Tags`` as one string or
holding null, ``Content`` as a list or BSON binary data. What can be read sensibly is
(a null is "absent", a string ``Tags`` is one tag, a number as a string is a number);
what cannot raises ``BadField``, a ``NoteError``: the sync skips that one note, says
which field of which note, and carries on with the rest.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from rag.errors import NoteError
from rag.model import Note, Notebook


class BadField(NoteError):
    """One field of one note or notebook has a value that cannot be used."""


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def ident(value: Any, field: str) -> str:
    """An id: a string, or a BSON ObjectId; absent is ""."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if type(value).__name__ == "ObjectId":
        return str(value)
    raise BadField(f"{field} is {_describe(value)}, not an id")


def text(value: Any, field: str) -> str:
    """A string; absent is "". Numbers are written out; anything else is refused."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise BadField(f"{field} is {_describe(value)}, not text")


def flag(value: Any, field: str) -> bool:
    """A boolean; absent is false; 0/1 and "true"/"false" are accepted."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "0", "1", ""):
        return value.strip().lower() in ("true", "1")
    raise BadField(f"{field} is {_describe(value)}, not true or false")


def usn(value: Any, field: str = "Usn") -> int:
    """An update sequence number: a non-negative integer; absent is 0."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise BadField(f"{field} is {_describe(value)}, not a number")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    else:
        raise BadField(f"{field} is {_describe(value)}, not a number")
    if number < 0:
        raise BadField(f"{field} is {number}, below 0")
    return number


def usn_or_zero(value: Any) -> int:
    """For ordering a listing only: a bad USN counts as 0 (the note itself is refused
    when it is read)."""
    try:
        return usn(value)
    except BadField:
        return 0


def tags(value: Any) -> tuple[str, ...]:
    """Tags: a list of strings; null and "" entries are left out; a single string is one
    tag (MongoDB documents written by hand hold them so)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise BadField(f"Tags is {_describe(value)}, not a list of tags")
    out = []
    for tag in value:
        if tag is None:
            continue
        if not isinstance(tag, str):
            raise BadField(f"Tags holds {_describe(tag)}, not a tag")
        if tag.strip():
            out.append(tag.strip())
    return tuple(out)


def content(value: Any) -> str:
    """A note's body: text; absent is an empty note."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    kind = "binary data" if isinstance(value, (bytes, bytearray)) else type(value).__name__
    raise BadField(f"Content is {kind}, not text")


def when(value: Any) -> datetime | None:
    """A time: a datetime, or RFC 3339 text with 0-9 fractional digits. Go's zero time,
    absent and unreadable are None (a time is never worth skipping a note for)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if not isinstance(value, str) or not value or value.startswith("0001-01-01"):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))  # 3.11 reads up to 9 digits
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def note(d: Any, id_key: str, body: Any = "") -> Note:
    """A note from Leanote's field names (API JSON: ``NoteId``; MongoDB: ``_id``)."""
    if not isinstance(d, dict):
        raise BadField(f"a note is {_describe(d)}, not an object")
    note_id = ident(d.get(id_key), id_key)
    try:
        return Note(
            id=note_id,
            user_id=ident(d.get("UserId"), "UserId"),
            title=text(d.get("Title"), "Title").strip() or "(untitled)",
            content=content(body),
            is_markdown=flag(d.get("IsMarkdown"), "IsMarkdown"),
            notebook_id=ident(d.get("NotebookId"), "NotebookId"),
            tags=tags(d.get("Tags")),
            is_trash=flag(d.get("IsTrash"), "IsTrash"),
            is_deleted=flag(d.get("IsDeleted"), "IsDeleted"),
            usn=usn(d.get("Usn")),
            updated_at=when(d.get("UpdatedTime")),
            origin=f"note {note_id}",
        )
    except BadField as err:
        raise BadField(f"note {note_id}: {err}") from None


def notebook(d: Any, id_key: str) -> Notebook:
    """A notebook; a root one has ``ParentNotebookId`` absent, "" or null."""
    if not isinstance(d, dict):
        raise BadField(f"a notebook is {_describe(d)}, not an object")
    book_id = ident(d.get(id_key), id_key)
    try:
        return Notebook(
            id=book_id,
            user_id=ident(d.get("UserId"), "UserId"),
            title=text(d.get("Title"), "Title"),
            parent_id=ident(d.get("ParentNotebookId"), "ParentNotebookId"),
            is_deleted=flag(d.get("IsDeleted"), "IsDeleted"),
        )
    except BadField as err:
        raise BadField(f"notebook {book_id}: {err}") from None
