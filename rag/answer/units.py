"""A reply cut into units, each judged on its own by ``rag.answer.support``: each fenced code block
whole, each table whole; elsewhere sentences, a sentence's markers (``…。[1]``) and its line end
belonging to it; a list item's prefix to its first sentence. Concatenated, the units give the
reply back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MARKERS_AFTER = re.compile(r"(?:\s*[\[【]\s*\d{1,3}(?:\s*[,，、]\s*\d{1,3})*\s*[\]】])+")
_PARTIAL = re.compile(r"[\[【][\d\s,，、]{0,20}$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_TABLE_LINE = re.compile(r"^\s*(?:>\s*)*\|")
_TABLE_RULE = re.compile(r"^\s*(?:>\s*)*\|?\s*:?-{2,}:?\s*(?:\|\s*:?-{2,}:?\s*)*\|?\s*$")  # | --- | :--: |
# a line's markup before its words: "- ", "2. ", "> 1. ", "### 4. " (a heading's number ends no sentence)
_LIST_PREFIX = re.compile(r"^\s*(?:>\s*)*(?:#{1,6}\s*)?(?:(?:[-*+•]|\d{1,3}[.、)）]|[（(]\d{1,3}[)）])\s*)?")
# A sentence ends at these; so does a clause the model closed with a marker ("…盛出[1]，再加…[3]。",
# "100 克[1] 120 毫升[1]": each its own claim); a colon before a number does not ("干辣椒面：60 克":
# the number is said of what comes before it).
_TERMINATOR = re.compile(r"[。！？!?；;]+|：+(?!\s*\d)|[.:](?=\s|$)(?!\s*\d)|(?<=[\]】])\s*[，,]"
                        r"|(?:(?<=[^\s\]】][\[【]\d[\]】])|(?<=[^\s\]】][\[【]\d\d[\]】]))[ \t]+(?=[^\s\[【])")


@dataclass
class Unit:
    """A piece of the reply: ``text`` is reply[start:end], the pieces together are the reply."""

    start: int
    end: int
    text: str
    code: bool = False
    table: bool = False  # lines of a Markdown table (or rows of one, pasted without it)

    @property
    def blank(self) -> bool:
        return not self.text.strip()


_ENTITY_START = re.compile(r"&#?[A-Za-z0-9]{1,31}$")


def _inside(text: str, start: int, at: int) -> bool:
    """Is ``at`` inside brackets, parentheses or inline code opened since ``start`` (on its line),
    or the ``;`` that ends an HTML entity (``-&gt;``, as a note's Markdown may write it)?"""
    before = text[start:at]
    if text.startswith(";", at) and _ENTITY_START.search(before):
        return True
    return (before.count("[") > before.count("]") or before.count("(") > before.count(")")
            or before.count("（") > before.count("）") or before.count("`") % 2 == 1)


def split(reply: str) -> list[Unit]:
    """The reply as units: each fenced code block whole, each table whole; elsewhere sentences, a sentence's
    markers (``…。[1]``) and its line end belonging to it; a list item's prefix to its first
    sentence. Concatenated, the units give the reply back."""
    units: list[Unit] = []
    pos, n = 0, len(reply)
    while pos < n:
        line_end = reply.find("\n", pos)
        line_end = n if line_end < 0 else line_end + 1
        line = reply[pos:line_end]
        if _FENCE.match(line):
            close = pos + len(line)
            while close < n:
                nxt = reply.find("\n", close)
                nxt = n if nxt < 0 else nxt + 1
                closing = _FENCE.match(reply[close:nxt])
                close = nxt
                if closing:
                    break
            units.append(Unit(pos, close, reply[pos:close], code=True))
            pos = close
            continue
        if _TABLE_LINE.match(line):  # a table's lines, whole
            close = line_end
            while close < n:
                nxt = reply.find("\n", close)
                nxt = n if nxt < 0 else nxt + 1
                if not _TABLE_LINE.match(reply[close:nxt]):
                    break
                close = nxt
            units.append(Unit(pos, close, reply[pos:close], table=True))
            pos = close
            continue
        prefix = _LIST_PREFIX.match(line)
        start, cursor = pos, pos + (prefix.end() if prefix else 0)
        body_end = pos + len(line.rstrip("\n"))
        while cursor < body_end:
            m = _TERMINATOR.search(reply, cursor, body_end)
            if m is None:
                break
            if _inside(reply, pos, m.start()):  # "[图片: …]", "[Hippo4j](https://…)", `a: b`: not a sentence's end
                cursor = m.end()
                continue
            end = m.end()
            after = _MARKERS_AFTER.match(reply, end, body_end)
            if after:
                end = after.end()
            while end < body_end and reply[end] in " \t":
                end += 1
            if end >= body_end:
                break
            units.append(Unit(start, end, reply[start:end]))
            start = cursor = end
        units.append(Unit(start, line_end, reply[start:line_end]))
        pos = line_end
    return [u for u in units if u.text]
