"""How soon a note file written into the notes folder is searchable under `serve`, and
what a pass over an unchanged folder costs.

    .venv/bin/python bench/snapshot_live.py [CHANGES]
    .venv/bin/python bench/snapshot_live.py --tiny      # seconds (a smoke run)

A real `serve` process (default embedder, embedded Qdrant) over a copy of
examples/notes; a new note file is written and the clock stops when its row in
state.db says "indexed" (the pass has written its points and committed):
1. with the file watcher (sync.watch, defaults: watch_debounce 1 s, trigger_debounce
   10 s) and sync.interval 1 h: changes spaced past the trigger debounce ("isolated")
   and changes made as soon as the previous one is in ("back to back");
2. polling: watcher off, sync.interval 5 s, each change written at a random moment.
3. a pass over an unchanged folder (size + mtime fingerprints, nothing read) vs a
   full re-read (the reconcile: every file read and hashed, nothing embedded), over
   the 15 sample notes and over 1,500 files (the samples copied 100 times).
``--tiny``: one change of each kind, sync.trigger_debounce 0.5 s, watch_debounce 0.2 s,
polling every 0.5 s, the idle passes over the samples and 3 copies of them.
Prints JSON and writes bench/snapshot_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file  # noqa: E402

EXAMPLES = REPO / "examples" / "notes"

from rag import config  # noqa: E402
from rag.index.note_index import NoteIndex  # noqa: E402
from sync.sources.files import stable_id  # noqa: E402
from sync.state import State  # noqa: E402
from bot.root import Parts  # noqa: E402

EXE = str(Path(sys.executable).with_name("leanote-rag"))


def status(db: Path, note_id: str) -> str | None:
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            row = con.execute("SELECT status FROM notes WHERE note_id = ?", (note_id,)).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def finished_runs(db: Path) -> int:
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return con.execute("SELECT COUNT(*) FROM runs WHERE finished IS NOT NULL").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def stats(values: list[float]) -> dict:
    return {"p50_s": round(statistics.median(values), 2), "max_s": round(max(values), 2),
            "each_s": [round(v, 2) for v in values]}


class Serve:
    """A serve process over a fresh copy of the sample notes."""

    def __init__(self, sync: str):
        self.work = Path(tempfile.mkdtemp(prefix="leanote-rag-live-"))
        self.notes = self.work / "notes"
        shutil.copytree(EXAMPLES, self.notes)
        self.config = self.work / "config.yaml"
        self.config.write_text(
            f"state_dir: data\nsource: {{kind: files, path: '{self.notes}'}}\nsync: {sync}\n"
            f"ollama: {{enabled: false}}\nrerank: {{kind: none}}\napi: {{socket: '{self.work}/api.sock'}}\n",
            encoding="utf-8",
        )
        self.db = self.work / "data" / "state.db"
        self.proc = subprocess.Popen([EXE, "--config", str(self.config), "serve"], cwd=REPO,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while finished_runs(self.db) < 1:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"serve did not finish its first pass: {self.proc.stderr.read()[-2000:]}")
            time.sleep(0.05)
        self.n = 0

    def change(self) -> float:
        """Write a new note; seconds until it is indexed."""
        self.n += 1
        rel = f"新/变化{self.n}.md"
        path = self.notes / rel
        path.parent.mkdir(exist_ok=True)
        note_id = stable_id(f"file:{rel}")
        start = time.monotonic()
        path.write_text(f"# 变化{self.n}\n\n第 {self.n} 次写入的笔记，编号 LIVE-{self.n}-{random.random()}。\n",
                        encoding="utf-8")
        while status(self.db, note_id) != "indexed":
            if self.proc.poll() is not None:
                sys.exit(f"serve exited: {self.proc.stderr.read()[-2000:]}")
            if time.monotonic() - start > 600:
                sys.exit(f"change {self.n} not indexed after 600 s")
            time.sleep(0.01)
        return time.monotonic() - start

    def idle_passes(self) -> list[float]:
        con = sqlite3.connect(self.db, timeout=5)
        try:
            rows = con.execute("SELECT summary FROM runs WHERE finished IS NOT NULL AND error IS NULL").fetchall()
        finally:
            con.close()
        out = []
        for (summary,) in rows:
            s = json.loads(summary or "{}")
            if s and not (s.get("added") or s.get("updated") or s.get("deleted") or s.get("moved")):
                out.append(s["seconds"])
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=120)
        if self.proc.returncode != 0 or "Traceback" in err:
            sys.exit(f"serve did not stop cleanly: {err[-2000:]}")
        shutil.rmtree(self.work, ignore_errors=True)


def pass_costs(copies: int, runs: int = 20) -> dict:
    """An idle pass (fingerprints) vs a full re-read (reconcile), in-process, ms."""
    work = Path(tempfile.mkdtemp(prefix="leanote-rag-idle-"))
    notes = work / "notes"
    if copies == 1:
        shutil.copytree(EXAMPLES, notes)
    else:
        for i in range(copies):
            shutil.copytree(EXAMPLES, notes / f"copy{i:03d}")
    old = time.time() - 3600  # synced long ago: fingerprints are trusted
    for path in notes.rglob("*"):
        os.utime(path, (old, old))
    files = sum(1 for p in notes.rglob("*") if p.is_file())
    settings = config.from_dict({"source": {"kind": "files", "path": str(notes)}, "state_dir": str(work / "data")},
                                base_dir=work)
    state = State(settings.state_dir)
    index = NoteIndex.open(settings, create=True)
    service = Parts(settings, index=index, state=state).sync
    first = service.run_pass()
    assert first.ok, first.failures
    idle, full = [], []
    for _ in range(runs):
        t = time.perf_counter()
        r = service.run_pass()
        idle.append((time.perf_counter() - t) * 1000)
        assert r.ok and r.summary.changed == 0 and r.summary.unchanged == first.summary.added
        t = time.perf_counter()
        r = service.run_pass(reconcile=True)
        full.append((time.perf_counter() - t) * 1000)
        assert r.ok and r.summary.changed == 0 and r.summary.chunks_embedded == 0
    service.close()
    index.close()
    state.close()
    shutil.rmtree(work, ignore_errors=True)
    p50_idle, p50_full = statistics.median(idle), statistics.median(full)
    return {"files": files, "notes": first.summary.added, "idle_pass_ms": {"p50": round(p50_idle, 1), "max": round(max(idle), 1)},
            "full_reread_ms": {"p50": round(p50_full, 1), "max": round(max(full), 1)},
            "full_over_idle": round(p50_full / p50_idle, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("changes", nargs="?", type=int, help="how many changes to time (default 5)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run: one change of each kind, short debounces")
    args = ap.parse_args()
    changes = args.changes or (1 if args.tiny else 5)
    # sync.trigger_debounce (its default: 10 s) and watch_debounce (1 s), the polling interval, copies of the samples
    debounce, watch_debounce, poll, copies = (0.5, 0.2, 0.5, 3) if args.tiny else (10, 1, 5, 100)
    random.seed(7)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(), "changes": changes}

    serve = Serve(f"{{interval: 1h, watch: true, trigger_debounce: {debounce}, watch_debounce: {watch_debounce}}}")
    isolated, back_to_back = [], []
    for i in range(changes):
        time.sleep(debounce * 1.1)  # past sync.trigger_debounce since the last trigger
        isolated.append(serve.change())
        print(f"watcher, isolated change {i + 1}: {isolated[-1]:.2f} s", file=sys.stderr)
    for i in range(changes):
        back_to_back.append(serve.change())
        print(f"watcher, back-to-back change {i + 1}: {back_to_back[-1]:.2f} s", file=sys.stderr)
    serve.stop()
    results["watcher_interval_1h"] = {"isolated": stats(isolated), "back_to_back": stats(back_to_back)}

    serve = Serve(f"{{interval: {poll}s, watch: false}}")
    polled = []
    for i in range(changes):
        time.sleep(random.uniform(0, poll))
        polled.append(serve.change())
        print(f"polling every {poll} s, change {i + 1}: {polled[-1]:.2f} s", file=sys.stderr)
    time.sleep(poll * 2.2)  # two idle passes (nothing changed) in the serve process
    idle = serve.idle_passes()
    serve.stop()
    results[f"polling_interval_{poll}s"] = {**stats(polled), "idle_pass_in_serve_s": {
        "passes": len(idle), "p50": round(statistics.median(idle), 3) if idle else None,
        "max": round(max(idle), 3) if idle else None}}

    results["idle_pass_vs_full_reread"] = {
        "sample_notes": pass_costs(1, runs=3 if args.tiny else 20),
        f"sample_notes_x{copies}": pass_costs(copies, runs=3 if args.tiny else 5),
    }
    text = json.dumps(results, ensure_ascii=False, indent=1)
    print(text)
    results_file("snapshot_results.json", args.tiny).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
