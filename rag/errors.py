"""One exception tree, split by who can act on it.

- ``UserError``: the user must change something (config, arguments, a rebuild);
  the CLI prints the message without a traceback and exits 2. ``TooLarge``: a
  question or request over ``limits`` (the API's 413).
- ``Unavailable``: a service or resource is down or busy; retrying later may work.
  The CLI exits 1.
- ``AuthFailed``: a source refused the credentials; that account's sync stops
  until they are fixed. The CLI exits 1.
- ``NoteError``: one note could not be processed; an index run skips it and
  reports it in the summary.

Third-party errors are wrapped once, at the adapter that called the library.
"""


class LeanoteRagError(Exception):
    """Base of every error this package raises on purpose."""


class UserError(LeanoteRagError):
    """Bad configuration, arguments or state that the user must fix."""


class NotIndexed(UserError):
    """No index yet where the config says (before the first ``leanote-rag index``)."""


class TooLarge(UserError):
    """A request larger than the door takes (``limits``): refused before any work
    (the API answers 413, the CLI exits 2)."""


class ConfigError(UserError):
    """The configuration file is missing, unreadable or invalid."""


class IndexMismatch(UserError):
    """The index was built with another embedder or schema than the config asks for."""


class Unavailable(LeanoteRagError):
    """A service or resource cannot be used right now (down, locked, timing out)."""


class BrokenState(UserError):
    """A file we keep (the sync state, the index) exists but cannot be read."""


class ModelMissing(UserError):
    """A configured model is not there (not pulled, not downloaded)."""


class StoreLocked(Unavailable):
    """Another process holds the embedded index open."""


class AuthFailed(LeanoteRagError):
    """A source refused our credentials: retrying will not help until they are fixed."""


class NoteError(LeanoteRagError):
    """A single note could not be cleaned, chunked or embedded."""


class Refused(LeanoteRagError):
    """A server understood a write and said no (Leanote's ``Ok: false`` with a reason:
    ``conflict``, ``fileIsTooLarge``, ``notebookIdNotExists``...)."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason


class DiskFull(Unavailable):
    """The file system of the state directory has (almost) no room left: nothing is written
    until there is; the message names the folder and how much is free."""
