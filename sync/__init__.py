"""Notes in and out: keeping the index and the memory a mirror of Leanote, and writing back.

``sources/`` reads notes (Leanote's API, its MongoDB, a mongodump backup, a folder of files);
``state`` remembers what is in the index and why; ``incremental`` syncs one account from its
USN; ``indexer`` applies notes to the index; ``derived`` keeps what is derived from the notes
(the memory, related notes, the answers kept) in line with it; ``service`` runs one pass over
every account, each failing alone (``faults``: what stops them all; ``progress``: how far a pass
got); ``schedule`` decides when passes run in the daemon; ``watch`` follows a folder or backup
file; ``memory_jobs`` is the memory's LLM tier; ``writeback/`` writes captures into Leanote,
exactly once, through a durable outbox.

``sync/`` imports ``rag/`` and never ``bot/``.
"""
