"""The links a passage of a note holds: the only ones an answer may show as links.

A note's text is Markdown (``rag.index.clean`` turns a rich-text note's ``<a href>`` into
``[words](address)``). An answer citing a passage may show an address as a link only when
that passage links to it, and then with the note's own words for it; every other address,
domain, ``@name`` or email in an answer is shown as inert text (the renderers in ``bot/``).
A bare address in a note's text is no link: the note only mentions it.
"""

from __future__ import annotations

import re

# [words](address "title") and <address>, outside code
_CODE = re.compile(r"```[\s\S]*?(?:```|$)|`[^`\n]*`")
_MD_LINK = re.compile(r"(?<!!)\[([^\]\n]{0,300})\]\(\s*<?([^()\s>]+)>?(?:\s+[\"'(][^)\n]*)?\s*\)")
_AUTOLINK = re.compile(r"<((?:https?|ftp|mailto):[^>\s]+)>", re.I)
MOST = 20  # links kept per passage


def held(text: str) -> list[dict]:
    """The links ``text`` (a passage, Markdown) holds: ``{"text", "url"}``, in order, each address once."""
    prose = _CODE.sub(" ", text or "")
    found: dict[str, dict] = {}
    for m in _MD_LINK.finditer(prose):
        words, url = " ".join(m.group(1).split()), m.group(2)
        if ":" in url and key(url) not in found:
            found[key(url)] = {"text": words or url, "url": url}
    for m in _AUTOLINK.finditer(prose):
        found.setdefault(key(m.group(1)), {"text": m.group(1), "url": m.group(1)})
    return list(found.values())[:MOST]


def key(address: str) -> str:
    """An address as compared: no scheme, no ``www.``, the host in lower case, no trailing
    slash or punctuation (``https://www.Example.com/a/`` and ``example.com/a`` are one)."""
    text = address.strip().rstrip(".,;:!?)]}'\"。，；：！？）】》")
    text = re.sub(r"^(?:[a-z][a-z0-9+.-]*://|mailto:)", "", text, flags=re.I)
    host, slash, rest = text.partition("/")
    host = host.lower().removeprefix("www.")
    return (host + slash + rest).rstrip("/")
