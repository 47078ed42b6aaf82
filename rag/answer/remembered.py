"""What the memory of the notes adds to an answer (``rag.memory.store``): the entities a question
names rank the chunks that mention them in the fusion, the active facts about them join the
evidence as lines cited to their source notes, and "我写过哪些关于 X 的笔记" / "which notes did I
write about X" is answered from the memory without the LLM: the notes mentioning X, newest
first. Nothing of a note the index no longer holds is evidence nor listed. Without a memory
(off, or empty) an answer is as without these.
"""

from __future__ import annotations

import re

from rag.language import chinese
from rag.answer.types import Answer, Citation, Trace
from rag.config import Settings
from rag.index.note_index import NoteIndex
from rag.index.retrieve import entity_ranking, named_entities
from rag.memory.entities import norm
from rag.memory.store import MemoryStore

MAX_LISTED = 20
# "Which notes did I write about X": the forms answered by listing the notes that mention X.
_ABOUT = [re.compile(p, re.I) for p in (
    r"我(?:都|曾经|以前|之前)?(?:写|记)过(?:哪些|什么|几篇|多少篇?)?(?:关于|有关)\s*(?P<x>.+?)\s*(?:的|相关的)?(?:笔记|记录|文章)",
    r"我(?:都|曾经|以前|之前)?(?:写|记)过(?:哪些|几篇|多少篇?)\s*(?P<x>.+?)\s*(?:的|相关的)(?:笔记|记录|文章)",
    r"^(?:关于|有关)\s*(?P<x>.+?)\s*(?:的|相关的)?(?:笔记|记录)有(?:哪些|几篇|多少)",
    r"^哪些笔记(?:提到|提及|写到|写了|写过|关于|讲)(?:了|过)?\s*(?P<x>.+?)\s*[？?。!！]*$",
    r"^(?:which|what) notes (?:did|have) i (?:write|written|take|taken|make|made|keep|kept)\s+"
    r"(?:about|on|regarding|mentioning)\s+(?P<x>.+?)\s*[?.!]*$",
    r"^(?:list|show|find)(?: me)? (?:all )?(?:of )?(?:my |the )?notes (?:about|on|mentioning|regarding)\s+(?P<x>.+?)\s*[?.!]*$",
    r"^(?:which|what) (?:of my )?notes (?:are about|mention|talk about|cover)\s+(?P<x>.+?)\s*[?.!]*$",
)]
_QUOTES = "\"'“”‘’「」《》`"


def notes_about(question: str) -> str | None:
    """X, when the question asks which notes are about X; else None."""
    for pattern in _ABOUT:
        m = pattern.search(question.strip())
        if m:
            x = m.group("x").strip().strip(_QUOTES).strip()
            if x:
                return x
    return None


def remembered(memory: MemoryStore | None, index: NoteIndex, settings: Settings, question: str, user_id: str, k: int,
               trace: Trace) -> tuple[list, list[dict]]:
    """The entities ranking for the fusion and the active facts about the entities the
    question names (both empty without a memory); the entities go into the trace."""
    if memory is None:
        return [], []
    named = named_entities(memory, user_id, question)
    trace.entities = [f"{e['name']} ({', '.join(e['kinds'])}; {e['notes']} notes)" for e in named]
    limit = max(settings.retrieval.candidates, k)
    ranking = entity_ranking(memory, user_id, named, limit)
    facts = memory.facts_named(user_id, question, [e["norm"] for e in named]) if named else []
    return ranking, indexed(index, user_id, facts)

def indexed(index: NoteIndex | None, user_id: str, rows: list[dict]) -> list[dict]:
    """The memory's rows (facts, notes) whose note the index holds: a note that left it
    (trashed, made private) and whose memory the sync has not removed yet (a failed
    write, a crash: its next pass does) is never evidence nor listed."""
    if not rows or index is None:
        return rows
    held = index.store.holding(user_id, [r["note_id"] for r in rows])
    return [r for r in rows if r["note_id"] in held]

def listing(memory: MemoryStore, index: NoteIndex, question: str, about: str, user_id: str, trace: Trace) -> Answer | None:
    """The notes mentioning ``about``, newest first, as the answer (no LLM); None when
    the memory knows no entity by that name (the question is answered as any other)."""
    names = [about] if memory.notes_mentioning(user_id, [about]) else \
        [e["norm"] for e in named_entities(memory, user_id, about, common=True)]
    notes = indexed(index, user_id, memory.notes_mentioning(user_id, names) if names else [])
    if not notes:
        return None
    named = memory.named_in(user_id, " ".join(names))
    trace.entities = [f"{e['name']} ({', '.join(e['kinds'])}; {e['notes']} notes)" for e in named
                      if e["norm"] in {norm(n) for n in names}]
    shown = notes[:MAX_LISTED]
    citations = [Citation(i, n["note_id"], n["title"], n["notebook"], "", n["url"], n["snippet"], 0.0)
                 for i, n in enumerate(shown, start=1)]
    zh = chinese(question)
    head = (f"提到「{about}」的笔记有 {len(notes)} 篇（按更新时间，新的在前）：" if zh
            else f"{len(notes)} notes mention “{about}” (newest first):")
    lines = [head]
    for c, n in zip(citations, shown):
        when = (n["updated_at"] or "")[:10]
        where = " · ".join(p for p in (c.notebook, when) if p)
        lines.append(f"{c.n}. [{c.title or c.note_id}]({c.url})" + (f" · {where}" if where else "") + f" [{c.n}]")
    if len(notes) > len(shown):
        lines.append(f"…另有 {len(notes) - len(shown)} 篇" if zh else f"… and {len(notes) - len(shown)} more")
    trace.decision = (f"listed the {len(notes)} notes that mention {about!r} from the memory of the notes, "
                      f"newest first (no search, no LLM)")
    trace.outcome = "listing"
    return Answer(question, "\n".join(lines), used_llm=False, grounded=True, citations=citations)
