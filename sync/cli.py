"""The commands sync/ owns: ``index``, ``serve``, ``status``, ``doctor``."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import click
from tqdm import tqdm

from rag.cli import App, pass_app
from rag.errors import UserError
from rag.store import open_store

from .service import SyncService
from .state import State


@click.command()
@click.option("--rebuild", is_flag=True, help="delete the index and build it again from the source")
@click.option("--reconcile", is_flag=True, help="live sources: compare everything with the source, not just changes")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
@pass_app
def index(app: App, rebuild: bool, reconcile: bool, as_json: bool) -> None:
    """One sync pass from the configured source: only what changed since the last one."""
    settings = app.settings
    state = State(settings.state_dir, replace_broken=rebuild)
    try:
        with app.open_index(create=True, rebuild=rebuild) as nindex:
            service = SyncService(settings, nindex, state)
            try:
                total = None if settings.source.incremental else len(service.source)
                with tqdm(total=total, unit="note", desc="indexing", disable=None, leave=False) as bar:

                    def progress(seen: int, embedded: int) -> None:
                        bar.n = seen
                        bar.set_postfix(embedded=embedded, refresh=False)
                        bar.refresh()

                    service.progress = progress
                    result = service.run_pass(reconcile=reconcile, force=True)
            finally:
                service.close()
    finally:
        state.close()
    summary = result.summary
    if as_json:
        click.echo(json.dumps({**summary.as_json(), "failures": result.failures}, ensure_ascii=False))
    else:
        for item in summary.skipped:
            click.echo(f"skipped {item['note']}: {item['reason']}", err=True)
        click.echo(summary.line())
    for account, error in result.failures.items():
        click.echo(f"error: {account}: {error}", err=True)
    if result.failures:
        raise click.exceptions.Exit(1)


@click.command()
@pass_app
def serve(app: App) -> None:
    """Run the sync daemon: incremental sync on a schedule, daily reconcile."""
    from .daemon import Daemon

    asyncio.run(Daemon(app.settings).run())


def _when(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts).isoformat(timespec="seconds") if ts else None


@click.command()
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@pass_app
def status(app: App, as_json: bool) -> None:
    """Per source and account: cursor vs server USN, notes indexed, last success and error, next run."""
    settings = app.settings
    state = State(settings.state_dir)
    try:
        notes = state.counts_by_user()
        last = state.last_run()
        skipped = [{**s, "at": _when(s["at"])} for s in state.skipped()]
        accounts = [
            {
                "source": a.source,
                "account": a.account,
                "user_id": a.user_id,
                "cursor_usn": a.cursor,
                "server_usn": a.server_usn,
                "lag": (a.server_usn - a.cursor) if a.server_usn is not None else None,
                "notes_indexed": state.indexed_count(a.source, a.account) if settings.source.incremental else None,
                "last_success": _when(a.last_success),
                "last_error": a.last_error,
                "failing_since": _when(a.failing_since),
                "next_run": _when(a.next_run),
            }
            for a in state.accounts()
        ]
    finally:
        state.close()
    try:
        store = open_store(settings.qdrant, settings.state_dir, dim=0, create=False)
    except UserError:  # nothing indexed yet
        chunks, manifest, location = {}, {}, f"{settings.state_dir} (no index yet: run `leanote-rag index`)"
    else:
        try:
            chunks = store.count_by_user()
            manifest = store.manifest() or {}
            location = store.location
        finally:
            store.close()
    users = sorted(set(notes) | set(chunks))
    report = {
        "index": location,
        "backend": settings.qdrant.kind,
        "embedder": manifest.get("embedder"),
        "dim": manifest.get("dim"),
        "source": {"kind": settings.source.kind, "path": str(settings.source.path) if settings.source.path else None},
        "users": [{"user_id": u, "notes": notes.get(u, 0), "chunks": chunks.get(u, 0)} for u in users],
        "accounts": accounts,
        "last_sync": last and {**last, "ok": last["error"] is None},
        "skipped": skipped,
    }
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False))
        return
    click.echo(f"index:    {location} ({report['backend']})")
    click.echo(f"embedder: {report['embedder']} (dim {report['dim']})")
    click.echo(f"source:   {report['source']['kind']} {report['source']['path'] or ''}")
    for u in report["users"]:
        click.echo(f"user {u['user_id']}: {u['notes']} notes, {u['chunks']} chunks")
    for a in accounts:
        lag = f"cursor {a['cursor_usn']} / server {a['server_usn']} (lag {a['lag']})" if a["server_usn"] is not None else ""
        line = f"account {a['account']}: {lag} last success {a['last_success'] or 'never'}"
        if a["last_error"]:
            line += f"; failing since {a['failing_since']}: {a['last_error']}"
        if a["next_run"]:
            line += f"; next run {a['next_run']}"
        click.echo(line)
    if last:
        outcome = "ok" if last["error"] is None else f"failed: {last['error']}"
        s = last["summary"] or {}
        counts = f" ({s.get('added', 0)} added, {s.get('updated', 0)} updated, {s.get('deleted', 0)} deleted)" if s else ""
        click.echo(f"last sync: {_when(last['finished'])} {outcome}{counts}")
    else:
        click.echo("last sync: never")
    if skipped:
        click.echo(f"not indexed: {len(skipped)} note(s) that could not be read (fixed on their next change):")
        for s in skipped[:10]:
            click.echo(f"  {s['origin']}: {s['reason']}")
        if len(skipped) > 10:
            click.echo(f"  ... and {len(skipped) - 10} more (status --json lists them all)")


@click.command()
@pass_app
def doctor(app: App) -> None:
    """Check config, the source (reachability, login), the index and the embedder; say how to fix what fails."""
    from .doctor import run_checks

    failed = 0
    for check in run_checks(app):
        mark = click.style("ok  ", fg="green") if check.ok else click.style("FAIL", fg="red")
        click.echo(f"{mark} {check.name}: {check.detail}")
        if not check.ok:
            failed += 1
            click.echo(f"     fix: {check.fix}")
    if failed:
        raise click.exceptions.Exit(1)

