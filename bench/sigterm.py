"""How fast `leanote-rag serve` stops on SIGTERM in the middle of a sync (needs ../shared).

    .venv/bin/python bench/sigterm.py [RUNS]

A local Leanote (tests/fakes/leanote.py) serves the shared corpus; a real `serve`
process (default embedder, embedded Qdrant) starts its first full sync and gets
SIGTERM once a third of the notes are in, as systemd's `stop` sends it. Measured:
seconds from the signal to the process's exit, and whether the log holds an ERROR
or a traceback. After the last run, `index` finishes the sync from where it stopped.
Prints JSON and writes bench/sigterm_results.json.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
SHARED = Path(os.environ.get("LEANOTE_RAG_SHARED", REPO.parent / "shared"))
CORPUS = SHARED / "corpus"
EXE = str(Path(sys.executable).with_name("leanote-rag"))

from fakes.leanote import FakeLeanote  # noqa: E402


def notes_in(db: Path) -> int:
    try:
        return sqlite3.connect(db, timeout=1).execute("SELECT COUNT(*) FROM notes").fetchone()[0]
    except sqlite3.Error:
        return 0


def main() -> None:
    if not (CORPUS / "notes.jsonl").exists():
        sys.exit(f"needs the shared corpus at {CORPUS} (set LEANOTE_RAG_SHARED)")
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    env = {**os.environ, "BENCH_PW_ONE": "one-secret", "BENCH_PW_TWO": "two-secret"}
    total = sum(1 for _ in open(CORPUS / "notes.jsonl", encoding="utf-8"))
    stops, problems, fractions = [], [], []
    with FakeLeanote() as leanote:
        leanote.load_corpus(CORPUS)
        for run in range(runs):
            work = Path(tempfile.mkdtemp(prefix="leanote-rag-sigterm-"))
            config = work / "config.yaml"
            config.write_text(
                f"leanote: {{base_url: '{leanote.url}'}}\nstate_dir: data\n"
                "source:\n  kind: leanote_api\n  accounts:\n"
                "    - {email: one@example.com, password_env: BENCH_PW_ONE}\n"
                "    - {email: two@example.com, password_env: BENCH_PW_TWO}\n"
                "ollama: {enabled: false}\nrerank: {kind: none}\nsync: {interval: 1h}\n"
            )
            proc = subprocess.Popen([EXE, "--config", str(config), "serve"], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
            db = work / "data" / "state.db"
            while notes_in(db) < total / 3:
                if proc.poll() is not None:
                    sys.exit(f"serve exited early: {proc.stderr.read()}")
                time.sleep(0.05)
            fractions.append(round(notes_in(db) / total, 3))
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, log = proc.communicate(timeout=120)
            stops.append(round(time.monotonic() - signalled, 3))
            if proc.returncode != 0 or "Traceback" in log or " ERROR " in log:
                problems.append({"run": run, "returncode": proc.returncode, "log": log[-2000:]})
            print(f"run {run + 1}: stopped in {stops[-1]:.2f} s at {fractions[-1]:.0%} of the notes", file=sys.stderr)
        finish = subprocess.run([EXE, "--config", str(config), "index", "--json"], env=env, capture_output=True,
                                text=True, timeout=600)
    summary = json.loads(finish.stdout) if finish.returncode == 0 else {"error": finish.stderr[-500:]}
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "runs": runs,
        "notes": total,
        "stopped_at_fraction": fractions,
        "sigterm_to_exit_s": stops,
        "p50_s": statistics.median(stops),
        "max_s": max(stops),
        "runs_with_error_or_traceback": problems,
        "restart_index": {k: summary.get(k) for k in ("added", "unchanged", "chunks_embedded", "chunks_cached",
                                                        "seconds", "error") if k in summary},
    }
    text = json.dumps(results, ensure_ascii=False, indent=1)
    print(text)
    (REPO / "bench" / "sigterm_results.json").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
