"""The commands that sync and serve: ``index``, ``status``, ``serve`` and ``doctor``.

While ``serve`` runs, ``index`` and ``status`` ask the daemon (it owns the index);
otherwise they do the work here.
"""

from __future__ import annotations

import asyncio
import json
import sys

import click

from rag.errors import Unavailable

from bot.cli.app import App, pass_app
from bot.api.client import find_daemon, say_door
from sync.progress import Every, Step

# The index, the stores and the report are imported by the commands that use them: `--help`
# loads none of them.


class _Shown:
    """An index pass's progress where the person waits: one line kept up to date on a
    terminal; elsewhere (systemd's journal, a pipe) a line for each account and then one a
    minute, on stderr (``sync.progress``)."""

    def __init__(self):
        from tqdm import tqdm

        self.tty = sys.stderr.isatty()
        self.bar = tqdm(total=None, bar_format="{desc}", leave=False) if self.tty else None
        self.every = Every(lambda text: click.echo(f"indexing {text}", err=True))

    def __call__(self, step: Step) -> None:
        if self.bar is not None:
            self.bar.set_description_str(f"indexing {step.line()}", refresh=True)
        else:
            self.every(step)

    def event(self, event: dict) -> None:
        """A ``progress`` event of the API's ``POST /sync``: the daemon's step, as it said it."""
        step = Step(event.get("account") or "", event.get("seen") or 0, event.get("embedded") or 0,
                    event.get("page") or 0, event.get("done"), event.get("total"))
        line = event.get("line") or step.line()
        if self.bar is not None:
            self.bar.set_description_str(f"indexing {line}", refresh=True)
        else:
            self.every.say_line(step, line)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def _index_here(app: App, rebuild: bool, reconcile: bool) -> tuple[dict, dict]:
    from bot.root import Parts
    from sync.faults import check_disk

    settings = app.settings
    with Parts(settings, create=True, rebuild=rebuild) as parts:
        parts.state  # the state first: a broken one is said (or, rebuilding, replaced) before anything else
        check_disk(settings.state_dir)  # before the index maps its files: no room there is a crash
        service = parts.sync
        if rebuild and service.derived is not None:
            service.derived.reset()  # derived from the notes, like the index: built again
        with _Shown() as shown:
            result = service.run_pass(reconcile=reconcile, force=True, progress=shown)
    return result.summary.as_json(), result.failures


def _index_through(client, rebuild: bool, reconcile: bool) -> tuple[dict, dict]:
    """The running daemon makes the pass; its progress and summary come back here."""
    with _Shown() as shown:
        for event in client.stream("/sync", {"reconcile": reconcile, "rebuild": rebuild, "wait": True}):
            if event["event"] == "progress":
                shown.event(event)
            elif event["event"] == "result":
                return event["summary"], event["failures"]
    raise Unavailable("the daemon ended the sync before it reported its result")


@click.command()
@click.option("--rebuild", is_flag=True, help="delete the index and build it again from the source")
@click.option("--reconcile", is_flag=True, help="live sources: compare everything with the source, not just changes")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
@pass_app
def index(app: App, rebuild: bool, reconcile: bool, as_json: bool) -> None:
    """One sync pass from the configured source: only what changed since the last one.
    While `serve` runs, the daemon makes the pass (now, waiting for it)."""
    client = find_daemon(app.settings)
    say_door(app.settings, client)
    if client is not None:
        with client:
            summary, failures = _index_through(client, rebuild, reconcile)
    else:
        summary, failures = _index_here(app, rebuild, reconcile)
    from bot.cli.report import print_pass

    print_pass(summary, failures, as_json)
    if failures:
        raise click.exceptions.Exit(1)


@click.command()
@pass_app
def serve(app: App) -> None:
    """Run the sync daemon: incremental sync on a schedule, daily reconcile."""
    from bot.serve import Daemon
    from bot.root import services

    asyncio.run(Daemon(app.settings, services()).run())


def _status_here(settings) -> dict:
    from bot.cli.report import status_report
    from bot.root import Parts
    from sync.faults import reading_state

    with Parts(settings) as parts:
        state = parts.state
        state.verify()  # a damaged page anywhere is named, with the fix
        with reading_state(state):
            return status_report(settings, state, parts.store(), memory=parts.memory_to_read)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@pass_app
def status(app: App, as_json: bool) -> None:
    """Per source and account: cursor vs server USN, notes indexed, last success and error, next run."""
    client = find_daemon(app.settings)
    say_door(app.settings, client)
    if client is not None:
        with client:
            report = client.get("/status")
    else:
        report = _status_here(app.settings)
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False))
    else:
        from bot.cli.report import print_status

        print_status(report)


@click.command()
@pass_app
def doctor(app: App) -> None:
    """Check config, the source (reachability, login), the index and the embedder; say how to fix what fails."""
    from bot.cli.doctor import run_checks
    from bot.root import checks

    failed = 0
    for check in run_checks(app, checks()):
        mark = (click.style("FAIL", fg="red") if not check.ok else click.style("WARN", fg="yellow") if check.warn
                else click.style("ok  ", fg="green"))
        click.echo(f"{mark} {check.name}: {check.detail}")
        if not check.ok:
            failed += 1
            click.echo(f"     fix: {check.fix}")
    if failed:
        raise click.exceptions.Exit(1)
