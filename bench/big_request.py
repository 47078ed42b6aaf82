"""One huge request, and everyone else's answers (needs ../shared).

    .venv/bin/python bench/big_request.py [--state-dir DIR] [--questions N]
    .venv/bin/python bench/big_request.py --tiny     # seconds, on the sample notes (a smoke run)

The shared corpus (its mongodump) is indexed into a temporary state directory, or DIR (kept,
and reused when it already holds that index: indexing takes minutes), then `leanote-rag
serve` runs over it with a fake Ollama (tests/fakes/ollama.py, the reader stand-in: replies
at once, quoting the evidence). Measured through the daemon's Unix-socket API:

1. a 20 MB question (`POST /ask`): how long after its request head the 413 comes (a raw
   socket sends the head and the first kilobyte only), and how long an HTTP client that
   sends all 20 MB (httpx) waits for its 413;
2. another person's answer latency (`POST /ask` until the answer event; N questions of
   eval/dev.jsonl, default 10): alone; while two other clients send 20 MB questions back to
   back (each refused); and while two other clients ask 2,000-character questions back to
   back (the most the door takes, each answered);
3. the daemon's resident memory before and after.
``--tiny``: the sample notes (bench/common.py's ``tiny_world``), 3 questions, each 20 MB
request timed twice instead of 5 times. Prints JSON and writes bench/big_request_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BACKUP_NAME, REPO, results_file, shared, tiny_world  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
EXE = str(Path(sys.executable).with_name("leanote-rag"))
HUGE = 20 * 1024 * 1024

from fakes.ollama import FakeOllama  # noqa: E402
from conftest import unix_http  # noqa: E402

from rag.eval import load_questions  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def client(sock: str) -> httpx.Client:
    return unix_http(sock, timeout=600)


def ask(http: httpx.Client, question: str, user: str) -> float:
    """Seconds until the answer event of one question (raises on anything else)."""
    t = time.perf_counter()
    with http.stream("POST", "/ask", json={"question": question, "user": user}) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code}: {reply.read()[:200]!r}")
        for line in reply.iter_lines():
            if line and json.loads(line)["event"] == "answer":
                return time.perf_counter() - t
    raise RuntimeError("no answer event")


def refused_after_head(sock: str) -> float:
    """Seconds from sending a 20 MB request's head (and its first KB) to the 413's first byte."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock)
    try:
        t = time.perf_counter()
        s.sendall(b"POST /ask HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % HUGE + b'{"question": "' + b"a" * 1024)
        first = s.recv(12)
        took = time.perf_counter() - t
        assert first.startswith(b"HTTP/1.1 413"), first
        return took
    finally:
        s.close()


def huge_body() -> bytes:
    return b'{"question": "' + "问".encode() * (HUGE // 3) + b'", "user": null}'


def summary(values: list[float]) -> dict:
    values = sorted(values)
    return {"n": len(values), "p50_ms": round(statistics.median(values) * 1000, 1),
            "max_ms": round(values[-1] * 1000, 1)}


class Flood:
    """``workers`` threads doing ``one(http)`` back to back until stopped; their times."""

    def __init__(self, sock: str, one, workers: int = 2):
        self.times: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(sock, one), daemon=True) for _ in range(workers)]

    def _run(self, sock, one) -> None:
        with client(sock) as http:
            while not self._stop.is_set():
                t = time.perf_counter()
                try:
                    one(http)
                    self.times.append(time.perf_counter() - t)
                except Exception as err:  # noqa: BLE001 - counted and reported
                    self.errors.append(f"{type(err).__name__}: {err}"[:200])

    def __enter__(self):
        for t in self._threads:
            t.start()
        while not self.times and not self.errors:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, help="index the corpus here (kept), or reuse the index there")
    parser.add_argument("--questions", type=int, help="another person's questions, each way (default 10)")
    parser.add_argument("--tiny", action="store_true", help="a smoke run on the sample notes, 3 questions")
    args = parser.parse_args()
    if args.tiny:
        tiny_world()
    tries = 2 if args.tiny else 5  # of each 20 MB request timed alone
    dump = shared() / "corpus" / "mongodump" / BACKUP_NAME
    if not dump.exists():
        sys.exit(f"needs the shared corpus at {dump} (set LEANOTE_RAG_SHARED), or --tiny")
    questions = [q for q in load_questions(shared() / "eval" / "dev.jsonl") if not q.get("after_changes")]
    questions = questions[: args.questions or (3 if args.tiny else 10)]
    work = Path(tempfile.mkdtemp(prefix="leanote-rag-bigreq-"))
    state = args.state_dir or work / "data"
    sock = f"/tmp/lr-bigreq-{os.getpid()}.sock"
    results: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
                     "load_avg_at_start": [round(x, 2) for x in os.getloadavg()], "body_bytes": HUGE}
    with FakeOllama(reader=True) as ollama:
        config = work / "config.yaml"
        config.write_text(
            f"source: {{kind: mongodump, path: '{dump.parent}'}}\nstate_dir: '{state}'\n"
            f"ollama: {{host: '{ollama.url}'}}\nrerank: {{kind: none}}\nretrieval: {{expand: 'off'}}\n"
            f"memory: {{llm: 'off'}}\nsync: {{interval: 1h}}\napi: {{socket: '{sock}'}}\n")
        if not (state / "qdrant").exists():
            t = time.monotonic()
            subprocess.run([EXE, "--config", str(config), "index"], check=True, capture_output=True)
            results["full_index_s"] = round(time.monotonic() - t, 1)
        proc = subprocess.Popen([EXE, "--config", str(config), "serve"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            with client(sock) as http:
                while True:
                    assert proc.poll() is None, proc.stderr.read()
                    try:
                        if http.get("/health").json().get("passes", 0) >= 1:
                            break
                    except (httpx.HTTPError, ValueError):
                        pass
                    time.sleep(0.2)
                ask(http, questions[0]["question"], questions[0]["user_id"])  # warm
                results["rss_mb_before"] = rss_mb(proc.pid)

                def answers() -> list[float]:
                    return [ask(http, q["question"], q["user_id"]) for q in questions]

                alone = answers()
                head = [refused_after_head(sock) for _ in range(tries)]
                body = huge_body()

                def post_huge(h: httpx.Client) -> None:
                    reply = h.post("/ask", content=body, headers={"Content-Type": "application/json"})
                    assert reply.status_code == 413 and "limits.request_kb" in reply.json()["error"], reply.text

                whole = []
                with client(sock) as h:
                    for _ in range(tries):
                        t = time.perf_counter()
                        post_huge(h)
                        whole.append(time.perf_counter() - t)
                with Flood(sock, post_huge) as huge:
                    during_huge = answers()
                results["rss_mb_after_huge_flood"] = rss_mb(proc.pid)
                longest = ("请根据我的笔记详细解释。" * 200)[:2000]
                user = questions[0]["user_id"]
                with Flood(sock, lambda h: ask(h, longest, user)) as long:
                    during_long = answers()
                results["rss_mb_after"] = rss_mb(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, log = proc.communicate(timeout=60)
    shutil.rmtree(work)  # the config, and the index unless it is in --state-dir
    results["refused_20mb"] = {
        "after_head_ms": summary(head),
        "whole_body_sent_ms": summary(whole),
        "during_flood": summary(huge.times) | {"errors": huge.errors[:3]},
    }
    results["other_persons_answer"] = {
        "alone": summary(alone),
        "while_20mb_questions_are_refused": summary(during_huge),
        "while_2000_char_questions_are_answered": summary(during_long),
    }
    results["flood_2000_char_questions"] = summary(long.times) | {"errors": long.errors[:3]}
    results["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["daemon_errors"] = [line for line in log.splitlines() if " ERROR " in line][:5]
    text = json.dumps(results, ensure_ascii=False, indent=1)
    print(text)
    results_file("big_request_results.json", args.tiny).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
