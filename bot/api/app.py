"""The daemon's API: one door for the CLI, scripts and monitoring.

FastAPI on uvicorn, inside the daemon's event loop, on two listeners:

- a Unix socket (``api.socket``, default ``<state_dir>/api.sock``, mode 0600): the
  CLI of the same user (or root) uses it with full access, no token;
- optionally TCP (``api.listen``, ``host:port``) for remote use: every request needs
  ``Authorization: Bearer <token>``, one of ``api.tokens``; a token may query only its
  ``users`` and, unless ``admin``, cannot start syncs or see other accounts.

Endpoints: ``GET /health`` (liveness; 503 when not ready: index not open, or the last
sync failed; over TCP without a token only that and why in general terms, no paths or
pids: the index's details need a token or the socket), ``GET /status``, ``GET /users``, ``GET /search``, ``POST /ask`` (NDJSON:
``token`` events as the answer streams, then one ``answer`` event: what the bots
render), ``POST /sync`` (a pass now; with ``wait`` NDJSON ``progress`` events and a
``result``; ``rebuild`` empties the index first), ``GET /metrics`` (Prometheus; admin),
``GET /openapi.json``.

The memory (``rag.memory.explore``): ``GET /memory/find``, ``/memory/graph``, ``/memory/note/{id}``,
``/memory/entity``, ``POST /memory/verdict`` (reject or confirm a fact or a related pair);
``GET /explorer`` is a page over them (its graph library, vis-network, is served from the
``pyvis`` package; the page asks for a token when it is opened over TCP).

Over TCP the door is kept by ``bot.api.guard`` (a deadline on each request's head and body, a cap on
connections, the excess put out or refused at once); a request without a valid token is answered 401 from its
head (``TokenFirst``); ``/ask`` and ``/search`` count against the token's ``api.rate_limit`` (429). Answers are
shared out fairly between callers (``rag.answer.fair``); the ``answer`` event carries the answer as HTML with
every address and ``@name`` inert but the cited passages' own links (``bot.render.web_html``).

Errors are JSON ``{"error", "kind"}``: 400 ``user`` (fix the request), 401/403 (token),
413 ``user`` (too large: a body over ``limits.request_kb``, refused before it is read, or a
question, query or name over ``limits.question_chars``, refused before any work), 503
``unavailable`` (retry later), 429 ``unavailable`` (the token's rate; ``Retry-After``), 500 ``internal``
(a bug; see the log). A request line and headers longer than a question of ``limits.question_chars``
needs get uvicorn's plain 400.

Long: every endpoint of the daemon's HTTP API on one FastAPI app, so its door rules (tokens, whose
notes, limits) are applied in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import socket
from dataclasses import asdict, dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Protocol

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from bot.render import NoteLinks, web_html
from rag.memory import explore

from rag import limits
from bot.api.client import check_socket_path
from rag.config import Settings, secret
from rag.errors import DiskFull, LeanoteRagError, TooLarge, Unavailable, UserError
from rag.memory.store import MemoryStore
from rag.index.retrieve import RETRIEVERS, resolve_user

from sync.faults import reading_state
from bot.api.guard import AcceptErrors, Episode, Guard, GuardedH11, connection_cap
from bot.cli.report import status_report

if TYPE_CHECKING:
    from rag.answer.service import AnswerService
    from rag.index.note_index import NoteIndex
    from bot.api.metrics import Metrics
    from sync.service import PassResult, SyncService

log = logging.getLogger(__name__)
NDJSON = "application/x-ndjson"
BACKLOG = 4096  # connections the kernel queues until they are accepted (capped by net.core.somaxconn)
PROGRESS_EVERY = 0.25  # seconds between two progress events of a pass
ACCEPT_BATCH = 16  # connections accepted in one go before the next are looked at (``_Server``)


class Host(Protocol):
    """What the API reads of the daemon that runs it (``bot.serve.Daemon``)."""

    settings: Settings
    index: "NoteIndex | None"
    answers: "AnswerService | None"
    sync: "SyncService | None"
    metrics: "Metrics"
    stopping: asyncio.Event
    passes: int
    last_pass: "PassResult | None"
    not_ready: str | None

    def problems(self) -> list[dict]: ...

    def resolve_user_name(self, name: str) -> str: ...

    async def sync_now(self, reconcile: bool = False, rebuild: bool = False, progress=None) -> "PassResult": ...


@dataclass(frozen=True)
class Caller:
    """Who is asking: the local socket's user (everything), or a TCP token's scope."""

    name: str
    users: frozenset[str] | None  # None: every user
    admin: bool

    def may_see(self, user_id: str) -> bool:
        return self.users is None or user_id in self.users


LOCAL = Caller("local", None, True)


class AskIn(BaseModel):
    question: str = Field(description="the question, in any language")
    user: str | None = Field(default=None, description="whose notes (default: the only user the caller may query)")
    conversation: str | None = Field(default=None, description="an id to keep follow-ups together (optional)")


class VerdictIn(BaseModel):
    id: str = Field(description="a fact's or related pair's id (`fact_id`, `pair_id`)")
    verdict: str = Field(description="`rejected` (it goes, and extraction never brings it back) or `confirmed`")
    user: str | None = Field(default=None, description="whose memory (default: the only user the caller may query)")


class HeldIn(BaseModel):
    user: str | None = Field(default=None, description="whose notes (default: the only user the caller may query)")
    note_ids: list[str] = Field(default=[], max_length=1000, description="note ids")


class SyncIn(BaseModel):
    reconcile: bool = Field(default=False, description="compare everything with the source, not just changes")
    rebuild: bool = Field(default=False, description="empty the index and read every note again")
    wait: bool = Field(default=True, description="stream progress and the result (else start it and return)")


def _event(**fields) -> bytes:
    return (json.dumps(fields, ensure_ascii=False) + "\n").encode()


def _error_body(err: Exception) -> tuple[int, dict]:
    if isinstance(err, TooLarge):
        return 413, {"error": str(err), "kind": "user"}
    if isinstance(err, UserError):
        return 400, {"error": str(err), "kind": "user"}
    if isinstance(err, Unavailable):
        return 503, {"error": str(err), "kind": "unavailable"}
    if isinstance(err, LeanoteRagError):
        return 500, {"error": str(err), "kind": "internal"}
    return 500, {"error": "internal error: see the daemon's log", "kind": "internal"}


def create_app(daemon: Host, auth: "TokenAuth | None" = None) -> FastAPI:
    """The API over what the daemon holds. ``auth`` None: the local socket (full access)."""
    body_kb = daemon.settings.limits.request_kb
    app = FastAPI(title="leanote-rag", version="1", docs_url=None, redoc_url=None,
                  description="Ask questions of your Leanote notes: the running daemon's API.")
    too_large = (f"the request body is larger than {body_kb} KB (limits.request_kb): send a shorter question "
                 f"(at most {daemon.settings.limits.question_chars:,} characters are read)")
    app.add_middleware(BodyLimit, most=body_kb * 1024, refusal=too_large, close=auth is None)
    if auth is not None:
        app.add_middleware(TokenFirst, auth=auth)

    def small(text: str | None, what: str) -> str:
        """``text`` within ``limits.question_chars``, checked before any work (else 413)."""
        return limits.check(text, daemon.settings.limits.question_chars, what)

    async def caller(request: Request) -> Caller:
        return LOCAL if auth is None else auth.caller(request.headers.get("authorization", ""))

    def admin(who: Caller = Depends(caller)) -> Caller:
        if not who.admin:
            raise HTTPException(403, "this token may not do that (api.tokens[].admin)")
        return who

    rates = limits.PerMinute(lambda: daemon.settings.api.rate_limit)

    def counted(who: Caller) -> None:
        """A question or a search over TCP counts against its token's ``api.rate_limit``."""
        if auth is None:
            return
        wait = rates.take(who.name)
        if wait:
            n = daemon.settings.api.rate_limit
            raise HTTPException(429, f"this token asked {n} questions and searches in the last minute "
                                     f"(api.rate_limit): try again in {wait:.0f} s",
                                headers={"Retry-After": str(max(1, round(wait)))})

    def ready() -> None:
        if daemon.index is None or daemon.answers is None:
            raise Unavailable(f"the daemon is starting: {daemon.not_ready or 'the index is not open yet'}")

    @app.exception_handler(LeanoteRagError)
    async def _ours(request: Request, err: LeanoteRagError):
        status, body = _error_body(err)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, err: HTTPException):
        kind = "auth" if err.status_code in (401, 403) else "unavailable" if err.status_code == 429 else "user"
        return JSONResponse({"error": err.detail, "kind": kind}, status_code=err.status_code, headers=err.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception):
        log.error("API %s %s failed", request.method, request.url.path, exc_info=err)
        status, body = _error_body(err)
        return JSONResponse(body, status_code=status)

    async def scoped_users(who: Caller) -> dict[str, int]:
        ready()
        counts = await daemon.answers.in_search_thread(daemon.index.store.count_by_user)
        return {u: n for u, n in counts.items() if who.may_see(u)}

    async def pick_user(who: Caller, user: str | None) -> str:
        users = await scoped_users(who)
        if not user:
            return resolve_user(users, None)
        user_id = daemon.resolve_user_name(user)
        if user_id not in users:  # as asked: an email is never answered with the Leanote user it is
            mine = ", ".join(sorted(users)) or "none"
            raise UserError(f"no notes of user {user!r} that this caller may query (its users with notes: {mine})")
        return user_id

    @app.get("/health", summary="liveness and readiness (the details with a token, or on the socket)")
    async def health(request: Request) -> JSONResponse:
        last = daemon.last_pass
        is_open = daemon.index is not None and daemon.answers is not None
        ready = is_open and (last is None or last.ok)
        reason = None if ready else "the index is not open yet" if not is_open else "the last sync failed"
        fault = daemon.sync.fault if daemon.sync is not None else None
        if fault is not None:  # what, not where (this door may be asked without a token): `status` has the details
            ready = False
            reason = "the disk is full" if isinstance(fault, DiskFull) else "the sync state file is damaged"
        body = {"live": True, "ready": ready, "reason": reason}
        if fault is not None:
            body["problem"] = reason
        header = request.headers.get("authorization")
        if auth is None or header:  # the socket's user, or a token (a wrong one is refused)
            if auth is not None:
                auth.caller(header)
            body.update({
                "index": "open" if daemon.index is not None else (daemon.not_ready or "not open yet"),
                "last_sync_ok": None if last is None else last.ok,
                "passes": daemon.passes,
            })
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/status", summary="sync and index status (the CLI's `status --json`)")
    async def status(who: Caller = Depends(caller)) -> dict:
        ready()
        store = daemon.index.store

        def read(state) -> dict:
            with reading_state(state):
                # an admin sees every account; anyone else only their own (no other's email or error)
                return status_report(daemon.settings, state, store, users=None if who.admin else who.users,
                                     memory=daemon.memory)

        def report() -> dict:  # off the event loop, on the daemon's reading connection
            body = daemon.reading(read)
            if body is None:
                raise HTTPException(503, "the daemon is starting or stopping: try again in a moment")
            if who.admin:  # they name folders and files
                own = daemon.problems()  # the daemon's word on a kind wins (it says when it tries again)
                body["problems"] = own + [p for p in body["problems"] if p["kind"] not in {o["kind"] for o in own}]
            return body

        return await daemon.answers.in_search_thread(report)

    @app.get("/users", summary="indexed chunks per Leanote user the caller may query")
    async def users(who: Caller = Depends(caller)) -> dict:
        return {"users": await scoped_users(who)}

    @app.get("/search", summary="the best chunks for a query")
    async def search(q: str = Query(description="the query"), user: str | None = None,
                     k: int | None = Query(default=None, ge=1, le=100), retriever: str = "hybrid",
                     who: Caller = Depends(caller)) -> dict:
        q = small(q, "the query")
        if retriever not in RETRIEVERS:
            raise UserError(f"unknown retriever {retriever!r}; choose one of {', '.join(RETRIEVERS)}")
        counted(who)
        user_id = await pick_user(who, user)
        hits = await daemon.answers.search(q, user_id, k, retriever)
        return {"query": q, "user_id": user_id, "hits": [asdict(h) for h in hits]}

    @app.post("/ask", summary="an answer from the notes, streamed as NDJSON events",
              response_class=StreamingResponse, responses={200: {"content": {NDJSON: {}}}})
    async def ask(body: AskIn, who: Caller = Depends(caller)) -> StreamingResponse:
        question = small(body.question, "the question")
        counted(who)
        user_id = await pick_user(who, body.user)
        conversation = f"api:{who.name}:{body.conversation}" if body.conversation else None
        return StreamingResponse(_answer_events(daemon, question, user_id, conversation, f"api:{who.name}"),
                                 media_type=NDJSON)

    @app.post("/sync", summary="a sync pass now (admin)",
              responses={200: {"content": {NDJSON: {}}, "description": "with wait: progress events, then the result"}})
    async def sync(body: SyncIn, who: Caller = Depends(admin)):
        ready()
        if not body.wait:
            task = asyncio.create_task(daemon.sync_now(reconcile=body.reconcile, rebuild=body.rebuild))
            task.add_done_callback(_log_failure)
            return {"started": True}
        return StreamingResponse(_sync_events(daemon, body), media_type=NDJSON)

    @app.get("/metrics", summary="Prometheus metrics (admin)", response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def metrics(request: Request, who: Caller = Depends(admin)) -> Response:
        body, content_type = await asyncio.to_thread(daemon.metrics.exposition, request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

    def memory() -> MemoryStore:
        ready()
        store = daemon.memory
        if store is None:
            raise UserError("the memory is off (memory.enabled: false in the config)" if not daemon.settings.memory.enabled
                            else "no memory yet: the first sync pass makes it")
        return store

    async def read(work, *args):
        return await asyncio.to_thread(work, memory(), *args)

    async def indexed(user_id: str, data):
        """``data`` less what names a note the index no longer holds (``explore.indexed_only``)."""
        ids = sorted(explore.note_ids_in(data))
        held = await daemon.answers.in_search_thread(daemon.index.store.holding, user_id, ids) if ids else set()
        return explore.indexed_only(data, held)

    async def held_note(user_id: str, note_id: str) -> bool:
        return note_id in await daemon.answers.in_search_thread(daemon.index.store.holding, user_id, [note_id])

    @app.get("/memory/find", summary="entities and notes whose name or title contains q")
    async def memory_find(q: str = Query(description="part of a name or title, or a note id"), user: str | None = None,
                          limit: int = Query(default=20, ge=1, le=100), who: Caller = Depends(caller)) -> dict:
        q = small(q, "the search")
        user_id = await pick_user(who, user)
        def find(store: MemoryStore) -> dict:  # with the notes each entity stands on
            found = store.find(user_id, q, limit)
            for e in found["entities"]:
                e["_notes"] = {n["note_id"] for n in store.entity(user_id, e["name"])} | \
                    {f["note_id"] for f in store.facts_about(user_id, e["name"])}
            return found

        found = await read(find)
        ids = sorted({n for e in found["entities"] for n in e["_notes"]} | explore.note_ids_in(found["notes"]))
        held = await daemon.answers.in_search_thread(daemon.index.store.holding, user_id, ids) if ids else set()
        entities = []
        for e in found["entities"]:  # an entity only notes that left the index name goes too
            mine = e.pop("_notes")
            if mine & held or not mine:
                entities.append({**e, "notes": len(mine & held) if mine else e["notes"]})
        return {"query": q, "user_id": user_id, "entities": entities,
                "notes": explore.indexed_only(found["notes"], held)}

    @app.get("/memory/graph", summary="the neighbourhood of an entity or a note")
    async def memory_graph(entity: str | None = None, note: str | None = None, user: str | None = None,
                           who: Caller = Depends(caller)) -> dict:
        if (entity is None) == (note is None):
            raise UserError("give entity=NAME or note=NOTE_ID")
        small(entity or note, "the name")
        user_id = await pick_user(who, user)
        if entity is not None:
            graph = await read(explore.entity_graph, user_id, entity)
        else:
            graph = await read(explore.note_graph, user_id, note) if await held_note(user_id, note) else None
            if graph is None:
                raise HTTPException(404, f"no note {note} in this user's memory")
        return {"user_id": user_id, **await indexed(user_id, graph)}

    @app.get("/memory/note/{note_id}", summary="a note's card: summary, facts with quotes, entities, related notes")
    async def memory_note(note_id: str, user: str | None = None, who: Caller = Depends(caller)) -> dict:
        user_id = await pick_user(who, user)
        card = await read(explore.note_card, user_id, note_id) if await held_note(user_id, note_id) else None
        if card is None:
            raise HTTPException(404, f"no note {note_id} in this user's memory")
        return {"user_id": user_id, **await indexed(user_id, card)}

    @app.get("/memory/entity", summary="an entity's card: its facts with sources, the notes that mention it")
    async def memory_entity(name: str, user: str | None = None, who: Caller = Depends(caller)) -> dict:
        small(name, "the name")
        user_id = await pick_user(who, user)
        return {"user_id": user_id, **await indexed(user_id, await read(explore.entity_card, user_id, name))}

    @app.post("/notes/held", summary="which of these notes the index holds (the CLI's memory commands)")
    async def notes_held(body: HeldIn, who: Caller = Depends(caller)) -> dict:
        ready()
        user_id = await pick_user(who, body.user)
        ids = sorted(set(body.note_ids))
        held = await daemon.answers.in_search_thread(daemon.index.store.holding, user_id, ids) if ids else set()
        return {"user_id": user_id, "held": sorted(held)}

    @app.post("/memory/verdict", summary="reject or confirm a fact or a related pair")
    async def memory_verdict(body: VerdictIn, who: Caller = Depends(caller)) -> dict:
        if body.verdict not in ("rejected", "confirmed"):
            raise UserError(f"verdict must be 'rejected' or 'confirmed', not {body.verdict!r}")
        user_id = await pick_user(who, body.user)
        return await read(lambda s: s.correct(user_id, body.id, body.verdict, by=f"page:{who.name}"))

    @app.get("/explorer", summary="the memory explorer (a web page)", response_class=HTMLResponse)
    async def explorer_page() -> FileResponse:
        return FileResponse(EXPLORER / "index.html", media_type="text/html")

    @app.get("/explorer/{name}", summary="the explorer's scripts and styles", include_in_schema=False)
    async def explorer_asset(name: str) -> FileResponse:
        path = _asset(name)
        if path is None:
            raise HTTPException(404, f"no such file: {name}")
        return FileResponse(path, headers={"Cache-Control": "no-cache"})

    return app


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


EXPLORER = Path(__file__).with_name("explorer")
VENDOR = {"vis-network.min.js": "vis-network.min.js", "vis-network.css": "vis-network.css"}


def _asset(name: str) -> Path | None:
    """The page's own files, or vis-network from the pyvis package (a declared dependency)."""
    if name in VENDOR:
        try:
            root = resources.files("pyvis") / "lib" / "vis-9.1.2"
        except ModuleNotFoundError:
            raise Unavailable("the explorer's graph library is missing: pip install pyvis") from None
        return Path(str(root / VENDOR[name]))
    if name in ("explorer.js", "explorer.css"):
        return EXPLORER / name
    return None


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a sync started through the API failed", exc_info=task.exception())


async def _answer_events(daemon: Host, question: str, user_id: str, conversation: str | None,
                         caller: str) -> AsyncIterator[bytes]:
    queue: asyncio.Queue = asyncio.Queue()
    task = asyncio.create_task(daemon.answers.ask(
        question, user_id, conversation=conversation, on_token=lambda text: queue.put_nowait(("token", text)),
        on_sources=lambda found: queue.put_nowait(("sources", found)), caller=caller))
    task.add_done_callback(lambda _: queue.put_nowait(None))
    try:
        while (item := await queue.get()) is not None:
            kind, value = item
            if kind == "sources":  # before the LLM reads: the notes its evidence comes from
                yield _event(event="sources", sources=[asdict(c) for c in value])
            else:
                yield _event(event="token", text=value)
        answer = task.result()
    except Exception as err:  # the stream has started: the error is an event
        if not isinstance(err, LeanoteRagError):
            log.error("answering over the API failed", exc_info=err)
        _, body = _error_body(err)
        yield _event(event="error", **body)
        return
    finally:
        task.cancel()  # the client went away: stop writing its answer
    # the answer as HTML for a page: every link-like token inert, but the cited passages' own links
    yield _event(event="answer", answer=answer.as_json(with_trace=True),
                 html=web_html(answer.shown, NoteLinks(answer.citations)))


async def _sync_events(daemon: Host, body: SyncIn) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    sent = [0.0]

    def progress(step) -> None:  # called in the sync's thread (sync.progress.Step); a few a second at most
        now = loop.time()
        if now - sent[0] >= PROGRESS_EVERY:
            sent[0] = now
            loop.call_soon_threadsafe(queue.put_nowait, step.as_json())

    task = asyncio.create_task(daemon.sync_now(reconcile=body.reconcile, rebuild=body.rebuild, progress=progress))
    task.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, None))
    try:
        while (item := await queue.get()) is not None:
            yield _event(event="progress", **item)
        result = task.result()
    except Exception as err:
        _, error = _error_body(err)
        yield _event(event="error", **error)
        return
    if result.stopped:
        yield _event(event="error", error="the daemon is stopping: the pass ended early (the next start carries on)",
                     kind="unavailable")
        return
    yield _event(event="result", summary=result.summary.as_json(), failures=result.failures)


class TokenAuth:
    """Bearer tokens for the TCP listener, each with the users it may query."""

    def __init__(self, daemon: Host):
        self.daemon = daemon
        self.entries = [(secret(entry.token_env, f"api.tokens[{i}].token_env").encode(), i, entry)
                        for i, entry in enumerate(daemon.settings.api.tokens)]

    def caller(self, header: str) -> Caller:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise HTTPException(401, "send Authorization: Bearer <token>", headers={"WWW-Authenticate": "Bearer"})
        for known, i, entry in self.entries:
            if hmac.compare_digest(known, token.strip().encode()):
                # emails name API accounts, known once they have synced: resolved per request
                users = frozenset(self.daemon.resolve_user_name(u) for u in entry.users)
                return Caller(f"token{i}", users, entry.admin)
        raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})


class _Server(uvicorn.Server):
    """uvicorn inside our event loop: the daemon handles the signals, not uvicorn.

    asyncio accepts as many connections in one go as the listen backlog it is given, before
    any of them is looked at: a long queue of a stranger's connections would take every file
    the process may open at once. So uvicorn's backlog (``Config.backlog``) is the small
    batch ``ACCEPT_BATCH``, and once it listens the kernel's queue is made ``BACKLOG`` long
    again (``listen()`` on a listening socket only changes its queue): a client's
    connection waits in the queue, never for a SYN to be sent again."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        for sock in sockets or ():
            sock.listen(BACKLOG)


def _config(app: FastAPI, settings: Settings, guard: Guard | None = None) -> uvicorn.Config:
    # h11 holds a request's line and headers whole up to this: room for a query of
    # question_chars (CJK percent-encoded: 9 bytes a character) and the headers, no more.
    head = max(16 * 1024, settings.limits.question_chars * 9 + 8 * 1024)
    protocol = partial(GuardedH11, guard=guard) if guard is not None else "h11"
    return uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=2,
                          server_header=False, h11_max_incomplete_event_size=head, http=protocol,
                          timeout_keep_alive=settings.api.idle_timeout, backlog=ACCEPT_BATCH)


def unix_listener(path) -> socket.socket:
    """The API's Unix socket, private to this user (0600); a stale file is replaced (we
    hold the index lock, so no other daemon of this state directory is alive)."""
    check_socket_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


def tcp_listener(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as err:
        sock.close()
        raise UserError(f"cannot listen on api.listen {listen}: {err.strerror or err}") from None
    sock.listen(BACKLOG)
    return sock


async def service(daemon: Host) -> None:
    """Serve the API until the daemon stops (run by the daemon like the bots)."""
    cfg = daemon.settings.api
    if not cfg.enabled:
        return
    servers: list[tuple[_Server, socket.socket]] = []
    remote = ""
    guard = None
    if cfg.listen:  # a problem here leaves the local socket working, and says what is wrong
        try:
            guard = Guard(cfg.listen, connection_cap(cfg.max_connections), cfg.request_timeout)
            app = create_app(daemon, TokenAuth(daemon))
            servers.append((_Server(_config(app, daemon.settings, guard)), tcp_listener(cfg.listen)))
            remote = f" and http://{cfg.listen} (tokens; at most {guard.most} connections)"
        except UserError as err:
            log.error("the API's TCP listener is off: %s", err)
    servers.append((_Server(_config(create_app(daemon), daemon.settings)), unix_listener(cfg.socket)))
    log.info("API on %s%s", cfg.socket, remote)
    accept_errors = AcceptErrors(asyncio.get_running_loop())
    accept_errors.install()
    bad_heads = _QuietBadRequests()
    logging.getLogger("uvicorn.error").addFilter(bad_heads)
    tasks = [asyncio.create_task(server.serve(sockets=[sock])) for server, sock in servers]
    try:
        await daemon.stopping.wait()
    finally:
        for server, _ in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, sock in servers:
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            cfg.socket.unlink()
        accept_errors.remove()
        logging.getLogger("uvicorn.error").removeFilter(bad_heads)
        bad_heads.episode.over()
        if guard is not None:
            guard.close()


class _QuietBadRequests(logging.Filter):
    """uvicorn logs every malformed request head; a stranger can send thousands: the first
    one of an episode is said, the rest counted (``guard.Episode``)."""

    def __init__(self):
        super().__init__()
        self.episode = Episode(
            lambda c: "the API received a malformed HTTP request (answered 400); more are counted, not logged",
            lambda c: f"the API answered {c['bad']} malformed HTTP request(s) with 400", level=logging.INFO)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Invalid HTTP request received"):
            self.episode.hit("bad")
            return False
        return True


service.label = "API"
