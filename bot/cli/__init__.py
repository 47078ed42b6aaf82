"""``leanote-rag``'s command line: one group, its commands in five modules.

- ``app``: what every command gets (``App``), logging, and how the program exits;
- ``notes``: ``search``, ``ask``, ``eval``, ``feedback``, ``note``;
- ``memory``: ``entities``, ``memory``, ``related``;
- ``people``: ``gaps``, ``digest``;
- ``service``: ``index``, ``status``, ``serve``, ``doctor``;
- ``models``: ``models list``, ``models fetch`` (the models fetched once into the state folder).
"""

from __future__ import annotations

from bot.cli import memory, models, notes, people, service
from bot.cli.app import cli, main, with_verbose

for _command in (notes.search, notes.ask, notes.eval_command, notes.feedback, notes.note, memory.entities, memory.memory,
                 memory.related, people.gaps, people.digest, service.index, service.status, service.serve,
                 service.doctor, models.models):
    cli.add_command(with_verbose(_command))

__all__ = ["cli", "main"]
