"""An hour of ``serve`` as a home server lives it: a question every few minutes, the memory's
LLM tier working (or not) in between, and what the box spends while nobody asks.

    .venv/bin/leanote-rag --config C index                # once: the notes indexed, the LLM jobs queued
    .venv/bin/python bench/serve_hour.py --config C --llm-pid PID [--minutes 60] [--every 180]
                                         [--questions ../shared/eval/dev.jsonl] [--key NAME]
    .venv/bin/python bench/serve_hour.py --tiny          # a minute: the sample notes, the fake Ollama (a smoke run)

``C`` names a real Ollama (or ``../shared/real-llm``'s server, whose process is ``--llm-pid``).
The script starts ``leanote-rag --config C serve``, asks one question of the dev set every
``--every`` seconds through the CLI (which reaches the daemon's socket, as a person's door
does), and every ``--sample`` seconds reads the CPU time of the daemon and of the LLM's
server (``psutil``: their own CPU seconds, whatever else runs on the machine) and the daemon's
``status --json`` (the LLM tier's jobs done, pending, this run's counts and why it does not run).
At the end it stops the daemon with SIGTERM (and times that).

Reported (and written into ``bench/serve_hour_results.json`` under ``--key``): the questions'
first-token times; the jobs done, the sections read, the extractions that gave way to a
question, whether ``auto`` stopped the tier; the CPU the daemon and the LLM spent while no
question was in flight, as a share of one core, split into the samples where the tier had
work pending and ran it, and the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BACKUP_NAME, REPO, results_file, shared, tiny_world  # noqa: E402

BIN = Path(sys.executable).parent / "leanote-rag"
RESULTS = "serve_hour_results.json"


def cpu_seconds(proc: psutil.Process) -> float:
    """A process's CPU seconds and its children's (the daemon's worker processes)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def status(config: str) -> dict | None:
    out = subprocess.run([str(BIN), "--config", config, "status", "--json"], capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def ask(config: str, q: dict, into: list, busy: threading.Event) -> None:
    busy.set()
    started = time.time()
    try:
        out = subprocess.run([str(BIN), "--config", config, "ask", "--json", "--user", q["user_id"], q["question"]],
                             capture_output=True, text=True, timeout=900)
        answer = json.loads(out.stdout) if out.returncode == 0 else {}
        into.append({"id": q["id"], "at": started, "seconds": round(time.time() - started, 1),
                     "first_token_s": (answer.get("timings_ms") or {}).get("first_token", 0) / 1000 or None,
                     "used_llm": answer.get("used_llm"), "error": None if out.returncode == 0 else out.stderr[-300:]})
    finally:
        busy.clear()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config")
    ap.add_argument("--llm-pid", type=int, help="the LLM server's process")
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=180.0, help="seconds between two questions")
    ap.add_argument("--sample", type=float, default=15.0, help="seconds between two readings")
    ap.add_argument("--questions", help="questions in the dev set's form (default: the shared dev set)")
    ap.add_argument("--key", default="serve hour")
    ap.add_argument("--tiny", action="store_true", help="the sample notes and the fake Ollama, for a minute")
    args = ap.parse_args(argv)
    if args.tiny:
        return tiny(args)
    if not args.config or not args.llm_pid:
        ap.error("--config and --llm-pid are needed (or --tiny)")
    return run(args)


def tiny(args) -> int:
    """The same on the sample notes with the fake Ollama (this process is its server), indexed
    into a temporary folder: half a minute, a question every 10 s."""
    import tempfile

    sys.path.insert(0, str(REPO / "tests"))
    from fakes.ollama import FakeOllama

    shared = tiny_world()
    folder = Path(tempfile.mkdtemp(prefix="lr-serve-hour-"))
    with FakeOllama(models=("qwen2.5:7b-instruct",), speed=(2000.0, 200.0)) as ollama:
        config = folder / "tiny.yaml"
        backup = shared / "corpus" / "mongodump" / BACKUP_NAME
        config.write_text(f"source: {{kind: mongodump, path: '{backup}'}}\n"
                          f"state_dir: '{folder / 'state'}'\nrerank: {{kind: none}}\n"
                          f"ollama: {{host: '{ollama.url}', model: 'qwen2.5:7b-instruct'}}\nmemory: {{llm: 'on'}}\n"
                          "api: {enabled: true}\n", encoding="utf-8")
        done = subprocess.run([str(BIN), "--config", str(config), "index"], capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            print(done.stderr[-2000:])
            return 1
        args.config, args.llm_pid = str(config), os.getpid()
        args.minutes, args.every, args.sample = 0.5, 10.0, 2.0
        args.questions = str(shared / "eval" / "dev.jsonl")
        args.key = "tiny"
        return run(args, tiny=True)


def run(args, tiny: bool = False) -> int:
    args.questions = args.questions or str(shared() / "eval" / "dev.jsonl")
    questions = [json.loads(line) for line in Path(args.questions).read_text(encoding="utf-8").splitlines() if line]
    llm = psutil.Process(args.llm_pid)
    daemon = subprocess.Popen([str(BIN), "--config", args.config, "serve"], stdout=subprocess.DEVNULL,
                              stderr=open(Path(args.config).with_suffix(".serve.log"), "w"))
    proc = psutil.Process(daemon.pid)
    began = time.time()
    while status(args.config) is None or not Path(args.config).exists():
        if daemon.poll() is not None:
            print("serve ended at once: see", Path(args.config).with_suffix(".serve.log"))
            return 1
        time.sleep(2)
    print(f"serve up after {time.time() - began:.1f} s", flush=True)

    asked: list[dict] = []
    samples: list[dict] = []
    busy = threading.Event()
    start = time.time()
    end = start + args.minutes * 60
    next_q, n = start + min(30.0, args.every), 0
    last = (time.time(), cpu_seconds(proc), cpu_seconds(llm), busy.is_set())
    worker = None
    while time.time() < end:
        if time.time() >= next_q and not busy.is_set():
            q = questions[n % len(questions)]
            n += 1
            worker = threading.Thread(target=ask, args=(args.config, q, asked, busy), daemon=True)
            worker.start()
            busy.wait(5)
            next_q += args.every
        time.sleep(args.sample)
        now, d_cpu, l_cpu = time.time(), cpu_seconds(proc), cpu_seconds(llm)
        report = status(args.config) or {}
        llm_counts = ((report.get("memory") or {}).get("llm") or {})
        wall = now - last[0]
        samples.append({"t": round(now - start), "asking": busy.is_set() or last[3], "load": os.getloadavg()[0],
                        "daemon_core": round((d_cpu - last[1]) / wall, 3), "llm_core": round((l_cpu - last[2]) / wall, 3),
                        "pending": llm_counts.get("jobs_pending"), "done_last_hour": llm_counts.get("done_last_hour"),
                        "worker": llm_counts.get("worker")})
        last = (now, d_cpu, l_cpu, busy.is_set())
        s = samples[-1]
        print(f"{s['t']:5d}s asking={int(s['asking'])} daemon {s['daemon_core']:.2f} llm {s['llm_core']:.2f} "
              f"pending {s['pending']} done/h {s['done_last_hour']} {json.dumps(s['worker'])}", flush=True)
    if worker is not None:
        worker.join(900)
    stop = time.time()
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(120)
    stopped = time.time() - stop

    quiet = [s for s in samples if not s["asking"]]
    last_worker = next((s["worker"] for s in reversed(samples) if s["worker"]), {}) or {}

    def core(rows, key):
        return round(statistics.mean(r[key] for r in rows), 3) if rows else None

    firsts = [a["first_token_s"] for a in asked if a["first_token_s"]]
    result = {
        "minutes": args.minutes, "every_s": args.every, "config": args.config,
        "questions": len(asked), "errors": sum(1 for a in asked if a["error"]),
        "first_token_p50_s": round(statistics.median(firsts), 1) if firsts else None,
        "first_token_max_s": round(max(firsts), 1) if firsts else None,
        "jobs_done": last_worker.get("done"), "sections_done": last_worker.get("sections_done"),
        "gave_way": last_worker.get("preempted"), "gave_up": last_worker.get("gave_up"),
        "worker_text": last_worker.get("text"),
        "pending_start": samples[0]["pending"] if samples else None,
        "pending_end": samples[-1]["pending"] if samples else None,
        "quiet_samples": len(quiet), "load_mean": core(samples, "load"),
        "quiet_daemon_core": core(quiet, "daemon_core"), "quiet_llm_core": core(quiet, "llm_core"),
        "sigterm_stop_s": round(stopped, 1),
        "asked": asked,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "asked"}, indent=1))
    out = results_file(RESULTS, tiny)
    results = json.loads(out.read_text()) if out.exists() else {}
    results[args.key] = result
    out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
