"""The Leanote admin's backup: a ``mongodump`` of the database, as the
``backup_leanote_*.tar.gz`` the admin page offers, a folder holding such backups (the
newest is read: by the time in its name, else by mtime), or the extracted folder
(``dump/leanote/*.bson``). Read with pymongo's ``bson``, no MongoDB server needed.

Each pass looks again at which backup is current and reads it only when it is not
the one the last complete pass read (another path, size or mtime): then an archive
is extracted into ``state_dir/tmp`` for the pass and removed after it. Otherwise the
pass reads nothing and every note stays as it is.

Collections used (field names and types as Leanote writes them): ``users``
(who exists), ``notebooks`` (titles and the tree), ``notes`` (metadata, trash and
delete flags) and ``note_contents`` (bodies, joined on ``_id``; a missing body is
an empty note). Bodies are read one at a time from file offsets, so a large dump
is never held in memory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import tarfile
import tempfile
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import IO, Iterator

import bson
from bson.codec_options import CodecOptions

from rag.state_dir import prepare_state_dir
from rag.errors import NoteError, UserError
from rag.model import Note, Notebook

from sync.sources.base import BookPath, Checkpoint, Known, SnapshotItem, Skipped, Unchanged, notebook_paths
from sync.sources.mongodb import read_notebooks, note_from_doc

log = logging.getLogger(__name__)

_CODEC = CodecOptions(tz_aware=True, tzinfo=timezone.utc, unicode_decode_error_handler="replace")
COLLECTIONS = ("notes", "note_contents", "notebooks")
BACKUP = re.compile(r"^backup_leanote_(.*)\.tar\.gz$", re.I)


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


def _count(f: IO[bytes], where: str) -> int:
    """How many BSON documents a stream holds (each one's size is its first 4 bytes)."""
    n = 0
    while True:
        head = f.read(4)
        if not head:
            return n
        size = int.from_bytes(head, "little")
        if len(head) < 4 or size < 5 or len(f.read(size - 4)) < size - 4:
            raise UserError(f"{where} is truncated or not a BSON file (at document {n + 1})")
        n += 1


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


def backup_time(path: Path) -> datetime | None:
    """The time in a backup's name (backup_leanote_20250601153000.tar.gz, ..._2025-06-01_15-30.tar.gz)."""
    m = BACKUP.match(path.name)
    digits = re.sub(r"\D", "", m.group(1)) if m else ""
    if len(digits) < 8:
        return None
    try:
        return datetime.strptime((digits + "000000")[:14], "%Y%m%d%H%M%S")
    except ValueError:
        return None


def newest_backup(folder: Path) -> Path | None:
    """The newest backup_leanote_*.tar.gz in a folder: by the time in its name, else its mtime."""
    found = []
    for path in folder.iterdir():
        if not BACKUP.match(path.name):
            continue
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file():
            named = backup_time(path) or datetime.fromtimestamp(st.st_mtime)
            found.append((named, st.st_mtime_ns, path.name, path))
    return max(found)[-1] if found else None


@dataclasses.dataclass(frozen=True)
class Backup:
    """The backup a pass reads: an archive, or the folder holding notes.bson, and its mark
    (path, sizes and mtimes: another mark means another backup)."""

    path: Path
    archive: bool
    mark: str


class MongodumpSource:
    def __init__(self, path: Path, state_dir: Path):
        self.path = Path(path)
        self.state_dir = Path(state_dir)
        self.name = f"mongodump:{self.path.resolve()}"
        self._tmp: Path | None = None
        self._counts: dict[str, int] = {}  # mark -> notes in that backup
        backup = self.current()  # a clear error now for a path that holds no backup
        if backup.archive:
            self._check_archive(backup.path)
        else:
            len(self)  # a truncated notes.bson is named now

    def current(self) -> Backup:
        """The backup source.path points at now."""
        path = self.path
        if not path.exists():
            raise UserError(f"source.path {path} does not exist")
        if path.is_dir():
            newest = newest_backup(path)
            if newest is None:
                try:
                    db = find_database(path)
                except UserError as err:
                    if "no notes.bson" not in str(err):
                        raise
                    raise UserError(
                        f"source.path {path} holds no Leanote backup: no backup_leanote_*.tar.gz in it and no "
                        f"notes.bson under it (an extracted mongodump)"
                    ) from None
                stats = []
                for c in COLLECTIONS:
                    st = (db / f"{c}.bson").stat()
                    stats.append([c, st.st_size, st.st_mtime_ns])
                return Backup(db, False, json.dumps([str(db.resolve()), stats], ensure_ascii=False))
            path = newest
        try:
            st = path.stat()
        except OSError as err:
            raise UserError(f"cannot read backup archive {path}: {err.strerror or err}") from None
        return Backup(path, True, json.dumps([str(path.resolve()), st.st_size, st.st_mtime_ns], ensure_ascii=False))

    def _check_archive(self, archive: Path) -> None:
        try:
            with tarfile.open(archive):
                pass
        except (tarfile.TarError, OSError, EOFError) as err:
            raise UserError(f"cannot read backup archive {archive}: {err}") from None

    def __len__(self) -> int:
        """Notes in the current backup (an archive is read through, not extracted)."""
        backup = self.current()
        if backup.mark not in self._counts:
            if backup.archive:
                self._counts[backup.mark] = self._count_archive(backup.path)
            else:
                with open(backup.path / "notes.bson", "rb") as f:
                    self._counts[backup.mark] = _count(f, str(backup.path / "notes.bson"))
        return self._counts[backup.mark]

    def _count_archive(self, archive: Path) -> int:
        counts: dict[PurePosixPath, int] = {}
        try:
            with tarfile.open(archive, "r|*") as tar:
                for member in tar:
                    name = PurePosixPath(member.name)
                    if member.isfile() and name.name == "notes.bson":
                        counts[name.parent] = _count(tar.extractfile(member), f"{archive}: {member.name}")
        except (tarfile.TarError, OSError, EOFError) as err:
            raise UserError(f"cannot read backup archive {archive}: {err}") from None
        named = [n for parent, n in counts.items() if parent.name == "leanote"]
        if len(counts) == 1 or len(named) == 1:
            return (named or list(counts.values()))[0]
        if not counts:
            raise UserError(f"no notes.bson in {archive}: is it a Leanote backup?")
        raise UserError(f"several databases in {archive}: point source.path at an extracted one")

    def _extract(self, archive: Path, target: Path) -> None:
        """The .bson files of an archive, read through once."""
        try:
            with tarfile.open(archive, "r|*") as tar:
                for member in tar:
                    if member.isfile() and member.name.endswith(".bson"):
                        tar.extract(member, target, filter="data")
        except (tarfile.TarError, OSError, EOFError) as err:
            raise UserError(f"cannot read backup archive {archive}: {err}") from None

    @contextmanager
    def _database(self, backup: Backup) -> Iterator[Path]:
        """The folder holding notes.bson, extracted for the pass when an archive."""
        if not backup.archive:
            yield backup.path
            return
        self._tmp = Path(tempfile.mkdtemp(prefix="mongodump-", dir=_tmp_dir(self.state_dir)))
        try:
            self._extract(backup.path, self._tmp)
            try:
                db = find_database(self._tmp)
            except UserError as err:  # named by the archive, not the temporary copy
                raise UserError(str(err).replace(str(self._tmp), str(backup.path))) from None
            yield db
        finally:
            self.close()

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def notebooks(self, db: Path) -> dict[str, Notebook]:
        return {b.id: b for b, _ in read_notebooks(_docs(db / "notebooks.bson"))}

    def notes(self, known: Known = Known()) -> Iterator[SnapshotItem]:
        backup = self.current()
        if backup.mark == known.checkpoint:
            yield Unchanged(backup.path.name)  # the backup the last complete pass read: nothing to do
            return
        yield Checkpoint(backup.mark)
        with self._database(backup) as db:
            with open(db / "notes.bson", "rb") as f:  # a truncated file fails the pass before any note
                self._counts[backup.mark] = _count(f, str(db / "notes.bson"))
            paths = notebook_paths(self.notebooks(db))
            bodies = {}
            for offset, raw in _iter_raw(db / "note_contents.bson"):
                doc = bson.decode(raw, codec_options=_CODEC)
                bodies[_id(doc.get("_id"))] = (offset, len(raw))
            with open(db / "note_contents.bson", "rb") as contents:
                for d in _docs(db / "notes.bson"):
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
