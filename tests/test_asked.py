"""Written questions (rag.index.asked): the LLM's questions checked and bad ones dropped and
counted, stored per note at its text and going with it, written by the memory's worker only
between answers and only in their window, a restart going on and a kill repaired, nothing
changed without the LLM, and a question found through a written question cited by its chunk.
The LLM is the fake Ollama; the index is the real one with the real embedder."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from rag.answer.service import AnswerService
from rag.index import asked, asked_scopes, asked_sections
from rag.index.note_index import NoteIndex
from rag.index.points import asked_point_id, asked_user
from rag.index.retrieve import search
from rag.llm import OllamaChat
from rag.memory.schema import ASKED_JOB
from rag.memory.store import MemoryStore
from rag.model import Chunk
from rag.speed import Usage
from sync.memory_jobs import MemoryJobs, in_window, questions_wanted
from bot.usecases.status import memory_counts, questions_line

from conftest import index_samples, until, within
from fakes.ollama import FakeOllama

DIGEST = "Title: 红烧肉\nStart:\n五花肉先焯水，再炒糖色，小火炖一个小时。"
GOOD = json.dumps({"questions": ["红烧肉要先焯水吗？", "糖色怎么炒才不苦？"],
                   "english": ["Do I blanch the pork belly first?", "How long does braised pork simmer?"]},
                  ensure_ascii=False)


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def run(coro):
    return asyncio.run(within(coro, "the scenario"))


# --- the checks ----------------------------------------------------------------------------------


def test_a_good_reply_is_kept_in_both_languages():
    w = asked.check(GOOD, DIGEST, "红烧肉", Usage(prompt_tokens=100, output_tokens=60))
    assert w.ok and w.english == 2 and w.dropped == {}
    assert w.questions[:2] == ["红烧肉要先焯水吗？", "糖色怎么炒才不苦？"]
    assert w.stats()["output_tokens"] == 60


@pytest.mark.parametrize("reply, reason", [
    ("not json at all", "generation: not the schema's object"),
    ('{"questions": "x", "english": []}', "generation: not the schema's object"),
    (json.dumps({"questions": [], "english": []}), "generation: nothing usable"),
    # the prompt echoed back: the instructions, the title, the digest's labels
    (json.dumps({"questions": ["红烧肉"], "english": ["Title: 红烧肉?"]}, ensure_ascii=False),
     "generation: nothing usable"),
    # the prompt's example copied into a note it has nothing to do with
    (json.dumps({"questions": ["炒蛋怎么才嫩？", "红烧肉的鸡蛋要先炒吗？"], "english": ["How do I keep scrambled eggs soft?"]},
                ensure_ascii=False), "generation: nothing usable"),
    # the other language only: English in the Chinese note's own questions, Chinese in the English ones
    (json.dumps({"questions": ["How long do I fry it?"], "english": ["炒多久？"]}, ensure_ascii=False),
     "generation: nothing usable"),
])
def test_a_bad_generation_is_dropped_and_counted(reply, reason):
    w = asked.check(reply, DIGEST, "红烧肉", Usage(output_tokens=50))
    assert not w.ok and w.questions == [] and w.dropped.get(reason) == 1


def test_rambling_to_the_output_cap_is_dropped_whole_and_bad_questions_one_by_one():
    w = asked.check(GOOD, DIGEST, "红烧肉", Usage(output_tokens=asked.OUTPUT_TOKENS))
    assert not w.ok and w.dropped == {"generation: ran to the output cap": 1}
    mixed = json.dumps({"questions": ["红烧肉要先焯水吗？", "红烧肉要先焯水吗?", "五花肉先焯水。", "炒" * 200 + "？",
                                      "How long?"],
                        "english": ["Do I blanch it first?", "怎么炒糖色？"]}, ensure_ascii=False)
    w = asked.check(mixed, DIGEST, "红烧肉", Usage(output_tokens=80))
    assert w.questions == ["红烧肉要先焯水吗？", "Do I blanch it first?"] and w.english == 1
    assert w.dropped == {"repeated": 1, "not a question": 1, "too long": 1, "language": 2}


def test_a_question_that_only_restates_a_heading_is_dropped_and_one_that_adds_to_it_stays():
    digest = ("Title: 全双工通信的 WebSocket\nOutline:\n- WebSocket 握手\n- 数据帧\nStart:\n"
              "WebSocket 是浏览器和服务器之间的全双工长连接协议。握手时客户端发 Upgrade 头。")
    reply = json.dumps({"questions": ["WebSocket 握手是什么？", "数据帧的作用是什么？", "数据帧的结构是什么？",
                                      "握手时客户端要发哪些头？"],
                        "english": ["What is WebSocket?", "What is the WebSocket handshake?"]}, ensure_ascii=False)
    w = asked.check(reply, digest, "全双工通信的 WebSocket", Usage(output_tokens=80))
    assert w.questions == ["数据帧的结构是什么？", "握手时客户端要发哪些头？", "What is the WebSocket handshake?"]
    assert w.dropped == {"restates a heading": 3}
    # a section's question is read against its own heading (with the title), not another section's
    digest = "Title: Dockerfile 最佳实践\nSections:\n[1] 指令 > COPY(复制文件)\nCOPY 复制文件。\n[2] 指令 > ADD\nADD 还能解压。"
    w = asked_sections.check(sections_reply((1, ["COPY(复制文件) 的用法是什么？", "ADD 和 COPY 怎么选？"], ["What is COPY?"]),
                                            (2, ["ADD 是什么？"], ["When does ADD unpack an archive?"])),
                             digest, "Dockerfile 最佳实践", [[0], [1]], Usage(output_tokens=80))
    assert w.questions == ["ADD 和 COPY 怎么选？", "When does ADD unpack an archive?"] and w.ties == [[0], [1]]
    assert w.dropped == {"restates a heading": 3}


def test_the_digest_is_bounded_and_holds_title_outline_and_first_lines():
    chunks = [Chunk(i, "正文" * 400, ("番茄炒蛋", f"第{i}步"), 0, 800) for i in range(30)]
    d = asked.digest("番茄炒蛋", chunks)
    assert d.startswith("Title: 番茄炒蛋\nOutline:\n- 第0步\n") and "Start:\n正文" in d
    assert len(d) <= asked.DIGEST_CHARS


def test_the_window_runs_past_midnight_and_empty_is_always():
    import time
    day = time.mktime((2026, 12, 5, 0, 0, 0, 0, 0, -1))
    at = lambda h, m=0: day + h * 3600 + m * 60  # noqa: E731
    assert in_window("", at(12))
    assert in_window("01:00-06:00", at(1)) and in_window("01:00-06:00", at(5, 59)) and not in_window("01:00-06:00", at(6))
    assert in_window("23:00-02:00", at(23, 30)) and in_window("23:00-02:00", at(1)) and not in_window("23:00-02:00", at(12))


def test_a_window_that_is_not_one_is_a_config_error(settings_factory):
    from rag.errors import UserError
    with pytest.raises((UserError, ValueError), match="not a daily window"):
        settings_factory(memory={"questions_window": "25:00-3"})
    assert settings_factory(memory={"questions_window": "01:00-06:00"}).memory.questions_window == "01:00-06:00"


# --- the worker and the store ----------------------------------------------------------------------


@pytest.fixture
def fake():
    with FakeOllama() as ollama:
        yield ollama


@pytest.fixture
def world(tmp_path, settings_factory, fake):
    settings = settings_factory(ollama={"host": fake.url, "timeout": 10}, answer={"first_token_budget": 5}, memory={"llm": "off", "questions": "on", "questions_scope": "note"})
    clock = Clock()
    store = MemoryStore(tmp_path / "memory.sqlite", clock=clock)
    answers = AnswerService(settings, index=None, chat=OllamaChat(settings.ollama))
    jobs = MemoryJobs(settings, lambda: store, answers, clock=clock, poll=0.01, quiet=0.0)
    yield SimpleNamespace(settings=settings, clock=clock, store=store, answers=answers, jobs=jobs, fake=fake)
    answers.close()
    store.close()


def add_note(w, note_id: str, content_hash: str = "h1", user: str = "u1") -> None:
    """The note's memory row with its questions' job, as ``remember(queue_asked=True)`` writes them."""
    w.store.replace_note(user, note_id, content_hash, [], asked_job=json.dumps({"digest": DIGEST, "title": "红烧肉"}))
    w.clock.t += 1


def asked_jobs(store) -> list[tuple]:
    with store._lock:
        return store.db.execute("SELECT note_id, content_hash FROM jobs WHERE kind = ?", (ASKED_JOB,)).fetchall()


def test_the_worker_writes_a_notes_questions_and_the_status_shows_them(world):
    w = world
    add_note(w, "n1")
    w.fake.reply_structured(GOOD)
    assert run(w.jobs.step()) is True
    assert w.store.asked_of("n1", "u1")[0] == "红烧肉要先焯水吗？" and asked_jobs(w.store) == []
    assert w.jobs.asked["done"] == 1
    (chat,) = w.fake.structured_chats()
    assert chat["format"] == asked.SCHEMA and DIGEST in chat["messages"][-1]["content"]
    counts = memory_counts(w.settings, w.store, None)["questions"]
    assert counts["notes"] == 1 and counts["questions"] == 4 and counts["jobs_pending"] == 0
    assert questions_line(counts).startswith("questions written for search: 1 notes (4 questions)")
    assert run(w.jobs.step()) is False  # nothing more to do: the LLM is not called again
    assert len(w.fake.structured_chats()) == 1


def test_a_bad_generation_is_stored_empty_counted_and_not_asked_again_until_the_text_changes(world):
    w = world
    add_note(w, "n1")
    w.fake.reply_structured('{"questions": ["How long?"], "english": ["炒多久呢？"]}')
    assert run(w.jobs.step()) is True
    assert w.store.asked_of("n1", "u1") == [] and w.jobs.asked["dropped"] == 1 and asked_jobs(w.store) == []
    counts = w.store.asked_counts()
    assert counts["generations_dropped"] == 1 and counts["dropped"]["language"] == 2 and counts["notes"] == 0
    add_note(w, "n1")  # processed again at the same text (a memory version bump): not asked again
    assert asked_jobs(w.store) == []
    add_note(w, "n1", content_hash="h2")  # its text changed: asked again
    assert asked_jobs(w.store) == [("n1", "h2")]


def test_the_questions_go_with_their_note_and_are_rewritten_only_when_its_text_changes(world):
    w = world
    add_note(w, "n1")
    add_note(w, "n2")
    w.fake.reply_structured(GOOD)
    w.fake.reply_structured(GOOD)
    assert run(w.jobs.step()) and run(w.jobs.step())
    add_note(w, "n1")  # same text: kept, nothing queued
    assert w.store.asked_of("n1", "u1") and asked_jobs(w.store) == []
    add_note(w, "n1", content_hash="h2")  # edited: the old questions go, new ones are due
    assert w.store.asked_of("n1", "u1") == [] and asked_jobs(w.store) == [("n1", "h2")]
    w.store.remove_note("n2")  # trashed or deleted
    assert w.store.asked_of("n2", "u1") == [] and "n2" not in w.store.asked_rows()
    w.store.remove_note("n1")
    assert asked_jobs(w.store) == [] and w.store.asked_rows() == {}


def test_a_job_whose_note_changed_while_written_stores_nothing(world):
    w = world
    add_note(w, "n1")
    job = w.store.due_job(w.clock(), (ASKED_JOB,))
    add_note(w, "n1", content_hash="h2")
    assert w.store.store_asked(job, ["老问题？"], {}) is False
    assert w.store.asked_of("n1", "u1") == []


def test_a_restarted_worker_goes_on_with_the_jobs_left(world, settings_factory):
    w = world
    for n in ("n1", "n2", "n3"):
        add_note(w, n)
    w.fake.reply_structured(GOOD)
    assert run(w.jobs.step())
    # the daemon stops; a new one (a new worker on the same file) takes the rest
    again = MemoryStore(w.store.path, clock=w.clock)
    worker = MemoryJobs(w.settings, lambda: again, w.answers, clock=w.clock, poll=0.01, quiet=0.0)
    w.fake.reply_structured(GOOD)
    w.fake.reply_structured(GOOD)
    assert run(worker.step()) and run(worker.step()) and run(worker.step()) is False
    assert set(again.asked_rows()) == {"n1", "n2", "n3"}
    again.close()


def test_questions_give_way_to_an_answer_and_keep_to_their_window(world):
    w = world

    async def scenario():
        add_note(w, "n1")
        async with w.answers.llm_slot():  # an answer holds the LLM: nothing starts
            assert await w.jobs.step() is False
        assert w.fake.structured_chats() == []
        w.fake.reply_structured(GOOD[:10], GOOD[10:20], GOOD[20:], stall_after=2)
        step = asyncio.create_task(w.jobs.step())
        await until(w.fake.structured_chats, what="the questions to call the LLM")
        async with w.answers.llm_slot():
            assert await within(step, "the questions to give the LLM up to the answer", 10) is False
        assert w.jobs.asked["preempted"] == 1 and asked_jobs(w.store) == [("n1", "h1")]

    run(scenario())


def test_outside_its_window_nothing_is_written(world, settings_factory):
    w = world
    import time
    now = time.localtime(w.clock())
    start = (now.tm_hour + 2) % 24
    settings = settings_factory(ollama={"host": w.fake.url, "timeout": 10}, answer={"first_token_budget": 5}, memory={"llm": "off", "questions": "on",
                                                                     "questions_scope": "note", "questions_window": f"{start:02d}:00-{(start + 1) % 24:02d}:00"})
    jobs = MemoryJobs(settings, lambda: w.store, w.answers, clock=w.clock, poll=0.01, quiet=0.0)
    add_note(w, "n1")
    assert run(jobs.step()) is False and w.fake.structured_chats() == []
    assert jobs.state()["questions"]["text"].startswith("written only ")
    w.clock.t += 2 * 3600  # inside it
    w.fake.reply_structured(GOOD)
    assert run(jobs.step()) is True and w.store.asked_of("n1", "u1")


def test_without_the_llm_nothing_is_queued_or_written(settings_factory, tmp_path):
    for settings in (settings_factory(ollama={"enabled": False}, memory={"questions": "on"}),
                     settings_factory(memory={"questions": "off"})):
        assert not questions_wanted(settings)
    off = settings_factory(ollama={"enabled": False}, memory={"questions": "on"})
    store = MemoryStore(tmp_path / "m.sqlite")
    jobs = MemoryJobs(off, lambda: store, AnswerService(off, index=None), poll=0.01, quiet=0.0)
    store.replace_note("u1", "n1", "h1", [], asked_job=json.dumps({"digest": DIGEST, "title": "t"}))
    assert run(jobs.step()) is False and store.asked_rows() == {}
    store.close()


# --- in the index ------------------------------------------------------------------------------------

QUESTION = "What should I do when my tomato and egg dish comes out watery?"


def test_a_written_question_finds_its_note_and_the_chunk_is_what_is_cited(tmp_path, use_embedder):
    settings = index_samples(tmp_path, use_embedder)
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        user = next(iter(index.store.count_by_user()))
        before = search(index, QUESTION, user, 5)
        target = next(h for h in search(index, "番茄炒蛋", user, 5) if "番茄" in h.title)
        weighted = NoteIndex(settings.model_copy(update={"retrieval": settings.retrieval.model_copy(
            update={"questions_weight": 1.0})}), index.store, index.embedder, index.index_id)
        # with no written question anywhere, the weight changes nothing
        assert [h.point_id for h in search(weighted, QUESTION, user, 5)] == [h.point_id for h in before]
        written = ["Why is my tomato egg dish watery?", "What should I do when the tomato and egg dish comes out watery?"]
        assert asked.index_questions(index, target.note_id, user, index.store.payloads([target.point_id])[
            target.point_id]["content_hash"], written) == 2
        assert index.store.count_by_user() == {user: sum(index.store.count_by_user().values())}  # not a person
        hits = search(weighted, QUESTION, user, 5)
        assert hits[0].note_id == target.note_id
        chunk = index.store.payloads([hits[0].point_id])[hits[0].point_id]
        assert chunk.get("kind") is None and hits[0].text == chunk["text"]  # a chunk, never the question
        assert all(q not in h.text for h in hits for q in written)
        assert hits[0].point_id != asked_point_id(target.note_id, 0)
        # nobody else's search sees them, and without the weight nothing changes
        assert search(index, QUESTION, user, 5)[0].point_id == before[0].point_id
        assert search(weighted, QUESTION, "someone-else", 5) == []
        # the note goes: so do its questions (and a question whose chunk went counts for nothing)
        asked.unindex_questions(index.store, [target.note_id])
        assert index.store.note_ids(asked_user(user)) == set()
        # a kill between the row and the points: the alignment puts them back, and takes stray ones out
        rows = {target.note_id: (user, "h", written)}
        assert asked.align(index, rows, [user]) == (1, 0)
        assert asked.align(index, {}, [user]) == (0, 1)


@pytest.mark.parametrize("scope", ["note", "sections"])
def test_notes_indexed_before_the_questions_were_on_get_them_and_a_kill_is_repaired(tmp_path, use_embedder, fake,
                                                                                    scope):
    """The real sync pass over the sample notes (the memory on, the questions off), then a daemon's
    worker with the questions on: every note is queued, its digest read from the index, its questions
    stored and indexed; points lost in a kill come back, and a removed note's go. In either scope."""
    from conftest import make_settings, run_pass
    from sync.memory_jobs import MemoryJobs

    settings = make_settings(tmp_path, ollama={"host": fake.url, "timeout": 10}, answer={"first_token_budget": 5},
                             memory={"llm": "off", "questions": "on", "questions_scope": scope})
    run_pass(make_settings(tmp_path, memory={"llm": "off"}), use_embedder)
    memory = MemoryStore(tmp_path / "data" / "memory.sqlite")
    answers = AnswerService(settings, index=None, chat=OllamaChat(settings.ollama))
    try:
        with NoteIndex.open(settings, embedder=use_embedder) as index:
            jobs = MemoryJobs(settings, lambda: memory, answers, poll=0.01, quiet=0.0, index=lambda: index)
            notes = len(memory.hashes())
            fake.reply_structured(sections_reply((1, ["这篇笔记讲的是什么？"], ["What is this note about?"]))
                                  if scope == "sections" else
                                  json.dumps({"questions": ["这篇笔记讲的是什么？"], "english": ["What is this note about?"]},
                                             ensure_ascii=False))
            assert run(jobs.step()) is True
            assert memory.asked_counts()["jobs_pending"] == notes - 1
            (note_id,) = [n for n, (_, _, qs, _) in memory.asked_rows().items() if qs]
            (chat,) = fake.structured_chats()
            assert chat["messages"][-1]["content"].startswith("Title: ")  # the digest, read from the index
            user, _, _, ties = memory.asked_rows()[note_id]
            if scope == "sections":  # tied to the first section's chunks, as read from the index
                assert "Sections:\n[1] " in chat["messages"][-1]["content"] and ties[0] and 0 in ties[0]
            else:
                assert ties == []
            assert index.store.note_ids(asked_user(user)) == {note_id}
            # killed after the row, before the points: the next alignment puts them back
            asked.unindex_questions(index.store, [note_id])
            jobs._aligned_at = float("-inf")
            fake.reply_structured(GOOD)
            assert run(jobs.step()) is True
            assert note_id in index.store.note_ids(asked_user(user))
            # the note goes (trashed): what follows the index's commit takes its row and its points
            from sync.derived import Derived
            Derived(settings, state=None, store=lambda: index.store, memory=memory).follow({note_id: None}, {}, {})
            assert note_id not in memory.asked_rows() and note_id not in index.store.note_ids(asked_user(user))
            # a stray point (a kill between the two): the next alignment takes it out
            asked.index_questions(index, note_id, user, "h", ["还在吗？"])
            jobs._aligned_at = float("-inf")
            fake.reply_structured(GOOD)
            assert run(jobs.step()) is True
            assert note_id not in index.store.note_ids(asked_user(user))
    finally:
        answers.close()
        memory.close()


def test_metrics_show_the_written_questions(world):
    from bot.api.metrics import _QuestionsCollector

    w = world
    add_note(w, "n1")
    add_note(w, "n2")
    w.fake.reply_structured(GOOD)
    assert run(w.jobs.step())
    got = {m.name: m.samples[0].value for m in _QuestionsCollector(lambda: w.store).collect()}
    assert got["leanote_rag_questions_notes"] == 1 and got["leanote_rag_questions_written"] == 4
    assert got["leanote_rag_questions_jobs_pending"] == 1 and got["leanote_rag_questions_generations_dropped"] == 0
    assert got["leanote_rag_questions_output_tokens"] > 0
    assert list(_QuestionsCollector(lambda: None).collect()) == []


# --- per heading section (memory.questions_scope: sections) ------------------------------------------

SECTIONS_DIGEST = "Title: 红烧肉\nSections:\n[1] 准备\n五花肉先焯水。\n[2] 炖\n小火炖一个小时，收汁。"


def sections_reply(*entries) -> str:
    return json.dumps({"sections": [{"section": n, "questions": own, "english": en} for n, own, en in entries]},
                      ensure_ascii=False)


def test_a_sections_reply_ties_each_question_to_its_sections_chunks_and_drops_a_section_not_shown():
    reply = sections_reply((1, ["五花肉要先焯水吗？"], ["Do I blanch the pork first?"]),
                           (2, ["要炖多久？", "汁怎么收？", "火候多大？"], ["How long does it simmer?"]),
                           (7, ["第七节讲什么？", "还有吗？"], ["What else?"]))
    w = asked_sections.check(reply, SECTIONS_DIGEST, "红烧肉", [[0], [1, 2]], Usage(output_tokens=120))
    assert w.questions == ["五花肉要先焯水吗？", "要炖多久？", "汁怎么收？", "Do I blanch the pork first?",
                           "How long does it simmer?"]
    assert w.ties == [[0], [1, 2], [1, 2], [0], [1, 2]] and w.english == 2
    assert w.dropped == {"no such section": 3, "too many": 1}  # section 7's three, the third of section 2's
    assert w.stats()["sections_answered"] == 2
    # nothing but sections that do not exist: the generation is dropped
    w = asked_sections.check(sections_reply((0, ["有吗？"], []), (3, ["有吗？"], [])), SECTIONS_DIGEST, "红烧肉",
                             [[0], [1, 2]], Usage(output_tokens=40))
    assert not w.ok and w.dropped == {"no such section": 2, "generation: nothing usable": 1}
    # the same checks as the note scope's: echoes, language (a reply cut at the cap: the next test)
    w = asked_sections.check(sections_reply((1, ["红烧肉？", "炒蛋怎么才嫩？"], ["炖多久？"])), SECTIONS_DIGEST, "红烧肉",
                             [[0], [1, 2]], Usage(output_tokens=40))
    assert w.dropped == {"echo": 2, "language": 1, "generation: nothing usable": 1}


def long_note(sections: int, chars: int = 600) -> list[Chunk]:
    return [Chunk(i, f"第{i}节" + "正文" * chars, ("红烧肉", f"第{i}节"), 0, 2 * chars) for i in range(sections)]


def test_a_sections_reply_cut_at_the_cap_keeps_the_sections_it_finished_and_is_counted():
    cap = Usage(output_tokens=asked_sections.output_cap(2))
    whole = sections_reply((1, ["五花肉要先焯水吗？"], ["Do I blanch the pork first?"]),
                           (2, ["要炖多久？", "汁怎么收？"], ["How long does it simmer?"]))
    cut = whole[: whole.index('"How long')]  # the model ran on and the cap cut section 2's entry
    w = asked_sections.check(cut, SECTIONS_DIGEST, "红烧肉", [[0], [1, 2]], cap)
    assert w.questions == ["五花肉要先焯水吗？", "Do I blanch the pork first?"] and w.ties == [[0], [0]]
    assert w.dropped == {asked_sections.CUT: 1}
    # cut before its first section was finished: nothing to keep, the generation is dropped
    for nothing in (whole[:30], '{"sections": ', "五花肉" * 50):
        w = asked_sections.check(nothing, SECTIONS_DIGEST, "红烧肉", [[0], [1, 2]], cap)
        assert not w.ok and w.dropped == {"generation: ran to the output cap": 1}
    # rambling on past the sections shown is still checked entry by entry
    ramble = sections_reply((1, ["五花肉要先焯水吗？"], []), (1, ["五花肉要先焯水吗？"], []), (9, ["还有吗？"], []))
    w = asked_sections.check(ramble[:-2], SECTIONS_DIGEST, "红烧肉", [[0], [1, 2]], cap)
    assert w.questions == ["五花肉要先焯水吗？"]
    assert w.dropped == {asked_sections.CUT: 1, "repeated": 1, "no such section": 1}
    # the note scope still drops such a reply whole
    assert asked.check(GOOD, DIGEST, "红烧肉", Usage(output_tokens=asked.OUTPUT_TOKENS)).dropped == {
        "generation: ran to the output cap": 1}


def test_a_long_notes_sections_are_spread_over_it_and_its_one_call_stays_under_the_budget(world, settings_factory):
    chunks = long_note(40)
    shown = asked_sections.sections("红烧肉", chunks)
    assert len(shown) == asked_sections.MAX_SECTIONS and shown[0].chunks == (0,) and shown[-1].chunks == (39,)
    assert [s.number for s in shown] == list(range(1, asked_sections.MAX_SECTIONS + 1))
    d = asked_sections.digest("红烧肉", shown)
    assert len(d) <= asked_sections.PROMPT_CHARS and all(f"[{s.number}] 第{s.chunks[0]}节" in d for s in shown)
    # every question a call may keep has a point of its own in the index
    from rag.index.points import MAX_ASKED
    assert asked_sections.MAX_SECTIONS * (asked_sections.OWN_PER_SECTION + asked_sections.ENGLISH_PER_SECTION) <= MAX_ASKED
    # no headings: one section per chunk
    plain = [Chunk(i, f"段落{i}", (), 0, 3) for i in range(3)]
    assert [s.chunks for s in asked_sections.sections("笔记", plain)] == [(0,), (1,), (2,)]
    w = world
    settings = settings_factory(ollama={"host": w.fake.url, "timeout": 10}, answer={"first_token_budget": 5},
                                memory={"llm": "off", "questions": "on", "questions_scope": "sections"})
    jobs = MemoryJobs(settings, lambda: w.store, w.answers, clock=w.clock, poll=0.01, quiet=0.0)
    w.store.replace_note("u1", "n1", "h1", [], asked_job=json.dumps(asked_scopes.job("sections", "红烧肉", chunks), ensure_ascii=False))
    w.fake.reply_structured(sections_reply((8, ["最后一节讲什么做法？"], ["What does the last part say?"])))
    assert run(jobs.step()) is True
    (chat,) = w.fake.structured_chats()
    assert chat["format"] == asked_sections.SCHEMA
    assert len(chat["messages"][-1]["content"]) <= asked_sections.PROMPT_CHARS
    assert chat["options"]["num_predict"] == asked_sections.output_cap(asked_sections.MAX_SECTIONS)
    assert w.store.asked_rows()["n1"][2:] == (["最后一节讲什么做法？", "What does the last part say?"], [[39], [39]])


def test_switching_the_scope_rewrites_the_questions_on_the_next_pass(world, settings_factory):
    w = world
    add_note(w, "n1")
    w.fake.reply_structured(GOOD)
    assert run(w.jobs.step()) and w.store.asked_scope("n1") == "note"
    assert w.store.queue_missing_asked("note") == 0
    # the scope switched: the next pass queues the note again; its old questions stay until replaced
    sections = settings_factory(ollama={"host": w.fake.url, "timeout": 10}, answer={"first_token_budget": 5},
                                memory={"llm": "off", "questions": "on", "questions_scope": "sections"})
    chunks = [Chunk(0, "五花肉先焯水。", ("红烧肉", "准备"), 0, 7), Chunk(1, "小火炖一个小时。", ("红烧肉", "炖"), 7, 15)]
    w.store.replace_note("u1", "n1", "h1", [], asked_job=json.dumps(asked_scopes.job("sections", "红烧肉", chunks), ensure_ascii=False))
    assert asked_jobs(w.store) == [("n1", "h1")] and w.store.asked_of("n1", "u1")[0] == "红烧肉要先焯水吗？"
    jobs = MemoryJobs(sections, lambda: w.store, w.answers, clock=w.clock, poll=0.01, quiet=0.0)
    w.fake.reply_structured(sections_reply((2, ["要炖多久？"], ["How long does it simmer?"])))
    assert run(jobs.step()) is True and w.store.asked_scope("n1") == "sections"
    assert w.store.asked_rows()["n1"][2:] == (["要炖多久？", "How long does it simmer?"], [[1], [1]])
    assert w.store.queue_missing_asked("sections") == 0 and asked_jobs(w.store) == []
    # and back: the note scope's next pass (a job queued without a digest, read from the index then)
    assert w.store.queue_missing_asked("note") == 1 and asked_jobs(w.store) == [("n1", "h1")]


def test_the_title_scope_sends_the_title_alone_and_its_questions_replace_the_note_scopes(world, settings_factory):
    w = world
    add_note(w, "n1")
    w.fake.reply_structured(GOOD)
    assert run(w.jobs.step()) and w.store.asked_scope("n1") == "note"
    titled = settings_factory(ollama={"host": w.fake.url, "timeout": 10}, answer={"first_token_budget": 5},
                              memory={"llm": "off", "questions": "on", "questions_scope": "title"})
    assert titled.retrieval.questions_weight == 0.25  # turned on, and searched
    assert w.store.queue_missing_asked("title") == 1  # a note written in another scope is written again
    w.store.replace_note("u1", "n1", "h1", [], asked_job=json.dumps(asked_scopes.job("title", "红烧肉", []),
                                                                     ensure_ascii=False))
    jobs = MemoryJobs(titled, lambda: w.store, w.answers, clock=w.clock, poll=0.01, quiet=0.0)
    w.fake.reply_structured(json.dumps({"questions": ["红烧肉怎么做才不腻？", "红烧肉是什么？"],
                                        "english": ["How do I keep braised pork from being greasy?"]},
                                       ensure_ascii=False))
    assert run(jobs.step()) is True and w.store.asked_scope("n1") == "title"
    assert w.store.asked_rows()["n1"][2] == ["红烧肉怎么做才不腻？", "How do I keep braised pork from being greasy?"]
    chat = w.fake.structured_chats()[-1]
    assert chat["messages"][0]["content"] == asked.TITLE_SYSTEM and chat["messages"][-1]["content"] == "Title: 红烧肉\n"
    # (it opens like the prompt's example, "How do I keep scrambled eggs soft?", and is kept: an echo
    # must copy the example's subject)
    # the title scope's own instructions are what an echo is checked against
    echo = json.dumps({"questions": [asked.TITLE_SYSTEM.splitlines()[0]], "english": []})
    assert asked.check(echo, asked.title_digest("红烧肉"), "红烧肉", Usage(output_tokens=40),
                       system=asked.TITLE_SYSTEM).dropped.get("echo") == 1


def test_rows_written_before_the_scope_existed_are_the_note_scopes(tmp_path):
    import sqlite3

    from rag.memory.schema import MIGRATIONS

    path = tmp_path / "memory.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:-1]:
        for statement in step.split(";"):
            if statement.strip():
                db.execute(statement)
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) - 1}")
    db.execute("INSERT INTO asked(note_id, user_id, content_hash, questions, stats, at) VALUES "
               "('n1', 'u1', 'h1', '[\"老问题？\"]', '{}', 1)")
    db.close()
    store = MemoryStore(path)
    try:
        assert store.asked_rows() == {"n1": ("u1", "h1", ["老问题？"], [])} and store.asked_scope("n1") == "note"
    finally:
        store.close()


def test_a_sections_question_credits_its_own_sections_chunk(tmp_path, use_embedder):
    from rag.index.points import point_id

    settings = index_samples(tmp_path, use_embedder)
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        user = next(iter(index.store.count_by_user()))
        def chunks_of(note_id: str) -> list[dict]:
            return sorted(index.store.payloads([point_id(note_id, i) for i in range(64)]).values(),
                          key=lambda p: p["chunk_index"])

        note_id = max(sorted(index.store.note_ids(user)), key=lambda n: len(chunks_of(n)))
        target = SimpleNamespace(note_id=note_id)
        chunks = chunks_of(note_id)
        assert len(chunks) >= 2, "a sample note with two chunks"
        content_hash = chunks[0]["content_hash"]
        written = [QUESTION]
        # untied (the note scope): the note's nearest chunk; tied to a section: that section's chunk
        asked.index_questions(index, target.note_id, user, content_hash, written)
        nearest = index.store.payloads([asked_point_id(target.note_id, 0)])[asked_point_id(target.note_id, 0)]
        other = next(c["chunk_index"] for c in chunks if point_id(target.note_id, c["chunk_index"]) != nearest["chunk_id"])
        assert asked.index_questions(index, target.note_id, user, content_hash, written, [[other]]) == 1
        point = index.store.payloads([asked_point_id(target.note_id, 0)])[asked_point_id(target.note_id, 0)]
        assert point["chunk_id"] == point_id(target.note_id, other) != nearest["chunk_id"]
        found = asked.rankings(index.store, *query_vectors(index, QUESTION), user, 5)
        assert found["asked_dense"][0].id == point_id(target.note_id, other)
        # a tie to a chunk the note does not have (any more): the question is not indexed
        assert asked.index_questions(index, target.note_id, user, content_hash, written, [[999]]) == 0
        # the alignment keeps the tie
        asked.unindex_questions(index.store, [target.note_id])
        assert asked.align(index, {target.note_id: (user, content_hash, written, [[other]])}, [user]) == (1, 0)
        point = index.store.payloads([asked_point_id(target.note_id, 0)])[asked_point_id(target.note_id, 0)]
        assert point["chunk_id"] == point_id(target.note_id, other)


def query_vectors(index, question: str):
    """The dense and sparse vectors a search sends for ``question``."""
    from rag.index.lexical import query_vector

    return index.embed_query([question])[0], query_vector(question)
