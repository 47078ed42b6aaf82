"""Fair shares of the LLM (``rag.answer.fair``): one caller's hundred questions never push
another person's first one behind them, and a token that asks too often is told to wait.

The slots and turns on their own, then a real ``serve`` with a fake LLM as slow as a small
machine: 100 concurrent ``/ask`` from one token, and another person's question meanwhile."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from rag.answer.fair import FairSlots, Turns

from conftest import free_port, unix_http
from fakes.ollama import FakeOllama

EXE = str(Path(sys.executable).with_name("leanote-rag"))
TOKEN_A, TOKEN_B = "tok-a-" + uuid.uuid4().hex, "tok-b-" + uuid.uuid4().hex
FLOOD = 100
A_QUESTION = "番茄炒蛋怎么做才不酸？"
B_QUESTION = "家里路由器自动分给设备的 IP 是从哪到哪？"


# --- the slots and the turns ---------------------------------------------------------------------


def test_the_slots_go_round_the_callers_waiting():
    async def main():
        slots = FairSlots(2)
        order: list[str] = []
        release = asyncio.Event()

        async def call(key: str, i: int):
            async with slots.slot(key):
                order.append(f"{key}{i}")
                await release.wait()

        flood = [asyncio.create_task(call("a", i)) for i in range(50)]
        await asyncio.sleep(0)
        assert order == ["a0", "a1"] and slots.waiting() == 48
        other = asyncio.create_task(call("b", 0))
        late = asyncio.create_task(call("c", 0))
        await asyncio.sleep(0)
        release.set()  # every call ends as soon as it starts: the order is the slots' order
        await asyncio.gather(*flood, other, late)
        # b and c waited for one of a's at most: the slot after a's next one, in the round
        assert order[:6] == ["a0", "a1", "a2", "b0", "c0", "a3"]
        assert slots.busy == 0 and slots.waiting() == 0

    asyncio.run(main())


def test_a_caller_cancelled_while_waiting_gives_its_place_back():
    async def main():
        slots = FairSlots(1)
        gate = asyncio.Event()

        async def hold():
            async with slots.slot("a"):
                await gate.wait()

        first = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiting = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        gate.set()
        await first
        assert slots.busy == 0 and slots.waiting() == 0
        async with slots.slot("b"):  # the slot is free again
            assert slots.busy == 1

    asyncio.run(main())


def test_each_caller_has_at_most_n_answers_under_way():
    async def main():
        turns = Turns(lambda: 2)
        inside: dict[str, int] = {"a": 0, "b": 0}
        most: dict[str, int] = {"a": 0, "b": 0}

        async def answer(key: str):
            async with turns.turn(key):
                inside[key] += 1
                most[key] = max(most[key], inside[key])
                await asyncio.sleep(0.01)
                inside[key] -= 1

        await asyncio.gather(*[answer("a") for _ in range(20)], answer("b"))
        assert most == {"a": 2, "b": 1}
        assert not turns._held  # forgotten once nobody asks

    asyncio.run(main())


# --- a real serve ----------------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path, notes_dir):
    """A ``serve`` over the sample notes with two tokens, and a fake LLM that reads 4,000 tokens
    and writes 20 a second (an answer takes about half a second)."""
    with FakeOllama(speed=(4000.0, 20.0)) as ollama:
        sock = Path(f"/tmp/lr-fair-{uuid.uuid4().hex[:8]}.sock")
        port = free_port()
        config = tmp_path / "config.yaml"
        rate = "{rate}"
        text = (f"source: {{kind: files, path: '{notes_dir}'}}\nstate_dir: data\n"
                f"ollama: {{host: '{ollama.url}'}}\nrerank: {{kind: none}}\nretrieval: {{expand: 'off'}}\n"
                f"memory: {{llm: 'off'}}\nsync: {{interval: 1h}}\n"
                f"api:\n  socket: '{sock}'\n  listen: '127.0.0.1:{port}'\n  max_connections: 300\n"
                f"  rate_limit: {rate}\n"
                f"  tokens: [{{token_env: LR_TOKEN_A, users: [local]}}, {{token_env: LR_TOKEN_B, users: [local]}}]\n")
        env = {**os.environ, "LR_TOKEN_A": TOKEN_A, "LR_TOKEN_B": TOKEN_B}
        env.pop("NOTIFY_SOCKET", None)
        procs: list[subprocess.Popen] = []

        def start(rate_limit: int) -> str:
            config.write_text(text.replace(rate, str(rate_limit)))
            assert subprocess.run([EXE, "--config", str(config), "index"], env=env, capture_output=True,
                                  timeout=300).returncode == 0
            proc = subprocess.Popen([EXE, "--config", str(config), "serve"], env=env, stdout=subprocess.DEVNULL,
                                    stderr=(tmp_path / "serve.log").open("w"))
            procs.append(proc)
            deadline = time.monotonic() + 120
            with unix_http(sock) as http:
                while time.monotonic() < deadline:
                    assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                    try:
                        reply = http.get("/health", timeout=5)
                        if reply.status_code == 200 and reply.json()["passes"] >= 1:
                            return f"http://127.0.0.1:{port}"
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.1)
            raise AssertionError("serve did not become ready")

        yield start, ollama, sock
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        sock.unlink(missing_ok=True)


async def ask(http: httpx.AsyncClient, token: str, question: str) -> tuple[float, dict]:
    """Seconds until the answer event, and the answer."""
    started = time.monotonic()
    async with http.stream("POST", "/ask", json={"question": question},
                           headers={"Authorization": f"Bearer {token}"}) as reply:
        assert reply.status_code == 200, await reply.aread()
        events = [json.loads(line) async for line in reply.aiter_lines() if line]
    assert events[-1]["event"] == "answer", events[-1]
    return time.monotonic() - started, events[-1]["answer"]


def asked(body: dict) -> str:
    return "\n".join(m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user")


@pytest.mark.slow
def test_a_hundred_questions_from_one_token_do_not_hold_another_persons_answer(served):
    start, ollama, _ = served
    url = start(rate_limit=1000)

    async def main():
        limits = httpx.Limits(max_connections=FLOOD + 10, max_keepalive_connections=FLOOD + 10)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
            one, _ = await ask(http, TOKEN_A, A_QUESTION)  # an answer's time here, alone
            usual, _ = await ask(http, TOKEN_B, B_QUESTION)  # the other person's usual time
            flood = [asyncio.create_task(ask(http, TOKEN_A, A_QUESTION)) for _ in range(FLOOD)]
            before = len(ollama.chats())

            async def busy():
                while sum(A_QUESTION in asked(c) for c in ollama.chats()[before:]) < 2:
                    await asyncio.sleep(0.02)

            await asyncio.wait_for(busy(), 120)  # both LLM slots are writing A's answers
            sent_at = len(ollama.chats())
            took, answer = await ask(http, TOKEN_B, B_QUESTION)
            chats = ollama.chats()
            mine = next(i for i in range(sent_at, len(chats)) if B_QUESTION in asked(chats[i]))
            ahead = sum(A_QUESTION in asked(c) for c in chats[sent_at:mine])
            waiting = sum(not t.done() for t in flood)
            for t in flood:
                t.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
            return one, usual, took, ahead, waiting

    one, usual, took, ahead, waiting = asyncio.run(main())
    print(f"one answer {one:.2f} s, B alone {usual:.2f} s, B during the flood {took:.2f} s, "
          f"A's answers started ahead of B's: {ahead}, A's still waiting: {waiting}")
    assert waiting >= FLOOD // 2  # the flood was still there when B had its answer
    assert ahead <= 1  # B's question went to the LLM after at most one more of A's
    assert took <= usual + one + 3.0, (took, usual, one)  # its usual time and one answer (on a busy machine)


@pytest.mark.slow
def test_a_token_that_asks_too_often_is_told_to_wait_and_the_others_are_not(served):
    start, ollama, sock = served
    url = start(rate_limit=3)
    a = {"Authorization": f"Bearer {TOKEN_A}"}
    b = {"Authorization": f"Bearer {TOKEN_B}"}
    with httpx.Client(base_url=url, timeout=120) as http:
        for _ in range(2):
            assert http.get("/search", params={"q": "番茄炒蛋"}, headers=a).status_code == 200
        ollama.reply("加一小勺糖[1]。")
        with http.stream("POST", "/ask", json={"question": A_QUESTION}, headers=a) as reply:
            assert reply.status_code == 200
            reply.read()
        chats = len(ollama.chats())
        refused = http.post("/ask", json={"question": A_QUESTION}, headers=a)
        assert refused.status_code == 429 and refused.json()["kind"] == "unavailable"
        assert "api.rate_limit" in refused.json()["error"] and int(refused.headers["retry-after"]) >= 1
        assert http.get("/search", params={"q": "番茄炒蛋"}, headers=a).status_code == 429
        assert len(ollama.chats()) == chats  # refused before any work
        assert http.get("/search", params={"q": "番茄炒蛋"}, headers=b).status_code == 200  # per token
    with unix_http(sock, timeout=60) as local:
        for _ in range(5):  # the socket is the owner's: not counted
            assert local.get("/search", params={"q": "番茄炒蛋"}).status_code == 200
