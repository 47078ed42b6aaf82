"""The daemon's digest schedule: one APScheduler job per person with a plan, on the sync's
scheduler (``sync.schedule.Schedule.add_cron``), a ``CronTrigger`` in the person's time zone.

``coalesce=True`` and ``max_instances=1``: runs missed while the process was busy or asleep are
one run, never several; ``misfire_grace_time`` keeps a late run (a loaded machine) instead of
skipping it. After downtime (the daemon was not running at the planned time), ``catch_up``
runs each person's missed digest once, at start: their last one went before the latest
planned time. A digest is read in a worker thread and never waits for the LLM, so it cannot
delay the sync; a failure is logged and tried at the next planned time.

A job runs for a person, never for a Leanote user: ``digest.send`` asks who they are now. After a
reload (``follow``) the jobs follow ``users:``: a person removed loses theirs (their plan is kept,
and comes back with them), one added with ``users[].digest`` gets one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta
from typing import Callable

from rag.digest_plan import DAYS, Plan, parse_plan, plan_text, zone

from bot.chat.digest import digest_text
from bot.usecases import digest as digest_case
from bot.usecases.gaps import announcer
from bot.usecases.people import entry_of

log = logging.getLogger(__name__)

MISFIRE = 6 * 3600  # a run up to 6 h late still runs (once); later ones wait for catch_up or the next time
BOT_WAIT = 120.0  # seconds a digest caught up at start waits for its person's bot to be running


def last_planned(plan: Plan, now: float) -> float:
    """The latest planned time at or before ``now`` (a Unix time), in the plan's time zone."""
    tz = zone(plan.tz)
    hour, minute = (int(x) for x in plan.at.split(":"))
    at = datetime.fromtimestamp(now, tz).replace(hour=hour, minute=minute, second=0, microsecond=0)
    step = timedelta(days=1)
    while at.timestamp() > now or (plan.every == "weekly" and at.weekday() != DAYS.index(plan.day)):
        at = (at - step).replace(hour=hour, minute=minute)  # (the wall clock's time, across a DST change)
    return at.timestamp()


class DigestJobs:
    """The digest jobs of one daemon: ``start`` schedules every plan and catches up what was
    missed; ``replan`` follows one person's new plan (``/digest``)."""

    def __init__(self, parts, schedule, clock: Callable[[], float]):
        """``schedule``: the sync's (``add_cron``, ``remove_cron``, ``next_run``)."""
        self.parts = parts
        self.schedule = schedule
        self.clock = clock
        self.scheduled: set[str] = set()  # the people with a job

    def plans(self) -> list[Plan]:
        """Every plan of a person ``users:`` holds now: set in chat, else from the config (kept
        in the store from the first start, so the time of the last digest is remembered); "off"
        ones left out."""
        store = self.parts.gaps
        kept = {p.person: p for p in store.plans()}
        for person, (text, tz) in digest_case.configured(self.parts).items():
            if person in kept or not text:
                continue
            plan = Plan(person, *parse_plan(text, tz), last_sent=self.clock())
            store.set_plan(plan, person)
            kept[person] = plan
        settings = self.parts.settings
        return [p for p in kept.values() if p.every != "off" and entry_of(settings, p.person) is not None]

    async def start(self) -> None:
        try:
            plans = await asyncio.to_thread(self.plans)
            for plan in plans:
                self._schedule(plan)
            await self.catch_up(plans)
        except Exception:  # the sync and the doors go on without digests
            log.exception("digests could not be scheduled")

    async def catch_up(self, plans: list[Plan]) -> int:
        """Each person whose digest was planned while the daemon was down gets it once now."""
        now, sent = self.clock(), 0
        for plan in plans:
            if plan.last_sent is not None and plan.last_sent < last_planned(plan, now):
                log.info("digest for %s missed at %s: sending it now", plan.person,
                         datetime.fromtimestamp(last_planned(plan, now)).isoformat(timespec="minutes"))
                await self._bot_running(plan.person)
                await self.run(plan.person)
                sent += 1
        return sent

    async def _bot_running(self, person: str) -> None:
        deadline = time.monotonic() + BOT_WAIT
        while announcer(self.parts, person) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)

    def _schedule(self, plan: Plan) -> None:
        self.schedule.add_cron(f"digest:{plan.person}", self.run, [plan.person],
                               plan.day if plan.every == "weekly" else "*", plan.at, zone(plan.tz), MISFIRE)
        self.scheduled.add(plan.person)

    def _unschedule(self, person: str) -> None:
        self.schedule.remove_cron(f"digest:{person}")
        self.scheduled.discard(person)

    async def follow(self) -> None:
        """After a reload: the jobs of the people ``users:`` holds now (with their plans, or the
        ones the config gives them), and none for the others; said in the log when one goes or
        comes. A job that still runs meanwhile asks again (``digest.send``)."""
        try:
            plans = {p.person: p for p in await asyncio.to_thread(self.plans)}
            for person in sorted(self.scheduled - set(plans)):
                self._unschedule(person)
                log.info("digest for %s stopped: not in users: now", person)
            for person, plan in sorted(plans.items()):
                if person not in self.scheduled:
                    log.info("digest for %s scheduled: %s", person, plan_text(plan))
                self._schedule(plan)
        except Exception:
            log.exception("the digests could not follow the reloaded users:")

    def replan(self, person: str) -> None:
        """The person's plan changed (in a worker thread or on the loop): its job follows."""
        plan = self.parts.gaps.plan(person)
        self._unschedule(person)
        if plan is not None and plan.every != "off" and entry_of(self.parts.settings, person) is not None:
            self._schedule(plan)

    def next_run(self, person: str) -> datetime | None:
        return self.schedule.next_run(f"digest:{person}")

    async def run(self, person: str) -> None:
        """One person's digest now (the job, or ``catch_up``)."""
        plan = self.parts.gaps.plan(person)
        if plan is None or plan.every == "off":
            return
        try:
            await digest_case.send(self.parts, person, digest_text, now=self.clock())
        except Exception:
            log.exception("the digest for %s failed; tried again at its next time", person)
