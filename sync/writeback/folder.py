"""Captures written into a folder of notes (the ``folder`` capture target, ``sync.writeback.targets``):
each a Markdown file that the ``files`` source reads like any other note.

- **Where.** ``<folder>/<capture.notebook>/<title>.md``: the inbox notebook is a sub-folder (as
  the source reads sub-folders as notebooks), the file named by the note's title made safe for
  any file system (no ``/ \\ : * ? " < > |``, no leading dot, at most ~150 bytes). The title and
  tags are in the file's front matter (``title:``, ``tags:``, which the source reads), the
  capture's marker line (``rag.capture``) at its end.
- **Never over a person's file.** A name in use gets `` (2)``, `` (3)`` …: a file is written
  whole under a hidden temporary name and then linked to its name, which fails if the name
  was taken meanwhile; nothing is ever written over.
- **Attachments** go beside the note under their own (safe) names, linked relatively
  (``![photo.jpg](photo.jpg)``): written before the note, so it never points at a missing file.
  A file already there with the same bytes (an earlier try's) is linked again, not copied.
- **Exactly once.** A capture whose row says ``sending`` (an earlier try was cut off: an error,
  ``kill -9``) is first looked for by its marker in the inbox folder; found, it is that file.
- **Appends never overwrite an edit.** ``/append`` and ``/remember`` add to the end of the file
  (``O_APPEND``): whatever the person changed is kept; a file carrying the capture's marker
  already is not added to again, and one replaced while the text went in (an editor saving
  by rename) is added to again.
- **Per person.** The folder's notes are one user's (``source.user_id``): a person mapped to
  another Leanote user is told so and nothing is written. Each person's last note (for
  ``/append``) and memory note (``/remember``) are their own.

New files and folders take the folder's permissions (without the execute bits), so a capture
is as readable as the notes beside it.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Callable
from urllib.parse import quote

import yaml

from rag.capture import MARKER, has_marker, md_escape, md_label, with_marker
from rag.config import Settings
from rag.errors import Refused

from sync.sources.files import decode
from sync.writeback.outbox import Item, Outbox

log = logging.getLogger(__name__)

NAME_BYTES = 150  # a file name's stem at most (file systems allow 255 bytes; room for " (99).md")
MAX_SAME_NAME = 1000
APPEND_RETRIES = 5
_UNSAFE = re.compile(r'[\x00-\x1f\x7f*?"<>]')
_SEPARATORS = re.compile(r"\s*[/\\|:]+\s*")
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def safe_name(title: str, fallback: str = "note") -> str:
    """A file name (without its suffix) for a title, safe on Linux, macOS and Windows shares:
    separators become " - ", what no file system takes goes, no leading dot (a hidden file is
    never read), at most ``NAME_BYTES`` bytes."""
    name = _UNSAFE.sub("", _SEPARATORS.sub(" - ", title))
    name = " ".join(name.split()).strip(" .-")
    while len(name.encode("utf-8")) > NAME_BYTES:
        name = name[:-1]
    name = name.rstrip(" .")
    if name.split(".")[0].upper() in _RESERVED:
        name += "_"
    return name or fallback


def front_matter(title: str, tags: list[str], when: datetime) -> str:
    """The YAML block the ``files`` source reads a note's title and tags from."""
    meta = {"title": title, "tags": list(tags), "created": when.strftime("%Y-%m-%d %H:%M")}
    return "---\n" + yaml.safe_dump(meta, allow_unicode=True, sort_keys=False, default_flow_style=None,
                                     width=1000) + "---\n\n"


class FolderTarget:
    """Writes captures as Markdown files into the ``files`` source's folder."""

    kind = "folder"
    where = ("笔记文件夹", "the notes folder")

    def __init__(self, settings: Settings, outbox: Outbox, clock: Callable[[], float]):
        self.settings = settings
        self.outbox = outbox
        self.clock = clock

    @property
    def root(self) -> Path:
        return Path(self.settings.source.path)

    @property
    def user(self) -> str:
        return self.settings.source.user_id

    def inbox(self) -> Path:
        return self.root / safe_name(self.settings.capture.notebook, "Inbox")

    def describe(self) -> str:
        return (f"Markdown files in the folder {self.root}, sub-folder {self.inbox().name}/ (the notes of user "
                f"{self.user})")

    def unavailable(self) -> str | None:
        return None  # (a folder not there now, a share not mounted, is found by the write: tried again later)

    def refusal(self, user_id: str) -> str | None:
        if user_id == self.user:
            return None
        return (f"笔记文件夹里是用户 {self.user} 的笔记，而你对应的是用户 {user_id}，所以不能记进去。 / The notes folder "
                f"holds the notes of user {self.user} and you are mapped to user {user_id}: nothing can be captured "
                f"for you there.")

    def user_of(self, email: str) -> str | None:
        return None

    def who(self, user_id: str) -> str:
        return f"Leanote user {user_id} (the folder {self.root})"

    def grace(self) -> float:
        return 0.0  # a file is written, or not, by the time the call returns

    def link(self, note_id: str) -> tuple[str, str]:
        return (self.root / note_id).absolute().as_uri(), note_id

    def check(self, item: Item) -> None:
        self.outbox.checked(item)  # no write goes unanswered here: nothing can land late

    def resume(self) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...

    # --- writing ---------------------------------------------------------------------------

    def write(self, item: Item) -> str:
        if not self.root.is_dir():  # a share not mounted, say: tried again later
            raise FileNotFoundError(errno.ENOENT, "the notes folder is not there", str(self.root))
        if item.kind in ("note", "save"):
            rel = self._write_note(item)
            if item.kind == "note":
                self.outbox.set_target(item.person, item.user_id, "last", rel)
            return rel
        return self._write_append(item)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _folder(self) -> Path:
        folder = self.inbox()
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, self.root.stat().st_mode & 0o7777)
        return folder

    def _write_note(self, item: Item, title: str | None = None, content: str | None = None,
                    tags: list[str] | None = None) -> str:
        folder = self._folder()
        title = title or item.payload["title"]
        stem = safe_name(title)
        if item.state == "sending":  # an earlier try was cut off: it may have written the file
            self._temp(folder, item.key).unlink(missing_ok=True)  # (cut off before it was cleared)
            found = self._marked(folder, item.key, stem)
            if found is not None:
                return self._rel(found)
        self.outbox.sending(item, self.clock(), adding=True)
        body = content if content is not None else item.payload["content"]
        for f in item.files:
            name = self._attach(folder, f.filename, f.data, item.key)
            body += f"\n{'!' if f.is_image else ''}[{md_label(f.filename)}]({quote(name)})\n"
        if item.payload.get("after"):  # what was read from the files (a photo's text), under them
            body += "\n" + item.payload["after"]
        tags = item.payload.get("tags", []) if tags is None else tags
        text = front_matter(title, tags, datetime.fromtimestamp(item.created)) + with_marker(body, item.key)
        return self._rel(self._create(folder, stem, ".md", text.encode("utf-8"), item.key))

    def _marked(self, folder: Path, key: str, stem: str) -> Path | None:
        """The file in ``folder`` carrying capture ``key``'s marker: those named like its title first."""
        files = [p for p in folder.glob("*.md") if not p.name.startswith(".")]
        files.sort(key=lambda p: not p.name.startswith(stem))
        for path in files:
            try:
                if has_marker(decode(path.read_bytes()), key):
                    return path
            except OSError:
                continue
        return None

    def _attach(self, folder: Path, filename: str, data: bytes, key: str) -> str:
        """A file sent with a capture, beside the note: its name (one with the same bytes
        already there, an earlier try's, is used again)."""
        raw = Path(filename.replace("\\", "/")).name
        suffix = "".join(c for c in Path(raw).suffix if c.isalnum() or c == ".")[:16]
        stem = safe_name(raw[: len(raw) - len(Path(raw).suffix)] if suffix else raw, "file")
        for n in range(1, MAX_SAME_NAME):
            path = folder / self._numbered(stem, suffix, n)
            try:
                if path.read_bytes() == data:
                    return path.name
            except FileNotFoundError:
                break
            except OSError:
                continue
        return self._create(folder, stem, suffix, data, key).name

    @staticmethod
    def _temp(folder: Path, key: str) -> Path:
        """Where a capture's file is written before it gets its name: hidden (neither the source
        nor the watcher looks at it)."""
        return folder / f".leanote-rag-{key}.tmp"

    @staticmethod
    def _numbered(stem: str, suffix: str, n: int) -> str:
        return f"{stem}{suffix}" if n == 1 else f"{stem} ({n}){suffix}"

    def _create(self, folder: Path, stem: str, suffix: str, data: bytes, key: str) -> Path:
        """``data`` as a new file ``stem[ (n)]suffix`` in ``folder``: written whole under a hidden
        name, then linked to the first free name (a link never replaces a file)."""
        mode = self.root.stat().st_mode & 0o666
        temp = self._temp(folder, key)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(temp, mode)  # (the process's umask narrowed it)
            for n in range(1, MAX_SAME_NAME):
                path = folder / self._numbered(stem, suffix, n)
                try:
                    os.link(temp, path)
                except FileExistsError:
                    continue
                except OSError as err:
                    if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                        raise
                    if not self._create_plain(path, data, mode):  # a file system without hard links
                        continue
                self._sync_folder(folder)
                return path
            raise Refused(f"{MAX_SAME_NAME} files in {self._rel(folder)} are named {stem}{suffix} already",
                          "name_taken")
        finally:
            temp.unlink(missing_ok=True)

    @staticmethod
    def _create_plain(path: Path, data: bytes, mode: int) -> bool:
        """``data`` as a new file at ``path`` (False when the name is taken), where no link can be made."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True

    @staticmethod
    def _sync_folder(folder: Path) -> None:
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _write_append(self, item: Item) -> str:
        what = "last" if item.kind == "append" else "memory"
        for _ in range(APPEND_RETRIES):
            rel = self.outbox.target(item.person, item.user_id, what)
            path = self.root / rel if rel else None
            if path is None or not path.is_file():
                if item.kind == "append":
                    raise Refused("the last captured note is gone from the folder (deleted, moved or renamed)", "gone")
                # the memory note does not exist (yet, or any more): it starts with this line
                title = self.settings.capture.memory_title
                rel = self._write_note(item, title=title, content=f"# {md_escape(title)}\n\n{item.payload['text']}\n",
                                       tags=[])
                self.outbox.set_target(item.person, item.user_id, what, rel)
                return rel
            content = decode(path.read_bytes())
            if has_marker(content, item.key):
                return rel  # the last try was written
            self.outbox.sending(item, self.clock(), adding=False)
            gap = "\n" if content.endswith("\n") else "\n\n"
            added = f"{gap}{item.payload['text'].rstrip()}\n\n{MARKER.format(key=item.key)}\n"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            except FileNotFoundError:  # gone meanwhile: looked at again
                continue
            try:
                data = memoryview(added.encode("utf-8"))
                while data:  # (one write on a local disk; a share may take it in parts)
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            finally:
                os.close(fd)
            if path.is_file() and has_marker(decode(path.read_bytes()), item.key):
                return rel
            log.debug("%s was replaced while capture %s was added to it; adding it again", rel, item.key)
        raise Refused(f"{rel} kept changing while the text was added", "conflict")
