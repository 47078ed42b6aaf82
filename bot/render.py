"""Answers rendered for each platform. The core returns Markdown and citations; this
module only translates them to what Telegram and Discord display.

Telegram: the Markdown answer goes through markdown-it (so everything from the
notes is escaped by a real renderer) and is reduced to the HTML subset Telegram
accepts; messages over 4,096 characters are split between Markdown blocks, a code
block that alone is too long between its lines, so no tag or fence is ever broken.
Discord: Markdown as it is, sources as lines with ``<url>`` (no embeds of links),
embeds kept within Discord's limits.

Only the links the answer service made (the sources) are clickable. A link in the
answer's text came from the LLM, which may have copied it from a note or made it
up: it is shown as plain text with its address visible, never as a link whose
target hides behind its words.
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
_URL = re.compile(r"(?:https?|ftp)://[^\s<>\"'`）)\]】，。]+", re.I)


def _escaped_text(text: str, in_code: bool) -> str:
    """Text escaped for Telegram HTML; web addresses in code style, which Telegram does
    not turn into links."""
    if in_code:
        return html.escape(text, quote=False)
    out, last = [], 0
    for m in _URL.finditer(text):
        out.append(html.escape(text[last : m.start()], quote=False))
        out.append(f"<code>{html.escape(m.group(0), quote=False)}</code>")
        last = m.end()
    out.append(html.escape(text[last:], quote=False))
    return "".join(out)


def _tg(node, out: list[str]) -> None:
    for child in node.children:
        if isinstance(child, NavigableString):
            if node.name in _CONTAINERS and not str(child).strip():
                continue  # the renderer's newlines between blocks
            out.append(_escaped_text(str(child), in_code=node.name == "code"))
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
        elif name == "a":  # never clickable: the words, then the address in plain sight
            words = child.get_text()
            href = child.get("href", "")
            if not href or words.strip() == href:
                out.append(_escaped_text(href or words, in_code=False) if _URL.fullmatch(href or words)
                           else html.escape(href or words, quote=False))
            else:
                out.append(f"{html.escape(words, quote=False)} (<code>{html.escape(href, quote=False)}</code>)")
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


_CODE_SPANS = re.compile(r"(```[\s\S]*?(?:```|$)|`[^`\n]*`)")
_MD_LINK = re.compile(r"!?\[([^\]\n]*)\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)\n]*)?\)")
_AUTOLINK = re.compile(r"<((?:https?|ftp)://[^>\s]+)>", re.I)


def discord_plain_links(markdown: str) -> str:
    """The answer's Markdown for Discord with no clickable link: ``[words](url)`` becomes
    "words (`url`)", autolinks and bare addresses become `url` (code is not linked).
    Code spans and blocks are left as they are."""
    parts = _CODE_SPANS.split(markdown)
    for i in range(0, len(parts), 2):  # the even parts are outside code
        text = parts[i]
        text = _MD_LINK.sub(lambda m: f"{m.group(1)} ({_TICK}{m.group(2)}{_TICK})" if m.group(1).strip()
                            and m.group(1).strip() != m.group(2) else f"{_TICK}{m.group(2)}{_TICK}", text)
        text = _AUTOLINK.sub(lambda m: f"{_TICK}{m.group(1)}{_TICK}", text)
        pieces = re.split(r"(`[^`\n]*`)", text)  # the addresses just put in code stay as they are
        for j in range(0, len(pieces), 2):
            pieces[j] = _URL.sub(lambda m: f"{_TICK}{m.group(0)}{_TICK}", pieces[j])
        parts[i] = "".join(pieces)
    return "".join(parts)


_TICK = "`"
