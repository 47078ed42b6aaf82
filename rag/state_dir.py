"""The state directory, where everything the program keeps lives (the sync state, the index,
the memory, the outbox, the answers sent): private to this user, and never written by root
in a folder another user (the service's) owns."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from rag.errors import UserError

log = logging.getLogger(__name__)


def private_files() -> None:
    """From now on this process creates its files 0600 and its folders 0700, whatever umask
    it was started with (the systemd units set ``UMask=0077``; a shell's is usually 022):
    the state holds the notes' text. Bits the umask already had stay."""
    os.umask(os.umask(0o077) | 0o077)  # never looser in between, for a thread creating a file meanwhile


def prepare_state_dir(path: Path) -> Path:
    """The state directory, created private to this user (0700) if missing, and made
    private if other users could open it (a folder made by hand, with umask 022), with
    what it holds; a clear error when it cannot be created or written."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"cannot create the state directory {path}: {err.strerror or err}. Create it and make it writable "
            f"by this user (mkdir -p {path}; chown \"$USER\" {path}), or set state_dir in the config"
        ) from None
    not_as_root(path)
    make_private(path)
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(
            f"cannot write the state directory {path}: permission denied. Make it writable by this user "
            f"(sudo chown -R \"$USER\" {path}), or set state_dir in the config"
        )
    return path


def make_private(path: Path, say: bool = True) -> int | None:
    """A state directory other users may open becomes 0700, and what is in it loses its
    group and other bits (said once, as a warning, unless ``say`` is off); one this user
    does not own is only named, with the fix. The mode it had when it was open, else None."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o077:
        return None
    try:
        os.chmod(path, 0o700)
    except OSError:
        if say:
            log.warning("the state directory %s is open to other users (mode %03o) and cannot be made private by "
                        "this user: chmod 700 %s (it holds your notes' text)", path, mode, path)
        return mode
    uid = os.geteuid()
    for folder, dirs, files in os.walk(path):  # symlinks are neither followed nor changed
        for name in dirs + files:
            item = Path(folder, name)
            try:
                st = item.lstat()
                if st.st_uid == uid and not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
                    os.chmod(item, stat.S_IMODE(st.st_mode) & ~0o077)
            except OSError:  # gone meanwhile, or not ours to change
                continue
    if say:
        log.warning("the state directory %s was open to other users (mode %03o): made it private (0700), with the "
                    "files in it; it holds your notes' text", path, mode)
    return mode


def not_as_root(path: Path) -> None:
    """Root must not work in a state directory another user (the service's) owns: the files
    it would leave there are ones the service cannot write."""
    owner = path.stat().st_uid
    if os.geteuid() == 0 and owner != 0:
        raise UserError(
            f"the state directory {path} belongs to another user (uid {owner}), the service's: run this as that "
            f"user (sudo systemd-run --pty -p DynamicUser=yes -p User=leanote-rag -p StateDirectory=leanote-rag "
            f"... leanote-rag ...), or start the service (while it runs, the CLI goes through it)"
        )
