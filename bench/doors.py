"""The API's doors under a stranger and under one greedy caller (the sample notes; no ../shared).

    .venv/bin/python bench/doors.py [--requests N]

1. A slow-loris: a real `serve` at a 1,024-file limit (systemd's default soft limit), 1,100
   connections to its TCP port that each send half a request head and never finish it,
   opened again four times a second when the daemon closes them (tests/test_api_door.py's
   attacker). Measured: the token holder's `/search` over TCP and the CLI's door (`/search`
   on the Unix socket), calm and under the attack (N requests each, one at a time), the
   files the process holds, the log's growth.
2. Fair shares: a fake LLM as slow as a small CPU (an answer ~1 s); another token's
   question alone, and while one token has 100 questions in at once (tests/test_fair.py's
   setting).
Prints JSON and writes bench/doors_results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
EXE = str(Path(sys.executable).with_name("leanote-rag"))

import httpx  # noqa: E402

from conftest import EXAMPLES, free_port  # noqa: E402
from fakes.ollama import FakeOllama  # noqa: E402
from test_api_door import FILE_LIMIT, HALF_OPEN, Loris, file_limit, open_files  # noqa: E402
from test_fair import A_QUESTION, B_QUESTION, FLOOD, asked  # noqa: E402


def stats(values: list[float]) -> dict:
    values = sorted(values)
    return {"p50_s": round(statistics.median(values), 3), "p95_s": round(values[int(0.95 * (len(values) - 1))], 3),
            "max_s": round(values[-1], 3), "n": len(values)}


def serve(folder: Path, extra: str, env: dict, limit_files: bool) -> tuple[subprocess.Popen, Path, str, Path]:
    sock = Path(f"/tmp/lr-bench-{uuid.uuid4().hex[:8]}.sock")
    port = free_port()
    config = folder / "config.yaml"
    config.write_text(f"source: {{kind: files, path: '{EXAMPLES}'}}\nstate_dir: data\nrerank: {{kind: none}}\n"
                      f"retrieval: {{expand: 'off'}}\nmemory: {{llm: 'off'}}\nsync: {{interval: 1h}}\n"
                      f"api:\n  socket: '{sock}'\n  listen: '127.0.0.1:{port}'\n{extra}")
    subprocess.run([EXE, "--config", str(config), "index"], env=env, capture_output=True, check=True, timeout=600)
    log = folder / "serve.log"
    proc = subprocess.Popen([EXE, "--config", str(config), "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), preexec_fn=file_limit if limit_files else None)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x") as http:
        for _ in range(1200):
            try:
                reply = http.get("/health", timeout=5)
                if reply.status_code == 200 and reply.json()["passes"] >= 1:
                    return proc, sock, f"http://127.0.0.1:{port}", log
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise SystemExit("serve did not become ready")


def stop(proc: subprocess.Popen) -> float:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    return round(time.monotonic() - started, 2)


def slowloris(requests: int) -> dict:
    token = "tok-" + uuid.uuid4().hex
    env = {**os.environ, "LR_BENCH_TOKEN": token}
    env.pop("NOTIFY_SOCKET", None)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp, FakeOllama() as ollama:
        extra = (f"  rate_limit: 1000\n  tokens: [{{token_env: LR_BENCH_TOKEN, users: [local]}}]\n"
                 f"ollama: {{host: '{ollama.url}'}}\n")
        proc, sock, url, log = serve(Path(tmp), extra, env, limit_files=True)
        local = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x", timeout=30)
        remote = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

        def run(client) -> list[float]:
            out = []
            for _ in range(requests):
                t = time.monotonic()
                assert client.get("/search", params={"q": "番茄炒蛋"}).status_code == 200
                out.append(time.monotonic() - t)
            return out

        calm = {"token": stats(run(remote)), "socket": stats(run(local)), "files_open": open_files(proc.pid)}
        log_before = log.stat().st_size
        loris = Loris(int(url.rsplit(":", 1)[1]), HALF_OPEN)
        loris.start()
        while loris.sent < HALF_OPEN:
            time.sleep(0.1)
        time.sleep(2.0)
        attacked = {"token": stats(run(remote)), "socket": stats(run(local)), "files_open": open_files(proc.pid)}
        loris.stop.set()
        loris.join()
        local.close()
        remote.close()
        stopped = stop(proc)
        result = {"file_limit": FILE_LIMIT, "half_open": HALF_OPEN, "calm": calm, "under_attack": attacked,
                  "attacker_connections_opened": loris.opened, "closed_by_the_daemon": loris.closed_by_server,
                  "log_growth_bytes": log.stat().st_size - log_before, "sigterm_s": stopped}
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return result


def fairness() -> dict:
    tokens = {"A": "tok-a-" + uuid.uuid4().hex, "B": "tok-b-" + uuid.uuid4().hex}
    env = {**os.environ, "LR_A": tokens["A"], "LR_B": tokens["B"]}
    env.pop("NOTIFY_SOCKET", None)
    with tempfile.TemporaryDirectory() as tmp, FakeOllama(speed=(4000.0, 20.0)) as ollama:
        extra = ("  max_connections: 300\n  rate_limit: 1000\n"
                 "  tokens: [{token_env: LR_A, users: [local]}, {token_env: LR_B, users: [local]}]\n"
                 f"ollama: {{host: '{ollama.url}'}}\n")
        proc, _, url, _ = serve(Path(tmp), extra, env, limit_files=False)

        async def ask(http, who: str, question: str) -> float:
            t = time.monotonic()
            async with http.stream("POST", "/ask", json={"question": question},
                                   headers={"Authorization": f"Bearer {tokens[who]}"}) as reply:
                async for _ in reply.aiter_lines():
                    pass
            return time.monotonic() - t

        async def main() -> dict:
            limits = httpx.Limits(max_connections=FLOOD + 10, max_keepalive_connections=FLOOD + 10)
            async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as http:
                one = await ask(http, "A", A_QUESTION)
                alone = [await ask(http, "B", B_QUESTION) for _ in range(3)]
                flood = [asyncio.create_task(ask(http, "A", A_QUESTION)) for _ in range(FLOOD)]
                before = len(ollama.chats())
                while sum(A_QUESTION in asked(c) for c in ollama.chats()[before:]) < 2:
                    await asyncio.sleep(0.02)
                during = [await ask(http, "B", B_QUESTION) for _ in range(3)]
                waiting = sum(not t.done() for t in flood)
                for t in flood:
                    t.cancel()
                await asyncio.gather(*flood, return_exceptions=True)
            return {"one_answer_s": round(one, 2), "b_alone_s": [round(x, 2) for x in alone],
                    "b_during_100_from_a_s": [round(x, 2) for x in during], "a_still_waiting": waiting}

        try:
            return asyncio.run(main())
        finally:
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20, help="requests per door and condition")
    args = parser.parse_args()
    result = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
              "load_before": round(os.getloadavg()[0], 2), "slowloris": slowloris(args.requests),
              "fairness": fairness(), "load_after": round(os.getloadavg()[0], 2)}
    text = json.dumps(result, indent=1, ensure_ascii=False)
    print(text)
    (REPO / "bench" / "doors_results.json").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
