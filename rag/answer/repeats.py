"""An answer that goes round in circles: stopped while it streams, and discouraged before.

A small model on a CPU sometimes writes the same block again and again (the real 1.5B wrote one
four-line block 8 times over 87 s, every sentence of it standing on the note). The answer check
shows a unit only once (``rag.answer.support``: a unit that says what an earlier one said is a
"repeat"); ``looping`` says when the reply has gone round long enough to stop it: ``RUN`` units
in a row, each said before (blank lines and filler between them aside). The service then closes
the LLM's request (Ollama stops writing) and ends the answer with what was checked so far.

``options`` are Ollama's sampling options that hold a repeat back (``ollama.repeat_penalty``,
``ollama.repeat_last_n``, ``ollama.presence_penalty``), sent with answers only: structured
replies (the query expansion, the memory's extraction) repeat braces and quotes by design.
"""

from __future__ import annotations

from rag.answer.support import Verdict
from rag.config import OllamaConfig

RUN = 3  # units in a row that say what the reply said before: the reply is going round


def looping(verdicts: list[Verdict]) -> int:
    """How many units in a row at the reply's end say again what it said before, when that
    is ``RUN`` or more (0 otherwise): blank lines and filler between them do not break the run."""
    run = 0
    for v in reversed(verdicts):
        if v.kind == "repeat":
            run += 1
        elif v.kind not in ("blank", "filler"):
            break
    return run if run >= RUN else 0


def options(cfg: OllamaConfig) -> dict:
    """The sampling options an answer is asked with, to hold repeats back."""
    return {"repeat_penalty": cfg.repeat_penalty, "repeat_last_n": cfg.repeat_last_n,
            "presence_penalty": cfg.presence_penalty}
