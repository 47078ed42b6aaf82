"""``leanote-rag``: what the installed command runs.

The command line is ``sync.daemon.cli``; the parts it and ``serve`` use are put together
in ``sync.daemon.root``.
"""

from __future__ import annotations

import sys

from sync.daemon.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
