"""Signing in to the web chat (``/chat``, served by the daemon's API on ``api.listen``).

Two ways in, each opening a session (a cookie the browser keeps, ``api.web_session`` long):

- ``link``: a bot's ``/web`` gives a person a one-time link, ``<api.web_url>/chat#code=…``. The
  code is in the address's fragment, which a browser never sends to a server: a chat app's link
  preview cannot spend it, no log holds it. The page sends it once (``redeem``): it works once,
  within ``api.web_link``, and opens a session of that person (``telegram:111``): their answers,
  gaps and captures, their Leanote user as the config in force maps them (``person_of``), also
  after a reload; removed from ``users:``, they are signed out.
- ``with_token``: an API token (``api.tokens``), checked by the door; the session is the token's
  holder (``api:<name>``) and lasts only while that token stays in its variable.

Only hashes are stored (``rag.signin``). A session's ``csrf`` is derived from its secret: the page
sends it with every request that changes something, which a page of another site cannot read.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rag.errors import UserError
from rag.signin import Signed

from bot.usecases.people import Person, person_now

if TYPE_CHECKING:
    from bot.root import Parts

SECRET_BYTES = 32
REFUSED = {
    "used": "this sign-in link was used already: links work once. Ask the bot for a new one with /web",
    "expired": "this sign-in link has expired: ask the bot for a new one with /web",
    "unknown": "this sign-in link is not known here: ask the bot for a new one with /web",
    "gone": "this sign-in link's person may no longer use this service (users: in the config)",
}


class WebChatOff(UserError):
    """The web chat needs the API's TCP listener (``api.listen``)."""

    def __init__(self):
        super().__init__("the web chat is off: it is served on api.listen, which is not set in the config")


class SigninRefused(UserError):
    """A sign-in code that opens nothing: ``reason`` is ``used``, ``expired``, ``unknown`` or ``gone``."""

    def __init__(self, reason: str):
        super().__init__(REFUSED[reason])
        self.reason = reason


@dataclass(frozen=True)
class WebLink:
    """A one-time sign-in link, and when it stops working (``time.time()``; ``minutes`` from now)."""

    url: str
    expires: float
    minutes: int


@dataclass(frozen=True)
class Opened:
    """A session just opened: the cookie's ``secret`` (shown to nobody but the browser), its
    ``csrf`` (the page's header), whose it is and for how many seconds."""

    secret: str
    csrf: str
    person: str
    seconds: int


def hashed(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def csrf_of(secret: str) -> str:
    """The token a session's page sends with each change: derived from its secret, never stored."""
    return hmac.new(secret.encode(), b"leanote-rag web chat csrf", hashlib.sha256).hexdigest()


def address(parts: "Parts") -> str:
    """Where people open the web chat: ``api.web_url``, else ``http://<api.listen>``."""
    cfg = parts.settings.api
    if not cfg.listen:
        raise WebChatOff()
    return (cfg.web_url or f"http://{cfg.listen}").rstrip("/")


def link(parts: "Parts", person: Person) -> WebLink:
    """A one-time link that signs ``person`` in to the web chat (a bot's ``/web``). In a worker thread."""
    base = address(parts)
    code = secrets.token_urlsafe(SECRET_BYTES)
    ttl = parts.settings.api.web_link
    expires = parts.signins.add_code(hashed(code), person.key, ttl)
    return WebLink(f"{base}/chat#code={code}", expires, max(1, round(ttl / 60)))


def redeem(parts: "Parts", code: str) -> Opened:
    """The session a one-time code opens (``SigninRefused`` saying why not). In a worker thread."""
    state, person = parts.signins.take_code(hashed(code.strip()))
    if state != "ok":
        raise SigninRefused(state)
    if person_now(parts, person) is None:
        raise SigninRefused("gone")
    return _open(parts, person, "")


def with_token(parts: "Parts", name: str, token: str) -> Opened:
    """A session for the holder of API token ``name`` (the door has checked ``token``). In a worker thread."""
    return _open(parts, f"api:{name}", hashed(token))


def _open(parts: "Parts", person: str, proof: str) -> Opened:
    secret = secrets.token_urlsafe(SECRET_BYTES)
    ttl = parts.settings.api.web_session
    parts.signins.add_session(hashed(secret), person, proof, ttl)
    return Opened(secret, csrf_of(secret), person, int(ttl))


def session(parts: "Parts", secret: str) -> Signed | None:
    """The live session a cookie holds, or None. In a worker thread: a read."""
    return parts.signins.session(hashed(secret)) if secret else None


def person_of(parts: "Parts", signed: Signed) -> Person | None:
    """The chat person a session is, as the config in force maps them now (None: no longer)."""
    return person_now(parts, signed.person)


def sign_out(parts: "Parts", secret: str) -> None:
    """The session ends. In a worker thread."""
    if secret:
        parts.signins.end(hashed(secret))
