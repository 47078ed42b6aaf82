"""Does a crash change the ranking? (needs ../shared)

    .venv/bin/python bench/crash_ranking.py                      # this tree
    .venv/bin/python bench/crash_ranking.py --code /tmp/old-tree  # and another source tree, e.g. before a fix

Two state dirs sync the shared corpus from a local Leanote (tests/fakes/leanote.py) through
the real ``leanote-rag index`` command: one undisturbed, one killed with SIGKILL at seeded
points of each step and then run to the end. The steps: the full sync (three kills near
35, 70 and 97 % of its embedding batches, each while the process waits for one), the 20-change batch
(changes.jsonl; killed at its embedding, then at its first note body), a batch of malformed
notes beside good ones and a note cut short (the same two kills). After each step
``leanote-rag search --queries eval/dev.jsonl --retriever R -k 10`` runs in both dirs for
R = sparse, dense, hybrid, and the questions whose top-10 lists differ are counted; the
stored points (ids, payloads, vectors) are compared too.

The embedder is the fake Ollama at 512 dimensions, the size of the default USE model, so the
undisturbed index passes Qdrant's indexing threshold (~10 MB of vectors) and its full sync
leaves an optimized (HNSW) segment, as with the real model; the resumed one is optimized only
if its last run wrote 1000 chunks (``qdrant.optimize_after``), which here it does not. The
memory is off: search does not read it.
Each ``--code`` tree runs the same schedule (its code on PYTHONPATH, the fakes from here).
Prints JSON and writes bench/crash_ranking_results.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
SHARED = Path(os.environ.get("LEANOTE_RAG_SHARED", REPO.parent / "shared"))
CORPUS = SHARED / "corpus"
EXE = str(Path(sys.executable).with_name("leanote-rag"))
USER_ONE = "5dbed2987db161bc2a85b919"
RETRIEVERS = ("sparse", "dense", "hybrid")
SEED = 18


def config(folder: Path, leanote_url: str, ollama_url: str) -> Path:
    folder.mkdir(parents=True)
    path = folder / "config.yaml"
    path.write_text(
        f"leanote: {{base_url: '{leanote_url}'}}\nstate_dir: data\n"
        f"source:\n  kind: leanote_api\n  accounts:\n"
        f"    - {{email: one@example.com, password_env: LR_PW_ONE}}\n"
        f"    - {{email: two@example.com, password_env: LR_PW_TWO}}\n"
        f"embedder: {{kind: ollama, host: '{ollama_url}'}}\nsync: {{page_size: 50}}\nmemory: {{enabled: false}}\n"
        f"ollama: {{enabled: false}}\nrerank: {{kind: none}}\n"
    )
    return path


def segments(cfg: Path) -> list[str]:
    kinds = []
    for f in sorted(glob.glob(str(cfg.parent / "data" / "qdrant" / "segments" / "*" / "segment.json"))):
        c = json.load(open(f))["config"]
        kinds.append(f"{c['vector_data']['dense']['index']['type']}/{c['sparse_vector_data']['bm25']['index']['index_type']}")
    return kinds


def points(cfg: Path) -> dict:
    import numpy as np
    import qdrant_edge as qe

    shard = qe.EdgeShard.load(str(cfg.parent / "data" / "qdrant"))
    found, offset = {}, None
    try:
        while True:
            kwargs = {"offset": offset} if offset else {}
            recs, offset = shard.scroll(qe.ScrollRequest(limit=1000, with_payload=True, with_vector=True, **kwargs))
            for r in recs:
                s = r.vector["bm25"]
                found[str(r.id)] = (json.dumps(dict(r.payload), sort_keys=True, ensure_ascii=False),
                                    tuple(np.round(r.vector["dense"], 5)), tuple(s.indices), tuple(np.round(s.values, 6)))
            if offset is None:
                return found
    finally:
        shard.close()


def run_code(code: Path, work: Path) -> dict:
    from fakes.leanote import FakeLeanote
    from fakes.ollama import FakeOllama

    env = {**os.environ, "LR_PW_ONE": "one-secret", "LR_PW_TWO": "two-secret", "PYTHONPATH": str(code)}
    rnd = random.Random(SEED)
    out: dict = {"code": str(code), "steps": {}}
    with FakeLeanote() as leanote, FakeOllama(dim=512) as ollama:
        leanote.load_corpus(CORPUS)
        ref, crashed = config(work / "reference", leanote.url, ollama.url), config(work / "crashed", leanote.url, ollama.url)

        def index(cfg: Path) -> None:
            done = subprocess.run([EXE, "--config", str(cfg), "index"], env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr

        def killed(embed: int | None = None) -> bool:
            started, proc = threading.Event(), {}
            start = ollama.embed_calls

            def kill(*_):
                started.wait(60)
                proc["p"].send_signal(signal.SIGKILL)

            if embed is None:
                leanote.after("note/getNoteContent", kill)
            else:
                ollama.on_embed = lambda n: kill() if n == start + embed else None
            try:
                proc["p"] = subprocess.Popen([EXE, "--config", str(crashed), "index"], env=env,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                started.set()
                proc["p"].wait()
            finally:
                ollama.on_embed = None
                leanote.after("note/getNoteContent", lambda *_: None)
            return proc["p"].returncode == -signal.SIGKILL

        def search(cfg: Path, retriever: str) -> list:
            done = subprocess.run([EXE, "--config", str(cfg), "search", "--queries", str(SHARED / "eval" / "dev.jsonl"),
                                   "--json", "--retriever", retriever, "-k", "10"], env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            return [[(h["note_id"], h["text"]) for h in json.loads(line)["hits"]] for line in done.stdout.splitlines()]

        def compare(step: str, kills: list[bool], started: float) -> None:
            row = {"kills_mid_work": sum(kills), "kill_attempts": len(kills),
                   "points_equal": points(ref) == points(crashed),
                   "segments": {"undisturbed": segments(ref), "crashed": segments(crashed)}}
            for retriever in RETRIEVERS:
                a, b = search(ref, retriever), search(crashed, retriever)
                row[retriever] = {"questions": len(a), "top10_differ": sum(x != y for x, y in zip(a, b))}
            row["seconds"] = round(time.monotonic() - started, 1)
            out["steps"][step] = row
            print(step, json.dumps(row), flush=True)

        t = time.monotonic()
        calls = ollama.embed_calls
        index(ref)
        calls = ollama.embed_calls - calls
        # three kills near 35, 70 and 97 % of the work (seeded ±2 %; a resumed run embeds only what
        # is not cached yet): the last run, the rest and the page it repeats, writes under 1000 chunks
        marks = [0.0, *(share + rnd.uniform(-0.02, 0.02) for share in (0.35, 0.7, 0.97))]
        kills = [killed(embed=max(2, round((b - a) * calls))) for a, b in zip(marks, marks[1:])]
        index(crashed)
        compare("full_sync", kills, t)

        t = time.monotonic()
        for line in open(CORPUS / "changes.jsonl", encoding="utf-8"):
            leanote.apply_change(json.loads(line))
        index(ref)
        kills = [killed(embed=2), killed()]
        index(crashed)
        compare("change_batch", kills, t)

        t = time.monotonic()
        leanote.malformed_batch(CORPUS, USER_ONE, rnd)
        index(ref)
        kills = [killed(embed=2), killed()]
        index(crashed)
        compare("malformed_batch", kills, t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", action="append", type=Path, default=[], help="another source tree to run too")
    args = parser.parse_args()
    if not (CORPUS / "notes.jsonl").exists():
        sys.exit(f"shared corpus not found at {CORPUS}")
    started = time.time()
    runs = []
    for code in [*args.code, REPO]:
        work = Path(tempfile.mkdtemp(prefix="crash-ranking-"))
        try:
            runs.append(run_code(code.resolve(), work))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    result = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
              "load_average_at_end": [round(x, 1) for x in os.getloadavg()],
              "seconds": round(time.time() - started, 1), "seed": SEED, "embedder": "fake Ollama, 512 dimensions",
              "runs": runs}
    text = json.dumps(result, indent=1, ensure_ascii=False)
    print(text)
    (REPO / "bench" / "crash_ranking_results.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
