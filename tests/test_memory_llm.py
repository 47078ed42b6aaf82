"""The memory's LLM tier: one schema-constrained call per note, quotes checked
against the note, jobs with retries and parking on a fake clock, supersession between
notes and its undoing when the newer note goes, stale jobs dropped, answers first, and
each user's facts their own. The LLM is the fake Ollama."""

from __future__ import annotations

import asyncio
import logging
import json
from types import SimpleNamespace

import pytest

from rag.answer.service import AnswerService
from rag.memory.extract import MAX_CALLS, find_quote, sections
from rag.index.note_index import NoteIndex
from rag.llm import OllamaChat
from rag.memory.store import MemoryStore
from rag.model import Note
from sync.derived import Derived
from sync.memory_jobs import MemoryJobs
from bot.usecases.status import memory_counts
from sync.state import INDEXED

from conftest import until, within
from fakes.ollama import FakeOllama

POSTGRES = """# 数据库迁移
我们在 2023 年把项目 Atlas 的数据库从 MySQL 换成了 PostgreSQL。
连接池用 pgbouncer，pool_size 设为 20。"""
POSTGRES_2025 = """# 数据库再迁移
今年项目 Atlas 的数据库又从 PostgreSQL 换成了 SQLite，
因为数据量很小。"""


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def reply(summary: str, relations: list[tuple[str, str, str, str]], entities=(("Atlas", "project"),)) -> str:
    return json.dumps({
        "summary": summary,
        "entities": [{"name": n, "type": t} for n, t in entities],
        "relations": [{"subject": s, "predicate": p, "object": o, "quote": q} for s, p, o, q in relations],
    }, ensure_ascii=False)


ATLAS_PG = reply("项目 Atlas 的数据库从 MySQL 迁到 PostgreSQL", [
    ("Atlas", "uses database", "PostgreSQL", "把项目 Atlas 的数据库从 MySQL 换成了 PostgreSQL"),
    ("Atlas", "uses pooler", "pgbouncer", "连接池用 pgbouncer"),
    ("Atlas", "uses cache", "Redis", "缓存用 Redis"),  # not in the note: dropped
])
ATLAS_SQLITE = reply("Atlas 改用 SQLite", [
    ("Atlas", "USES   database", "SQLite", "又从 PostgreSQL 换成了 SQLite"),  # quote across a line break
])


@pytest.fixture
def fake():
    with FakeOllama() as ollama:
        yield ollama


@pytest.fixture
def world(tmp_path, settings_factory, fake):
    settings = settings_factory(ollama={"host": fake.url, "timeout": 10}, answer={"first_token_budget": 5}, memory={"llm": "on"})
    clock = Clock()
    store = MemoryStore(tmp_path / "memory.sqlite", clock=clock)
    answers = AnswerService(settings, index=None, chat=OllamaChat(settings.ollama))
    jobs = MemoryJobs(settings, lambda: store, answers, clock=clock, poll=0.01, quiet=0.0)
    yield SimpleNamespace(settings=settings, clock=clock, store=store, answers=answers, jobs=jobs, fake=fake)
    answers.close()
    store.close()


def add_note(w, note_id: str, text: str, updated: float, user: str = "u1", content_hash: str | None = None) -> dict:
    """The no-LLM tier's row for the note (as ``remember`` writes it) and its LLM job."""
    content_hash = content_hash or f"h-{note_id}-{len(text)}"
    w.store.replace_note(user, note_id, content_hash, [])
    w.store.enqueue_llm(user, note_id, content_hash, text, title=note_id, updated=updated)
    w.clock.t += 1  # jobs are taken oldest first
    return {"note_id": note_id, "content_hash": content_hash}


def run(coro):
    return asyncio.run(within(coro, "the scenario"))


def jobs_of(store) -> list[tuple]:
    with store._lock:
        return store.db.execute("SELECT note_id, attempts, parked, error, next_try FROM jobs ORDER BY note_id").fetchall()


# --- extraction ------------------------------------------------------------------------------


def test_quotes_are_found_whitespace_aside_and_long_notes_are_capped():
    assert find_quote("换成了  SQLite", "又从 PostgreSQL 换成了\nSQLite，") is not None
    start, end = find_quote("换成了 SQLite", "又从 PostgreSQL 换成了\nSQLite，")
    assert "又从 PostgreSQL 换成了\nSQLite，"[start:end] == "换成了\nSQLite"
    assert find_quote("缓存用 Redis", POSTGRES) is None
    parts, skipped = sections("\n\n".join(["段落" * 1000] * 10), limit=6000)
    assert len(parts) == MAX_CALLS and skipped > 0 and all(len(p) <= 6000 for p in parts)
    assert sections(POSTGRES) == ([POSTGRES], 0)


def test_a_schema_valid_reply_is_stored_with_quotes_and_a_bad_quote_is_dropped(world):
    w = world
    add_note(w, "n1", POSTGRES, updated=100.0)
    w.fake.reply_structured(ATLAS_PG)
    assert run(w.jobs.step()) is True
    calls = w.fake.structured_chats()
    assert len(calls) == 1 and calls[0]["format"]["required"] == ["summary", "entities", "relations"]
    assert w.store.summary("n1", "u1") == "项目 Atlas 的数据库从 MySQL 迁到 PostgreSQL"
    facts = w.store.facts("u1")
    assert {(f["predicate"], f["object"]) for f in facts} == {("uses database", "PostgreSQL"), ("uses pooler", "pgbouncer")}
    for f in facts:
        assert f["origin"] == "llm" and f["status"] == "active" and f["note_id"] == "n1" and f["time"] == 100.0
        assert POSTGRES[f["char_start"]:f["char_end"]] == f["quote"]
    stats = w.jobs.last
    assert stats["calls"] == 1 and stats["dropped"] == 1 and stats["relations"] == 2
    assert stats["prompt_tokens"] > 0 and stats["output_tokens"] > 0
    assert jobs_of(w.store) == []
    counts = w.store.llm_counts()
    assert counts["jobs_pending"] == 0 and counts["facts"] == 2
    assert w.store.counts()["notes"] == {"llm": 1}


def test_invalid_json_is_retried_on_schedule_then_parked_with_its_error(world):
    w = world
    add_note(w, "n1", POSTGRES, updated=100.0)
    for _ in range(5):
        w.fake.reply_structured('{"summary": "cut off')
    schedule = []
    for attempt in range(1, 6):
        assert run(w.jobs.step()) is True
        note_id, attempts, parked, error, next_try = jobs_of(w.store)[0]
        assert attempts == attempt and "not JSON" in error
        schedule.append(None if parked else next_try - w.clock.t)
        if not parked and next_try > w.clock.t:
            assert run(w.jobs.step()) is False  # not due before its time
            w.clock.t = next_try
    assert schedule == [0.0, 120.0, 600.0, 1800.0, None]
    assert run(w.jobs.step()) is False  # parked: never taken again
    assert len(w.fake.structured_chats()) == 5
    counts = w.store.llm_counts()
    assert counts["jobs_parked"] == 1 and counts["jobs_pending"] == 0 and "not JSON" in counts["parked"][0]["error"]
    assert w.store.facts("u1") == []


def test_a_newer_note_supersedes_and_the_older_fact_returns_when_it_goes(world):
    w = world
    add_note(w, "old", POSTGRES, updated=100.0)
    add_note(w, "new", POSTGRES_2025, updated=200.0)
    w.fake.reply_structured(ATLAS_PG)
    w.fake.reply_structured(ATLAS_SQLITE)
    assert run(w.jobs.step()) and run(w.jobs.step())
    db = {f["object"]: f for f in w.store.facts("u1", "Atlas")}
    assert db["SQLite"]["status"] == "active" and db["SQLite"]["predicate"] == "uses database"
    assert db["PostgreSQL"]["status"] == "superseded"
    assert db["PostgreSQL"]["superseded_by"] == db["SQLite"]["id"] and db["PostgreSQL"]["superseded_by_note"] == "new"
    assert db["pgbouncer"]["status"] == "active"  # another predicate: untouched
    # an older note processed after the newer one does not win either
    add_note(w, "older", POSTGRES.replace("2023", "2021"), updated=50.0)
    w.fake.reply_structured(ATLAS_PG)
    assert run(w.jobs.step())
    statuses = {(f["note_id"], f["object"]): f["status"] for f in w.store.facts("u1", "Atlas", )}
    assert statuses[("older", "PostgreSQL")] == "superseded" and statuses[("new", "SQLite")] == "active"
    # the newer note goes: its facts with it, and PostgreSQL is the newest statement again
    w.store.remove_note("new")
    assert w.store.settle_facts() == 1
    db = [f for f in w.store.facts("u1", "Atlas") if f["predicate"] == "uses database"]
    assert {(f["note_id"], f["object"], f["status"]) for f in db} == {
        ("old", "PostgreSQL", "active"), ("older", "PostgreSQL", "active")}


def test_what_follows_a_commit_queues_jobs_and_settles_facts_after_a_removal(world, tmp_path):
    w = world
    index = NoteIndex(w.settings, store=None, embedder=type("E", (), {"model_id": "x", "dim": 3})(), index_id="i")
    derived = Derived(w.settings, state=None, store=lambda: None, memory=w.store)
    prepared = index.prepare(Note("n1", "u1", "迁移", POSTGRES))
    rec = SimpleNamespace(status=INDEXED, content_hash=prepared.content_hash)
    derived.follow({"n1": rec}, {"n1": prepared}, {})
    job = w.store.due_job()
    assert job["content_hash"] == prepared.content_hash and "pgbouncer" in job["text"] and job["title"] == "迁移"
    derived.settings = w.settings.model_copy(update={"memory": w.settings.memory.model_copy(update={"llm": "off"})})
    w.store.remove_note("n1")
    derived.follow({"n1": rec}, {"n1": prepared}, {})
    assert w.store.due_job() is None  # memory.llm: off queues nothing


def test_a_job_whose_note_changed_or_went_is_dropped(world):
    w = world
    first = add_note(w, "n1", POSTGRES, updated=100.0)
    stale = w.store.due_job()
    add_note(w, "n1", POSTGRES + "\n补充一句。", updated=150.0)  # edited: a new job replaces the old one
    assert w.store.job_current(stale) is False
    assert w.store.due_job()["content_hash"] != first["content_hash"]
    # the note changes while its extraction runs: what came back is not stored
    job = w.store.due_job()
    w.store.replace_note("u1", "n1", "h-third", [])
    assert w.store.store_llm(job, "s", [], {}) is False and w.store.facts("u1") == []
    # a note that went: its job goes with it, and a job left behind is dropped unseen
    add_note(w, "n2", POSTGRES, updated=100.0)
    w.store.remove_note("n2")
    assert w.store.due_job() is None
    w.store.enqueue_llm("u1", "ghost", "h", "text")
    assert run(w.jobs.step()) is True and w.jobs.dropped == 1 and w.fake.structured_chats() == []


def test_the_worker_gives_way_to_answers(world):
    w = world

    async def scenario():
        add_note(w, "n1", POSTGRES, updated=100.0)
        slots = w.answers.llm_slot
        # an answer holds the LLM: the worker does not start
        async with slots():
            assert await w.jobs.step() is False
        assert w.fake.structured_chats() == []
        # an answer comes while the extraction runs: the extraction is cancelled at once (its reply
        # stalls after three pieces, so nothing else could end it), no attempt counted
        pieces = [ATLAS_PG[i:i + 10] for i in range(0, len(ATLAS_PG), 10)]
        w.fake.reply_structured(*pieces, stall_after=3)
        step = asyncio.create_task(w.jobs.step())
        await until(w.fake.structured_chats, what="the extraction to call the LLM")
        async with slots():
            assert await within(step, "the extraction to give the LLM up to the answer", 10) is False
        assert w.jobs.preempted == 1 and jobs_of(w.store)[0][1] == 0
        # with the quiet period, a just-finished answer still keeps it off (for a second: the two
        # steps below come well within it, on a busy machine too), and after it no longer does
        w.jobs.quiet = 1.0
        async with slots():
            assert await w.jobs.step() is False
            seen = asyncio.get_running_loop().time()  # the step saw the answer by now: quiet until 1 s on
        assert await w.jobs.step() is False
        await asyncio.sleep(seen + 1.0 - asyncio.get_running_loop().time())
        w.fake.reply_structured(ATLAS_PG)
        assert await w.jobs.step() is True and w.jobs.done == 1

    run(scenario())
    assert len(w.fake.structured_chats()) == 2


def test_an_answer_waiting_for_a_slot_counts_and_the_count_falls_back_however_it_ends(tmp_path, settings_factory):
    settings = settings_factory(bots={"max_concurrent_llm": 1})
    answers = AnswerService(settings, index=None)
    jobs = MemoryJobs(settings, lambda: None, answers, poll=0.01, quiet=0.0)

    async def scenario():
        holding, release = asyncio.Event(), asyncio.Event()

        async def hold(until: asyncio.Event):
            async with answers.llm_slot():
                holding.set()
                await until.wait()

        first = asyncio.create_task(hold(release))
        await holding.wait()
        waiting = asyncio.create_task(hold(release))  # the one slot is taken: this answer waits for it
        await until(lambda: answers.answers_waiting_or_writing == 2, what="the second answer to wait for the slot")
        assert jobs._busy()
        release.set()
        await asyncio.gather(first, waiting)
        assert answers.answers_waiting_or_writing == 0 and not jobs._busy()
        with pytest.raises(RuntimeError):  # an LLM call that fails
            async with answers.llm_slot():
                raise RuntimeError("down")
        cancelled = asyncio.create_task(hold(asyncio.Event()))  # an expansion dropped while it runs
        await until(lambda: answers.answers_waiting_or_writing == 1, what="the expansion to hold the slot")
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert answers.answers_waiting_or_writing == 0

    run(scenario())
    answers.close()


def test_an_extraction_waits_while_an_answer_is_written(world, monkeypatch):
    """A real answer, streamed slowly by the fake Ollama: the worker, running meanwhile,
    calls the LLM only once the answer is done."""
    import rag.answer.service as answer_mod
    from rag.model import Hit

    w = world
    hit = Hit("p1", "n9", "u1", "Atlas 数据库", "", "", "", "项目 Atlas 的数据库是 PostgreSQL。", 0, 0, 20, 1.0,
              dense_rank=1, dense_score=0.9)
    monkeypatch.setattr(answer_mod, "search", lambda *a, **kw: [hit])
    add_note(w, "n1", POSTGRES, updated=100.0)
    w.fake.reply(*["Atlas 用 PostgreSQL[1]。"[i:i + 3] for i in range(0, 21, 3)], delay=0.1)
    w.fake.reply_structured(ATLAS_PG)
    w.jobs.idle = 0.02

    async def scenario():
        stopping = asyncio.Event()
        asking = asyncio.create_task(w.answers.ask("Atlas 的数据库是什么？", "u1"))
        while w.answers.answers_waiting_or_writing == 0:
            await asyncio.sleep(0.005)
        worker = asyncio.create_task(w.jobs.run(stopping))
        while not asking.done():  # the answer takes ~0.7 s: no extraction meanwhile
            assert w.fake.structured_chats() == [] and w.jobs.preempted == 0
            await asyncio.sleep(0.01)
        answer = asking.result()
        assert answer.used_llm and answer.grounded
        assert w.answers.answers_waiting_or_writing == 0
        for _ in range(300):  # then the job runs
            if w.jobs.done:
                break
            await asyncio.sleep(0.01)
        stopping.set()
        await worker
        assert w.jobs.done == 1 and len(w.fake.structured_chats()) == 1 and len(w.fake.chats()) == 1

    run(scenario())


def test_facts_are_per_user_and_auto_waits_while_the_llm_fails(world):
    w = world
    add_note(w, "a", POSTGRES, updated=100.0, user="u1")
    add_note(w, "b", POSTGRES_2025, updated=200.0, user="u2")
    w.fake.reply_structured(ATLAS_PG)
    w.fake.reply_structured(ATLAS_SQLITE)
    assert run(w.jobs.step()) and run(w.jobs.step())
    assert {f["object"] for f in w.store.facts("u1")} == {"PostgreSQL", "pgbouncer"}
    assert all(f["status"] == "active" for f in w.store.facts("u1"))  # u2's newer note supersedes nothing of u1's
    assert [f["object"] for f in w.store.facts("u2")] == ["SQLite"]
    assert w.store.summary("b", "u1") is None
    assert w.store.llm_counts("u1")["facts"] == 2 and w.store.llm_counts("u2")["facts"] == 1
    # auto: not while the answers' last LLM call failed (tried again after `probe`)
    auto = w.settings.model_copy(update={"memory": w.settings.memory.model_copy(update={"llm": "auto"})})
    w.jobs.settings = auto
    assert w.jobs.ready()
    w.answers._llm_failing = True
    w.jobs._probed = float("inf") * -1
    assert w.jobs.ready()  # a probe is due
    w.jobs._probed = 1e18
    assert not w.jobs.ready()


def test_status_shows_jobs_and_facts(world, settings_factory):
    w = world
    settings = w.settings
    store = MemoryStore.open_for(settings)
    store.replace_note("u1", "n1", "h", [])
    store.enqueue_llm("u1", "n1", "h", POSTGRES)
    job = store.due_job()
    for _ in range(5):
        job = store.due_job(float("inf")) or job
        store.fail_job(job, "Ollama did not answer in time", (0, 0, 0, 0))
    store.replace_note("u1", "n2", "h2", [])
    store.enqueue_llm("u1", "n2", "h2", POSTGRES)
    counts = memory_counts(settings, store, None)["llm"]
    assert counts["jobs_pending"] == 1 and counts["jobs_parked"] == 1
    assert counts["parked"][0]["error"] == "Ollama did not answer in time"
    assert memory_counts(settings, store, ["u2"])["llm"]["jobs_pending"] == 0
    store.close()


# --- the LLM's typed entities ------------------------------------------------------------------

ATLAS_TYPED = reply("Atlas 换数据库", [], entities=(
    ("Atlas", "project"),
    ("PostgreSQL", "Tools"),  # a plural: tool
    ("pgbouncer", "TOOL"),
    ("mysql", "database"),  # not a type the prompt names: other; found ignoring case
    ("Redis", "tool"),  # not in the note: dropped
    ("SQL", "tool"),  # only inside MySQL/PostgreSQL, never a word of its own: dropped
))


def remember_note(w, note_id: str, text: str, user: str = "u1", updated: float = 100.0):
    """A note as the indexer handles it: the no-LLM tier (``remember``) and its LLM job,
    carrying the cleaned text the chunks are cut from."""
    from rag.memory.entities import text_of

    index = NoteIndex(w.settings, store=None, embedder=type("E", (), {"model_id": "x", "dim": 3})(), index_id="i")
    prepared = index.prepare(Note(note_id, user, note_id, text))
    w.store.remember(prepared, "http://leanote")
    w.store.enqueue_llm(user, note_id, prepared.content_hash, text_of([pc.chunk for pc in prepared.chunks]),
                        title=note_id, updated=updated)
    w.clock.t += 1
    return prepared


def mentions_of_note(store, note_id: str, kinds=None) -> list[tuple]:
    with store._lock:
        rows = store.db.execute(
            "SELECT e.user_id, e.name, e.kind, m.point_id, m.char_start, m.char_end, m.snippet FROM mentions m "
            "JOIN entities e ON e.id = m.entity_id WHERE m.note_id = ? ORDER BY e.kind, e.name, m.char_start",
            (note_id,)).fetchall()
    return [r for r in rows if kinds is None or r[2] in kinds]


def llm_stats(store, note_id: str) -> dict:
    with store._lock:
        return json.loads(store.db.execute("SELECT llm FROM notes WHERE note_id = ?", (note_id,)).fetchone()[0])


def test_names_are_found_whitespace_and_case_aside_and_kinds_are_normalised():
    from rag.memory.entities import llm_kind
    from rag.model import ENTITY_KINDS as KINDS, LLM_KINDS
    from rag.memory.extract import name_spans

    text = "Project  Atlas\nuses PostgreSQL, not MySQL; atlas again. ATLAS"
    found = name_spans(["Project Atlas", "atlas", "SQL", "Redis", "postgresql"], text)
    assert [text[a:b] for a, b in found["Project Atlas"]] == ["Project  Atlas"]
    assert [text[a:b] for a, b in found["atlas"]] == ["atlas"]  # as written first; case aside only if none
    assert found["SQL"] == [] and found["Redis"] == []
    assert [text[a:b] for a, b in found["postgresql"]] == ["PostgreSQL"]
    assert len(name_spans(["a"], " a" * 50)["a"]) == 5
    assert [llm_kind(t) for t in ("Person", "projects", "organisation", "", "database", "tag")] == [
        "person", "project", "organization", "other", "other", "other"]
    assert set(LLM_KINDS) <= set(KINDS) and {"term", "code", "tag", "heading", "link"} <= set(KINDS)


def test_the_cli_kind_choice_takes_the_llm_kinds():
    from bot.cli import memory

    kind = next(p for p in memory.entities.params if p.name == "kind")
    assert {"project", "tool", "person", "organization", "term"} <= set(kind.type.choices)


def test_typed_entities_are_stored_with_kind_spans_and_the_no_llm_tiers_chunk(world):
    w = world
    prepared = remember_note(w, "n1", POSTGRES)
    text = w.store.due_job()["text"]
    no_llm = mentions_of_note(w.store, "n1")
    chunks_before = w.store.chunks_mentioning("u1", ["atlas"])
    assert chunks_before and all(count == 1 for *_, count in chunks_before)
    w.fake.reply_structured(ATLAS_TYPED)
    assert run(w.jobs.step()) is True and w.jobs.done == 1
    stored = mentions_of_note(w.store, "n1", ("person", "project", "tool", "place", "organization", "concept", "other"))
    assert {(name, kind) for _, name, kind, *_ in stored} == {
        ("Atlas", "project"), ("PostgreSQL", "tool"), ("pgbouncer", "tool"), ("mysql", "other")}
    points = {pc.point_id for pc in prepared.chunks}
    placed = [(s, e, p) for _, _, _, p, s, e, _ in no_llm if p is not None and s is not None]
    for user, name, kind, point_id, start, end, snip in stored:
        assert user == "u1" and " ".join(text[start:end].split()).casefold() == name.casefold()
        assert text[start:end] in snip
        holding = [p for s, e, p in placed if s <= start < e]
        assert point_id == (holding[0] if holding else None) and (point_id is None or point_id in points)
    assert any(p is not None for *_, p, _, _, _ in stored)  # e.g. Atlas: the no-LLM tier's term holds it
    assert mentions_of_note(w.store, "n1", ("term", "code", "tag", "heading", "link")) == no_llm  # untouched
    assert w.jobs.last["entities_dropped"] == 2 and llm_stats(w.store, "n1")["entities_dropped"] == 2
    # a place both tiers hold counts once in the answers' entity ranking
    assert w.store.chunks_mentioning("u1", ["atlas"]) == chunks_before
    assert llm_stats(w.store, "n1")["entities"] == 6  # what the LLM named, before the check
    # everything that lists entities sees them
    assert w.store.entities("u1", kind="project") == [{"name": "Atlas", "kind": "project", "notes": 1, "mentions": 1}]
    assert [e["name"] for e in w.store.entities("u1", kind="tool")] == ["pgbouncer", "PostgreSQL"]
    assert "project" in w.store.entity("u1", "atlas")[0]["kinds"]
    assert any("project" in e["kinds"] for e in w.store.named_in("u1", "Atlas 用什么数据库"))
    assert [n["note_id"] for n in w.store.notes_mentioning("u1", ["pgbouncer"])] == ["n1"]
    assert w.store.entities("u2") == []
    # a place no no-LLM mention holds (a number is no term): no chunk, rather than a guess
    job = {"note_id": "n1", "user_id": "u1", "content_hash": prepared.content_hash, "text": text}
    assert w.store.store_llm(job, "s", [], {}, [("Atlas", "project"), ("2023", "concept")])
    points = {name: p for _, name, _, p, *_ in mentions_of_note(w.store, "n1", ("project", "concept"))}
    assert points["2023"] is None and points["Atlas"] is not None


def test_re_extraction_replaces_them_and_removal_removes_them_other_users_untouched(world):
    w = world
    remember_note(w, "n1", POSTGRES)
    remember_note(w, "theirs", POSTGRES, user="u2")
    w.fake.reply_structured(ATLAS_TYPED)
    w.fake.reply_structured(ATLAS_TYPED)
    assert run(w.jobs.step()) and run(w.jobs.step())
    theirs = mentions_of_note(w.store, "theirs")
    assert {r[0] for r in theirs} == {"u2"} and ("u2", "Atlas", "project") in {r[:3] for r in theirs}
    # the note is edited: the no-LLM tier's pass clears its mentions, the new job brings new ones
    remember_note(w, "n1", POSTGRES_2025, updated=200.0)
    assert mentions_of_note(w.store, "n1", ("project", "tool", "other")) == []
    w.fake.reply_structured(reply("Atlas 改用 SQLite", [], entities=(("SQLite", "tool"), ("Atlas", "concept"))))
    assert run(w.jobs.step())
    llm = {(name, kind) for _, name, kind, *_ in mentions_of_note(w.store, "n1", ("project", "tool", "concept", "other"))}
    assert llm == {("SQLite", "tool"), ("Atlas", "concept")}
    assert {e["name"] for e in w.store.entities("u1", kind="tool")} == {"SQLite"}  # orphans dropped
    assert w.store.entities("u1", kind="project") == [] and w.store.entities("u1", kind="other") == []
    # the same text extracted again (a retry, a new model): replaced, the no-LLM mentions kept
    no_llm = mentions_of_note(w.store, "n1", ("term", "code", "tag", "heading", "link"))
    job = {"note_id": "n1", "user_id": "u1", "content_hash": w.store.known("n1"), "text": POSTGRES_2025}
    stats: dict = {}
    assert w.store.store_llm(job, "s", [], stats, [("PostgreSQL", "tool"), ("Oracle", "tool")])
    assert stats["entities_dropped"] == 1
    llm = {(name, kind) for _, name, kind, *_ in mentions_of_note(w.store, "n1", ("project", "tool", "concept", "other"))}
    assert llm == {("PostgreSQL", "tool")}
    assert mentions_of_note(w.store, "n1", ("term", "code", "tag", "heading", "link")) == no_llm
    assert [e["name"] for e in w.store.entities("u1", kind="concept")] == []
    # the note goes: its mentions and the entities only it mentioned go too
    w.store.remove_note("n1")
    assert mentions_of_note(w.store, "n1") == [] and w.store.entities("u1") == []
    with w.store._lock:
        assert w.store.db.execute("SELECT COUNT(*) FROM entities WHERE user_id = 'u1'").fetchone()[0] == 0
    # the other user's rows never moved
    assert mentions_of_note(w.store, "theirs") == theirs
    assert w.store.entities("u2", kind="project") == [{"name": "Atlas", "kind": "project", "notes": 1, "mentions": 1}]



def test_the_log_says_what_a_batch_did_in_one_line_and_a_parked_job_once(world, caplog):
    """Not a line per note per attempt: one line per batch, at most one per report_every
    (5 min), each attempt a debug line, a parked job a warning of its own."""
    import logging

    w = world
    caplog.set_level("DEBUG", logger="sync.memory_jobs")
    for i in range(6):
        add_note(w, f"n{i}", POSTGRES, updated=100.0 + i)
    for _ in range(5):
        w.fake.reply_structured(reply("摘要", []))
    for _ in range(5):  # n5's replies are never JSON: now and at once again, then after 2, 10, 30 min
        w.fake.reply_structured('{"summary": "cut off')

    def take(level):
        """Our log lines of this level (since the last retry())."""
        return [r.getMessage() for r in caplog.records if r.name == "sync.memory_jobs" and r.levelno == level]

    def retry():
        w.clock.t = jobs_of(w.store)[-1][4]  # n5's next try
        caplog.clear()
        assert run(w.jobs.step()) is True
        assert run(w.jobs.step()) is False  # nothing else due: the batch ends

    while run(w.jobs.step()):
        pass
    [line] = take(logging.INFO)
    assert line.startswith("memory: extracted 5 notes in 0 s, 2 failed (last: ") and "not JSON" in line
    assert line.endswith("), 1 waiting")
    assert len(take(logging.DEBUG)) == 7 and take(logging.WARNING) == []  # each attempt: a debug line
    retry()  # 2 min after the last line: no line of its own
    assert take(logging.INFO) == [] and len(take(logging.DEBUG)) == 1
    retry()  # 10 min later: one line for both attempts
    [line] = take(logging.INFO)
    assert line.startswith("memory: extracted 0 notes in 10 min, 2 failed (last: ") and line.endswith(", 1 waiting")
    retry()  # 30 min later the 5th failure parks it: a warning naming it once, and the batch's line
    [warning] = take(logging.WARNING)
    assert warning.startswith("memory: extraction of n5 parked after 5 attempts: ")
    [line] = take(logging.INFO)
    assert line.startswith("memory: extracted 0 notes in 0 s, 1 failed") and line.endswith(
        ", 0 waiting, 1 parked (`leanote-rag status` lists them)")


def test_auto_stays_off_where_the_backlog_would_take_longer_than_its_bound_and_says_so(world, caplog):
    """The speed measured here (a slow CPU) and 40 queued notes: over a bound of one hour
    the auto tier takes no job and logs the estimate once; with a day it runs; status shows it."""
    from rag.speed import Speed

    w = world
    for i in range(40):
        add_note(w, f"n{i}", POSTGRES * 20, updated=100.0 + i)  # ~2,000 characters each
    w.answers.speeds._speeds[w.settings.ollama.model] = Speed(read_tps=20.0, write_tps=5.0, samples=3)
    tight = w.settings.model_copy(update={"memory": w.settings.memory.model_copy(
        update={"llm": "auto", "llm_auto_max": 3600.0})})
    w.jobs.settings = tight
    with caplog.at_level(logging.INFO, logger="sync.memory_jobs"):
        assert run(w.jobs.step()) is False and run(w.jobs.step()) is False
    assert jobs_of(w.store)[0][1] == 0 and w.fake.structured_chats() == []  # nothing taken
    said = [r.getMessage() for r in caplog.records if "would take" in r.getMessage()]
    assert len(said) == 1 and "40 queued notes" in said[0] and "reads ~20 tok/s" in said[0]
    estimate = w.jobs.outlook
    assert estimate["too_long"] and estimate["seconds"] > 3600 and estimate["jobs"] == 40
    assert "memory.llm: on runs it anyway" in estimate["text"]
    # a bound it fits: the tier runs
    roomy = tight.model_copy(update={"memory": tight.memory.model_copy(update={"llm_auto_max": 30 * 86400.0})})
    w.jobs.settings = roomy
    w.jobs._outlook_at = float("-inf")
    w.fake.reply_structured(ATLAS_PG)
    assert run(w.jobs.step()) is True


def test_a_backlog_too_long_at_a_speed_measured_under_load_is_measured_again_once_the_box_is_idle(world, caplog):
    """The speed probed while the box was busy made the backlog look days long, and auto never ran
    it, not even through a quiet night. Once no question has come for RESUME_IDLE, the worker
    measures the speed again (one short reply) and estimates anew: the box is fast now, it runs.
    Measured once per quiet stretch, not at every step."""
    from rag.speed import Speed
    from sync.memory_jobs import RESUME_IDLE

    w = world
    for i in range(40):
        add_note(w, f"n{i}", POSTGRES * 20, updated=100.0 + i)
    model = w.settings.ollama.model
    w.answers.speeds._speeds[model] = Speed(read_tps=20.0, write_tps=5.0, probe_tps=20.0, samples=3)  # under load
    w.jobs.settings = w.settings.model_copy(update={"memory": w.settings.memory.model_copy(
        update={"llm": "auto", "llm_auto_max": 3600.0})})
    assert run(w.jobs.step()) is False and w.jobs.outlook["too_long"]
    w.clock.t += RESUME_IDLE - 60  # quiet, but not yet for long: no new measurement
    assert run(w.jobs.step()) is False and w.fake.probes() == []
    w.clock.t += 60
    w.fake.reply_structured(ATLAS_PG)
    with caplog.at_level(logging.INFO, logger="sync.memory_jobs"):
        assert run(w.jobs.step()) is True  # measured again (fast), estimated again, and run
    assert len(w.fake.probes()) == 1 and w.answers.speeds.get(model).read_tps > 20.0
    assert not w.jobs.outlook["too_long"] and w.jobs.done == 1
    assert any("resumes" in r.getMessage() for r in caplog.records)


def test_auto_stops_for_the_run_when_every_extraction_gives_way_to_a_question(tmp_path, settings_factory, fake):
    """On 2 cores each question cancelled the running extraction, which then began again from the
    start: 5 cancels in 4 minutes, none done, the CPU busy between questions. memory.llm: auto now
    stops after GIVE_UP_AFTER such cancels with nothing finished; on runs it anyway."""
    from sync.memory_jobs import GIVE_UP_AFTER

    settings = settings_factory(ollama={"host": fake.url, "timeout": 10}, answer={"first_token_budget": 5},
                                memory={"llm": "auto"})
    clock = Clock()
    store = MemoryStore(tmp_path / "memory.sqlite", clock=clock)
    answers = AnswerService(settings, index=None, chat=OllamaChat(settings.ollama))
    jobs = MemoryJobs(settings, lambda: store, answers, clock=clock, poll=0.01, quiet=0.0)
    w = SimpleNamespace(settings=settings, clock=clock, store=store, answers=answers, jobs=jobs, fake=fake)
    pieces = [ATLAS_PG[i:i + 10] for i in range(0, len(ATLAS_PG), 10)]

    async def scenario():
        add_note(w, "n1", POSTGRES, updated=100.0)
        for n in range(GIVE_UP_AFTER):
            w.fake.reply_structured(*pieces, stall_after=3)
            step = asyncio.create_task(jobs.step())
            await until(lambda: len(w.fake.structured_chats()) > n, what="the extraction to call the LLM")
            async with answers.llm_slot():  # a question
                assert await within(step, "the extraction to give way", 10) is False
        assert jobs.preempted == GIVE_UP_AFTER and jobs.done == 0
        asked = len(w.fake.structured_chats())
        assert await jobs.step() is False and jobs.gave_up  # no fourth start
        assert len(w.fake.structured_chats()) == asked
        jobs.settings = settings.model_copy(update={"memory": settings.memory.model_copy(update={"llm": "on"})})
        w.fake.reply_structured(ATLAS_PG)
        assert await jobs.step() is True and jobs.done == 1  # memory.llm: on runs it anyway

    try:
        run(scenario())
    finally:
        answers.close()
        store.close()


def test_a_tier_stopped_by_questions_resumes_once_the_box_is_idle_and_stops_again_if_they_come_back(
        tmp_path, settings_factory, fake, caplog):
    """Stopped after GIVE_UP_AFTER extractions gave way, the tier used to stay off until a restart,
    also through a whole quiet night. Now it waits for RESUME_IDLE without a question (on the
    worker's clock): a question in between starts the wait again; then it runs, and status says
    why it waits and when it runs again. Questions coming back as often stop it again."""
    from sync.memory_jobs import GIVE_UP_AFTER, RESUME_IDLE

    settings = settings_factory(ollama={"host": fake.url, "timeout": 10}, answer={"first_token_budget": 5},
                                memory={"llm": "auto"})
    clock = Clock()
    store = MemoryStore(tmp_path / "memory.sqlite", clock=clock)
    answers = AnswerService(settings, index=None, chat=OllamaChat(settings.ollama))
    jobs = MemoryJobs(settings, lambda: store, answers, clock=clock, poll=0.01, quiet=0.0)
    w = SimpleNamespace(settings=settings, clock=clock, store=store, answers=answers, jobs=jobs, fake=fake)
    pieces = [ATLAS_PG[i:i + 10] for i in range(0, len(ATLAS_PG), 10)]

    async def give_way(times: int) -> None:
        for _ in range(times):
            before = len(w.fake.structured_chats())
            w.fake.reply_structured(*pieces, stall_after=3)
            step = asyncio.create_task(jobs.step())
            await until(lambda: len(w.fake.structured_chats()) > before, what="the extraction to call the LLM")
            async with answers.llm_slot():  # a question
                assert await within(step, "the extraction to give way", 10) is False

    async def scenario():
        add_note(w, "n1", POSTGRES, updated=100.0)
        add_note(w, "n2", POSTGRES_2025, updated=101.0)
        await give_way(GIVE_UP_AFTER)
        asked = len(w.fake.structured_chats())
        assert await jobs.step() is False and jobs.gave_up
        text = jobs.state()["text"]
        assert "resume" in text and f"{RESUME_IDLE // 60:.0f} min" in text, text
        # the evening goes on: a question now and then; each starts the quiet wait again
        clock.t += RESUME_IDLE - 60
        async with answers.llm_slot():
            assert await jobs.step() is False
        clock.t += RESUME_IDLE - 60
        assert await jobs.step() is False and jobs.gave_up
        assert len(w.fake.structured_chats()) == asked  # nothing started meanwhile
        # the night: no question for RESUME_IDLE; the tier runs again
        clock.t += 61
        w.fake.reply_structured(ATLAS_PG)
        with caplog.at_level(logging.INFO, logger="sync.memory_jobs"):
            assert await jobs.step() is True
        assert jobs.done == 1 and not jobs.gave_up and jobs.state()["text"] == ""
        assert any("resume: no question for 30 min" in r.getMessage() for r in caplog.records)
        # the morning: questions cut it off again as often, and it stops again
        await give_way(GIVE_UP_AFTER)
        assert await jobs.step() is False and jobs.gave_up

    try:
        run(scenario())
    finally:
        answers.close()
        store.close()


def test_a_long_note_cut_off_by_a_question_goes_on_from_the_sections_read_and_status_counts_the_hour(world):
    """A note of three sections: the first is read, a question cuts the second off. The next try
    asks only the second and third (not the first again), the note is done, and the status shows
    it among the jobs done in the last hour, then only in the last day."""
    from bot.chat.texts import status_text
    from bot.usecases.people import Person

    w = world
    long_note = "\n\n".join([POSTGRES] + ["段落内容" * 1480] * 2)  # 3 sections of at most 6,000 characters
    assert len(sections(long_note)[0]) == 3

    async def scenario():
        add_note(w, "n1", long_note, updated=100.0)
        w.fake.reply_structured(ATLAS_PG)  # section 1
        pieces = [ATLAS_PG[i:i + 10] for i in range(0, len(ATLAS_PG), 10)]
        w.fake.reply_structured(*pieces, stall_after=3)  # section 2: a question comes while it runs
        step = asyncio.create_task(w.jobs.step())
        await until(lambda: len(w.fake.structured_chats()) == 2, what="the second section's call")
        async with w.answers.llm_slot():
            assert await within(step, "the extraction to give way", 10) is False
        assert w.jobs.preempted == 1 and w.jobs.sections_done == 1 and w.jobs.done == 0
        w.fake.reply_structured(reply("第二段", []))
        w.fake.reply_structured(reply("第三段", []))
        assert await w.jobs.step() is True and w.jobs.done == 1

    run(scenario())
    asked = [c["messages"][-1]["content"] for c in w.fake.structured_chats()]
    assert ["part 1 of 3" in a for a in asked] == [True, False, False, False]
    assert ["part 2 of 3" in a for a in asked] == [False, True, True, False]  # cut off, asked again
    assert "part 3 of 3" in asked[3]
    assert w.store.summary("n1", "u1") and {f["object"] for f in w.store.facts("u1")} == {"PostgreSQL", "pgbouncer"}
    counts = memory_counts(w.settings, w.store, None)["llm"]
    assert (counts["done_last_hour"], counts["done_last_day"], counts["jobs_pending"]) == (1, 1, 0)
    assert counts["last_done"] is not None
    w.clock.t += 2 * 3600
    counts = memory_counts(w.settings, w.store, None)["llm"]
    assert (counts["done_last_hour"], counts["done_last_day"]) == (0, 1)
    assert memory_counts(w.settings, w.store, ["u2"])["llm"]["done_last_day"] == 0  # another user's count: none
    report = {"accounts": [], "users": [], "skipped": [], "memory": {"llm": {**counts, "worker": w.jobs.state()}}}
    assert "summaries and facts by the LLM: 0 notes in the last hour, 0 waiting" in status_text(
        report, Person(user_id="u1", admin=True, key="k"))
