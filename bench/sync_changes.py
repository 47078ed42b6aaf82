"""Incremental sync benchmark on the shared corpus (needs ../shared).

    .venv/bin/python bench/sync_changes.py                  # memory on and off, one after the other
    .venv/bin/python bench/sync_changes.py --memory off     # one of them
    .venv/bin/python bench/sync_changes.py --tiny           # seconds, on the sample notes (a smoke run)

A local Leanote (tests/fakes/leanote.py, the API as leanote-api.md describes it)
serves the corpus to the real sync code, default embedder, embedded Qdrant:
1. full sync of both users;
2. an idle sync: time and HTTP calls per account;
3. the 20-change batch (changes.jsonl): chunks embedded vs chunks whose text
   changed, and its time as a share of the full sync.

``--tiny``: the same on the sample notes (bench/common.py's ``tiny_world``: one user with
notes, the second with none, a 3-change batch), 5 idle syncs.

``--memory on|off|both`` (default both, each run from scratch in its own directory, one
after the other): ``on`` is ``memory.enabled: true, memory.llm: off`` (the no-LLM tier:
entities as notes are indexed, related notes recomputed after each pass), ``off`` is
``memory.enabled: false``. The top-level keys are the first run's (``on`` with both);
``memory`` holds both runs side by side: each pass's time, the time the indexer spent
bringing the memory in line (``sync.derived.Derived.follow``) and the related-notes refresh
after it (``rag.memory.related.refresh``: notes recomputed, pairs found, seconds), both timed by
wrapping those functions here. The retrieval eval runs once, in the first run (``search``
does not read the memory: the entities ranking is an answer's, see
bench/retrieval_steps.py).
Prints JSON and writes bench/sync_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file, shared, tiny_world  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))

from fakes.leanote import FakeLeanote  # noqa: E402

from rag import config  # noqa: E402
from rag.memory import related  # noqa: E402
from rag.eval import evaluate, load_questions, report_json  # noqa: E402
from rag.index.note_index import NoteIndex  # noqa: E402
from rag.index.retrieve import search  # noqa: E402
from sync import derived as derived_mod  # noqa: E402
from sync.state import State  # noqa: E402
from bot.root import Parts  # noqa: E402


def chunk_keys(state: State) -> set[str]:
    rows = state.db.execute("SELECT chunk_keys FROM notes WHERE status = 'indexed'")
    return {k for (keys,) in rows for k in json.loads(keys)}


class MemoryMeter:
    """Time spent on the memory in a pass: what follows each commit (``Derived.follow``) and the related refresh
    after the pass (the functions wrapped while the meter is installed)."""

    def __init__(self):
        self.update_s = 0.0
        self.refreshes: list = []  # rag.memory.related.Refresh per pass
        self._update = derived_mod.Derived.follow
        self._refresh = related.refresh

    def install(self) -> None:
        meter, update, refresh = self, self._update, self._refresh

        def timed_update(derived, *args, **kwargs):
            t = time.perf_counter()
            try:
                return update(derived, *args, **kwargs)
            finally:
                meter.update_s += time.perf_counter() - t

        def counted_refresh(*args, **kwargs):
            done = refresh(*args, **kwargs)
            meter.refreshes.append(done)
            return done

        derived_mod.Derived.follow = timed_update
        related.refresh = counted_refresh

    def uninstall(self) -> None:
        derived_mod.Derived.follow = self._update
        related.refresh = self._refresh

    def take(self) -> dict:
        """What the passes since the last take spent on the memory."""
        out = {"indexer_memory_s": round(self.update_s, 3),
               "related_notes_recomputed": sum(len(r.recomputed) for r in self.refreshes),
               "related_pairs": sum(r.pairs for r in self.refreshes),
               "related_s": round(sum(r.seconds for r in self.refreshes), 3)}
        self.update_s, self.refreshes = 0.0, []
        return out


def run(memory: bool, with_eval: bool, idle_runs: int) -> dict:
    """One run from scratch: full sync, idle syncs, the change batch (and the eval)."""
    work = Path(tempfile.mkdtemp(prefix="leanote-rag-syncbench-"))
    results: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
                     "memory": "on (no-LLM tier)" if memory else "off"}
    meter = MemoryMeter()
    meter.install()
    try:
        with FakeLeanote() as leanote:
            _run(leanote, work, memory, with_eval, idle_runs, meter, results)
    finally:
        meter.uninstall()
        shutil.rmtree(work, ignore_errors=True)
    return results


def _run(leanote, work: Path, memory: bool, with_eval: bool, idle_runs: int, meter: MemoryMeter,
         results: dict) -> None:
    corpus = shared() / "corpus"
    leanote.load_corpus(corpus)
    settings = config.from_dict(
        {
            "leanote": {"base_url": leanote.url},
            "source": {"kind": "leanote_api", "accounts": [
                {"email": "one@example.com", "password_env": "BENCH_PW_ONE"},
                {"email": "two@example.com", "password_env": "BENCH_PW_TWO"}]},
            "state_dir": str(work / "data"),
            "memory": {"enabled": memory, "llm": "off"},
        },
        base_dir=work,
    )
    state = State(settings.state_dir)
    index = NoteIndex.open(settings, create=True)  # loads the embedder: not timed
    service = Parts(settings, index=index, state=state).sync
    passes: dict = {}

    meter.take()
    t = time.perf_counter()
    full = service.run_pass()
    full_s = time.perf_counter() - t
    assert full.ok, full.failures
    results["full_sync"] = {"notes": full.summary.added, "chunks_embedded": full.summary.chunks_embedded,
                            "seconds": round(full_s, 1), "http_calls": sum(leanote.calls.values())}
    passes["full_sync"] = {"seconds": round(full_s, 1), **meter.take()}

    idle_ms, calls = [], []
    for _ in range(idle_runs):
        leanote.calls.clear()
        t = time.perf_counter()
        idle = service.run_pass()
        idle_ms.append((time.perf_counter() - t) * 1000)
        calls.append(sum(leanote.calls.values()))
        assert all(r.idle for r in idle.results.values())
    idle_ms.sort()
    results["idle_sync"] = {"p50_ms": round(idle_ms[len(idle_ms) // 2], 1), "max_ms": round(idle_ms[-1], 1),
                            "http_calls_per_account": max(calls) / 2, "calls": dict(leanote.calls)}
    passes["idle_sync"] = {"p50_ms": results["idle_sync"]["p50_ms"], **meter.take()}

    before = chunk_keys(state)
    changes = [json.loads(line) for line in open(corpus / "changes.jsonl", encoding="utf-8")]
    for change in changes:
        leanote.apply_change(change)
    leanote.calls.clear()
    t = time.perf_counter()
    batch = service.run_pass()
    batch_s = time.perf_counter() - t
    assert batch.ok, batch.failures
    changed_texts = len(chunk_keys(state) - before)
    s = batch.summary
    results["change_batch"] = {
        "changes": len(changes),
        "notes": {"added": s.added, "updated": s.updated, "moved": s.moved, "deleted": s.deleted,
                  "not_indexed": s.not_indexed},
        "chunks_whose_text_changed": changed_texts,
        "chunks_embedded": s.chunks_embedded,
        "embedded_per_changed_chunk": round(s.chunks_embedded / changed_texts, 3) if changed_texts else None,
        "seconds": round(batch_s, 2),
        "share_of_full_sync": round(batch_s / full_s, 4),
        "http_calls": dict(leanote.calls),
    }
    passes["change_batch"] = {"seconds": round(batch_s, 3), "related_in_pass_result": batch.related, **meter.take()}
    results["passes"] = passes
    # retrieval once the change batch is synced: after_changes questions count now
    dev = shared() / "eval" / "dev.jsonl"
    if with_eval and dev.exists():
        reports, _ = evaluate(lambda q, u, k, r: search(index, q, u, k, retriever=r), load_questions(dev),
                              with_changes=True)
        metrics = report_json(reports, 0)["retrievers"]
        results["eval_with_changes"] = {
            name: {k: m[k] for k in ("questions", "recall@5", "recall@20", "hit@5", "mrr@10", "trap_leaks")}
            for name, m in metrics.items()
        }
    index.close()
    state.close()


def table(runs: dict) -> str:
    """Markdown: the passes of each run side by side."""
    rows = ["| memory | full sync s | related pairs (full) | 20-change batch s | indexer memory s | related notes "
            "recomputed | related pairs | related s | idle p50 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        full, batch, idle = r["passes"]["full_sync"], r["passes"]["change_batch"], r["passes"]["idle_sync"]
        rows.append(f"| {name} | {full['seconds']} | {full['related_pairs']} | {batch['seconds']} | "
                    f"{batch['indexer_memory_s']} | {batch['related_notes_recomputed']} | {batch['related_pairs']} | "
                    f"{batch['related_s']} | {idle['p50_ms']} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memory", choices=("on", "off", "both"), default="both",
                    help="the memory (no-LLM tier, related notes) on, off, or both one after the other")
    ap.add_argument("--no-eval", action="store_true", help="skip the retrieval eval after the batch")
    ap.add_argument("--out", help="where to write the JSON (default bench/sync_results.json; '-': nowhere)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run on the sample notes, 5 idle syncs")
    args = ap.parse_args()
    if args.tiny:
        tiny_world()
    args.out = args.out or str(results_file("sync_results.json", args.tiny))
    if not (shared() / "corpus" / "notes.jsonl").exists():
        sys.exit(f"needs the shared corpus at {shared() / 'corpus'} (set LEANOTE_RAG_SHARED), or --tiny")
    os.environ["BENCH_PW_ONE"], os.environ["BENCH_PW_TWO"] = "one-secret", "two-secret"
    modes = ["on", "off"] if args.memory == "both" else [args.memory]
    runs = {}
    for i, mode in enumerate(modes):
        runs[mode] = run(mode == "on", with_eval=i == 0 and not args.no_eval, idle_runs=5 if args.tiny else 20)
    first = runs[modes[0]]
    results = {k: v for k, v in first.items() if k not in ("passes", "memory")}
    results["memory"] = {
        "note": "on: memory.enabled true, memory.llm off (no-LLM tier + related notes); off: memory.enabled false; "
                "each run from scratch, one after the other, on a shared 2-core machine",
        "runs": {mode: {"passes": r["passes"], "change_batch_seconds": r["change_batch"]["seconds"],
                        "full_sync_seconds": r["full_sync"]["seconds"]} for mode, r in runs.items()},
    }
    if args.out != "-" and Path(args.out).exists() and args.memory != "both":  # the other mode's run stays
        old = json.loads(Path(args.out).read_text()).get("memory", {}).get("runs", {})
        for mode, r in old.items():
            results["memory"]["runs"].setdefault(mode, r)
    both = results["memory"]["runs"]
    results["memory"]["table"] = table(both)
    if "on" in both and "off" in both:
        on, off = both["on"]["change_batch_seconds"], both["off"]["change_batch_seconds"]
        results["memory"]["change_batch_on_minus_off_s"] = round(on - off, 2)
    text = json.dumps(results, indent=2, ensure_ascii=False)
    print(text)
    print(results["memory"]["table"])
    if args.out != "-":
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
