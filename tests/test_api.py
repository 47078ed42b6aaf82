"""The running daemon is the one door: a real `serve` process, and the CLI beside it.

`status`, `search`, `ask` (streamed), `index` and `eval` go through the daemon's API
while it runs and print what they print without it, with the same exit codes; the
TCP listener wants a token and keeps each token to its users; health says "not
ready" while the index cannot open."""

from __future__ import annotations

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

from bot.api.client import ONE_SHOT
from rag.index.note_index import NoteIndex
from sync.sources.files import stable_id

from conftest import THREADS, free_port, unix_http
from fakes.ollama import FakeOllama

pytestmark = pytest.mark.slow  # real `serve` processes and the CLI

EXE = str(Path(sys.executable).with_name("leanote-rag"))
TOKEN_ME, TOKEN_OTHER = "tok-me-" + uuid.uuid4().hex, "tok-other-" + uuid.uuid4().hex


@pytest.fixture
def world(tmp_path, notes_dir):
    """A config over a copy of the sample notes, a fake Ollama, and helpers to run the
    CLI and to start/stop `serve`."""
    with FakeOllama() as ollama:
        sock = Path(f"/tmp/lr-api-{uuid.uuid4().hex[:8]}.sock")  # short: Unix socket paths are limited
        port = free_port()
        config = tmp_path / "config.yaml"
        config.write_text(
            f"source: {{kind: files, path: '{notes_dir}'}}\nstate_dir: data\n"
            f"ollama: {{host: '{ollama.url}'}}\nrerank: {{kind: none}}\nembedder: {{threads: {THREADS}}}\n"
            # expansion starts once a speed is measured, which differs between runs alone and through
            # the daemon; off keeps the two runs comparable
            f"retrieval: {{expand: 'off'}}\n"
            f"sync: {{interval: 1h, trigger_debounce: 0.1s}}\n"
            f"api:\n  socket: '{sock}'\n  listen: '127.0.0.1:{port}'\n  tokens:\n"
            f"    - {{token_env: LR_TOKEN_ME, users: [local], admin: true}}\n"
            f"    - {{token_env: LR_TOKEN_OTHER, users: [somebody-else]}}\n"
        )
        env = {**os.environ, "LR_TOKEN_ME": TOKEN_ME, "LR_TOKEN_OTHER": TOKEN_OTHER}
        w = World(config, env, sock, f"http://127.0.0.1:{port}", ollama)
        yield w
        w.stop()


class World:
    def __init__(self, config: Path, env: dict, sock: Path, url: str, ollama: FakeOllama):
        self.config, self.env, self.sock, self.url, self.ollama = config, env, sock, url, ollama
        self.proc: subprocess.Popen | None = None
        self.log = ""

    def cli(self, *args: str) -> tuple[int, str, str]:
        out = subprocess.run([EXE, "--config", str(self.config), *args], env=self.env, capture_output=True,
                             text=True, timeout=120)
        return out.returncode, out.stdout, out.stderr

    def health(self) -> httpx.Response:
        with unix_http(self.sock) as http:
            return http.get("/health", timeout=5)

    def serve(self, wait_ready: bool = True) -> None:
        self.proc = subprocess.Popen([EXE, "--config", str(self.config), "serve"], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read()
            try:
                reply = self.health()
                if not wait_ready or (reply.status_code == 200 and reply.json()["passes"] >= 1):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        pytest.fail("serve did not become ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            _, self.log = self.proc.communicate(timeout=30)
        self.proc = None


def drop(obj, *keys):
    """A JSON object without the fields that measure time."""
    if isinstance(obj, dict):
        return {k: drop(v, *keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [drop(v, *keys) for v in obj]
    return obj


def test_the_cli_goes_through_the_daemon_and_prints_the_same(world, tmp_path):
    assert world.cli("index")[0] == 0
    questions = tmp_path / "q.jsonl"
    gold = stable_id("file:生活/菜谱/番茄炒蛋.md")
    questions.write_text(json.dumps({"id": "q1", "question": "西红柿炒鸡蛋怎样不那么酸", "user_id": "local",
                                     "gold_note_ids": [gold], "gold_quotes": ["加一小勺糖"]}, ensure_ascii=False)
                         + "\n", encoding="utf-8")
    commands = [
        ("search", "付款失败后第一次重试前要等多久", "-k", "3"),
        ("search", "retry_count", "--json"),
        ("search", "x", "--user", "nobody"),  # an error: exit code and message must match too
        ("ask", "番茄炒蛋怎么做才不酸？", "--json"),
        ("ask", "番茄炒蛋怎么做才不酸？"),
        ("eval", str(questions), "--json"),
        ("index", "--json"),
        ("status", "--json"),
    ]

    def run_all():
        out = []
        for args in commands:
            if args[0] == "ask":
                world.ollama.reply("先把鸡蛋炒好盛出[1]，", "再加一小勺糖[1]。")
            code, stdout, stderr = world.cli(*args)
            out.append((code, stdout, stderr))
        return out

    alone = run_all()
    world.serve()
    passes = world.health().json()["passes"]
    through = run_all()
    assert world.health().json()["passes"] == passes + 1  # `index` made the daemon run a pass
    world.stop()
    assert "Traceback" not in world.log

    for args, (code_a, out_a, err_a), (code_b, out_b, err_b) in zip(commands, alone, through):
        assert code_a == code_b, (args, err_a, err_b)
        if args[0] in ("search",) or args == ("ask", "番茄炒蛋怎么做才不酸？"):
            assert out_a == out_b and err_a == err_b, args
        elif args[0] == "ask":
            assert drop(json.loads(out_a), "timings_ms", "usage") == drop(json.loads(out_b), "timings_ms", "usage")
        elif args[0] == "eval":
            assert drop(json.loads(out_a), "search_p50_ms") == drop(json.loads(out_b), "search_p50_ms")
        elif args[0] == "index":
            timings = ("seconds", "optimize_seconds", "searchable_seconds", "embed_seconds")
            assert drop(json.loads(out_a), *timings) == drop(json.loads(out_b), *timings)
        else:  # status: the daemon ran passes since, so compare what does not move
            a, b = json.loads(out_a), json.loads(out_b)
            assert a["users"] == b["users"] and a["index"] == b["index"] and a["embedder"] == b["embedder"]
            assert [x["account"] for x in a["accounts"]] == [x["account"] for x in b["accounts"]]
    assert alone[2][0] == 2 and "nobody" in alone[2][2]
    assert "加一小勺糖" in through[4][1] and "来源:" in through[4][1]


def test_tcp_needs_a_token_and_keeps_each_token_to_its_users(world):
    assert world.cli("index")[0] == 0
    world.serve()
    with httpx.Client(base_url=world.url, timeout=10, limits=ONE_SHOT) as http:
        assert http.get("/search", params={"q": "番茄"}).status_code == 401
        wrong = http.get("/search", params={"q": "番茄"}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["kind"] == "auth"
        me = {"Authorization": f"Bearer {TOKEN_ME}"}
        hits = http.get("/search", params={"q": "番茄炒蛋"}, headers=me).json()["hits"]
        assert hits and hits[0]["title"] == "番茄炒蛋"
        other = {"Authorization": f"Bearer {TOKEN_OTHER}"}
        refused = http.get("/search", params={"q": "番茄炒蛋", "user": "local"}, headers=other)
        assert refused.status_code == 400 and "local" in refused.json()["error"]
        assert http.get("/users", headers=other).json() == {"users": {}}
        status = http.get("/status", headers=other).json()
        assert status["users"] == [] and status["accounts"] == []
        assert http.post("/sync", json={"wait": False}, headers=other).status_code == 403
        world.ollama.reply("加一小勺糖[1]。")
        with http.stream("POST", "/ask", json={"question": "番茄炒蛋怎么做才不酸？"}, headers=me) as reply:
            events = [json.loads(line) for line in reply.iter_lines() if line]
        assert [e["event"] for e in events][-1] == "answer" and [e["event"] for e in events[:2]] == ["sources", "token"]
        assert events[0]["sources"][0]["title"] == "番茄炒蛋" and events[0]["sources"][0]["url"]  # before the first token
        assert events[-1]["answer"]["citations"][0]["title"] == "番茄炒蛋"
        spec = http.get("/openapi.json", headers=me).json()
        assert {"/health", "/status", "/search", "/ask", "/sync", "/metrics"} <= set(spec["paths"])
    assert oct(world.sock.stat().st_mode & 0o777) == "0o600"
    code, out, _ = world.cli("doctor")
    assert "ok   index (edge): held by the running daemon" in out


def samples(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_parse_and_move_after_a_sync_and_an_answer(world):
    assert world.cli("index")[0] == 0
    world.serve()
    me = {"Authorization": f"Bearer {TOKEN_ME}"}
    with httpx.Client(base_url=world.url, timeout=30, limits=ONE_SHOT) as http:  # (CLI runs between calls)
        assert http.get("/metrics", headers={"Authorization": f"Bearer {TOKEN_OTHER}"}).status_code == 403
        before = samples(http.get("/metrics", headers=me).text)
        world.ollama.reply("加一小勺糖[1]。")
        assert world.cli("ask", "番茄炒蛋怎么做才不酸？")[0] == 0
        assert world.cli("index")[0] == 0
        after = samples(http.get("/metrics", headers=me).text)
    llm = ("leanote_rag_answers_total", (("outcome", "llm"),))
    passes = ("leanote_rag_sync_passes_total", (("outcome", "ok"),))
    total = ("leanote_rag_answer_stage_duration_seconds_count", (("stage", "total"),))
    assert after[llm] == before[llm] + 1 and after[total] == before.get(total, 0) + 1
    assert after[passes] == before[passes] + 1
    assert after[("leanote_rag_user_notes_indexed", (("user_id", "local"),))] == 15


def test_health_is_not_ready_while_the_index_cannot_open(world, tmp_path):
    from rag import config as config_mod

    assert world.cli("index")[0] == 0
    settings = config_mod.load(world.config)
    holder = NoteIndex.open(settings)  # a one-shot command holds the index
    try:
        world.serve(wait_ready=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # it answers while opening, and then says why it waits
            try:
                reply = world.health()
                assert reply.status_code == 503
                if "open in another process" in reply.json()["index"]:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        body = reply.json()
        assert body["live"] is True and body["ready"] is False and "open in another process" in body["index"]
        code, _, err = world.cli("search", "番茄")
        assert code == 1 and "starting" in err
    finally:
        holder.close()
    deadline = time.monotonic() + 60
    while world.health().status_code != 200:
        assert time.monotonic() < deadline, "serve never opened the index"
        time.sleep(0.1)
    assert world.cli("search", "番茄炒蛋")[0] == 0


def test_a_second_serve_is_refused_and_a_stale_socket_is_no_daemon(world):
    assert world.cli("index")[0] == 0
    world.serve()
    second = subprocess.run([EXE, "--config", str(world.config), "serve"], env=world.env, capture_output=True,
                            text=True, timeout=60)
    assert second.returncode == 2 and "already runs" in second.stderr
    world.proc.send_signal(signal.SIGKILL)  # the socket file stays behind
    world.proc.wait(timeout=30)
    assert world.sock.exists()
    code, out, _ = world.cli("search", "番茄炒蛋")  # nobody listens: the CLI opens the index itself
    assert code == 0 and "番茄炒蛋" in out


def test_a_missing_token_turns_only_the_tcp_listener_off(world):
    assert world.cli("index")[0] == 0
    del world.env["LR_TOKEN_ME"]
    code, out, _ = world.cli("doctor")
    assert "FAIL api token 1: environment variable LR_TOKEN_ME is not set" in out
    world.serve()
    assert world.cli("search", "番茄炒蛋")[0] == 0  # the local door works
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{world.url}/health", timeout=5)
    world.stop()
    assert "the API's TCP listener is off" in world.log and "LR_TOKEN_ME" in world.log
