"""A folder of notes: ``.md`` files (sub-folders are notebooks), rich-text ``.html``
files, and Leanote desktop ``.leanote`` export files (JSON, one or more notes each).

Notes get stable ids from their path (``.leanote`` notes: path and position), so
a renamed or moved file is a new note and the old one leaves the index.
Citations link to the file itself: exported notes carry no Leanote id.

The folder is listed anew on every pass. A file whose size and mtime (ns) are what
the last pass recorded is not read again: its notes count as unchanged. Hidden files
and folders (``.git``, ``.obsidian``, sync tools' temporary files) are never looked at.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import yaml

from rag.index.clean import strip_front_matter
from rag.errors import UserError
from rag.model import NOTEBOOK_SEP, Note

from sync.sources.base import Known, SnapshotItem, Skipped, Unchanged

log = logging.getLogger(__name__)

MARKDOWN = {".md", ".markdown"}
HTML = {".html", ".htm"}
LEANOTE = {".leanote"}
SUFFIXES = MARKDOWN | HTML | LEANOTE
MAX_FILE_BYTES = 50 * 1024 * 1024
# A file changed this recently may change again within the same mtime tick (2 s on FAT,
# coarser on some network shares) without its fingerprint changing: it is read again
# next time rather than trusted.
RACY_NS = 3_000_000_000

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
        self._counts: dict[tuple[str, int, int], int] = {}  # a .leanote export's notes, by (path, size, mtime)
        self._check_root()

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise UserError(f"source.path {self.root} is not a folder of notes")

    def _list(self) -> list[tuple[str, str, os.stat_result]]:
        """(path relative to the root, full path, stat) of every note file now, by path."""
        self._check_root()
        found: list[tuple[str, str, os.stat_result]] = []
        folders = [(os.fspath(self.root), "")]
        while folders:
            folder, prefix = folders.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue  # unreadable or gone meanwhile: as if empty, like a walk
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append((entry.path, prefix + entry.name + "/"))
                        continue
                    if os.path.splitext(entry.name)[1].lower() not in SUFFIXES:
                        continue
                    st = entry.stat()  # follows a symlink, as reading does
                except OSError:
                    continue  # gone meanwhile, or a dangling link
                if stat.S_ISREG(st.st_mode):
                    found.append((prefix + entry.name, entry.path, st))
        found.sort(key=lambda item: item[0])
        return found

    def __len__(self) -> int:
        """The notes ``notes()`` yields now: one a file, a .leanote export's own count, one a
        file it cannot read (reported as skipped). An export not changed since the last count
        is not parsed again."""
        total, counts = 0, {}
        for rel, full, st in self._list():
            if not rel.lower().endswith(tuple(LEANOTE)) or st.st_size > MAX_FILE_BYTES:
                total += 1
                continue
            key = (rel, st.st_size, st.st_mtime_ns)
            counts[key] = self._counts[key] if key in self._counts else self._count_export(full)
            total += counts[key]
        self._counts = counts
        return total

    def _count_export(self, full: str) -> int:
        try:
            with open(full, "rb") as f:
                data = f.read()
        except OSError:
            return 1
        if looks_binary(data):
            return 1
        try:
            doc = json.loads(decode(data))
        except json.JSONDecodeError:
            return 1
        notes = doc.get("notes") if isinstance(doc, dict) else None
        return len(notes) if isinstance(notes, list) else 1

    def _stamp(self, st: os.stat_result) -> str:
        """A file's fingerprint: its size and mtime, and who its notes belong to. "" for a
        file changed a moment ago (see RACY_NS): it is read again next time."""
        if abs(time.time_ns() - st.st_mtime_ns) < RACY_NS:
            return ""
        return f"{st.st_size}:{st.st_mtime_ns}:{self.user_id}"

    def _unchanged(self, rel: str, stamp: str, known: Known) -> tuple[str, ...] | None:
        """The note ids of a file whose every note was indexed from this very version."""
        if not stamp or not known.fingerprints:
            return None
        if not rel.lower().endswith(tuple(LEANOTE)):
            note_id = stable_id(f"file:{rel}")
            return (note_id,) if known.fingerprints.get(note_id) == stamp else None
        first = known.fingerprints.get(stable_id(f"leanote:{rel}#0"), "")
        head, _, count = first.rpartition("/")
        if head != stamp or not count.isdigit():
            return None
        ids = tuple(stable_id(f"leanote:{rel}#{i}") for i in range(int(count)))
        return ids if all(known.fingerprints.get(i) == first for i in ids) else None

    def notes(self, known: Known = Known()) -> Iterator[SnapshotItem]:
        for rel, full, st in self._list():
            stamp = self._stamp(st)
            same = self._unchanged(rel, stamp, known)
            if same is not None:
                yield Unchanged(rel, same)
                continue
            path = Path(full)
            try:
                if st.st_size > MAX_FILE_BYTES:
                    yield Skipped(rel, f"file is {st.st_size // (1024 * 1024)} MB, over the {MAX_FILE_BYTES // (1024 * 1024)} MB limit")
                    continue
                with open(path, "rb") as f:
                    data = f.read(8192)
                    if looks_binary(data):
                        yield Skipped(rel, "not a text file")
                        continue
                    data += f.read()
            except OSError as err:
                yield Skipped(rel, f"cannot read: {err.strerror or err}")
                continue
            suffix = path.suffix.lower()
            if suffix in LEANOTE:
                yield from self._leanote(path, rel, data, stamp)
            else:
                yield self._single(path, rel, decode(data), suffix in MARKDOWN, st, stamp)

    def _notebook(self, rel: str) -> dict:
        """The Note fields naming the folder holding a file (sub-folders are notebooks)."""
        parts = rel.split("/")[:-1]
        if not parts:
            return {}
        ids = tuple(stable_id("notebook:" + "/".join(parts[: i + 1])) for i in range(len(parts)))
        return {"notebook_id": ids[-1], "notebook_path": NOTEBOOK_SEP.join(parts), "notebook_ids": ids,
                "notebook_titles": tuple(parts)}

    def _single(self, path: Path, rel: str, text: str, is_markdown: bool, st: os.stat_result,
                stamp: str) -> Note:
        meta = _front_matter(text) if is_markdown else {}
        title = str(meta.get("title") or "").strip()
        if not title and is_markdown:
            m = _H1.search(strip_front_matter(text)[:5000])
            title = m.group(1).strip() if m else ""
        if not title and not is_markdown:
            m = _HTML_TITLE.search(text[:20000])
            title = " ".join(_TAGS.sub("", m.group(1)).split()) if m else ""
        mtime = datetime.fromtimestamp(st.st_mtime, tz=timezone.utc).replace(microsecond=0)
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
            fingerprint=stamp,
        )

    def _leanote(self, path: Path, rel: str, data: bytes, stamp: str) -> Iterator[Note | Skipped]:
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
        usable = [isinstance(item, dict) and isinstance(item.get("content", ""), str) for item in notes]
        # every note of the file carries the file's fingerprint and how many notes it holds;
        # a file with an unusable entry gets none: it is read (and the entry reported) each pass
        stamp = f"{stamp}/{len(notes)}" if stamp and all(usable) else ""
        for i, item in enumerate(notes):
            origin = f"{rel}#{i + 1}"
            if not usable[i]:
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
                fingerprint=stamp,
            )
