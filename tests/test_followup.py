"""A question asked in a conversation (rag.answer.followup): only a follow-up is rewritten, from a
small prompt, within a share of the first-token budget; otherwise it is searched joined to the
last question. The old step sent the whole history to the LLM before every search in a chat."""

from __future__ import annotations

import asyncio

import pytest

from rag.answer import followup
from rag.answer.service import AnswerService
from rag.index.note_index import NoteIndex
from rag.llm import OllamaChat

from conftest import index_samples
from fakes.ollama import FakeOllama


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, use_embedder):
    return index_samples(tmp_path_factory.mktemp("followup"), use_embedder, rerank={"kind": "none"},
                         retrieval={"expand": "off"})


@pytest.fixture
def answers(indexed, use_embedder):
    """(make, close): make(ollama_url, budget) gives an AnswerService that has learned nothing."""
    made = []

    def make(url: str, budget: float = 30.0) -> AnswerService:
        for earlier, _ in made:  # what an earlier service learned is written before it is removed
            earlier.speeds.flush()
        (indexed.state_dir / "llm_speed.json").unlink(missing_ok=True)
        settings = indexed.model_copy(update={
            "ollama": indexed.ollama.model_copy(update={"host": url, "timeout": 60.0}),
            "answer": indexed.answer.model_copy(update={"first_token_budget": budget})})
        index = NoteIndex.open(settings, embedder=use_embedder)
        service = AnswerService(settings, index, chat=OllamaChat(settings.ollama))
        made.append((service, index))
        return service

    yield make
    for service, index in made:
        service.close()
        index.close()


def ask(service, question):
    return asyncio.run(service.ask(question, "local", conversation="chat"))


def rewrites(ollama) -> list[dict]:
    return [c for c in ollama.chats() if c["messages"][0]["content"] == followup.CONDENSE]


@pytest.mark.parametrize("question, follows", [
    ("那它保留多少份？", True),  # refers back, short
    ("为什么？", True),  # very short
    ("And Redis?", True),
    ("what about its retention policy?", True),
    ("And what water temperature?", True),  # a newcomer's follow-up: "And" carries on from the last question
    ("But how long does it keep them?", True),
    ("What water temperature for a pour-over?", False),
    ("家里服务器怎么备份的？", False),
    ("restic 备份保留多少份快照？", False),
    ("线程池那几个大小参数还有排队上限，能不能在服务不停机的情况下动态调整？有没有现成的开源轮子？", False),
    ("How do I rebase a branch that my teammates already pulled without breaking their history?", False),
])
def test_only_a_question_that_needs_the_conversation_is_a_follow_up(question, follows):
    assert followup.is_follow_up(question) is follows


def test_the_rewrite_reads_the_last_questions_and_the_head_of_the_last_answer_not_the_history():
    history = [(f"第{i}个问题？", "长答案" * 2000) for i in range(10)]
    prompt = followup.messages(history, "那它呢？")
    user = prompt[1]["content"]
    assert "第8个问题？" in user and "第9个问题？" in user and "第7个问题？" not in user
    assert user.endswith("Last message: 那它呢？")
    assert len(user) < 600  # of ~60,000 characters of history


def test_a_chain_of_joined_follow_ups_keeps_the_topic_and_does_not_grow():
    history = [("家里服务器怎么备份的？", "用 restic。")]
    for _ in range(50):
        history.append((followup.joined(history, "还有别的办法吗？"), "……"))
    assert history[-1][0].startswith("家里服务器怎么备份的？ 还有别的办法吗？")
    assert len(history[-1][0]) <= followup.JOIN_CHARS + len(" 还有别的办法吗？")


def test_a_question_that_stands_alone_is_searched_as_asked_in_a_conversation(answers):
    with FakeOllama() as ollama:
        service = answers(ollama.url)
        ollama.reply("每天夜里 02:00 用 restic 备份到 USB 硬盘[1]。")
        ask(service, "家里服务器怎么备份的？")
        ollama.reply("先把鸡蛋炒好盛出[1]。")
        second = ask(service, "番茄炒蛋怎么做才不酸？")
    assert len(ollama.chats()) == 2 and not rewrites(ollama)
    assert second.trace.standalone == "番茄炒蛋怎么做才不酸？" and second.trace.followup == ""
    assert second.citations[0].title == "番茄炒蛋"


def test_a_follow_up_is_rewritten_by_a_model_fast_enough_and_the_trace_says_so(answers):
    with FakeOllama() as ollama:
        service = answers(ollama.url)
        ollama.reply("每天夜里 02:00 用 restic 备份到 USB 硬盘[1]。")
        ask(service, "家里服务器怎么备份的？")
        ollama.reply("restic 备份保留多少个快照？")
        ollama.reply("保留 7 个每日快照[1]。")
        second = ask(service, "那它保留多少份？")
    assert len(rewrites(ollama)) == 1
    assert second.trace.standalone == "restic 备份保留多少个快照？"
    assert second.trace.followup.startswith("rewritten by the LLM (")


@pytest.mark.slow
def test_a_model_too_slow_to_rewrite_within_its_share_of_the_budget_is_not_asked(answers):
    """Writing 20 tokens a second, a rewrite takes ~2 s: over a quarter of a 4 s budget. The
    follow-up is searched joined to the last question, and finds the note."""
    with FakeOllama(speed=(5000.0, 20.0)) as ollama:
        service = answers(ollama.url, budget=4.0)
        ollama.reply("每天夜里 02:00 用 restic 备份到 USB 硬盘[1]。")
        ask(service, "家里服务器怎么备份的？")
        assert service.speeds.get(service.chat.model).write_tps < 40  # measured by the first answer
        ollama.reply("保留 7 个每日快照[1]。")
        second = ask(service, "那它保留多少份？")
    assert not rewrites(ollama) and len(ollama.chats()) == 2
    assert second.trace.standalone == "家里服务器怎么备份的？ 那它保留多少份？"
    assert second.trace.followup.startswith("joined to the last question: a rewrite would take ~")
    assert second.answer == "保留 7 个每日快照[1]。" and "restic" in second.citations[0].title


def test_a_rewrite_not_ready_within_its_share_is_dropped_and_the_answer_goes_on(answers):
    """A 4 s budget gives the rewrite 1 s; the model takes 3 s before its first word."""
    with FakeOllama() as ollama:
        service = answers(ollama.url, budget=4.0)
        ollama.reply("每天夜里 02:00 用 restic 备份到 USB 硬盘[1]。")
        ask(service, "家里服务器怎么备份的？")
        ollama.reply("restic 备份保留多少个快照？", delay=3.0)  # the rewrite, late
        ollama.reply("保留 7 个每日快照[1]。")
        second = ask(service, "那它保留多少份？")
    assert second.trace.followup == "joined to the last question: the rewrite was not ready within 1.0 s"
    assert second.trace.standalone == "家里服务器怎么备份的？ 那它保留多少份？"
    assert second.answer == "保留 7 个每日快照[1]。"
