"""The commands that read and correct the memory: ``entities``, ``memory`` and ``related``."""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import click

from rag import limits
from rag.errors import UserError
from rag.model import ENTITY_KINDS

from bot.cli.app import App, cell as _cell, pass_app, print_json as _print_json

if TYPE_CHECKING:  # the parts are imported when a command reads them (`--help` loads none of them)
    from bot.root import Parts
    from bot.usecases.people import Person


@contextmanager
def _memory_here(app: App) -> Iterator["Parts"]:
    """The root's parts built here, for the commands only the machine's operator has (entities, a
    correction's history, export and import): the memory is SQLite, read and written here also
    while the service runs."""
    from bot.root import Parts

    with Parts(app.settings) as parts:
        yield parts


def _operator(app: App, parts: "Parts", name: str | None) -> "Person":
    """The operator, acting on ``--user``'s memory (or the only user it holds)."""
    from bot.usecases.memory import memory_users
    from bot.usecases.people import Person, resolve_user

    return Person("cli", resolve_user(memory_users(parts), app.user_id(parts, name)), admin=True)


@click.command()
@click.option("--user", "user_id", metavar="USER_ID", help="whose notes (needed when the memory holds several users)")
@click.option("--top", type=click.IntRange(1), default=50, show_default=True, help="how many entities")
@click.option("--kind", type=click.Choice(ENTITY_KINDS), help="only entities of this kind")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@pass_app
def entities(app: App, user_id: str | None, top: int, kind: str | None, as_json: bool) -> None:
    """What your notes are about: the entities most notes mention (terms, code, tags,
    headings, link labels)."""
    from bot.usecases import memory

    with _memory_here(app) as parts:
        operator = _operator(app, parts, user_id)
        found = memory.entities(parts, operator, top, kind)
    if as_json:
        _print_json({"user_id": operator.user_id, "entities": found})
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


@click.group(cls=_MemoryGroup)
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
    with app.door() as door:
        about = door.about(app.person(door, user_id), entity)
    notes, facts = about.notes, about.facts
    for n in notes:
        n["score"] = len(n["mentions"])
    if as_json:
        _print_json({"entity": entity, "user_id": about.user_id, "facts": facts, "notes": notes})
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
        with app.door() as door:
            done = door.verdict(app.person(door, user_id), item_id, verdict).done
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
    from bot.usecases import memory

    with _memory_here(app) as parts:
        operator = _operator(app, parts, user_id)
        h = memory.history(parts, operator, item_id)
    user = operator.user_id
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
    from bot.usecases import memory
    from bot.usecases.people import Person

    with _memory_here(app) as parts:
        _print_json(memory.corrections(parts, Person("cli", "", admin=True), app.user_id(parts, user_id)))


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
    from bot.usecases import memory
    from bot.usecases.people import Person

    with _memory_here(app) as parts:
        result = memory.apply_corrections(parts, Person("cli", "", admin=True), data, app.user_id(parts, user_id))
    if as_json:
        _print_json(result)
        return
    click.echo(f"{result['records']} corrections: {result['applied']} applied, {result['unchanged']} already there")
    for c in result["changes"]:
        click.echo(f"  {c['verdict']}  {_describe(c)}  (user {c['user_id']})")


@click.command()
@click.argument("target", metavar="NOTE_ID|TITLE|QUESTION")
@click.option("--user", "user_id", metavar="USER_ID", help="whose notes (needed when the memory holds several users)")
@click.option("-k", "k", type=click.IntRange(1, 100), default=10, show_default=True, help="how many notes")
@click.option("--json", "as_json", is_flag=True, help="JSON output: the notes, with the fields of `search --json` hits and reasons")
@pass_app
def related(app: App, target: str, user_id: str | None, k: int, as_json: bool) -> None:
    """Notes related to a note (its id) or to a question (the notes found for it, then theirs)."""
    limits.check(target, app.settings.limits.question_chars, "the question")
    with app.door() as door:
        found = door.related(app.person(door, user_id), target, k)
    if found.gone:
        raise UserError(f"no note {found.note_id} in the index (it left it: trashed, deleted or made private)")
    about = {"note_id": found.note_id} if found.note_id else {"query": found.query}
    user, notes = found.user_id, found.notes
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
