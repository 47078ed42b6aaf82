"""Where notes come from. Each source yields every current note (a full snapshot);
the indexer compares it with the state and writes only what changed.

A source yields ``Note`` objects (trashed and deleted ones too, flagged, so the
indexer can take them out) and ``Skipped`` records for notes it could not read.
It raises ``UserError``/``Unavailable`` when the source as a whole cannot be read:
then nothing is deleted from the index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Union

from rag.config import Settings
from rag.errors import ConfigError
from rag.model import NOTEBOOK_SEP, Note, Notebook


@dataclass(frozen=True)
class Skipped:
    origin: str
    reason: str


def notebook_paths(notebooks: dict[str, Notebook]) -> dict[str, str]:
    """Each notebook's path from its root ("父 / 子"). A parent that is missing or
    part of a cycle ends the path where it is."""
    paths: dict[str, str] = {}
    for book_id in notebooks:
        titles, seen, current = [], set(), notebooks.get(book_id)
        while current is not None and current.id not in seen:
            seen.add(current.id)
            titles.append(current.title)
            current = notebooks.get(current.parent_id) if current.parent_id else None
        paths[book_id] = NOTEBOOK_SEP.join(reversed(titles))
    return paths


class NoteSource(Protocol):
    name: str  # stable id of the source, e.g. "files:/home/me/notes"

    def __len__(self) -> int:
        """How many notes (or note files) a snapshot will yield, for progress."""
        ...

    def notes(self) -> Iterator[Union[Note, Skipped]]: ...


def _files(settings: Settings) -> NoteSource:
    from .files import FilesSource

    return FilesSource(settings.source.path, settings.source.user_id)


def _mongodump(settings: Settings) -> NoteSource:
    from .mongodump import MongodumpSource

    return MongodumpSource(settings.source.path, settings.state_dir)


SOURCES: dict[str, Callable[[Settings], NoteSource]] = {
    "files": _files,
    "mongodump": _mongodump,
}


def open_source(settings: Settings) -> NoteSource:
    kind = settings.source.kind
    try:
        factory = SOURCES[kind]
    except KeyError:
        raise ConfigError(
            f"source.kind {kind!r} is not available yet in this version; use one of {', '.join(SOURCES)}"
        ) from None
    return factory(settings)
