"""Access removed is access gone, and a person is who they are now: what the daemon sends a
person unasked (a digest on its schedule, a gap a note answers now, the late receipt of a
capture) checks them against the config in force, through a reload (``Parts.apply``, what
SIGHUP calls) and a restart (new parts over the same state). A person removed from ``users:``
gets nothing; a person remapped to another Leanote user gets nothing of the old one's.
Real SQLite stores in a temp state directory, a clock the test moves; the bots' ``tell`` and
``announce`` recorded as the platforms' bots register them; and a real daemon's reload
(``Daemon.reload``, what SIGHUP runs) taking a removed person's digest job."""

from __future__ import annotations

import asyncio
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from rag.digest_plan import Plan

from bot.digests import DigestJobs
from bot.root import Parts
from bot.usecases import capture as capture_case, digest as digest_case, gaps
from bot.usecases.people import Person

from conftest import make_settings

WEEK = 7 * 86400
ONE, TWO, THREE = "telegram:1", "telegram:2", "telegram:3"


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Jobs:
    """What the digests ask of the sync's schedule (``add_cron``...), recorded."""

    def __init__(self):
        self.jobs = {}

    def add_cron(self, job_id, work, args, day, at, tz, grace):
        self.jobs[job_id] = (day, at, str(tz), grace)

    def remove_cron(self, job_id):
        self.jobs.pop(job_id, None)

    def next_run(self, job_id):
        return self.jobs.get(job_id)


def users(*entries):
    return [{"leanote_user_id": user, "telegram_ids": [int(key.partition(":")[2])], "digest": "weekly mon 09:00"}
            for key, user in entries]


def before_and_after(tmp_path):
    """``users:`` before: 1 and 2 on Leanote user A, 3 on A; after the reload: 1 gone, 2 on B, 3 as it was."""
    before = make_settings(tmp_path, users=users((ONE, "A"), (TWO, "A"), (THREE, "A")))
    after = make_settings(tmp_path, users=users((TWO, "B"), (THREE, "A")))
    return before, after


def test_a_digest_goes_only_to_a_person_in_users_and_only_of_their_leanote_user_now(tmp_path):
    clock = Clock(datetime(2026, 12, 9, 12, 0, tzinfo=ZoneInfo("UTC")).timestamp())  # a Wednesday
    before, after = before_and_after(tmp_path)
    sent: list[tuple[str, str]] = []

    async def tell(person, text):
        sent.append((person, text))

    def to(person):
        return [text for p, text in sent if p == person]

    async def scenario():
        with Parts(before, clock=clock) as parts:
            for person, user, question in ((ONE, "A", "ONE asks A"), (TWO, "A", "TWO asks A"),
                                           (TWO, "B", "TWO asks B"), (THREE, "A", "THREE asks A")):
                parts.gaps.add(person, user, question, question, [1.0, 0.0], "refused")
            gaps.announce_with(parts, "telegram", tell)
            scheduler = Jobs()
            jobs = DigestJobs(parts, scheduler, clock)
            await jobs.start()  # the config's plans, kept from now on
            assert set(scheduler.jobs) == {f"digest:{p}" for p in (ONE, TWO, THREE)}
            clock.now += WEEK
            for person in (ONE, TWO, THREE):
                await jobs.run(person)  # as the schedule runs each on Monday
            assert len(to(ONE)) == 1 and "ONE asks A" in to(ONE)[0]
            assert "TWO asks A" in to(TWO)[0] and "TWO asks B" not in to(TWO)[0]

            # the reload: ONE removed from users:, TWO mapped to Leanote user B now
            parts.apply(after)
            await jobs.follow()
            sent.clear()
            clock.now += WEEK
            for person in (ONE, TWO, THREE):  # a job still scheduled runs all the same
                await jobs.run(person)
            assert to(ONE) == []
            assert len(to(TWO)) == 1 and "TWO asks B" in to(TWO)[0] and "TWO asks A" not in to(TWO)[0]
            assert len(to(THREE)) == 1 and "THREE asks A" in to(THREE)[0]
            assert set(scheduler.jobs) == {f"digest:{p}" for p in (TWO, THREE)}  # ONE's job is gone
            # /digest as a preview (the API's GET /digest, the CLI's --dry-run) is of the person's user now
            assert [g.question for g in digest_case.compose(parts, Person(TWO, "B")).gaps] == ["TWO asks B"]

        # a restart after downtime: each missed digest is caught up, but not ONE's, and TWO's of B only
        sent.clear()
        clock.now += 3 * WEEK
        with Parts(after, clock=clock) as parts:
            gaps.announce_with(parts, "telegram", tell)
            scheduler = Jobs()
            jobs = DigestJobs(parts, scheduler, clock)
            await jobs.start()
            assert to(ONE) == []
            assert len(to(TWO)) == 1 and "TWO asks B" in to(TWO)[0] and "TWO asks A" not in to(TWO)[0]
            assert len(to(THREE)) == 1
            assert set(scheduler.jobs) == {f"digest:{p}" for p in (TWO, THREE)}
            assert all(not hasattr(plan, "user_id") for plan in parts.gaps.plans())  # whose: the person's now

    asyncio.run(scenario())


def test_a_closed_gap_is_told_only_to_a_person_who_still_sees_its_leanote_user(tmp_path):
    clock = Clock(datetime(2026, 12, 9, 12, 0, tzinfo=ZoneInfo("UTC")).timestamp())
    before, after = before_and_after(tmp_path)
    told: list[tuple[str, str]] = []

    async def tell(person, text):
        told.append((person, text))

    async def scenario():
        with Parts(before, clock=clock) as parts:
            ids = {}
            for person in (ONE, TWO, THREE):
                ids[person], _ = parts.gaps.add(person, "A", f"{person} asks A", "q", [1.0, 0.0], "refused")
                parts.gaps.close_gap(ids[person], "n1", "The note of A", "http://leanote/note/n1")
            parts.apply(after)  # the reload comes before the bots hear of the closing
            gaps.announce_with(parts, "telegram", tell)
            await gaps.check(parts)
            assert [p for p, _ in told] == [THREE]  # ONE is gone, TWO sees B's notes now
        with Parts(after, clock=clock) as parts:  # and after a restart
            gaps.announce_with(parts, "telegram", tell)
            await gaps.check(parts)
            assert [p for p, _ in told] == [THREE]

    asyncio.run(scenario())


def test_the_late_receipt_of_a_capture_goes_only_to_its_maker_as_they_are_now(tmp_path):
    before, after = before_and_after(tmp_path)
    heard: list[tuple[str, str]] = []

    async def announce(person, once, text):
        heard.append((person, text))

    async def scenario():
        with Parts(before, scheduled=True) as parts:
            outbox = parts.outbox
            for person in (ONE, TWO, THREE):  # written while their receipt was cut off (a kill -9)
                item = outbox.add(person, "A", "note", {"title": f"{person}'s note", "content": "x", "tags": []},
                                  [], 0.0)
                outbox.done(item, f"note-{person}", 1.0)
            parts.apply(after)
            capture_case.announce_with(parts, "telegram", announce)
            await asyncio.gather(*list(parts.capture()._telling))  # the receipts go in tasks of their own
            assert [p for p, _ in heard] == [THREE]

    asyncio.run(scenario())


def test_plans_kept_with_a_leanote_user_keep_their_schedule_and_lose_the_user(tmp_path):
    """A gaps store from before: its plans keep when and since when, and no Leanote user."""
    import sqlite3

    from rag.answer.gaps import MIGRATIONS, GapStore

    path = tmp_path / "gaps.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0].split(";"):
        db.execute(statement)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO plans VALUES ('telegram:1', 'A', 'weekly', 'mon', '09:00', 'Asia/Shanghai', 1234.5)")
    db.close()
    store = GapStore(path)
    try:
        assert store.plans() == [Plan("telegram:1", "weekly", "mon", "09:00", "Asia/Shanghai", 1234.5)]
    finally:
        store.close()


@pytest.mark.slow  # a daemon over the sample notes
def test_a_reload_takes_the_digest_job_of_a_person_removed_from_users(tmp_path):
    """What SIGHUP runs (``Daemon.reload``): the config file re-read, the removed person's digest
    job gone, the others' kept."""
    from rag import config as config_mod
    from bot.serve import Daemon

    from conftest import EXAMPLES, until, within

    config = tmp_path / "config.yaml"

    def write(ids: str) -> None:
        config.write_text(f"source: {{kind: files, path: '{EXAMPLES}'}}\nstate_dir: data\nollama: {{enabled: false}}\n"
                          f"rerank: {{kind: none}}\napi: {{socket: '{tmp_path}/api.sock'}}\n"
                          f"sync: {{interval: 1h, watch: false}}\n"
                          f"users: [{{leanote_user_id: local, telegram_ids: [{ids}], digest: 'weekly mon 09:00'}}]\n")

    write("1, 2")

    async def scenario():
        daemon = Daemon(config_mod.load(config), services=[])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the first pass")
            await until(lambda: daemon.digests is not None and daemon.digests.scheduled == {ONE, TWO},
                        what="both digest jobs")
            assert daemon.digests.next_run(TWO) is not None
            write("1")
            daemon.reload()
            await until(lambda: daemon.digests.scheduled == {ONE}, what="the removed person's job to go")
            assert daemon.digests.next_run(TWO) is None and daemon.digests.next_run(ONE) is not None
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=60)

    asyncio.run(scenario())
