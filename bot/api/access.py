"""The API's door rules: who is calling (the local socket's user, or a TCP token's scope), a
request without a valid token answered 401 from its head, and a body too large refused before
it is read."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from rag.config import secret
from rag.errors import ConfigError

from bot.usecases.people import user_for_email


@dataclass(frozen=True)
class Caller:
    """Who is asking: the local socket's user (everything), or a TCP token's scope; ``name``:
    the token's (``api.tokens[].name``), the person ``api:<name>``."""

    name: str
    users: frozenset[str] | None  # None: every user
    admin: bool

    def may_see(self, user_id: str) -> bool:
        return self.users is None or user_id in self.users


LOCAL = Caller("local", None, True)


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

    def _leanote_user(self, name: str) -> str:
        parts = self.daemon.parts
        return (user_for_email(parts, name) if parts is not None else None) or name


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
    (``/health``, ``/openapi.json``, the explorer page, which asks for a token itself) without
    a valid token is answered 401 from its head, before its body is read: a stranger's
    request holds no connection longer than that answer takes (``bot.api.guard``)."""

    PUBLIC = ("/health", "/openapi.json", "/explorer")

    def __init__(self, app, auth: "TokenAuth"):
        self.app, self.auth = app, auth

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or any(path == p or path.startswith(p + "/") for p in self.PUBLIC):
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        try:
            self.auth.caller(header)
        except HTTPException as err:
            response = JSONResponse({"error": err.detail, "kind": "auth"}, status_code=err.status_code,
                                    headers=err.headers)
            return await response(scope, receive, send)
        await self.app(scope, receive, send)
