"""``leanote-rag index`` and ``leanote-rag status``: the commands sync/ owns."""

from __future__ import annotations

import json
from datetime import datetime

import click
from tqdm import tqdm

from rag.cli import App, pass_app
from rag.errors import UserError
from rag.store import open_store

from .indexer import Indexer
from .sources import open_source
from .state import State


@click.command()
@click.option("--rebuild", is_flag=True, help="delete the index and build it again from the source")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
@pass_app
def index(app: App, rebuild: bool, as_json: bool) -> None:
    """Index the configured source: only what changed since the last run."""
    settings = app.settings
    source = open_source(settings)
    state = State(settings.state_dir)
    run_id = state.start_run(source.name)
    try:
        with app.open_index(create=True, rebuild=rebuild) as nindex:
            indexer = Indexer(nindex, state, source.name)
            with tqdm(total=len(source), unit="note", desc="indexing", disable=None, leave=False) as bar:

                def progress(seen: int, embedded: int) -> None:
                    bar.n = min(seen, bar.total or seen)
                    bar.set_postfix(embedded=embedded, refresh=False)
                    bar.refresh()

                indexer.progress = progress
                summary = indexer.run(source.notes())
    except BaseException as err:
        state.finish_run(run_id, {}, error=f"{type(err).__name__}: {err}")
        state.close()
        raise
    state.finish_run(run_id, summary.as_json())
    state.close()
    if as_json:
        click.echo(json.dumps(summary.as_json(), ensure_ascii=False))
        return
    for item in summary.skipped:
        click.echo(f"skipped {item['note']}: {item['reason']}", err=True)
    click.echo(summary.line())


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).isoformat(timespec="seconds") if ts else "never"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@pass_app
def status(app: App, as_json: bool) -> None:
    """Notes and chunks per user, the embedder, where the index is, the last sync."""
    settings = app.settings
    state = State(settings.state_dir)
    try:
        notes = state.counts_by_user()
        last = state.last_run()
        last_ok = state.last_run(ok_only=True)
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
        "last_sync": last and {**last, "ok": last["error"] is None},
        "last_success": last_ok and last_ok["finished"],
    }
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False))
        return
    click.echo(f"index:    {location} ({report['backend']})")
    click.echo(f"embedder: {report['embedder']} (dim {report['dim']})")
    click.echo(f"source:   {report['source']['kind']} {report['source']['path'] or ''}")
    for u in report["users"]:
        click.echo(f"user {u['user_id']}: {u['notes']} notes, {u['chunks']} chunks")
    if last:
        outcome = "ok" if last["error"] is None else f"failed: {last['error']}"
        line = (last["summary"] or {}) and f" ({last['summary'].get('added', 0)} added, {last['summary'].get('deleted', 0)} deleted)"
        click.echo(f"last sync: {_when(last['finished'])} {outcome}{line or ''}")
    else:
        click.echo("last sync: never")
    if last_ok and last and last["error"] is not None:
        click.echo(f"last success: {_when(last_ok['finished'])}")
