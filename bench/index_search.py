"""Index and search benchmark on the shared corpus (needs ../shared).

    .venv/bin/python bench/index_search.py [--replicas-to 100000] [--skip-100k]
    .venv/bin/python bench/index_search.py --tiny     # seconds, on the sample notes (a smoke run)

Phases, each in its own process so that peak RSS is that phase's own:
1. index   `leanote-rag index` of the corpus through the mongodump source into a
           fresh state dir: seconds, chunks/s, peak RSS, size on disk; when every note was
           searchable (rows committed, HNSW built: before the memory's entities and related
           notes) and the seconds spent in the embedder inside the pass;
2. embed   the embedder alone on the very chunk texts the index embedded, same
           batch size: the floor the index run is compared with;
3. search  in-process hybrid search over the dev questions, three rounds: p50/p95 ms, and the
           first round's p50 (each question's first search in the process), RSS;
4. 100k    the corpus's points replicated under the same users to >= 100k chunks in
           a second index: upsert, HNSW build, reopen time, search p50.

Prints the results as JSON and writes bench/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file, shared, tiny_world  # noqa: E402

PY = sys.executable


PEAK = """
def _peak_mb():
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) // 1024
"""


def child(code: str, *args: str) -> tuple[dict, float]:
    """Run a Python snippet in a fresh process: (its last line of JSON, seconds).
    Snippets report their own peak RSS (VmHWM) as peak_rss_mb."""
    t = time.perf_counter()
    out = subprocess.run([PY, "-c", PEAK + textwrap.dedent(code), *args], capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - t
    if out.returncode != 0:
        sys.exit(f"benchmark step failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1]), seconds


def du_mb(path: Path) -> float:
    """Space used on disk (blocks, like du: Qdrant's WAL files are sparse)."""
    return round(sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) / 1e6, 1)


INDEX = """
import io, json, sys, contextlib
from bot.cli import main  # the composition root: every command, index included
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    code = main(["--config", sys.argv[1], "index", "--json"])
assert code == 0, code
summary = json.loads(buf.getvalue())
summary["peak_rss_mb"] = _peak_mb()
print(json.dumps(summary))
"""


EMBED_ALONE = """
import json, sys, time
from rag import config
from rag.index.embed import load
from rag.index.note_index import NoteIndex
s = config.load(sys.argv[1])
with NoteIndex.open(s) as index:
    texts = []
    offset = None
    store = index.store
    import qdrant_edge as qe
    while True:
        req = qe.ScrollRequest(limit=2000, offset=offset, with_payload=["text"]) if offset else qe.ScrollRequest(limit=2000, with_payload=["text"])
        recs, offset = store._shard.scroll(req)
        texts += [r.payload["text"] for r in recs]
        if offset is None:
            break
from rag.index.note_index import embed_text
from rag.model import Chunk
texts = [embed_text(Chunk(0, t, (), 0, len(t))) for t in texts]
e = load(s.embedder)
t = time.perf_counter()
e.embed(texts)
print(json.dumps({"chunks": len(texts), "seconds": time.perf_counter() - t, "peak_rss_mb": _peak_mb()}))
"""

SEARCH = """
import json, sys, time, resource
from rag import config
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search
s = config.load(sys.argv[1])
questions = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
t0 = time.perf_counter()
index = NoteIndex.open(s)
opened = time.perf_counter() - t0
for q in questions[:5]:  # warm up
    search(index, q["question"], q["user_id"])
rounds = []
for _ in range(3):
    times = []
    for q in questions:
        t = time.perf_counter()
        search(index, q["question"], q["user_id"])
        times.append((time.perf_counter() - t) * 1000)
    rounds.append(sorted(times))
times = sorted(t for r in rounds for t in r)
# The first round is each question's first search in this process (the store's point -> note map
# and kept payloads hold only what the warm-up and the questions before it read); later rounds repeat them.
print(json.dumps({"open_s": opened, "n": len(times), "p50_ms": times[len(times) // 2],
                  "p95_ms": times[int(len(times) * 0.95)], "first_round_p50_ms": rounds[0][len(rounds[0]) // 2],
                  "peak_rss_mb": _peak_mb()}))
"""

REPLICATE = """
import json, sys, time
import numpy as np
import qdrant_edge as qe
from rag.index.points import PointData, point_id
from rag.index.store_edge import EdgeStore
from rag.index.lexical import SparseVector
src = qe.EdgeShard.load(sys.argv[1])
target, goal = sys.argv[2], int(sys.argv[3])
points, offset = [], None
while True:
    req = qe.ScrollRequest(limit=2000, offset=offset, with_payload=True, with_vector=True) if offset else qe.ScrollRequest(limit=2000, with_payload=True, with_vector=True)
    recs, offset = src.scroll(req)
    points += recs
    if offset is None:
        break
src.close()
copies = -(-goal // len(points))
store = EdgeStore(target, len(points[0].vector["dense"]))
t = time.perf_counter()
n = 0
for c in range(copies):
    batch = []
    for r in points:
        p = dict(r.payload)
        p["note_id"] = f"{p['note_id']}-{c}"
        sv = r.vector["bm25"]
        batch.append(PointData(point_id(p["note_id"], p["chunk_index"]), np.asarray(r.vector["dense"], dtype=np.float32),
                               SparseVector(list(sv.indices), list(sv.values)), p))
    for i in range(0, len(batch), 1000):
        store.upsert(batch[i:i + 1000])
    n += len(batch)
upsert_s = time.perf_counter() - t
t = time.perf_counter()
store.optimize()
optimize_s = time.perf_counter() - t
store.close()
print(json.dumps({"points": n, "copies": copies, "upsert_s": upsert_s, "optimize_s": optimize_s, "peak_rss_mb": _peak_mb()}))
"""

REOPEN = """
import json, sys, time
from rag.index.store_edge import EdgeStore
t = time.perf_counter()
s = EdgeStore(sys.argv[1], 512)
print(json.dumps({"reopen_s": time.perf_counter() - t}))
"""

SEARCH_100K = """
import json, sys, time
from rag.config import RetrievalConfig
from rag.index.embed import load
from rag.config import EmbedderConfig
from rag.index.lexical import query_vector
from rag.index.retrieve import fuse, cap_per_note
from rag.index.store_edge import EdgeStore
questions = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
cfg = RetrievalConfig()
e = load(EmbedderConfig())
store = EdgeStore(sys.argv[1], 512)
rounds = []
for _ in range(2):
    times = []
    for q in questions:
        t = time.perf_counter()
        dense = e.embed_query([q["question"]])[0]
        d, s = store.search(dense, query_vector(q["question"]), q["user_id"], cfg.candidates, cfg.hnsw_ef)
        chosen = cap_per_note(fuse({"dense": d, "sparse": s}, cfg), cfg.max_chunks_per_note, cfg.top_k)
        store.payloads([c.id for c in chosen])
        times.append((time.perf_counter() - t) * 1000)
    rounds.append(sorted(times))
times = sorted(t for r in rounds for t in r)
print(json.dumps({"p50_ms": times[len(times) // 2], "p95_ms": times[int(len(times) * 0.95)],
                  "first_round_p50_ms": rounds[0][len(rounds[0]) // 2], "peak_rss_mb": _peak_mb()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas-to", type=int, default=100_000)
    ap.add_argument("--skip-100k", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    ap.add_argument("--tiny", action="store_true", help="a smoke run on the sample notes, replicated to 200 points")
    args = ap.parse_args()
    if args.tiny:
        tiny_world()
        args.replicas_to = 200
    backup = shared() / "corpus" / "mongodump" / "backup_leanote_20250601.tar.gz"
    dev = shared() / "eval" / "dev.jsonl"
    if not backup.exists():
        sys.exit(f"needs the shared corpus at {shared()} (set LEANOTE_RAG_SHARED), or --tiny")
    work = Path(tempfile.mkdtemp(prefix="leanote-rag-bench-"))
    config = work / "config.yaml"
    config.write_text(f"source:\n  kind: mongodump\n  path: {backup}\nstate_dir: {work / 'data'}\n")
    results: dict = {"cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}

    summary, seconds = child(INDEX, str(config))
    chunks = summary["chunks_embedded"]
    results["index"] = {
        "notes": summary["added"],
        "chunks": chunks,
        "seconds": round(seconds, 1),
        "of_which_hnsw_build_s": summary["optimize_seconds"],
        "chunks_per_s": round(chunks / seconds, 1),
        # every note in the index (rows committed, HNSW built), before the memory's entities and related notes
        "searchable_s": summary["searchable_seconds"],
        "searchable_chunks_per_s": round(chunks / summary["searchable_seconds"], 1) if summary["searchable_seconds"] else None,
        "of_which_embedder_s": summary["embed_seconds"],
        "peak_rss_mb": summary["peak_rss_mb"],
        "qdrant_mb": du_mb(work / "data" / "qdrant"),
        "state_db_mb": round(du_mb(work / "data") - du_mb(work / "data" / "qdrant"), 1),
    }
    alone, _ = child(EMBED_ALONE, str(config))
    results["embedder_alone"] = {"chunks": alone["chunks"], "seconds": round(alone["seconds"], 1),
                                 "chunks_per_s": round(alone["chunks"] / alone["seconds"], 1)}
    results["index"]["share_of_embedder_throughput"] = round(
        results["index"]["chunks_per_s"] / results["embedder_alone"]["chunks_per_s"], 3
    )
    if results["index"]["searchable_chunks_per_s"]:
        results["index"]["searchable_share_of_embedder_throughput"] = round(
            results["index"]["searchable_chunks_per_s"] / results["embedder_alone"]["chunks_per_s"], 3)
    found, _ = child(SEARCH, str(config), str(dev))
    results["search"] = {k: round(v, 2) if isinstance(v, float) else v for k, v in found.items()}

    if not args.skip_100k:
        big = work / "big" / "qdrant"
        rep, _ = child(REPLICATE, str(work / "data" / "qdrant"), str(big), str(args.replicas_to))
        reopen, _ = child(REOPEN, str(big))
        s100, _ = child(SEARCH_100K, str(big), str(dev))
        results["replicated"] = {
            "points": rep["points"],
            "upsert_s": round(rep["upsert_s"], 1),
            "hnsw_build_s": round(rep["optimize_s"], 1),
            "reopen_s": round(reopen["reopen_s"], 3),
            "search_p50_ms": round(s100["p50_ms"], 2),
            "search_p95_ms": round(s100["p95_ms"], 2),
            "search_first_round_p50_ms": round(s100["first_round_p50_ms"], 2),
            "search_peak_rss_mb": s100["peak_rss_mb"],
            "build_peak_rss_mb": rep["peak_rss_mb"],
            "disk_mb": du_mb(big),
        }

    out = results_file("results.json", args.tiny)
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(results, indent=2, ensure_ascii=False))
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
