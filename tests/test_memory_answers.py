"""The memory in answers: entities named in a question add a ranking to the fusion, facts
about them are evidence cited to their source notes, "which notes did I write about X" is
a listing without the LLM, the trace shows both; without a memory nothing changes."""

from __future__ import annotations

import asyncio

import pytest

from bot.chat.texts import trace_text
from bot.usecases.results import Why
from rag.answer.remembered import notes_about
from rag.answer.service import AnswerService
from rag.answer.evidence import Evidence, add_facts
from rag.index.note_index import NoteIndex
from rag.llm import OllamaChat
from rag.memory.store import MemoryStore
from rag.index.retrieve import entity_ranking, named_entities, search
from sync.state import State
from bot.root import Parts

from conftest import make_settings
from fakes.ollama import FakeOllama

PG = "PostgreSQL 连接池配置（SQLAlchemy）"


@pytest.fixture(scope="module")
def remembered(tmp_path_factory, use_embedder):
    """The sample notes indexed and in the memory, and one LLM-tier fact about pool_size."""
    tmp = tmp_path_factory.mktemp("memory_answers")
    settings = make_settings(tmp, rerank={"kind": "none"}, memory={"llm": "off"}, retrieval={"expand": "off"})
    state = State(settings.state_dir)
    try:
        with NoteIndex.open(settings, create=True, embedder=use_embedder) as index:
            service = Parts(settings, index=index, state=state).sync
            try:
                assert service.run_pass(force=True).ok
            finally:
                service.close()
    finally:
        state.close()
    with MemoryStore.open_for(settings) as memory:
        note = memory.entity("local", "pool_size")[0]
        row = memory.db.execute("SELECT content_hash FROM notes WHERE note_id = ?", (note["note_id"],)).fetchone()
        quote = note["mentions"][0]["snippet"].strip("…").strip()
        job = {"note_id": note["note_id"], "user_id": "local", "content_hash": row[0], "updated": 1.0e9}
        fact = {"subject": "pool_size", "predicate": "set to", "object": "20 after the incident", "quote": quote}
        assert memory.store_llm(job, "", [fact], {})
    return settings, note["note_id"], quote


@pytest.fixture(autouse=True)
def no_speed_learned_yet(request):
    from rag.speed import FILE

    if "remembered" in request.fixturenames:
        (request.getfixturevalue("remembered")[0].state_dir / FILE).unlink(missing_ok=True)


def service(settings, embedder, url=None, memory=True):
    if url is not None:
        settings = settings.model_copy(update={"ollama": settings.ollama.model_copy(update={"host": url})})
    index = NoteIndex.open(settings, embedder=embedder)
    store = MemoryStore.open_for(settings) if memory is True else (memory or None)
    svc = AnswerService(settings, index, chat=OllamaChat(settings.ollama) if url else None, memory=store)
    return svc, index, store


def close(svc, index, store):
    svc.close()
    index.close()
    if store is not None:
        store.close()


def test_entities_named_in_a_question_rank_the_notes_that_mention_them(remembered, use_embedder):
    settings, pg_id, _ = remembered
    question = "pool_size 在事故之后调成了多少？"
    with MemoryStore.open_for(settings) as memory, NoteIndex.open(settings, embedder=use_embedder) as index:
        named = named_entities(memory, "local", question)
        assert "pool_size" in [e["name"] for e in named]
        ranking = entity_ranking(memory, "local", named, 50)
        assert ranking and pg_id in {r.note_id for r in ranking}
        only = entity_ranking(memory, "local", [e for e in named if e["name"] == "pool_size"], 50)
        assert only and {r.note_id for r in only} == {pg_id}
        assert named_entities(memory, "other", question) == []  # another user's memory is not this one's
        plain = search(index, question, "local", 20)
        boosted = search(index, question, "local", 20, entities=ranking)
        best = lambda hits: max((h.score for h in hits if h.note_id == pg_id), default=0.0)  # noqa: E731
        assert best(boosted) > best(plain)
        # an entity inside a longer word, or too short, is not named
        assert named_entities(memory, "local", "my_pool_sizes and 池") == []


def test_facts_are_evidence_cited_to_their_source_note_and_the_trace_shows_them(remembered, use_embedder):
    settings, pg_id, quote = remembered
    with FakeOllama() as ollama:
        svc, index, store = service(settings, use_embedder, ollama.url)
        try:
            ollama.reply("事故之后 pool_size 调到了 20[1]。")
            answer = asyncio.run(svc.ask("pool_size 在事故之后调成了多少？", "local", conversation="t:1"))
            prompt = ollama.chats()[-1]["messages"][-1]["content"]
            assert "Facts remembered from this note:" in prompt and "pool_size — set to — 20 after the incident" in prompt
            trace = answer.trace
            assert any(e.startswith("pool_size") for e in trace.entities)
            assert trace.facts and trace.facts[0].endswith("pool_size — set to — 20 after the incident")
            n = int(trace.facts[0][1:trace.facts[0].index("]")])
            block_note = next(c.note_id for c in trace.candidates if c.evidence == n)
            assert block_note == pg_id
            assert answer.grounded and answer.citations[0].note_id == pg_id
            assert answer.citations[0].url == store.note_info("local", pg_id)["url"]  # the note's own link
            why = trace_text(Why.of(svc.conversations.trace("local", "t:1")))
            assert "实体 entities: pool_size" in why and "事实 fact: " in why
        finally:
            close(svc, index, store)


def test_a_fact_of_a_note_not_among_the_evidence_gets_a_block_that_links_to_it():
    blocks = [Evidence(1, "n1", "Other", "nb", "", "http://l/note/n1", "text", 1.0, ["p1"])]
    fact = {"subject": "X", "predicate": "is", "object": "Y", "quote": "X is Y", "note_id": "n2", "title": "Source",
            "notebook": "nb", "url": "http://l/note/n2"}
    used = add_facts(blocks, [fact, dict(fact, note_id="n1", object="Z")])
    assert [(n, f["object"]) for n, f in used] == [(2, "Y"), (1, "Z")]
    assert blocks[1].url == "http://l/note/n2" and "X — is — Y (\u201cX is Y\u201d)" in blocks[1].text
    assert blocks[0].text.startswith("text\n\nFacts remembered from this note:\n- X — is — Z")


def test_notes_about_question_forms():
    assert notes_about("我写过哪些关于 journalctl 的笔记？") == "journalctl"
    assert notes_about("我写过哪些关于连接池的笔记") == "连接池"
    assert notes_about("关于「pool_size」的笔记有哪些") == "pool_size"
    assert notes_about("哪些笔记提到了 retry_count？") == "retry_count"
    assert notes_about("Which notes did I write about journalctl?") == "journalctl"
    assert notes_about("show me my notes about pool_size") == "pool_size"
    assert notes_about("怎么看 journalctl 的日志？") is None
    assert notes_about("我写过哪些笔记") is None


def test_which_notes_about_x_is_a_listing_without_the_llm(remembered, use_embedder):
    settings, pg_id, _ = remembered
    with FakeOllama() as ollama:
        svc, index, store = service(settings, use_embedder, ollama.url)
        try:
            answer = asyncio.run(svc.ask("我写过哪些关于 journalctl 的笔记？", "local"))
            assert not ollama.chats()  # the LLM was not asked
            assert answer.trace.outcome == "listing" and "journalctl" in answer.trace.decision
            assert not answer.used_llm and answer.grounded
            listed = store.notes_mentioning("local", ["journalctl"])
            assert [c.note_id for c in answer.citations] == [n["note_id"] for n in listed]
            dates = [n["updated_at"] for n in listed]
            assert dates == sorted(dates, reverse=True)  # newest first
            assert "提到「journalctl」的笔记有" in answer.answer
            for c, n in zip(answer.citations, listed):
                assert c.url == store.note_info("local", c.note_id)["url"] and c.url in answer.answer
                assert c.title in answer.answer
                assert n["updated_at"][:10] in answer.answer
            english = asyncio.run(svc.ask("Which notes did I write about pool_size?", "local"))
            assert english.trace.outcome == "listing" and [c.note_id for c in english.citations] == [pg_id]
            assert english.answer.startswith("1 notes mention")
            # nothing in the memory by that name: answered as any other question
            ollama.reply("不知道")
            other = asyncio.run(svc.ask("我写过哪些关于量子引力的笔记？", "local"))
            assert other.trace.outcome != "listing"
        finally:
            close(svc, index, store)


QUESTIONS = ["pool_size 在事故之后调成了多少？", "怎么实时看一个服务的日志", "我写过哪些关于 journalctl 的笔记？"]


def _comparable(answer):
    out = answer.as_json(with_trace=True)
    out.pop("timings_ms")
    return out


def test_without_a_memory_answers_are_as_before(remembered, use_embedder, tmp_path):
    settings, _, _ = remembered
    svc, index, _ = service(settings, use_embedder, memory=None)
    try:
        before = [_comparable(asyncio.run(svc.ask(q, "local"))) for q in QUESTIONS]
    finally:
        close(svc, index, None)
    assert all(not b["trace"]["entities"] and not b["trace"]["facts"] for b in before)
    assert before[2]["trace"]["outcome"] != "listing"
    empty = MemoryStore(tmp_path / "empty.sqlite")
    svc, index, _ = service(settings, use_embedder, memory=empty)
    try:
        assert [_comparable(asyncio.run(svc.ask(q, "local"))) for q in QUESTIONS] == before
    finally:
        close(svc, index, empty)
    # memory.enabled: false -> the service opens no memory
    off = settings.model_copy(update={"memory": settings.memory.model_copy(update={"enabled": False})})
    index = NoteIndex.open(off, embedder=use_embedder)
    svc = Parts(off.model_copy(update={"ollama": off.ollama.model_copy(update={"enabled": False})}), index=index).answers
    try:
        assert svc.memory is None
    finally:
        svc.close()
        index.close()
