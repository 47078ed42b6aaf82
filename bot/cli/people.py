"""The commands about a person's own things: ``gaps`` (the questions the notes could not
answer) and ``digest`` (what a digest would say, ``--dry-run``). Both read the stores directly
(through ``bot.root.Parts``), so they work while the service runs."""

from __future__ import annotations

import time
from datetime import datetime

import click

from rag.errors import UserError

from bot.cli.app import App, cell, pass_app, print_json

STATES = ("open", "closed", "dismissed")


def _person(key: str | None, user_id: str | None):
    from bot.usecases.people import Person

    return Person(key or "cli", user_id or "", admin=True)


@click.command()
@click.option("--user", "user_id", metavar="USER", help="only the gaps over this Leanote user's notes (an id or an account's email)")
@click.option("--person", "person", metavar="KEY", help="whose gaps: a person as the bots name them (telegram:111, "
              "discord:222); the command line's own by default")
@click.option("--state", "states", type=click.Choice(STATES + ("all",)), multiple=True, help="open (the default), "
              "closed, dismissed or all")
@click.option("--dismiss", "dismiss", metavar="GAP_ID", help="dismiss this gap (of --person's) instead of listing")
@click.option("--json", "as_json", is_flag=True, help="JSON output: a list of gaps, each with its wordings, count, "
              "last asked and state")
@pass_app
def gaps(app: App, user_id: str | None, person: str | None, states: tuple[str, ...], dismiss: str | None,
         as_json: bool) -> None:
    """The questions the notes could not answer (refused, the answer withdrawn, or 👎), grouped by
    meaning, the most asked lately first."""
    from bot.root import Parts
    from bot.usecases import gaps as gaps_case

    chosen = STATES if "all" in states else (states or ("open",))
    with Parts(app.settings) as parts:
        who = _person(person, app.user_id(parts, user_id))
        if dismiss:
            gap = gaps_case.dismiss(parts, who, dismiss)
            click.echo(f"dismissed: {gap.question}")
            return
        store = parts.gaps_if_made()
        found = store.gaps(who.key, who.user_id or None, chosen) if store is not None else []
    if as_json:
        print_json([g.as_json() for g in found])
        return
    if not found:
        click.echo(f"no {'/'.join(chosen)} gaps for {who.key}" + (f" over user {user_id}" if user_id else ""))
        return
    click.echo(f"{'id':<8}  {'state':<9}  {'asked':>5}  {'last asked':<16}  {cell('question', 50)}  other wordings")
    for g in found:
        last = datetime.fromtimestamp(g.last).strftime("%Y-%m-%d %H:%M")
        others = "; ".join(g.wordings[1:3]) or "-"
        click.echo(f"{g.id:<8}  {g.state:<9}  {g.count:>5}  {last:<16}  {cell(g.question, 50)}  {others}")
        if g.state == "closed":
            click.echo(f"{'':<8}  answered by «{g.note_title or g.note_id}» {g.note_url or ''}")


def _when(text: str | None, what: str) -> float | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise UserError(f"{what} {text[:40]!r} is not a date: write it as 2025-06-01 or 2025-06-01T09:00") from None


@click.command()
@click.option("--user", "user_id", metavar="USER", required=True, help="whose notes: a Leanote user id or an account's email")
@click.option("--person", "person", metavar="KEY", help="whose digest (telegram:111): their plan, time zone and "
              "gaps; the command line's own by default")
@click.option("--dry-run", "dry_run", is_flag=True, help="print what would be sent (required: the daemon sends digests)")
@click.option("--since", "since", metavar="DATE", help="the digest covers from this date (default: since the last "
              "one, or a week)")
@click.option("--at", "at", metavar="DATE", help="as if it were sent at this time (default: now)")
@click.option("--json", "as_json", is_flag=True, help="JSON output: the digest's sections")
@pass_app
def digest(app: App, user_id: str, person: str | None, dry_run: bool, since: str | None, at: str | None,
           as_json: bool) -> None:
    """What a person's digest would say: notes added and edited, open gaps, notes from this day in
    earlier years, related notes that do not link each other yet."""
    from bot.chat.digest import digest_text
    from bot.render import notes_root
    from bot.root import Parts
    from bot.usecases import digest as digest_case

    if not dry_run:
        raise UserError("the daemon sends digests on each person's plan (/digest in chat, users[].digest in the "
                        "config): add --dry-run to print what one would say")
    with Parts(app.settings) as parts:
        who = _person(person, app.user_id(parts, user_id))
        started = time.perf_counter()
        found = digest_case.compose(parts, who, _when(since, "--since"), _when(at, "--at"))
        took = time.perf_counter() - started
        text = digest_text(found, parts.note_url, notes_root(parts.settings))
    if as_json:
        print_json({**found.as_json(), "seconds": round(took, 3)})
        return
    click.echo(text)
