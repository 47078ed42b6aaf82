"""What ``status`` reports, built in one place: by the CLI from the state and the index
it opens, and by the daemon (``GET /status``) from the ones it holds. Both print the
same report the same way."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from typing import Iterable

import click

from rag.redact import safe_url
from rag.config import Settings
from rag.memory.store import MemoryStore
from rag.speed import FILE as SPEED_FILE
from rag.speed import load as load_speeds
from rag.speed import meaning
from rag.index.store import Store

from rag.errors import DiskFull

from sync.writeback.capture import account_emails
from sync.writeback.outbox import Outbox
from sync.faults import check_disk
from sync.incremental import USN_BACK
from sync.indexer import Summary
from sync.memory_jobs import outlook, wanted as llm_wanted
from sync.state import State


def when(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts).isoformat(timespec="seconds") if ts else None


def status_report(settings: Settings, state: State, store: Store | None, users: Iterable[str] | None = None,
                  memory: MemoryStore | None = None) -> dict:
    """The sync and index status. ``store`` None: no index yet; ``memory`` None: no memory
    (off, or not made yet). ``users``: only these Leanote users' accounts and counts (a
    caller who may see only their own)."""
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
        "source": source_of(settings, everyone=users is None),
        "users": [{"user_id": u, "notes": notes.get(u, 0), "chunks": chunks.get(u, 0)} for u in known],
        "accounts": accounts,
        "last_sync": last_sync,
        "skipped": skipped,
        "llm": {model: _speed(model, speed, settings, everyone=users is None)
                for model, speed in load_speeds(settings.state_dir / SPEED_FILE).items()},
        "capture": Outbox.counts_at(settings.state_dir, None if users is None else list(allowed),
                                    account_emails(settings)),
        "memory": memory_counts(settings, memory, None if users is None else list(allowed)),
        "problems": problems(settings) if users is None else [],
    }


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
           "text": speed.describe(model), "means": meaning(model, speed, settings.answer.first_token_budget)}
    if everyone:
        out.update(replies=speed.samples, updated=when(speed.updated))
    else:
        out["text"] = re.sub(r" \(\d+ repl(?:y|ies)\)$", "", out["text"])
    return out


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
        return {**memory.counts(), "llm": llm}
    totals: dict = {"notes": {}, "entities": 0, "mentions": 0}
    for user in users:
        c = memory.counts(user)
        for tier, n in c["notes"].items():
            totals["notes"][tier] = totals["notes"].get(tier, 0) + n
        totals["entities"] += c["entities"]
        totals["mentions"] += c["mentions"]
    totals["llm"] = _llm_totals([memory.llm_counts(user) for user in users])
    return totals


def _llm_totals(parts: list[dict]) -> dict:
    """The LLM tier's counts (``MemoryStore.llm_counts``) of several users as one."""
    out: dict = {"jobs_pending": 0, "jobs_parked": 0, "parked": [], "facts": 0, "facts_by_status": {}}
    for c in parts:
        for key in ("jobs_pending", "jobs_parked", "facts"):
            out[key] += c[key]
        out["parked"] += c["parked"]
        for status, n in c["facts_by_status"].items():
            out["facts_by_status"][status] = out["facts_by_status"].get(status, 0) + n
    out["parked"] = out["parked"][:5]
    return out


def print_status(report: dict) -> None:
    click.echo(f"index:    {report['index']} ({report['backend']})")
    click.echo(f"embedder: {report['embedder']} (dim {report['dim']})")
    source = report["source"]
    click.echo(f"source:   {source.get('text') or (source['kind'] + ' ' + (source['path'] or '')).strip()}")
    for u in report["users"]:
        click.echo(f"user {u['user_id']}: {u['notes']} notes, {u['chunks']} chunks")
    for a in report["accounts"]:
        lag = f"cursor {a['cursor_usn']} / server {a['server_usn']} (lag {a['lag']})" if a["server_usn"] is not None else ""
        if a["lag"] is not None and a["lag"] < 0:
            lag = (f"cursor {a['cursor_usn']} / server {a['server_usn']} (the server's USN is below the one synced: "
                   f"Leanote restored from a backup? The next pass compares every note with it)")
        line = f"account {a['account']}: {lag} last success {a['last_success'] or 'never'}"
        if a["last_error"]:
            line += f"; failing since {a['failing_since']}: {a['last_error']}"
        if a["next_run"]:
            line += f"; next run {a['next_run']}"
        click.echo(line)
        back = a.get("usn_went_back")
        if back:
            why = back.get("why") or f"its USN went back from {back['from']} to {back['to']}"
            click.echo(f"  at {back['at']} the server's history changed: {why} (Leanote restored from a backup?): "
                       f"every note was compared with the server again")
    for problem in report.get("problems", []):
        click.echo(f"problem:  {problem['problem']}")
    last = report["last_sync"]
    if last:
        outcome = "ok" if last["error"] is None else f"failed: {last['error']}"
        s = last["summary"] or {}
        counts = f" ({s.get('added', 0)} added, {s.get('updated', 0)} updated, {s.get('deleted', 0)} deleted)" if s else ""
        click.echo(f"last sync: {when(last['finished'])} {outcome}{counts}")
    else:
        click.echo("last sync: never")
    for speed in report.get("llm", {}).values():
        click.echo(f"llm:      {speed['text']}" + (f": {speed['means']}" if speed.get("means") else ""))
    capture = report.get("capture")
    if capture and (capture["waiting"] or capture["failed"] or capture["written"]):
        line = f"capture:  {capture['written']} written, {capture['waiting']} waiting for Leanote"
        if capture["oldest_waiting"]:
            line += f" (oldest from {when(capture['oldest_waiting'])})"
        click.echo(line + (f", {capture['failed']} not taken (see /outbox)" if capture["failed"] else ""))
    for f in (capture or {}).get("logins_failing") or []:
        click.echo(f"          login of {f['account']} failing since {when(f['since'])}, {f['waiting']} capture(s) "
                   f"waiting for it: {f['error']}")
    memory = report.get("memory")
    if memory:
        tiers = ", ".join(f"{n} by {tier}" for tier, n in sorted(memory["notes"].items())) or "none yet"
        click.echo(f"memory:   notes processed: {tiers}; {memory['entities']} entities, {memory['mentions']} mentions")
        llm = memory.get("llm")
        if llm:
            facts = ", ".join(f"{n} {s}" for s, n in sorted(llm["facts_by_status"].items()))
            click.echo(f"          LLM tier: {llm['jobs_pending']} jobs pending, {llm['jobs_parked']} parked; "
                       f"{llm['facts']} facts" + (f" ({facts})" if facts else ""))
            if llm.get("outlook") and llm["outlook"]["text"]:
                click.echo(f"          backlog: {llm['outlook']['text']}")
            for job in llm["parked"]:
                click.echo(f"          parked {job['note_id']} after {job['attempts']} attempts: {job['error']}")
    skipped = report["skipped"]
    if skipped:
        click.echo(f"not indexed: {len(skipped)} note(s) that could not be read (fixed on their next change):")
        for s in skipped[:10]:
            click.echo(f"  {s['origin']}: {s['reason']}")
        if len(skipped) > 10:
            click.echo(f"  ... and {len(skipped) - 10} more (status --json lists them all)")


def print_pass(summary: dict, failures: dict[str, str], as_json: bool) -> None:
    """An index pass as the CLI shows it: the summary line (or JSON), then failures."""
    if as_json:
        click.echo(json.dumps({**summary, "failures": failures}, ensure_ascii=False))
    else:
        for item in summary.get("skipped", []):
            click.echo(f"skipped {item['note']}: {item['reason']}", err=True)
        fields = {k: v for k, v in summary.items() if k in Summary.__dataclass_fields__}
        click.echo(Summary(**fields).line())
    for account, error in failures.items():
        click.echo(f"error: {account}: {error}", err=True)
