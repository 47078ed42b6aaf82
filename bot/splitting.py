"""Markdown cut into messages a platform takes: between top-level blocks, a block too long
alone between its lines (a code block fenced again in each part) or sentences, so no fence or
tag is ever broken. Pure text: ``bot.render`` measures the parts as each platform renders them."""

from __future__ import annotations

import re
from functools import lru_cache

from markdown_it import MarkdownIt


@lru_cache(maxsize=1)
def markdown_parser() -> MarkdownIt:
    """The one Markdown reading the doors share (tables and strikethrough, no raw HTML)."""
    return MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(["table", "strikethrough"])


def _blocks(markdown: str) -> list[str]:
    """Top-level Markdown blocks, in order, as source text (fences kept whole)."""
    tokens = markdown_parser().parse(markdown)
    lines = markdown.splitlines(keepends=True)
    blocks, last = [], 0
    for tok in tokens:
        if tok.level == 0 and tok.map and tok.nesting in (0, 1):
            start, end = tok.map
            if start >= last:
                blocks.append("".join(lines[start:end]).strip("\n"))
                last = end
    return [b for b in blocks if b.strip()] or [markdown]


def _split_block(block: str, limit: int) -> list[str]:
    """A block too long for one message: a fence between its lines (each part fenced
    again), prose between sentences or, failing that, anywhere."""
    fence = re.match(r"^(```+|~~~+)([^\n]*)\n", block)
    if fence:
        opener, closer = fence.group(0), fence.group(1)
        body = block[len(opener):]
        body = body[: body.rfind(closer)] if body.rstrip().endswith(closer) else body
        parts, current = [], ""
        for line in body.splitlines(keepends=True):
            if current and len(opener) + len(current) + len(line) + len(closer) + 1 > limit:
                parts.append(f"{opener}{current.rstrip(chr(10))}\n{closer}")
                current = ""
            current += line[: limit - len(opener) - len(closer) - 2]
        if current:
            parts.append(f"{opener}{current.rstrip(chr(10))}\n{closer}")
        return parts
    parts, current = [], ""
    for piece in re.split(r"(?<=[。！？.!?\n])", block):
        while len(piece) > limit:
            parts.append(piece[:limit])
            piece = piece[limit:]
        if len(current) + len(piece) > limit:
            parts.append(current)
            current = ""
        current += piece
    if current:
        parts.append(current)
    return parts


def split_markdown(markdown: str, limit: int, measure=len) -> list[str]:
    """Markdown cut between blocks so each part measures at most ``limit`` (measured
    after rendering when ``measure`` renders)."""
    parts: list[str] = []
    current = ""
    for block in _blocks(markdown):
        pieces = [block] if measure(block) <= limit else _split_block(block, limit // 2)
        for piece in pieces:
            candidate = f"{current}\n\n{piece}" if current else piece
            if current and measure(candidate) > limit:
                parts.append(current)
                candidate = piece
            current = candidate
    if current:
        parts.append(current)
    return parts
