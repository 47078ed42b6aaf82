"""LLM-assisted retrieval (retrieval.expand): the LLM's terms and hypothetical answer are
fused in, cached per question and person, skipped without an LLM, dropped when late without
delaying the answer, and an expansion that repeats the question changes nothing."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from rag.answer.service import AnswerService
from rag.index.note_index import NoteIndex
from rag.llm import OllamaChat
from rag.index.retrieve import search
from bot.root import Parts

from conftest import index_samples
from fakes.ollama import FakeOllama

# Everyday words for what the note calls journalctl -u NAME -f
PARAPHRASE = "看某个后台程序实时输出用什么命令？"
NOTE = "Reading systemd journal logs"


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory, use_embedder):
    return index_samples(tmp_path_factory.mktemp("expand"), use_embedder, rerank={"kind": "none"})


@pytest.fixture(autouse=True)
def no_speed_learned_yet(request):
    """Each test starts as a new install: nothing learned about the LLM."""
    from rag.speed import FILE

    if "sample_index" in request.fixturenames:
        (request.getfixturevalue("sample_index").state_dir / FILE).unlink(missing_ok=True)


def service(settings, url, use_embedder, expand="on", budget=30.0, **answer):
    s = settings.model_copy(update={
        "ollama": settings.ollama.model_copy(update={"host": url}),
        "retrieval": settings.retrieval.model_copy(update={"expand": expand}),
        "answer": settings.answer.model_copy(update={"first_token_budget": budget, **answer})})
    index = NoteIndex.open(s, embedder=use_embedder)
    return AnswerService(s, index, chat=OllamaChat(s.ollama)), index


def expansions(ollama) -> list[dict]:
    return ollama.structured_chats()


def rank_of(trace, title: str) -> int:
    titles = list(dict.fromkeys(c.title for c in trace.candidates))
    return titles.index(title) + 1


def test_the_expansion_joins_the_fusion_and_is_cached(sample_index, use_embedder):
    with FakeOllama() as ollama:
        svc, index = service(sample_index, ollama.url, use_embedder)
        try:
            ollama.reply_structured(json.dumps({"terms": ["journalctl", "systemd", "日志", "-f"],
                                                "answer": "用 journalctl -u 服务名 -f 实时跟踪一个服务的日志"},
                                               ensure_ascii=False))
            ollama.reply("用 journalctl -u 服务名 -f[1]。")
            answer = asyncio.run(svc.ask(PARAPHRASE, "local"))
            assert "journalctl" in answer.trace.expansion and "实时跟踪" in answer.trace.expansion
            request = expansions(ollama)[0]
            assert request["format"]["required"] == ["terms", "answer"] and request["options"]["num_predict"] <= 128
            expanded = rank_of(answer.trace, NOTE)
            ollama.reply("用 journalctl[1]。")
            again = asyncio.run(svc.ask(PARAPHRASE, "local"))
            assert len(expansions(ollama)) == 1 and "cached" in again.trace.expansion  # asked once
            # the cache is per person: someone else asking the same learns nothing from it
            ollama.reply("用 journalctl[1]。")
            other = asyncio.run(svc.ask(PARAPHRASE, "local", conversation="telegram:-100:222"))
            assert len(expansions(ollama)) == 2 and "cached" not in other.trace.expansion
        finally:
            svc.close()
            index.close()
    with NoteIndex.open(sample_index, embedder=use_embedder) as index:
        plain = search(index, PARAPHRASE, "local", 50)
    titles = list(dict.fromkeys(h.title for h in plain))
    assert expanded == 1 and titles.index(NOTE) + 1 > 3  # from below the top 3 to first


def test_without_an_llm_there_is_no_expansion_and_no_fuss(sample_index, use_embedder):
    s = sample_index.model_copy(update={"ollama": sample_index.ollama.model_copy(update={"enabled": False}),
                                        "retrieval": sample_index.retrieval.model_copy(update={"expand": "on"})})
    with NoteIndex.open(s, embedder=use_embedder) as index:
        svc = Parts(s, index=index).answers
        try:
            answer = asyncio.run(svc.ask(PARAPHRASE, "local"))
        finally:
            svc.close()
    assert answer.trace.expansion == "" and answer.trace.outcome == "extractive"


def test_a_late_expansion_is_dropped_without_delaying_the_answer(sample_index, use_embedder):
    with FakeOllama() as ollama:
        svc, index = service(sample_index, ollama.url, use_embedder, budget=2.0)  # 0.5 s for the expansion
        try:
            ollama.reply_structured("{", stall_after=0)  # the expansion hangs
            ollama.reply("用 journalctl[1]。")
            started = time.monotonic()
            answer = asyncio.run(svc.ask(PARAPHRASE, "local"))
            took = time.monotonic() - started
        finally:
            svc.close()
            index.close()
    # dropped by the answer's wait, or given up by the expansion's own deadline first: either way not waited for
    assert answer.trace.expansion.startswith(("dropped", "none")) and answer.trace.reply == "用 journalctl[1]。"
    assert took < 2.0  # the answer did not wait past the expansion's share of the budget


@pytest.mark.slow
def test_auto_waits_for_a_measured_speed_and_skips_a_slow_machine(sample_index, use_embedder):
    with FakeOllama(speed=(400.0, 40.0)) as ollama:  # a slow CPU: ~3 s for an expansion
        svc, index = service(sample_index, ollama.url, use_embedder, expand="auto", budget=3.0, total_chars=1000)
        try:
            ollama.reply("先炒蛋[1]，再加一小勺糖压酸味[1]。")
            first = asyncio.run(svc.ask("番茄炒蛋怎么做才不酸？", "local"))
            assert "not until the LLM's speed here is measured" in first.trace.expansion
            ollama.reply("加一小勺糖[1]。")
            second = asyncio.run(svc.ask("番茄炒蛋怎么做才不酸？", "local"))
            assert "skipped" in second.trace.expansion and expansions(ollama) == []
        finally:
            svc.close()
            index.close()


@pytest.mark.slow
def test_auto_does_not_hold_the_sources_back_for_an_expansion_even_when_the_budget_would_fit_it(
        sample_index, use_embedder):
    """A 120 s budget fits a ~3 s expansion in its quarter, but the sources wait for the
    expansion's search: auto skips it (the 1.5B here held them back 13.7 s p50)."""
    with FakeOllama(speed=(400.0, 40.0)) as ollama:
        svc, index = service(sample_index, ollama.url, use_embedder, expand="auto", budget=120.0, total_chars=1000)
        try:
            ollama.reply("先炒蛋[1]，再加一小勺糖压酸味[1]。")
            asyncio.run(svc.ask("番茄炒蛋怎么做才不酸？", "local"))
            ollama.reply("加一小勺糖[1]。")
            second = asyncio.run(svc.ask("番茄炒蛋怎么做才不酸？", "local"))
        finally:
            svc.close()
            index.close()
    assert "the sources would wait for it" in second.trace.expansion and expansions(ollama) == []


def test_an_expansion_that_repeats_the_question_changes_no_ranking(sample_index, use_embedder):
    with NoteIndex.open(sample_index, embedder=use_embedder) as index:
        for question in ("retry_count", "付款失败后第一次重试前要等多久", PARAPHRASE, "How do I follow a service's logs?"):
            plain = search(index, question, "local", 10)
            echoed = search(index, question, "local", 10, expansion=([question], question))
            assert [h.point_id for h in echoed] == [h.point_id for h in plain], question
