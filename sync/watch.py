"""``serve``'s file watcher: a note file added, changed or deleted (``files`` source),
or a new backup (``mongodump`` pointing at a folder or an archive), starts a sync
within seconds instead of at the next ``sync.interval``.

Changes come from the operating system (``watchfiles``: inotify on Linux). Hidden
files and folders and files that are not notes are ignored, as the source ignores
them; a folder created, moved in, deleted or moved away counts (its notes come or go).

Changes are grouped: the sync starts once they have been quiet for
``sync.watch_debounce`` (a burst, e.g. a sync tool writing many files, is one pass),
at the latest ten times that after the first one. Then the watcher makes sure that a
pass which *started after* the last change has finished: it asks the schedule for a pass
(``Schedule.trigger(debounce=False)``: the watcher groups changes itself), asks again if the
pass does not come, and looks at the run history in the state. So a change made while a pass was running,
or just after a trigger, is never left for the next interval. While the sync is paused (the disk full, the
state file damaged: ``Schedule.paused()``) it asks for nothing and waits for the pass that ends the pause: a
file changing all the time makes no pass of its own then. The interval passes still
run: they catch anything the operating system does not report (a network share
changed by another machine).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Callable

from watchfiles import Change, awatch

from rag.errors import UserError

from sync.sources.files import SUFFIXES
from sync.sources.mongodump import BACKUP
from sync.schedule import Schedule

log = logging.getLogger(__name__)

RETRY = 0.5  # seconds between tries while the daemon cannot take a trigger (still starting)
RECHECK = 2.0  # seconds to wait for a pass asked for before looking again
MAX_DELAY = 10  # changes that never quiet down still sync after this many debounce periods

Filter = Callable[[Change, str], bool]


def _hidden(parts: tuple[str, ...]) -> bool:
    return any(part.startswith(".") for part in parts)


def _below(root: Path, path: str) -> tuple[str, ...] | None:
    """The parts of path below root (as given or resolved), or None when outside."""
    for base in (root, root.resolve()):
        try:
            return Path(path).relative_to(base).parts
        except ValueError:
            continue
    return None


def files_filter(root: Path) -> Filter:
    """Changes to note files under root, and folders that appear or go (their notes with them)."""
    folders: set[str] = set()

    def remember(top: str) -> None:
        for folder, dirs, _ in os.walk(top):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            folders.add(folder)

    remember(str(root))

    def relevant(change: Change, path: str) -> bool:
        parts = _below(root, path)
        if not parts or _hidden(parts):
            return False
        if Path(path).suffix.lower() in SUFFIXES:
            return True
        if change == Change.added and os.path.isdir(path):  # created or moved in, maybe with notes
            remember(path)
            return True
        if change == Change.deleted and path in folders:  # removed or moved away, with its notes
            gone = {f for f in folders if f == path or f.startswith(path + os.sep)}
            folders.difference_update(gone)
            return True
        return False

    return relevant


def backups_filter(folder: Path, only: str | None = None) -> Filter:
    """A backup archive (``only`` that name, else any backup_leanote_*.tar.gz) or a .bson
    file of an extracted dump under folder."""

    def relevant(change: Change, path: str) -> bool:
        parts = _below(folder, path)
        if not parts or _hidden(parts):
            return False
        name = parts[-1]
        if only is not None:
            return name == only
        return bool(BACKUP.match(name)) or name.lower().endswith(".bson")

    return relevant


def target(settings) -> tuple[Path, bool, Filter] | None:
    """(what to watch, recursively?, which changes count), or None: nothing to watch."""
    source = settings.source
    if source.incremental or source.path is None:
        return None
    path = Path(source.path)
    if source.kind == "files":
        return path, True, files_filter(path)
    if source.kind == "mongodump":
        if path.is_file():
            return path.parent, False, backups_filter(path.parent, only=path.name)
        return path, True, backups_filter(path)
    return None


class _Pending:
    """Changes not yet known to be synced: when the first and last came."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.first = self.last = 0.0  # monotonic
        self.wall = 0.0  # time.time() of the last one, to compare with the runs' start

    def changed(self) -> None:
        now = time.monotonic()
        if not self.event.is_set():
            self.first = now
        self.last = now
        self.wall = time.time()
        self.event.set()


async def watch(host) -> None:
    """A ``serve`` service: sync soon after the source's files change (``sync.watch``).
    ``host``: the daemon, whose ``schedule`` runs the passes."""
    settings = host.settings
    if not settings.sync.watch:
        return
    what = await asyncio.to_thread(target, settings)  # it walks the folder once
    if what is None:
        return
    path, recursive, relevant = what
    if not await asyncio.to_thread(path.is_dir):
        raise UserError(f"cannot watch {path}: it is not a folder (set sync.watch: false to turn the watcher off)")
    pending = _Pending()
    schedule = host.schedule  # (the passes, and a reading connection to the state for the run history)
    tasks = [
        asyncio.create_task(_listen(schedule, path, recursive, relevant, pending)),
        asyncio.create_task(_sync_changes(schedule, pending, settings.sync.watch_debounce)),
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()  # an error of either is the service's


watch.label = "file watcher"


async def _listen(schedule: Schedule, path: Path, recursive: bool, relevant: Filter, pending: _Pending) -> None:
    """Note every relevant change until the daemon stops."""
    log.info("watching %s for changes", path)
    # awatch sets its stop event when it is cancelled: its own, or the watcher's end would stop the daemon
    stop = asyncio.Event()
    relay = asyncio.create_task(_relay(schedule.stopping, stop))
    try:
        async for changes in awatch(path, watch_filter=relevant, recursive=recursive, stop_event=stop,
                                    step=50, ignore_permission_denied=True):
            log.debug("changed: %s", sorted(p for _, p in changes)[:5])
            pending.changed()
    except OSError as err:  # the folder went away, the inotify watch limit
        hint = ("raise fs.inotify.max_user_watches, or " if "limit" in str(err).lower() else "")
        raise UserError(f"cannot watch {path}: {err}; {hint}set sync.watch: false "
                        f"(the interval sync goes on either way)") from None
    finally:
        relay.cancel()


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


async def _sync_changes(schedule: Schedule, pending: _Pending, debounce: float) -> None:
    """After each quiet burst of changes, see a pass through that started after them."""
    while True:
        await pending.event.wait()
        while True:
            now = time.monotonic()
            due = min(pending.last + debounce, pending.first + MAX_DELAY * debounce)
            if now >= due:
                break
            await asyncio.sleep(due - now)
        pending.event.clear()
        await synced_after(schedule, pending.wall)


async def synced_after(schedule: Schedule, since: float) -> None:
    """Return once a pass that started after ``since`` (time.time()) has finished. Until one
    has started, ask the schedule for it: again while its trigger is debounced, and again when
    one asked for has not come (the scheduler may drop a run asked for while the previous one
    is winding up)."""
    while not schedule.stopping.is_set():
        if schedule.paused():  # the disk full, the state damaged: the pass after the pause is the one
            await schedule.wait_for_pass(schedule.passes)
            continue
        try:
            runs = await asyncio.to_thread(schedule.reading, lambda state: state.runs_since(since))
        except sqlite3.DatabaseError:  # the state cannot be read: a pass finds out what is wrong, and pauses
            passes = schedule.passes
            schedule.trigger(debounce=False)
            await schedule.wait_for_pass(passes)
            continue
        if runs is None:  # the daemon closes
            return
        if any(run["finished"] is not None for run in runs):
            return
        passes = schedule.passes
        if not runs and not schedule.trigger(debounce=False):
            await asyncio.sleep(RETRY)
            continue
        try:  # for the pass asked for, or the one under way that started after the change
            await asyncio.wait_for(schedule.wait_for_pass(passes), timeout=RECHECK)
        except asyncio.TimeoutError:
            pass
