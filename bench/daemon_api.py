"""The daemon as the one door (needs ../shared).

    .venv/bin/python bench/daemon_api.py [EDITS]
    .venv/bin/python bench/daemon_api.py --tiny     # seconds, on the sample notes (a smoke run)

A local Leanote (tests/fakes/leanote.py) serves the shared corpus through its API;
the real sync code indexes it (default embedder). Measured:
1. search in this process on the index it opened, vs the same searches through a
   running `serve` process's Unix-socket API (the added latency of the one door),
   and `leanote-rag search` as a command both ways (wall time);
2. the idle daemon's resident memory with the API on;
3. with the default `sync.interval` (1 minute), the time from an edit in Leanote to
   the edited text being found through the daemon, for EDITS edits (default 5) made
   at random moments.
``--tiny``: the sample notes (bench/common.py's ``tiny_world``), each command once, no
idle, one edit with a 1 s ``sync.interval``. Prints JSON and writes
bench/daemon_api_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file, shared, tiny_world  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
EXE = str(Path(sys.executable).with_name("leanote-rag"))

from fakes.leanote import FakeLeanote  # noqa: E402

from rag import config as config_mod  # noqa: E402
from bot.api.client import find_daemon  # noqa: E402
from bot.cli.door import DaemonDoor, LocalDoor  # noqa: E402
from bot.usecases.people import Person  # noqa: E402
from rag.eval import load_questions  # noqa: E402


def ms(values: list[float]) -> dict:
    values = sorted(values)
    return {"p50_ms": round(statistics.median(values) * 1000, 2),
            "p95_ms": round(values[int(0.95 * (len(values) - 1))] * 1000, 2)}


def timed(fn, items) -> list[float]:
    out = []
    for item in items:
        t = time.perf_counter()
        fn(item)
        out.append(time.perf_counter() - t)
    return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("edits", nargs="?", type=int, help="notes edited while it is asked (default 5)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run on the sample notes, one edit, 1 s sync interval")
    args = ap.parse_args()
    edits = args.edits or (1 if args.tiny else 5)
    commands, idle_s = (1, 0) if args.tiny else (5, 10)  # each `leanote-rag search` command timed; idle seconds
    if args.tiny:
        tiny_world()
    corpus = shared() / "corpus"
    if not (corpus / "notes.jsonl").exists():
        sys.exit(f"needs the shared corpus at {corpus} (set LEANOTE_RAG_SHARED), or --tiny")
    questions = [q for q in load_questions(shared() / "eval" / "dev.jsonl") if not q.get("after_changes")]
    env = {**os.environ, "BENCH_PW_ONE": "one-secret", "BENCH_PW_TWO": "two-secret"}
    work = Path(tempfile.mkdtemp(prefix="leanote-rag-apibench-"))
    results: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(), "questions": len(questions)}
    with FakeLeanote() as leanote:
        leanote.load_corpus(corpus)
        config = work / "config.yaml"
        config.write_text(
            f"leanote: {{base_url: '{leanote.url}'}}\nstate_dir: data\n"
            "source:\n  kind: leanote_api\n  accounts:\n"
            "    - {email: one@example.com, password_env: BENCH_PW_ONE}\n"
            "    - {email: two@example.com, password_env: BENCH_PW_TWO}\n"
            "ollama: {enabled: false}\nrerank: {kind: none}\n"
            f"api: {{socket: '/tmp/lr-bench-{os.getpid()}.sock'}}\n"
            + ("sync: {interval: 1s}\n" if args.tiny else "")
        )
        settings = config_mod.load(config)
        t = time.monotonic()
        subprocess.run([EXE, "--config", str(config), "index"], env=env, check=True, capture_output=True)
        results["full_index_s"] = round(time.monotonic() - t, 1)

        def search_with(door):
            return lambda q: door.search(Person("cli", q["user_id"]), q["question"], 20, "hybrid")

        with LocalDoor(settings) as door:
            search_with(door)(questions[0])  # warm: the model and the index are loaded
            direct = timed(search_with(door), questions * 3)

        def command(*args) -> float:
            t = time.monotonic()
            subprocess.run([EXE, "--config", str(config), *args], env=env, check=True, capture_output=True)
            return time.monotonic() - t

        cli_direct = [command("search", "restic 备份保留多少个快照", "--user", questions[0]["user_id"])
                      for _ in range(commands)]

        proc = subprocess.Popen([EXE, "--config", str(config), "serve"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            while (client := find_daemon(settings)) is None or client.health().get("passes", 0) < 1:
                if client is not None:
                    client.close()
                time.sleep(0.2)
            time.sleep(idle_s)
            results["idle_daemon_rss_mb"] = rss_mb(proc.pid)
            with DaemonDoor(client) as door:
                search_with(door)(questions[0])
                through = timed(search_with(door), questions * 3)
                cli_daemon = [command("search", "restic 备份保留多少个快照", "--user", questions[0]["user_id"])
                              for _ in range(commands)]

                # edits in Leanote, at random moments: how long until they are found
                note = next(n for n in leanote.notes.values() if not n["IsTrash"] and not n["IsDeleted"])
                me = Person("cli", note["UserId"])
                waits = []
                for i in range(edits):
                    time.sleep(random.uniform(0, settings.sync.interval))
                    marker = f"EDIT-MARKER-{i}-{random.randrange(10**6)}"
                    edited = dict(note)
                    edited["Content"] = f"{note['Content']}\n\n{marker} 新加的一段。"
                    t = time.monotonic()
                    leanote.put_note(edited)
                    while not any(marker in h.text for h in door.search(me, marker, 5, "sparse").hits):
                        time.sleep(0.2)
                    waits.append(round(time.monotonic() - t, 2))
                    print(f"edit {i + 1}: found after {waits[-1]} s", file=sys.stderr)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
    shutil.rmtree(work)
    results["search_in_process"] = ms(direct)
    results["search_through_daemon"] = ms(through)
    results["added_latency_p50_ms"] = round(results["search_through_daemon"]["p50_ms"]
                                            - results["search_in_process"]["p50_ms"], 2)
    results["cli_search_direct_s"] = round(statistics.median(cli_direct), 2)
    results["cli_search_through_daemon_s"] = round(statistics.median(cli_daemon), 2)
    results["sync_interval_s"] = settings.sync.interval
    results["edit_to_found_s"] = {"each": waits, "p50": statistics.median(waits), "max": max(waits)}
    text = json.dumps(results, ensure_ascii=False, indent=1)
    print(text)
    results_file("daemon_api_results.json", args.tiny).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
