"""A bot's ``/web``: a one-time link that signs the person in to the web chat (``/chat``), sent
to them alone (a private chat, an ephemeral reply: the link is a key). The link is made by
``bot.usecases.signin.link``; a door shows it as a link only through ``web_link``, its ``own``
rule's addition (``bot.plain``: every other address a bot sends is inert)."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from bot.usecases import signin
from bot.usecases.people import Person

if TYPE_CHECKING:
    from bot.root import Parts

WEB_OFF = ("网页聊天没有开启：需要在配置里设置 api.listen。 / The web chat is off: it needs api.listen in the "
           "config.")


def web_text(link: signin.WebLink) -> str:
    return (f"在浏览器里问你的笔记：打开这个链接（{link.minutes} 分钟内有效，只能用一次，别转发给别人）。\n"
            f"Chat with your notes in a browser: open this link (it works once, within {link.minutes} minutes; "
            f"it signs you in, so keep it to yourself).\n{link.url}")


async def web_reply(parts: "Parts", person: Person) -> str:
    """What ``/web`` answers ``person``: their link, or why there is none."""
    try:
        return web_text(await asyncio.to_thread(signin.link, parts, person))
    except signin.WebChatOff:
        return WEB_OFF


def web_link(parts: "Parts"):
    """Whether a token is a web chat sign-in link of this install (for a door's ``own`` rule)."""
    try:
        base = signin.address(parts)
    except signin.WebChatOff:
        return lambda token: False
    link = re.compile(re.escape(base) + r"/chat#code=[A-Za-z0-9_-]{20,}")
    return lambda token: bool(link.fullmatch(token))
