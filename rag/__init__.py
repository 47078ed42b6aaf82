"""leanote-rag core: notes in, hits and answers out. Imports neither bot/ nor sync/.

Three rooms, each importing only the ones after it:

- ``answer/``: a question in, a cited answer out (retrieval to the LLM's reply, read for citations);
- ``memory/``: what the notes are about: entities, facts, related notes;
- ``index/``: notes in, searchable chunks out, and hybrid search over them.

The modules here are the plumbing they share: ``config``, ``errors``, ``model`` (plain
data), ``redact``, ``sqlite``, ``limits``, ``llm`` and ``speed`` (the chat model and its
measured speed), ``capture`` (what a note saved from chat is), ``digest`` and ``digest_plan``
(what a person's digest holds, and when it comes); and ``eval``, which measures retrieval and
answers. The questions the notes could not answer are ``answer/gaps``. The ways in (the command line, the API, the bots) are not here.
"""
