"""The status: the sync (each account's cursor against the server's, last success and error,
when it runs next), the index, the LLM's speed here, the captures waiting, the memory, and
what keeps the sync from working. Built in one place: with a running daemon from the parts it
holds, else from the state and index opened here; every door shows the same report.

JSON (``GET /status``, ``status --json``): ``{"index", "backend", "embedder", "dim" (the index's:
None before the first pass), "embedder_configured",
"source", "users": [{"user_id", "notes", "chunks"}], "accounts": [{"source", "account",
"user_id", "cursor_usn", "server_usn", "lag", "notes_indexed", "last_success", "last_error",
"failing_since", "next_run", "usn_went_back"}], "last_sync", "skipped", "llm", "capture",
"memory", "problems", "second_index"}`` (``second_index``: None when off, else ``{"enabled",
"embedder", "chunks", "current", "left", "notes_covered", "rate", "seconds_left", "text"}``). An admin sees every account; anyone else only their own, without
another account's email or error.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from typing import TYPE_CHECKING, Iterable

from rag.redact import safe_url
from rag.config import Settings
from rag.memory.store import MemoryStore
from rag.speed import FILE as SPEED_FILE
from rag.speed import SIZES, Speed, model_size
from rag.speed import load as load_speeds
from rag.answer.sizing import fit, plan_for
from rag.index import embed as embed_mod
from rag.index.store import Store
from rag.model import Hit

from rag.errors import DiskFull, Unavailable

from sync.writeback.logins import account_emails
from sync.writeback.outbox import Outbox
from sync.faults import check_disk, reading_state
from sync.incremental import USN_BACK
from sync.memory_jobs import duration, outlook, wanted as llm_wanted
from sync.second_jobs import saved_rate, too_slow, wanted as second_wanted
from sync.state import State

from bot.usecases.people import Person

if TYPE_CHECKING:
    from bot.root import Parts


async def status(parts: "Parts", person: Person, users: Iterable[str] | None = None) -> dict:
    """The status as ``person`` may see it: everything for an admin, else only their own
    account and counts (those of ``users``, when they may see several: an API token's)."""
    settings = parts.settings
    users = None if person.admin else list(users if users is not None else [person.user_id])

    def read(state: State) -> dict:
        with reading_state(state):
            return status_report(settings, state, parts.store(), users=users, memory=parts.memory_to_read,
                                 outbox=parts.outbox_if_made())

    if not parts.scheduled:  # the state and the index opened here
        state = parts.state
        state.verify()  # a damaged page anywhere is named, with the fix
        return read(state)

    def report() -> dict:  # off the event loop, on the daemon's reading connection
        body = parts.schedule.reading(read)
        if body is None:
            raise Unavailable("the daemon is starting or stopping: try again in a moment")
        if person.admin:  # the schedule's word on a kind wins (it says when it tries again)
            own = parts.schedule.problems()
            body["problems"] = own + [p for p in body["problems"] if p["kind"] not in {o["kind"] for o in own}]
            llm = (body.get("memory") or {}).get("llm")
            if llm is not None and parts.built("memory_jobs"):  # the daemon's worker: this run
                llm["worker"] = parts.memory_jobs.state()
                questions = (body.get("memory") or {}).get("questions")
                if questions is not None:
                    questions["worker"] = llm["worker"].pop("questions")
            if body.get("second_index") is not None and parts.built("second_fill"):  # the fill, this run
                body["second_index"].update(parts.second_fill.state())
        return body

    return await parts.answers.in_search_thread(report)


def when(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts).isoformat(timespec="seconds") if ts else None


def status_report(settings: Settings, state: State, store: Store | None, users: Iterable[str] | None = None,
                  memory: MemoryStore | None = None, outbox: Outbox | None = None) -> dict:
    """The sync and index status. ``store`` None: no index yet; ``memory`` None: no memory
    (off, or not made yet); ``outbox`` None: nothing was ever captured. ``users``: only these
    Leanote users' accounts and counts (a caller who may see only their own)."""
    notes = state.counts_by_user()
    accounts = [
        {
            "source": a.source,
            "account": a.account,
            "user_id": a.user_id,
            "cursor_usn": a.cursor,
            "server_usn": a.server_usn,
            "lag": (a.server_usn - a.cursor) if a.server_usn is not None else None,
            "notes_indexed": state.indexed_count(a.source, a.account) if settings.source.incremental else None,
            "last_success": when(a.last_success),
            "last_error": a.last_error,
            "failing_since": when(a.failing_since),
            "next_run": when(a.next_run),
            "usn_went_back": usn_went_back(state, a.source, a.account),
        }
        for a in state.accounts()
    ]
    skipped = [{**s, "at": when(s["at"])} for s in state.skipped()]
    last = state.last_run()
    if store is None:
        chunks, manifest, location = {}, {}, f"{settings.state_dir} (no index yet: run `leanote-rag index`)"
    else:
        chunks, manifest, location = store.count_by_user(), store.manifest() or {}, store.location
    known = sorted(set(notes) | set(chunks))
    last_sync = last and {**last, "ok": last["error"] is None}
    if users is not None:
        allowed = set(users)
        known = [u for u in known if u in allowed]
        # an account is the caller's by its user id, or by its email while it has none (never logged in)
        accounts = [a for a in accounts if a["user_id"] in allowed or a["account"] in {u.lower() for u in allowed}]
        skipped = [s for s in skipped if any(s["account"] == a["account"] for a in accounts)]
        last_sync = _scoped_run(last, {a["account"] for a in accounts}, settings.source.incremental)
    return {
        "index": location,
        "backend": settings.qdrant.kind,
        "embedder": manifest.get("embedder"),
        "dim": manifest.get("dim"),
        "embedder_configured": embed_mod.expected_model_id(settings.embedder) or settings.embedder.kind,
        "source": source_of(settings, everyone=users is None),
        "users": [{"user_id": u, "notes": notes.get(u, 0), "chunks": chunks.get(u, 0)} for u in known],
        "accounts": accounts,
        "last_sync": last_sync,
        "skipped": skipped,
        "llm": {model: _speed(model, speed, settings, everyone=users is None)
                for model, speed in load_speeds(settings.state_dir / SPEED_FILE).items()},
        "capture": capture_counts(settings, outbox, None if users is None else list(allowed)),
        "memory": memory_counts(settings, memory, None if users is None else list(allowed)),
        "problems": problems(settings) if users is None else [],
        "second_index": second_index(settings) if users is None else None,
    }


def second_index(settings: Settings) -> dict | None:
    """The second dense index as the status shows it without its worker: on or auto, the fill
    rate last measured here and whether it fits a night (None: off). The daemon adds how far the
    fill is and the time left (``sync.second_jobs.SecondFill.state``)."""
    if not second_wanted(settings):
        return None
    rate = saved_rate(settings) or {}
    return {"enabled": settings.second_index.enabled, "embedder": rate.get("embedder"), "rate": rate.get("rate"),
            "chunks": rate.get("chunks"), "current": None, "left": None, "notes_covered": None,
            "seconds_left": None, "text": too_slow(settings, rate.get("rate"), rate.get("chunks")) or
            "filled by the running service (`leanote-rag serve`), between questions"}


def second_line(s: dict | None) -> str | None:
    """The second index's line of the status, or None when it is off."""
    if not s:
        return None
    line = f"second index ({s['enabled']}): {s.get('embedder') or 'not loaded yet'}"
    if s.get("chunks") is not None and s.get("current") is not None:
        line += f"; {s['current']} of {s['chunks']} chunks embedded"
        if s.get("notes_covered") is not None:
            line += f", {s['notes_covered']} notes searched with it"
        if s.get("left"):
            line += (f", ~{duration(s['seconds_left'])} left at {s['rate']:.2f} chunks/s" if s.get("seconds_left")
                     is not None else f", {s['left']} to go")
    return line + (f"; {s['text']}" if s.get("text") else "")


def capture_counts(settings: Settings, outbox: Outbox | None, users: list[str] | None) -> dict | None:
    """The captures waiting, written and refused, and the logins failing (of the configured
    accounts): only these users' if given; None when nothing was ever captured."""
    if outbox is None:
        return None
    return {**outbox.counts(users), "logins_failing": outbox.login_failures(account_emails(settings), users)}


def source_of(settings: Settings, everyone: bool = True) -> dict:
    """The configured source, and a line naming it whole: the folder or backup, Leanote's
    address and (for who may see every account) its accounts, MongoDB's server (no
    credentials) and database."""
    src = settings.source
    out = {"kind": src.kind, "path": str(src.path) if src.path else None}
    if src.kind in ("files", "mongodump"):
        out["text"] = f"{src.kind} {src.path}"
    elif src.kind == "leanote_api":
        out["url"] = safe_url(src.api_url or settings.leanote.base_url)
        out["text"] = f"leanote_api {out['url']}"
        if everyone:
            out["accounts"] = [a.email for a in src.accounts]
            out["text"] += f" ({len(src.accounts)} account{'s' if len(src.accounts) != 1 else ''}: " \
                           f"{', '.join(out['accounts'])})"
    else:
        url = os.environ.get(src.url_env or "", "")
        out["url"] = safe_url(url) if url else None
        where = out["url"] or f"the URL in ${src.url_env} (not set here)"
        out["text"] = f"mongodb {where}" + (f", database {src.database}" if src.database else "")
    return out


def _speed(model: str, speed, settings: Settings, everyone: bool) -> dict:
    """The LLM's speed here; how many replies it was learnt from (everyone's questions) and
    when only for a caller who may see every account."""
    out = {"read_tps": speed.read_tps and round(speed.read_tps, 1),
           "write_tps": speed.write_tps and round(speed.write_tps, 1),
           "text": speed.describe(model), "means": answers_here(settings, model, speed)}
    if everyone:
        out.update(replies=speed.samples, updated=when(speed.updated))
    else:
        out["text"] = re.sub(r" \(\d+ repl(?:y|ies)\)$", "", out["text"])
    return out


# A note's prose as the sizing reads it (Chinese: the larger token estimate), for a question whose
# best passages each fill an evidence block.
_PROSE = "番茄炒蛋先把鸡蛋打散，加少许盐搅匀；油热后倒入蛋液，凝固后盛出。"


def _sized(settings: Settings, model: str, speed: Speed) -> tuple[int, float, str]:
    """What the answer sizing (``rag.answer.sizing``) gives a question here at ``speed``: the
    evidence's characters, the seconds from the search to the first token, and why the LLM is
    not asked at all ("": it is)."""
    cfg = settings.answer
    text = (_PROSE * (cfg.block_chars // len(_PROSE) + 1))[: cfg.block_chars]
    top = [Hit(point_id=f"p{i}", note_id=f"n{i}", user_id="", title="", notebook="", heading="", url="", text=text,
               chunk_index=0, char_start=0, char_end=len(text), score=1.0 - i / 100) for i in range(cfg.top_k)]
    question = "番茄炒蛋怎么做？"
    plan = plan_for(settings, model, speed, question, top, elapsed=0.0)
    blocks, prompt, _ = fit(settings, question, top, plan)
    return sum(len(b.text) for b in blocks), plan.prompt_tokens(prompt) / speed.read_tps, plan.too_slow


def answers_here(settings: Settings, model: str, speed: Speed) -> str | None:
    """What answers do at the speed measured here, in the words of a person waiting: how much of
    the notes the LLM reads and when it starts writing, as the answer sizing works it out (the
    evidence is cut to ``answer.first_token_budget``, never below the best passage whole); and
    what the next model size would do, or the largest that reads all the evidence in time.
    None before a reading speed is known."""
    if not speed.read_tps:
        return None
    cfg = settings.answer
    chars, first, too_slow = _sized(settings, model, speed)
    if too_slow:
        return f"too slow here to answer within ollama.timeout ({too_slow}): answers are the best passages, cited"
    budget = f"answer.first_token_budget, {cfg.first_token_budget:g} s"
    if chars >= min(cfg.total_chars, cfg.top_k * cfg.block_chars):
        why = "all the answer settings allow"
    elif first > cfg.first_token_budget:
        why = f"of {cfg.total_chars:,}: the least an answer reads, which takes longer than {budget}, here"
    else:
        why = f"of {cfg.total_chars:,}: cut to start within {budget}"
    line = (f"answers here read ~{chars:,} characters of evidence ({why}) and start writing "
            f"{'over ' if speed.bound else ''}~{first:.0f} s after the search")
    size = model_size(model)
    bigger = next((s for s in SIZES if size and s > size), None)
    if bigger is not None:
        scaled = Speed(read_tps=speed.read_tps * size / bigger, calibration=speed.calibration,
                       write_tps=speed.write_tps and speed.write_tps * size / bigger)
        b_chars, b_first, b_slow = _sized(settings, model, scaled)
        line += (f"; a {bigger:g}B would be too slow to answer within ollama.timeout" if b_slow else
                 f"; a {bigger:g}B would read ~{b_chars:,} characters and start ~{b_first:.0f} s after it")
    return line


SHARED_FAILURE = "the last sync failed (the admin can see why)"


def _scoped_run(last: dict | None, mine: set[str], incremental: bool) -> dict | None:
    """The last pass as a caller who may see only the accounts ``mine`` sees it: ok unless
    one of theirs failed, and only their accounts' errors; nothing of another account (its
    email, its error, the pass's counts, which are everyone's). A failure that is no one
    account's (a snapshot source's, the pass itself) shows without its details."""
    if last is None:
        return None
    failures = (last["summary"] or {}).get("failures")
    if failures is None:  # the pass failed as a whole (or was written before failures were kept)
        error = SHARED_FAILURE if last["error"] else None
    else:
        own = [f"{account}: {err}" for account, err in failures.items() if account in mine]
        shared = any(account == "*" or not incremental for account in failures if account not in mine)
        error = "; ".join(own) or (SHARED_FAILURE if shared else None)
    return {"source": last["source"], "started": last["started"], "finished": last["finished"], "summary": None,
            "error": error, "ok": error is None}


def usn_went_back(state: State, source: str, account: str) -> dict | None:
    """When the server's history last changed under the cursor (Leanote restored from a backup):
    its USN went below the one synced, or a note seen was gone; ``why`` says which."""
    raw = state.get_meta(f"{USN_BACK}{source}:{account}")
    if not raw:
        return None
    seen = json.loads(raw)
    return {**seen, "at": when(seen.get("at"))}


def problems(settings: Settings) -> list[dict]:
    """What keeps every account from syncing, each with its fix: ``{"kind", "problem"}``."""
    out = []
    try:
        check_disk(settings.state_dir)
    except DiskFull as err:
        out.append({"kind": "disk_full", "problem": str(err)})
    return out


def memory_counts(settings: Settings, memory: MemoryStore | None, users: list[str] | None) -> dict | None:
    """Notes processed by tier, entities and mentions (only these users' if given); None
    without a memory."""
    if not settings.memory.enabled or memory is None:
        return None
    if users is None:
        llm = memory.llm_counts()
        if llm_wanted(settings) and llm["jobs_pending"]:  # what the backlog means in time here
            speed = load_speeds(settings.state_dir / SPEED_FILE).get(settings.ollama.model)
            llm["outlook"] = outlook(settings, *memory.llm_backlog(), settings.ollama.model, speed)
        llm["last_done"] = when(llm["last_done"])
        return {**memory.counts(), "llm": llm, "questions": memory.asked_counts()}
    totals: dict = {"notes": {}, "entities": 0, "mentions": 0}
    for user in users:
        c = memory.counts(user)
        for tier, n in c["notes"].items():
            totals["notes"][tier] = totals["notes"].get(tier, 0) + n
        totals["entities"] += c["entities"]
        totals["mentions"] += c["mentions"]
    totals["llm"] = _llm_totals([memory.llm_counts(user) for user in users])
    totals["llm"]["last_done"] = when(totals["llm"]["last_done"])
    totals["questions"] = _asked_totals([memory.asked_counts(user) for user in users])
    return totals


def sync_line(a: dict) -> str:
    """Where an account's sync stands against its server (a status account), in words: how many
    of the server's changes are left to sync."""
    if a["server_usn"] is None:
        return "not compared with the server yet"
    if a["lag"] is not None and a["lag"] < 0:
        return ("the server holds fewer changes than were synced (Leanote restored from a backup?): the next sync "
                "compares every note with it")
    if not a["lag"]:
        return "up to date with the server"
    return f"{a['lag']} change{'s' if a['lag'] != 1 else ''} on the server not synced yet"


def questions_line(q: dict | None) -> str:
    """The written questions in one line (status, /status): progress, ETA, drops, the worker."""
    if not q or not (q["notes"] or q["jobs_pending"] or q["generations_dropped"]):
        return ""
    line = f"questions written for search: {q['notes']} notes ({q['questions']} questions)"
    if q["jobs_pending"]:
        eta = f" (~{duration(q['eta_seconds'])} at {q['seconds_per_note']:g} s a note)" if q.get("eta_seconds") else ""
        line += f", {q['jobs_pending']} notes waiting{eta}"
    if q["generations_dropped"]:
        line += f", {q['generations_dropped']} notes' questions thrown away (they failed the checks)"
    if q.get("done_last_hour"):
        line += f"; {q['done_last_hour']} in the last hour"
    worker = q.get("worker") or {}
    if worker.get("text"):
        line += f"; {worker['text']}"
    return line


def _asked_totals(parts: list[dict]) -> dict:
    """The written questions' counts (``MemoryStore.asked_counts``) of several users as one."""
    out: dict = {"notes": 0, "questions": 0, "generations_dropped": 0, "dropped": {}, "jobs_pending": 0,
                 "jobs_parked": 0, "output_tokens": 0, "done_last_hour": 0, "done_last_day": 0}
    seconds = [(c["seconds_per_note"], c["notes"] + c["generations_dropped"]) for c in parts if c["seconds_per_note"]]
    for c in parts:
        for key in ("notes", "questions", "generations_dropped", "jobs_pending", "jobs_parked", "output_tokens",
                    "done_last_hour", "done_last_day"):
            out[key] += c[key]
        for reason, n in c["dropped"].items():
            out["dropped"][reason] = out["dropped"].get(reason, 0) + n
    n = sum(w for _, w in seconds)
    out["seconds_per_note"] = round(sum(s * w for s, w in seconds) / n, 1) if n else None
    out["eta_seconds"] = round(out["seconds_per_note"] * out["jobs_pending"]) if n else None
    return out


def _llm_totals(parts: list[dict]) -> dict:
    """The LLM tier's counts (``MemoryStore.llm_counts``) of several users as one."""
    out: dict = {"jobs_pending": 0, "jobs_parked": 0, "parked": [], "facts": 0, "facts_by_status": {},
                 "done_last_hour": 0, "done_last_day": 0, "last_done": None}
    for c in parts:
        for key in ("jobs_pending", "jobs_parked", "facts", "done_last_hour", "done_last_day"):
            out[key] += c[key]
        if c["last_done"] is not None and (out["last_done"] is None or c["last_done"] > out["last_done"]):
            out["last_done"] = c["last_done"]
        out["parked"] += c["parked"]
        for status, n in c["facts_by_status"].items():
            out["facts_by_status"][status] = out["facts_by_status"].get(status, 0) + n
    out["parked"] = out["parked"][:5]
    return out
