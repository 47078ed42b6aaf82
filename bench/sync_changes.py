"""Incremental sync benchmark on the shared corpus (needs ../shared).

    .venv/bin/python bench/sync_changes.py

A local Leanote (tests/fakes/leanote.py, the API as leanote-api.md describes it)
serves the corpus to the real sync code, default embedder, embedded Qdrant:
1. full sync of both users;
2. an idle sync: time and HTTP calls per account;
3. the 20-change batch (changes.jsonl): chunks embedded vs chunks whose text
   changed, and its time as a share of the full sync.
Prints JSON and writes bench/sync_results.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
SHARED = Path(os.environ.get("LEANOTE_RAG_SHARED", REPO.parent / "shared"))
CORPUS = SHARED / "corpus"

from fakes.leanote import FakeLeanote  # noqa: E402

from rag import config  # noqa: E402
from rag.eval import evaluate, load_questions, report_json  # noqa: E402
from rag.index import NoteIndex  # noqa: E402
from rag.retrieve import search  # noqa: E402
from sync.service import SyncService  # noqa: E402
from sync.state import State  # noqa: E402


def chunk_keys(state: State) -> set[str]:
    rows = state.db.execute("SELECT chunk_keys FROM notes WHERE status = 'indexed'")
    return {k for (keys,) in rows for k in json.loads(keys)}


def main() -> None:
    if not (CORPUS / "notes.jsonl").exists():
        sys.exit(f"needs the shared corpus at {CORPUS} (set LEANOTE_RAG_SHARED)")
    os.environ["BENCH_PW_ONE"], os.environ["BENCH_PW_TWO"] = "one-secret", "two-secret"
    work = Path(tempfile.mkdtemp(prefix="leanote-rag-syncbench-"))
    results: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count()}
    with FakeLeanote() as leanote:
        leanote.load_corpus(CORPUS)
        settings = config.from_dict(
            {
                "leanote": {"base_url": leanote.url},
                "source": {"kind": "leanote_api", "accounts": [
                    {"email": "one@example.com", "password_env": "BENCH_PW_ONE"},
                    {"email": "two@example.com", "password_env": "BENCH_PW_TWO"}]},
                "state_dir": str(work / "data"),
            },
            base_dir=work,
        )
        state = State(settings.state_dir)
        index = NoteIndex.open(settings, create=True)  # loads the embedder: not timed
        service = SyncService(settings, index, state)

        t = time.perf_counter()
        full = service.run_pass()
        full_s = time.perf_counter() - t
        assert full.ok, full.failures
        results["full_sync"] = {"notes": full.summary.added, "chunks_embedded": full.summary.chunks_embedded,
                                "seconds": round(full_s, 1), "http_calls": sum(leanote.calls.values())}

        idle_ms, calls = [], []
        for _ in range(20):
            leanote.calls.clear()
            t = time.perf_counter()
            idle = service.run_pass()
            idle_ms.append((time.perf_counter() - t) * 1000)
            calls.append(sum(leanote.calls.values()))
            assert all(r.idle for r in idle.results.values())
        idle_ms.sort()
        results["idle_sync"] = {"p50_ms": round(idle_ms[len(idle_ms) // 2], 1), "max_ms": round(idle_ms[-1], 1),
                                "http_calls_per_account": max(calls) / 2, "calls": dict(leanote.calls)}

        before = chunk_keys(state)
        for line in open(CORPUS / "changes.jsonl", encoding="utf-8"):
            leanote.apply_change(json.loads(line))
        leanote.calls.clear()
        t = time.perf_counter()
        batch = service.run_pass()
        batch_s = time.perf_counter() - t
        assert batch.ok, batch.failures
        changed_texts = len(chunk_keys(state) - before)
        s = batch.summary
        results["change_batch"] = {
            "changes": 20,
            "notes": {"added": s.added, "updated": s.updated, "moved": s.moved, "deleted": s.deleted,
                      "not_indexed": s.not_indexed},
            "chunks_whose_text_changed": changed_texts,
            "chunks_embedded": s.chunks_embedded,
            "embedded_per_changed_chunk": round(s.chunks_embedded / changed_texts, 3) if changed_texts else None,
            "seconds": round(batch_s, 2),
            "share_of_full_sync": round(batch_s / full_s, 4),
            "http_calls": dict(leanote.calls),
        }
        # retrieval once the change batch is synced: after_changes questions count now
        dev = SHARED / "eval" / "dev.jsonl"
        if dev.exists():
            reports, _ = evaluate(lambda q, u, k, r: search(index, q, u, k, retriever=r), load_questions(dev),
                                  with_changes=True)
            metrics = report_json(reports, 0)["retrievers"]
            results["eval_with_changes"] = {
                name: {k: m[k] for k in ("questions", "recall@5", "recall@20", "hit@5", "mrr@10", "trap_leaks")}
                for name, m in metrics.items()
            }
        index.close()
        state.close()
    shutil.rmtree(work, ignore_errors=True)
    out = REPO / "bench" / "sync_results.json"
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
