"""``leanote-rag``'s command line: what every command gets, and how it exits.

Exit codes: 0 ok; 2 bad config or usage (the message names the fix); 1 a runtime
failure (a message; the traceback only with ``--debug``); 130 interrupted.

``App`` is what a command gets: the settings (loaded on first use), its door to the notes
(``bot.cli.door``: the running daemon's API, or the parts built here) and the person it acts
for (the machine's operator, asking of ``--user``'s notes). Each command parses its options,
calls a use case through the door and prints what comes back. The commands are in ``notes``
(search, ask, eval, feedback), ``memory`` (entities, memory, related) and ``service`` (index,
status, serve, doctor); ``bot.cli`` puts them in the group.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import unicodedata
from typing import TYPE_CHECKING

import click

from rag import config as config_mod
from rag.errors import LeanoteRagError, UserError
from rag.redact import redact_in_logs, safe_url
from rag.state_dir import private_files

if TYPE_CHECKING:  # the doors are imported when a command uses them: `--help` and the commands
    # that go through a running daemon start without loading the search stack
    from bot.cli.door import Door
    from bot.usecases.people import Person

log = logging.getLogger("leanote_rag")

class App:
    """What every command gets: the config (loaded on first use) and output helpers."""

    def __init__(self, config_path: str | None, debug: bool, verbose: int = 0, serving: bool = False):
        self.config_path = config_path
        self.debug = debug
        self.verbose = verbose
        self.serving = serving
        self._settings: config_mod.Settings | None = None

    @property
    def settings(self) -> config_mod.Settings:
        if self._settings is None:
            self._settings = config_mod.load(self.config_path)
            if not (self.debug or self.verbose):  # log_level is the daemon's; one-shot commands print results
                level = logging.getLevelName(self._settings.log_level)
                logging.getLogger().setLevel(level if self.serving else max(level, logging.WARNING))
        return self._settings

    def door(self, create: bool = False, rebuild: bool = False) -> "Door":
        """The notes, through the running daemon if there is one, else opened here (``create``,
        ``rebuild``: for ``index``)."""
        from bot.cli.door import open_door

        return open_door(self.settings, create=create, rebuild=rebuild)

    def person(self, door: "Door", name: str | None, users: dict[str, int] | None = None) -> "Person":
        """The command line's person: the machine's operator (an admin), asking of ``--user``'s
        notes (a Leanote user id, or an account's email once it has synced), or of the only user
        there is. ``users``: the index's users, when the caller has them already."""
        from bot.usecases.people import Person, named_user, resolve_user

        users = door.users() if users is None else users
        user_id = resolve_user(users, named_user(self.settings, door.accounts(), name) if name else None)
        return Person("cli", user_id, admin=True)

    def user_id(self, parts, name: str | None) -> str | None:
        """``--user`` of the commands that read a store through the root's ``parts`` (feedback,
        the memory's corrections): a Leanote user id, or an account's email once it has synced."""
        from bot.usecases.people import accounts, named_user

        return named_user(self.settings, accounts(parts), name) if name else name


pass_app = click.make_pass_decorator(App)


def _setup_logging(debug: bool, verbose: int = 0, serving: bool = False) -> None:
    """The daemon (``serve``) logs what it does (INFO: a line per pass and per change of
    state); a one-shot command prints its results and logs only warnings, unless ``-v``
    (INFO) or ``-vv`` (DEBUG; ``--debug`` also the libraries' and tracebacks)."""
    # Under systemd (JOURNAL_STREAM set) journald adds timestamps; a terminal gets them.
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("JOURNAL_STREAM") else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=_level(debug, verbose, serving), format=fmt, stream=sys.stderr)
    # Libraries that narrate every request, job or connection: their warnings only, unless --debug.
    for noisy in ("httpx", "httpcore", "urllib3", "jieba", "apscheduler", "uvicorn", "pymongo", "watchfiles",
                  "telegram.ext", "discord.gateway", "discord.client"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)
    redact_in_logs()  # no user:password@ of a configured URL in any log line


def _level(debug: bool, verbose: int, serving: bool) -> int:
    if debug or verbose >= 2:
        return logging.DEBUG
    return logging.INFO if verbose or serving else logging.WARNING


VERBOSE_HELP = "log what it does (INFO); -vv: debug. Default: warnings only (serve: log_level)"


def _more_verbose(ctx: click.Context, _param, count: int) -> None:
    if count:
        app = ctx.find_object(App)
        app.verbose += count
        logging.getLogger().setLevel(_level(app.debug, app.verbose, app.serving))


def with_verbose(command: click.Command) -> click.Command:
    """``command`` (a group: each of its commands) taking ``-v`` after its name too: a person
    adds it to the line they just ran (``leanote-rag doctor -v``)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            with_verbose(sub)
    else:
        command.params.append(click.Option(["-v", "--verbose"], count=True, expose_value=False,
                                           callback=_more_verbose, help=VERBOSE_HELP))
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", metavar="PATH", help=f"config file (default: ${config_mod.CONFIG_ENV}, else ./config.yaml, else {config_mod.SYSTEM_CONFIG})")
@click.option("--debug", is_flag=True, help="debug logging (the libraries' too) and tracebacks")
@click.option("-v", "--verbose", count=True, help=VERBOSE_HELP)
@click.version_option(package_name="leanote-rag")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, debug: bool, verbose: int) -> None:
    """Ask questions of your Leanote notes."""
    serving = ctx.invoked_subcommand == "serve"
    _setup_logging(debug, verbose, serving)
    ctx.obj = App(config_path, debug, verbose, serving)


def print_json(obj) -> None:
    click.echo(json.dumps(obj, ensure_ascii=False))




def cell(text: str, width: int) -> str:
    """``text`` on one line, cut and padded to ``width`` terminal columns: CJK characters
    take two, so a column of Chinese questions lines up with one of English ones."""
    text = " ".join(text.split())
    widths = [2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text]
    used = sum(widths)
    if used > width:
        used, cut = 1, 0  # 1: the ellipsis
        while used + widths[cut] <= width:
            used += widths[cut]
            cut += 1
        text = text[:cut] + "…"
    return text + " " * (width - used)


def main(argv: list[str] | None = None) -> int:
    private_files()  # state.db, the index, the memory...: 0600 whatever the umask
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        # without standalone mode click returns a command's Exit code instead of raising it
        code = cli.main(args=args, prog_name="leanote-rag", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except UserError as exc:
        click.echo(safe_url(f"error: {exc}"), err=True)
        return 2
    except LeanoteRagError as exc:
        if debug:
            traceback.print_exc()
        click.echo(safe_url(f"error: {exc}"), err=True)
        details = getattr(exc, "details", None)  # what the libraries said, for -v
        if details and ("-v" in args or "--verbose" in args or "-vv" in args or debug):
            click.echo(safe_url(f"  details: {details}"), err=True)
        return 1
    except Exception as exc:
        if debug:
            traceback.print_exc()
        click.echo(safe_url(f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)"), err=True)
        return 1
