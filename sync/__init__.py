"""Notes in from Leanote, and the daemon that hosts everything.

Keeping the index a mirror of Leanote: ``sources/`` reads notes (Leanote's API, its
MongoDB, a mongodump backup, a folder of files); ``state`` remembers what is in the index
and why; ``incremental`` syncs one account from its USN; ``indexer`` applies notes to the
index and the memory; ``service`` runs one pass over every account, each failing alone
(``faults``: what stops them all); ``memory_jobs`` is the memory's LLM tier; ``watch``
follows a folder or backup file.

``daemon/`` hosts it all in one process (``serve``, the API, the bots, capture) and holds
the composition root, ``daemon/main.py``. Nothing outside ``daemon/`` imports it or
``bot/``.
"""
