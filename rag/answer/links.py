"""The links a passage of a note holds: the only ones an answer may show as links.

A note's text is Markdown (``rag.index.clean`` turns a rich-text note's ``<a href>`` into
``[words](address)``). An answer citing a passage may show an address as a link only when
that passage links to it, and then with the note's own words for it; every other address,
domain, ``@name`` or email in an answer is shown as inert text (the renderers in ``bot/``).
A web address a note writes out (``https://docs.python.org/3/`` on a line of its own) is the
note's too, but only where the note's own words are shown (a passage, the quote under an
answer: ``linked`` makes it a link there); the same address in the LLM's words stays inert
(a clipped page that says "open http://evil.example now" does not become the bot's advice).

A link's words may name an address of their own (``[官方文档 https://docs.python.org](http://evil.example/steal)``):
when they name a host the link does not go to (``misleading``), every door shows the words as
text and the real address beside them, never the words as the link.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

# [words](address "title") and <address>, outside code
_CODE = re.compile(r"```[\s\S]*?(?:```|$)|`[^`\n]*`")
_MD_LINK = re.compile(r"(?<!!)\[([^\]\n]{0,300})\]\(\s*<?([^()\s>]+)>?(?:\s+[\"'(][^)\n]*)?\s*\)")
_AUTOLINK = re.compile(r"<((?:https?|ftp|mailto):[^>\s]+)>", re.I)
MOST = 20  # links kept per passage
# a web address written out in prose, and what is no prose: code, links and images, <…>
_BARE = re.compile(r"https?://[^\s<>\"'`\u3000-\u303f\uff01-\uff0f\uff1a-\uff20]+", re.I)
_NOT_PROSE = re.compile(rf"{_CODE.pattern}|!?\[[^\]\n]{{0,300}}\]\([^)\n]*\)|<[^<>\n]*>")
_END = ".,;:!?)]}'\"。，；：！？）】》"


def held(text: str) -> list[dict]:
    """The links ``text`` (a passage, Markdown) holds: ``{"text", "url"}``, in order, each address
    once; then the web addresses it writes out, ``"bare": True`` (links only where the note's
    words are shown: ``linked``)."""
    prose = _CODE.sub(" ", text or "")
    found: dict[str, dict] = {}
    for m in _MD_LINK.finditer(prose):
        words, url = " ".join(m.group(1).split()), m.group(2)
        if ":" in url and key(url) not in found:
            found[key(url)] = {"text": words or url, "url": url}
    for m in _AUTOLINK.finditer(prose):
        found.setdefault(key(m.group(1)), {"text": m.group(1), "url": m.group(1)})
    for start, end in _bare(text or ""):
        url = text[start:end]
        found.setdefault(key(url), {"text": url, "url": url, "bare": True})
    return list(found.values())[:MOST]


def linked(text: str) -> str:
    """A note's words (Markdown) with each web address they write out as a link (``<address>``)."""
    out, last = [], 0
    for start, end in _bare(text):
        out += [text[last:start], f"<{text[start:end]}>"]
        last = end
    out.append(text[last:])
    return "".join(out)


def _bare(text: str):
    """(start, end) of each web address ``text`` writes out in its prose, trailing punctuation
    left out (a closing parenthesis only when it closes none of the address's own)."""
    last = 0
    for skip in [*_NOT_PROSE.finditer(text), None]:
        upto = skip.start() if skip else len(text)
        for m in _BARE.finditer(text, last, upto):
            start, end = m.span()
            while end > start and text[end - 1] in _END:
                if text[end - 1] == ")" and text.count("(", start, end) >= text.count(")", start, end):
                    break
                end -= 1
            if end - start > len("https://"):
                yield start, end
        last = skip.end() if skip else len(text)


# what in a link's words names a host: an address's, a domain, an email's
_NAMED = re.compile(r"(?:[a-z][a-z0-9+.-]*://|@)?((?:[^\W_](?:[\w-]*[^\W_])?\.)+[^\W\d_]{2,24})(?![\w-])", re.I)


def host(address: str) -> str:
    """The host an address goes to: no scheme, user, port or path, in lower case, no ``www.``
    (``mailto:a@b.example`` goes to ``b.example``)."""
    text = re.sub(r"^[a-z][a-z0-9+.-]*:(?://)?", "", address.strip(), flags=re.I)
    text = re.split(r"[/?#\\]", text, maxsplit=1)[0].rpartition("@")[2]
    return _idna(text.split(":")[0].lower().rstrip(".").removeprefix("www."))


def _idna(name: str) -> str:
    """A host as DNS spells it (``例子.测试`` is ``xn--fsqu00a.xn--0zwm56d``), so a name and its
    punycode compare equal; as it is when it is no valid name."""
    try:
        return name.encode("idna").decode("ascii")
    except UnicodeError:
        return name


def misleading(link: dict) -> bool:
    """Do the link's words name a host (in an address, a domain, an email) that its address
    does not go to? A host of the words' own, or one above it, is what the link says."""
    target = host(link["url"])
    for m in _NAMED.finditer(str(link.get("text") or "")):
        named = host(m.group(1))
        if named and not (target == named or target.endswith("." + named)):
            return True
    return False


def key(address: str) -> str:
    """An address as compared: no scheme, no ``www.``, the host in lower case (as DNS spells
    it), the path unescaped, no trailing slash or punctuation (``https://www.Example.com/a/``
    and ``example.com/a`` are one; so are an address and the one a Markdown renderer escaped)."""
    text = address.strip().rstrip(".,;:!?)]}'\"。，；：！？）】》")
    text = re.sub(r"^(?:[a-z][a-z0-9+.-]*://|mailto:)", "", text, flags=re.I)
    host, slash, rest = text.partition("/")
    host = _idna(host.lower().removeprefix("www."))
    return (host + slash + unquote(rest)).rstrip("/")
