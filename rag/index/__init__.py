"""The index: notes in, searchable chunks out.

A note is cleaned to Markdown (``clean``), cut at its headings (``chunk``), embedded
(``embed``: dense vectors, backends by config name) and tokenized for BM25 (``lexical``:
jieba, code-friendly), and kept in Qdrant (``store``: embedded Edge or a server).
``note_index.NoteIndex`` ties those together for one index; ``retrieve`` is hybrid search
over it for one user, ``excerpt`` the passage of a hit that matches a question.

Imports only the plumbing of ``rag/`` (config, errors, model, ...): never the answer or
the memory.
"""
