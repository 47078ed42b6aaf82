"""Every text a chat door sends that is no answer, as each platform shows it: plain text made safe.

What the bots say besides an answer (``bot.render`` renders those) is plain text built from
words of others: a note's title, the question a person asked (a gap's wording), a passage found
by ``/search``, a fact's quote, the words heard in a clip or read from a photo, a receipt. Any of
them may hold Markdown or an address: a note titled ``[docs.python.org](http://evil.example/steal)``
is a masked link in Discord and an address Telegram makes a link of. So each door sends such text
only through its bot's one path (``TelegramBot.reply``/``send``/``edit``, ``DiscordBot.say``/
``edit``/``dm``), which renders it here by the rule answers follow (``bot.render``): nothing in it
is Markdown or HTML, and every URL-like or mention-like token (an address, ``www.``, a domain,
an email, an ``@name``, a Discord mention) is inert, in code style, except the addresses of this
install's own notes (``{leanote.base_url}/note/<id>``, what the bots link to: ``own``), which are
links, and the bot's own ``@name``.
"""

from __future__ import annotations

import html
import re
from typing import Callable

from bot.render import linklike

Own = Callable[[str], bool]  # is this token one of ours (a note's address, the bot's @name)?

_WORDISH = re.compile(r"[\w.-]+")  # what follows a token as part of its word ("telegram.allowed" + "_chats")
_DISCORD_MARKS = re.compile(r"([\\*_`~|<>\[\]])")
_LINE_START = re.compile(r"^(\s*)([#-])", re.M)  # a heading, a small line (-#), a list


def own_links(base_url: str, also: tuple[str, ...] = ()) -> Own:
    """The tokens a door shows as they are: the addresses of this install's notes (``base_url``:
    ``leanote.base_url``) and ``also`` (the bot's ``@name``)."""
    note = re.compile(re.escape(base_url.rstrip("/")) + r"/note/[A-Za-z0-9_-]+/?", re.I)
    names = {a.lower() for a in also if a}
    return lambda token: bool(note.fullmatch(token)) or token.lower() in names


_QUOTES = "«»“”‘’"  # an address ends before them: «[t](http://evil.example/steal)» is a title in quotes


def _tokens(text: str):
    """(start, end) of each link-like token in ``text``: an address ends before a quotation mark
    (what follows is looked at again), a token's word is kept whole with it."""
    pos = 0
    while True:
        found = next(linklike(text[pos:]), None)
        if found is None:
            return
        start, end = found[0] + pos, found[1] + pos
        quote = next((i for i in range(start + 1, end) if text[i] in _QUOTES), None)
        if quote is not None:
            end = quote
            while end > start + 1 and text[end - 1] in ".,;:!?)]}'\"":
                end -= 1
        elif end < len(text) and (text[end].isalnum() or text[end] == "_"):
            m = _WORDISH.match(text, end)
            end = m.end() if m else end
        yield start, end
        pos = end


def telegram_text(text: str, own: Own = lambda token: False) -> str:
    """Plain text as the HTML Telegram reads (``parse_mode=HTML``): escaped, each link-like token in
    ``<code>`` (Telegram makes no link there), but ``own`` ones: a web address as its own link,
    another (the bot's ``@name``) as text."""
    out, last = [], 0
    for start, end in _tokens(text):
        token = text[start:end]
        out.append(html.escape(text[last:start], quote=False))
        if not own(token):
            out.append(f"<code>{html.escape(token, quote=False)}</code>")
        elif token.lower().startswith(("http://", "https://")):
            out.append(f'<a href="{html.escape(token)}">{html.escape(token, quote=False)}</a>')
        else:
            out.append(html.escape(token, quote=False))
        last = end
    out.append(html.escape(text[last:], quote=False))
    return "".join(out)


def discord_text(text: str, own: Own = lambda token: False) -> str:
    """Plain text as Discord's Markdown shows it as written: every mark escaped (no masked link, no
    mention, no heading), each link-like token in code, but ``own`` ones: a web address as
    ``<address>`` (a link, no preview)."""
    out, last = [], 0
    for start, end in _tokens(text):
        token = text[start:end]
        out.append(_discord_escape(text[last:start]))
        if own(token) and token.lower().startswith(("http://", "https://")):
            out.append(f"<{token}>")
        else:
            out.append(f"`{token}`")
        last = end
    out.append(_discord_escape(text[last:]))
    return "".join(out)


def _discord_escape(text: str) -> str:
    text = _DISCORD_MARKS.sub(r"\\\1", text)
    text = _LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), text)  # a heading, a quote, a list
    return text.replace("@", "@\u200b")


def messages(text: str, limit: int, render: Callable[[str], str]) -> list[str]:
    """``text`` rendered (``render``, which keeps each line to itself) as messages of at most
    ``limit`` characters, cut between lines; a line too long alone is cut (as text, before it is
    rendered, so no tag or escape is broken)."""
    lines: list[str] = []
    for line in text.split("\n"):
        lines += _fitting(line, limit, render)
    parts, current = [], None
    for line in lines:
        if current is not None and len(current) + 1 + len(line) <= limit:
            current += "\n" + line
        else:
            if current is not None:
                parts.append(current)
            current = line
    parts.append(current or "")
    return parts


def _fitting(line: str, limit: int, render: Callable[[str], str]) -> list[str]:
    shown = render(line)
    if len(shown) <= limit or len(line) <= 1:
        return [shown[:limit]]
    cut = max(1, len(line) * limit // max(len(shown), 1) - 1)
    return _fitting(line[:cut], limit, render) + _fitting(line[cut:], limit, render)
