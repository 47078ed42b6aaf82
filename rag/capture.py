"""What a capture from chat is, and the note it becomes (no Leanote calls here: the
writing, the outbox and the retries are ``sync.writeback.capture``).

A capture is kept per person (``telegram:111``, ``discord:222``) and per Leanote user.
It becomes a Markdown note: the title from the first line (its ``#hashtags`` left out), ``#hashtags`` as tags
(besides ``capture.tags``), the text, and for a forwarded message where it came from.
Every note or appended block we write ends with a marker line, an HTML comment holding
the capture's key: Leanote's Markdown view hides it, the indexer drops it, and after a
crash between Leanote's write and our acknowledgement it tells us the write happened.

Markdown: the person's own words stay their Markdown, as they typed them. Everything else
put into the note is shown as written (``md_escape``): someone else's text (a forward, a
saved message, ``Quote``), names and chat titles, file names, the question and the cited
titles of a saved answer. A file named ``a](javascript:…) [b`` stays that name, never a link.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from rag.language import label, say

TITLE_CHARS = 60
MARKER = "<!-- leanote-rag:{key} -->"
MARKER_RE = re.compile(r"<!-- leanote-rag:([A-Za-z0-9_-]+) -->")
# A hashtag: '#' after a space or at the start, then letters, digits, CJK, '_' or '-';
# not '# heading' (a space after it), not a URL's fragment, not '#1' alone.
_HASHTAG = re.compile(r"(?:(?<=\s)|^)#([^\s#.,，。!！?？:：;；()（）\[\]{}<>\"'`]+)", re.M)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")

KINDS = ("note", "append", "remember", "save")
AUDIO_SUFFIXES = (".ogg", ".oga", ".opus", ".mp3", ".m4a", ".wav", ".flac", ".aac")
# What can start Markdown (or HTML) inside a line, and at the start of one (headings, quotes,
# lists, rules, setext underlines): backslash-escaped, as CommonMark allows for any ASCII punctuation.
_INLINE_MARKUP = re.compile(r"[\\`*_\[\]()<>!~|&{}]")
_LINE_MARKUP = re.compile(r"^([ \t]*)(?:([#>+=-])|(\d+)([.)]))", re.M)
_SAFE_LINK = re.compile(r"^https?://[^\s<>()\\]+$")


def md_escape(text: str) -> str:
    """``text`` as Markdown that shows exactly this text: no link, emphasis, heading, list or HTML."""
    text = _INLINE_MARKUP.sub(lambda m: "\\" + m[0], text)
    return _LINE_MARKUP.sub(lambda m: m[1] + ("\\" + m[2] if m[2] else m[3] + "\\" + m[4]), text)


def md_label(text: str) -> str:
    """A link's (or image's) label: shown as written, on one line."""
    return md_escape(" ".join(str(text).split()))


def md_url(url: str) -> str:
    """A link target that stays one: the characters that would end it percent-encoded."""
    return "".join(f"%{ord(c):02X}" if c in "()<> \t\n\r\\" else c for c in url)


@dataclass(frozen=True)
class Origin:
    """Where a forwarded message came from."""

    who: str = ""  # the original sender's name, or the channel's title
    chat: str = ""  # the chat it was forwarded from
    when: datetime | None = None
    link: str = ""  # a link to the original when the chat is public

    def line(self) -> str:
        """The line under a forward, as Markdown: names and titles as written, the link if it is a web link."""
        who = " ".join(self.who.split())
        chat = " ".join(self.chat.split())
        parts = [p for p in (md_escape(who), chat and f"「{md_escape(chat)}」",
                             self.when and self.when.strftime("%Y-%m-%d %H:%M")) if p]
        text = " · ".join(parts) or "?"
        link = self.link if _SAFE_LINK.match(self.link or "") else ""
        return f"转发自 / Forwarded from: {text}" + (f" — {link}" if link else "")


@dataclass(frozen=True)
class Quote:
    """Someone else's text in a capture (a forwarded or saved message): shown as they wrote
    it. ``markdown``: the same text as Markdown when the bot knows more (its hidden links);
    by default the text escaped."""

    text: str
    markdown: str = ""

    def body(self) -> str:
        return self.markdown or md_escape(self.text)


@dataclass(frozen=True)
class Attachment:
    """A file sent with a capture: an image goes inline, anything else is attached."""

    filename: str
    data: bytes
    mime: str = "application/octet-stream"

    @property
    def is_image(self) -> bool:
        return self.mime.startswith("image/")

    @property
    def is_audio(self) -> bool:
        """A voice message or an audio file (by its type, or its name when the type says nothing)."""
        return self.mime.startswith("audio/") or (
            self.mime in ("application/octet-stream", "") and self.filename.lower().endswith(AUDIO_SUFFIXES))


@dataclass
class Receipt:
    """What became of a capture, for the reply in chat."""

    status: str  # "written" | "queued" | "refused"
    message: str
    note_id: str = ""
    url: str = ""
    key: str = ""
    again: bool = False  # the capture was made before (the same message again): nothing new was written


@dataclass
class Draft:
    title: str
    content: str
    tags: list[str] = field(default_factory=list)


def hashtags(text: str) -> list[str]:
    """The ``#tags`` of a text, in order, once each; code is not looked into."""
    plain = _INLINE_CODE.sub(" ", _FENCE.sub(" ", text))
    out: list[str] = []
    for tag in _HASHTAG.findall(plain):
        tag = tag.strip("-_")
        if tag and not tag.isdigit() and tag not in out:
            out.append(tag)
    return out


def title_of(text: str) -> str:
    """The first line with words in it, without Markdown's heading or list marks and without
    its ``#tags`` (they become the note's tags), cut short."""
    for line in text.splitlines():
        line = re.sub(r"^\s*(#{1,6}\s+|[-*+>]\s+|\d+[.)]\s+)", "", line).strip()
        line = " ".join(_HASHTAG.sub(" ", MARKER_RE.sub("", line)).split())
        if re.search(r"\w", line):
            return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"
    return ""


def compose(text: str, *, extra_tags: list[str] = (), origin: Origin | None = None, title: str = "",
            when: datetime | None = None, quote: Quote | None = None) -> Draft:
    """The note a capture becomes: Markdown, the title from the first line (or the one
    given), ``#hashtags`` and ``extra_tags`` as tags, the origin of a forward below.
    ``text``: the person's own words (their Markdown, kept); ``quote``: someone else's
    text after them (shown as written)."""
    text = text.strip()
    quoted = quote.text.strip() if quote is not None else ""
    title = (title.strip() or title_of(text) or title_of(quoted)
             or f"Captured {(when or datetime.now()).strftime('%Y-%m-%d %H:%M')}")
    body = "\n\n".join(part for part in (text, quote.body().strip() if quoted else "") if part)
    if origin is not None:
        body += f"\n\n> {origin.line()}"
    tags = list(dict.fromkeys([*hashtags(text), *hashtags(quoted), *extra_tags]))
    return Draft(title, body.lstrip("\n") + "\n", tags)


def with_marker(content: str, key: str) -> str:
    """Content ending with the marker of capture ``key`` on a line of its own."""
    return content.rstrip("\n") + "\n\n" + MARKER.format(key=key) + "\n"


def has_marker(content: str, key: str) -> bool:
    return MARKER.format(key=key) in (content or "")


def answer_note(question: str, answer: str, citations: list[dict]) -> str:
    """A saved answer as Markdown: the question, the answer, its sources as links."""
    asked = say(question, "问", "Q")
    lines = [f"**{asked}:** {md_escape(' '.join(question.split()))}", "", answer.strip(), ""]
    if citations:
        lines.append(f"{label(question, 'sources')}:")
        for c in citations:
            n = c.get("n")
            mark = f"[{n}] " if n else ""
            title = md_label(c.get("title") or c.get("note_id") or "note")
            lines.append(f"- {mark}[{title}]({md_url(c['url'])})" if c.get("url") else f"- {mark}{title}")
    return "\n".join(lines).rstrip() + "\n"


def recognised(filename: str, lines: list[str]) -> str:
    """The text read from an image, for under it in the note: marked as read by the machine
    (never taken for the person's words), each line shown as written, searchable and citable."""
    head = (f"**图中文字（机器识别，可能有误） / Recognised text** — {md_label(filename)} "
            f"(read on the server by OCR; may contain errors):")
    return head + "\n\n" + "\n>\n".join("> " + md_escape(line) for line in lines if line.strip()) + "\n"


VOICE_MARK = "_🎙 由语音转写（机器识别，可能有误） / Transcribed from the voice message (may contain errors)_"
