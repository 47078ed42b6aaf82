"""``leanote-rag``: a thin command line over the core.

Exit codes: 0 ok; 2 bad config or usage (the message names the fix); 1 a runtime
failure (a message; the traceback only with ``--debug``); 130 interrupted.

The commands that answer questions live here; commands owned by other packages
(``index``, ``status`` from ``sync``) are found through the ``leanote_rag.commands``
entry point group, so this package never imports them.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path

import click

from . import config as config_mod
from .door import Door, open_door
from .excerpt import excerpt
from .errors import LeanoteRagError, UserError
from .eval import evaluate, load_questions, report_json
from .index import NoteIndex
from .redact import redact_in_logs, safe_url
from .retrieve import RETRIEVERS, resolve_user

log = logging.getLogger("leanote_rag")


class App:
    """What every command gets: the config (loaded on first use) and output helpers."""

    def __init__(self, config_path: str | None, debug: bool):
        self.config_path = config_path
        self.debug = debug
        self._settings: config_mod.Settings | None = None

    @property
    def settings(self) -> config_mod.Settings:
        if self._settings is None:
            self._settings = config_mod.load(self.config_path)
            if not self.debug:
                logging.getLogger().setLevel(self._settings.log_level)
        return self._settings

    def open_index(self, **kwargs) -> NoteIndex:
        return NoteIndex.open(self.settings, **kwargs)

    def door(self) -> Door:
        """The notes, through the running daemon if there is one, else opened here."""
        return open_door(self.settings)


pass_app = click.make_pass_decorator(App)


def _setup_logging(debug: bool) -> None:
    # Under systemd (JOURNAL_STREAM set) journald adds timestamps; a terminal gets them.
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("JOURNAL_STREAM") else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, format=fmt, stream=sys.stderr)
    # Libraries that narrate every request, job or connection: their warnings only, unless --debug.
    for noisy in ("httpx", "httpcore", "urllib3", "jieba", "apscheduler", "uvicorn", "pymongo", "watchfiles",
                  "telegram.ext", "discord.gateway", "discord.client"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)
    redact_in_logs()  # no user:password@ of a configured URL in any log line


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", metavar="PATH", help=f"config file (default: ${config_mod.CONFIG_ENV}, else ./config.yaml, else {config_mod.SYSTEM_CONFIG})")
@click.option("--debug", is_flag=True, help="debug logging and tracebacks")
@click.version_option(package_name="leanote-rag")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, debug: bool) -> None:
    """Ask questions of your Leanote notes."""
    _setup_logging(debug)
    ctx.obj = App(config_path, debug)


def _print_json(obj) -> None:
    click.echo(json.dumps(obj, ensure_ascii=False))


def _print_hits(hits, query: str) -> None:
    if not hits:
        click.echo("no matching notes")
    for i, h in enumerate(hits, start=1):
        where = " › ".join(p for p in (h.notebook, h.heading) if p)
        click.echo(click.style(f"{i}. {h.title}", bold=True) + (f"  ({where})" if where else "") + f"  score {h.score:.4f}")
        click.echo(f"   {h.url}")
        click.echo(f"   {' '.join(excerpt(h.text, query, 200).split())}")


@cli.command()
@click.argument("query", required=False)
@click.option("--queries", "queries_file", type=click.Path(path_type=Path), help="JSONL file: {id, question, user_id} per line")
@click.option("--json", "as_json", is_flag=True, help="JSON output (one line per query)")
@click.option("-k", "k", type=click.IntRange(1, 100), default=None, help="hits to return (default retrieval.top_k)")
@click.option("--user", "user_id", metavar="USER_ID", help="whose notes to search (needed when the index holds several users)")
@click.option("--retriever", type=click.Choice(RETRIEVERS), default="hybrid", show_default=True)
@pass_app
def search(app: App, query, queries_file, as_json, k, user_id, retriever) -> None:
    """Find the chunks of your notes that best match QUERY."""
    if (query is None) == (queries_file is None):
        raise click.UsageError("give either QUERY or --queries FILE")
    batch = load_questions(queries_file, required=("question",)) if queries_file else None
    with app.door() as door:
        users = door.users()
        if batch is None:
            user = resolve_user(users, user_id)
            hits = door.search(query, user, k, retriever)
            if as_json:
                _print_json({"query": query, "user_id": user, "hits": [h.as_json() for h in hits]})
            else:
                _print_hits(hits, query)
            return
        failed = 0
        for q in batch:
            try:
                user = resolve_user(users, q.get("user_id") or user_id)
                hits = door.search(q["question"], user, k, retriever)
                out = {"id": q.get("id"), "hits": [h.as_json() for h in hits]}
            except UserError as err:
                failed += 1
                out = {"id": q.get("id"), "error": str(err)}
            if as_json:
                _print_json(out)
            else:
                click.echo(click.style(f"# {q.get('id')}: {q['question']}", bold=True))
                _print_hits(hits, q["question"]) if "hits" in out else click.echo(f"error: {out['error']}")
        if failed:
            raise click.exceptions.Exit(1)


@cli.command()
@click.argument("question")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.option("--user", "user_id", metavar="USER_ID", help="whose notes to ask (needed when the index holds several users)")
@click.option("--trace", "show_trace", is_flag=True, help="show why: the rewritten question, candidates and scores, evidence")
@pass_app
def ask(app: App, question: str, as_json: bool, user_id: str | None, show_trace: bool) -> None:
    """Answer QUESTION from your notes, citing them."""
    stream = not as_json and sys.stdout.isatty()

    def printer(text: str) -> None:
        click.echo(text, nl=False)

    with app.door() as door:
        user = resolve_user(door.users(), user_id)
        answer = door.ask(question, user, on_token=printer if stream else None)
    if as_json:
        _print_json(answer.as_json(with_trace=show_trace))
        return
    if stream and answer.used_llm:
        click.echo()
    else:
        click.echo(answer.answer)
    if answer.notice:
        click.echo(click.style(answer.notice, dim=True))
        if answer.trace is not None and answer.trace.llm_error:  # what the operator can fix
            click.echo(click.style(f"({answer.trace.llm_error})", dim=True))
    if answer.citations:
        click.echo("\n" + click.style("来源 / Sources:", bold=True))
        for c in answer.citations:
            click.echo(f"[{c.n}] {c.label}  {c.url}")
    if answer.closest:
        click.echo("\n" + click.style("最接近的笔记 / Closest notes:", bold=True))
        for c in answer.closest:
            click.echo(f"- {c.label}  {c.url}")
    if show_trace:
        _print_trace(answer)


def _print_trace(answer) -> None:
    t = answer.trace
    click.echo("\n" + click.style("trace", bold=True))
    click.echo(f"  question:   {t.question}")
    if t.standalone != t.question:
        click.echo(f"  rewritten:  {t.standalone}")
    click.echo(f"  rerank:     {t.rerank}")
    click.echo(f"  decision:   {t.decision}")
    if t.llm_error:
        click.echo(f"  llm error:  {t.llm_error}")
    click.echo(f"  timings ms: {answer.timings_ms}")
    click.echo("  candidates: dense rank/score · sparse rank/score · fused · rerank · evidence block")
    for c in t.candidates[:20]:
        dense, sparse, fused, rr, ev = c.cells()
        click.echo(f"    {dense:>11} {sparse:>10} {fused:>7} {rr:>6} {ev:>4}  {c.title} › {c.heading}")


@cli.command(name="eval")
@click.argument("questions_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="JSON report, with per-question misses")
@click.option("--with-changes", is_flag=True, help="count after_changes questions (the change batch is synced)")
@click.option("--retriever", "retrievers", type=click.Choice(RETRIEVERS), multiple=True, help="default: all three")
@pass_app
def eval_command(app: App, questions_file: Path, as_json: bool, with_changes: bool, retrievers) -> None:
    """Retrieval metrics on a question set: recall, hit@5, MRR, trap leaks."""
    questions = load_questions(questions_file)
    with app.door() as door:
        reports, skipped = evaluate(door.search, questions, tuple(retrievers) or RETRIEVERS, with_changes)
    result = report_json(reports, skipped)
    if as_json:
        _print_json(result)
        return
    click.echo(f"{'retriever':<8} {'n':>3} {'recall@5':>9} {'recall@20':>10} {'hit@5':>6} {'MRR@10':>7} {'leaks':>6} {'p50 ms':>7}")
    for name, r in result["retrievers"].items():
        click.echo(
            f"{name:<8} {r['questions']:>3} {r['recall@5']:>9.3f} {r['recall@20']:>10.3f} {r['hit@5']:>6.3f} "
            f"{r['mrr@10']:>7.3f} {r['trap_leaks']:>6} {r['search_p50_ms']:>7.1f}"
        )
    if skipped:
        click.echo(f"({skipped} after_changes questions left out; pass --with-changes once the change batch is synced)")


def _load_plugins() -> None:
    for ep in entry_points(group="leanote_rag.commands"):
        if ep.name in cli.commands:
            continue
        try:
            cli.add_command(ep.load(), ep.name)
        except Exception as err:  # a broken plugin must not take the CLI down
            log.warning("cannot load command %s (%s): %s", ep.name, ep.value, err)


def main(argv: list[str] | None = None) -> int:
    _load_plugins()
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
        return 1
    except Exception as exc:
        if debug:
            traceback.print_exc()
        click.echo(safe_url(f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)"), err=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
