"""How fast `leanote-rag serve` stops on SIGTERM, in the middle of a sync and idle (needs ../shared).

    .venv/bin/python bench/sigterm.py [RUNS] [--load N]
    .venv/bin/python bench/sigterm.py --tiny      # seconds, on the sample notes (a smoke run)

A local Leanote (tests/fakes/leanote.py) serves the shared corpus; a real `serve`
process (default embedder, embedded Qdrant) gets SIGTERM, as systemd's `stop` sends it:

- mid-sync: its first full sync has a third of the notes in (a fresh state each run);
- idle: a fully synced state, the daemon ready and its first pass done, nothing running.

Measured: seconds from the signal to the process's exit (systemd's unit promises 10),
the part of it between the log's "stopping" and "stopped" lines, and whether the log
holds an ERROR or a traceback. After the last mid-sync run, `index` finishes the sync
from where it stopped. ``--load N`` keeps N busy loops (``while True: pass``) running
during the runs, as other work on the machine would (killed at the end). ``--tiny``: one
run of each on the sample notes (bench/common.py's ``tiny_world``). Prints JSON and writes
bench/sigterm_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file, shared, tiny_world  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
EXE = str(Path(sys.executable).with_name("leanote-rag"))
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?bot\.serve: (stopping|stopped)$", re.M)

from fakes.leanote import FakeLeanote  # noqa: E402
from conftest import unix_http  # noqa: E402


def notes_in(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            return conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0]
    except sqlite3.Error:
        return 0


def passes(sock: Path) -> int:
    try:
        with unix_http(sock) as http:
            reply = http.get("/health", timeout=5)
            return reply.json()["passes"] if reply.status_code == 200 else 0
    except (httpx.HTTPError, ValueError, KeyError):
        return 0


def inside(log: str) -> float | None:
    """Seconds between the daemon's "stopping" and "stopped" log lines."""
    found = {what: datetime.strptime(when, "%Y-%m-%d %H:%M:%S,%f") for when, what in STAMP.findall(log)}
    if "stopping" in found and "stopped" in found:
        return round((found["stopped"] - found["stopping"]).total_seconds(), 3)
    return None


def config(work: Path, leanote: FakeLeanote, sync: str) -> tuple[Path, Path]:
    sock = Path(f"/tmp/lr-bench-{uuid.uuid4().hex[:8]}.sock")
    path = work / "config.yaml"
    path.write_text(
        f"leanote: {{base_url: '{leanote.url}'}}\nstate_dir: data\n"
        "source:\n  kind: leanote_api\n  accounts:\n"
        "    - {email: one@example.com, password_env: BENCH_PW_ONE}\n"
        "    - {email: two@example.com, password_env: BENCH_PW_TWO}\n"
        f"ollama: {{enabled: false}}\nrerank: {{kind: none}}\nsync: {sync}\napi: {{socket: '{sock}'}}\n"
    )
    return path, sock


def stop(proc: subprocess.Popen) -> tuple[float, str]:
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, log = proc.communicate(timeout=120)
    return round(time.monotonic() - signalled, 3), log


def summary(stops: list[float], insides: list[float | None]) -> dict:
    known = [x for x in insides if x is not None]
    return {"sigterm_to_exit_s": stops, "p50_s": statistics.median(stops), "max_s": max(stops),
            "stopping_to_stopped_s": insides, "stopping_to_stopped_max_s": max(known) if known else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="?", type=int, help="runs of each (default 5)")
    parser.add_argument("--load", type=int, default=0, help="busy loops to keep running meanwhile")
    parser.add_argument("--tiny", action="store_true", help="a smoke run on the sample notes, one run of each")
    args = parser.parse_args()
    args.runs = args.runs or (1 if args.tiny else 5)
    if args.tiny:
        tiny_world()
    corpus = shared() / "corpus"
    if not (corpus / "notes.jsonl").exists():
        sys.exit(f"needs the shared corpus at {corpus} (set LEANOTE_RAG_SHARED), or --tiny")
    env = {**os.environ, "BENCH_PW_ONE": "one-secret", "BENCH_PW_TWO": "two-secret"}
    total = sum(1 for _ in open(corpus / "notes.jsonl", encoding="utf-8"))
    # tiny: pages of 5 notes, each committed on its own, so that a third of them are in before the end
    sync = "{interval: 1h, page_size: 5}" if args.tiny else "{interval: 1h}"
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    mid, mid_inside, idle, idle_inside, problems, fractions = [], [], [], [], [], []
    work = None
    try:
        with FakeLeanote() as leanote:
            leanote.load_corpus(corpus)
            for run in range(args.runs):  # mid-sync, a fresh state each time
                if work is not None:
                    shutil.rmtree(work, ignore_errors=True)
                work = Path(tempfile.mkdtemp(prefix="leanote-rag-sigterm-"))
                path, _ = config(work, leanote, sync)
                proc = subprocess.Popen([EXE, "--config", str(path), "serve"], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
                db = work / "data" / "state.db"
                while notes_in(db) < total / 3:
                    if proc.poll() is not None:
                        sys.exit(f"serve exited early: {proc.stderr.read()}")
                    time.sleep(0.05)
                fractions.append(round(notes_in(db) / total, 3))
                seconds, log = stop(proc)
                mid.append(seconds)
                mid_inside.append(inside(log))
                if proc.returncode != 0 or "Traceback" in log or " ERROR " in log:
                    problems.append({"mode": "mid-sync", "run": run, "returncode": proc.returncode, "log": log[-2000:]})
                print(f"mid-sync {run + 1}: stopped in {seconds:.2f} s at {fractions[-1]:.0%} of the notes",
                      file=sys.stderr)
            finish = subprocess.run([EXE, "--config", str(path), "index", "--json"], env=env, capture_output=True,
                                    text=True, timeout=1800)
            for run in range(args.runs):  # idle, on the state the last index completed
                path, sock = config(work, leanote, sync)
                proc = subprocess.Popen([EXE, "--config", str(path), "serve"], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
                while passes(sock) < 1:
                    if proc.poll() is not None:
                        sys.exit(f"serve exited early: {proc.stderr.read()}")
                    time.sleep(0.05)
                time.sleep(1.0)  # settled: nothing running
                seconds, log = stop(proc)
                idle.append(seconds)
                idle_inside.append(inside(log))
                if proc.returncode != 0 or "Traceback" in log or " ERROR " in log:
                    problems.append({"mode": "idle", "run": run, "returncode": proc.returncode, "log": log[-2000:]})
                print(f"idle {run + 1}: stopped in {seconds:.2f} s", file=sys.stderr)
    finally:
        for p in busy:
            p.kill()
            p.wait()
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    done = json.loads(finish.stdout) if finish.returncode == 0 else {"error": finish.stderr[-500:]}
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "busy_loops": args.load,
        "runs": args.runs,
        "notes": total,
        "mid_sync": {"stopped_at_fraction": fractions, **summary(mid, mid_inside)},
        "idle": summary(idle, idle_inside),
        "runs_with_error_or_traceback": problems,
        "restart_index": {k: done.get(k) for k in ("added", "unchanged", "chunks_embedded", "chunks_cached",
                                                     "optimize_seconds", "seconds", "error") if k in done},
    }
    text = json.dumps(results, ensure_ascii=False, indent=1)
    print(text)
    results_file("sigterm_results.json", args.tiny).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
