"""The composition root: the one place where leanote-rag's parts are put together.

``leanote-rag`` runs ``main`` here. With plain imports, this module wires
config -> index -> answer service -> sync -> bots -> API:

- the command line: ``rag.cli``'s group (search, ask, eval, ...) with the commands that
  sync and serve, defined here: ``index``, ``status``, ``serve``, ``doctor``;
- ``serve``: the daemon (``sync.daemon.host.Daemon``), which opens the index, the answer
  service and the sync, and runs the API and ``services()``: the Telegram and Discord
  bots and the file watcher;
- ``doctor``: every part's check, the bots' (``checks()``) too.

The bots are imported when ``serve`` or ``doctor`` starts, so a one-shot command does not
load the chat libraries. Nothing else imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

import click
from tqdm import tqdm

from rag.cli import USER_NAMES, App, cli, pass_app
from rag.cli import main as cli_main
from rag.client import find_daemon, say_door
from rag.errors import Unavailable, UserError
from rag.index.store import open_store

from sync.faults import check_disk, reading_state
from sync.daemon.report import print_pass, print_status, status_report
from sync.progress import Every, Step
from sync.service import SyncService
from sync.state import State


def account_user_id(settings, name: str) -> str | None:
    """The Leanote user id of a ``source.accounts`` account, named by its email (or login
    name) as ``users:`` takes it: what ``--user`` resolves it to. None when ``name`` is no
    account; an error when it is one that has not synced yet."""
    key = name.strip().lower()
    if settings.source.kind != "leanote_api" or key not in {a.email.strip().lower() for a in settings.source.accounts}:
        return None
    if (settings.state_dir / "state.db").exists():
        with contextlib.closing(State(settings.state_dir)) as state:
            found = next((a.user_id for a in state.accounts() if a.account == key and a.user_id), None)
        if found:
            return found
    raise UserError(f"account {name} has not synced yet, so its Leanote user is not known: run `leanote-rag index` "
                    f"(`leanote-rag status` says why it failed, if it did), or pass its Leanote user id")


USER_NAMES.append(account_user_id)


class _Shown:
    """An index pass's progress where the person waits: one line kept up to date on a
    terminal; elsewhere (systemd's journal, a pipe) a line for each account and then one a
    minute, on stderr (``sync.progress``)."""

    def __init__(self):
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
    settings = app.settings
    state = State(settings.state_dir, replace_broken=rebuild)
    try:
        check_disk(settings.state_dir)  # before the index maps its files: no room there is a crash
        with app.open_index(create=True, rebuild=rebuild) as nindex:
            service = SyncService(settings, nindex, state)
            if rebuild and service.memory is not None:
                service.memory.reset()  # derived from the notes, like the index: built again
            try:
                with _Shown() as shown:
                    result = service.run_pass(reconcile=reconcile, force=True, progress=shown)
            finally:
                service.close()
    finally:
        state.close()
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
    print_pass(summary, failures, as_json)
    if failures:
        raise click.exceptions.Exit(1)


@click.command()
@pass_app
def serve(app: App) -> None:
    """Run the sync daemon: incremental sync on a schedule, daily reconcile."""
    from sync.daemon.host import Daemon

    asyncio.run(Daemon(app.settings, services()).run())


def _status_here(settings) -> dict:
    state = State(settings.state_dir)
    try:
        state.verify()  # a damaged page anywhere is named, with the fix
        try:
            store = open_store(settings.qdrant, settings.state_dir, dim=0, create=False)
        except UserError:  # nothing indexed yet
            store = None
        try:
            with reading_state(state):
                return status_report(settings, state, store)
        finally:
            if store is not None:
                store.close()
    finally:
        state.close()


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
        print_status(report)


@click.command()
@pass_app
def doctor(app: App) -> None:
    """Check config, the source (reachability, login), the index and the embedder; say how to fix what fails."""
    from sync.daemon.doctor import run_checks

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


def services() -> list:
    """What ``serve`` runs beside the sync: the chat bots and the file watcher."""
    from bot.discord import service as discord
    from bot.telegram import service as telegram
    from sync.watch import watch

    return [telegram, discord, watch]


def checks() -> list:
    """What ``doctor`` asks the bots to check (their tokens, chats, channels)."""
    from bot.discord import check as discord
    from bot.telegram import check as telegram

    return [telegram, discord]


for _command in (index, status, serve, doctor):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    """``leanote-rag``: every command; the exit code (``rag.cli.main`` says which)."""
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
