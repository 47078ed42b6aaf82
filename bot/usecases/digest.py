"""Digests: opt-in, per person, on their plan (``/digest weekly mon 09:00``, ``daily 08:30``,
``off``, or ``users[].digest`` in the config), in their time zone; sent by the daemon to their
private chat (``bot.digests`` schedules them). ``compose`` is what would be sent
(``leanote-rag digest --dry-run``); ``send`` sends it, and nothing when there is nothing to say.

A plan is the person's, not a Leanote user's: each send asks who the person is now, by the
config in force (``people.person_now``): nobody removed from ``users:`` gets one, and a person
mapped to another Leanote user since gets that user's notes and gaps, nothing of the old one's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from rag.digest import Digest, compute
from rag.digest_plan import Plan, parse_plan
from rag.sections_chat import CHAT_DOORS

from bot.render import notes_root
from bot.usecases import gaps
from bot.usecases.people import Person, entry_of, person_now

if TYPE_CHECKING:
    from bot.root import Parts

log = logging.getLogger(__name__)
PERIOD = {"daily": 86400.0, "weekly": 7 * 86400.0}


def configured(parts: "Parts") -> dict[str, tuple[str, str]]:
    """The digest plans the config in force gives (``users[].digest``): person key -> (plan,
    time zone)."""
    out = {}
    for entry in parts.settings.users:
        for platform in CHAT_DOORS:
            for i in entry.ids_on(platform):
                out[f"{platform}:{i}"] = (entry.digest or "", entry.timezone)
    return out


def _default_tz(parts: "Parts", person: Person) -> str:
    entry = entry_of(parts.settings, person.key)
    return entry.timezone if entry is not None else "UTC"


def plan_of(parts: "Parts", person: Person) -> Plan | None:
    """The person's plan: as set in chat, else the config's; None: no digest."""
    store = parts.gaps_if_made()
    plan = store.plan(person.key) if store is not None else None
    if plan is None:
        text, tz = configured(parts).get(person.key, ("", "UTC"))
        parsed = parse_plan(text, tz) if text else None
        plan = Plan(person.key, *parsed) if parsed else None
    return None if plan is None or plan.every == "off" else plan


def set_plan(parts: "Parts", person: Person, text: str) -> Plan | None:
    """The person's plan from what they typed (``UserError``: an unknown day, time or time zone);
    None: ``off``. The daemon's schedule follows at once (``parts.replan``). In a worker thread."""
    parsed = parse_plan(text, _default_tz(parts, person))
    now = parts.clock()
    if parsed is None:  # kept as "off": it overrides a plan the config gives
        plan = Plan(person.key, "off", "*", "00:00", "UTC", now)
    else:
        old = parts.gaps.plan(person.key)
        plan = Plan(person.key, *parsed, last_sent=(old.last_sent if old and old.last_sent else now))
    parts.gaps.set_plan(plan, person.key)
    if parts.replan is not None:
        parts.replan(person.key)
    return None if parsed is None else plan


def since_for(plan: Plan | None, now: float) -> float:
    """What a digest covers: since the last one, else one period (a week without a plan)."""
    if plan is not None and plan.last_sent:
        return plan.last_sent
    return now - PERIOD.get(plan.every if plan else "weekly", PERIOD["weekly"])


def compose(parts: "Parts", person: Person, since: float | None = None, now: float | None = None,
            tz: str | None = None) -> Digest:
    """The person's digest as it would be sent now (or at ``now``), since ``since`` (the last one
    by default), in their time zone. In a worker thread: reads the memory and the gaps."""
    now = parts.clock() if now is None else now
    plan = plan_of(parts, person)
    since = since_for(plan, now) if since is None else since
    tz = tz or (plan.tz if plan else _default_tz(parts, person))
    return compute(parts.memory_to_read, parts.gaps_if_made(), person.key, person.user_id, since, now, tz,
                   parts.settings.related_min_score, text_of=_text_of(parts))


def _text_of(parts: "Parts"):
    """A note's text as indexed (its chunks), "" when the index does not hold it: what the
    digest reads for the titles a note names in 《》."""
    from rag.index.asked import chunks_from_index

    def text_of(note_id: str) -> str:
        store = parts.store()
        found = chunks_from_index(store, note_id) if store is not None else None
        return "\n".join(c.text for c in found[1]) if found else ""

    return text_of


async def send(parts: "Parts", key: str, render, now: float | None = None) -> Digest | None:
    """The digest of person ``key`` (``telegram:111``) to their private chat, of their Leanote
    user as the config in force maps them now, when there is something to say (None when there
    is not, when they are no longer in ``users:``, or their bot is not running: tried at the
    next time). ``render`` turns it into text for the person's platform. The plan remembers
    when it went."""
    person = await asyncio.to_thread(person_now, parts, key)
    if person is None:
        log.info("no digest for %s: not in users: now (or their account has not synced yet)", key)
        return None
    tell = gaps.announcer(parts, person.key)
    if tell is None:
        return None
    now = parts.clock() if now is None else now
    digest = await asyncio.to_thread(compose, parts, person, None, now)
    if not digest.empty:
        await tell(person.key, render(digest, parts.note_url, notes_root(parts.settings)))
    await asyncio.to_thread(parts.gaps.sent, person.key, now)
    return None if digest.empty else digest
