"""Where notes come from. Two kinds of source:

- snapshot sources (``files``, ``mongodump``) yield every current note; the
  indexer compares them with the state and writes only what changed. They yield
  ``Note`` objects (trashed and deleted ones too, flagged, so the indexer can take
  them out) and ``Skipped`` records for notes they could not read.
- incremental sources (``leanote_api``, ``mongodb``) open one ``AccountSession`` per
  Leanote user, which answers "what changed after USN n" (``sync.incremental``).

Either raises ``UserError``/``Unavailable``/``AuthFailed`` when it cannot be read as
a whole: then nothing is deleted from the index.

A snapshot source is opened once and read again on every pass, so it looks at the
folder or backup anew each time, and reads only what changed: it is handed what the
last passes recorded (``Known``) and yields ``Unchanged`` for notes whose file (size
and mtime) or backup is the same, without reading them; a note's ``fingerprint`` is
what the indexer stores with a note read, ``Checkpoint`` what the indexer
keeps once the whole pass is through (a backup's path, size and mtime).
"""

from __future__ import annotations

from typing import Callable

from rag.config import Settings
from rag.errors import ConfigError
from sync.sources.base import (  # noqa: F401  (the types, where every user of a source finds them)
    Skipped, Unchanged, Checkpoint, Known, SnapshotItem, BookPath, notebook_paths, NoteSource, Page, AccountSession, IncrementalSource)


def _files(settings: Settings) -> NoteSource:
    from sync.sources.files import FilesSource

    return FilesSource(settings.source.path, settings.source.user_id)


def _mongodump(settings: Settings) -> NoteSource:
    from sync.sources.mongodump import MongodumpSource

    return MongodumpSource(settings.source.path, settings.state_dir)


def _leanote_api(settings: Settings) -> IncrementalSource:
    from sync.sources.leanote_api import ApiSource

    return ApiSource(settings)


def _mongodb(settings: Settings) -> IncrementalSource:
    from sync.sources.mongodb import MongoSource

    return MongoSource(settings)


SOURCES: dict[str, Callable[[Settings], NoteSource | IncrementalSource]] = {
    "files": _files,
    "mongodump": _mongodump,
    "leanote_api": _leanote_api,
    "mongodb": _mongodb,
}


def open_source(settings: Settings) -> NoteSource | IncrementalSource:
    kind = settings.source.kind
    try:
        factory = SOURCES[kind]
    except KeyError:
        raise ConfigError(f"source.kind {kind!r} is unknown; use one of {', '.join(SOURCES)}") from None
    return factory(settings)
