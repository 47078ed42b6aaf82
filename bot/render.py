"""Answers rendered for each platform. The core returns Markdown and citations; this
module only translates them to what Telegram and Discord display.

Telegram: the Markdown answer goes through markdown-it (so everything from the
notes is escaped by a real renderer) and is reduced to the HTML subset Telegram
accepts; messages over 4,096 characters are split between Markdown blocks, a code
block that alone is too long between its lines, so no tag or fence is ever broken.
Discord: Markdown as it is, sources as lines with ``<url>`` (no embeds of links),
embeds kept within Discord's limits.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache

from bs4 import BeautifulSoup, NavigableString, Tag
from markdown_it import MarkdownIt

TELEGRAM_LIMIT = 4096
DISCORD_DESCRIPTION = 4096  # an embed's description; a message's embeds stay under 6,000 in all
DISCORD_CONTENT = 2000

_INLINE = {"b": "b", "strong": "b", "i": "i", "em": "i", "s": "s", "del": "s", "u": "u", "code": "code"}


@lru_cache(maxsize=1)
def _md() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(["table", "strikethrough"])


_CONTAINERS = {"ul", "ol", "table", "thead", "tbody", "tr", "blockquote", "[document]"}


def _tg(node, out: list[str]) -> None:
    for child in node.children:
        if isinstance(child, NavigableString):
            if node.name in _CONTAINERS and not str(child).strip():
                continue  # the renderer's newlines between blocks
            out.append(html.escape(str(child), quote=False))
            continue
        if not isinstance(child, Tag):
            continue
        name = child.name
        if name == "pre":
            code = child.find("code")
            lang = ""
            if code is not None:
                lang = next((c[9:] for c in code.get("class", []) if c.startswith("language-")), "")
            text = html.escape(child.get_text(), quote=False).rstrip("\n")
            attr = f' class="language-{html.escape(lang)}"' if lang else ""
            out.append(f"<pre><code{attr}>{text}</code></pre>\n\n")
        elif name in _INLINE and not (name == "code" and child.parent is not None and child.parent.name == "pre"):
            tag = _INLINE[name]
            inner: list[str] = []
            _tg(child, inner)
            out.append(f"<{tag}>{''.join(inner)}</{tag}>")
        elif name == "a":
            inner = []
            _tg(child, inner)
            href = child.get("href", "")
            if href.startswith(("http://", "https://")):
                out.append(f'<a href="{html.escape(href)}">{"".join(inner)}</a>')
            else:
                out.append("".join(inner))
        elif name in ("h1", "h2", "h3", "h4", "h5", "h6"):
            inner = []
            _tg(child, inner)
            out.append(f"<b>{''.join(inner).strip()}</b>\n\n")
        elif name == "li":
            inner = []
            _tg(child, inner)
            out.append("• " + "".join(inner).strip() + "\n")
        elif name in ("ul", "ol"):
            _tg(child, out)
            out.append("\n")
        elif name == "blockquote":
            inner = []
            _tg(child, inner)
            out.append(f"<blockquote>{''.join(inner).strip()}</blockquote>\n\n")
        elif name == "p":
            _tg(child, out)
            out.append("\n\n")
        elif name == "br":
            out.append("\n")
        elif name == "hr":
            out.append("——\n\n")
        elif name in ("tr",):
            cells = []
            for cell in child.find_all(["td", "th"]):
                inner = []
                _tg(cell, inner)
                cells.append("".join(inner).strip())
            out.append(" | ".join(cells) + "\n")
        elif name == "table":
            _tg(child, out)
            out.append("\n")
        else:
            _tg(child, out)


def telegram_html(markdown: str) -> str:
    """Markdown -> the HTML subset Telegram's parse_mode=HTML accepts, all text escaped."""
    soup = BeautifulSoup(_md().render(markdown), "html.parser")
    out: list[str] = []
    _tg(soup, out)
    return re.sub(r"\n{3,}", "\n\n", "".join(out)).strip()


def _blocks(markdown: str) -> list[str]:
    """Top-level Markdown blocks, in order, as source text (fences kept whole)."""
    tokens = _md().parse(markdown)
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


def telegram_messages(markdown: str, sources: str = "", limit: int = TELEGRAM_LIMIT) -> list[str]:
    """The answer (and its sources, already HTML) as Telegram HTML messages within the limit."""
    parts = [telegram_html(p) for p in split_markdown(markdown, limit, measure=lambda m: len(telegram_html(m)))]
    if sources:
        if len(parts[-1]) + 2 + len(sources) <= limit:
            parts[-1] = f"{parts[-1]}\n\n{sources}"
        else:
            parts.append(sources[:limit])
    return parts


def telegram_sources(citations, title: str = "来源") -> str:
    lines = []
    for c in citations:
        label = html.escape(c.label, quote=False)
        if c.url.startswith(("http://", "https://")):
            lines.append(f'[{c.n}] <a href="{html.escape(c.url)}">{label}</a>')
        else:
            lines.append(f"[{c.n}] {label}")
    return f"<b>{title}</b>\n" + "\n".join(lines) if lines else ""


def discord_sources(citations, title: str = "来源") -> str:
    """Sources as lines, each link in <> so Discord shows no preview."""
    if not citations:
        return ""
    return f"**{title}**\n" + "\n".join(f"[{c.n}] {discord_escape(c.label)} <{c.url}>" for c in citations)


def discord_escape(text: str) -> str:
    """Text from notes shown as a label: no Markdown, no mentions."""
    text = re.sub(r"([*_`~|>\\[\]])", r"\\\1", text)
    return text.replace("@", "@\u200b")


def discord_pages(markdown: str, limit: int = DISCORD_DESCRIPTION) -> list[str]:
    return split_markdown(markdown, limit)
