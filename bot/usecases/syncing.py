"""A sync pass asked for by a person (admins only): now and waited for (the API's ``/sync``,
``leanote-rag index``), or the schedule's next pass brought forward (a chat's ``/sync``); and
``after_pass``, what follows every pass that did not fail, the daemon's and one made here alike."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Callable

from rag.errors import UserError

from sync.faults import check_disk
from sync.progress import Progress

from bot.usecases import gaps
from bot.usecases.people import Person
from bot.usecases.results import Synced, SyncRequest

if TYPE_CHECKING:
    from bot.root import Parts

CHAT_SYNC_WAIT = 600.0  # seconds a chat's /sync waits for its pass before it says "still syncing"


class AdminsOnly(UserError):
    """Only an admin may start a sync."""

    def __init__(self):
        super().__init__("only an admin may start a sync")


async def sync_now(parts: "Parts", person: Person, reconcile: bool = False, rebuild: bool = False,
                   progress: Progress | None = None) -> Synced:
    """One pass now, whatever the backoff says, waiting for a pass already running:
    ``reconcile`` compares every note with the source, ``rebuild`` empties the index (and what
    is derived from the notes) and reads every note again. ``progress`` hears how far it got,
    in the pass's thread."""
    if not person.admin:
        raise AdminsOnly()
    if parts.scheduled:
        result = await parts.schedule.sync_now(reconcile=reconcile, rebuild=rebuild, progress=progress)
    else:
        result = await asyncio.to_thread(_pass_here, parts, reconcile, rebuild, progress)
        if result.fault is None and not result.stopped:  # as the daemon's schedule does after its passes
            await after_pass(parts)
    return Synced(result.summary.as_json(), dict(result.failures), result.stopped)


async def after_pass(parts: "Parts") -> None:
    """What follows a pass that did not fail, wherever it ran (the daemon's schedule runs it
    after each of its passes; ``index`` without a daemon after its own): the knowledge gaps the
    notes it changed answer now are closed, their people told when their bot runs."""
    await gaps.check(parts)


def _pass_here(parts: "Parts", reconcile: bool, rebuild: bool, progress: Progress | None):
    """The pass in this process (no daemon runs): ``parts`` were built to make the index
    (``create``; ``rebuild`` replaces a broken state file and empties the index)."""
    parts.state  # the state first: a broken one is said (or, rebuilding, replaced) before anything else
    check_disk(parts.settings.state_dir)  # before the index maps its files: no room there is a crash
    service = parts.sync
    if rebuild and service.derived is not None:
        service.derived.reset()  # derived from the notes, like the index: built again
    return service.run_pass(reconcile=reconcile, force=True, progress=progress)


SECOND_REPORT_EVERY = 60.0  # seconds between two progress reports of a fill here


async def fill_second(parts: "Parts", person: Person, seconds: float,
                      progress: Callable[[dict], None] | None = None, clock: Callable[[], float] = time.monotonic) -> dict:
    """The second dense index filled here, for at most ``seconds`` (``leanote-rag index --second``,
    for a machine where no ``serve`` runs: a timer's nightly pass): compared with the first index,
    then its chunks embedded until none is left or the time is up; ``progress`` hears how far it
    is now and then. What it wrote stays: the next fill (or the service) goes on from there.
    Returns the second index's ``progress()``."""
    if not person.admin:
        raise AdminsOnly()
    cfg = parts.settings.second_index
    if cfg.enabled == "off":
        raise UserError("second_index.enabled is off: turn it on (or auto) in the config to fill the second index")
    if parts.scheduled:
        raise UserError("the running service fills the second index between questions: `leanote-rag status` "
                        "shows how far it is")
    second = await asyncio.to_thread(parts.open_second)
    plan = await asyncio.to_thread(second.plan, parts.index.store)
    said = clock()
    until = said + seconds
    if progress is not None:
        progress(second.progress())
    while plan.todo and clock() < until:
        if not await asyncio.to_thread(second.fill, cfg.batch, lambda: clock() >= until):
            break
        if progress is not None and clock() - said >= SECOND_REPORT_EVERY:
            said = clock()
            progress(second.progress())
    return second.progress()


async def request_sync(parts: "Parts", person: Person, wait: float = CHAT_SYNC_WAIT) -> SyncRequest:
    """The schedule's pass now (debounced: one asked for a moment ago is not asked again), and
    what it did once it ends; a pass under way when asked is followed by the one asked for."""
    if not person.admin:
        raise AdminsOnly()
    schedule = parts.schedule
    if schedule.paused():
        return SyncRequest("paused", problems=[p["problem"] for p in schedule.problems()])
    after = schedule.passes + (1 if schedule.in_pass else 0)  # a pass under way: the one after it
    if not schedule.trigger():
        return SyncRequest("just_ran")
    try:
        async with schedule.pass_done:
            await asyncio.wait_for(schedule.pass_done.wait_for(lambda: schedule.passes > after), wait)
    except asyncio.TimeoutError:
        return SyncRequest("running", waited=wait)
    result = schedule.last_pass
    if result is None or result.stopped:
        return SyncRequest("stopping")
    if result.fault is not None:
        return SyncRequest("fault", problems=[str(result.fault)])
    return SyncRequest("done", result.summary.line(), dict(result.failures))
