"""How the command line prints the status report (``bot.usecases.status``) and an index pass."""

from __future__ import annotations

import json

import click

from sync.indexer import Summary

from bot.usecases.status import questions_line, second_line, sync_line, when


# What a note given up on means to someone reading ``status``, and what they can do about it.
PARKED = (
    "given up: the LLM failed on these notes at every try and no longer reads them. They are still searched",
    "and answered from, without the facts and summary the LLM adds. Fix what the error says (is Ollama up?",
    "does the model reply with the JSON asked for?); a note given up on is tried again when its text changes.",
)
BACKENDS = {"edge": "embedded Qdrant", "server": "Qdrant server"}


def print_status(report: dict) -> None:
    click.echo(f"index:    {report['index']} ({BACKENDS.get(report['backend'], report['backend'])})")
    if report["embedder"]:
        click.echo(f"embedder: {report['embedder']} ({report['dim']} dimensions)")
    else:  # no index yet
        click.echo(f"embedder: {report.get('embedder_configured')} (the first index pass embeds with it)")
    source = report["source"]
    click.echo(f"source:   {source.get('text') or (source['kind'] + ' ' + (source['path'] or '')).strip()}")
    for u in report["users"]:
        click.echo(f"user {u['user_id']}: {u['notes']} notes, searched as {u['chunks']} passages")
    for a in report["accounts"]:
        line = f"account {a['account']}: {sync_line(a)}; last synced {a['last_success'] or 'never'}"
        if a["last_error"]:
            line += f"; failing since {a['failing_since']}: {a['last_error']}"
        if a["next_run"]:
            line += f"; next sync {a['next_run']}"
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
        _print_memory(memory)
    second = second_line(report.get("second_index"))
    if second:
        click.echo(second)
    skipped = report["skipped"]
    if skipped:
        click.echo(f"not indexed: {len(skipped)} note(s) that could not be read (fixed on their next change):")
        for s in skipped[:10]:
            click.echo(f"  {s['origin']}: {s['reason']}")
        if len(skipped) > 10:
            click.echo(f"  ... and {len(skipped) - 10} more (status --json lists them all)")


def _print_memory(memory: dict) -> None:
    read = sum(memory["notes"].values())
    by_llm = memory["notes"].get("llm", 0)
    click.echo(f"memory:   {read} notes read for names and terms" + (f", {by_llm} of them also summarised by the LLM"
                                                                   if by_llm else "")
               + f"; {memory['entities']} names, mentioned {memory['mentions']} times")
    llm = memory.get("llm")
    if llm:
        facts = ", ".join(f"{n} {FACT_STATUS.get(s, s)}" for s, n in sorted(llm["facts_by_status"].items()))
        click.echo(f"          summaries and facts by the LLM: {llm['jobs_pending']} notes waiting"
                   + (f", {llm['jobs_parked']} given up on" if llm["jobs_parked"] else "")
                   + f"; {llm['facts']} facts" + (f" ({facts})" if facts else ""))
        if llm.get("done_last_day") or llm.get("jobs_pending"):
            click.echo(f"          notes summarised: {llm['done_last_hour']} in the last hour, {llm['done_last_day']} "
                       f"in the last day" + (f" (the last at {llm['last_done']})" if llm["last_done"] else ""))
        worker = llm.get("worker")
        if worker and worker["text"]:
            click.echo(f"          summaries and facts {worker['text']}")
        if llm.get("outlook") and llm["outlook"]["text"]:
            click.echo(f"          the notes waiting: {llm['outlook']['text']}")
        if llm["jobs_parked"]:
            for line in PARKED:
                click.echo(f"          {line}")
        for job in llm["parked"]:
            click.echo(f"          given up on {job['note_id']} after {job['attempts']} tr"
                       f"{'y' if job['attempts'] == 1 else 'ies'}: {job['error']}")
        if llm["jobs_parked"] > len(llm["parked"]):
            click.echo(f"          ... and {llm['jobs_parked'] - len(llm['parked'])} more")
    line = questions_line(memory.get("questions"))
    if line:
        click.echo(f"          {line}")


FACT_STATUS = {"active": "current", "superseded": "replaced by newer notes"}


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
