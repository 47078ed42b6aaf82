"""The API's doors under a stranger and under one greedy caller (the sample notes; no ../shared).

    .venv/bin/python bench/doors.py [--requests N]
    .venv/bin/python bench/doors.py --tiny      # seconds: a smaller attack and flood (a smoke run)

1. A slow-loris: a real `serve` at a 1,024-file limit (systemd's default soft limit), 1,100
   connections to its TCP port that each send half a request head and never finish it,
   opened again four times a second when the daemon closes them (tests/test_api_door.py's
   attacker). Measured: the token holder's `/search` over TCP and the CLI's door (`/search`
   on the Unix socket), calm and under the attack (N requests each, one at a time), the
   files the process holds, the log's growth.
2. Fair shares: a fake LLM as slow as a small CPU (an answer ~1 s); another token's
   question alone, and while one token has 100 questions in at once (tests/test_fair.py's
   setting).
``--tiny``: 3 requests per door and condition, 200 half-open connections, `serve` indexing
the notes itself (no `index` run first); an LLM 4 times as fast, one question of B's each way,
A's flood 10 questions. Prints JSON and writes bench/doors_results.json.
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
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
EXE = str(Path(sys.executable).with_name("leanote-rag"))

import httpx  # noqa: E402

from conftest import EXAMPLES, free_port, unix_http  # noqa: E402
from fakes.ollama import FakeOllama  # noqa: E402
from test_api_door import FILE_LIMIT, HALF_OPEN, Loris, file_limit, open_files  # noqa: E402
from test_fair import A_QUESTION, B_QUESTION, FLOOD, asked  # noqa: E402


class Size(NamedTuple):
    """How big a run is."""

    requests: int  # per door and condition
    half_open: int  # the attacker's connections
    settle_s: float  # the attack at full strength this long before it is measured
    flood: int  # A's questions in at once
    tries: int  # B's questions alone, and again during A's flood
    speed: tuple[float, float]  # the fake LLM's: prompt tokens read, tokens written a second
    index_first: bool  # `leanote-rag index` before `serve` (else serve's first pass indexes the notes)


FULL = Size(requests=20, half_open=HALF_OPEN, settle_s=2.0, flood=FLOOD, tries=3, speed=(4000.0, 20.0),
            index_first=True)
TINY = Size(requests=3, half_open=200, settle_s=0.5, flood=10, tries=1, speed=(16000.0, 80.0), index_first=False)


def stats(values: list[float]) -> dict:
    values = sorted(values)
    return {"p50_s": round(statistics.median(values), 3), "p95_s": round(values[int(0.95 * (len(values) - 1))], 3),
            "max_s": round(values[-1], 3), "n": len(values)}


def serve(folder: Path, extra: str, env: dict, limit_files: bool,
          index_first: bool) -> tuple[subprocess.Popen, Path, str, Path]:
    sock = Path(f"/tmp/lr-bench-{uuid.uuid4().hex[:8]}.sock")
    port = free_port()
    config = folder / "config.yaml"
    config.write_text(f"source: {{kind: files, path: '{EXAMPLES}'}}\nstate_dir: data\nrerank: {{kind: none}}\n"
                      f"retrieval: {{expand: 'off'}}\nmemory: {{llm: 'off'}}\nsync: {{interval: 1h}}\n"
                      f"api:\n  socket: '{sock}'\n  listen: '127.0.0.1:{port}'\n{extra}")
    if index_first:
        subprocess.run([EXE, "--config", str(config), "index"], env=env, capture_output=True, check=True, timeout=600)
    log = folder / "serve.log"
    proc = subprocess.Popen([EXE, "--config", str(config), "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), preexec_fn=file_limit if limit_files else None)
    with unix_http(sock) as http:
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


def slowloris(size: Size) -> dict:
    token = "tok-" + uuid.uuid4().hex
    env = {**os.environ, "LR_BENCH_TOKEN": token}
    env.pop("NOTIFY_SOCKET", None)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp, FakeOllama() as ollama:
        extra = (f"  rate_limit: 1000\n  tokens: [{{token_env: LR_BENCH_TOKEN, users: [local]}}]\n"
                 f"ollama: {{host: '{ollama.url}'}}\n")
        proc, sock, url, log = serve(Path(tmp), extra, env, limit_files=True, index_first=size.index_first)
        local = unix_http(sock, timeout=30)
        remote = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

        def run(client) -> list[float]:
            out = []
            for _ in range(size.requests):
                t = time.monotonic()
                assert client.get("/search", params={"q": "番茄炒蛋"}).status_code == 200
                out.append(time.monotonic() - t)
            return out

        calm = {"token": stats(run(remote)), "socket": stats(run(local)), "files_open": open_files(proc.pid)}
        log_before = log.stat().st_size
        loris = Loris(int(url.rsplit(":", 1)[1]), size.half_open)
        loris.start()
        while loris.sent < size.half_open:
            time.sleep(0.1)
        time.sleep(size.settle_s)
        attacked = {"token": stats(run(remote)), "socket": stats(run(local)), "files_open": open_files(proc.pid)}
        loris.stop.set()
        loris.join()
        local.close()
        remote.close()
        stopped = stop(proc)
        result = {"file_limit": FILE_LIMIT, "half_open": size.half_open, "calm": calm, "under_attack": attacked,
                  "attacker_connections_opened": loris.opened, "closed_by_the_daemon": loris.closed_by_server,
                  "log_growth_bytes": log.stat().st_size - log_before, "sigterm_s": stopped}
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return result


def fairness(size: Size) -> dict:
    tokens = {"A": "tok-a-" + uuid.uuid4().hex, "B": "tok-b-" + uuid.uuid4().hex}
    env = {**os.environ, "LR_A": tokens["A"], "LR_B": tokens["B"]}
    env.pop("NOTIFY_SOCKET", None)
    with tempfile.TemporaryDirectory() as tmp, FakeOllama(speed=size.speed) as ollama:
        extra = ("  max_connections: 300\n  rate_limit: 1000\n"
                 "  tokens: [{token_env: LR_A, users: [local]}, {token_env: LR_B, users: [local]}]\n"
                 f"ollama: {{host: '{ollama.url}'}}\n")
        proc, _, url, _ = serve(Path(tmp), extra, env, limit_files=False, index_first=size.index_first)

        async def ask(http, who: str, question: str) -> float:
            t = time.monotonic()
            async with http.stream("POST", "/ask", json={"question": question},
                                   headers={"Authorization": f"Bearer {tokens[who]}"}) as reply:
                async for _ in reply.aiter_lines():
                    pass
            return time.monotonic() - t

        async def main() -> dict:
            limits = httpx.Limits(max_connections=size.flood + 10, max_keepalive_connections=size.flood + 10)
            async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as http:
                one = await ask(http, "A", A_QUESTION)
                alone = [await ask(http, "B", B_QUESTION) for _ in range(size.tries)]
                flood = [asyncio.create_task(ask(http, "A", A_QUESTION)) for _ in range(size.flood)]
                before = len(ollama.chats())
                while sum(A_QUESTION in asked(c) for c in ollama.chats()[before:]) < 2:
                    await asyncio.sleep(0.02)
                during = [await ask(http, "B", B_QUESTION) for _ in range(size.tries)]
                waiting = sum(not t.done() for t in flood)
                for t in flood:
                    t.cancel()
                await asyncio.gather(*flood, return_exceptions=True)
            return {"one_answer_s": round(one, 2), "b_alone_s": [round(x, 2) for x in alone],
                    f"b_during_{size.flood}_from_a_s": [round(x, 2) for x in during], "a_still_waiting": waiting}

        try:
            return asyncio.run(main())
        finally:
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, help="requests per door and condition (default 20)")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: a smaller attack and flood, a faster LLM")
    args = parser.parse_args()
    size = TINY if args.tiny else FULL
    if args.requests:
        size = size._replace(requests=args.requests)
    result = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
              "load_before": round(os.getloadavg()[0], 2), "slowloris": slowloris(size),
              "fairness": fairness(size), "load_after": round(os.getloadavg()[0], 2)}
    text = json.dumps(result, indent=1, ensure_ascii=False)
    print(text)
    results_file("doors_results.json", args.tiny).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
