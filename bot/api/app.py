"""The daemon's HTTP API: FastAPI, one endpoint per use case (``bot.usecases``), each reading
the request, calling the use case for the caller and returning its JSON form.

Endpoints: ``GET /health`` (liveness; 503 when not ready: index not open, or the last sync
failed; over TCP without a token only that and why in general terms, no paths or pids),
``GET /status``, ``GET /users``, ``GET /search``, ``POST /ask`` (NDJSON: ``sources`` once the
evidence is chosen, ``token`` events as the answer streams, then one ``answer`` event: what
the bots render, with the answer as HTML with every address and ``@name`` inert but the cited
passages' own links, ``bot.render.web_html``, and ``places``: a note file's path in the notes
folder, by its address; with ``keep`` the answer is kept, its
``answer_id`` in that event), the caller's kept answers: ``GET /answers/{id}/why`` (its trace),
``POST /answers/{id}/feedback`` (👍 / 👎), ``POST /answers/{id}/save`` (as a note, once); ``GET
/why`` (the last answer's trace in a conversation: the bots' ``/why``), ``POST /sync`` (a pass now; with ``wait`` NDJSON
``progress`` events and a ``result``; ``rebuild`` empties the index first), ``GET /metrics``
(Prometheus; admin), ``GET /openapi.json``. The memory: ``GET /memory/about``,
``/memory/related``, ``/memory/find``, ``/memory/graph``, ``/memory/note/{id}``,
``/memory/entity``, ``POST /memory/verdict``. The caller's knowledge gaps: ``GET /gaps``,
``POST /gaps/{id}/dismiss``, ``POST /gaps/{id}/note`` (the note for it, into Leanote or the notes
folder through the outbox); ``POST /note`` (a note captured the same way: the command line's
``note``); ``GET /digest`` (what the caller's digest would say). ``GET /explorer`` is a page over them (its graph
library, vis-network, is served from the ``pyvis`` package); ``GET /chat`` the web chat, on the TCP
listener only, with its sign-in (``bot.api.web``).

Who calls (``bot.api.access``): the local socket's user may do everything; a TCP token may
query only its ``users`` and, unless ``admin``, cannot start syncs or see other accounts;
``/ask`` and ``/search`` count against the token's ``api.rate_limit`` (429). A web chat session's
(a cookie's) ``/ask``, ``/why``, answer buttons, gap acts and ``/note`` go through the person's chat
session instead (``bot.api.chatdoor``: its limits, message cut and refusals). Answers are shared
out fairly between callers (``rag.answer.fair``).

Errors are JSON ``{"error", "kind"}``, every one (``Error`` in the OpenAPI description): 400
``user`` (fix the request: also a body that is not JSON or a field of the wrong type, never
FastAPI's own 422 ``{"detail"}``), 401/403 (token), 404 (no such note, no such path), 405
(another method), 413 ``user`` (too large: a body over ``limits.request_kb``, refused before it is
read, or a question, query or name over ``limits.question_chars``, refused before any work),
503 ``unavailable`` (retry later), 429 ``unavailable`` (the token's rate; ``Retry-After``), 500
``internal`` (a bug; see the log).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import AsyncIterator

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from rag import limits
from rag.answer.feedback import KEEP_DAYS, NotYours, UnknownAnswer
from rag.errors import DiskFull, LeanoteRagError, TooLarge, Unavailable, UserError
from rag.index.retrieve import RETRIEVERS
from rag.memory import explore

from bot.api import chatdoor as chat, web
from bot.api.access import LOCAL, BodyLimit, Caller, TokenAuth, TokenFirst
from bot.chat.texts import NO_TRACE_KEPT, not_saved_text, trace_text
from bot.render import NoteLinks, file_place, notes_root, web_html
from bot.usecases import answers as answers_case, asking, capture as capture_case, digest as digest_case, gaps as gaps_case, memory
from bot.usecases import status as status_case, syncing
from bot.usecases.people import Person, accounts, leanote_user, resolve_user, users as users_case

log = logging.getLogger(__name__)
NDJSON = "application/x-ndjson"
PROGRESS_EVERY = 0.25  # seconds between two progress events of a pass
EXPLORER = Path(__file__).with_name("explorer")
VENDOR = {"vis-network.min.js": "vis-network.min.js", "vis-network.css": "vis-network.css"}


class AskIn(BaseModel):
    question: str = Field(description="the question, in any language")
    user: str | None = Field(default=None, description="whose notes (default: the only user the caller may query)")
    conversation: str | None = Field(default=None, description="an id to keep follow-ups together (optional)")
    keep: bool = Field(default=False, description="keep the answer for its trace, 👍/👎 and saving "
                                                  "(`/answers/{answer_id}/…`): its id is the answer event's `answer_id`")


class RatingIn(BaseModel):
    verdict: str = Field(description="`up` (👍) or `down` (👎, which keeps the question as one of the caller's gaps); "
                                     "a later one replaces it")
    user: str | None = Field(default=None, description="whose notes (default: the only user the caller may query)")


class VerdictIn(BaseModel):
    id: str = Field(description="a fact's or related pair's id (`fact_id`, `pair_id`)")
    verdict: str = Field(description="`rejected` (it goes, and extraction never brings it back) or `confirmed`")
    user: str | None = Field(default=None, description="whose memory (default: the only user the caller may query)")


class NoteIn(BaseModel):
    text: str = Field(description="the note's text (Markdown); its title is the gap's question")
    user: str | None = Field(default=None, description="whose notes (default: the only user the caller may query)")


class CaptureIn(BaseModel):
    text: str = Field(description="the note's text (Markdown): its first line is the title, #hashtags its tags")
    title: str | None = Field(default=None, description="the title, when not the text's first line")
    once: str | None = Field(default=None, description="an id of the caller's for this note: the same id again "
                                                        "writes nothing new and answers with the first note")
    user: str | None = Field(default=None, description="whose notes (default: the only user the caller may query)")


class SyncIn(BaseModel):
    reconcile: bool = Field(default=False, description="compare everything with the source, not just changes")
    rebuild: bool = Field(default=False, description="empty the index and read every note again")
    wait: bool = Field(default=True, description="stream progress and the result (else start it and return)")


def _event(**fields) -> bytes:
    return (json.dumps(fields, ensure_ascii=False) + "\n").encode()


def _error_body(err: Exception) -> tuple[int, dict]:
    if isinstance(err, chat.Refused):  # the web chat's session said no
        return err.status, {"error": str(err), "kind": err.kind}
    if isinstance(err, TooLarge):
        return 413, {"error": str(err), "kind": "user"}
    if isinstance(err, UserError):
        return 400, {"error": str(err), "kind": "user"}
    if isinstance(err, Unavailable):
        return 503, {"error": str(err), "kind": "unavailable"}
    if isinstance(err, LeanoteRagError):
        return 500, {"error": str(err), "kind": "internal"}
    return 500, {"error": "internal error: see the daemon's log", "kind": "internal"}


def invalid_request(errors: list[dict]) -> str:
    """What is wrong with a request FastAPI could not read (``RequestValidationError.errors()``),
    in words: where and what, never the value sent (it may be large, or a secret)."""
    said = []
    for e in errors[:3]:
        where = ".".join(str(part) for part in e.get("loc", ()) if not isinstance(part, int)) or "the request"
        if e.get("type") == "json_invalid":
            said.append(f"the body is not valid JSON ({(e.get('ctx') or {}).get('error', 'cannot be read')})")
        elif where == "body" and e.get("type") in ("missing", "model_attributes_type", "dict_type"):
            said.append("the body must be a JSON object")
        else:
            said.append(f"{where}: {e.get('msg', 'not valid')}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(said) + more


def _documented_errors(app: FastAPI) -> None:
    """The OpenAPI description says what every error is: ``{"error", "kind"}`` (FastAPI's own
    422 ``{"detail"}`` is never sent: a request it cannot read is answered 400)."""
    made = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = made()
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        schemas["Error"] = {"type": "object", "required": ["error", "kind"], "properties": {
            "error": {"type": "string", "description": "what is wrong, and what to do"},
            "kind": {"type": "string", "enum": ["user", "auth", "unavailable", "internal"]}}}
        error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                responses.setdefault("400", {"description": "the request cannot be used (kind: user)", "content": error})
                responses.setdefault("default", {"description": "an error", "content": error})
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


def create_app(daemon, auth: TokenAuth | None = None) -> FastAPI:
    """The API over what the daemon (``bot.serve.Daemon``) holds. ``auth`` None: the local
    socket (full access)."""
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
        if auth is None:
            return LOCAL
        return getattr(request.state, "caller", None) or auth.caller(request.headers.get("authorization", ""))

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

    def parts():
        if not daemon.ready:
            raise Unavailable(f"the daemon is starting: {daemon.not_ready or 'the index is not open yet'}")
        return daemon.parts

    @app.exception_handler(LeanoteRagError)
    async def _ours(request: Request, err: LeanoteRagError):
        status, body = _error_body(err)
        return JSONResponse(body, status_code=status, headers=getattr(err, "headers", None) or None)

    @app.exception_handler(StarletteHTTPException)  # ours, and the router's (no such path, method)
    async def _http(request: Request, err: StarletteHTTPException):
        kind = "auth" if err.status_code in (401, 403) else "unavailable" if err.status_code == 429 else "user"
        detail = err.detail
        if err.status_code == 404 and detail == "Not Found":
            detail = f"no such path: {limits.echoed(request.url.path)} (GET /openapi.json lists them)"
        elif err.status_code == 405:
            detail = f"{request.method} is not how {limits.echoed(request.url.path)} is called (see GET /openapi.json)"
        return JSONResponse({"error": detail, "kind": kind}, status_code=err.status_code, headers=err.headers)

    @app.exception_handler(RequestValidationError)  # a body that is not JSON, a field of the wrong type ...
    async def _invalid(request: Request, err: RequestValidationError):
        return JSONResponse({"error": invalid_request(err.errors()), "kind": "user"}, status_code=400)

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception):
        log.error("API %s %s failed", request.method, request.url.path, exc_info=err)
        status, body = _error_body(err)
        return JSONResponse(body, status_code=status)

    async def scoped_users(who: Caller) -> dict[str, int]:
        counts = await users_case(parts())
        return {u: n for u, n in counts.items() if who.may_see(u)}

    async def person(who: Caller, user: str | None, conversation: str | None = None) -> Person:
        """The caller as a person of one Leanote user: ``user`` (an id, or an account's email),
        or the only one the caller may query. The local socket's user is the machine's operator,
        as the command line is."""
        users = await scoped_users(who)
        if not user:
            user_id = resolve_user(users, None)
        else:
            user_id = leanote_user(parts(), user)
            if user_id not in users:  # as asked: an email is never answered with the Leanote user it is
                mine = ", ".join(sorted(users)) or "none"
                raise UserError(f"no notes of user {limits.echoed(user)!r} that this caller may query "
                                f"(its users with notes: {mine})")
        key = who.person
        return Person(key, user_id, who.admin, f"{key}:{conversation}" if conversation else None)

    @app.get("/health", summary="liveness and readiness (the details with a token, or on the socket)")
    async def health(request: Request) -> JSONResponse:
        last = daemon.last_pass
        is_open = daemon.ready
        ready = is_open and (last is None or last.ok)
        reason = None if ready else "the index is not open yet" if not is_open else "the last sync failed"
        sync = daemon.parts.sync if daemon.parts is not None and daemon.parts.built("sync") else None
        fault = sync.fault if sync is not None else None
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
                "index": "open" if is_open else (daemon.not_ready or "not open yet"),
                "last_sync_ok": None if last is None else last.ok,
                "passes": daemon.passes,
            })
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/status", summary="sync and index status (the CLI's `status --json`)")
    async def status(who: Caller = Depends(caller)) -> dict:
        # an admin sees every account; anyone else only their own users' (no other's email or error)
        asker = Person(who.person, "", who.admin)
        return await status_case.status(parts(), asker, users=sorted(who.users or ()))

    @app.get("/users", summary="indexed chunks per Leanote user the caller may query (and, for an admin, the "
                               "Leanote user of each API account that has synced, by its email)")
    async def users(who: Caller = Depends(caller)) -> dict:
        found = {"users": await scoped_users(who)}
        if who.admin:
            found["accounts"] = dict(accounts(parts()))
        return found

    @app.get("/search", summary="the best chunks for a query")
    async def search(q: str = Query(description="the query"), user: str | None = None,
                     k: int | None = Query(default=None, ge=1, le=100), retriever: str = "hybrid",
                     who: Caller = Depends(caller)) -> dict:
        q = small(q, "the query")
        if retriever not in RETRIEVERS:
            raise UserError(f"unknown retriever {limits.echoed(retriever)!r}; choose one of {', '.join(RETRIEVERS)}")
        counted(who)
        found = await asking.search(parts(), await person(who, user), q, k, retriever)
        return found.as_json()

    @app.post("/ask", summary="an answer from the notes, streamed as NDJSON events",
              response_class=StreamingResponse, responses={200: {"content": {NDJSON: {}}}})
    async def ask(body: AskIn, who: Caller = Depends(caller)) -> StreamingResponse:
        if who.web:  # the web chat: through the person's session (its limits, its message cut)
            started = await chat.ask(parts(), who, body.question, body.conversation, body.user)
            return StreamingResponse(_answer_events(parts(), None, body.question, started=started), media_type=NDJSON)
        question = small(body.question, "the question")
        counted(who)
        asker = await person(who, body.user, body.conversation)
        return StreamingResponse(_answer_events(parts(), asker, question, body.keep), media_type=NDJSON)

    # --- an answer kept (``keep``): its trace, the caller's 👍 / 👎, saved as a note ------------------

    async def kept_answer(who: Caller, user: str | None, answer_id: str) -> tuple[Person, object]:
        """The caller's own answer ``answer_id``; another person's is no more found than one never kept."""
        asker = await person(who, user)
        try:
            return asker, await asyncio.to_thread(answers_case.pressed, parts(), asker.key, small(answer_id, "the id"))
        except (UnknownAnswer, NotYours):
            raise HTTPException(404, f"no answer {limits.echoed(answer_id)} of yours is kept (ask with keep: true; "
                                     f"answers are kept {KEEP_DAYS} days)") from None

    @app.get("/why", summary="why the last answer in the caller's conversation is what it is (the bots' /why)")
    async def why_last(conversation: str, user: str | None = None, who: Caller = Depends(caller)) -> dict:
        if who.web:
            return await chat.why(parts(), who, small(conversation, "the conversation"), user)
        why = asking.why(parts(), await person(who, user, small(conversation, "the conversation")))
        return {"question": None, "rows": [], "candidates": [], "timings_ms": {}, "text": trace_text(why),
                **(why.as_json() if why is not None else {})}

    @app.get("/answers/{answer_id}/why", summary="why one of the caller's kept answers is what it is (its trace)")
    async def why_answer(answer_id: str, user: str | None = None, who: Caller = Depends(caller)) -> dict:
        if who.web:
            return await chat.answer_button(parts(), who, "why", small(answer_id, "the id"), user)
        asker, record = await kept_answer(who, user, answer_id)
        why = answers_case.why(asker, record)
        body = why.as_json() if why is not None else {"question": record.question, "rows": [], "candidates": [],
                                                      "timings_ms": {}}
        return {"answer_id": record.id, **body, "text": trace_text(why) if why is not None else
                f"问题 question: {record.question}\n{NO_TRACE_KEPT}"}

    @app.post("/answers/{answer_id}/feedback", summary="the caller's 👍 (up) or 👎 (down) on one of their answers")
    async def rate_answer(answer_id: str, body: RatingIn, who: Caller = Depends(caller)) -> dict:
        if body.verdict not in ("up", "down"):
            raise UserError(f"verdict must be 'up' or 'down', not {limits.echoed(body.verdict)!r}")
        if who.web:
            return await chat.answer_button(parts(), who, body.verdict, small(answer_id, "the id"), body.user)
        asker, record = await kept_answer(who, body.user, answer_id)
        done = await asyncio.to_thread(answers_case.rate, parts(), asker, record, body.verdict)
        return {"answer_id": done.id, "verdict": done.verdict}

    @app.post("/answers/{answer_id}/save", summary="save one of the caller's answers as a note (once, however "
                                                   "often asked)")
    async def save_answer(answer_id: str, user: str | None = None, who: Caller = Depends(caller)) -> dict:
        if who.web:
            return await chat.answer_button(parts(), who, "save", small(answer_id, "the id"), user)
        asker, record = await kept_answer(who, user, answer_id)
        house = parts()
        blocked = await answers_case.save_blocked(house, asker, record)
        if blocked is not None:
            return {"status": "saved" if blocked.why == "saved" else "not_saved", "why": blocked.why,
                    "message": not_saved_text(blocked)[0], "url": blocked.url, "note_id": "", "again": True}
        return asdict(await answers_case.save_answer(house, asker, record))

    @app.post("/sync", summary="a sync pass now (admin)",
              responses={200: {"content": {NDJSON: {}}, "description": "with wait: progress events, then the result"}})
    async def sync(body: SyncIn, who: Caller = Depends(admin)):
        house = parts()
        operator = Person(who.person, "", True)
        if not body.wait:
            task = asyncio.create_task(syncing.sync_now(house, operator, body.reconcile, body.rebuild))
            task.add_done_callback(_log_failure)
            return {"started": True}
        return StreamingResponse(_sync_events(house, operator, body), media_type=NDJSON)

    @app.get("/metrics", summary="Prometheus metrics (admin)", response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def metrics(request: Request, who: Caller = Depends(admin)) -> Response:
        body, content_type = await asyncio.to_thread(daemon.metrics.exposition, request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

    # --- the caller's knowledge gaps and digest ---------------------------------------------------

    @app.get("/gaps", summary="the questions the caller's notes could not answer, grouped by meaning, the most "
                              "asked lately first (each with its wordings, count, last asked, state)")
    async def gaps_list(user: str | None = None, state: list[str] = Query(default=["open"]),
                        who: Caller = Depends(caller)) -> list[dict]:
        bad = [s for s in state if s not in ("open", "closed", "dismissed")]
        if bad:
            raise UserError(f"unknown state {limits.echoed(bad[0])!r}: open, closed or dismissed")
        asker = await person(who, user)
        return [g.as_json() for g in await asyncio.to_thread(gaps_case.listing, parts(), asker, tuple(state))]

    @app.post("/gaps/{gap_id}/dismiss", summary="dismiss one of the caller's gaps")
    async def gaps_dismiss(gap_id: str, user: str | None = None, who: Caller = Depends(caller)) -> dict:
        if who.web:
            return await chat.gap(parts(), who, small(gap_id, "the gap id"), None, user)
        asker = await person(who, user)
        return (await asyncio.to_thread(gaps_case.dismiss, parts(), asker, small(gap_id, "the gap id"))).as_json()

    @app.post("/gaps/{gap_id}/note", summary="write the note for one of the caller's gaps (titled by its question)")
    async def gaps_note(gap_id: str, body: NoteIn, who: Caller = Depends(caller)) -> dict:
        if who.web:
            return await chat.gap(parts(), who, small(gap_id, "the gap id"), body.text, body.user)
        asker = await person(who, body.user)
        house = parts()
        draft = await asyncio.to_thread(gaps_case.draft_for, house, asker, small(gap_id, "the gap id"), "api")
        receipt = await gaps_case.write_draft(house, asker, draft, body.text, once=f"api:gap:{gap_id}")
        return asdict(receipt)

    @app.post("/note", summary="capture a note into the caller's notes (Leanote, or the notes folder), written once")
    async def note(body: CaptureIn, who: Caller = Depends(caller)) -> dict:
        if who.web:
            once = small(body.once, "the once id") if body.once else None
            return await chat.note(parts(), who, body.text, body.title, once, body.user)
        asker = await person(who, body.user)
        once = capture_case.note_once(small(body.once, "the once id") if body.once else "")
        return asdict(await capture_case.note(parts(), asker, body.text, title=body.title or "", once=once))

    @app.get("/digest", summary="what the caller's digest would say now (nothing is sent)")
    async def digest_view(user: str | None = None, since: float | None = None, who: Caller = Depends(caller)) -> dict:
        asker = await person(who, user)
        return (await asyncio.to_thread(digest_case.compose, parts(), asker, since)).as_json()

    # --- the memory -------------------------------------------------------------------------

    @app.get("/memory/about", summary="what the memory knows about a name: its facts, the notes that mention it")
    async def memory_about(name: str, user: str | None = None, who: Caller = Depends(caller)) -> dict:
        small(name, "the name")
        return (await memory.about(parts(), await person(who, user), name)).as_json()

    @app.get("/memory/related", summary="the notes related to a note (its id or title) or to a question")
    async def memory_related(target: str, user: str | None = None, k: int = Query(default=8, ge=1, le=100),
                             who: Caller = Depends(caller)) -> dict:
        small(target, "the question")
        return (await memory.related(parts(), await person(who, user), target, k)).as_json()

    @app.get("/memory/find", summary="entities and notes whose name or title contains q")
    async def memory_find(q: str = Query(description="part of a name or title, or a note id"), user: str | None = None,
                          limit: int = Query(default=20, ge=1, le=100), who: Caller = Depends(caller)) -> dict:
        q = small(q, "the search")
        asker = await person(who, user)
        return {"query": q, "user_id": asker.user_id, **await memory.find(parts(), asker, q, limit)}

    @app.get("/memory/graph", summary="the neighbourhood of an entity or a note")
    async def memory_graph(entity: str | None = None, note: str | None = None, user: str | None = None,
                           who: Caller = Depends(caller)) -> dict:
        if (entity is None) == (note is None):
            raise UserError("give entity=NAME or note=NOTE_ID")
        small(entity or note, "the name")
        asker = await person(who, user)
        graph = await memory.graph(parts(), asker, entity=entity, note=note)
        if graph is None:
            raise HTTPException(404, f"no note {limits.echoed(note)} in this user's memory")
        return {"user_id": asker.user_id, **graph}

    @app.get("/memory/note/{note_id}", summary="a note's card: summary, facts with quotes, entities, related notes")
    async def memory_note(note_id: str, user: str | None = None, who: Caller = Depends(caller)) -> dict:
        asker = await person(who, user)
        card = await memory.note_card(parts(), asker, note_id)
        if card is None:
            raise HTTPException(404, f"no note {limits.echoed(note_id)} in this user's memory")
        return {"user_id": asker.user_id, **card}

    @app.get("/memory/entity", summary="an entity's card: its facts with sources, the notes that mention it")
    async def memory_entity(name: str, user: str | None = None, who: Caller = Depends(caller)) -> dict:
        small(name, "the name")
        asker = await person(who, user)
        about = await memory.about(parts(), asker, name)
        return {"user_id": asker.user_id, **explore.card_of(about.entity, about.facts, about.notes)}

    @app.post("/memory/verdict", summary="reject or confirm a fact or a related pair")
    async def memory_verdict(body: VerdictIn, who: Caller = Depends(caller)) -> dict:
        if body.verdict not in memory.VERDICTS:
            raise UserError(f"verdict must be 'rejected' or 'confirmed', not {limits.echoed(body.verdict)!r}")
        asker = await person(who, body.user)
        return (await memory.verdict(parts(), asker, body.id, body.verdict)).as_json()

    @app.get("/explorer", summary="the memory explorer (a web page)", response_class=HTMLResponse)
    async def explorer_page() -> FileResponse:
        return FileResponse(EXPLORER / "index.html", media_type="text/html")

    @app.get("/explorer/{name}", summary="the explorer's scripts and styles", include_in_schema=False)
    async def explorer_asset(name: str) -> FileResponse:
        path = _asset(name)
        if path is None:
            raise HTTPException(404, f"no such file: {limits.echoed(name)}")
        return FileResponse(path, headers={"Cache-Control": "no-cache"})

    if auth is not None:  # the web chat: on the TCP listener, where browsers come
        web.mount(app, daemon, auth, parts)
    _documented_errors(app)
    return app


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


async def _answer_events(parts, person: Person | None, question: str, keep: bool = False,
                         started: tuple | None = None) -> AsyncIterator[bytes]:
    """The answer's events; ``started``: a chat session's ask under way (``chatdoor.ask``: its
    task, whose result is an ``AnswerView``, and the queue of its events), its notices sent too."""
    if started is None:
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.create_task(asking.ask(parts, person, question, keep=keep,
                                              on_token=lambda text: queue.put_nowait(("token", text)),
                                              on_sources=lambda found: queue.put_nowait(("sources", found))))
        task.add_done_callback(lambda _: queue.put_nowait(None))
    else:
        task, queue = started
    try:
        while (item := await queue.get()) is not None:
            kind, value = item
            if kind == "sources":  # before the LLM reads: the notes its evidence comes from
                yield _event(event="sources", sources=[asdict(c) for c in value])
            else:
                yield _event(event="token", text=value)
        asked = task.result()
        view, asked = (asked, asked.asked) if started is not None else (None, asked)
        answer = asked.answer
    except Exception as err:  # the stream has started: the error is an event
        if not isinstance(err, LeanoteRagError):
            log.error("answering over the API failed", exc_info=err)
        _, body = _error_body(err)
        yield _event(event="error", **body)
        return
    finally:
        task.cancel()  # the client went away: stop writing its answer
    # the answer as HTML for a page: every link-like token inert, but the cited passages' own links
    root = notes_root(parts.settings)  # a note file is named by its path in the notes folder (``places``)
    places = {c.url: file_place(c.url, root) for c in (*answer.citations, *answer.closest) if file_place(c.url, root)}
    yield _event(event="answer", answer=answer.as_json(with_trace=True), answer_id=asked.answer_id,
                 html=web_html(answer.shown, NoteLinks(answer.citations)), places=places,
                 **({"notices": view.notices} if view is not None else {}))


async def _sync_events(parts, person: Person, body: SyncIn) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    sent = [0.0]

    def progress(step) -> None:  # called in the sync's thread (sync.progress.Step); a few a second at most
        now = loop.time()
        if now - sent[0] >= PROGRESS_EVERY:
            sent[0] = now
            loop.call_soon_threadsafe(queue.put_nowait, step.as_json())

    task = asyncio.create_task(syncing.sync_now(parts, person, body.reconcile, body.rebuild, progress))
    task.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, None))
    try:
        while (item := await queue.get()) is not None:
            yield _event(event="progress", **item)
        done = task.result()
    except Exception as err:
        _, error = _error_body(err)
        yield _event(event="error", **error)
        return
    if done.stopped:
        yield _event(event="error", error="the daemon is stopping: the pass ended early (the next start carries on)",
                     kind="unavailable")
        return
    yield _event(event="result", summary=done.summary, failures=done.failures)
