"""The scopes of the written questions (``memory.questions_scope``), one place for each step
that differs between them: what a job carries (``job``) and which call writes it (``write``).

- ``title``: the note's title alone (``rag.index.asked.title_digest``, ``TITLE_SYSTEM``);
- ``note``: its title, outline and first lines (``rag.index.asked.digest``);
- ``sections``: its heading sections, each question tied to its section's chunks
  (``rag.index.asked_sections``).

The indexer queues a job with ``job`` (``rag.memory.writes``); the memory's worker builds it
again from the index when the job was queued without one or in another scope, and runs
``write`` (``sync.memory_jobs``); the bench does both the same way.
"""

from __future__ import annotations

from rag.index import asked, asked_sections

SCOPES = ("title", "note", "sections")


def job(scope: str, title: str, chunks) -> dict:
    """A job's payload: the scope, the title, what the model reads (``digest``) and, in the
    sections scope, each shown section's chunks (``sections``)."""
    if scope == "sections":
        shown = asked_sections.sections(title, chunks)
        return {"scope": scope, "title": title, "digest": asked_sections.digest(title, shown),
                "sections": [list(s.chunks) for s in shown]}
    if scope not in SCOPES:
        raise ValueError(f"memory.questions_scope: {scope!r} is not one of {', '.join(SCOPES)}")
    digest = asked.title_digest(title) if scope == "title" else asked.digest(title, chunks)
    return {"scope": scope, "title": title, "digest": digest}


async def write(stream: asked.Stream, payload: dict, *, timeout: float | None = None) -> asked.Written:
    """The questions of one job (``job``'s payload): its scope's one call, checked."""
    if payload["scope"] == "sections":
        return await asked_sections.write(stream, payload["digest"], payload["title"], payload["sections"],
                                          timeout=timeout)
    system = asked.TITLE_SYSTEM if payload["scope"] == "title" else asked.SYSTEM
    return await asked.write(stream, payload["digest"], payload["title"], timeout=timeout, system=system)
