"""No request can jam the door: size limits at every door before any work (the API's 413,
the CLI's exit 2, the bots cut a long message and say so), every step bounded in what it
reads, a search held up for one person leaves the others' answers alone, rate limits on
every bot command that searches. The real daemon (its API on a Unix socket, the Telegram
bot against the fake Bot API), the real index and memory over the sample notes."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from bot.telegram import service as telegram
from rag.index.note_index import NoteIndex
from rag.limits import cut
from rag.memory.schema import MATCH_CHARS
from rag.memory.store import MemoryStore
from bot.serve import Daemon
from bot.root import Parts

from conftest import EXAMPLES, SCENARIO, make_settings, run_pass, unix_ahttp, until, within
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram

OWNER, FRIEND, GROUP = 111, 222, -100500
EXE = str(Path(sys.executable).with_name("leanote-rag"))
LONG = "番茄炒蛋怎么做才不酸？" + "请详细说明。" * 500  # 3,011 characters: over limits.question_chars (2,000)


@pytest.fixture
def world(tmp_path, monkeypatch):
    """Settings for the daemon over the sample notes: the API on a short socket path, the
    Telegram bot on a fake Bot API, a fake Ollama; and those fakes."""
    monkeypatch.setenv("LR_TG_TOKEN", "123:TEST")
    sock = Path(f"/tmp/lr-doors-{uuid.uuid4().hex[:8]}.sock")
    with FakeTelegram() as tg, FakeOllama() as ollama:
        def settings(**sections):
            base = dict(
                telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url, "edit_interval": 0.3},
                users=[{"leanote_user_id": "local", "telegram_ids": [OWNER], "admin": True},
                       {"leanote_user_id": "local", "telegram_ids": [FRIEND]}],
                ollama={"host": ollama.url}, rerank={"kind": "none"}, retrieval={"expand": "off"},
                sync={"interval": "1h"}, api={"socket": str(sock)},
            )
            return make_settings(tmp_path, **{**base, **sections})

        yield settings, tg, ollama
    sock.unlink(missing_ok=True)


def run(settings, scenario, services=(telegram,)):
    """``scenario(daemon)`` inside the running daemon, once its first pass is done (and the
    bot polls)."""
    async def main():
        daemon = Daemon(settings, services=list(services))
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(lambda: settings.api.socket.exists(), what="the API's socket")
            await within(scenario(daemon), "the scenario", SCENARIO)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())


def api(settings) -> httpx.AsyncClient:
    return unix_ahttp(settings.api.socket, base_url="http://leanote-rag", timeout=60)


async def raw_exchange(path: Path, head: bytes, body_parts) -> tuple[int, dict]:
    """Send a request's head and then ``body_parts`` one by one, not ending the body, and
    read the response: it must come while the body is still unfinished."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        try:
            writer.write(head)
            for part in body_parts:
                writer.write(part)
                await writer.drain()
        except ConnectionError:  # the server refused and closed: its answer is still there to read
            pass
        status_line = await asyncio.wait_for(reader.readline(), timeout=60)
        headers = {}
        while (line := await asyncio.wait_for(reader.readline(), timeout=60)) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout=60)
        return int(status_line.split()[1]), json.loads(body)
    finally:
        writer.close()


# --- the API ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_api_refuses_an_oversized_body_before_reading_it_and_a_long_question_before_any_work(world):
    settings, tg, ollama = world
    settings = settings()

    async def scenario(daemon):
        # A 20 MB body announced by Content-Length: refused after its first kilobyte arrived.
        head = (b"POST /ask HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 20000000\r\n\r\n")
        status, body = await raw_exchange(settings.api.socket, head, [b'{"question": "' + b"a" * 1024])
        assert status == 413 and body["kind"] == "user" and "limits.request_kb" in body["error"]
        # ... and one sent in chunks, without a length: refused once past the limit (64 KB).
        head = (b"POST /ask HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"a" * 16384
        parts = [b'4000\r\n' + chunk + b"\r\n" for _ in range(6)]  # 96 KB, and no last chunk
        status, body = await raw_exchange(settings.api.socket, head, parts)
        assert status == 413 and "limits.request_kb" in body["error"]

        async with api(settings) as http:
            # A question over limits.question_chars: 413 before any work (no search, no LLM).
            reply = await http.post("/ask", json={"question": LONG})
            assert reply.status_code == 413 and reply.json()["kind"] == "user"
            assert "limits.question_chars" in reply.json()["error"] and "3,011" in reply.json()["error"]
            for path, params in (("/search", {"q": LONG}), ("/memory/find", {"q": LONG}),
                                 ("/memory/entity", {"name": LONG})):
                reply = await http.get(path, params=params)
                assert reply.status_code == 413 and "limits.question_chars" in reply.json()["error"], path
            assert ollama.chats() == []
            # A query of the most it may hold, 2,000 CJK characters (18 KB percent-encoded), is served.
            reply = await http.get("/search", params={"q": "番茄炒蛋" * 500})
            assert reply.status_code == 200 and reply.json()["hits"]
            ollama.reply("先把鸡蛋炒好盛出[1]。")
            async with http.stream("POST", "/ask", json={"question": "番茄炒蛋怎么做才不酸？"}) as reply:
                events = [json.loads(line) async for line in reply.aiter_lines() if line]
            assert reply.status_code == 200 and events[-1]["event"] == "answer"

    run(settings, scenario, services=())


@pytest.mark.slow
def test_the_cli_refuses_an_oversized_question_with_exit_2(world, tmp_path):
    settings, tg, ollama = world
    config = tmp_path / "config.yaml"
    config.write_text(f"source: {{kind: files, path: '{EXAMPLES}'}}\nstate_dir: data\n"
                      f"ollama: {{host: '{ollama.url}'}}\nrerank: {{kind: none}}\n")
    for args in (("ask", LONG), ("search", LONG), ("related", LONG), ("memory", LONG)):
        out = subprocess.run([EXE, "--config", str(config), *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, (args[0], out.stderr)
        assert "too long: 3,011 characters" in out.stderr and "limits.question_chars" in out.stderr, args[0]
        assert "Traceback" not in out.stderr
    assert ollama.requests == []
    assert not (tmp_path / "data" / "qdrant").exists()  # refused before the index was opened


# --- every step bounded -------------------------------------------------------------------------


def test_every_step_reads_at_most_the_limit_of_a_huge_question(tmp_path, use_embedder):
    """A 3 M-character question through the answer service itself (no door in front): the search,
    the memory, the history and the LLM prompt see at most limits.question_chars of it."""
    with FakeOllama() as ollama:
        settings = make_settings(tmp_path, ollama={"host": ollama.url}, rerank={"kind": "none"},
                                 retrieval={"expand": "off"}, limits={"question_chars": 100})
        run_pass(settings, use_embedder)
        huge = "番茄炒蛋怎么做才不酸？ " * 250_000  # 3 M characters

        async def main():
            with NoteIndex.open(settings, embedder=use_embedder) as index:
                service = Parts(settings, index=index).answers
                try:
                    ollama.reply("先把鸡蛋炒好盛出[1]。")
                    first = await service.ask(huge, "local", conversation="c")
                    ollama.reply("番茄炒蛋怎么做才不酸？")  # the follow-up's rewrite, then its answer
                    ollama.reply("加一小勺糖[1]。")
                    second = await service.ask("那它呢？", "local", conversation="c")  # after the huge turn
                    hits = await service.search(huge, "local", 3)
                finally:
                    service.close()
            return first, second, hits

        first, second, hits = asyncio.run(main())
    assert len(first.trace.question) <= 100 and first.trace.question.startswith("番茄炒蛋怎么做才不酸？")
    assert first.citations and first.citations[0].title == "番茄炒蛋" and hits[0].title == "番茄炒蛋"
    assert second.trace.followup.startswith("rewritten by the LLM")
    for chat in ollama.chats():  # the answer's prompt, the rewrite's (with the history), the second answer's
        assert sum(len(m["content"]) for m in chat["messages"]) < 20_000
        assert max(len(m["content"]) for m in chat["messages"] if m["role"] == "user") < 12_000
    assert second.answer == "加一小勺糖[1]。"


def test_the_memorys_name_matching_reads_a_bounded_part_of_any_text(tmp_path, use_embedder):
    settings = make_settings(tmp_path)
    run_pass(settings, use_embedder)
    with MemoryStore.open_for(settings) as memory:
        near = "怎么看 journalctl 的日志？"
        assert [e["norm"] for e in memory.named_in("local", near) if e["norm"] == "journalctl"]
        far = " ".join(["x"] * MATCH_CHARS) + near  # the name only past what is read
        assert not [e for e in memory.named_in("local", far) if e["norm"] == "journalctl"]
        assert memory.find("local", far)["entities"] == []
        assert memory.facts_named("local", far) == memory.facts_named("local", "x")


def test_cut_reads_no_more_than_it_keeps():
    assert cut("  a \n\t b  ", 10) == ("a b", False)
    assert cut("abc", 3) == ("abc", False) and cut("abcd", 3) == ("abc", True)
    assert cut(" " * 100 + "ab" + " " * 100, 2) == ("ab", False)
    assert cut("ab" + " " * 100 + "c", 2) == ("ab", True)  # past what it read, there was more
    assert cut("", 5) == ("", False) and cut(None, 5) == ("", False) and cut(" \n ", 5) == ("", False)


# --- the search threads ---------------------------------------------------------------------------


def test_a_search_held_up_for_one_request_does_not_hold_another_persons_answer(world):
    """An API question whose search waits on the embedding model (the fake Ollama holds it)
    and, meanwhile, a Telegram question of another person: the second is answered while
    the first is still held; then the first is answered too."""
    settings, tg, ollama = world
    settings = settings(embedder={"kind": "ollama", "host": ollama.url})
    release = ollama.hold_embed("慢一点的问题")

    async def scenario(daemon):
        async with api(settings) as http:
            async def slow():
                body = {"question": "慢一点的问题：红烧肉怎么做？"}
                async with http.stream("POST", "/ask", json=body) as reply:
                    return [json.loads(line) async for line in reply.aiter_lines() if line]

            held = asyncio.create_task(slow())
            await until(lambda: ollama.held, what="the first question's search to be held")
            ollama.reply("先把鸡蛋炒好盛出[1]。")
            tg.say(FRIEND, "番茄炒蛋怎么做才不酸？")
            done = await until(lambda: [m for m in tg.sent_to(FRIEND) if "来源" in m["text"]], timeout=60,
                               what="the other person's answer")
            assert "先把鸡蛋炒好盛出" in done[0]["text"]
            assert not held.done() and ollama.held == ["慢一点的问题"]  # still held
            ollama.reply("大火烧开后转小火，盖上盖子炖 60 分钟[1]。")
            release.set()
            events = await asyncio.wait_for(held, timeout=60)
        assert events[-1]["event"] == "answer" and "炖 60 分钟" in events[-1]["answer"]["answer"]

    run(settings, scenario)


def test_concurrent_answers_find_what_one_at_a_time_finds(tmp_path, use_embedder):
    """The search threads share the index (Qdrant Edge), the embedder and the memory: answers
    asked all at once come out as they do one by one."""
    settings = make_settings(tmp_path, ollama={"enabled": False}, rerank={"kind": "none"})
    run_pass(settings, use_embedder)
    questions = ["番茄炒蛋怎么做才不酸？", "怎么实时看一个服务的日志", "家里路由器的 DHCP 范围是多少？",
                 "pool_size 在事故之后调成了多少？", "restic 备份多久一次", "我写过哪些关于 journalctl 的笔记？",
                 "How do I read systemd journal logs", "短链服务怎么部署"]

    def comparable(answer):
        return (answer.answer, [c.note_id for c in answer.citations], answer.trace.entities,
                [c.point_id for c in answer.trace.candidates])

    async def main():
        with NoteIndex.open(settings, embedder=use_embedder) as index:
            service = Parts(settings, index=index).answers
            try:
                alone = [comparable(await service.ask(q, "local")) for q in questions]
                together = await asyncio.gather(*(service.ask(q, "local") for q in questions * 3))
            finally:
                service.close()
        return alone, [comparable(a) for a in together]

    alone, together = asyncio.run(main())
    assert together == alone * 3


# --- the bots -------------------------------------------------------------------------------------


def final(tg, chat, containing):
    return [m for m in tg.sent_to(chat) if containing in m["text"]]


def test_telegram_cuts_a_long_message_says_so_and_reads_only_the_cut(world):
    settings, tg, ollama = world
    settings = settings()

    async def scenario(daemon):
        ollama.reply("先把鸡蛋炒好盛出[1]。")
        tg.say(OWNER, LONG)
        done = await until(lambda: final(tg, OWNER, "来源"))
        assert "只读了前 2000 个字符" in done[0]["text"]
        [chat] = ollama.chats()
        question = chat["messages"][-1]["content"].rsplit("问题：", 1)[1]
        assert question.startswith("番茄炒蛋怎么做才不酸？") and len(question) <= 2000
        tg.say(OWNER, "/search " + LONG)
        hits = await until(lambda: final(tg, OWNER, "番茄炒蛋  "))
        assert "只读了前 2000 个字符" in hits[0]["text"]

    run(settings, scenario)


def test_every_telegram_command_that_searches_counts_against_the_persons_rate_limit(world):
    settings, tg, ollama = world
    settings = settings(bots={"rate_limit": 3})

    async def scenario(daemon):
        for text in ("/search 番茄", "/about journalctl", "/related 番茄炒蛋怎么做", "/search 红烧肉"):
            tg.say(OWNER, text)
            await until(lambda: len(tg.sent_to(OWNER)) == len([t for t in tg.updates if t["message"]["from"]["id"]
                                                                == OWNER]), what=f"the reply to {text}")
        replies = [m["text"] for m in tg.sent_to(OWNER)]
        assert "questions a minute" not in "".join(replies[:3]) and "questions a minute" in replies[3]
        tg.say(OWNER, "番茄炒蛋怎么做？")  # a question counts in the same minute
        await until(lambda: len(final(tg, OWNER, "questions a minute")) == 2)
        tg.say(FRIEND, "/search 红烧肉")  # another person's minute is their own
        await until(lambda: final(tg, FRIEND, "红烧肉（妈妈的做法）"))
        assert ollama.chats() == []

    run(settings, scenario)


def test_a_blank_telegram_message_gets_a_short_reply_and_no_error(world, caplog):
    settings, tg, ollama = world
    settings = settings(telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url,
                                  "allowed_chats": [GROUP]})

    async def scenario(daemon):
        tg.say(OWNER, "   \n  ")
        tg.say(FRIEND, "@notes_bot", chat_id=GROUP, chat_type="supergroup")
        await until(lambda: final(tg, OWNER, "Please write a question") and final(tg, GROUP, "Please write a question"))

    run(settings, scenario)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not final(tg, OWNER, "Sorry") and ollama.chats() == []


def test_the_fallback_without_the_llm_shows_passages_readably(world):
    """Ollama down: the best passages, each under its note's title, with no Markdown
    marks of the note's own heading in front (``[1] # title``)."""
    settings, tg, ollama = world
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    settings = settings(ollama={"host": f"http://127.0.0.1:{port}", "connect_retries": 0})

    async def scenario(daemon):
        tg.say(OWNER, "How do I read systemd journal logs")
        done = await until(lambda: final(tg, OWNER, "unavailable"), timeout=60)
        text = done[0]["text"]
        assert text.startswith("[1] Reading systemd journal logs\n") and "journalctl" in text
        assert "[1] #" not in text and not re.search(r"^#+ ", text, re.M)  # headings rendered, as <b>

    run(settings, scenario)


# --- related QUESTION -----------------------------------------------------------------------------


def test_related_to_a_question_scores_on_the_pairs_scale_and_leaves_out_the_weak(tmp_path, capsys, use_embedder):
    from bot.cli import main
    from rag.memory.related import ENTITY_WEIGHT

    settings = make_settings(tmp_path)
    run_pass(settings, use_embedder)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"source: {{kind: files, path: '{EXAMPLES}'}}\nstate_dir: {settings.state_dir}\n")

    assert main(["--config", str(cfg), "search", "番茄炒蛋怎么做", "--json", "-k", "10"]) == 0
    found = {h["note_id"] for h in json.loads(capsys.readouterr().out)["hits"]}
    assert main(["--config", str(cfg), "related", "番茄炒蛋怎么做", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert notes and notes[0]["title"] == "番茄炒蛋" and len(notes) < len(found)  # not every note search found
    for n in notes:  # a similarity (a cosine, plus shared rare entities), never a rank's 2.0, 1.5, 1.33...
        assert settings.related_question_min_score() <= n["score"] <= 1 + ENTITY_WEIGHT, n
        assert n["reasons"]["search"] >= 1 and 0 < n["reasons"]["similarity"] <= 1
    assert main(["--config", str(cfg), "related", "量子计算机的原理是什么"]) == 0
    assert "no notes related to the question" in capsys.readouterr().out


# --- Discord ----------------------------------------------------------------------------------------


def test_discord_cuts_a_long_question_and_rate_limits_every_command_that_searches(world):
    from test_discord import FakeInteraction, run as run_discord

    settings, tg, ollama = world
    ONE, TWO = 3001, 3002
    settings = settings(discord={"enabled": True}, telegram={"enabled": False}, bots={"rate_limit": 4},
                        users=[{"leanote_user_id": "local", "discord_ids": [ONE, TWO]}])

    async def scenario(daemon, bot, command):
        ollama.reply("先把鸡蛋炒好盛出[1]。")
        it = FakeInteraction(ONE)
        await command("ask")(it, question=LONG)
        shown = it.events[-1][1]["embed"].description
        assert "先把鸡蛋炒好盛出" in shown and "只读了前 2000 个字符" in shown
        question = ollama.chats()[-1]["messages"][-1]["content"].rsplit("问题：", 1)[1]
        assert question.startswith("番茄炒蛋怎么做才不酸？") and len(question) <= 2000
        it = FakeInteraction(ONE)
        await command("search")(it, query=LONG)
        assert "只读了前 2000 个字符" in it.events[-1][1]["content"]
        await command("about")(FakeInteraction(ONE), name="journalctl")
        await command("related")(FakeInteraction(ONE), target="番茄炒蛋怎么做")
        for name, options in (("search", {"query": "红烧肉"}), ("about", {"name": "journalctl"}),
                              ("related", {"target": "番茄"}), ("ask", {"question": "番茄炒蛋怎么做？"})):
            it = FakeInteraction(ONE)  # the fifth within the minute, whichever command: refused before any work
            await command(name)(it, **options)
            assert it.names() == ["send_message"] and "questions a minute" in it.events[0][1]["content"], name
            assert it.events[0][1]["ephemeral"] is True
        it = FakeInteraction(TWO)  # another person's minute is their own
        await command("search")(it, query="红烧肉")
        assert "红烧肉（妈妈的做法）" in it.events[-1][1]["content"]
        assert len(ollama.chats()) == 1

    run_discord(settings, scenario)
