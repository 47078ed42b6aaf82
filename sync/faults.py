"""What stops every account at once, and the daemon's guards against it.

- ``ServeLock``: one ``serve`` per state directory, an OS file lock (``flock``) on
  ``<state_dir>/serve.lock`` taken before anything is opened or bound; a second one is
  refused, naming the first one's pid.
- The disk: the index (Qdrant Edge) writes through memory-mapped files, and a write into
  a mapped page the file system has no room for kills the process with SIGBUS. So nothing
  is written unless ``MIN_FREE`` bytes are free where the state lives: ``serve`` refuses
  to start, a pass does not start (or stops at its next batch), and says so (``DiskFull``).
- ``state_fault``: an error raised while writing the state that is no account's fault: the
  disk full (SQLite's ``SQLITE_FULL``, ``ENOSPC``) or the state file damaged
  (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``), as a ``DiskFull`` or ``BrokenState`` that says
  which file and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sqlite3
from pathlib import Path

from rag.state_dir import prepare_state_dir
from rag.errors import BrokenState, DiskFull, UserError

# Room the index may need between two checks: a Qdrant WAL segment is 32 MiB, mapped whole.
MIN_FREE = 100 * 1024 * 1024

LOCK_FILE = "serve.lock"


class ServeLock:
    """``serve``'s claim on its state directory, held until ``release()`` (or the process's end)."""

    def __init__(self, state_dir: Path):
        self.path = prepare_state_dir(state_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> "ServeLock":
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise disk_full(self.path.parent) from None
            raise UserError(f"cannot create {self.path}: {err.strerror or err}. Make {self.path.parent} "
                            f"writable by this user") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UserError(f"leanote-rag serve already runs for {self.path.parent} (pid {owner}): stop it first "
                            f"(systemctl stop leanote-rag), or give this one another state_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the lock goes with the descriptor
            self._fd = None


UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a number this large


def memory_limit(cgroup_file: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory this process may use at most, in bytes: the smallest limit of its control group
    and the groups above it (systemd's ``MemoryMax=``: cgroup v2's ``memory.max``, v1's
    ``memory.limit_in_bytes``); None when there is none or it cannot be read."""
    try:
        lines = cgroup_file.read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: "0::/system.slice/leanote-rag.service"
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):  # v1
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        folder = base / path.strip("/")
        while True:
            try:
                value = (folder / name).read_text().strip()
                if value.isdigit() and int(value) < UNLIMITED:
                    found.append(int(value))
            except OSError:
                pass
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(found) if found else None


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f} MB"


def disk_full(folder: Path, free: int | None = None) -> DiskFull:
    free = free_bytes(folder) if free is None else free
    return DiskFull(
        f"the disk holding {folder} is full ({_mb(free)} free, at least {_mb(MIN_FREE)} needed): nothing is "
        f"written until there is room. Free some space on that file system (or move state_dir to a larger one); "
        f"syncing resumes by itself")


def check_disk(folder: Path) -> None:
    """``DiskFull`` when less than ``MIN_FREE`` is free on the file system of ``folder``."""
    try:
        free = free_bytes(folder)
    except OSError:  # not there yet, or not ours to look at: the writes will say
        return
    if free < MIN_FREE:
        raise disk_full(folder, free)


def broken_state(path: Path, why: str) -> BrokenState:
    return BrokenState(
        f"{path} is damaged ({why}). Run `leanote-rag index --rebuild` (it sets the file aside and reads every "
        f"note again from the source; stop `serve` first), or restore the file from a backup")


def state_fault(err: BaseException, state_path: Path) -> DiskFull | BrokenState | None:
    """The error as what it means for every account (see the module's docstring), or None."""
    if isinstance(err, (DiskFull, BrokenState)):
        return err
    if isinstance(err, sqlite3.DatabaseError):
        name = getattr(err, "sqlite_errorname", "") or ""
        if name == "SQLITE_FULL" or "disk is full" in str(err):
            return disk_full(state_path.parent)
        if name in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or name.startswith("SQLITE_CORRUPT_") or \
                "malformed" in str(err) or "not a database" in str(err):
            return broken_state(state_path, str(err))
        return None
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return disk_full(Path(err.filename).parent if err.filename else state_path.parent)
    return None


@contextlib.contextmanager
def reading_state(state):
    """Reading ``state`` (a ``sync.state.State``): a damaged file is a ``BrokenState`` naming it."""
    try:
        yield state
    except sqlite3.DatabaseError as err:
        fault = state_fault(err, state.path)
        if fault is None:
            raise
        raise fault from None
