"""The memory's LLM tier: a note's summary, typed entities and relations, each relation
with the quote it rests on.

One call per note, constrained to a JSON schema (Ollama's ``format``): a small local
model writes valid JSON only when the schema holds it to it. A long note is cut into
sections at blank lines (``SECTION_CHARS`` each) and only the first ``MAX_CALLS`` are
read, so no note costs more than ``MAX_CALLS`` calls. The reply is checked anyway: a
reply that is not the schema's object fails the extraction (the job retries); a
relation whose quote is not in the note (whitespace aside) is dropped and counted, so
every fact kept can be traced to the words it came from. Typed entities are stored
the same way (``MemoryStore.store_llm``): at their places in the note (``name_spans``),
a name the note does not hold dropped and counted. What the calls cost (prompt
and output tokens, as Ollama reports them) comes back with the result.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from rag.errors import LeanoteRagError
from rag.speed import Usage

SCHEMA = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "entities": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "type": {"type": "string"}},
                "required": ["name", "type"],
            },
        },
        "relations": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "subject": {"type": "string"},
                    "predicate": {"type": "string"},
                    "object": {"type": "string"},
                    "quote": {"type": "string"},
                },
                "required": ["subject", "predicate", "object", "quote"],
            },
        },
    },
    "required": ["summary", "entities", "relations"],
}
SYSTEM = """You read one note from a person's own notes (technical notes, recipes, life; mostly Chinese, some English).
Reply with JSON only:
- "summary": one line saying what the note is about, in the note's language;
- "entities": the people, projects, tools, places, organisations and concepts it is about, each {"name", "type"} \
(type: person, project, tool, place, organization, concept, other), the name as the note writes it;
- "relations": facts the note states, each {"subject", "predicate", "object", "quote"}: the predicate a short verb \
phrase ("uses", "replaced", "depends on", "位于"), and "quote" the exact words of the note the fact comes from, \
copied character for character (a short span, one sentence at most).
Only what the note says; no facts from elsewhere."""
SECTION_CHARS = 6000  # about 2-4k tokens of Chinese: fits num_ctx 8192 with the reply
MAX_CALLS = 3
OUTPUT_TOKENS = 1024
MAX_ENTITIES = 40
MAX_RELATIONS = 40
MAX_NAME_SPANS = 5  # per entity: its first places in the note
_WORDISH = re.compile(r"[A-Za-z0-9_]")

Stream = Callable[..., AsyncIterator[str]]  # AnswerService._stream(prompt, usage, options, format=..., timeout=...)


class ExtractError(LeanoteRagError):
    """The LLM's reply is not the schema's object."""


@dataclass
class Relation:
    subject: str
    predicate: str
    object: str
    quote: str
    char_start: int | None = None  # the quote's span in the note's text
    char_end: int | None = None

    def as_fact(self) -> dict:
        return {"subject": self.subject, "predicate": self.predicate, "object": self.object, "quote": self.quote,
                "char_start": self.char_start, "char_end": self.char_end}


@dataclass
class Extraction:
    summary: str = ""
    entities: list[tuple[str, str]] = field(default_factory=list)  # (name, type)
    relations: list[Relation] = field(default_factory=list)
    dropped: int = 0  # relations whose quote is not in the note
    calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    skipped_chars: int = 0  # past the cap of MAX_CALLS sections: not read

    def stats(self) -> dict:
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "dropped": self.dropped, "relations": len(self.relations), "entities": len(self.entities),
                "seconds": round(self.seconds, 3), "skipped_chars": self.skipped_chars}


def sections(text: str, limit: int = SECTION_CHARS, max_calls: int = MAX_CALLS) -> tuple[list[str], int]:
    """The note cut at blank lines into pieces of at most ``limit`` characters (a longer
    paragraph is cut hard), the first ``max_calls`` of them, and how many characters
    were left out."""
    pieces: list[str] = []
    current = ""
    for para in text.split("\n\n"):
        while len(para) > limit:
            if current:
                pieces.append(current)
                current = ""
            pieces.append(para[:limit])
            para = para[limit:]
        if current and len(current) + 2 + len(para) > limit:
            pieces.append(current)
            current = para
        else:
            current = f"{current}\n\n{para}" if current else para
    if current.strip():
        pieces.append(current)
    pieces = [p for p in pieces if p.strip()]
    kept = pieces[:max_calls]
    return kept, sum(len(p) for p in pieces[max_calls:])


def _normalised(text: str) -> tuple[str, list[int]]:
    """The text with runs of whitespace as one space, and for each of its characters the
    offset it came from."""
    out: list[str] = []
    where: list[int] = []
    space = False
    for i, ch in enumerate(text):
        if ch.isspace():
            if not space and out:
                out.append(" ")
                where.append(i)
            space = True
        else:
            out.append(ch)
            where.append(i)
            space = False
    return "".join(out), where


def find_quote(quote: str, text: str) -> tuple[int, int] | None:
    """The quote's span in the text, whitespace aside, or None when the note does not say it."""
    q = " ".join(quote.split())
    if not q:
        return None
    norm, where = _normalised(text)
    i = norm.find(q)
    if i < 0:
        return None
    return where[i], where[i + len(q) - 1] + 1


def name_spans(names, text: str, limit: int = MAX_NAME_SPANS) -> dict[str, list[tuple[int, int]]]:
    """Where each of ``names`` occurs in ``text``: its first ``limit`` spans, whitespace
    aside (as ``find_quote``), as written or else ignoring case; a Latin name only as a
    whole word ("SQL" is not in "PostgreSQL"). Names not in the text map to []."""
    flat, where = _normalised(text)
    lower = flat.lower()
    if len(lower) != len(flat):  # a case mapping that changes lengths: no offsets to trust
        lower = None
    out: dict[str, list[tuple[int, int]]] = {}
    for name in names:
        q = " ".join(name.split())
        spans: list[tuple[int, int]] = []
        for hay, needle in ((flat, q), (lower, q.lower())):
            if not q or hay is None or len(needle) != len(q):
                continue
            i = hay.find(needle)
            while i >= 0 and len(spans) < limit:
                j = i + len(q)
                cut_before = i > 0 and _WORDISH.match(q[0]) and _WORDISH.match(flat[i - 1])
                cut_after = j < len(flat) and _WORDISH.match(q[-1]) and _WORDISH.match(flat[j])
                if not cut_before and not cut_after:
                    spans.append((where[i], where[j - 1] + 1))
                    i = hay.find(needle, j)
                else:
                    i = hay.find(needle, i + 1)
            if spans:
                break
        out[name] = spans
    return out


def parse(reply: str) -> dict:
    """The reply as the schema's object, or ExtractError."""
    try:
        data = json.loads(reply)
    except ValueError as err:
        raise ExtractError(f"the LLM's reply is not JSON ({err}): {reply[:80]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("summary"), str) \
            or not isinstance(data.get("entities"), list) or not isinstance(data.get("relations"), list):
        raise ExtractError(f"the LLM's reply is not the schema's object: {reply[:80]!r}")
    return data


def _text(value) -> str:
    return " ".join(value.split()) if isinstance(value, str) else ""


def check(data: dict, text: str, into: Extraction) -> None:
    """Add a parsed reply to ``into``: entities and relations with all their fields, the
    relations only when their quote is in ``text``."""
    if not into.summary:
        into.summary = _text(data["summary"])[:300]
    seen = {e[0].casefold() for e in into.entities}
    for e in data["entities"]:
        if not isinstance(e, dict) or not _text(e.get("name")):
            continue
        name = _text(e["name"])
        if name.casefold() not in seen and len(into.entities) < MAX_ENTITIES:
            seen.add(name.casefold())
            into.entities.append((name, _text(e.get("type")) or "other"))
    for r in data["relations"]:
        if not isinstance(r, dict):
            continue
        fields = [_text(r.get(k)) for k in ("subject", "predicate", "object")]
        quote = r.get("quote") if isinstance(r.get("quote"), str) else ""
        if not all(fields) or not quote.strip():
            continue
        span = find_quote(quote, text)
        if span is None:
            into.dropped += 1
            continue
        if len(into.relations) < MAX_RELATIONS:
            into.relations.append(Relation(*fields, text[span[0]:span[1]], span[0], span[1]))


async def extract(stream: Stream, text: str, title: str = "", *, timeout: float | None = None,
                  clock: Callable[[], float] | None = None, replies: list | None = None) -> Extraction:
    """Summary, entities and relations of one note, in at most ``MAX_CALLS`` calls.

    ``replies``: the sections read so far, ``(reply, prompt_tokens, output_tokens)`` each, kept
    by the caller. A section already read is not asked again and each section read is added
    to it, so an extraction cut off between sections (a question wanted the LLM) resumes
    where it stopped: only the section being read is lost."""
    import time

    clock = clock or time.monotonic
    started = clock()
    out = Extraction()
    replies = [] if replies is None else replies
    pieces, out.skipped_chars = sections(text)
    for n, piece in enumerate(pieces):
        if n >= len(replies):
            head = f"Title: {title}\n" if title else ""
            if len(pieces) > 1:
                head += f"(part {n + 1} of {len(pieces)})\n"
            prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{head}\n{piece}"}]
            usage = Usage()
            reply = "".join([p async for p in stream(prompt, usage, {"num_predict": OUTPUT_TOKENS, "temperature": 0},
                                                     format=SCHEMA, timeout=timeout)])
            replies.append((reply, usage.prompt_tokens, usage.output_tokens))
        reply, prompt_tokens, output_tokens = replies[n]
        out.calls += 1
        out.prompt_tokens += prompt_tokens
        out.output_tokens += output_tokens
        check(parse(reply), text, out)
    out.seconds = clock() - started
    return out
