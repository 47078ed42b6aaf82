"""The Leanote admin's backup: a ``mongodump`` of the database, as the
``backup_leanote_*.tar.gz`` the admin page offers or as the extracted folder
(``dump/leanote/*.bson``). Read with pymongo's ``bson``, no MongoDB server needed.

Collections used (field names and types as Leanote writes them): ``users``
(who exists), ``notebooks`` (titles and the tree), ``notes`` (metadata, trash and
delete flags) and ``note_contents`` (bodies, joined on ``_id``; a missing body is
an empty note). Bodies are read one at a time from file offsets, so a large dump
is never held in memory.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tarfile
import tempfile
from datetime import timezone
from pathlib import Path
from typing import Iterator, Union

import bson
from bson.codec_options import CodecOptions

from rag.config import prepare_state_dir
from rag.errors import NoteError, UserError
from rag.model import Note, Notebook

from . import BookPath, Skipped, notebook_paths
from .mongodb import read_notebooks, note_from_doc

log = logging.getLogger(__name__)

_CODEC = CodecOptions(tz_aware=True, tzinfo=timezone.utc, unicode_decode_error_handler="replace")
COLLECTIONS = ("notes", "note_contents", "notebooks")


def _iter_raw(path: Path) -> Iterator[tuple[int, bytes]]:
    """(offset, raw document) for each BSON document in a .bson file."""
    with open(path, "rb") as f:
        offset = 0
        while True:
            head = f.read(4)
            if not head:
                return
            if len(head) < 4:
                raise UserError(f"{path} is truncated (a partial document at byte {offset})")
            size = int.from_bytes(head, "little")
            if size < 5:
                raise UserError(f"{path} is not a BSON file (bad document size at byte {offset})")
            body = head + f.read(size - 4)
            if len(body) < size:
                raise UserError(f"{path} is truncated (a partial document at byte {offset})")
            yield offset, body
            offset += size


def _docs(path: Path) -> Iterator[dict]:
    for _, raw in _iter_raw(path):
        yield bson.decode(raw, codec_options=_CODEC)


def _id(value) -> str:
    return "" if value is None else str(value)


def find_database(root: Path) -> Path:
    """The folder holding notes.bson: root itself, root/leanote, root/dump/leanote, ..."""
    candidates = sorted({p.parent for p in root.rglob("notes.bson")})
    if not candidates:
        raise UserError(f"no notes.bson under {root}: source.path must be a Leanote mongodump (folder or .tar.gz)")
    if len(candidates) > 1:
        named = [c for c in candidates if c.name == "leanote"]
        if len(named) == 1:
            return named[0]
        raise UserError(f"several databases under {root} ({', '.join(map(str, candidates))}): point source.path at one")
    missing = [c for c in COLLECTIONS if not (candidates[0] / f"{c}.bson").exists()]
    if missing:
        raise UserError(f"{candidates[0]} lacks {', '.join(m + '.bson' for m in missing)}: is the dump complete?")
    return candidates[0]


class MongodumpSource:
    def __init__(self, path: Path, state_dir: Path):
        self.path = Path(path)
        self.name = f"mongodump:{self.path.resolve()}"
        self._tmp: Path | None = None
        if not self.path.exists():
            raise UserError(f"source.path {self.path} does not exist")
        if self.path.is_file():
            self._tmp = Path(tempfile.mkdtemp(prefix="mongodump-", dir=_tmp_dir(state_dir)))
            self._extract(self.path, self._tmp)
            root = self._tmp
        else:
            root = self.path
        self.db = find_database(root)
        self._count = sum(1 for _ in _iter_raw(self.db / "notes.bson"))

    def _extract(self, archive: Path, target: Path) -> None:
        try:
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".bson")]
                tar.extractall(target, members=members, filter="data")
        except (tarfile.TarError, OSError, EOFError) as err:
            shutil.rmtree(target, ignore_errors=True)
            raise UserError(f"cannot read backup archive {archive}: {err}") from None

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def notebooks(self) -> dict[str, Notebook]:
        return {b.id: b for b, _ in read_notebooks(_docs(self.db / "notebooks.bson"))}

    def notes(self) -> Iterator[Union[Note, Skipped]]:
        try:
            paths = notebook_paths(self.notebooks())
            bodies = {}
            for offset, raw in _iter_raw(self.db / "note_contents.bson"):
                doc = bson.decode(raw, codec_options=_CODEC)
                bodies[_id(doc.get("_id"))] = (offset, len(raw))
            with open(self.db / "note_contents.bson", "rb") as contents:
                for d in _docs(self.db / "notes.bson"):
                    note_id = _id(d.get("_id"))
                    try:
                        content = None
                        if note_id in bodies:
                            offset, size = bodies[note_id]
                            contents.seek(offset)
                            content = bson.decode(contents.read(size), codec_options=_CODEC).get("Content")
                        yield _note(d, content, paths)
                    except NoteError as err:
                        yield Skipped(f"note {note_id}", str(err), note_id)
                    except (bson.errors.BSONError, KeyError, TypeError, ValueError) as err:
                        yield Skipped(f"note {note_id}", f"unreadable document: {err}", note_id)
        finally:
            self.close()


def _note(d: dict, content, paths: dict[str, BookPath]) -> Note:
    note = note_from_doc(d, content)
    book = paths.get(note.notebook_id)
    if book is None:
        return dataclasses.replace(note, notebook_ids=(note.notebook_id,) if note.notebook_id else ())
    return dataclasses.replace(note, notebook_path=book.path, notebook_ids=book.ids, notebook_titles=book.titles)


def _tmp_dir(state_dir: Path) -> Path:
    path = prepare_state_dir(state_dir) / "tmp"
    path.mkdir(mode=0o700, exist_ok=True)
    return path
