"""A folder of notes: ``.md`` files (sub-folders are notebooks), rich-text ``.html``
files, and Leanote desktop ``.leanote`` export files (JSON, one or more notes each).

Notes get stable ids from their path (``.leanote`` notes: path and position), so
a renamed or moved file is a new note and the old one leaves the index.
Citations link to the file itself: exported notes carry no Leanote id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Union

import yaml

from rag.clean import strip_front_matter
from rag.errors import UserError
from rag.model import NOTEBOOK_SEP, Note

from . import Skipped

log = logging.getLogger(__name__)

MARKDOWN = {".md", ".markdown"}
HTML = {".html", ".htm"}
LEANOTE = {".leanote"}
MAX_FILE_BYTES = 50 * 1024 * 1024

_H1 = re.compile(r"^#[ \t]+(.+?)[ \t#]*$", re.M)
_FRONT = re.compile(r"\A\ufeff?---[ \t]*\n(.{0,4000}?)\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.S)
_HTML_TITLE = re.compile(r"<(?:title|h1)[^>]*>(.*?)</(?:title|h1)>", re.I | re.S)
_TAGS = re.compile(r"<[^>]+>")


def stable_id(key: str) -> str:
    """A 24-hex id, the shape of a Leanote NoteId, derived from a path."""
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:24]


def decode(data: bytes) -> str:
    """UTF-8 (with or without BOM), else GB18030 (common for Chinese Windows files)."""
    for encoding in ("utf-8-sig", "gb18030"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace")


def looks_binary(data: bytes) -> bool:
    head = data[:8192]
    if not head:
        return False
    if b"\x00" in head:
        return True
    controls = sum(1 for b in head if b < 9 or 13 < b < 32)
    return controls > len(head) * 0.1


def _front_matter(text: str) -> dict:
    m = _FRONT.match(text)
    if not m:
        return {}
    try:
        data = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _tags(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = re.split(r"[,，\s]+", value)
    if not isinstance(value, (list, tuple)):
        value = [value]
    return tuple(str(t).strip() for t in value if str(t).strip())


def _parse_time(value) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if not value:
        return None
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d"):
        try:
            parsed = datetime.strptime(str(value), fmt)
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


class FilesSource:
    def __init__(self, root: Path, user_id: str = "local"):
        self.root = Path(root)
        self.user_id = user_id
        self.name = f"files:{self.root.resolve()}"
        if not self.root.is_dir():
            raise UserError(f"source.path {self.root} is not a folder of notes")
        self._paths = sorted(
            p
            for p in self.root.rglob("*")
            if p.is_file()
            and p.suffix.lower() in MARKDOWN | HTML | LEANOTE
            and not any(part.startswith(".") for part in p.relative_to(self.root).parts)
        )

    def __len__(self) -> int:
        return len(self._paths)

    def notes(self) -> Iterator[Union[Note, Skipped]]:
        for path in self._paths:
            rel = path.relative_to(self.root).as_posix()
            try:
                size = path.stat().st_size
                if size > MAX_FILE_BYTES:
                    yield Skipped(rel, f"file is {size // (1024 * 1024)} MB, over the {MAX_FILE_BYTES // (1024 * 1024)} MB limit")
                    continue
                data = path.read_bytes()
            except OSError as err:
                yield Skipped(rel, f"cannot read: {err.strerror or err}")
                continue
            if looks_binary(data):
                yield Skipped(rel, "not a text file")
                continue
            suffix = path.suffix.lower()
            if suffix in LEANOTE:
                yield from self._leanote(path, rel, data)
            else:
                yield self._single(path, rel, decode(data), is_markdown=suffix in MARKDOWN)

    def _notebook(self, rel: str) -> dict:
        """The Note fields naming the folder holding a file (sub-folders are notebooks)."""
        parts = rel.split("/")[:-1]
        if not parts:
            return {}
        ids = tuple(stable_id("notebook:" + "/".join(parts[: i + 1])) for i in range(len(parts)))
        return {"notebook_id": ids[-1], "notebook_path": NOTEBOOK_SEP.join(parts), "notebook_ids": ids,
                "notebook_titles": tuple(parts)}

    def _single(self, path: Path, rel: str, text: str, is_markdown: bool) -> Note:
        meta = _front_matter(text) if is_markdown else {}
        title = str(meta.get("title") or "").strip()
        if not title and is_markdown:
            m = _H1.search(strip_front_matter(text)[:5000])
            title = m.group(1).strip() if m else ""
        if not title and not is_markdown:
            m = _HTML_TITLE.search(text[:20000])
            title = " ".join(_TAGS.sub("", m.group(1)).split()) if m else ""
        mtime = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc).replace(microsecond=0)
        return Note(
            id=stable_id(f"file:{rel}"),
            user_id=self.user_id,
            title=title or path.stem,
            content=text,
            is_markdown=is_markdown,
            **self._notebook(rel),
            tags=_tags(meta.get("tags")),
            updated_at=_parse_time(meta.get("updated")) or mtime,
            url=path.resolve().as_uri(),
            origin=rel,
        )

    def _leanote(self, path: Path, rel: str, data: bytes) -> Iterator[Union[Note, Skipped]]:
        """A Leanote desktop export: {"exportDate", "app", "notes": [{title, content, ...}]}."""
        try:
            doc = json.loads(decode(data))
        except json.JSONDecodeError as err:
            yield Skipped(rel, f"not a .leanote export (invalid JSON: {err.msg} at line {err.lineno})")
            return
        notes = doc.get("notes") if isinstance(doc, dict) else None
        if not isinstance(notes, list):
            yield Skipped(rel, "not a .leanote export (no \"notes\" list)")
            return
        notebook = self._notebook(rel)
        for i, item in enumerate(notes):
            origin = f"{rel}#{i + 1}"
            if not isinstance(item, dict) or not isinstance(item.get("content", ""), str):
                yield Skipped(origin, "note entry is not an object with text content")
                continue
            yield Note(
                id=stable_id(f"leanote:{rel}#{i}"),
                user_id=self.user_id,
                title=str(item.get("title") or "").strip() or f"{path.stem} {i + 1}",
                content=item.get("content") or "",
                is_markdown=bool(item.get("isMarkdown", True)),
                **notebook,
                tags=_tags(item.get("tags")),
                updated_at=_parse_time(item.get("updatedTime")),
                url=path.resolve().as_uri(),
                origin=origin,
            )
