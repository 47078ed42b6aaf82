"""Knowledge gaps and digests, below the chat doors: the gaps store (real SQLite, the real USE
embedder), asks from the real answer service over the sample notes, a gap closed by a note the
real sync indexes, the CLI (``gaps``, ``digest --dry-run``), the digest's content and plan, and
the digest schedule's catch-up under a clock the test moves."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from rag.answer.gaps import GapDone, GapStore, UnknownGap
from rag.digest import compute, created_of
from rag.digest_plan import Plan, parse_plan
from rag.errors import ConfigError, UserError

from bot.cli import main
from bot.chat.digest import digest_text
from bot.plain import messages
from bot.digests import DigestJobs, last_planned
from sync.schedule import cron
from bot.root import Parts
from bot.usecases import asking, digest as digest_case, gaps
from bot.usecases.people import Person

from conftest import EXAMPLES, THREADS, make_settings

ROOT = Path(__file__).resolve().parents[1]
NGINX = ("# Nginx rate limiting\n\nTo configure rate limiting in nginx, define a zone with limit_req_zone "
         "$binary_remote_addr zone=one:10m rate=5r/s; and use limit_req zone=one burst=10 in the location.\n")


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path):
    s = GapStore(tmp_path / "gaps.sqlite")
    yield s
    s.close()


def unit(*xs):
    import numpy as np

    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


# --- the store ------------------------------------------------------------------------------------

def test_asks_join_the_closest_open_gap_of_the_same_person_only(store):
    a, new = store.add("telegram:1", "u", "怎么煮溏心蛋", "怎么煮溏心蛋", unit(1, 0, 0), "refused")
    assert new
    b, new = store.add("telegram:1", "u", "how long for a soft-boiled egg", "same", unit(0.9, 0.1, 0), "withdrawn")
    assert (b, new) == (a, False)  # cosine 0.99: the same gap
    c, new = store.add("telegram:1", "u", "nginx 限流", "nginx 限流", unit(0, 1, 0), "refused")
    assert new and c != a  # cosine 0: another
    other, new = store.add("telegram:2", "u", "怎么煮溏心蛋", "怎么煮溏心蛋", unit(1, 0, 0), "refused")
    assert new and other != a  # another person: their own gap, even in a shared group
    elsewhere, new = store.add("telegram:1", "v", "怎么煮溏心蛋", "怎么煮溏心蛋", unit(1, 0, 0), "refused")
    assert new and elsewhere != a  # another Leanote user of the same person: apart
    mine = store.gaps("telegram:1", "u")
    assert [g.id for g in mine] == [a, c]  # asked twice first
    assert mine[0].wordings == ["how long for a soft-boiled egg", "怎么煮溏心蛋"] and mine[0].count == 2
    assert mine[0].why == ["refused", "withdrawn"]
    assert [g.id for g in store.gaps("telegram:2", "u")] == [other]


def test_ranking_weighs_how_often_by_how_recently(tmp_path):
    clock = Clock(1_000_000.0)
    store = GapStore(tmp_path / "g.sqlite", clock=clock)
    old, _ = store.add("p", "u", "old", "old", unit(1, 0, 0), "refused")
    store.add("p", "u", "old again", "old", unit(1, 0, 0), "refused")
    clock.now += 30 * 86400
    new, _ = store.add("p", "u", "new", "new", unit(0, 1, 0), "refused")
    assert [g.id for g in store.gaps("p", "u")] == [new, old]  # 1 now beats 2 a month ago
    store.close()


def test_dismiss_and_write_refuse_another_persons_gap_and_a_replayed_press(store):
    gap_id, _ = store.add("telegram:1", "u", "q", "q", unit(1, 0), "refused")
    with pytest.raises(UnknownGap):
        store.dismiss(gap_id, "telegram:2")  # forged: someone else's id
    with pytest.raises(UnknownGap):
        store.start_draft(gap_id, "telegram:2", "telegram:2")
    with pytest.raises(UnknownGap):
        store.dismiss("made-up", "telegram:1")
    assert store.gaps("telegram:1", "u")[0].state == "open"  # nothing changed
    assert store.dismiss(gap_id, "telegram:1").state == "dismissed"
    with pytest.raises(GapDone, match="dismissed already"):
        store.dismiss(gap_id, "telegram:1")  # the same press again
    with pytest.raises(GapDone):
        store.start_draft(gap_id, "telegram:1", "telegram:1")
    assert store.gaps("telegram:1", "u") == []
    # a dismissed gap is not joined: the same question asked again is a new open gap
    again, new = store.add("telegram:1", "u", "q", "q", unit(1, 0), "refused")
    assert new and again != gap_id


def test_a_thumbs_down_is_one_ask_and_a_thumbs_up_takes_it_back(store):
    gap_id, _ = store.add("p", "u", "q", "q", unit(1, 0), "down", answer_id="A1")
    assert store.add("p", "u", "q", "q", unit(1, 0), "down", answer_id="A1") == (gap_id, False)
    assert store.gaps("p", "u")[0].count == 1
    assert not store.unask("A1", "other")  # only the asker's
    assert store.unask("A1", "p")
    assert store.gaps("p", "u") == []


def test_forget_removes_the_persons_gaps_draft_and_plan_only(store):
    gap_id, _ = store.add("p", "u", "q", "q", unit(1, 0), "refused")
    store.add("p2", "u", "q", "q", unit(1, 0), "refused")
    store.start_draft(gap_id, "p", "telegram:1")
    store.set_plan(Plan("p", "daily", "*", "08:30", "UTC"), "p")
    assert store.forget("p") == 1
    assert store.gaps("p", "u") == [] and store.draft("p") is None and store.plan("p") is None
    assert len(store.gaps("p2", "u")) == 1


def test_past_most_open_the_gaps_asked_least_recently_are_dismissed(tmp_path):
    """A person's open gaps cost every closing check: past ``most_open`` (gaps.max_open), a new gap
    dismisses the ones asked least recently, that person's over that Leanote user only."""
    clock = Clock(1_000_000.0)
    store = GapStore(tmp_path / "g.sqlite", clock=clock)
    made = []
    for i in range(4):
        clock.now += 60
        made.append(store.add("p", "u", f"q{i}", f"q{i}", unit(*[float(k == i) for k in range(6)]), "refused",
                              most_open=3)[0])
    store.add("p2", "u", "other", "other", unit(1, 0, 0, 0, 0, 0), "refused", most_open=3)
    assert {g.id for g in store.gaps("p", "u")} == set(made[1:])  # q0 went when q3 came
    clock.now += 60
    store.add("p", "u", "q1 again", "q1", unit(0, 1, 0, 0, 0, 0), "refused", most_open=3)  # joins q1: none goes
    assert {g.id for g in store.gaps("p", "u")} == set(made[1:])
    store.start_draft(made[2], "p", "telegram:1")
    clock.now += 60
    new, _ = store.add("p", "u", "q5", "q5", unit(0, 0, 0, 0, 0, 1), "refused", most_open=3)
    assert {g.id for g in store.gaps("p", "u")} == {made[1], made[3], new}  # q2 was asked least recently
    assert {g.id for g in store.gaps("p", "u", ("dismissed",))} == {made[0], made[2]}
    assert store.draft("p") is None  # the note begun for the dismissed gap ends with it
    assert len(store.gaps("p2", "u")) == 1  # another person's untouched
    store.close()


def test_a_queued_note_waits_until_every_open_gap_was_checked_against_it(store):
    """The closing check's queue: each note has a turn; a gap checked up to a turn is past the notes of
    that turn; a note leaves the queue once every open gap of its user is past it; a note changed again
    goes to the back (its new text is checked too); a gap made later starts past what is queued."""
    a, _ = store.add("p", "u", "a", "a", unit(1, 0), "refused")
    b, _ = store.add("p", "u", "b", "b", unit(0, 1), "refused")
    assert store.changed({"n1": "u", "n2": "u", "x": "nobody-with-gaps"}) == 2
    queued = store.pending_checks()
    assert set(queued) == {"u"} and set(queued["u"]) == {"n1", "n2"}
    turn = max(queued["u"].values())
    store.checked([a], turn)
    assert store.drop_checked("u") == 0  # b was not checked yet: both notes wait
    store.changed({"n1": "u"})  # n1 changed again: after a's turn
    assert store.pending_checks()["u"]["n1"] > turn
    store.checked([b], turn)
    assert store.drop_checked("u") == 1  # n2 is past every gap; n1's new text not past a's
    assert set(store.pending_checks()["u"]) == {"n1"}
    c, _ = store.add("p", "u", "c", "c", unit(-1, 0), "refused")
    assert store.get(c, "p").checked >= store.pending_checks()["u"]["n1"]  # asked after n1 was indexed
    store.checked([a, b], store.pending_checks()["u"]["n1"])
    assert store.drop_checked("u") == 1 and store.pending_checks() == {}


def test_gaps_survive_a_kill_9_mid_run(tmp_path):
    """A process keeps a gap and is killed (SIGKILL) right after: the next one has it."""
    path = tmp_path / "gaps.sqlite"
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
            "from rag.answer.gaps import GapStore\n"
            f"s = GapStore({str(path)!r})\n"
            "s.add('telegram:1', 'u', '怎么煮溏心蛋', '怎么煮溏心蛋', [1.0, 0.0], 'refused')\n"
            "print('kept', flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "kept"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    store = GapStore(path)
    try:
        assert [g.wordings for g in store.gaps("telegram:1", "u")] == [["怎么煮溏心蛋"]]
    finally:
        store.close()


# --- through the answer service and the sync: asks kept, a gap closed by a new note ----------------

@pytest.fixture
def notes_world(tmp_path):
    notes = tmp_path / "notes"
    shutil.copytree(EXAMPLES, notes)
    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes)}, ollama={"enabled": False},
                             rerank={"kind": "none"}, users=[{"leanote_user_id": "local", "telegram_ids": [1, 2]}])
    return settings, notes


@pytest.mark.slow
def test_refused_questions_become_one_gap_and_a_synced_note_closes_it(notes_world, caplog):
    settings, notes = notes_world
    me, friend = Person("telegram:1", "local"), Person("telegram:2", "local")

    async def scenario():
        with Parts(settings, create=True) as parts:
            await asyncio.to_thread(parts.sync.run_pass, False, True)
            assert await gaps.check(parts) == []  # no gap yet: nothing made, nothing to do
            for q in ("How do I configure nginx rate limiting?", "怎么给 nginx 配置限流"):
                asked = await asking.ask(parts, me, q)
                assert asked.answer.trace.outcome == "refused"
            await asking.ask(parts, friend, "How do I configure nginx rate limiting?")
            answered = await asking.ask(parts, me, "番茄炒蛋怎么做")  # answered from the notes: no gap
            assert answered.answer.trace.outcome == "extractive"
            mine = gaps.listing(parts, me)
            assert len(mine) == 1 and mine[0].count == 2
            assert set(mine[0].wordings) == {"How do I configure nginx rate limiting?", "怎么给 nginx 配置限流"}
            # a note that does not answer it changes nothing
            (notes / "生活" / "溏心蛋.md").write_text("# 溏心蛋\n\n水开后放鸡蛋，煮 6 分钟，捞出过冷水。\n")
            await asyncio.to_thread(parts.sync.run_pass, False, True)
            assert await gaps.check(parts) == [] and gaps.listing(parts, me)[0].state == "open"
            # the note that answers it, added and synced: the gap closes, for both people who asked
            (notes / "运维" / "nginx.md").write_text(NGINX)
            await asyncio.to_thread(parts.sync.run_pass, False, True)
            told = []

            async def tell(person, text):
                told.append((person, text))

            gaps.announce_with(parts, "telegram", tell)
            caplog.clear()
            with caplog.at_level("INFO"):
                closed = await gaps.check(parts)
            assert {g.person for g in closed} == {"telegram:1", "telegram:2"}
            said = [r.getMessage() for r in caplog.records if "closed" in r.getMessage()]
            assert len(said) == 2 and all(g.id in " ".join(said) for g in closed)
            assert not [r for r in caplog.records if "nginx" in r.getMessage().lower()]  # ids, never the question
            assert gaps.listing(parts, me) == []
            done = gaps.listing(parts, me, ("closed",))[0]
            assert done.note_title == "Nginx rate limiting" and done.count == 2
            assert sorted(p for p, _ in told) == ["telegram:1", "telegram:2"]
            line = dict(told)["telegram:1"]
            assert "«Nginx rate limiting» now answers" in line and "(asked 2 times)" in line
            assert await gaps.check(parts) == [] and len(told) == 2  # told once
            assert parts.gaps.pending_checks() == {}
            # the note leaves the index: the closed gap no longer names it
            (notes / "运维" / "nginx.md").unlink()
            await asyncio.to_thread(parts.sync.run_pass, False, True)
            done = gaps.listing(parts, me, ("closed",))[0]
            assert (done.note_title, done.note_url) == (None, None) and done.count == 2

    asyncio.run(scenario())


@pytest.mark.slow
def test_the_closing_check_is_bounded_and_what_it_did_not_reach_is_checked_next(notes_world):
    """Past gaps.check_budget a pass checks no further gap (at least one, so a pass always goes
    forward); the gaps it did not reach keep the note queued and are checked after the next pass,
    until the one the note answers closes. Past gaps.max_open the person's least recently asked gap
    was dismissed."""
    settings, notes = notes_world
    settings = settings.model_copy(update={"gaps": settings.gaps.model_copy(update={"max_open": 4,
                                                                                    "check_budget": 1e-9})})
    me = Person("telegram:1", "local")
    questions = ["怎么给自行车换内胎？", "How do I configure nginx rate limiting?", "Kubernetes ingress 怎么配置 TLS 证书？",
                 "How do I wax a snowboard?", "咖啡豆应该怎么保存才新鲜？"]

    async def scenario():
        with Parts(settings, create=True) as parts:
            await asyncio.to_thread(parts.sync.run_pass, False, True)
            for q in questions:
                assert (await asking.ask(parts, me, q)).answer.trace.outcome == "refused", q
            assert sorted(g.question for g in gaps.listing(parts, me)) == sorted(questions[1:])
            assert [g.question for g in gaps.listing(parts, me, ("dismissed",))] == [questions[0]]
            (notes / "运维" / "nginx.md").write_text(NGINX)
            await asyncio.to_thread(parts.sync.run_pass, False, True)
            passes = []
            while not passes or not passes[-1]:
                assert len(passes) < 4, passes  # each pass checks at least one gap
                passes.append(await gaps.check(parts))
                if not passes[-1]:
                    assert parts.gaps.pending_checks(), passes  # not reached yet: still queued
            assert len(passes) == 4  # the nginx gap, asked first of the four, is checked last
            assert [g.question for g in passes[-1]] == [questions[1]]
            assert parts.gaps.pending_checks() == {}

    asyncio.run(scenario())


ZYX = ("# Zyxqwerty rate limiting\n\nZyxqwerty limits each client to 100 requests a minute. Past that the "
       "gateway answers 429; set rate_limit in zyxqwerty.yaml to change it. Here is how the limits work.\n")


@pytest.mark.slow
def test_one_rare_name_a_note_shares_with_a_question_does_not_close_its_gap(notes_world):
    """A note on Zyxqwerty's rate limiting shares the rare name Zyxqwerty (and "work") with a
    question about Zyxqwerty's failover: it does not answer it, and its gap stays open; the gap
    of a question it does answer closes."""
    from rag.answer.gaps import answering_note

    settings, notes = notes_world
    me, friend = Person("telegram:1", "local"), Person("telegram:2", "local")
    failover = ("Zyxqwerty failover?", "How does Zyxqwerty failover work?")
    limiting = "How does Zyxqwerty rate limiting work?"

    async def scenario():
        with Parts(settings, create=True) as parts:
            await asyncio.to_thread(parts.sync.run_pass, False, True)
            for who, q in ((me, failover[0]), (me, failover[1]), (friend, limiting)):
                assert (await asking.ask(parts, who, q)).answer.trace.outcome == "refused"
            assert [len(g.wordings) for g in gaps.listing(parts, me)] == [2]  # the failover wordings: one gap
            (notes / "English" / "zyxqwerty.md").write_text(ZYX)
            await asyncio.to_thread(parts.sync.run_pass, False, True)
            changed = {n for notes_of in parts.gaps.pending_checks().values() for n in notes_of}
            for q in failover:
                assert answering_note(parts.index, settings, q, "local", changed) is None, q
            assert answering_note(parts.index, settings, "What is Zyxqwerty?", "local", changed) is not None
            closed = await gaps.check(parts)
            assert [(g.person, g.question) for g in closed] == [(friend.key, limiting)]
            assert [g.state for g in gaps.listing(parts, me)] == ["open"]

    asyncio.run(scenario())


# --- the command line -------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_lists_gaps_as_json_and_dismisses_and_digest_dry_run(tmp_path, capsys):
    notes = tmp_path / "notes"
    shutil.copytree(EXAMPLES, notes)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("source:\n  kind: files\n  path: notes\nstate_dir: data\nollama: {enabled: false}\n"
                   f"rerank: {{kind: none}}\nembedder: {{threads: {THREADS}}}\n")
    assert main(["--config", str(cfg), "index"]) == 0
    assert main(["--config", str(cfg), "ask", "How do I configure nginx rate limiting?"]) == 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "gaps", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == 1
    gap = listed[0]
    assert gap["wordings"] == ["How do I configure nginx rate limiting?"] and gap["count"] == 1
    assert gap["state"] == "open" and gap["last"] > 0 and gap["person"] == "cli"
    assert main(["--config", str(cfg), "gaps", "--person", "telegram:9", "--dismiss", gap["id"]]) == 2  # not theirs
    assert "not one of yours" in capsys.readouterr().err
    assert main(["--config", str(cfg), "gaps", "--dismiss", gap["id"]]) == 0
    assert main(["--config", str(cfg), "gaps", "--json", "--state", "dismissed"]) == 0
    assert [g["id"] for g in json.loads(capsys.readouterr().out.split("\n", 1)[1])] == [gap["id"]]
    assert main(["--config", str(cfg), "digest", "--user", "local"]) == 2
    assert "--dry-run" in capsys.readouterr().err
    assert main(["--config", str(cfg), "digest", "--user", "local", "--dry-run", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert set(shown) >= {"changed", "gaps", "this_day", "pairs", "empty", "seconds"}


# --- digests -------------------------------------------------------------------------------------

def test_plans_refuse_an_unknown_day_time_or_time_zone_with_the_fix():
    assert parse_plan("weekly MON 9:00") == ("weekly", "mon", "09:00", "UTC")
    assert parse_plan("daily 08:30 Asia/Shanghai") == ("daily", "*", "08:30", "Asia/Shanghai")
    assert parse_plan("off") is None
    for bad, said in (("weekly someday 09:00", "unknown day"), ("daily 24:00", "unknown time"),
                      ("daily 8h30", "unknown time"), ("daily 08:30 Mars/Olympus", "unknown time zone"),
                      ("hourly 08:00", "not daily, weekly or off"), ("weekly 09:00", "unknown day"), ("", "usage")):
        with pytest.raises(UserError, match=said):
            parse_plan(bad)
    with pytest.raises(ConfigError, match="unknown time zone"):
        make_settings(Path("/tmp"), users=[{"leanote_user_id": "u", "telegram_ids": [1], "digest": "daily 08:00",
                                            "timezone": "Nowhere/Land"}])


def test_the_schedule_runs_in_the_persons_time_zone_and_catches_up_once():
    plan = Plan("telegram:1", "weekly", "mon", "09:00", "Asia/Shanghai")
    shanghai = ZoneInfo("Asia/Shanghai")
    # Wednesday 2026-12-09 12:00 in Shanghai: the last planned time was Monday 09:00 there
    now = datetime(2026, 12, 9, 12, 0, tzinfo=shanghai).timestamp()
    assert last_planned(plan, now) == datetime(2026, 12, 7, 9, 0, tzinfo=shanghai).timestamp()
    nxt = cron("mon", "09:00", shanghai).get_next_fire_time(None, datetime(2026, 12, 9, 12, 0, tzinfo=shanghai))
    assert nxt == datetime(2026, 12, 14, 9, 0, tzinfo=shanghai)
    daily = Plan("p", "daily", "*", "08:30", "Europe/Berlin")
    berlin = ZoneInfo("Europe/Berlin")
    at = datetime(2026, 3, 29, 8, 0, tzinfo=berlin).timestamp()  # the morning clocks go forward
    assert last_planned(daily, at) == datetime(2026, 3, 28, 8, 30, tzinfo=berlin).timestamp()


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


def test_missed_digests_after_downtime_are_sent_once(tmp_path):
    """Down for three weekly runs: one digest at start, not three; one not missed is not sent."""
    clock = Clock(datetime(2026, 12, 9, 12, 0, tzinfo=ZoneInfo("UTC")).timestamp())
    settings = make_settings(tmp_path, users=[{"leanote_user_id": "local", "telegram_ids": [1, 2, 3]}])
    with Parts(settings, clock=clock) as parts:
        sent = []

        async def tell(person, text):
            sent.append((person, text))

        parts.gaps.add("telegram:1", "local", "怎么煮溏心蛋", "怎么煮溏心蛋", [1.0, 0.0], "refused")
        three_weeks = clock.now - 22 * 86400
        parts.gaps.set_plan(Plan("telegram:1", "weekly", "mon", "09:00", "UTC", three_weeks), "telegram:1")
        parts.gaps.set_plan(Plan("telegram:2", "weekly", "mon", "09:00", "UTC", clock.now - 3600), "telegram:2")
        parts.gaps.set_plan(Plan("telegram:3", "off", "*", "00:00", "UTC", three_weeks), "telegram:3")
        scheduler = Jobs()
        jobs = DigestJobs(parts, scheduler, clock)

        async def start():
            gaps.announce_with(parts, "telegram", tell)
            await jobs.start()

        asyncio.run(start())
        assert [p for p, _ in sent] == ["telegram:1"]
        assert "怎么煮溏心蛋" in sent[0][1]
        assert set(scheduler.jobs) == {"digest:telegram:1", "digest:telegram:2"}
        assert scheduler.jobs["digest:telegram:1"] == ("mon", "09:00", "UTC", 6 * 3600)
        assert parts.gaps.plan("telegram:1").last_sent == clock.now
        asyncio.run(jobs.catch_up(jobs.plans()))  # a second start: nothing missed now
        assert len(sent) == 1
        # /digest off: the job goes
        digest_case.set_plan(parts, Person("telegram:1", "local"), "off")
        jobs.replan("telegram:1")
        assert "digest:telegram:1" not in scheduler.jobs


class FakeMemory:
    """A memory's reads the digest needs (the real one is exercised in the bench and the doors)."""

    def __init__(self, notes, pairs, links):
        self.notes, self.pairs, self.links = notes, pairs, links

    def shown_notes(self, user_id):
        return self.notes

    def best_pairs(self, user_id, limit, min_score=0.0):
        return self.pairs

    def link_words(self, user_id):
        return self.links

    def first_index(self, user_id):
        return None  # no pass ended yet: a Leanote note's own times count


def test_a_digest_holds_changes_by_kind_this_day_unlinked_pairs_and_nothing_when_empty(tmp_path):
    tz = ZoneInfo("Asia/Shanghai")
    now = datetime(2025, 8, 5, 9, 0, tzinfo=tz).timestamp()
    since = now - 7 * 86400
    made_now = f"{int(now - 86400):08x}" + "0" * 16  # made yesterday: added
    made_2023 = f"{int(datetime(2023, 8, 5, 10, 0, tzinfo=tz).timestamp()):08x}" + "1" * 16
    made_2024 = f"{int(datetime(2024, 1, 2, 10, 0, tzinfo=tz).timestamp()):08x}" + "2" * 16
    assert created_of(made_2023) == datetime(2023, 8, 5, 10, 0, tzinfo=tz).timestamp() and created_of("x.md") is None
    notes = [
        {"note_id": made_now, "title": "家里 NAS 备份方案", "notebook": "运维", "url": "u1",
         "updated_at": "2025-08-04T14:57:39.761+08:00"},
        {"note_id": made_2023, "title": "Redis", "notebook": "数据库", "url": "u2", "updated_at": "2025-08-01T10:00:00+08:00"},
        {"note_id": made_2024, "title": "Old", "notebook": "数据库", "url": "u3", "updated_at": "2024-01-02T10:00:00+08:00"},
    ]
    memory = FakeMemory(notes, [(made_now, made_2024, 0.9), (made_2023, made_2024, 0.8)], {made_2023: {"old"}})
    store = GapStore(tmp_path / "g.sqlite")
    store.add("p", "u", "怎么煮溏心蛋", "怎么煮溏心蛋", [1.0, 0.0], "refused")
    d = compute(memory, store, "p", "u", since, now, "Asia/Shanghai")
    assert [(c["title"], c["kind"]) for c in d.changed] == [("家里 NAS 备份方案", "added"), ("Redis", "edited")]
    assert [g.question for g in d.gaps] == ["怎么煮溏心蛋"]
    assert [(e["title"], e["year"]) for e in d.this_day] == [("Redis", 2023)]
    assert [(p["a"]["title"], p["b"]["title"]) for p in d.pairs] == [("家里 NAS 备份方案", "Old")]  # Redis links Old
    text = digest_text(d)
    assert "📁 运维" in text and "🆕 家里 NAS 备份方案 — u1" in text and "✏️ Redis" in text and "2023: Redis" in text
    assert all(len(part) <= 300 for part in messages(text * 20, 300, str))  # (the doors' one splitter)
    assert "".join(messages("a\nb", 300, str)) == "a\nb"
    quiet = compute(FakeMemory([], [], {}), None, "p", "u", since, now, "UTC")
    assert quiet.empty
    store.close()
