"""The API's door rules: who is calling (the local socket's user, a TCP token's scope, or the
web chat's session cookie), a request without a valid token or session answered 401 from its
head, a cookie's request that changes something refused unless it comes from the API's own page
(its ``Origin`` and the session's ``X-CSRF-Token``), and a body too large refused before it is
read."""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.requests import cookie_parser

from rag.config import secret
from rag.errors import ConfigError

from bot.usecases import signin
from bot.usecases.people import user_for_email

COOKIE = "lr_chat"  # the web chat's session (``bot.api.web``)
SAFE = ("GET", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class Caller:
    """Who is asking: the local socket's user (everything), a TCP token's scope, or a web chat
    session's; ``name``: the token's (``api.tokens[].name``); ``key``: the person when not the
    token's ``api:<name>`` (a session a bot's link opened: ``telegram:111``); ``web``: a web chat
    session's (a cookie): what the person does goes through their chat session (``bot.api.chatdoor``)."""

    name: str
    users: frozenset[str] | None  # None: every user
    admin: bool
    key: str = ""
    web: bool = False

    @property
    def person(self) -> str:
        return self.key or f"api:{self.name}"

    def may_see(self, user_id: str) -> bool:
        return self.users is None or user_id in self.users


LOCAL = Caller("local", None, True, "cli")


class TokenAuth:
    """Bearer tokens for the TCP listener, each with the users it may query."""

    def __init__(self, daemon):
        """Each token read from its variable; two variables holding the same token are refused
        (one holder would be taken for the other): a ``ConfigError`` naming both."""
        self.daemon = daemon
        self.entries = []
        for i, entry in enumerate(daemon.settings.api.tokens):
            token = secret(entry.token_env, f"api.tokens[{i}].token_env").encode()
            for known, other in self.entries:
                if hmac.compare_digest(known, token):
                    raise ConfigError(f"api.tokens: {other.token_env} ({other.name}) and {entry.token_env} "
                                      f"({entry.name}) hold the same token: give each holder a token of their own "
                                      f"(openssl rand -hex 32)")
            self.entries.append((token, entry))

    def caller(self, header: str) -> Caller:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise HTTPException(401, "send Authorization: Bearer <token>", headers={"WWW-Authenticate": "Bearer"})
        for known, entry in self.entries:
            if hmac.compare_digest(known, token.strip().encode()):
                # emails name API accounts, known once they have synced: resolved per request
                users = frozenset(self._leanote_user(u) for u in entry.users)
                return Caller(entry.name, users, entry.admin)  # the person api:<name>, whatever its place
        raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})

    async def of(self, method: str, headers: Headers, cookie_only: bool = False) -> Caller:
        """The caller of a request: its bearer token, else its web chat session (a request that
        changes something only from the API's own page: ``same_site`` and the session's
        ``X-CSRF-Token``). Never an admin through a cookie."""
        header = headers.get("authorization", "")
        session = cookie_parser(headers.get("cookie", "")).get(COOKIE, "")
        if not session or (header and not cookie_only):
            if cookie_only:
                raise HTTPException(401, "not signed in: sign in at /chat")
            return self.caller(header)
        if method not in SAFE:
            same_site(headers, self.daemon.settings.api.web_url)
            if not hmac.compare_digest(headers.get("x-csrf-token", "").encode(), signin.csrf_of(session).encode()):
                raise HTTPException(403, "this request lacks the web chat's X-CSRF-Token: reload the page")
        parts = self.daemon.parts
        if parts is None:
            raise HTTPException(503, "the daemon is starting: try again in a moment")
        signed = await asyncio.to_thread(signin.session, parts, session)
        if signed is None:
            raise HTTPException(401, "not signed in, or the sign-in has ended: sign in again at /chat")
        if signed.person.startswith("api:"):  # opened with a token: only while that token is still its holder's
            for token, entry in self.entries:
                if f"api:{entry.name}" == signed.person and hmac.compare_digest(
                        signin.hashed(token.decode()).encode(), signed.proof.encode()):
                    return Caller(entry.name, frozenset(self._leanote_user(u) for u in entry.users), False, web=True)
            raise HTTPException(401, "the token this sign-in was made with is no longer accepted: sign in again")
        person = signin.person_of(parts, signed)
        if person is None:
            raise HTTPException(401, "you may no longer use this service (users: in the config)")
        return Caller(signed.person, frozenset({person.user_id}), False, signed.person, web=True)

    def _leanote_user(self, name: str) -> str:
        parts = self.daemon.parts
        return (user_for_email(parts, name) if parts is not None else None) or name


def same_site(headers: Headers, web_url: str | None) -> None:
    """403 unless the request comes from a page of this API: its ``Origin`` (else its
    ``Referer``'s) is the address it was sent to, or ``api.web_url``'s. A browser sends it with
    every POST, and a page of another site cannot set it."""
    origin = headers.get("origin") or _origin(headers.get("referer", ""))
    host = headers.get("host", "")
    allowed = {f"http://{host}", f"https://{host}", _origin(web_url or "")} - {""}
    if not origin or origin.lower() not in {a.lower() for a in allowed}:
        raise HTTPException(403, "a request from another site is refused: use the web chat's own page (/chat)")


def _origin(url: str) -> str:
    found = urlsplit(url)
    return f"{found.scheme}://{found.netloc}" if found.scheme and found.netloc else ""


class BodyLimit:
    """ASGI middleware: a request body larger than ``most`` bytes is refused with 413 and
    ``refusal`` before it is read whole: at once when its Content-Length says so, else as
    soon as what has streamed in passes the limit (the app reads no further).

    ``close`` (the Unix socket): the 413 also closes the connection, so the rest of the body
    is never received (a client stops sending at once, and reads its 413: data already sent
    on a Unix socket stays readable). Over TCP a close with unread data can reset the
    connection before the client reads the answer, so there the rest is received and dropped.
    """

    def __init__(self, app, most: int, refusal: str, close: bool = False):
        self.app, self.most, self.refusal = app, most, refusal
        self.headers = {"Connection": "close"} if close else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.most:
            response = JSONResponse({"error": self.refusal, "kind": "user"}, status_code=413, headers=self.headers)
            return await response(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.most:  # FastAPI passes an HTTPException from reading the body on
                    raise HTTPException(413, self.refusal, headers=self.headers)
            return message

        await self.app(scope, limited, send)


class TokenFirst:
    """ASGI middleware for the TCP listener: a request for anything but the public paths
    (``/health``, ``/openapi.json``, the explorer page, which asks for a token itself, and the web
    chat's page and sign-in) without a valid token or session is answered 401 from its head,
    before its body is read: a stranger's request holds no connection longer than that answer
    takes (``bot.api.guard``). The caller found is the request's (``scope["state"]["caller"]``)."""

    PUBLIC = ("/health", "/openapi.json", "/explorer", "/chat")

    def __init__(self, app, auth: "TokenAuth"):
        self.app, self.auth = app, auth

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or any(path == p or path.startswith(p + "/") for p in self.PUBLIC):
            return await self.app(scope, receive, send)
        try:
            caller = await self.auth.of(scope["method"], Headers(scope=scope))
        except HTTPException as err:
            kind = "unavailable" if err.status_code == 503 else "auth"
            response = JSONResponse({"error": err.detail, "kind": kind}, status_code=err.status_code,
                                    headers=err.headers)
            return await response(scope, receive, send)
        scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)
