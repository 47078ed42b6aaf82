"""``leanote-rag``'s command line: one group, its commands in four modules.

- ``app``: what every command gets (``App``), logging, and how the program exits;
- ``notes``: ``search``, ``ask``, ``eval``, ``feedback``, ``note``;
- ``memory``: ``entities``, ``memory``, ``related``;
- ``people``: ``gaps``, ``digest``;
- ``service``: ``index``, ``status``, ``serve``, ``doctor``.
"""

from __future__ import annotations

from bot.cli import memory, notes, people, service
from bot.cli.app import cli, main, with_verbose

for _command in (notes.search, notes.ask, notes.eval_command, notes.feedback, notes.note, memory.entities, memory.memory,
                 memory.related, people.gaps, people.digest, service.index, service.status, service.serve,
                 service.doctor):
    cli.add_command(with_verbose(_command))

__all__ = ["cli", "main"]
