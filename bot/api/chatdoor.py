"""The web chat as a door of the chat session: what a person signed in at ``/chat`` does goes
through their ``bot.session.Session``, as it does from Telegram or Discord.

A cookie's caller (``Caller.web``) is a person: ``telegram:111`` when a bot's one-time link
opened the session, ``api:<name>`` when a token did. Their session is ``Session(parts, platform,
id, place)`` of that key (``platform`` and ``id`` split from it), ``place`` the page's
conversation (``web-<id>``: a tab's follow-ups, its ``/why``; ``web`` where none is sent), never
an admin (a browser's cookie is not). So one person is one person at every door: their
``bots.rate_limit`` counts a question on the web with those asked in Telegram, their answers'
buttons, their gaps and captures are the same, and what the session refuses (a stranger, too
many questions, another's answer or gap) it refuses here too, with its words.

What the page calls and the session's method for it (``bot.api.app`` sends a cookie's request
here; a token's and the local socket's stay the API's own): ``POST /ask`` (``ask``: the message
cut to ``limits.question_chars`` with a notice, not refused), ``GET /why`` (``why``),
``/answers/{id}/why``, ``/feedback``, ``/save`` (``press`` on the answer's buttons),
``/gaps/{id}/dismiss`` and ``/note`` (``dismiss``, ``gap_note``), ``POST /note`` (``note``;
its idempotency key the session's ``once``). A refusal (``Reply.refused``) is the API's error:
its reason code gives the HTTP status (``STATUS``), its text the ``error``; a capture refused
(nowhere to write, too long) is a receipt, as the API answers it. The page's lists (``GET
/gaps``, ``/memory/related``) are the API's, read for the same person (``Caller.person``)."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from rag.errors import LeanoteRagError, UserError

from bot.api.access import Caller
from bot.session import Reply, Session

STATUS = {  # a refusal's reason code -> the HTTP status it is answered with (else it is a receipt)
    "stranger": 403, "not_allowed": 403, "many_users": 400, "empty": 400, "slow_down": 429, "not_yours": 404,
    "unknown_answer": 404, "remapped": 404, "unknown_gap": 400, "gap_done": 400, "unknown_button": 400,
    "unresolved": 503}


class Refused(LeanoteRagError):
    """A refusal of the session, as the API answers it: ``status`` and ``kind`` (``{error, kind}``)."""

    def __init__(self, status: int, text: str, wait: float = 0.0):
        super().__init__(text)
        self.status = status
        self.headers = {"Retry-After": str(max(1, round(wait)))} if status == 429 and wait else {}
        self.kind = ("auth" if status in (401, 403) else "unavailable" if status in (429, 503)
                     else "internal" if status >= 500 else "user")


def session(parts, who: Caller, user: str | None = None, conversation: str | None = None) -> Session:
    """The caller's session on the web door (``user``: whose notes, one of the caller's)."""
    if user and user not in (who.users or ()):
        mine = ", ".join(sorted(who.users or ())) or "none"
        raise UserError(f"no notes of user {user[:80]!r} that you may ask (yours: {mine})")
    platform, _, name = who.person.partition(":")
    place = f"web-{conversation[:100]}" if conversation else "web"
    return Session(parts, platform, name, place, user=user, admin=False)


def done(reply: Reply) -> Reply:
    """``reply``, unless it is a refusal the API answers as an error (raised)."""
    status = STATUS.get(reply.refused)
    if status is not None:
        raise Refused(status, reply.text, reply.wait)
    return reply


async def ask(parts, who: Caller, question: str, conversation: str | None, user: str | None):
    """The question asked through the session: (its task, the queue of its ``sources`` and
    ``token`` events) once it is let through, for ``app._answer_events``; a refusal raised."""
    queue: asyncio.Queue = asyncio.Queue()
    through = asyncio.Event()

    async def ready() -> None:
        through.set()

    task = asyncio.create_task(session(parts, who, user, conversation).ask(
        question, ready=ready, on_token=lambda text: queue.put_nowait(("token", text)),
        on_sources=lambda found, head: queue.put_nowait(("sources", found))))
    waiting = asyncio.create_task(through.wait())
    await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if task.done() and (task.exception() is not None or isinstance(task.result(), Reply)):
        done(task.result())  # a refusal before any work (raised); a failure raises itself
        raise Refused(500, "the answer was refused without a reason")
    task.add_done_callback(lambda _: queue.put_nowait(None))
    return task, queue


async def why(parts, who: Caller, conversation: str, user: str | None) -> dict:
    return {"text": done(await session(parts, who, user, conversation).why()).text}


async def answer_button(parts, who: Caller, act: str, answer_id: str, user: str | None) -> dict:
    """👍 / 👎 (``act`` "up", "down"), "Why?" ("why") or "Save as note" ("save") under an answer of theirs."""
    data = {"up": "fb:up", "down": "fb:down"}.get(act, act)
    reply = done(await session(parts, who, user).press(f"{data}:{answer_id}"))
    if act == "save":
        if reply.then is not None:
            reply = await reply.then()
        if reply.receipt is not None:
            return asdict(reply.receipt)
        return {"status": "not_saved" if reply.refused else "saved", "why": reply.refused or "saved",
                "message": reply.text, "url": "", "note_id": "", "again": True}
    return {"answer_id": answer_id, **({"verdict": act} if act != "why" else {}), "text": reply.text}


async def gap(parts, who: Caller, gap_id: str, text: str | None, user: str | None) -> dict:
    """✖ a gap of theirs (``text`` None), or its note written."""
    s = session(parts, who, user)
    if text is None:
        return {"id": gap_id, "state": "dismissed", "text": done(await s.dismiss(gap_id)).text}
    return receipt(done(await s.gap_note(gap_id, text, once=s.once(f"gap:{gap_id}"))))


async def note(parts, who: Caller, text: str, title: str | None, once: str | None, user: str | None) -> dict:
    s = session(parts, who, user)
    return receipt(done(await s.note(text, title=title or "", once=s.once(f"note:{once}") if once else "")))


def receipt(reply: Reply) -> dict:
    """A capture's receipt; a capture refused before it was taken (nowhere to write) is one too."""
    if reply.receipt is not None:
        return asdict(reply.receipt)
    return {"status": "refused", "message": reply.text, "note_id": "", "url": "", "key": "", "again": False}
