"""What a note is about, without an LLM: entities with their places in the note.

Five kinds, each found in the note's *cleaned* text (``rag.index.clean``; the text the
chunks are cut from, so every span ``(start, end)`` is an offset into it and
``text[start:end]`` is the mention as written):

- ``term``: the note's distinctive words. Candidates are jieba's words (precise mode)
  of the prose (code, URLs and link targets left out): CJK words of at least 2
  characters, Latin words with at least 3 letters, no numbers, no stopwords. Each is
  weighted as BM25 weights a term of a document: saturated term frequency
  ``tf·(k1+1)/(tf+k1)`` (a word in the title counts 3 more times, in a heading 2) times
  ``idf = ln(1 + (N - df + 0.5)/(df + 0.5))`` over the person's own notes: ``df`` is
  how many of them hold the word, kept by the memory store as notes come and go. Below
  ``MIN_NOTES_FOR_IDF`` notes the IDF says nothing and is left out. At most
  ``MAX_TERMS`` per note. (Chosen over IDF from the note's own chunks: a one-chunk
  note, the common case, has no statistics of its own; and over a fixed IDF table:
  none fits both Chinese prose and code notes.) The IDF is the one of the moment the
  note was processed: a note processed early in a first index saw fewer notes.
- ``code``: identifiers in inline code and fenced code that look like identifiers
  (``CamelCase``, ``snake_case``, ``dotted.names``), whole inline spans that are one
  identifier, and the command of a ``cmd --flag`` line.
- ``tag``: the note's tags (no span: they are not in the text).
- ``heading``: Markdown heading texts.
- ``link``: the labels of Markdown links ``[label](target)``.

The LLM tier (``rag.memory.extract``) adds typed entities of ``LLM_KINDS`` (``llm_kind``
turns the type the model wrote into one of them), each located in the same cleaned
text (``MemoryStore.store_llm``). ``rag.model.ENTITY_KINDS`` names both.

Pure functions: text in, entities out.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from markdown_it import MarkdownIt

from rag.index.lexical import STOPWORDS, jieba, norm  # an entity's key is the index's normal form of a name
from rag.model import LLM_KINDS, Chunk

VERSION = 1  # bump when extraction changes what a note yields: notes are processed again
MAX_TERMS = 12
MAX_CODE = 20
MAX_MENTIONS = 20  # per entity and note: the first ones
MIN_NOTES_FOR_IDF = 5
K1 = 1.2
SNIPPET = 30  # characters of context each side of a mention

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(r"[A-Za-z0-9_]+(?:[.\-'][A-Za-z0-9_]+)*")
_URL = re.compile(r"(?:https?|ftp)://[^\s)\]>]+")
_LINK = re.compile(r"(?<!!)\[([^\[\]\n]{1,200})\]\(([^()\s]*(?:\([^()\s]*\))?[^()\s]*)(?:\s+\"[^\"\n]*\")?\)")
_INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_HEADING = re.compile(r"^[ ]{0,3}(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.M)
_IDENT = re.compile(r"(?<![\w.])[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?![\w])")
_CAMEL = re.compile(r"[a-z0-9][A-Z]")  # a lower letter or digit before an upper one: fooBar, QueuePool
_COMMAND = re.compile(r"^[ \t]*(?:[$#>][ \t]+)?(?:sudo[ \t]+)?([a-z][\w.-]*)[ \t]+(?:\S+[ \t]+)*?--?[A-Za-z]", re.M)
_ONE_IDENT = re.compile(r"^[A-Za-z_][\w]*(?:[.:/-][A-Za-z_][\w]*)*(?:\(\))?$")
_EMPHASIS = re.compile(r"[*`~]+|(?<!\w)_+|_+(?!\w)")

# Words that say nothing about a note, besides the search stopwords; the IDF takes care
# of the rest once there are enough notes.
EXTRA_STOPWORDS = frozenset(
    """
    图片 附件 需要 时候 现在 之后 之前 以后 以前 已经 一下 一次 比较 可能 应该 知道 觉得 不是 问题
    方法 注意 这里 那里 里面 其中 所有 每个 不要 开始 最后 第一 一样 然后 因此 不过 只是 只要 不会
    不能 还有 之类 可以 所以 直接 一般 主要 时间 东西 情况 出来 起来 这么 那么 非常 特别
    are was not but all any can one two has had its our out use used using get got just like more most
    some than them then there these they this those very will with would your into also only each other
    such when where which while about after before over under again further once here what how why
    """.split()
)
_COMMAND_WORDS = frozenset("sudo cd ls echo cat set export then else done for do if".split())


@dataclass(frozen=True)
class Span:
    start: int
    end: int


@dataclass
class Entity:
    """One entity of one note: ``name`` as first written, its ``kind``, where it is."""

    name: str
    kind: str
    spans: list[Span] = field(default_factory=list)
    score: float = 0.0

    @property
    def norm(self) -> str:
        return norm(self.name)


@dataclass
class Extraction:
    entities: list[Entity]
    terms: frozenset[str]  # every candidate term of the note (its document frequency counts these)


_LLM_KIND_ALIASES = {"organisation": "organization", "org": "organization", "company": "organization",
                     "people": "person", "location": "place", "software": "tool", "library": "tool"}


def llm_kind(kind: str) -> str:
    """The LLM's entity type as one of ``LLM_KINDS`` (a plural or a common alias too);
    anything else is ``other``."""
    key = norm(kind or "")
    key = _LLM_KIND_ALIASES.get(key, key)
    if key not in LLM_KINDS and key.endswith("s"):
        key = _LLM_KIND_ALIASES.get(key[:-1], key[:-1])
    return key if key in LLM_KINDS else "other"


def text_of(chunks: Sequence[Chunk]) -> str:
    """The cleaned text again, from a note's chunks (``chunk.text == cleaned[start:end]``):
    what no chunk covers (blank lines between sections) becomes spaces, so every offset
    into a chunk is an offset into this text."""
    if not chunks:
        return ""
    out = [" "] * max(c.char_end for c in chunks)
    for c in chunks:
        out[c.char_start : c.char_end] = c.text
    return "".join(out)


# --- where things are ---------------------------------------------------------------------


_BLOCKS = MarkdownIt("commonmark").disable(["inline", "text_join"], ignoreInvalid=True)


def _code_ranges(text: str) -> list[tuple[int, int]]:
    """Fenced and indented code blocks (offsets), as ``rag.index.clean.block_spans`` finds them
    but with the block parser alone: the inline pass would double the cost."""
    try:
        tokens = _BLOCKS.parse(text)
    except RecursionError:
        return []
    lines = [0, *(m.end() for m in re.finditer("\n", text)), len(text)]
    at = lambda line: lines[min(line, len(lines) - 1)]  # noqa: E731
    return [(at(t.map[0]), at(t.map[1])) for t in tokens
            if t.map is not None and t.level == 0 and t.type in ("fence", "code_block")]


def _inline_code(text: str, blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Content ranges of inline code spans outside code blocks."""
    out = []
    for m in _INLINE_CODE.finditer(text):
        if not _inside(m.start(), blocks) and "\n\n" not in m.group(2):
            out.append((m.start(2), m.end(2)))
    return out


def _inside(pos: int, ranges: Iterable[tuple[int, int]]) -> bool:
    return any(a <= pos < b for a, b in ranges)


def _mask(text: str, ranges: Iterable[tuple[int, int]]) -> str:
    """The text with ``ranges`` blanked out, offsets unchanged."""
    chars = list(text)
    for a, b in ranges:
        chars[a:b] = " " * (b - a)
    return "".join(chars)


# --- terms --------------------------------------------------------------------------------


def _keep_term(term: str) -> bool:
    if term in STOPWORDS or term in EXTRA_STOPWORDS or len(term) > 40:
        return False
    if _CJK_RUN.fullmatch(term):
        return len(term) >= 2
    return sum(ch.isalpha() for ch in term) >= 3


def term_spans(prose: str) -> list[tuple[str, int, int]]:
    """Candidate terms of a text with their spans: CJK runs cut by jieba, Latin words
    lowercased (as BM25 sees them)."""
    out = []
    for m in _CJK_RUN.finditer(prose):
        for word, a, b in jieba().tokenize(m.group()):
            if _keep_term(word):
                out.append((word, m.start() + a, m.start() + b))
    for m in _WORD.finditer(prose):
        word = m.group().lower()
        if _keep_term(word):
            out.append((word, m.start(), m.end()))
    out.sort(key=lambda t: t[1])
    return out


def _prose(text: str, blocks: list[tuple[int, int]], inline: list[tuple[int, int]]) -> str:
    urls = [(m.start(), m.end()) for m in _URL.finditer(text)]
    targets = [(m.start(2), m.end(2)) for m in _LINK.finditer(text)]
    return _mask(text, [*blocks, *inline, *urls, *targets])


def idf(df: int, notes: int) -> float:
    """BM25's IDF (the Lucene form, never negative); ``df`` and ``notes`` count this note."""
    return math.log(1 + (notes - df + 0.5) / (df + 0.5))


def distinctive_terms(
    spans: list[tuple[str, int, int]],
    df: Mapping[str, int],
    notes: int,
    title: str = "",
    headings: Sequence[str] = (),
    limit: int = MAX_TERMS,
) -> list[Entity]:
    """The ``limit`` best terms by BM25 weight. ``df``/``notes``: the person's other notes
    (this one is added here)."""
    counts = Counter(t for t, _, _ in spans)
    if not counts:
        return []
    boost = Counter()
    for word, _, _ in term_spans(title):
        boost[word] += 3
    for heading in headings:
        for word in {w for w, _, _ in term_spans(heading)}:
            boost[word] += 2
    first: dict[str, int] = {}
    where: dict[str, list[Span]] = {}
    for term, a, b in spans:
        first.setdefault(term, a)
        where.setdefault(term, []).append(Span(a, b))
    scored = []
    for term, tf in counts.items():
        tf += boost.get(term, 0)
        weight = tf * (K1 + 1) / (tf + K1)
        if notes + 1 >= MIN_NOTES_FOR_IDF:
            weight *= idf(df.get(term, 0) + 1, notes + 1)
        scored.append((weight, term))
    scored.sort(key=lambda s: (-s[0], first[s[1]]))
    out = []
    for weight, term in scored[:limit]:
        out.append(Entity(term, "term", where[term][:MAX_MENTIONS], round(weight, 4)))
    return out


# --- code, headings, links ----------------------------------------------------------------


def _looks_like_identifier(word: str) -> bool:
    if sum(ch.isalpha() for ch in word) < 3:
        return False
    if "." in word:
        parts = word.split(".")
        return all(parts) and not word.lower().startswith(("www.", "e.g", "i.e"))
    if "_" in word.strip("_"):
        return True
    return bool(_CAMEL.search(word)) and any(ch.islower() for ch in word)


def code_identifiers(text: str, blocks: list[tuple[int, int]], inline: list[tuple[int, int]]) -> list[Entity]:
    found: dict[str, Entity] = {}
    count: Counter = Counter()

    def add(name: str, a: int, b: int) -> None:
        key = norm(name)
        ent = found.setdefault(key, Entity(name, "code"))
        if len(ent.spans) < MAX_MENTIONS:
            ent.spans.append(Span(a, b))
        count[key] += 1

    for a, b in inline:  # a span that is one identifier is one entity, whatever its shape
        content = text[a:b]
        stripped = content.strip()
        lead = a + len(content) - len(content.lstrip())
        if _ONE_IDENT.match(stripped) and (_looks_like_identifier(stripped.removesuffix("()")) or "(" in stripped):
            name = stripped.removesuffix("()")
            add(name, lead, lead + len(name))
            continue
        cmd = _COMMAND.match(content)
        if cmd and cmd.group(1) not in _COMMAND_WORDS and len(cmd.group(1)) >= 2:
            add(cmd.group(1), a + cmd.start(1), a + cmd.end(1))
        for m in _IDENT.finditer(content):
            if _looks_like_identifier(m.group()):
                add(m.group(), a + m.start(), a + m.end())
    for a, b in blocks:
        block = text[a:b]
        body_start = block.find("\n") + 1 if block.lstrip().startswith(("```", "~~~")) else 0
        body = _mask(block, [(0, body_start)])
        body = _mask(body, [(m.start(), m.end()) for m in _URL.finditer(body)])
        for m in _COMMAND.finditer(body):
            if m.group(1) not in _COMMAND_WORDS and len(m.group(1)) >= 2:
                add(m.group(1), a + m.start(1), a + m.end(1))
        for m in _IDENT.finditer(body):
            if _looks_like_identifier(m.group()):
                add(m.group(), a + m.start(), a + m.end())
    first = {k: e.spans[0].start for k, e in found.items()}
    keys = sorted(found, key=lambda k: (-count[k], first[k]))[:MAX_CODE]
    return [found[k] for k in sorted(keys, key=first.get)]


def headings(text: str, blocks: list[tuple[int, int]]) -> list[Entity]:
    found: dict[str, Entity] = {}
    for m in _HEADING.finditer(text):
        if _inside(m.start(), blocks):
            continue
        raw = m.group(2)
        name = " ".join(_EMPHASIS.sub("", raw).split())
        if not name or len(name) > 80 or not any(ch.isalnum() for ch in name):
            continue
        ent = found.setdefault(norm(name), Entity(name, "heading"))
        if len(ent.spans) < MAX_MENTIONS:
            ent.spans.append(Span(m.start(2), m.end(2)))
    return list(found.values())


def links(text: str, blocks: list[tuple[int, int]], inline: list[tuple[int, int]]) -> list[Entity]:
    found: dict[str, Entity] = {}
    for m in _LINK.finditer(text):
        if _inside(m.start(), blocks) or _inside(m.start(), inline):
            continue
        label = m.group(1)
        name = " ".join(_EMPHASIS.sub("", label).split())
        if not name or _URL.fullmatch(name) or not any(ch.isalpha() for ch in name):
            continue
        ent = found.setdefault(norm(name), Entity(name, "link"))
        if len(ent.spans) < MAX_MENTIONS:
            lead = len(label) - len(label.lstrip())
            ent.spans.append(Span(m.start(1) + lead, m.start(1) + lead + len(label.strip())))
    return list(found.values())


def tags(names: Iterable[str]) -> list[Entity]:
    found: dict[str, Entity] = {}
    for name in names:
        name = " ".join(name.split())
        if name:
            found.setdefault(norm(name), Entity(name, "tag"))
    return list(found.values())


# --- a whole note ---------------------------------------------------------------------------

Stats = Callable[[list[str]], tuple[Mapping[str, int], int]]  # terms -> (df over the other notes, their number)


def extract(text: str, *, title: str = "", tag_names: Iterable[str] = (), stats: Stats | None = None) -> Extraction:
    """Every entity of a note's cleaned ``text``. ``stats`` gives the document frequencies
    of the candidate terms over the person's other notes (none: no IDF)."""
    blocks = _code_ranges(text)
    inline = _inline_code(text, blocks)
    heads = headings(text, blocks)
    spans = term_spans(_prose(text, blocks, inline))
    terms = frozenset(t for t, _, _ in spans)
    df, notes = stats(sorted(terms)) if stats is not None and terms else ({}, 0)
    entities = [
        *distinctive_terms(spans, df, notes, title, [h.name for h in heads]),
        *code_identifiers(text, blocks, inline),
        *tags(tag_names),
        *heads,
        *links(text, blocks, inline),
    ]
    return Extraction(entities, terms)


def snippet(text: str, span: Span, width: int = SNIPPET) -> str:
    """The mention with a little context, on one line."""
    a, b = max(0, span.start - width), min(len(text), span.end + width)
    return ("…" if a else "") + " ".join(text[a:b].split()) + ("…" if b < len(text) else "")
