"""What every source gives the indexer, and what it is handed back: the records of a
snapshot (``SnapshotItem``: a note, ``Skipped``, ``Unchanged``), what the last passes
recorded (``Known``, ``Checkpoint``), a notebook's path, and the two kinds of source
(``NoteSource``, ``IncrementalSource`` with its ``AccountSession``). The package's
docstring says how they are used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping, Protocol, Union

from rag.model import NOTEBOOK_SEP, Note, Notebook


@dataclass(frozen=True)
class Skipped:
    """A note that could not be read: where it is, why, and its id when known."""

    origin: str
    reason: str
    note_id: str = ""


@dataclass(frozen=True)
class Unchanged:
    """Notes as the last pass left them, not read again: ``note_ids``, or every note the
    source has in the state when None (a backup that did not change)."""

    origin: str
    note_ids: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Checkpoint:
    """What the source read this pass (e.g. a backup file's path, size and mtime); kept
    once the pass is complete and handed back as ``Known.checkpoint`` next time."""

    mark: str


@dataclass(frozen=True)
class Known:
    """What earlier passes recorded, so a snapshot source can skip what did not change.
    Empty (the default) on a first pass or a reconcile: everything is read."""

    fingerprints: Mapping[str, str] = field(default_factory=dict)  # note id -> fingerprint
    checkpoint: str | None = None  # the mark of the last complete pass


SnapshotItem = Union[Note, Skipped, Unchanged, Checkpoint]


@dataclass(frozen=True)
class BookPath:
    path: str  # "父 / 子", for display
    ids: tuple[str, ...]  # root first, the notebook itself last
    titles: tuple[str, ...] = ()  # the same, by title: privacy rules match these


def notebook_paths(notebooks: dict[str, Notebook]) -> dict[str, BookPath]:
    """Each notebook's path from its root. A parent that is missing or part of a
    cycle ends the path where it is."""
    paths: dict[str, BookPath] = {}
    for book_id in notebooks:
        chain, seen, current = [], set(), notebooks.get(book_id)
        while current is not None and current.id not in seen:
            seen.add(current.id)
            chain.append(current)
            current = notebooks.get(current.parent_id) if current.parent_id else None
        chain.reverse()
        paths[book_id] = BookPath(NOTEBOOK_SEP.join(b.title for b in chain), tuple(b.id for b in chain),
                                  tuple(b.title for b in chain))
    return paths


class NoteSource(Protocol):
    name: str  # stable id of the source, e.g. "files:/home/me/notes"

    def __len__(self) -> int:
        """How many notes (or note files) a snapshot will yield now, for progress."""
        ...

    def notes(self, known: Known = Known()) -> Iterator[SnapshotItem]:
        """The current snapshot, looked at anew on each call."""
        ...


@dataclass
class Page:
    """Notes changed after a USN, in USN order (metadata only), the USN up to which
    every change has now been seen, and the notes whose fields could not be used."""

    notes: list[Note]
    covered: int
    skipped: list[Skipped] = field(default_factory=list)


class AccountSession(Protocol):
    account: str  # state key: the login email, or the user id
    user_id: str

    def server_usn(self) -> int: ...
    def notebooks_since(self, usn: int) -> list[tuple[Notebook, int]]: ...
    def notes_since(self, usn: int) -> Iterator[Page]: ...
    def contents(self, note_ids: list[str]) -> dict[str, "str | None | Exception"]: ...
    def notes_by_id(self, note_ids: list[str]) -> list[Note | Skipped]: ...
    def all_notebooks(self) -> list[Notebook]: ...
    def all_notes(self) -> list[Note | Skipped]: ...
    def close(self) -> None: ...


class IncrementalSource(Protocol):
    name: str

    def accounts(self) -> list[str]: ...
    def session(self, account: str) -> AccountSession: ...
