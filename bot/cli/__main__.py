"""``leanote-rag``: what the installed command runs.

The command line is ``bot.cli``; the parts it and ``serve`` use are put together
in ``bot.root``.
"""

from __future__ import annotations

import sys

from bot.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
