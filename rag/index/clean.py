"""Note body -> clean Markdown text, the text every chunk indexes into.

- Markdown notes lose a leading metadata header (``---`` / ``title:`` ... ``---``).
- Rich-text (TinyMCE HTML) notes become Markdown through markdownify, keeping
  headings, lists, tables and code blocks; ``<script>``, ``<style>``, ``<iframe>``
  and editor noise go.
- Images, and Leanote attachment links, become short placeholders (``[图片: alt]``,
  ``[附件: name]``): a URL carries nothing to search or answer from.
- Code blocks (fenced or indented) are kept byte-for-byte.
"""

from __future__ import annotations

import re
from functools import lru_cache

from markdown_it import MarkdownIt

IMAGE = "图片"
ATTACHMENT = "附件"

# Leanote's own file links, relative or absolute, and the desktop export's leanote:// form.
_FILE_PATH = (
    r"(?:api/file/getImage\?fileId=|file/outputImage\?fileId=|"
    r"api/file/getAttach\?fileId=|attach/download\?attachId=|"
    r"file/getImage\?fileId=|file/getAttach\?fileId=)"
)
_LEANOTE_URL = re.compile(
    r"(?:(?:https?://[^\s()<>\"']*?|leanote://)/?|/)" + _FILE_PATH + r"[0-9A-Za-z_-]*(?:&[^\s()<>\"']*)?"
)
_ATTACH_HINT = re.compile(r"getAttach|attach/download", re.I)

_MD_IMAGE = re.compile(r"!\[([^\]\n]{0,300})\]\(\s*<?([^()\s>]*(?:\([^()\s]*\))?[^()\s>]*)>?(?:\s+\"[^\"\n]*\")?\s*\)")
_MD_LINK_TO_FILE = re.compile(r"(?<!!)\[([^\]\n]{0,300})\]\(\s*(" + _LEANOTE_URL.pattern + r")(?:\s+\"[^\"\n]*\")?\s*\)")
_HTML_IMG = re.compile(r"<img\b[^>]*>", re.I)
_HTML_ATTR = re.compile(r"""\b(alt|title)\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.I)

_FRONT_MATTER = re.compile(r"\A\ufeff?---[ \t]*\n(.{0,4000}?)\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.S)
_YAML_KEY = re.compile(r"^[A-Za-z_][\w-]*[ \t]*:")

# Characters that carry nothing: zero-width, BOM, soft hyphen, C0/C1 controls but \t \n.
_INVISIBLE = re.compile("[\u200b\u200c\u200d\u2060\ufeff\u00ad\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SPACES = re.compile("[\u00a0\u2000-\u200a\u202f\u205f\u3000]")
_BLANK_LINES = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_TRAILING_WS = re.compile(r"[ \t]+\n")

_DROP_TAGS = ("script", "style", "iframe", "noscript", "object", "embed", "head", "title", "meta", "link")
_BRUSH = re.compile(r"brush\s*:\s*([\w#+-]+)", re.I)
_LANG_CLASS = re.compile(r"^(?:language|lang)-([\w#+-]+)$", re.I)


def placeholder(kind: str, label: str = "") -> str:
    label = " ".join(label.split())[:80]
    return f"[{kind}: {label}]" if label else f"[{kind}]"


def clean(content: str, is_markdown: bool) -> str:
    """The searchable Markdown text of a note body."""
    text = content.replace("\r\n", "\n").replace("\r", "\n")
    if is_markdown:
        return clean_markdown(strip_front_matter(text))
    return clean_markdown(html_to_markdown(text))


def strip_front_matter(text: str) -> str:
    """Drop a leading ``---`` metadata block whose lines look like YAML keys."""
    m = _FRONT_MATTER.match(text)
    if not m:
        return text
    first = next((line for line in m.group(1).splitlines() if line.strip()), "")
    if not _YAML_KEY.match(first):
        return text
    return text[m.end():]


# --- Markdown ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _md_parser() -> MarkdownIt:
    """Block structure only (what ``block_spans`` and the chunker read: top-level blocks, their
    lines, a heading's text): the inline pass (emphasis, links) is off. The same blocks, lines and
    texts as with it, and less time to clean and chunk a note."""
    return MarkdownIt("commonmark").enable("table").disable(["inline", "text_join"], ignoreInvalid=True)


def block_spans(text: str) -> list[tuple[int, int, str]]:
    """Top-level block ranges (char offsets) that need special treatment:
    ``code`` (fenced or indented code) and ``html`` (raw HTML blocks)."""
    tokens = _md_parser().parse(text)
    line_starts = [0]
    for m in re.finditer("\n", text):
        line_starts.append(m.end())
    line_starts.append(len(text))

    def offset(line: int) -> int:
        return line_starts[min(line, len(line_starts) - 1)]

    spans = []
    for tok in tokens:
        if tok.map is None or tok.level != 0:
            continue
        if tok.type in ("fence", "code_block"):
            spans.append((offset(tok.map[0]), offset(tok.map[1]), "code"))
        elif tok.type == "html_block":
            spans.append((offset(tok.map[0]), offset(tok.map[1]), "html"))
    return spans


def clean_markdown(text: str) -> str:
    """Tidy prose, turn images and file links into placeholders; code untouched."""
    out = []
    pos = 0
    for start, end, kind in block_spans(text):
        out.append(_clean_prose(text[pos:start]))
        block = text[start:end]
        if kind == "code":
            out.append(block)
        else:
            converted = html_to_markdown(block).strip("\n")
            out.append(_clean_prose(converted) + "\n\n" if converted.strip() else "\n")
        pos = end
    out.append(_clean_prose(text[pos:]))
    cleaned = "".join(out)
    return cleaned.strip("\n") + "\n" if cleaned.strip() else ""


def _clean_prose(text: str) -> str:
    if not text:
        return text
    text = _INVISIBLE.sub("", text)
    text = _SPACES.sub(" ", text)
    text = _MD_IMAGE.sub(lambda m: placeholder(IMAGE, m.group(1)), text)
    text = _MD_LINK_TO_FILE.sub(lambda m: placeholder(_file_kind(m.group(2)), m.group(1)), text)
    text = _HTML_IMG.sub(lambda m: placeholder(IMAGE, _attr_label(m.group(0))), text)
    text = _LEANOTE_URL.sub(lambda m: placeholder(_file_kind(m.group(0))), text)
    text = _TRAILING_WS.sub("\n", text)
    return _BLANK_LINES.sub("\n\n", text)


def _file_kind(url: str) -> str:
    return ATTACHMENT if _ATTACH_HINT.search(url) else IMAGE


def _attr_label(tag: str) -> str:
    for m in _HTML_ATTR.finditer(tag):
        value = m.group(2) if m.group(2) is not None else m.group(3)
        if value and value.strip():
            return value
    return ""


# --- HTML -------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _converter_class():
    """markdownify with Leanote's code-block dialects. Made on the first HTML note: a process
    with none (a search, a pass over unchanged notes) does not import BeautifulSoup and
    markdownify (~70 ms)."""
    from markdownify import MarkdownConverter

    class NoteConverter(MarkdownConverter):
        def convert_pre(self, el, text, parent_tags):
            # Take the code straight from the tree: byte-for-byte, whatever markdownify
            # would do to whitespace or markup inside it.
            code = el.get_text()
            if not code.strip():
                return ""
            fence = "```"
            while fence in code:
                fence += "`"
            lang = _code_language(el)
            return f"\n\n{fence}{lang}\n{code.rstrip(chr(10))}\n{fence}\n\n"

    return NoteConverter


def _code_language(pre) -> str:
    for el in (pre, pre.find("code")):
        if el is None:
            continue
        classes = el.get("class") or []
        joined = " ".join(classes)
        m = _BRUSH.search(joined)
        if m:
            return m.group(1).lower()
        for cls in classes:
            m = _LANG_CLASS.match(cls)
            if m:
                return m.group(1).lower()
    return ""


def html_to_markdown(html: str) -> str:
    from bs4 import BeautifulSoup, NavigableString

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup.find_all(_DROP_TAGS):
        tag.decompose()
    for img in soup.find_all("img"):
        label = img.get("alt") or img.get("title") or ""
        img.replace_with(NavigableString(placeholder(IMAGE, label)))
    for a in soup.find_all("a"):
        href = a.get("href") or ""
        if _LEANOTE_URL.search(href):
            a.replace_with(NavigableString(placeholder(_file_kind(href), a.get_text())))
    converter = _converter_class()(  # plain (unescaped) text
        heading_style="ATX",
        bullets="-",
        escape_asterisks=False,
        escape_underscores=False,
        escape_misc=False,
        strong_em_symbol="*",
    )
    return converter.convert_soup(soup)
