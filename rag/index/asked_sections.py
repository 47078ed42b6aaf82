"""Written questions per heading section (``memory.questions_scope: sections``).

The note scope (``rag.index.asked``) shows the model a note's start, and it asks what the note
is about in general; a person asks about a detail deep in it. Here the model reads the note's
sections, each one's heading path and its first lines, and writes one or two questions per
section in the note's language and one in English, each tied to its section: a hit on such a
question counts for that section's chunk nearest to it (``rag.index.asked.index_questions``),
not for whichever chunk of the note is nearest.

- **A section** is a run of the note's chunks under one heading path (the chunker merges tiny
  sections into their neighbour, so a section here is what the index holds). A note without
  headings, or with one section of several chunks, has one section per chunk.
- **One call per note**, whatever its length: at most ``MAX_SECTIONS`` sections (a note with
  more: that many spread evenly over it, the first and the last among them; the others get no
  question), each shown as ``[n] heading path`` (``HEADING_CHARS``) and its first
  ``SECTION_CHARS`` characters, ``PROMPT_CHARS`` in all; at most ``64 + OUTPUT_PER_SECTION``
  tokens per section written.
- **A reply cut at the output cap** (the model wrote more than asked and ran on) keeps the
  sections it finished before the cut (``complete_entries``), each checked as any other; the
  cut one is lost. (In the note scope such a reply is dropped whole.)
- **The reply** is a JSON object (Ollama's ``format``): ``sections``, a list of ``{section,
  questions, english}``. Each question is checked as in the note scope (``asked.verdict``); an
  entry naming a section that was not shown is dropped (``no such section``, its questions
  counted), and a section's questions past two (English: one) are dropped (``too many``); a
  question that only restates its section's heading (with the title) is dropped (``asked.restates``).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Callable

from rag.index import asked
from rag.speed import Usage

MAX_SECTIONS = 8
HEADING_CHARS = 80
SECTION_CHARS = 160
PROMPT_CHARS = 2000
OUTPUT_PER_SECTION = 80  # a section's entry is 30-60 tokens
OWN_PER_SECTION = 2
ENGLISH_PER_SECTION = 1
SCHEMA = {
    "type": "object",
    "properties": {"sections": {"type": "array", "items": {
        "type": "object",
        "properties": {"section": {"type": "integer"},
                       "questions": {"type": "array", "items": {"type": "string"}},
                       "english": {"type": "array", "items": {"type": "string"}}},
        "required": ["section", "questions", "english"]}}},
    "required": ["sections"],
}
EXAMPLE = {"sections": [
    {"section": 1, "questions": ["番茄炒蛋要准备哪些材料？"], "english": ["What do I need for tomato eggs?"]},
    {"section": 2, "questions": ["鸡蛋要先炒还是番茄先下锅？", "炒蛋怎么才嫩？"],
     "english": ["Do I fry the eggs before the tomatoes?"]}]}
SYSTEM = f"""You read one note from a person's own notes (technical notes, recipes; mostly Chinese): its sections, \
numbered [1], [2], …, each with its heading and its first lines.
For each section, write the questions that section answers, as the person would ask them months later without \
remembering the note's words: everyday words, about that section's own detail, not the note's general topic. \
Each is one short question ending with a question mark.
Reply with JSON only: "sections": one object per section with "section": its number, "questions": 1 or 2 \
questions in the note's language (Chinese for a Chinese note), "english": 1 question in English.
Example for a note on frying tomatoes with eggs ([1] 材料 [2] 做法): {json.dumps(EXAMPLE, ensure_ascii=False)}"""
_EXAMPLE_GRAMS = asked.echo_grams(q for s in EXAMPLE["sections"] for k in ("questions", "english") for q in s[k])


@dataclass(frozen=True)
class Section:
    """One section of a note as the model sees it: its number in the prompt, heading path, first
    lines, and the indexes of its chunks (what its questions point to)."""

    number: int
    path: str
    first: str
    chunks: tuple[int, ...]


def sections(title: str, chunks, most: int = MAX_SECTIONS) -> list[Section]:
    """The note's sections (module docstring), at most ``most``, numbered from 1."""
    runs: list[tuple[str, list]] = []
    for c in chunks:
        path = " > ".join(h for h in c.heading_path if h.strip() != title.strip())
        if runs and runs[-1][0] == path:
            runs[-1][1].append(c)
        else:
            runs.append((path, [c]))
    if len(runs) == 1 and len(runs[0][1]) > 1:  # no headings to go by: one section per chunk
        path = runs[0][0]
        runs = [(f"{path} ({n}/{len(chunks)})".strip(), [c]) for n, c in enumerate(runs[0][1], 1)]
    if len(runs) > most:  # spread over the note, the first and the last kept
        picked = sorted({round(i * (len(runs) - 1) / (most - 1)) for i in range(most)}) if most > 1 else [0]
        runs = [runs[i] for i in picked]
    out = []
    for n, (path, group) in enumerate(runs, 1):
        first = asked._flat(" ".join(c.text for c in group))[:SECTION_CHARS]
        out.append(Section(n, path[:HEADING_CHARS] or title[:HEADING_CHARS],
                           first, tuple(c.index for c in group)))
    return out


def digest(title: str, shown: list[Section], limit: int = PROMPT_CHARS) -> str:
    """What the model reads: the title and each section's number, heading path and first lines,
    ``limit`` characters in all (each section's share of what is left cut to fit)."""
    head = f"Title: {title}\nSections:\n"
    room = max(0, limit - len(head))
    share = room // max(1, len(shown))
    parts = []
    for s in shown:
        line = f"[{s.number}] {s.path}\n"
        parts.append((line + s.first)[:share])
    return head + "\n".join(parts)


CAPPED = "generation: ran to the output cap"
CUT = "generation: cut at the output cap (its finished sections kept)"


def complete_entries(reply: str) -> list:
    """The section entries a reply cut at the output cap finished: the JSON objects of its
    ``sections`` list up to the one the cap cut (none: the list never began)."""
    start = reply.find("[", max(0, reply.find('"sections"')))
    if '"sections"' not in reply or start < 0:
        return []
    decoder, at, out = json.JSONDecoder(), start + 1, []
    while True:
        while at < len(reply) and reply[at] in " \t\r\n,":
            at += 1
        if at >= len(reply) or reply[at] != "{":
            return out
        try:
            entry, at = decoder.raw_decode(reply, at)
        except ValueError:
            return out
        out.append(entry)


def paths_of(digest_text: str, n: int) -> list[str]:
    """Each shown section's heading path, read back from the digest's ``[k] path`` lines."""
    found = dict(re.findall(r"^\[(\d+)\] (.*)$", digest_text, flags=re.M))
    return [found.get(str(k), "") for k in range(1, n + 1)]


def output_cap(n_sections: int) -> int:
    return 64 + OUTPUT_PER_SECTION * max(1, n_sections)


def prompt(digest_text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": digest_text}]


def check(reply: str, digest_text: str, title: str, chunks_of: list[list[int]], usage: Usage | None = None,
          cap: int | None = None) -> asked.Written:
    """A reply's questions, checked (module docstring); ``chunks_of``: the chunks of section
    n + 1 (its heading path, which a question may not only restate, read from the digest). The
    kept questions: the note's language first, then English, ``ties`` beside them."""
    out, data = asked.opened(reply, usage, output_cap(len(chunks_of)) if cap is None else cap)
    if out.dropped:
        entries = complete_entries(reply) if CAPPED in out.dropped else []
        if not entries:
            return out
        out.dropped = {CUT: 1}  # the sections the model finished before the cap, each checked as any other
        data = {"sections": entries}
    entries = data.get("sections") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        out.drop("generation: not the schema's object")
        return out
    zh = asked.chinese(digest_text)
    echoes = asked.echoes_of(title, SYSTEM)
    seen: set[str] = set()
    own: list[tuple[str, list[int]]] = []
    english: list[tuple[str, list[int]]] = []
    per: dict[tuple[int, str], int] = {}
    paths = paths_of(digest_text, len(chunks_of))
    for entry in entries:
        if not isinstance(entry, dict):
            out.drop("generation: not the schema's object")
            continue
        n = entry.get("section")
        qs = {k: [q for q in entry.get(k) or [] if isinstance(q, str)] if isinstance(entry.get(k), list) else []
              for k in ("questions", "english")}
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= len(chunks_of):
            out.drop("no such section", max(1, len(qs["questions"]) + len(qs["english"])))
            continue
        for key, most, into in (("questions", OWN_PER_SECTION, own), ("english", ENGLISH_PER_SECTION, english)):
            for q in qs[key]:
                if per.get((n, key), 0) >= most:
                    out.drop("too many")
                    continue
                q = asked._flat(q)
                reason = asked.verdict(q, key == "english", zh, echoes, seen, digest_text, _EXAMPLE_GRAMS,
                                       [f"{title} {paths[n - 1]}"])
                if reason:
                    out.drop(reason)
                else:
                    per[(n, key)] = per.get((n, key), 0) + 1
                    into.append((q, list(chunks_of[n - 1])))
    if not own and not english:
        out.drop("generation: nothing usable")
        return out
    out.questions = [q for q, _ in own + english]
    out.ties = [t for _, t in own + english]
    out.english = len(english)
    return out


async def write(stream: asked.Stream, digest_text: str, title: str, chunks_of: list[list[int]], *,
                timeout: float | None = None, clock: Callable[[], float] | None = None) -> asked.Written:
    """The questions of one note's sections, from its ``digest``: one call, checked."""
    clock = clock or time.monotonic
    started = clock()
    usage = Usage()
    cap = output_cap(len(chunks_of))
    reply = "".join([p async for p in stream(prompt(digest_text), usage, {"num_predict": cap, "temperature": 0},
                                             format=SCHEMA, timeout=timeout)])
    out = check(reply, digest_text, title, chunks_of, usage, cap)
    out.seconds = clock() - started
    return out
