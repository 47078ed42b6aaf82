"""BM25's IDF per person against the IDF over everyone's notes: the dev set's retrieval metrics
and what the per-person count costs a search.

    .venv/bin/leanote-rag --config bench/corpus.yaml index           # once (needs ../shared)
    mkdir /tmp/before && git archive 442bd94 | tar -x -C /tmp/before  # the code before the change
    .venv/bin/python bench/idf_per_user.py eval --label before --code /tmp/before
    .venv/bin/python bench/idf_per_user.py eval --label after
    .venv/bin/python bench/idf_per_user.py store --replicate-to 100000
    .venv/bin/python bench/idf_per_user.py table

``eval`` runs every dev question (after_changes ones left out) through hybrid, dense alone and
BM25 alone with ``rag.eval.evaluate``, as ``leanote-rag eval`` does, with the code of ``--code``
(a checkout; default this one) over the index of ``--config``: recall@5/@20, hit@5 and MRR@10,
overall and per question type, each question's top 10, and the hybrid search's p50 (query
embedding included; the dev questions × 3 after 5 to warm up, as ``bench/index_search.py``).
Runs of the same code add their timings up: on a busy machine, run before and after in turn.
The stored points are the same for both codes: only the query's IDF corpus differs.

``store`` times the store's BM25 query alone, the IDF counted over every point (the code
before) and over the asking user's points (now), one after the other for each dev question,
``--rounds`` times, on the corpus's index and, with ``--replicate-to``, on a copy of it
replicated under the same users (``bench/index_search.py``'s replica): the only work the change
adds, measured side by side so that a busy machine slows both alike.

Results go to bench/idf_per_user_results.json; ``table`` prints the Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's rag/ (``eval --code`` puts another one first)
SHARED = Path(os.environ.get("LEANOTE_RAG_SHARED", REPO.parent / "shared"))
DEV = SHARED / "eval" / "dev.jsonl"
OUT = REPO / "bench" / "idf_per_user_results.json"
RETRIEVERS = ("hybrid", "dense", "sparse")


def load_results() -> dict:
    return json.loads(OUT.read_text()) if OUT.exists() else {}


def save(key: str, value: dict) -> None:
    results = load_results()
    results[key] = value
    OUT.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


def _metrics(outcomes) -> dict:
    with_quotes = [o for o in outcomes if o.hit5 is not None]
    return {
        "n": len(outcomes),
        "recall@5": round(mean(o.recall5 for o in outcomes), 3),
        "recall@20": round(mean(o.recall20 for o in outcomes), 3),
        "hit@5": round(mean(1.0 if o.hit5 else 0.0 for o in with_quotes), 3),
        "mrr@10": round(mean(o.rr10 for o in outcomes), 3),
    }


def cmd_eval(args) -> None:
    code = Path(args.code).resolve() if args.code else REPO
    sys.path.insert(0, str(code))
    from rag import config
    from rag.eval import evaluate, load_questions
    from rag.index.note_index import NoteIndex
    from rag.index.retrieve import search

    import rag

    assert Path(rag.__file__).resolve().is_relative_to(code), f"rag comes from {rag.__file__}, not {code}"
    settings = config.load(Path(args.config))
    questions = [q for q in load_questions(Path(args.questions)) if not q.get("after_changes")]
    with NoteIndex.open(settings) as index:
        tops: dict[str, dict[str, str]] = {r: {} for r in RETRIEVERS}

        def searcher(question, user_id, k, retriever):
            hits = search(index, question, user_id, k, retriever=retriever)
            tops[retriever][question] = " ".join(h.point_id[:8] for h in hits[:10])  # enough to tell lists apart
            return hits

        reports, _ = evaluate(searcher, questions, RETRIEVERS)
        for q in questions[:5]:  # warm up
            search(index, q["question"], q["user_id"])
        times = []
        for _ in range(3):
            for q in questions:
                t = time.perf_counter()
                search(index, q["question"], q["user_id"])
                times.append((time.perf_counter() - t) * 1000)
    out = {"code": str(code), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_average": os.getloadavg(), "retrievers": {}}
    for report in reports:
        scored = [o for o in report.outcomes if o.recall5 is not None]
        kinds = sorted({o.type for o in scored})
        out["retrievers"][report.retriever] = {
            "overall": {**_metrics(scored), "trap_leaks": report.leaks},
            "by_type": {kind: _metrics([o for o in scored if o.type == kind]) for kind in kinds},
            "top10": {q["id"]: tops[report.retriever][q["question"]] for q in questions},
        }
    times.sort()
    run = {"date": out["date"], "load_average": out["load_average"], "n": len(times),
           "p50": round(times[len(times) // 2], 2), "p95": round(times[int(len(times) * 0.95)], 2)}
    earlier = load_results().get(args.label, {})
    # Runs of the same code add up: on a busy machine, before and after run in turn, several times.
    out["hybrid_search_ms"] = (earlier.get("hybrid_search_ms", []) if earlier.get("code") == out["code"] else []) + [run]
    save(args.label, out)
    print(json.dumps({k: v for k, v in out.items() if k != "retrievers"}, indent=1))


def _time_store(shard_path: Path, questions: list[dict], rounds: int) -> dict:
    """The BM25 query alone, IDF over every point against over the user's points, interleaved."""
    import qdrant_edge as qe

    from rag.index.lexical import query_vector
    from rag.index.points import SPARSE
    from rag.index.store_edge import EdgeStore

    store = EdgeStore(shard_path, 512, create=False)
    try:
        count = sum(store.count_by_user().values())

        def user(uid):
            return qe.Filter(must=[qe.FieldCondition(key="user_id", match=qe.MatchValue(uid))])

        corpora = {"every point": lambda uid: qe.Filter(), "the user's points": user}
        times = {name: [] for name in corpora}
        for _ in range(rounds):
            for q in questions:
                vector = query_vector(q["question"])
                query = qe.Query.Nearest(qe.SparseVector(vector.indices, vector.values), using=SPARSE)
                for name, corpus in corpora.items():
                    request = qe.QueryRequest(limit=41, query=query, filter=user(q["user_id"]), with_payload=["note_id"],
                                              params=qe.SearchParams(idf=qe.IdfParams(corpus=corpus(q["user_id"]))))
                    t = time.perf_counter()
                    store._shard.query_batch(qe.QueryBatchRequest([request]))
                    times[name].append((time.perf_counter() - t) * 1000)
    finally:
        store.close()
    out = {"points": count}
    for name, ts in times.items():
        ts.sort()
        out[name] = {"n": len(ts), "p50_ms": round(ts[len(ts) // 2], 3), "p95_ms": round(ts[int(len(ts) * 0.95)], 3)}
    return out


def cmd_store(args) -> None:
    from rag import config

    sys.path.insert(0, str(REPO / "bench"))
    import index_search

    settings = config.load(Path(args.config))
    questions = [json.loads(line) for line in open(args.questions, encoding="utf-8") if line.strip()]
    shard = Path(settings.state_dir) / "qdrant"
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average_before": os.getloadavg(),
           "rounds": args.rounds, "corpus": _time_store(shard, questions, args.rounds)}
    if args.replicate_to:
        with tempfile.TemporaryDirectory(prefix="leanote-rag-idf-") as work:
            big = Path(work) / "qdrant"
            index_search.child(index_search.REPLICATE, str(shard), str(big), str(args.replicate_to))
            out["replicated"] = _time_store(big, questions, args.rounds)
    out["load_average_after"] = os.getloadavg()
    save("store", out)
    print(json.dumps(out, indent=1))


def cmd_table(args) -> None:
    results = load_results()
    before, after = results["before"], results["after"]
    print("| retriever | type | n | hit@5 before → after | MRR@10 before → after | recall@20 before → after |")
    print("|---|---|---|---|---|---|")
    for r in RETRIEVERS:
        b, a = before["retrievers"][r], after["retrievers"][r]
        for kind in ["overall", *b["by_type"]]:
            mb = b["overall"] if kind == "overall" else b["by_type"][kind]
            ma = a["overall"] if kind == "overall" else a["by_type"][kind]
            print(f"| {r} | {kind} | {mb['n']} | {mb['hit@5']:.3f} → {ma['hit@5']:.3f} | "
                  f"{mb['mrr@10']:.3f} → {ma['mrr@10']:.3f} | {mb['recall@20']:.3f} → {ma['recall@20']:.3f} |")
    print()
    for r in RETRIEVERS:
        b, a = before["retrievers"][r]["top10"], after["retrievers"][r]["top10"]
        changed = sum(b[q] != a[q] for q in b)
        print(f"{r}: top 10 changed for {changed} of {len(b)} questions; trap leaks "
              f"{before['retrievers'][r]['overall']['trap_leaks']} → {after['retrievers'][r]['overall']['trap_leaks']}")
    for label in ("before", "after"):
        runs = results[label]["hybrid_search_ms"]
        print(f"hybrid search p50 / p95 ms, {label}, {len(runs)} runs: "
              + ", ".join(f"{r['p50']} / {r['p95']} (load {r['load_average'][0]:.1f})" for r in runs))
    store = results.get("store")
    if store:
        print()
        print("| index | points | BM25 query p50 / p95 ms, IDF over every point | over the user's points |")
        print("|---|---|---|---|")
        for name in ("corpus", "replicated"):
            if name in store:
                s = store[name]
                every, own = s["every point"], s["the user's points"]
                print(f"| {name} | {s['points']:,} | {every['p50_ms']} / {every['p95_ms']} | {own['p50_ms']} / {own['p95_ms']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ev = sub.add_parser("eval", help="retrieval metrics with one checkout's code")
    ev.add_argument("--label", required=True, help="the results' key: before or after")
    ev.add_argument("--code", help="a checkout whose rag/ to run (default: this one)")
    st = sub.add_parser("store", help="the BM25 query alone, both IDF corpora side by side")
    st.add_argument("--rounds", type=int, default=5)
    st.add_argument("--replicate-to", type=int, default=0, help="also on a replica of at least this many points")
    sub.add_parser("table", help="the Markdown tables")
    for p in (ev, st):
        p.add_argument("--config", default=str(REPO / "bench" / "corpus.yaml"), help="an index of the shared corpus")
        p.add_argument("--questions", default=str(DEV))
    args = ap.parse_args()
    {"eval": cmd_eval, "store": cmd_store, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main()
