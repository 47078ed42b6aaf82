"""The doors a person talks through, and the house they share.

- ``telegram/``, ``discord/``: the chat bots (``chat/``: what both share; ``render``: how an answer
  looks in each door);
- ``api/``: the daemon's HTTP API and its explorer page;
- ``cli/``: the command line, ``leanote-rag``;
- ``usecases/``: what a person can do, each written once: every door parses its input, calls one
  and renders what comes back;
- ``root``: the composition root, which builds every store and model once;
- ``serve``: ``leanote-rag serve``, one process for the sync's schedule and every door
  (``notify``: systemd's notify protocol; ``digests``: each person's digest job on the schedule).

``bot/`` stands on ``sync/`` and ``rag/``; neither imports it.
"""
