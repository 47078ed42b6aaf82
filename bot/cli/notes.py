"""The commands that ask the notes: ``search``, ``ask``, ``eval`` and ``feedback``; and ``note``,
which writes one (into Leanote, or the notes folder, as the bots' ``/note`` does).

Each reaches the notes through a door (``bot.cli.door``): the running daemon's API,
or the index opened here, with the same output either way.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path

import click

from rag import limits
from rag.language import chinese, label
from rag.errors import UserError
from rag.redact import safe_url
from rag.model import RETRIEVERS

from bot.cli.app import App, cell as _cell, pass_app, print_json as _print_json

def _print_hits(hits, query: str, settings) -> None:
    from rag.index.excerpt import excerpt, question_terms

    if not hits:
        click.echo("no matching notes")
        return
    # made once for the hits, as the search made them (the glossary read from the state dir)
    terms = question_terms(query, settings.retrieval.translate_english, settings.state_dir)
    for i, h in enumerate(hits, start=1):
        where = " › ".join(p for p in (h.notebook, h.heading) if p)
        click.echo(click.style(f"{i}. {h.title}", bold=True) + (f"  ({where})" if where else "") + f"  score {h.score:.4f}")
        click.echo(f"   {h.url}")
        click.echo(f"   {' '.join(excerpt(h.text, query, 200, terms).split())}")


@click.command()
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
    from rag.eval import load_questions

    batch = load_questions(queries_file, required=("question",)) if queries_file else None
    most = app.settings.limits.question_chars
    if batch is None:
        limits.check(query, most, "the query")
    with app.door() as door:
        users = door.users()
        if batch is None:
            found = door.search(app.person(door, user_id, users), query, k, retriever)
            if as_json:
                _print_json({"query": query, "user_id": found.user_id, "hits": [h.as_json() for h in found.hits]})
            else:
                _print_hits(found.hits, query, app.settings)
            return
        failed = 0
        for q in batch:
            try:
                limits.check(q["question"], most, f"query {q.get('id')}")
                hits = door.search(app.person(door, q.get("user_id") or user_id, users), q["question"], k,
                                   retriever).hits
                out = {"id": q.get("id"), "hits": [h.as_json() for h in hits]}
            except UserError as err:
                failed += 1
                out = {"id": q.get("id"), "error": str(err)}
            if as_json:
                _print_json(out)
            else:
                click.echo(click.style(f"# {q.get('id')}: {q['question']}", bold=True))
                _print_hits(hits, q["question"], app.settings) if "hits" in out else click.echo(f"error: {out['error']}")
        if failed:
            raise click.exceptions.Exit(1)


@click.command()
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
        click.echo(click.style(f"{label(question, 'reading')}:", dim=True))
        for c in sources:
            click.echo(click.style(f"  {c.title or c.note_id}  {c.url}", dim=True))
        click.echo()

    with app.door() as door:
        answer = door.ask(app.person(door, user_id), question, on_token=printer if stream else None,
                          on_sources=found if stream else None)
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
    if answer.quote:  # the note's own words the answer stands on
        click.echo("\n" + answer.quote)
    if answered and answer.notice:  # sentences left out of the answer: said after it
        click.echo(click.style(answer.notice, dim=True))
    if answer.citations:
        click.echo("\n" + click.style(f"{label(question, 'sources')}:", bold=True))
        for c in answer.citations:
            click.echo(f"[{c.n}] {c.label}  {c.url}")
    if answer.closest:
        click.echo("\n" + click.style(f"{label(question, 'closest')}:", bold=True))
        for c in answer.closest:
            click.echo(f"- {c.label}  {c.url}")
    if show_trace:
        _print_trace(answer)


@click.command()
@click.argument("text")
@click.option("--title", help="the note's title (default: the text's first line)")
@click.option("--user", "user_id", metavar="USER", help="whose notes: a Leanote user id or an account's email (needed "
              "when the index holds several users)")
@click.option("--once", metavar="ID", help="an id of yours for this note: run again with the same id, it writes "
              "nothing new and shows the first note")
@click.option("--json", "as_json", is_flag=True, help="JSON output: the receipt (status, message, note_id, url)")
@pass_app
def note(app: App, text: str, title: str | None, user_id: str | None, once: str | None, as_json: bool) -> None:
    """Capture TEXT as a new note: into Leanote (capture.accounts, or a leanote_api source's), or a
    Markdown file in the notes folder (a files source), written once, as the bots' /note. #hashtags
    become tags. With the service running it writes it and indexes it within seconds; without, the
    next `index` reads it."""
    with app.door() as door:
        receipt = door.note(app.person(door, user_id), text, title or "", once or "")
        through_daemon = door.through_daemon
    if receipt.status == "refused":  # nothing was written (capture off, nowhere to write, too long...)
        raise UserError(receipt.message)
    if as_json:
        _print_json({"status": receipt.status, "message": receipt.message, "note_id": receipt.note_id,
                     "url": receipt.url, "again": receipt.again})
    else:
        click.echo(receipt.message)
        if receipt.status == "written" and not through_daemon and not receipt.again:
            click.echo(click.style("run `leanote-rag index` to search it (`serve` does that by itself)", dim=True))


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
    zh = chinese(question)
    click.echo()
    click.echo(click.style("（上面的文字没有通过与笔记的核对，已撤回，以下为准。）" if zh else
                           "(The text above did not check out against your notes and is withdrawn; what follows is the answer.)",
                           bold=True))


def _without_llm(question: str, answer) -> str | None:
    """One plain line saying that no LLM wrote this answer, why, and that the passages are
    the answer; None when an LLM wrote it (or nothing was found)."""
    trace = answer.trace
    zh = chinese(question)
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
    from bot.usecases.results import Why

    why = Why.of(answer.trace, operator=True, timings_ms=answer.timings_ms)
    click.echo("\n" + click.style("trace", bold=True))
    for what, text in why.rows:
        click.echo(f"  {what + ':':<11} {text}")
    click.echo(f"  timings ms: {why.timings_ms}")
    click.echo("  candidates: dense rank/score · sparse rank/score · fused · rerank · evidence block")
    for c in why.candidates[:20]:
        click.echo(f"    {c['dense']:>11} {c['sparse']:>10} {c['fused']:>7} {c['rerank']:>6} {c['evidence']:>4}  "
                   f"{c['title']} › {c['heading']}")


@click.command(name="eval")
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
    from rag.eval import evaluate, load_questions, report_json

    from bot.usecases.people import Person

    questions = load_questions(questions_file)
    with app.door() as door:
        def search(question: str, user_id: str, k: int, retriever: str):
            return door.search(Person("cli", user_id, admin=True), question, k, retriever).hits

        reports, skipped = evaluate(search, questions, tuple(retrievers) or RETRIEVERS, with_changes)
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
    from rag.eval import ANSWER_REQUIRED, answer_report, ask_all, check_answer_question, load_questions

    from bot.usecases.people import Person

    questions = load_questions(path, required=ANSWER_REQUIRED, check=check_answer_question)
    settings = app.settings
    def show(i: int, n: int, q: dict, answer) -> None:
        outcome = answer.trace.outcome if answer.trace is not None else "?"
        click.echo(f"\r{i}/{n} {q['id']}: {outcome}, {answer.timings_ms.get('total', 0) / 1000:.1f} s\033[K",
                   nl=i == n, err=True)

    progress = show if sys.stderr.isatty() else None
    with app.door() as door:
        def ask(question: str, user_id: str):
            return door.ask(Person("cli", user_id, admin=True), question)

        pairs, skipped = ask_all(ask, questions, with_changes, progress)
        through_daemon = door.through_daemon
    llm = ({"model": settings.ollama.model, "host": safe_url(settings.ollama.host), "through_daemon": through_daemon}
           if settings.ollama.enabled else None)
    result = answer_report(pairs, (settings.answer.refusal, settings.answer.refusal_english), skipped, llm)
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
                         f"({share(s['points_stated_rate'])}) in {s['answers_with_points']} answers, "
                         f"{s.get('points_shown', 0)}/{s['points']} ({share(s.get('points_shown_rate'))}) with the "
                         f"note's words quoted under them; "
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


@click.command()
@click.option("--json", "as_json", is_flag=True, help="JSON output: a list, newest first, with each answer's trace")
@click.option("--user", "user_id", metavar="USER_ID", help="only the answers to this Leanote user's questions")
@click.option("--since", "days", type=click.FloatRange(0, min_open=True), metavar="DAYS",
              help="only the answers of the last DAYS days")
@pass_app
def feedback(app: App, as_json: bool, user_id: str | None, days: float | None) -> None:
    """The answers the bots sent and the 👍/👎 they got, newest first (for tuning).

    Read from the feedback file directly: it works while the service runs."""
    from bot.root import Parts
    from bot.usecases import answers
    from bot.usecases.people import Person

    since = time.time() - days * 86400 if days is not None else None
    with Parts(app.settings) as parts:
        found = answers.kept(parts, Person("cli", "", admin=True), app.user_id(parts, user_id), since)
    made, records = found is not None, found or []
    if as_json:
        _print_json(records)
        return
    if not records:
        click.echo("no answers match --user/--since" if made and (user_id or days) else "no feedback yet")
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
