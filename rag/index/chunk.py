"""Heading-aware chunking of a cleaned note.

The note is cut into sections at Markdown headings (each keeps its heading path
``H1 › H2 › H3``); tiny sections merge with a neighbour; long sections are packed
into chunks of about ``min_size``..``max_size`` units with a small overlap cut on
sentence boundaries. A fenced code block is never cut unless it alone exceeds
``code_hard_cap``, and then only between lines.

Sizes are in *units*: one per CJK character, one per three other visible
characters (so an English word of five letters plus a space is about two units,
and a line of code counts what it holds). Every chunk's ``text`` is exactly
``cleaned[char_start:char_end]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rag.index.clean import _md_parser
from rag.config import ChunkingConfig
from rag.model import Chunk

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_VISIBLE = re.compile(r"\S")
# A sentence ends after CJK or Latin end punctuation (and any closing quote), or at a newline.
_SENTENCE_END = re.compile(r"(?:[。！？!?；;…]+[”’」』）)\]]*|\.(?=\s)|\n+)")
_CLAUSE_END = re.compile(r"[，,、：:]|\s+")


def size(text: str) -> float:
    """Chunk-size units of a text (see module docstring)."""
    cjk = len(_CJK.findall(text))
    visible = len(_VISIBLE.findall(text))
    return cjk + (visible - cjk) / 3.0


@dataclass
class _Piece:
    start: int
    end: int
    units: float
    kind: str  # "heading", "code", "text"
    path: tuple[str, ...]
    block_units: float  # size of the whole block, on its first piece; 0 on the others


@dataclass
class _Block:
    start: int
    end: int
    kind: str  # "heading", "code", "text"
    level: int = 0
    title: str = ""
    path: tuple[str, ...] = ()
    units: float = 0.0


def chunk_text(text: str, cfg: ChunkingConfig | None = None) -> list[Chunk]:
    """Cut cleaned note text into chunks with heading paths and char ranges."""
    cfg = cfg or ChunkingConfig()
    if not text.strip():
        return []
    chunks: list[Chunk] = []
    for group in _groups(_blocks(text), cfg):
        for start, end, path in _pack(_pieces(group, text, cfg), cfg):
            chunks.append(Chunk(len(chunks), text[start:end], path, start, end))
    return chunks


# --- blocks and sections ------------------------------------------------------------------


def _blocks(text: str) -> list[_Block]:
    """Top-level Markdown blocks tiling the whole text, each with its heading path."""
    tokens = _md_parser().parse(text)
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def offset(line: int) -> int:
        return line_starts[line] if line < len(line_starts) else len(text)

    blocks: list[_Block] = []
    for i, tok in enumerate(tokens):
        if tok.level != 0 or tok.map is None or tok.nesting == -1:
            continue
        start, end = offset(tok.map[0]), offset(tok.map[1])
        if tok.type == "heading_open":
            title = tokens[i + 1].content.strip() if i + 1 < len(tokens) else ""
            blocks.append(_Block(start, end, "heading", int(tok.tag[1]), title))
        elif tok.type in ("fence", "code_block"):
            blocks.append(_Block(start, end, "code"))
        else:
            blocks.append(_Block(start, end, "text"))
    # Tile the text: gaps (blank lines) go to the block before them.
    tiled: list[_Block] = []
    pos = 0
    for block in blocks:
        if block.end <= pos:
            continue
        block.start = max(block.start, pos)
        if tiled:
            tiled[-1].end = block.start
        elif block.start > 0:
            tiled.append(_Block(0, block.start, "text"))
        tiled.append(block)
        pos = block.end
    if not tiled:
        tiled = [_Block(0, len(text), "text")]
    tiled[-1].end = len(text)

    stack: list[tuple[int, str]] = []
    for block in tiled:
        if block.kind == "heading":
            while stack and stack[-1][0] >= block.level:
                stack.pop()
            if block.title:
                stack.append((block.level, block.title))
        block.path = tuple(title for _, title in stack)
        block.units = size(text[block.start:block.end])
    return tiled


def _content(blocks: list[_Block]) -> float:
    return sum(b.units for b in blocks if b.kind != "heading")


def _groups(blocks: list[_Block], cfg: ChunkingConfig) -> list[list[_Block]]:
    """Sections (a heading and what follows it), with small ones merged into a
    neighbour: a section under min_size takes the next section in, and a small last
    section joins the one before it."""
    sections: list[list[_Block]] = []
    for block in blocks:
        if block.kind == "heading" or not sections:
            sections.append([block])
        else:
            sections[-1].append(block)
    groups: list[list[_Block]] = []
    for section in sections:
        if groups and _content(groups[-1]) < cfg.min_size:
            groups[-1].extend(section)
        else:
            groups.append(list(section))
    if len(groups) > 1 and _content(groups[-1]) < cfg.min_size:
        groups[-2].extend(groups.pop())
    return groups


# --- packing ------------------------------------------------------------------------------


def _pieces(group: list[_Block], text: str, cfg: ChunkingConfig) -> list[_Piece]:
    """A group's blocks, with over-long ones cut: prose at sentences, code between lines."""
    pieces: list[_Piece] = []
    whole = sum(b.units for b in group) <= cfg.max_size
    for block in group:
        # Prose is cut into sentences (chunk edges and overlap fall between them) unless
        # the whole group is one chunk anyway; code only when it alone passes the hard cap.
        keep = whole or block.units <= cfg.code_hard_cap if block.kind == "code" else whole
        if block.kind == "heading" or keep or block.units == 0:
            pieces.append(_Piece(block.start, block.end, block.units, block.kind, block.path, block.units))
            continue
        splitter = _split_lines if block.kind == "code" else _split_sentences
        for i, (start, end) in enumerate(splitter(text, block.start, block.end, cfg.max_size)):
            units = size(text[start:end])
            pieces.append(_Piece(start, end, units, block.kind, block.path, block.units if i == 0 else 0.0))
    return pieces


def _pack(pieces: list[_Piece], cfg: ChunkingConfig) -> list[tuple[int, int, tuple[str, ...]]]:
    """Greedy packing of pieces into chunks, with sentence overlap inside a section."""
    out: list[tuple[int, int, tuple[str, ...]]] = []
    emitted: list[list[_Piece]] = []
    current: list[_Piece] = []
    units = content = 0.0

    def emit() -> None:
        if any(p.kind != "heading" and p.units > 0 for p in current):
            emitted.append(current)

    for piece in pieces:
        after = units + piece.units
        # Overflow cuts, unless the chunk so far is small and the overflow is too.
        overflow = after > cfg.max_size and (content >= cfg.min_size or after > cfg.max_size + cfg.min_size)
        # Rather than start a paragraph that will not fit, end the chunk before it.
        soft_cut = content >= cfg.min_size and units + piece.block_units > cfg.max_size
        if content > 0 and (overflow or soft_cut):
            emit()
            current = _overlap(current, piece.path, cfg.overlap * cfg.max_size)
            if sum(p.units for p in current) + piece.units > cfg.max_size:
                current = []
            units = sum(p.units for p in current)
            content = sum(p.units for p in current if p.kind != "heading")
        current.append(piece)
        units += piece.units
        if piece.kind != "heading":
            content += piece.units
    emit()
    # A small tail joins the chunk before it when the two fit together.
    if len(emitted) > 1 and sum(p.units for p in emitted[-1]) < cfg.min_size:
        tail = [p for p in emitted[-1] if p.start >= emitted[-2][-1].end]
        if sum(p.units for p in emitted[-2] + tail) <= cfg.max_size + cfg.min_size / 2:
            emitted[-2:] = [emitted[-2] + tail]
    for chunk in emitted:
        # Trivial bits (an image placeholder, a rule) do not decide the heading path.
        paths = [p.path for p in chunk if p.kind != "heading" and p.units >= 5] or [
            p.path for p in chunk if p.kind != "heading"
        ]
        out.append((chunk[0].start, chunk[-1].end, _common_prefix(paths)))
    return out


def _common_prefix(paths: list[tuple[str, ...]]) -> tuple[str, ...]:
    prefix = paths[0]
    for path in paths[1:]:
        n = 0
        while n < min(len(prefix), len(path)) and prefix[n] == path[n]:
            n += 1
        prefix = prefix[:n]
    return prefix


def _overlap(previous: list[_Piece], path: tuple[str, ...], budget: float) -> list[_Piece]:
    """Trailing prose sentences of the previous chunk from the same section,
    worth about ``budget`` units."""
    tail: list[_Piece] = []
    used = 0.0
    for piece in reversed(previous):
        if piece.kind != "text" or piece.units == 0 or piece.path != path:
            break
        limit = budget if tail else 2 * budget  # a first sentence may run a little long
        if used + piece.units > limit:
            break
        tail.insert(0, piece)
        used += piece.units
    return tail


def _split_sentences(text: str, start: int, end: int, max_units: float) -> list[tuple[int, int]]:
    spans = []
    pos = start
    for m in _SENTENCE_END.finditer(text, start, end):
        if m.end() > pos:
            spans.append((pos, m.end()))
            pos = m.end()
    if pos < end:
        spans.append((pos, end))
    out = []
    for s, e in spans:
        if size(text[s:e]) <= max_units:
            out.append((s, e))
        else:
            out.extend(_split_long(text, s, e, max_units))
    return out


def _split_long(text: str, start: int, end: int, max_units: float) -> list[tuple[int, int]]:
    """A sentence longer than a chunk: cut after clauses or spaces, else anywhere."""
    out = []
    pos = start
    while pos < end:
        cut = _cut_point(text, pos, end, max_units)
        out.append((pos, cut))
        pos = cut
    return out


def _cut_point(text: str, start: int, end: int, max_units: float) -> int:
    """The furthest clause boundary within max_units of start, else a hard cut there."""
    units = 0.0
    limit = start
    best = None
    for i in range(start, end):
        ch = text[i]
        units += 1.0 if _CJK.match(ch) else (0.0 if ch.isspace() else 1 / 3)
        if units > max_units:
            break
        limit = i + 1
        if _CLAUSE_END.match(ch):
            best = i + 1
    if limit >= end:
        return end
    if best is not None and best > start + (limit - start) // 2:
        return best
    return max(limit, start + 1)


def _split_lines(text: str, start: int, end: int, max_units: float) -> list[tuple[int, int]]:
    """Cut an oversized code block between lines, each part up to max_units."""
    lines = []
    pos = start
    for m in re.finditer("\n", text[start:end]):
        lines.append((pos, start + m.end()))
        pos = start + m.end()
    if pos < end:
        lines.append((pos, end))
    out: list[tuple[int, int]] = []
    cur_start, cur_units = None, 0.0
    for s, e in lines:
        u = size(text[s:e])
        if u > max_units:  # one giant line: cut it like prose
            if cur_start is not None:
                out.append((cur_start, s))
                cur_start, cur_units = None, 0.0
            out.extend(_split_long(text, s, e, max_units))
            continue
        if cur_start is not None and cur_units + u > max_units:
            out.append((cur_start, s))
            cur_start, cur_units = None, 0.0
        if cur_start is None:
            cur_start = s
        cur_units += u
    if cur_start is not None:
        out.append((cur_start, end))
    return out
