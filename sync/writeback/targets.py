"""Where captures are written: the capture target, chosen from the config (``capture.target``).

- ``leanote`` (``sync.writeback.leanote.LeanoteTarget``): a note in the person's own Leanote
  account, through its API (the logins of ``capture.accounts``, or of a ``leanote_api`` source);
- ``folder`` (``sync.writeback.folder.FolderTarget``): a Markdown file in a ``files`` source's
  folder, the inbox notebook a sub-folder;
- none: a MongoDB or a backup is read-only and there is no account to write with; ``why_none``
  says so, the bots offer no capture and ``doctor`` names it.

``auto`` (the default) is Leanote when there is an account to write with, else a files source's
folder, else none (``kind_of``; ``sync.writeback.capture.open_target`` builds it).

``sync.writeback.capture.Capture`` keeps the captures in the outbox and asks its target to write
each one, exactly once. A target says how a write went by what it raises: nothing (written:
where, as the note's id), ``Refused`` (this capture cannot be written: parked, with why, unless
its reason is ``conflict``), ``NotYet`` (a send may still land: not sent again before then),
``LeanoteRagError`` or ``OSError`` (tried again with backoff; a ``LoginFailed`` is the login's
trouble, logged as such).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from rag.config import Settings
from rag.errors import Unavailable

if TYPE_CHECKING:
    from sync.writeback.outbox import Item


class NotYet(Exception):
    """An unanswered write may still land: not sent again before ``when``."""

    def __init__(self, when: float):
        super().__init__(when)
        self.when = when


class LoginFailed(Unavailable):
    """A capture waits for a login (its account's, or one that may be its account's): the
    login's own trouble, logged as such, not as the user's writes failing."""


class Target(Protocol):
    kind: str  # "leanote" | "folder"
    settings: Settings  # read at each use (a reload hands the new ones)
    where: tuple[str, str]  # what the person is told it writes into: (Chinese, English)

    def describe(self) -> str:
        """Where captures go, for ``doctor`` and the log."""

    def unavailable(self) -> str | None:
        """Why nothing can be captured now (no account to write with, the folder gone), or None."""

    def refusal(self, user_id: str) -> str | None:
        """Why this Leanote user's captures cannot be written here (known before any write), or None."""

    def user_of(self, email: str) -> str | None:
        """The Leanote user an account's email is, once known (``users:`` may name people by it)."""

    def who(self, user_id: str) -> str:
        """A Leanote user as the log names it."""

    def write(self, item: "Item") -> str:
        """Write one capture (a note, a saved answer, an append, a line to remember) exactly
        once; the id of the note it is in (a folder: its path in the folder)."""

    def check(self, item: "Item") -> None:
        """A written capture one of whose sends went unanswered, looked for once more after
        ``grace``: a late copy is put away (``Outbox.checked`` when done)."""

    def grace(self) -> float:
        """How long after an unanswered write it may still land (0: a write is known at once)."""

    def link(self, note_id: str) -> tuple[str, str]:
        """Where a written capture opens (a URL) and how a chat names it."""

    def resume(self) -> None:
        """Calls may go out again (the writer runs again after a stop)."""

    def stop(self) -> None:
        """Cut the calls in flight (a stop): what they carried stays in the outbox."""

    def close(self) -> None: ...


def kind_of(settings: Settings) -> str | None:
    """The target ``capture.target`` names: "leanote", "folder", or None (nowhere to write)."""
    chosen = settings.capture.target
    if chosen != "auto":
        return chosen
    if settings.capture.accounts or settings.source.kind == "leanote_api":
        return "leanote"
    if settings.source.kind == "files":
        return "folder"
    return None


def why_none(settings: Settings) -> str:
    """Why a source has nowhere to write captures, and how to give it one."""
    what = {"mongodump": "mongodump 备份 / a mongodump backup", "mongodb": "Leanote 的 MongoDB / Leanote's MongoDB"}
    source = what.get(settings.source.kind, settings.source.kind)
    zh, _, en = source.partition(" / ")
    return (f"这里的笔记来自{zh}，它是只读的，所以不能记笔记：请主人在配置里 capture.accounts 加上 Leanote 账号。 / "
            f"The notes here come from {en or zh}, which is read-only, so nothing can be captured: the owner can "
            f"add a Leanote account under capture.accounts in the config to write notes into Leanote.")


class Failures:
    """What fails now (a login, a user's writes) -> the kind of error, to log each trouble once
    when it starts and once when it ends. Needs ``_failing`` (a dict) and ``_lock``."""

    _failing: dict[str, str]
    _lock: threading.Lock

    def _starts_failing(self, what: str, err: BaseException | str) -> bool:
        """Note that ``what`` fails; True when this is news (it worked, or failed otherwise)."""
        kind = type(err).__name__ if isinstance(err, BaseException) else str(err)
        with self._lock:
            was, self._failing[what] = self._failing.get(what), kind
        return was != kind

    def _works_again(self, what: str) -> bool:
        with self._lock:
            return self._failing.pop(what, None) is not None
