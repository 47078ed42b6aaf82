"""Written questions: the questions a note answers, written ahead of time by the LLM.

A question that does not use the note's words (a paraphrase, or English about a Chinese
note) is hard for both retrievers; the note's own questions, written once per note in
the background, are in the asker's words more often than the note is. They are indexed as
extra entries pointing to the note (``rag.index.retrieve``, "Written questions") and are
never shown or cited: the chunk they point to is.

One call per note: its title, its heading outline and its first lines (``digest``), never
more than ``DIGEST_CHARS``, so a long note costs what a short one does; with
``memory.questions_scope: title``, its title alone (``title_digest``, ``TITLE_SYSTEM``). The reply is a JSON
object (Ollama's ``format``): ``questions`` in the note's language and ``english``. What a
small model writes is checked (``check``), never trusted:

- a reply that is not the object, or that ran to the output cap (``OUTPUT_TOKENS``: rambling),
  is dropped whole;
- a question that is empty, too long, not a question (no question mark), repeats the prompt (the instructions, the
  title, the digest's labels, a run of the prompt's example the note does not hold), is in the wrong language (a Chinese note's questions
  hold CJK; the English ones hold none), repeats another, or only restates a heading (``restates``: "<heading>是什么？",
  "What is <heading>?" — both retrievers already match the heading in the chunk itself), is dropped;
- nothing left: the generation is dropped.

Every drop is counted with its reason (``Written.dropped``); a dropped generation writes no
entry. What the call cost (tokens, as the server reported them) comes back too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from rag.speed import Usage

PER_LANGUAGE = 4  # asked for: this many in the note's language, this many in English
DIGEST_CHARS = 900  # what the model reads of a note (title, outline, first lines)
OUTLINE_CHARS = 400
OUTPUT_TOKENS = 256  # a reply that reaches it is rambling, and dropped (a good one is 40-150)
MAX_QUESTION_CHARS = 160
MIN_QUESTION_CHARS = 4
CJK_NOTE = 30
SCHEMA = {
    "type": "object",
    "properties": {
        "questions": {"type": "array", "items": {"type": "string"}},
        "english": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["questions", "english"],
}
EXAMPLE = {"questions": ["番茄炒蛋的鸡蛋要先炒吗？", "炒蛋怎么才嫩？"],
           "english": ["Do I fry the eggs before the tomatoes?", "How do I keep scrambled eggs soft?"]}
SYSTEM = f"""You read the start of one note from a person's own notes (technical notes, recipes; mostly Chinese).
Write the questions this note answers, as the person would ask them months later without remembering the note's words: \
everyday words, not the note's headings copied. Each is one short question ending with a question mark.
Reply with JSON only: "questions": {PER_LANGUAGE} questions in the note's language (Chinese for a Chinese note); \
"english": {PER_LANGUAGE} questions in English.
Example for a note on frying tomatoes with eggs: {json.dumps(EXAMPLE, ensure_ascii=False)}"""
# ``memory.questions_scope: title``: the same call reading nothing but the note's title
TITLE_SYSTEM = SYSTEM.replace("You read the start of one note", "You read the title of one note")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")
_SPACES = re.compile(r"\s+")

Stream = Callable[..., AsyncIterator[str]]  # (prompt, usage, options, format=..., timeout=...)


@dataclass
class Written:
    """One note's written questions, or why there are none."""

    questions: list[str] = field(default_factory=list)  # in the note's language, then English
    english: int = 0  # how many of ``questions`` (the last ones) are the English ones
    # per question, the chunks (their indexes) of the section it was written for; none: the note's
    # nearest chunk (``questions_scope: note``); see ``rag.index.asked_sections``
    ties: list[list[int]] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count (questions, or "generation")
    prompt_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    server_seconds: float = 0.0  # reading and writing, as the server reported them (no waiting for its slot)

    @property
    def ok(self) -> bool:
        return bool(self.questions)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    def stats(self) -> dict:
        return {"questions": len(self.questions), "english": self.english, "dropped": dict(self.dropped),
                **({"sections_answered": len({tuple(t) for t in self.ties})} if self.ties else {}),
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "seconds": round(self.seconds, 3), "server_seconds": round(self.server_seconds, 3)}


def chinese(text: str) -> bool:
    """Is a note written in Chinese? (At least ``CJK_NOTE`` CJK characters, or a tenth of them
    in its prose's letters: code and names in Latin letters do not make it an English note.)"""
    cjk = len(_CJK.findall(text))
    return cjk >= CJK_NOTE or cjk * 10 > len(_LATIN.findall(text))


def digest(title: str, chunks, limit: int = DIGEST_CHARS) -> str:
    """What the model reads of a note: its title, its outline (the chunks' heading paths,
    each once, cut at ``OUTLINE_CHARS``) and its first lines, ``limit`` characters in all."""
    outline: list[str] = []
    for c in chunks:
        head = " > ".join(h for h in c.heading_path if h.strip() != title.strip())
        if head and head not in outline:
            outline.append(head)
    lines = "\n".join(f"- {h}" for h in outline)[:OUTLINE_CHARS]
    head = f"Title: {title}\n" + (f"Outline:\n{lines}\n" if lines else "")
    head += "Start:\n"
    body = "\n".join(c.text for c in chunks)
    return head + body[: max(0, limit - len(head))]


def title_digest(title: str) -> str:
    """What the model reads of a note in ``memory.questions_scope: title``."""
    return f"Title: {title}\n"


def prompt(digest_text: str, system: str = SYSTEM) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": digest_text}]


def _flat(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def _grams(text: str) -> set[str]:
    """A text's CJK character 4-grams and Latin word triples, lower case (what an echo shares)."""
    text = text.lower()
    out = {text[i:i + 4] for i in range(len(text) - 3) if all(_CJK.match(ch) for ch in text[i:i + 4])}
    words = re.findall(r"[a-z0-9]+", text)
    return out | {" ".join(words[i:i + 3]) for i in range(len(words) - 2)}


# the example's own subject: a three-word run of it counts as copied only with one of these in it
# ("How do I keep …" is how anyone asks; "keep scrambled eggs" is the example)
EXAMPLE_SUBJECT = frozenset({"tomato", "tomatoes", "egg", "eggs", "scrambled", "fry", "soft"})


def echo_grams(questions, subject=EXAMPLE_SUBJECT) -> set[str]:
    """What an echo of an example shares with it: its CJK 4-grams, and its three-word runs that
    hold one of its ``subject`` words."""
    grams = set().union(*(_grams(q) for q in questions))
    return {g for g in grams if " " not in g or subject & set(g.split())}


_EXAMPLE_GRAMS = echo_grams(q for qs in EXAMPLE.values() for q in qs)


def echoes_example(question: str, digest_text: str, example_grams: set[str] | None = None) -> bool:
    """Does the question repeat the prompt's example (a 4-character run of it, or a three-word run
    with its subject in it, that the note does not hold)? Small models copy it into notes it has
    nothing to do with."""
    grams = _EXAMPLE_GRAMS if example_grams is None else example_grams
    own = _grams(digest_text)
    return any(g in grams and g not in own for g in _grams(question))


def echoes_of(title: str, system: str) -> set[str]:
    """What a question must not be: the title, a line of the instructions (case-folded)."""
    return {_flat(title).casefold()} | {_flat(line).casefold() for line in system.splitlines()}


def verdict(q: str, english: bool, zh: bool, echoes: set[str], seen: set[str], digest_text: str,
            example_grams: set[str] | None = None, headings: list[str] = ()) -> str | None:
    """Why a question (flattened) is dropped, or None: it is kept (and added to ``seen``).
    ``english``: one of the English ones; ``zh``: the note is Chinese; ``headings``: what it may
    not only restate (``restates``)."""
    key_q = q.casefold().rstrip("?？")
    if len(q) < MIN_QUESTION_CHARS:
        return "empty"
    if len(q) > MAX_QUESTION_CHARS:
        return "too long"
    if q.casefold() in echoes or key_q in echoes or any(s in q for s in ("Title:", "Outline:", "Start:", "Sections:")) \
            or echoes_example(q, digest_text, example_grams):
        return "echo"
    if not q.endswith(("?", "？")):
        return "not a question"
    if (english or not zh) and _CJK.search(q) or not english and zh and not _CJK.search(q):
        return "language"
    if key_q in seen:
        return "repeated"
    if restates(q, english, list(headings)):
        return "restates a heading"
    seen.add(key_q)
    return None


# what a question adds to a heading without saying anything of its own: question words, and the
# words a small model puts after a heading to make it a question ("的作用是什么", "the purpose of")
_ASKING_ZH = re.compile("|".join(sorted("""是什么 什么 有哪些 哪些 哪个 如何 怎么样 怎么 怎样 为什么 为何 是否 吗 呢 的 了 是 有 和 与 及
    作用 用法 方法 步骤 区别 过程 场景 特点 原理 意思 含义 介绍 使用 进行 可以 能 要 该 一些 主要""".split(),
                                     key=len, reverse=True)))
_ASKING_EN = frozenset("""what whats is are was the a an of to in on for how do does did i you we it its and or with
    use used using purpose mean means meaning why when which can could should there this that be main some about
    work works way ways""".split())


def _units(text: str, english: bool) -> set[str]:
    """A text's content: its CJK characters (not in the English questions) and Latin words, lower case."""
    text = text.lower()
    words = set(re.findall(r"[a-z0-9]+", text))
    return words | (set() if english else set(_CJK.findall(text)))


def headings_of(digest_text: str, title: str) -> list[str]:
    """The headings a note scope question may not only restate: the title, and each line of the
    digest's outline read with the title."""
    outline = digest_text.split("\nOutline:\n", 1)[1].split("\nStart:\n", 1)[0] if "\nOutline:\n" in digest_text else ""
    return [title] + [f"{title} {line[2:]}" for line in outline.splitlines() if line.startswith("- ")]


def restates(q: str, english: bool, headings: list[str]) -> bool:
    """Does a question only restate one of the headings (each read with the ones above it, a
    note scope question: with the title)? Nothing of it but question words is outside that heading:
    "WebSocket 握手是什么？" for "WebSocket 握手", "What is WebSocket?" for "全双工通信的 WebSocket";
    "What is the structure of WebSocket data frames?" for "WebSocket 数据帧结构" says something of its
    own in English, and stays."""
    own = _units(_ASKING_ZH.sub(" ", q.lower()), english) - _ASKING_EN
    if not own:
        return False  # nothing but question words: not this check's to judge
    return any(own <= _units(h, False) for h in headings if h.strip())


def opened(reply: str, usage: Usage | None, cap: int) -> tuple[Written, object]:
    """What a reply cost (as the server reported it) and its JSON (None: not JSON). A reply that
    ran to the output cap is dropped (``out.dropped`` says so) and not read."""
    out = Written()
    if usage is not None:
        out.prompt_tokens, out.output_tokens = usage.prompt_tokens, usage.output_tokens
        out.server_seconds = usage.prompt_seconds + usage.output_seconds
        if usage.output_tokens >= cap:
            out.drop("generation: ran to the output cap")
            return out, None
    try:
        return out, json.loads(reply)
    except ValueError:
        return out, None


def check(reply: str, digest_text: str, title: str, usage: Usage | None = None,
          cap: int = OUTPUT_TOKENS, system: str = SYSTEM) -> Written:
    """A reply's questions, checked (module docstring); ``digest_text``: what the model read,
    ``system``: its instructions."""
    out, data = opened(reply, usage, cap)
    if out.dropped:
        return out
    if not isinstance(data, dict) or not isinstance(data.get("questions"), list) \
            or not isinstance(data.get("english"), list):
        out.drop("generation: not the schema's object")
        return out
    zh = chinese(digest_text)
    echoes = echoes_of(title, system)
    seen: set[str] = set()
    headings = headings_of(digest_text, title)
    kept: dict[str, list[str]] = {"questions": [], "english": []}
    for key in ("questions", "english"):
        for q in data[key][: 2 * PER_LANGUAGE]:
            q = _flat(q) if isinstance(q, str) else ""
            reason = verdict(q, key == "english", zh, echoes, seen, digest_text, headings=headings)
            if reason:
                out.drop(reason)
            else:
                kept[key].append(q)
        extra = len(data[key]) - 2 * PER_LANGUAGE
        if extra > 0:
            out.drop("too many", extra)
    if not kept["questions"] and not kept["english"]:
        out.drop("generation: nothing usable")
        return out
    out.questions = kept["questions"] + kept["english"]
    out.english = len(kept["english"])
    return out


async def write(stream: Stream, digest_text: str, title: str, *, timeout: float | None = None,
                clock: Callable[[], float] | None = None, system: str = SYSTEM) -> Written:
    """The questions one note answers, from its ``digest`` (or ``title_digest`` with
    ``TITLE_SYSTEM``): one call, checked."""
    import time

    clock = clock or time.monotonic
    started = clock()
    usage = Usage()
    reply = "".join([p async for p in stream(prompt(digest_text, system), usage,
                                             {"num_predict": OUTPUT_TOKENS, "temperature": 0},
                                             format=SCHEMA, timeout=timeout)])
    out = check(reply, digest_text, title, usage, system=system)
    out.seconds = clock() - started
    return out


# --- in the index ----------------------------------------------------------------------------
#
# A note's written questions are points of the person's questions tenant (``points.asked_user``),
# ids ``asked_point_id(note, n)``, each with the note's id, the question, the content hash it was
# written from and the chunk it points to: the note's chunk nearest to it (dense), or with
# ``memory.questions_scope: sections`` the nearest of its own section's chunks. A search finds
# them as it finds chunks (dense and BM25, BM25's IDF over the person's questions) and counts each
# hit for its chunk (``rankings``): the chunk is what is shown and cited, the question never.


def index_questions(index, note_id: str, user_id: str, content_hash: str, questions: list[str],
                    ties: list[list[int]] | None = None) -> int:
    """Put a note's written questions in the index in place of its old ones (none: they go).
    ``index``: a ``rag.index.note_index.NoteIndex``; ``ties``: per question the indexes of the
    chunks it may point to (its section's; none or empty: any of the note's). How many were written."""
    from rag.index.lexical import document_vector
    from rag.index.points import MAX_ASKED, PointData, asked_point_id, asked_point_ids, asked_user, point_id

    questions = list(questions)[:MAX_ASKED]
    ties = list(ties or [])
    allowed = [{point_id(note_id, i) for i in ties[n]} if n < len(ties) and ties[n] else None
               for n in range(len(questions))]
    points = []
    if questions:
        vectors = index.embed_query(questions)
        wide = any(allowed)  # a section's chunks may be far down the note's nearest
        nearest = index.store.nearest(list(vectors), user_id, NOTE_CHUNKS if wide else 1, note_ids=[note_id])
        for n, (q, vec, near) in enumerate(zip(questions, vectors, nearest)):
            near = [c for c in near if allowed[n] is None or c.id in allowed[n]]
            if not near:  # the note (the section) has no chunk (any more): nothing to point to
                continue
            payload = {"user_id": asked_user(user_id), "note_id": note_id, "kind": "question", "text": q,
                       "chunk_id": near[0].id, "content_hash": content_hash}
            points.append(PointData(asked_point_id(note_id, n), vec, document_vector(q, index.settings.bm25), payload))
    index.store.upsert(points)
    index.store.delete([pid for pid in asked_point_ids(note_id) if pid not in {p.id for p in points}])
    return len(points)


NOTE_CHUNKS = 64  # the most of a note's chunks read back from the index, or searched for a section's


def chunks_from_index(store, note_id: str, most: int = NOTE_CHUNKS) -> tuple[str, list] | None:
    """A note's title and chunks (index, text, heading path) from the index (its first ``most``),
    for a job queued without its digest; None when the note has no chunk there."""
    from types import SimpleNamespace

    from rag.index.points import point_id

    found = store.payloads([point_id(note_id, i) for i in range(most)])
    chunks = sorted(found.values(), key=lambda p: p.get("chunk_index", 0))
    if not chunks:
        return None
    return chunks[0].get("title", ""), [SimpleNamespace(index=p.get("chunk_index", 0), text=p.get("text", ""),
                                                        heading_path=tuple(p.get("heading_path") or ()))
                                        for p in chunks]


def unindex_questions(store, note_ids) -> None:
    """The notes' written questions leave the index (``store``: a ``rag.index.store.Store``)."""
    from rag.index.points import asked_point_ids

    ids = [pid for n in note_ids for pid in asked_point_ids(n)]
    if ids:
        store.delete(ids)


def align(index, rows: dict[str, tuple], users) -> tuple[int, int]:
    """The index's question points in line with the written questions' rows (``MemoryStore.
    asked_rows``: the truth): a note with questions and no points gets them, a note with points
    and no questions loses them (``users``: whose tenants to look at). After a kill between
    the row's commit and the points' write, or a note removed meanwhile. (added, removed)"""
    from rag.index.points import asked_user

    held: set[str] = set()
    for user in users:
        held |= index.store.note_ids(asked_user(user))
    wanted = {n for n, row in rows.items() if row[2]}
    added = 0
    for note_id in sorted(wanted - held):
        user, content_hash, qs, *ties = rows[note_id]
        added += bool(index_questions(index, note_id, user, content_hash, qs, ties[0] if ties else None))
    gone = sorted(held - wanted)
    unindex_questions(index.store, gone)
    return added, len(gone)


def rankings(store, dense, sparse, user_id: str, limit: int, hnsw_ef: int = 128) -> dict:
    """The written questions' candidates for a query, each counted for its chunk (the best
    question of a chunk), as two more rankings: ``asked_dense`` and ``asked_sparse``. A
    question whose chunk is gone, or was indexed from another text, counts for nothing."""
    from rag.index.points import Ranked, asked_user

    found_dense, found_sparse = store.search(dense, sparse, asked_user(user_id), limit, hnsw_ef)
    ids = list({c.id for c in found_dense + found_sparse})
    if not ids:
        return {}
    asked = store.payloads(ids)
    chunks = store.payloads(list({p["chunk_id"] for p in asked.values() if p.get("chunk_id")}))

    def mapped(found) -> list:
        out, seen = [], set()
        for c in found:
            p = asked.get(c.id) or {}
            chunk = chunks.get(p.get("chunk_id"))
            if chunk is None or chunk.get("user_id") != user_id or chunk.get("content_hash") != p.get("content_hash") \
                    or p["chunk_id"] in seen:
                continue
            seen.add(p["chunk_id"])
            out.append(Ranked(p["chunk_id"], c.score, c.note_id))
        return out

    return {"asked_dense": mapped(found_dense), "asked_sparse": mapped(found_sparse)}
