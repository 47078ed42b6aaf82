"""Answers rendered for each platform. The core returns Markdown and citations; this
module only translates them to what Telegram and Discord display.

Telegram: the Markdown answer goes through markdown-it (so everything from the
notes is escaped by a real renderer) and is reduced to the HTML subset Telegram
accepts; messages over 4,096 characters are split between Markdown blocks, a code
block that alone is too long between its lines, so no tag or fence is ever broken.
Discord: Markdown as it is, sources as lines with ``<url>`` (no embeds of links),
embeds kept within Discord's limits.

The answer's text came from the LLM, which may have copied an address from a note that
tells it to (a web page clipped into Leanote, a shared note), or made one up. So every
URL-like or mention-like token in it (``https://…``, ``www.…``, a bare ``example.com/…``,
``t.me/…``, ``@name``, an email) is shown inert: in code style, which neither Telegram nor
Discord turns into a link, and as ``<code>`` in the API's HTML; a Markdown link the LLM
wrote shows its words and then its address, inert. The one exception is a link the cited
passage itself holds (``Citation.links``, ``rag.answer.links``): it is shown as that
note's link, with the note's own words for it, not the LLM's, unless those words name
another host than it goes to (``links.misleading``): then the words are text and the real
address is the link, on every door (``_Style.link``, ``discord_plain_links``). A web address
the note's words write out is a link where those words are shown (passages, the quote). The
sources (the notes' own addresses, made by the answer service) are links; a file's path
(``file://``) is text in Discord, which opens no such link. A token split by formatting
(``evil**.com**``) is found in the text as it reads, and shown inert whole.
"""

from __future__ import annotations

import html
import os
import re
from urllib.parse import unquote, urlsplit

from bs4 import BeautifulSoup, NavigableString, Tag

from rag.answer import links as note_links
from rag.index.excerpt import open_fence
from rag.language import say

from bot.splitting import markdown_parser, split_markdown

TELEGRAM_LIMIT = 4096
DISCORD_DESCRIPTION = 4096  # an embed's description; a message's embeds stay under 6,000 in all
DISCORD_CONTENT = 2000

_INLINE = {"b": "b", "strong": "b", "i": "i", "em": "i", "s": "s", "del": "s", "u": "u", "code": "code"}


_CONTAINERS = {"ul", "ol", "table", "thead", "tbody", "tr", "blockquote", "[document]"}
_URL = re.compile(r"(?:https?|ftp)://[^\s<>\"'`）)\]】，。]+", re.I)
_INLINE_TAGS = {"b", "strong", "i", "em", "s", "del", "u", "code", "a", "br", "img", "span"}
_END_PUNCT = ".,;:!?)]}'\"。，；：！？）】》」…"
_ASCII = r"A-Za-z0-9"
# What Telegram (and a browser, a terminal) may turn into a link or a mention: emails, any
# scheme's address, www., a bare domain (with a port and a path), an @name.
_LINKLIKE = re.compile(
    rf"(?P<email>(?<![{_ASCII}._%+-])[{_ASCII}._%+-]+@(?:[{_ASCII}](?:[{_ASCII}-]{{0,61}}[{_ASCII}])?\.)+[A-Za-z]{{2,24}})"
    rf"|(?P<url>(?<![{_ASCII}])(?:[A-Za-z][A-Za-z0-9+.-]{{1,15}}://|mailto:|tg:|www\.)[^\s<>\"'`\x00\u3000-\u303f\uff01-\uff0f\uff1a-\uff20]+)"
    rf"|(?P<domain>(?<![{_ASCII}@._/-])(?:[{_ASCII}](?:[{_ASCII}-]{{0,61}}[{_ASCII}])?\.)+(?:[A-Za-z]{{2,24}}|xn--[{_ASCII}-]+)"
    rf"(?![{_ASCII}-])(?::\d{{1,5}})?(?:/[^\s<>\"'`\x00\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\u3400-\u9fff]*)?)"
    rf"|(?P<mention>(?<![{_ASCII}_@/])@[A-Za-z0-9_]{{2,32}})")


def linklike(text: str):
    """(start, end) of each URL-like or mention-like token in ``text``, trailing punctuation left out."""
    for m in _LINKLIKE.finditer(text):
        start, end = m.span()
        while end > start + 1 and text[end - 1] in _END_PUNCT:
            end -= 1
        yield start, end


class NoteLinks:
    """The links the cited passages hold (``Citation.links``), by address (``links.key``)."""

    def __init__(self, citations=()):
        self.by_key: dict[str, dict] = {}
        for c in citations or ():
            for link in getattr(c, "links", None) or ():
                self.by_key.setdefault(note_links.key(link["url"]), link)

    def find(self, address: str, bare: bool = False) -> dict | None:
        """The note's link to ``address``; one the note only writes out (``"bare"``) only when
        ``bare``: where the text shows it as a link (``links.linked`` made the note's words so)."""
        link = self.by_key.get(note_links.key(address)) if self.by_key else None
        return link if link is not None and (bare or not link.get("bare")) else None


NO_LINKS = NoteLinks()


class SourceLinks:
    """The sources' links while an answer is written: none until the sources are found, then the
    links their passages hold and their own web addresses (what a partial answer may show as links)."""

    def __init__(self):
        self.links, self.web = NO_LINKS, set()

    def found(self, citations) -> None:
        self.links = NoteLinks(citations)
        self.web = {c.url for c in citations if _web(c.url)}


def _web(url: str) -> bool:
    return url.lower().startswith(("http://", "https://"))


class _Style:
    """How inline text is written for one door: Telegram's HTML subset or the web's."""

    tags = {"b": "b", "strong": "b", "i": "i", "em": "i", "s": "s", "del": "s", "u": "u"}
    rel = ""

    def text(self, value: str) -> str:
        return html.escape(value, quote=False)

    def inert(self, value: str) -> str:
        return f"<code>{html.escape(value, quote=False)}</code>"

    def words(self, value: str) -> str:
        """Words shown as text: escaped, every link-like token in them inert."""
        out, last = [], 0
        for start, end in linklike(value):
            out += [self.text(value[last:start]), self.inert(value[start:end])]
            last = end
        out.append(self.text(value[last:]))
        return "".join(out)

    def anchor(self, url: str, inner: str) -> str:
        return f'<a href="{html.escape(url)}"{self.rel}>{inner}</a>'

    def link(self, link: dict, token: str) -> str:
        """A link the note holds: a link with the note's words (web addresses); when the words
        name another host than it goes to (``links.misleading``), the words as text and the
        real address as the link; else (no web address) its words and address, inert."""
        words = " ".join(str(link.get("text") or link["url"]).split())
        if not _web(link["url"]):
            return f"{self.words(words)} ({self.inert(token)})"
        if note_links.misleading(link):
            return f"{self.words(words)} (→ {self.anchor(link['url'], self.text(link['url']))})"
        return self.anchor(link["url"], self.text(words))


class _WebStyle(_Style):
    tags = {"b": "strong", "strong": "strong", "i": "em", "em": "em", "s": "del", "del": "del", "u": "u"}
    rel = ' rel="nofollow noopener noreferrer"'


TELEGRAM, WEB = _Style(), _WebStyle()


def _inline(nodes, links: NoteLinks, style: _Style) -> str:
    """A run of inline nodes (text, emphasis, code, links) as the door's HTML, every
    link-like token inert or, when the cited passage holds it, that note's link. Tokens are
    found in the text as it reads, across emphasis; code and links break them."""
    atoms: list[tuple[str, str, tuple[str, ...]]] = []  # ("text" | "raw", value, formatting)

    def walk(node, fmt: tuple[str, ...]) -> None:
        if isinstance(node, NavigableString):
            atoms.append(("text", str(node), fmt))
            return
        if not isinstance(node, Tag):
            return
        name = node.name
        if name == "code":
            atoms.append(("raw", style.inert(node.get_text()), fmt))
        elif name == "br":
            atoms.append(("text", "\n", fmt))
        elif name in ("a", "img"):
            href = node.get("href" if name == "a" else "src", "") or ""
            words = node.get_text() if name == "a" else (node.get("alt") or "")
            held = links.find(href, bare=True) if href else None
            if held is not None:  # the note's own link, in its words
                atoms.append(("raw", style.link(held, href), fmt))
            elif not href or words.strip() in ("", href):
                atoms.append(("raw", style.inert(href or words), fmt) if href or words.strip() else ("text", "", fmt))
            else:  # the words, then the address in plain sight
                for child in (node.children if name == "a" else [NavigableString(words)]):
                    walk(child, fmt)
                atoms.append(("text", " (", fmt))
                atoms.append(("raw", style.inert(href), fmt))
                atoms.append(("text", ")", fmt))
        elif name in style.tags:
            tag = style.tags[name]
            for child in node.children:
                walk(child, fmt + ((tag,) if tag not in fmt else ()))
        else:
            for child in node.children:
                walk(child, fmt)

    for node in nodes:
        walk(node, ())
    flat = "".join(value if kind == "text" else "\x00" for kind, value, _ in atoms)
    tokens = list(linklike(flat))

    def wrap(value: str, fmt: tuple[str, ...]) -> str:
        return "".join(f"<{t}>" for t in fmt) + value + "".join(f"</{t}>" for t in reversed(fmt))

    out: list[str] = []
    pos, t = 0, 0
    for kind, value, fmt in atoms:
        if kind == "raw":
            out.append(wrap(value, fmt))
            pos += 1
            continue
        i = 0
        while i < len(value):
            at = pos + i
            while t < len(tokens) and tokens[t][1] <= at:
                t += 1
            if t < len(tokens) and tokens[t][0] <= at:  # inside a token: it is written whole at its end
                start, end = tokens[t]
                take = min(len(value), end - pos)
                if end <= pos + len(value):
                    token = flat[start:end]
                    held = links.find(token) if token[0] != "@" else None
                    out.append(style.link(held, token) if held is not None else style.inert(token))
                i = take
                continue
            stop = min(len(value), tokens[t][0] - pos) if t < len(tokens) else len(value)
            out.append(wrap(style.text(value[i:stop]), fmt) if value[i:stop] else "")
            i = stop
        pos += len(value)
    return "".join(out)


def _escaped_text(text: str, in_code: bool) -> str:
    """Text escaped for Telegram HTML; web addresses in code style, which Telegram does
    not turn into links."""
    if in_code:
        return html.escape(text, quote=False)
    return _inline([NavigableString(text)], NO_LINKS, TELEGRAM)


def _tg(node, out: list[str], links: NoteLinks = NO_LINKS) -> None:
    run: list = []  # inline nodes waiting to be written together (tokens may span them)

    def flush() -> None:
        if run:
            out.append(_inline(run, links, TELEGRAM))
            run.clear()

    for child in node.children:
        if isinstance(child, NavigableString):
            if node.name in _CONTAINERS and not str(child).strip():
                continue  # the renderer's newlines between blocks
            run.append(child)
            continue
        if not isinstance(child, Tag):
            continue
        name = child.name
        if name in _INLINE_TAGS and not (name == "code" and child.parent is not None and child.parent.name == "pre"):
            run.append(child)
            continue
        flush()
        if name == "pre":
            code = child.find("code")
            lang = ""
            if code is not None:
                lang = next((c[9:] for c in code.get("class", []) if c.startswith("language-")), "")
            text = html.escape(child.get_text(), quote=False).rstrip("\n")
            attr = f' class="language-{html.escape(lang)}"' if lang else ""
            out.append(f"<pre><code{attr}>{text}</code></pre>\n\n")
        elif name in ("h1", "h2", "h3", "h4", "h5", "h6"):
            inner = []
            _tg(child, inner, links)
            out.append(f"<b>{''.join(inner).strip()}</b>\n\n")
        elif name == "li":
            inner = []
            _tg(child, inner, links)
            out.append("• " + "".join(inner).strip() + "\n")
        elif name in ("ul", "ol"):
            _tg(child, out, links)
            out.append("\n")
        elif name == "blockquote":
            inner = []
            _tg(child, inner, links)
            out.append(f"<blockquote>{''.join(inner).strip()}</blockquote>\n\n")
        elif name == "p":
            _tg(child, out, links)
            out.append("\n\n")
        elif name == "hr":
            out.append("——\n\n")
        elif name in ("tr",):
            cells = []
            for cell in child.find_all(["td", "th"]):
                inner = []
                _tg(cell, inner, links)
                cells.append("".join(inner).strip())
            out.append(" | ".join(cells) + "\n")
        elif name == "table":
            _tg(child, out, links)
            out.append("\n")
        else:
            _tg(child, out, links)
    flush()


def telegram_html(markdown: str, links: NoteLinks = NO_LINKS) -> str:
    """Markdown -> the HTML subset Telegram's parse_mode=HTML accepts, all text escaped, every
    link-like token inert but the links the cited passages hold (``links``)."""
    soup = BeautifulSoup(markdown_parser().render(markdown), "html.parser")
    out: list[str] = []
    _tg(soup, out, links)
    return re.sub(r"\n{3,}", "\n\n", "".join(out)).strip()


def telegram_plain(text: str, links: NoteLinks = NO_LINKS, web: set[str] = frozenset()) -> str:
    """Text shown as it is (an answer as it streams, its Markdown not read yet) as Telegram
    HTML: escaped, every link-like token inert but the links the passages read hold
    (``links``) and the addresses in ``web`` (the sources' own), which stay links. An entity the
    text writes (``&gt;``, copied from a note) reads as the final answer's Markdown reads it: as
    its character, outside code (where it stays as written)."""
    text = _entities(text)
    out, last = [], 0
    for start, end in linklike(text):
        out.append(html.escape(text[last:start], quote=False))
        token = text[start:end]
        held = links.find(token) if token[0] != "@" else None
        if token in web:
            out.append(f'<a href="{html.escape(token)}">{html.escape(token, quote=False)}</a>')
        elif held is not None:
            out.append(TELEGRAM.link(held, token))
        else:
            out.append(TELEGRAM.inert(token))
        last = end
    out.append(html.escape(text[last:], quote=False))
    return "".join(out)


_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")


def _entities(text: str) -> str:
    """Complete HTML entities outside code as their characters, as CommonMark reads them."""
    parts = _CODE_SPANS.split(text)
    for i in range(0, len(parts), 2):  # the even parts are outside code
        parts[i] = _ENTITY.sub(lambda m: html.unescape(m.group()), parts[i])
    return "".join(parts)


def web_html(markdown: str, links: NoteLinks = NO_LINKS) -> str:
    """The answer's Markdown as HTML for a web page (the API's ``answer`` event): everything
    from the notes escaped, no raw HTML, no images; every link-like token inert but the links
    the cited passages hold, which open as that note's link (``rel="nofollow noopener"``)."""
    soup = BeautifulSoup(markdown_parser().render(markdown), "html.parser")
    out: list[str] = []
    _web_blocks(soup, out, links)
    return "".join(out).strip()


_WEB_BLOCKS = {"p", "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "table", "thead", "tbody",
               "tr", "th", "td"}


def _web_blocks(node, out: list[str], links: NoteLinks) -> None:
    run: list = []

    def flush() -> None:
        if run:
            out.append(_inline(run, links, WEB))
            run.clear()

    for child in node.children:
        if isinstance(child, NavigableString):
            if str(child).strip() or node.name not in _CONTAINERS:
                run.append(child)
            continue
        if not isinstance(child, Tag):
            continue
        name = child.name
        if name in _INLINE_TAGS:
            run.append(child)
            continue
        flush()
        if name == "pre":
            code = child.find("code")
            lang = next((c[9:] for c in (code.get("class", []) if code is not None else []) if c.startswith("language-")), "")
            attr = f' class="language-{html.escape(lang)}"' if lang else ""
            out.append(f"<pre><code{attr}>{html.escape(child.get_text(), quote=False)}</code></pre>\n")
        elif name == "hr":
            out.append("<hr>\n")
        elif name in _WEB_BLOCKS:
            out.append(f"<{name}>")
            _web_blocks(child, out, links)
            out.append(f"</{name}>\n" if name not in ("li", "th", "td") else f"</{name}>")
        else:
            _web_blocks(child, out, links)
    flush()


def telegram_messages(markdown: str, sources: str = "", limit: int = TELEGRAM_LIMIT,
                      links: NoteLinks = NO_LINKS) -> list[str]:
    """The answer (and its sources, already HTML) as Telegram HTML messages within the limit."""
    parts = [telegram_html(p, links)
             for p in split_markdown(markdown, limit, measure=lambda m: len(telegram_html(m, links)))]
    if sources:
        if len(parts[-1]) + 2 + len(sources) <= limit:
            parts[-1] = f"{parts[-1]}\n\n{sources}"
        else:
            parts.append(sources[:limit])
    return parts


def file_place(url: str, root=None) -> str:
    """A note file's ``file://`` address as a person reads it: its path in the notes folder
    (``root``) when it is there, else the whole path; "" for any other address."""
    if not url.lower().startswith("file://"):
        return ""
    path = unquote(urlsplit(url).path)
    if root is not None:
        for base in {str(root).rstrip("/"), os.path.realpath(root).rstrip("/")}:
            if path.startswith(base + "/"):
                return path[len(base) + 1:]
    return path


def notes_root(settings):
    """The folder of notes whose files the sources name by their path in it (a files source), or None."""
    return settings.source.path if settings.source.kind == "files" else None


def shown_link(url: str, root=None) -> str:
    """A note's address as a message shows it: a note file by its path in the notes folder
    (no phone opens the server's ``file://`` address), any other as it is."""
    return file_place(url, root) or url


def telegram_sources(citations, title: str = "来源", root=None) -> str:
    """Sources as lines: a web address as the title's link; a note file (Telegram opens no
    ``file://`` link) by its path in the folder ``root``, in code style (copied with a tap)."""
    lines = []
    for c in citations:
        label = html.escape(c.label, quote=False)
        place = file_place(c.url, root)
        if c.url.startswith(("http://", "https://")):
            lines.append(f'[{c.n}] <a href="{html.escape(c.url)}">{label}</a>')
        elif place:
            lines.append(f"[{c.n}] {label} — <code>{html.escape(place, quote=False)}</code>")
        else:
            lines.append(f"[{c.n}] {label}")
    return f"<b>{title}</b>\n" + "\n".join(lines) if lines else ""


# Discord opens no file:// link: a Markdown folder's note is named by its path, and this says why.
DISCORD_FILES = ("（笔记文件在服务器上，Discord 打不开 file:// 链接）", "(note files on the server: Discord opens no file:// links)")


def discord_sources(citations, title: str = "来源", question: str = "", root=None) -> str:
    """Sources as lines, each web link in <> so Discord shows no preview; a file's path (in the
    notes folder ``root``) as text (Discord opens no ``file://`` link), with a line saying so in
    the question's language."""
    if not citations:
        return ""
    lines, files = [], False
    for c in citations:
        if _web(c.url):
            where = f" <{c.url}>"
        elif c.url.lower().startswith("file://"):
            files = True
            where = f" — {discord_escape(file_place(c.url, root))}"
        else:
            where = f" {_TICK}{c.url}{_TICK}" if c.url else ""
        lines.append(f"[{c.n}] {discord_escape(c.label)}{where}")
    return f"**{title}**\n" + "\n".join(lines + ([f"*{say(question, *DISCORD_FILES)}*"] if files else []))


def discord_escape(text: str) -> str:
    """Text from notes shown as a label: no Markdown, no mentions."""
    text = re.sub(r"([*_`~|>\\[\]])", r"\\\1", text)
    return text.replace("@", "@\u200b")


def discord_pages(markdown: str, limit: int = DISCORD_DESCRIPTION) -> list[str]:
    return split_markdown(markdown, limit)


_CODE_SPANS = re.compile(r"(```[\s\S]*?(?:```|$)|`[^`\n]*`)")
_MD_LINK = r"!?\[(?P<words>[^\]\n]*)\]\(\s*<?(?P<href>[^)\s>]+)>?(?:\s+[\"'(][^)\n]*)?\)"
_AUTOLINK = r"<(?P<auto>(?:https?|ftp|mailto|tg):[^>\s]+)>"
_LINKS = re.compile(f"{_MD_LINK}|{_AUTOLINK}", re.I)
_EMPHASIS = "*~"  # (an underscore inside a word is no emphasis, and @names and addresses hold them)
_DISCORD_MENTION = re.compile(r"<(?:@[!&]?|#)\d+>|@(?:everyone|here)\b")


def discord_plain_links(markdown: str, links: NoteLinks = NO_LINKS, web: set[str] = frozenset()) -> str:
    """The answer's Markdown for Discord with no link the cited passages do not hold:
    ``[words](url)`` becomes "words (`url`)", autolinks, addresses, domains, emails and
    ``@names`` become `code` (a token split by emphasis markers whole, without them), and a
    link a cited passage holds becomes ``[the note's words](<url>)``; the addresses in ``web``
    (the sources' own, as an answer streams) stay links, ``<url>``. Code spans and blocks are
    left as they are."""
    def held(link: dict, token: str) -> str:  # as _Style.link
        words = " ".join(str(link.get("text") or link["url"]).split())
        if not _web(link["url"]):
            return f"{_discord_words(words)} ({_TICK}{token}{_TICK})"
        if note_links.misleading(link):
            return f"{_discord_words(words)} (→ <{link['url']}>)"
        if words == link["url"]:
            return f"<{words}>"
        return f"[{discord_escape(words)}](<{link['url']}>)"

    def link(m: re.Match) -> list[tuple[bool, str]]:
        url = m.group("href") or m.group("auto")
        words = (m.group("words") or "").strip()
        found = links.find(url, bare=True)
        if found is not None:
            return [(False, held(found, url))]
        if words and words != url:
            return [(True, f"{m.group('words')} ("), (False, f"{_TICK}{url}{_TICK}"), (True, ")")]
        return [(False, f"{_TICK}{url}{_TICK}")]

    def tokens(text: str) -> str:
        # emphasis markers out of the text as it reads, so evil**.com** is found whole
        where = [i for i, ch in enumerate(text) if ch not in _EMPHASIS]
        plain = "".join(text[i] for i in where)
        out, last = [], 0
        for start, end in linklike(plain):
            a, b = where[start], where[end - 1] + 1
            if any(ch in _EMPHASIS for ch in text[a:b]):  # split by markers: their closing ones go too
                while b < len(text) and text[b] in _EMPHASIS:
                    b += 1
            token = plain[start:end]
            found = links.find(token) if token[0] != "@" else None
            out.append(_DISCORD_MENTION.sub(lambda m: f"{_TICK}{m.group(0)}{_TICK}", text[last:a]))
            if token in web:
                out.append(f"<{token}>")
            else:
                out.append(held(found, token) if found is not None else f"{_TICK}{token}{_TICK}")
            last = b
        out.append(_DISCORD_MENTION.sub(lambda m: f"{_TICK}{m.group(0)}{_TICK}", text[last:]))
        return "".join(out)

    parts = _CODE_SPANS.split(markdown)
    for i in range(0, len(parts), 2):  # the even parts are outside code
        pieces: list[tuple[bool, str]] = []  # (still to look at, text)
        last = 0
        for m in _LINKS.finditer(parts[i]):
            pieces.append((True, parts[i][last:m.start()]))
            pieces += link(m)
            last = m.end()
        pieces.append((True, parts[i][last:]))
        parts[i] = "".join(tokens(text) if open_ else text for open_, text in pieces)
    return "".join(parts)


_TICK = "`"


def _discord_words(text: str) -> str:
    """Words shown as text in Discord: escaped, every link-like token in them in code."""
    out, last = [], 0
    for start, end in linklike(text):
        out += [discord_escape(text[last:start]), f"{_TICK}{text[start:end]}{_TICK}"]
        last = end
    out.append(discord_escape(text[last:]))
    return "".join(out)


def discord_tail(text: str, limit: int = DISCORD_CONTENT) -> str:
    """The end of a text that streams into one Discord message (its last ``limit`` characters,
    from a line's start where one is near): a code block it begins inside is opened again, so
    the code's closing fence does not open one that swallows the rest."""
    if len(text) <= limit:
        return text
    cut, head = len(text) - limit, ""
    for _ in range(3):
        line = text.find("\n", cut)
        if 0 <= line < cut + 200:
            cut = line + 1
        opener = open_fence(text, cut)
        head = "" if opener is None else opener[:200] + "\n"
        if len(head) + len(text) - cut <= limit:
            return head + text[cut:]
        cut = len(text) - limit + len(head)
    return (head + text[cut:])[-limit:]
