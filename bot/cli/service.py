"""The commands that sync and serve: ``index``, ``status``, ``serve`` and ``doctor``.

While ``serve`` runs, ``index`` and ``status`` ask the daemon (it owns the index);
otherwise they do the work here.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import click

from sync.progress import Every, Step, columns

from bot.cli.app import App, pass_app

# The index, the stores and the report are imported by the commands that use them: `--help`
# loads none of them.


class _Shown:
    """An index pass's progress where the person waits: one line kept up to date on a
    terminal, fitted to its width; elsewhere (systemd's journal, a pipe) a line for each
    account and then one a minute, on stderr (``sync.progress``)."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.every = Every(lambda text: click.echo(f"indexing {text}", err=True))
        self._shown = 0  # columns of the line on the terminal now

    def __call__(self, step: Step) -> None:
        if self.tty:
            self._show(step)
        else:
            self.every(step)

    def event(self, event: dict) -> None:
        """A ``progress`` event of the API's ``POST /sync``: the daemon's step, as it told it."""
        step = Step.from_json(event)
        if self.tty:
            self._show(step)
        else:
            self.every.say_line(step, event.get("line") or step.line())

    def _show(self, step: Step) -> None:
        # the last column left empty: some terminals wrap a line that reaches it
        line = step.line(width=terminal_columns() - 1, before="indexing ")
        self._write(line)

    def _write(self, line: str) -> None:
        width = columns(line)
        sys.stderr.write("\r" + line + " " * max(0, self._shown - width))
        sys.stderr.flush()
        self._shown = width

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.tty and self._shown:
            self._write("")
            sys.stderr.write("\r")
            sys.stderr.flush()


def terminal_columns() -> int:
    """The width of the terminal on stderr: $COLUMNS when set, else what the terminal says;
    80 when either says 0 (a serial console, a terminal that was never sized): a line cut
    to nothing shows nothing."""
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        width = 0
    if width <= 0:
        try:
            width = os.get_terminal_size(sys.stderr.fileno()).columns
        except (OSError, ValueError):
            width = 0
    return width if width > 0 else 80


@click.command()
@click.option("--rebuild", is_flag=True, help="delete the index and build it again from the source")
@click.option("--reconcile", is_flag=True, help="live sources: compare everything with the source, not just changes")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
@click.option("--second", "second_for", metavar="DURATION", default=None,
              help="then fill the second index (second_index) for at most this long, e.g. 5h (where no serve runs)")
@pass_app
def index(app: App, rebuild: bool, reconcile: bool, as_json: bool, second_for: str | None) -> None:
    """One sync pass from the configured source: only what changed since the last one.
    While `serve` runs, the daemon makes the pass (now, waiting for it)."""
    from bot.usecases.people import Person

    seconds = _duration_option(second_for) if second_for else None
    cli_person = Person("cli", "", admin=True)
    with app.door(create=True, rebuild=rebuild) as door:
        with _Shown() as shown:
            done = door.sync(cli_person, reconcile, rebuild, shown)
        from bot.cli.report import print_pass

        print_pass(done.summary, done.failures, as_json)
        if seconds is not None and not done.failures:
            from bot.usecases.status import second_line

            def said(progress: dict) -> None:
                click.echo(second_line({"enabled": app.settings.second_index.enabled, "text": "", **progress}),
                           err=True)

            left = door.fill_second(cli_person, seconds, said)
            if left.get("through_daemon"):
                click.echo("second index: the running service fills it between questions", err=True)
            said(left)
    if done.failures:
        raise click.exceptions.Exit(1)


def _duration_option(value: str) -> float:
    from rag.sections import seconds

    try:
        return seconds(value)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--second") from None


@click.command()
@pass_app
def serve(app: App) -> None:
    """Run the sync daemon: incremental sync on a schedule, daily reconcile."""
    from bot.serve import Daemon
    from bot.serve import services

    daemon = Daemon(app.settings, services(app.settings))
    asyncio.run(daemon.run())
    daemon.exit()


@click.command()
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@pass_app
def status(app: App, as_json: bool) -> None:
    """Per source and account: cursor vs server USN, notes indexed, last success and error, next run."""
    from bot.usecases.people import Person

    with app.door() as door:
        report = door.status(Person("cli", "", admin=True))
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
    from bot.cli.doctor import checks

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
