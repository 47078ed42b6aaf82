"""Prometheus metrics: a real SyncService over the sample notes and a real AnswerService
with a fake Ollama feed a ``Metrics``; what a scraper would read is parsed back from
the exposition with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from discord import app_commands

from bot.discord import build as discord_bot
from bot.telegram import service as telegram_service
from rag.answer.service import AnswerService
from rag.index.note_index import NoteIndex
from rag.llm import OllamaChat
from bot.api.metrics import attach_metrics, Metrics, StateSnapshot, UserCounts
from bot.serve import Daemon
from sync.state import State
from bot.root import Parts

from conftest import SCENARIO, free_port, make_settings, within
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram
from test_discord import CHANNEL, GUILD, OWNER, ROLE, FakeInteraction

SAMPLE_NOTES = 15  # 13 files in examples/notes; the .leanote export holds two
NOW = 1_700_000_000.0
REFUSAL = "我笔记里没有相关内容"


def scrape(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    """Every sample of the exposition, as a scraper parses it: (name, sorted labels) -> value."""
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))



# --- sync passes and answers over the sample notes --------------------------------------------

@pytest.fixture
def ollama():
    with FakeOllama() as fake:
        yield fake


@pytest.fixture
def served(tmp_path, use_embedder, ollama):
    """What ``serve`` holds: one index, a sync service and an answer service over it, and
    the metrics attached to them."""
    settings = make_settings(tmp_path, ollama={"host": ollama.url, "stall_timeout": 1.0, "timeout": 10.0},
                             answer={"first_token_budget": 5.0}, rerank={"kind": "none"})
    state = State(settings.state_dir)
    index = NoteIndex.open(settings, create=True, embedder=use_embedder)
    parts = Parts(settings, index=index, state=state, clock=lambda: NOW)
    sync, answers = parts.sync, parts.answers
    metrics = Metrics()
    attach_metrics(metrics, parts)
    yield settings, sync, answers, metrics
    parts.close()
    index.close()
    state.close()


def ask(service: AnswerService, question: str):
    return asyncio.run(service.ask(question, "local"))


def test_a_pass_moves_the_pass_counters_and_the_state_reports_the_account(served):
    settings, sync, _, metrics = served
    before = scrape(metrics)
    assert value(before, "leanote_rag_sync_passes_total", outcome="ok") == 0
    assert value(before, "leanote_rag_state_readable") == 1
    assert value(before, "leanote_rag_account_notes_indexed", source=sync.source.name,
                 account=sync.source.name) is None  # no account before the first pass

    result = sync.run_pass()
    assert result.ok and result.summary.added == SAMPLE_NOTES
    after = scrape(metrics)
    assert value(after, "leanote_rag_sync_passes_total", outcome="ok") == 1
    assert value(after, "leanote_rag_sync_passes_total", outcome="failed") == 0
    assert value(after, "leanote_rag_sync_pass_duration_seconds_count") == 1
    assert value(after, "leanote_rag_sync_pass_duration_seconds_sum") == pytest.approx(result.seconds)
    assert value(after, "leanote_rag_sync_notes_total", change="added") == SAMPLE_NOTES
    assert value(after, "leanote_rag_sync_notes_total", change="deleted") == 0
    embedded = value(after, "leanote_rag_sync_chunks_embedded_total")
    assert embedded == result.summary.chunks_embedded > 0

    account = {"source": sync.source.name, "account": sync.source.name}  # a snapshot source: one account
    assert value(after, "leanote_rag_account_notes_indexed", **account) == SAMPLE_NOTES
    assert value(after, "leanote_rag_account_failing", **account) == 0
    assert value(after, "leanote_rag_account_last_success_timestamp_seconds", **account) == NOW
    assert value(after, "leanote_rag_account_notes_skipped", **account) == 0
    assert value(after, "leanote_rag_account_lag_usn", **account) is None  # files have no USN
    assert value(after, "leanote_rag_account_failing_since_timestamp_seconds", **account) is None
    assert value(after, "leanote_rag_user_notes_indexed", user_id="local") == SAMPLE_NOTES
    # chunks as the index itself counts them
    assert value(after, "leanote_rag_user_chunks_indexed", user_id="local") == sync.index.store.count_by_user()["local"]
    assert value(after, "process_resident_memory_bytes") > 0  # the process collector, on our registry

    # an idle pass: counted, nothing added
    sync.run_pass()
    again = scrape(metrics)
    assert value(again, "leanote_rag_sync_passes_total", outcome="ok") == 2
    assert value(again, "leanote_rag_sync_notes_total", change="added") == SAMPLE_NOTES
    assert value(again, "leanote_rag_sync_chunks_embedded_total") == embedded


def test_each_answer_is_counted_by_outcome_with_its_stage_durations(served, ollama, use_embedder):
    settings, sync, answers, metrics = served
    sync.run_pass()
    assert value(scrape(metrics), "leanote_rag_answer_stage_duration_seconds_count", stage="total") is None

    ollama.reply("先把鸡蛋炒好盛出[1]，再加一小勺糖[3]。")
    answer = ask(answers, "番茄炒蛋怎么做才不酸？")
    assert answer.used_llm and answer.grounded and answer.trace.outcome == "llm"
    s = scrape(metrics)
    assert value(s, "leanote_rag_answers_total", outcome="llm") == 1
    assert sum(value(s, "leanote_rag_answers_total", outcome=o) for o in ("llm_passages", "refused", "fallback",
                                                                          "extractive")) == 0
    for stage in ("retrieve", "first_token", "total"):
        assert value(s, "leanote_rag_answer_stage_duration_seconds_count", stage=stage) == 1
    assert value(s, "leanote_rag_answer_stage_duration_seconds_count", stage="rerank") is None  # no reranker
    assert value(s, "leanote_rag_answer_stage_duration_seconds_sum", stage="total") == pytest.approx(
        answer.timings_ms["total"] / 1000)
    t = answer.timings_ms  # each stage's own time: from the previous milestone
    assert value(s, "leanote_rag_answer_stage_duration_seconds_sum", stage="first_token") == pytest.approx(
        (t["first_token"] - t["retrieve"]) / 1000)

    ollama.reply(REFUSAL)
    assert ask(answers, "红烧肉用了几克冰糖和什么酒？").trace.outcome == "llm_passages"
    chats = len(ollama.chats())
    refused = ask(answers, "who won the football world cup in 1998?")  # nothing plausible: no LLM call
    assert not refused.used_llm and len(ollama.chats()) == chats
    s = scrape(metrics)
    assert value(s, "leanote_rag_answers_total", outcome="llm_passages") == 1
    assert value(s, "leanote_rag_answers_total", outcome="refused") == 1
    assert value(s, "leanote_rag_answer_stage_duration_seconds_count", stage="total") == 3

    # Ollama down: passages instead, counted as a fallback, on the same metrics
    cfg = settings.ollama.model_copy(update={"host": f"http://127.0.0.1:{free_port()}", "connect_retries": 1})
    down = AnswerService(settings, sync.index, chat=OllamaChat(cfg))
    down.observers.append(metrics.observe_answer)
    try:
        fell_back = ask(down, "家里路由器的 DHCP 地址池是多少？")
    finally:
        down.close()
    assert not fell_back.used_llm and fell_back.grounded and fell_back.trace.outcome == "fallback"
    # no LLM configured: extractive
    plain = AnswerService(settings, sync.index, chat=None)
    plain.observers.append(metrics.observe_answer)
    try:
        assert ask(plain, "番茄炒蛋怎么做才不酸？").trace.outcome == "extractive"
    finally:
        plain.close()
    s = scrape(metrics)
    assert [value(s, "leanote_rag_answers_total", outcome=o)
            for o in ("llm", "llm_passages", "refused", "fallback", "extractive")] == [1, 1, 1, 1, 1]


def test_an_observer_that_raises_breaks_neither_a_pass_nor_an_answer(served, ollama, caplog):
    settings, sync, answers, metrics = served

    def broken(_):
        raise RuntimeError("observer bug")

    sync.observers.insert(0, broken)
    answers.observers.insert(0, broken)
    with caplog.at_level(logging.ERROR):
        result = sync.run_pass()
        ollama.reply("先炒蛋[1]。")
        answer = ask(answers, "番茄炒蛋怎么做才不酸？")
    assert result.ok and result.summary.added == SAMPLE_NOTES
    assert answer.grounded and answer.answer == "先炒蛋[1]。"
    failures = [r for r in caplog.records if "observer failed" in r.getMessage()]
    assert len(failures) == 2 and all("observer bug" in r.exc_text for r in failures)
    s = scrape(metrics)  # the observers after the broken one still ran
    assert value(s, "leanote_rag_sync_passes_total", outcome="ok") == 1
    assert value(s, "leanote_rag_answers_total", outcome="llm") == 1


def test_a_state_that_cannot_be_read_still_gives_the_other_metrics(caplog):
    metrics = Metrics()

    def unreadable():
        raise OSError("database is locked")

    metrics.add_state_collector(unreadable)
    with caplog.at_level(logging.WARNING):
        first, second = scrape(metrics), scrape(metrics)
    assert value(first, "leanote_rag_state_readable") == value(second, "leanote_rag_state_readable") == 0
    assert value(first, "leanote_rag_sync_passes_total", outcome="ok") == 0
    assert len([r for r in caplog.records if "cannot read the sync state" in r.getMessage()]) == 1  # once
    metrics.add_state_collector(lambda: StateSnapshot(users=[UserCounts("u1", 3, 7)]))  # reopened: replaced
    s = scrape(metrics)
    assert value(s, "leanote_rag_state_readable") == 1
    assert value(s, "leanote_rag_user_chunks_indexed", user_id="u1") == 7


# --- an account that fails ---------------------------------------------------------------------

ALICE = "5dbed2987db161bc2a85b919"
WORK, PROJ = "5e16ca22f6ffdbad5b4ba501", "5e16ca22f6ffdbad5b4ba502"


def test_a_failing_account_reports_its_lag_and_failure_until_it_recovers(tmp_path, monkeypatch, use_embedder):
    monkeypatch.setenv("LR_PW_ALICE", "alice-pw")
    clock = [NOW]
    with FakeLeanote() as leanote:
        leanote.add_user(ALICE, "alice@example.com", "alice-pw")
        leanote.put_notebook({"NotebookId": WORK, "UserId": ALICE, "Title": "工作"})
        leanote.put_note({"NoteId": "6" + "0" * 22 + "1", "UserId": ALICE, "NotebookId": WORK, "Title": "发布",
                          "Content": "灰度发布先放 5% 流量。"})
        settings = make_settings(
            tmp_path, leanote={"base_url": leanote.url},
            source={"kind": "leanote_api", "path": None,
                    "accounts": [{"email": "alice@example.com", "password_env": "LR_PW_ALICE"}]},
            sync={"http_timeout": 2},
        )
        state = State(settings.state_dir)
        index = NoteIndex.open(settings, create=True, embedder=use_embedder)
        parts = Parts(settings, index=index, state=state, clock=lambda: clock[0], rng=lambda: 0.5)
        sync = parts.sync
        metrics = Metrics(process=False)
        attach_metrics(metrics, parts)
        account = {"source": sync.source.name, "account": "alice@example.com"}
        try:
            assert sync.run_pass().ok
            s = scrape(metrics)
            assert value(s, "leanote_rag_account_lag_usn", **account) == 0
            assert value(s, "leanote_rag_account_failing", **account) == 0
            assert value(s, "leanote_rag_account_notes_indexed", **account) == 1
            assert value(s, "leanote_rag_user_notes_indexed", user_id=ALICE) == 1

            # a notebook and two notes arrive; the notes cannot be listed (HTTP 500)
            leanote.put_notebook({"NotebookId": PROJ, "UserId": ALICE, "Title": "项目"})
            for i in (2, 3):
                leanote.put_note({"NoteId": "6" + "0" * 22 + str(i), "UserId": ALICE, "NotebookId": PROJ,
                                  "Title": f"笔记{i}", "Content": "内容"})
            leanote.fail("note/getSyncNotes", times=100)
            clock[0] = NOW + 600
            failed = sync.run_pass()
            assert "alice@example.com" in failed.failures
            s = scrape(metrics)
            assert value(s, "leanote_rag_sync_passes_total", outcome="failed") == 1
            assert value(s, "leanote_rag_account_lag_usn", **account) == 2  # the two notes not read
            assert value(s, "leanote_rag_account_failing", **account) == 1
            assert value(s, "leanote_rag_account_failing_since_timestamp_seconds", **account) == NOW + 600
            assert value(s, "leanote_rag_account_last_error_timestamp_seconds", **account) == NOW + 600
            assert value(s, "leanote_rag_account_last_success_timestamp_seconds", **account) == NOW

            leanote.fail("note/getSyncNotes", times=0)
            clock[0] = NOW + 1200
            assert sync.run_pass(force=True).ok
            s = scrape(metrics)
            assert value(s, "leanote_rag_account_lag_usn", **account) == 0
            assert value(s, "leanote_rag_account_failing", **account) == 0
            assert value(s, "leanote_rag_account_failing_since_timestamp_seconds", **account) is None
            assert value(s, "leanote_rag_account_notes_indexed", **account) == 3
        finally:
            index.close()
            state.close()


def test_an_account_that_was_never_reached_is_failing_without_a_lag(tmp_path, monkeypatch, use_embedder):
    monkeypatch.setenv("LR_PW_ALICE", "alice-pw")
    settings = make_settings(
        tmp_path, leanote={"base_url": f"http://127.0.0.1:{free_port()}"},
        source={"kind": "leanote_api", "path": None,
                "accounts": [{"email": "alice@example.com", "password_env": "LR_PW_ALICE"}]},
        sync={"http_timeout": 2},
    )
    state = State(settings.state_dir)
    index = NoteIndex.open(settings, create=True, embedder=use_embedder)
    try:
        parts = Parts(settings, index=index, state=state, clock=lambda: NOW)
        sync = parts.sync
        metrics = Metrics(process=False)
        attach_metrics(metrics, parts)
        assert not sync.run_pass().ok
        s = scrape(metrics)
        account = {"source": sync.source.name, "account": "alice@example.com"}
        assert value(s, "leanote_rag_account_failing", **account) == 1
        assert value(s, "leanote_rag_account_lag_usn", **account) is None  # the server's USN is unknown
        assert value(s, "leanote_rag_account_last_success_timestamp_seconds", **account) is None
        assert value(s, "leanote_rag_sync_passes_total", outcome="failed") == 1
    finally:
        index.close()
        state.close()


# --- the bots' error counter -------------------------------------------------------------------

def break_search(daemon):
    def broken(*args, **kwargs):  # the index fails in the middle of a search
        raise RuntimeError("segment file vanished")

    daemon.index.store.search = broken


def test_discord_counts_errors_while_answering_and_searching(tmp_path):
    """The bot reads ``host.metrics`` when an error happens; a host without one counts nothing."""
    with FakeOllama() as ollama:
        settings = make_settings(
            tmp_path, discord={"enabled": True, "guild_ids": [GUILD], "channel_ids": [CHANNEL], "role_ids": [ROLE]},
            users=[{"leanote_user_id": "local", "discord_ids": [OWNER], "admin": True}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, sync={"interval": "1h"},
        )

        async def main():
            daemon = Daemon(settings, services=[])
            task = asyncio.create_task(daemon.run())
            try:
                await within(daemon.wait_for_pass(0), "the daemon's first pass")
                bot = discord_bot(daemon)
                daemon.metrics = None  # a host without metrics: the error path still answers
                break_search(daemon)
                command = {name: bot.tree.get_command(name).callback for name in ("ask", "search")}
                it = FakeInteraction(OWNER)
                await command["ask"](it, question="番茄炒蛋怎么做？")
                assert it.events[-1][0] == "followup" and "Sorry" in it.events[-1][1]["content"]
                daemon.metrics = metrics = Metrics(process=False)
                it = FakeInteraction(OWNER)
                await command["ask"](it, question="番茄炒蛋怎么做？")
                assert "Sorry" in it.events[-1][1]["content"]
                it = FakeInteraction(OWNER)
                try:  # the command raises; discord.py hands it to the tree's error handler, as here
                    await command["search"](it, query="番茄")
                except RuntimeError as err:
                    await bot.tree.on_error(it, app_commands.CommandInvokeError(bot.tree.get_command("search"), err))
                assert "Sorry" in it.events[-1][1]["content"]
                s = scrape(metrics)
                assert value(s, "leanote_rag_bot_errors_total", platform="discord") == 2
                assert value(s, "leanote_rag_bot_errors_total", platform="telegram") == 0
            finally:
                daemon.stop()
                await asyncio.wait_for(task, timeout=30)

        asyncio.run(within(main(), "the scenario", SCENARIO))


def test_telegram_errors_are_counted_on_the_daemons_metrics(tmp_path, monkeypatch):
    """NEEDS THE DAEMON WIRING (``Daemon.open`` creating ``self.metrics`` and attaching it):
    the real daemon, its real Telegram bot against a fake Bot API, scraped through
    ``daemon.metrics``: a pass counted, the state reported, the bot's errors counted."""
    monkeypatch.setenv("LR_TG_TOKEN", "123:TEST")
    owner = 111
    with FakeTelegram() as tg, FakeOllama() as ollama:
        settings = make_settings(
            tmp_path, telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url},
            users=[{"leanote_user_id": "local", "telegram_ids": [owner], "admin": True}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, sync={"interval": "1h"},
        )

        async def until(check, timeout=30.0):
            for _ in range(int(timeout / 0.05)):
                if check():
                    return
                await asyncio.sleep(0.05)
            raise AssertionError("timed out")

        def sorry():
            return [m for m in tg.sent_to(owner) if "Sorry, something went wrong" in m["text"]]

        async def main():
            daemon = Daemon(settings, services=[telegram_service])
            task = asyncio.create_task(daemon.run())
            try:
                await within(daemon.wait_for_pass(0), "the daemon's first pass")
                await until(lambda: tg.method_calls("getUpdates"))
                metrics = daemon.metrics
                s = scrape(metrics)
                assert value(s, "leanote_rag_sync_passes_total", outcome="ok") == 1
                assert value(s, "leanote_rag_user_notes_indexed", user_id="local") == SAMPLE_NOTES
                break_search(daemon)
                tg.say(owner, "番茄炒蛋怎么做？")
                await until(lambda: len(sorry()) == 1)
                tg.say(owner, "/search 番茄")
                await until(lambda: len(sorry()) == 2)
                s = scrape(metrics)
                assert value(s, "leanote_rag_bot_errors_total", platform="telegram") == 2
                assert value(s, "leanote_rag_bot_errors_total", platform="discord") == 0
            finally:
                daemon.stop()
                await asyncio.wait_for(task, timeout=30)

        asyncio.run(within(main(), "the scenario", SCENARIO))
