"""The web chat: a page at ``/chat`` on the API's TCP listener, and its sign-in.

The page (``chat/``: its HTML, script and styles, served from here; nothing is fetched from
elsewhere) asks, rates, captures and lists gaps through the API's own endpoints, signed in by a
session cookie (``access.COOKIE``: HttpOnly, SameSite=Strict, Secure behind https) that an API
token or a bot's one-time link opens (``bot.usecases.signin``). A cookie's request that changes
something comes only from this page (``access.TokenAuth.of``). These routes only parse and
render: signing in is the use case's.

``POST /chat/signin`` (``{"token"}`` or ``{"code"}``: the session, and the page's ``csrf``),
``GET /chat/me`` (who is signed in, the users they may ask, the ``csrf``), ``POST /chat/signout``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from pydantic import BaseModel, Field

from rag import limits

from bot.api.access import COOKIE, TokenAuth, same_site
from bot.usecases import signin

CHAT = Path(__file__).with_name("chat")
ASSETS = ("chat.js", "chat.css")
HEADERS = {  # the page runs its own files only, and is never framed or sent elsewhere
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


class SigninIn(BaseModel):
    token: str | None = Field(default=None, description="an API token (api.tokens)")
    code: str | None = Field(default=None, description="the code of a one-time link a bot's /web gave")


def mount(app: FastAPI, daemon, auth: TokenAuth, parts) -> None:
    """The page and its sign-in on ``app`` (the TCP listener's; ``parts()``: the daemon's parts, once ready)."""

    def web_url() -> str | None:
        return daemon.settings.api.web_url

    def secure(request: Request) -> bool:
        return (web_url() or "").startswith("https:") or request.url.scheme == "https" \
            or request.headers.get("x-forwarded-proto") == "https"

    @app.get("/chat", summary="the web chat (a page)", response_class=HTMLResponse)
    async def page() -> FileResponse:
        return FileResponse(CHAT / "index.html", media_type="text/html", headers=HEADERS)

    @app.post("/chat/signin", summary="sign in to the web chat with an API token or a one-time link's code")
    async def sign_in(body: SigninIn, request: Request) -> JSONResponse:
        same_site(request.headers, web_url())
        if bool(body.token) == bool(body.code):
            raise HTTPException(400, "send either token (an API token) or code (from a /web link)")
        if body.token:
            who = auth.caller(f"Bearer {limits.check(body.token, 1000, 'the token')}")
            opened = await asyncio.to_thread(signin.with_token, parts(), who.name, body.token.strip())
        else:
            try:
                opened = await asyncio.to_thread(signin.redeem, parts(), limits.check(body.code, 200, "the code"))
            except signin.SigninRefused as err:
                raise HTTPException(403, str(err)) from None
        reply = JSONResponse({"person": opened.person, "csrf": opened.csrf})
        reply.set_cookie(COOKIE, opened.secret, max_age=opened.seconds, path="/", httponly=True, samesite="strict",
                         secure=secure(request))
        return reply

    @app.get("/chat/me", summary="who is signed in to the web chat, the users they may ask, the page's csrf")
    async def me(request: Request) -> dict:
        who = await auth.of(request.method, request.headers, cookie_only=True)
        return {"person": who.person, "users": sorted(who.users or ()),
                "csrf": signin.csrf_of(request.cookies.get(COOKIE, ""))}

    @app.post("/chat/signout", summary="sign out of the web chat (the session ends)")
    async def sign_out(request: Request) -> JSONResponse:
        await auth.of(request.method, request.headers, cookie_only=True)  # this page's, with its csrf
        await asyncio.to_thread(signin.sign_out, parts(), request.cookies.get(COOKIE, ""))
        reply = JSONResponse({"signed_out": True})
        reply.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=secure(request))
        return reply

    @app.get("/chat/{name}", include_in_schema=False)  # (after /chat/me)
    async def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise HTTPException(404, f"no such file: {limits.echoed(name)}")
        return FileResponse(CHAT / name, headers=HEADERS)
