"""``leanote-rag``: a thin command line over the core.

Exit codes: 0 ok; 2 bad config or usage (the message names the fix); 1 a runtime
failure (a message; the traceback only with ``--debug``); 130 interrupted.

The commands that answer questions live here. The commands that sync and serve
(``index``, ``status``, ``serve``, ``doctor``) are added to this group by the program's
composition root, ``sync.daemon.main``, which is what ``leanote-rag`` runs: this package
never imports them.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
import unicodedata
from datetime import datetime
from pathlib import Path
from typing import Callable

import click

from rag import config as config_mod
from rag import limits
from rag.door import Door, open_door
from rag.index.excerpt import excerpt
from rag.errors import LeanoteRagError, UserError
from rag.memory import explore
from rag.memory.entities import KINDS
from rag.eval import ANSWER_REQUIRED, answer_report, ask_all, check_answer_question, evaluate, load_questions, report_json
from rag.answer.feedback import FeedbackStore, path_for
from rag.index.note_index import NoteIndex
from rag.memory.store import MemoryStore, correction_id, correction_target
from rag.memory.store import path_for as memory_path
from rag.redact import redact_in_logs, safe_url
from rag.index.retrieve import RETRIEVERS, resolve_user

log = logging.getLogger("leanote_rag")

# Other names of a Leanote user than its id, from the packages that know them (sync/ adds
# the emails of source.accounts): each ``(settings, name) -> user id or None``.
USER_NAMES: list[Callable[[config_mod.Settings, str], str | None]] = []


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

    def user_id(self, name: str | None) -> str | None:
        """``--user`` as given: a Leanote user id, or another name of one that ``users:``
        takes too (the email of a ``source.accounts`` account, once it has synced)."""
        if not name:
            return name
        for lookup in USER_NAMES:
            found = lookup(self.settings, name)
            if found:
                return found
        return name

    def pick_user(self, users: dict[str, int], name: str | None) -> str:
        """Whose notes: ``--user`` (an id or another name of one), or the only user there is."""
        return resolve_user(users, self.user_id(name))

    def open_index(self, **kwargs) -> NoteIndex:
        return NoteIndex.open(self.settings, **kwargs)

    def door(self) -> Door:
        """The notes, through the running daemon if there is one, else opened here."""
        return open_door(self.settings)


pass_app = click.make_pass_decorator(App)


def _setup_logging(debug: bool, verbose: int = 0, serving: bool = False) -> None:
    """The daemon (``serve``) logs what it does (INFO: a line per pass and per change of
    state); a one-shot command prints its results and logs only warnings, unless ``-v``
    (INFO) or ``-vv`` (DEBUG; ``--debug`` also the libraries' and tracebacks)."""
    # Under systemd (JOURNAL_STREAM set) journald adds timestamps; a terminal gets them.
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("JOURNAL_STREAM") else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    if debug or verbose >= 2:
        level = logging.DEBUG
    else:
        level = logging.INFO if verbose or serving else logging.WARNING
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)
    # Libraries that narrate every request, job or connection: their warnings only, unless --debug.
    for noisy in ("httpx", "httpcore", "urllib3", "jieba", "apscheduler", "uvicorn", "pymongo", "watchfiles",
                  "telegram.ext", "discord.gateway", "discord.client"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)
    redact_in_logs()  # no user:password@ of a configured URL in any log line


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", metavar="PATH", help=f"config file (default: ${config_mod.CONFIG_ENV}, else ./config.yaml, else {config_mod.SYSTEM_CONFIG})")
@click.option("--debug", is_flag=True, help="debug logging (the libraries' too) and tracebacks")
@click.option("-v", "--verbose", count=True, help="log what it does (INFO); -vv: debug. Default: warnings only (serve: log_level)")
@click.version_option(package_name="leanote-rag")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, debug: bool, verbose: int) -> None:
    """Ask questions of your Leanote notes."""
    serving = ctx.invoked_subcommand == "serve"
    _setup_logging(debug, verbose, serving)
    ctx.obj = App(config_path, debug, verbose, serving)


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
@click.option("--user", "user_id", metavar="USER", help="whose notes to search: a Leanote user id or an account's email (needed when the index holds several users)")
@click.option("--retriever", type=click.Choice(RETRIEVERS), default="hybrid", show_default=True)
@pass_app
def search(app: App, query, queries_file, as_json, k, user_id, retriever) -> None:
    """Find the chunks of your notes that best match QUERY."""
    if (query is None) == (queries_file is None):
        raise click.UsageError("give either QUERY or --queries FILE")
    batch = load_questions(queries_file, required=("question",)) if queries_file else None
    most = app.settings.limits.question_chars
    if batch is None:
        limits.check(query, most, "the query")
    with app.door() as door:
        users = door.users()
        if batch is None:
            user = app.pick_user(users, user_id)
            hits = door.search(query, user, k, retriever)
            if as_json:
                _print_json({"query": query, "user_id": user, "hits": [h.as_json() for h in hits]})
            else:
                _print_hits(hits, query)
            return
        failed = 0
        for q in batch:
            try:
                limits.check(q["question"], most, f"query {q.get('id')}")
                user = app.pick_user(users, q.get("user_id") or user_id)
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
@click.option("--user", "user_id", metavar="USER", help="whose notes to ask: a Leanote user id or an account's email (needed when the index holds several users)")
@click.option("--trace", "show_trace", is_flag=True, help="show why: the rewritten question, candidates and scores, evidence")
@pass_app
def ask(app: App, question: str, as_json: bool, user_id: str | None, show_trace: bool) -> None:
    """Answer QUESTION from your notes, citing them."""
    limits.check(question, app.settings.limits.question_chars)
    stream = not as_json and sys.stdout.isatty()
    streamed = []

    def printer(text: str) -> None:
        streamed.append(text)
        click.echo(text, nl=False)

    def found(sources) -> None:  # before the LLM reads: where the answer will come from
        click.echo(click.style("读的笔记 / Reading:", dim=True))
        for c in sources:
            click.echo(click.style(f"  {c.title or c.note_id}  {c.url}", dim=True))
        click.echo()

    with app.door() as door:
        user = app.pick_user(door.users(), user_id)
        answer = door.ask(question, user, on_token=printer if stream else None, on_sources=found if stream else None)
    if as_json:
        _print_json(answer.as_json(with_trace=show_trace))
        return
    answered = answer.trace is not None and answer.trace.outcome == "llm"
    if stream and answered and "".join(streamed).strip() == answer.answer.strip():
        click.echo()
    else:
        if streamed:  # the LLM stopped halfway, or its answer did not stand on the notes: withdrawn
            _withdraw("".join(streamed), question)
        offline = None if answered else _without_llm(question, answer)
        if offline:  # first: what the passages below are
            click.echo(click.style(offline, dim=True))
        click.echo(answer.answer)
    if answered and answer.notice:  # sentences left out of the answer: said after it
        click.echo(click.style(answer.notice, dim=True))
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


def _withdraw(text: str, question: str) -> None:
    """Take back text streamed to the terminal that is not the answer: erased when it is all
    still on screen, else struck through and followed by a line saying so."""
    import shutil
    import unicodedata

    size = shutil.get_terminal_size()
    rows = 0
    for line in text.split("\n"):
        width = sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in line)
        rows += max(1, -(-width // max(1, size.columns)))
    if rows < size.lines:
        # back to the start of the streamed text, and clear from there down
        click.echo(f"\r\x1b[{rows - 1}F\x1b[J" if rows > 1 else "\r\x1b[J", nl=False)
        return
    zh = any("\u3400" <= ch <= "\u9fff" for ch in question)
    click.echo()
    click.echo(click.style("（上面的文字没有通过与笔记的核对，已撤回，以下为准。）" if zh else
                           "(The text above did not check out against your notes and is withdrawn; what follows is the answer.)",
                           bold=True))


def _without_llm(question: str, answer) -> str | None:
    """One plain line saying that no LLM wrote this answer, why, and that the passages are
    the answer; None when an LLM wrote it (or nothing was found)."""
    trace = answer.trace
    zh = any("\u3400" <= ch <= "\u9fff" for ch in question)
    if answer.notice:
        if trace is None or not trace.llm_error:
            return answer.notice
        if zh:
            return f"语言模型没有回答（{trace.llm_error}），以下笔记段落就是回答。"
        return f"No language model answered ({trace.llm_error}), so the passages below from your notes are the answer."
    if trace is not None and trace.outcome == "extractive" and answer.citations:
        if zh:
            return "没有配置语言模型（ollama.enabled: false），以下笔记段落就是回答。"
        return "No language model is configured (ollama.enabled: false), so the passages below from your notes are the answer."
    return None


def _print_trace(answer) -> None:
    t = answer.trace
    click.echo("\n" + click.style("trace", bold=True))
    click.echo(f"  question:   {t.question}")
    if t.standalone != t.question:
        click.echo(f"  rewritten:  {t.standalone}")
    if t.followup:
        click.echo(f"  follow-up:  {t.followup}")
    if t.expansion:
        click.echo(f"  expansion:  {t.expansion}")
    click.echo(f"  rerank:     {t.rerank}")
    if t.budget:
        click.echo(f"  budget:     {t.budget}")
    if t.entities:
        click.echo(f"  entities:   {'; '.join(t.entities)}")
    for line in t.facts:
        click.echo(f"  fact:       {line}")
    click.echo(f"  decision:   {t.decision}")
    if t.llm_error:
        click.echo(f"  llm error:  {t.llm_error}")
    if t.unknown_names:
        click.echo(f"  not in any note: {', '.join(t.unknown_names)}")
    if t.citing:
        click.echo(f"  llm reply:  {t.citing}" + ("" if t.outcome == "llm" else f": {' '.join(t.reply.split())[:300]}"))
    if t.support:
        click.echo(f"  checked:    {t.support}")
    click.echo(f"  timings ms: {answer.timings_ms}")
    click.echo("  candidates: dense rank/score · sparse rank/score · fused · rerank · evidence block")
    for c in t.candidates[:20]:
        dense, sparse, fused, rr, ev = c.cells()
        click.echo(f"    {dense:>11} {sparse:>10} {fused:>7} {rr:>6} {ev:>4}  {c.title} › {c.heading}")


@cli.command(name="eval")
@click.argument("questions_file", required=False, type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--answers", "answers_file", metavar="FILE.jsonl", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="answer metrics instead: `ask` every question of FILE (the configured LLM, or extractive answers)")
@click.option("--json", "as_json", is_flag=True, help="JSON report, with per-question misses (--answers: every question)")
@click.option("--with-changes", is_flag=True, help="count after_changes questions (the change batch is synced)")
@click.option("--retriever", "retrievers", type=click.Choice(RETRIEVERS), multiple=True, help="default: all three")
@pass_app
def eval_command(app: App, questions_file: Path | None, answers_file: Path | None, as_json: bool, with_changes: bool,
                 retrievers) -> None:
    """Retrieval metrics on a question set (QUESTIONS_FILE): recall, hit@5, MRR, trap leaks.
    With --answers FILE: answer metrics: refusals, gold notes cited, traps, latency."""
    if (questions_file is None) == (answers_file is None):
        raise click.UsageError("give either QUESTIONS_FILE (retrieval metrics) or --answers FILE (answer metrics)")
    if answers_file is not None:
        if retrievers:
            raise click.UsageError("--retriever is for the retrieval eval; the answer eval uses the configured retrieval")
        _answer_eval(app, answers_file, as_json, with_changes)
        return
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


def _answer_eval(app: App, path: Path, as_json: bool, with_changes: bool) -> None:
    """``eval --answers``: every question through ``ask``, by the same door as ``ask``."""
    questions = load_questions(path, required=ANSWER_REQUIRED, check=check_answer_question)
    settings = app.settings
    def show(i: int, n: int, q: dict, answer) -> None:
        outcome = answer.trace.outcome if answer.trace is not None else "?"
        click.echo(f"\r{i}/{n} {q['id']}: {outcome}, {answer.timings_ms.get('total', 0) / 1000:.1f} s\033[K",
                   nl=i == n, err=True)

    progress = show if sys.stderr.isatty() else None
    with app.door() as door:
        pairs, skipped = ask_all(door.ask, questions, with_changes, progress)
        through_daemon = door.through_daemon
    llm = ({"model": settings.ollama.model, "host": safe_url(settings.ollama.host), "through_daemon": through_daemon}
           if settings.ollama.enabled else None)
    result = answer_report(pairs, settings.answer.refusal, skipped, llm)
    if as_json:
        _print_json(result)
        return
    for line in answer_table(result):
        click.echo(line)


def _ms(value) -> str:
    return "-" if value is None else f"{value:.0f}"


def answer_table(r: dict) -> list[str]:
    """The answer eval as a compact text table."""
    llm = r["llm"]
    where = " (through the running service)" if llm and llm["through_daemon"] else ""
    lines = [f"LLM: {llm['model']} at {llm['host']}{where}" if llm else "LLM: none (ollama.enabled: false): extractive answers",
             "outcomes: " + ", ".join(f"{k} {v}" for k, v in r["outcomes"].items()), ""]
    lines.append(f"{'type':<15} {'n':>3} {'gold cited':>10} {'rate':>6} {'by LLM':>7} {'refused':>8} {'uncited':>8} "
                 f"{'passages':>9}")
    for kind, t in r["by_type"].items():
        if "gold_cited" in t:
            lines.append(f"{kind:<15} {t['n']:>3} {t['gold_cited']:>10} {t['gold_cited_rate']:>6.3f} "
                         f"{t['gold_cited_by_llm']:>7} {t['false_refusals']:>8} {t['uncited_by_llm']:>8} "
                         f"{t['passages_instead']:>9}")
    a = r["answerable"]
    rate = "-" if a["gold_cited_rate"] is None else f"{a['gold_cited_rate']:.3f}"
    lines.append(f"{'answerable':<15} {a['n']:>3} {a['gold_cited']:>10} {rate:>6} {a['gold_cited_by_llm']:>7} "
                 f"{a['false_refusals']:>8} {a['uncited_by_llm']:>8} {a['passages_instead']:>9}")
    lines.append(f"  the LLM's replies: cited {a['llm_cited']}, cited by inference {a['llm_inferred']}, refused "
                 f"{a['refused_by_llm']}, uncited {a['uncited_by_llm']}; refused before the LLM "
                 f"{a['refused_before_llm']}; shown citing nothing {a['shown_uncited']}; citing only other notes "
                 f"{a['cited_other_notes_only']}; gold note in the evidence {a['gold_in_evidence']}")
    na = r["no_answer"]
    lines.append(f"{'no_answer':<15} {na['n']:>3}  not answered {na['not_answered']} (refused before the LLM "
                 f"{na['refused_before_llm']}, after it {na.get('refusal_after_llm', 0)}, passages instead "
                 f"{na['passages_instead']}), answered anyway {na['answered_anyway']}")
    t = r["traps"]
    lines.append(f"trap notes cited: {t['cited']} (questions with traps: {t['questions_with_traps']}; "
                 f"shown as closest notes: {t['shown_as_closest']})")
    lines.append(f"LLM fallbacks: {r['fallbacks']}")
    s = r.get("says")
    if s and s["replies"]:
        share = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"what the answers say: the LLM's replies {s['reply_units_supported']}/{s['reply_units']} "
                     f"sentences on the evidence ({share(s['reply_supported_share'])}), {s['replies_with_invented']} "
                     f"replies with specifics no evidence holds; shown as its answer ({s['shown_answers']}): "
                     f"{s['shown_units'] - s['shown_units_unsupported']}/{s['shown_units']} sentences on the evidence "
                     f"({share(s['shown_supported_share'])}), invented specifics {s['shown_invented']}")
        if s["points"]:
            lines.append(f"  answer points stated: {s['points_stated']}/{s['points']} "
                         f"({share(s['points_stated_rate'])}) in {s['answers_with_points']} answers; "
                         f"shown cited with a wrong claim: {s['wrong_cited']}")
    lines += ["", f"{'':<14} {'p50':>7} {'p95':>7} {'n':>4}"]
    lat = r["latency_ms"]
    lines.append(f"{'sources ms':<14} {_ms(lat['sources']['p50']):>7} {_ms(lat['sources']['p95']):>7} "
                 f"{lat['sources']['n']:>4}  (the sources shown, before the answer)")
    lines.append(f"{'first token ms':<14} {_ms(lat['first_token']['p50']):>7} {_ms(lat['first_token']['p95']):>7} "
                 f"{lat['first_token']['n']:>4}  (where the LLM answered)")
    lines.append(f"{'total ms':<14} {_ms(lat['total']['p50']):>7} {_ms(lat['total']['p95']):>7} {lat['total']['n']:>4}")
    pt = r["prompt_tokens"]
    source = {"ollama": "as Ollama reported them", "estimated": "estimated: Ollama reported none",
              None: "no LLM prompt"}.get(pt["source"], pt["source"])
    lines.append(f"{'prompt tokens':<14} {_ms(pt['p50']):>7} {_ms(pt['p95']):>7} {pt['n']:>4}  ({source})")
    if r["skipped_after_changes"]:
        lines.append(f"({r['skipped_after_changes']} after_changes questions left out; pass --with-changes once the "
                     f"change batch is synced)")
    return lines


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="JSON output: a list, newest first, with each answer's trace")
@click.option("--user", "user_id", metavar="USER_ID", help="only the answers to this Leanote user's questions")
@click.option("--since", "days", type=click.FloatRange(0, min_open=True), metavar="DAYS",
              help="only the answers of the last DAYS days")
@pass_app
def feedback(app: App, as_json: bool, user_id: str | None, days: float | None) -> None:
    """The answers the bots sent and the 👍/👎 they got, newest first (for tuning).

    Read from the feedback file directly: it works while the service runs."""
    path = path_for(app.settings)
    since = time.time() - days * 86400 if days is not None else None
    records = []
    if path.exists():
        with FeedbackStore.open_for(app.settings) as store:
            records = store.export(app.user_id(user_id), since)
    if as_json:
        _print_json(records)
        return
    if not records:
        click.echo("no answers match --user/--since" if path.exists() and (user_id or days) else "no feedback yet")
        return
    person_width = max(len("person"), *(len(r["person"]) for r in records))
    click.echo(f"{'time':<16}  {'person':<{person_width}}  {'verdict':<7}  {_cell('question', 40)}  cited")
    for r in records:
        when = datetime.fromtimestamp(r["time"]).strftime("%Y-%m-%d %H:%M")
        titles = "; ".join(dict.fromkeys(c["title"] for c in r["cited"])) or "-"
        click.echo(f"{when:<16}  {r['person']:<{person_width}}  {r['verdict'] or '-':<7}  "
                   f"{_cell(r['question'], 40)}  {titles}")
    up = sum(r["verdict"] == "up" for r in records)
    down = sum(r["verdict"] == "down" for r in records)
    click.echo(f"\n{len(records)} answers: {up} up, {down} down, {len(records) - up - down} without a verdict")


def _indexed(app: App, user: str, *rows: list[dict], also: list[str] = ()) -> list:
    """Each of ``rows`` (the memory's notes, facts, related notes) less those of notes the
    index no longer holds (``explore.indexed_only``: a note the sync could not remove from the
    memory yet is never named); a row list is None when a note of ``also`` is not held."""
    ids = sorted(explore.note_ids_in(list(rows)) | set(also))
    if not ids:
        return list(rows)
    with app.door() as door:
        held = door.held(user, ids)
    if any(a not in held for a in also):
        return [None for _ in rows]
    return [explore.indexed_only(r, held) for r in rows]


def _open_memory(app: App) -> MemoryStore:
    """The memory file, read directly (it works while the service runs)."""
    settings = app.settings
    if not settings.memory.enabled:
        raise UserError("the memory is off (memory.enabled: false in the config): set it to true and run "
                        "`leanote-rag index`")
    if not memory_path(settings).exists():
        raise UserError(f"no memory yet in {settings.state_dir}: run `leanote-rag index` first")
    return MemoryStore.open_for(settings)


@cli.command()
@click.option("--user", "user_id", metavar="USER_ID", help="whose notes (needed when the memory holds several users)")
@click.option("--top", type=click.IntRange(1), default=50, show_default=True, help="how many entities")
@click.option("--kind", type=click.Choice(KINDS), help="only entities of this kind")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@pass_app
def entities(app: App, user_id: str | None, top: int, kind: str | None, as_json: bool) -> None:
    """What your notes are about: the entities most notes mention (terms, code, tags,
    headings, link labels)."""
    with _open_memory(app) as memory:
        user = app.pick_user(memory.users(), user_id)
        found = memory.entities(user, top, kind)
    if as_json:
        _print_json({"user_id": user, "entities": found})
        return
    if not found:
        click.echo("no entities yet")
        return
    click.echo(f"{_cell('entity', 40)}  {'kind':<12} {'notes':>5} {'mentions':>8}")
    for e in found:
        click.echo(f"{_cell(e['name'], 40)}  {e['kind']:<12} {e['notes']:>5} {e['mentions']:>8}")


class _MemoryGroup(click.Group):
    """``memory ENTITY`` as before, and ``memory reject|confirm|history|export|import``: a first
    argument that is not a subcommand's name is an entity (``memory show ENTITY`` for an
    entity named like a subcommand)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["show", *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter) -> None:
        formatter.write_usage(ctx.command_path, "ENTITY [--user ID] [--json] | COMMAND [ARGS]...")


@cli.group(cls=_MemoryGroup)
def memory() -> None:
    """What the memory knows about ENTITY (`memory ENTITY`: its facts, with quotes and sources,
    and the notes that mention it), and the corrections: reject or confirm a fact or a related
    pair by its id, see its history, export and import them."""


def _date(when: float | None) -> str:
    return datetime.fromtimestamp(when).strftime("%Y-%m-%d") if when else "-"


@memory.command(name="show")
@click.argument("entity")
@click.option("--user", "user_id", metavar="USER_ID", help="whose notes (needed when the memory holds several users)")
@click.option("--json", "as_json", is_flag=True, help="JSON output: the facts, and the notes with the fields of `search --json` hits")
@pass_app
def memory_show(app: App, entity: str, user_id: str | None, as_json: bool) -> None:
    """The facts about ENTITY (as subject or object) and the notes that mention it, and where."""
    limits.check(entity, app.settings.limits.question_chars, "the name")
    with _open_memory(app) as store:
        user = app.pick_user(store.users(), user_id)
        notes = store.entity(user, entity)
        facts = store.facts_about(user, entity)
    notes, facts = _indexed(app, user, notes, facts)
    for n in notes:
        n["score"] = len(n["mentions"])
    if as_json:
        _print_json({"entity": entity, "user_id": user, "facts": facts, "notes": notes})
        return
    if not notes and not facts:
        click.echo(f"no note mentions {entity!r} (`leanote-rag entities` lists what the notes mention)")
    if facts:
        click.echo(click.style("facts", bold=True))
        for f in facts:
            status = f["status"] + (", confirmed" if f["confirmed"] else "")
            if f["superseded_by_note"]:
                status += f" by {f['superseded_by_note']}"
            click.echo(f"  {f['fact_id']}  {f['subject']} —{f['predicate']}→ {f['object']}  [{status}]")
            click.echo(f"     “{' '.join(f['quote'].split())}”  {f['title']}  {_date(f['time'])}  {f['url']}")
        if notes:
            click.echo()
    for i, n in enumerate(notes, start=1):
        where = f"  ({n['notebook']})" if n["notebook"] else ""
        click.echo(click.style(f"{i}. {n['title']}", bold=True) + where + f"  {'/'.join(n['kinds'])}")
        click.echo(f"   {n['url']}")
        for m in n["mentions"][:3]:
            if m["snippet"]:
                click.echo(f"   {m['snippet']}")


def _describe(c: dict) -> str:
    if c["kind"] == "fact":
        return f"fact {c['id']}: {c['subject']} —{c['predicate']}→ {c['object']}"
    return f"pair {c['id']}: {' ↔ '.join(c['notes'])}"


def _verdict_command(verdict: str):
    @click.argument("item_id", metavar="ID")
    @click.option("--user", "user_id", metavar="USER_ID", help="whose memory (needed when it holds several users)")
    @click.option("--json", "as_json", is_flag=True, help="JSON output")
    @pass_app
    def command(app: App, item_id: str, user_id: str | None, as_json: bool) -> None:
        with _open_memory(app) as store:
            user = app.pick_user(store.users(), user_id)
            done = store.correct(user, item_id, verdict)
        if as_json:
            _print_json(done)
            return
        what = _describe(done)
        if not done["changed"]:
            click.echo(f"{what}: already {verdict}")
        elif verdict == "rejected":
            click.echo(f"{what}: rejected ({done['removed']} rows removed; re-extraction will not bring it back)")
        else:
            click.echo(f"{what}: confirmed")

    return command


memory.command(name="reject", help="Reject a fact or related pair (ID from `memory ENTITY` or `related`): "
               "it goes, and extraction never brings it back.")(_verdict_command("rejected"))
memory.command(name="confirm", help="Confirm a fact or related pair (ID from `memory ENTITY` or `related`); "
               "confirming a rejected one lifts the rejection.")(_verdict_command("confirmed"))


@memory.command(name="history")
@click.argument("item_id", metavar="ID")
@click.option("--user", "user_id", metavar="USER_ID", help="whose memory (needed when it holds several users)")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@pass_app
def memory_history(app: App, item_id: str, user_id: str | None, as_json: bool) -> None:
    """A fact's or pair's verdicts (who, when, what) and, for a fact, its supersession history
    with sources."""
    with _open_memory(app) as store:
        user = app.pick_user(store.users(), user_id)
        h = store.correction_history(user, item_id)
    if as_json:
        _print_json(h)
        return
    click.echo(click.style(_describe(h), bold=True) + f"  (user {user})")
    click.echo(f"verdict: {h['verdict'] or 'none'}")
    for e in h["log"]:
        click.echo(f"  {datetime.fromtimestamp(e['at']).strftime('%Y-%m-%d %H:%M')}  {e['verdict']} by {e['by']}")
    if h["kind"] == "fact":
        click.echo("history of this subject and predicate, newest first:" if h["supersession"] else
                   "no fact of this subject and predicate now")
        for f in h["supersession"]:
            mark = "*" if f["fact_id"] == h["id"] else " "
            click.echo(f" {mark} {f['fact_id']}  {f['object']}  [{f['status']}]  {_date(f['time'])}  {f['title']}  "
                       f"{f['url']}")
    else:
        click.echo(f"pair now: {'present' if h['rows'] else 'absent'}")
        for n in h["notes"]:
            click.echo(f"  {n.get('title', '?')}  {n.get('url', n['note_id'])}")


@memory.command(name="export")
@click.option("--user", "user_id", metavar="USER_ID", help="only this user's corrections (default: every user's)")
@pass_app
def memory_export(app: App, user_id: str | None) -> None:
    """Every correction (verdicts and their log) as JSON on stdout: `memory export > corrections.json`."""
    with _open_memory(app) as store:
        _print_json(store.export_corrections(app.user_id(user_id)))


@memory.command(name="import")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--user", "user_id", metavar="USER_ID", help="only this user's records of FILE")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@pass_app
def memory_import(app: App, file: Path, user_id: str | None, as_json: bool) -> None:
    """Apply corrections from FILE (as `memory export` writes it); records already there are left
    as they are, so importing twice changes nothing."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"cannot read {file}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{file} is not JSON ({err}); give a file `leanote-rag memory export` wrote") from None
    with _open_memory(app) as store:
        result = store.import_corrections(data, app.user_id(user_id))
    if as_json:
        _print_json(result)
        return
    click.echo(f"{result['records']} corrections: {result['applied']} applied, {result['unchanged']} already there")
    for c in result["changes"]:
        click.echo(f"  {c['verdict']}  {_describe(c)}  (user {c['user_id']})")


@cli.command()
@click.argument("target", metavar="NOTE_ID|TITLE|QUESTION")
@click.option("--user", "user_id", metavar="USER_ID", help="whose notes (needed when the memory holds several users)")
@click.option("-k", "k", type=click.IntRange(1, 100), default=10, show_default=True, help="how many notes")
@click.option("--json", "as_json", is_flag=True, help="JSON output: the notes, with the fields of `search --json` hits and reasons")
@pass_app
def related(app: App, target: str, user_id: str | None, k: int, as_json: bool) -> None:
    """Notes related to a note (its id) or to a question (the notes found for it, then theirs)."""
    from rag.memory import related as related_mod

    limits.check(target, app.settings.limits.question_chars, "the question")
    with _open_memory(app) as store:
        user = app.pick_user(store.users(), user_id)
        named = related_mod.note_named(store, user, target)  # an id, or the words of one note's title
        if named is not None:
            target = named["note_id"]
            notes, about = store.related_of(user, target, k), {"note_id": target}
            for n in notes:  # the id `memory reject|confirm` takes
                n["pair_id"] = correction_id(user, "pair", correction_target("pair", target, n["note_id"]))
        else:
            with app.door() as door:
                hits = door.search(target, user, k, "hybrid")
            notes = related_mod.for_text(store, user, target, hits, k, app.settings.memory.related_question_min_score)
            about = {"query": target}
    if "note_id" in about:
        notes, = _indexed(app, user, notes, also=[target])
        if notes is None:
            raise UserError(f"no note {target} in the index (it left it: trashed, deleted or made private)")
    else:
        notes, = _indexed(app, user, notes)
    if as_json:
        _print_json({**about, "user_id": user, "notes": notes})
        return
    if not notes:
        click.echo("no related notes (pairs below memory.related_min_score are not kept)" if "note_id" in about else
                   "no notes related to the question (none scores memory.related_question_min_score)")
    for i, n in enumerate(notes, start=1):
        where = f"  ({n['notebook']})" if n["notebook"] else ""
        click.echo(click.style(f"{i}. {n['title']}", bold=True) + where + f"  score {n['score']:.3f}")
        click.echo(f"   {n['url']}" + (f"  pair {n['pair_id']}" if "pair_id" in n else ""))
        reasons = n["reasons"]
        if reasons.get("entities"):
            click.echo("   shared: " + ", ".join(e["name"] for e in reasons["entities"]))
        if reasons.get("passages"):
            click.echo(f"   passage: {reasons['passages']['other_snippet']}")

def _cell(text: str, width: int) -> str:
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
    config_mod.private_files()  # state.db, the index, the memory...: 0600 whatever the umask
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


if __name__ == "__main__":
    sys.exit(main())
