"""Related notes on the shared corpus, against its own cross-links (``bench/related_links.py``).

Needs the corpus index with its memory (``.venv/bin/leanote-rag --config bench/corpus.yaml index
--reconcile`` once after the memory came). For every note of the corpus it computes the related notes
(``rag.memory.related.compute``, no threshold, so the ranking is what is measured) twice:

- ``content``: chunk similarity + shared rare entities only;
- ``with_links``: the same plus the notes the note itself links to (resolved as ``related_links`` does), as
  a reason with ``LINK_BOOST``.

and reports recall@5 of linked notes (``recall_at_k``; ``exclude_links=True`` keeps only the partners that
link *to* the note, which reading the note's own links cannot find), the time per note and in all, how
recall@5 and list length move with the threshold, and it stores the content-only pairs at the default
threshold in the corpus memory. Writes ``bench/related_results.json``.

    .venv/bin/python bench/related.py
    .venv/bin/python bench/related.py --tiny     # seconds, on the sample notes (a smoke run)

``--tiny`` indexes the sample notes (``bench/common.py``'s ``tiny_world``) into a temporary folder as
``bench/answers_eval.py`` indexes the corpus, and runs the same on them (two recipes link each other: one
pair). The results go apart from the recorded ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from answers_eval import index_corpus  # noqa: E402
from common import REPO, results_file, tiny_world  # noqa: E402
from related_links import load_notes, recall_at_k, scan  # noqa: E402

from rag import config as config_mod  # noqa: E402
from rag.memory import related  # noqa: E402
from rag.index.note_index import NoteIndex  # noqa: E402
from rag.memory.store import MemoryStore  # noqa: E402
from sync.derived import chunk_vectors  # noqa: E402
from sync.state import State  # noqa: E402

THRESHOLDS = (0.0, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a smoke run: the sample notes indexed in a temporary folder")
    args = ap.parse_args()
    config = REPO / "bench" / "corpus.yaml"
    work = tempfile.TemporaryDirectory(prefix="lr-bench-related-") if args.tiny else None  # removed at exit
    if work:
        tiny_world()
        config = index_corpus(Path(work.name), Path(work.name) / "data")
    settings = config_mod.load(str(config))
    report = scan(load_notes())
    pairs = report.pairs
    out_links: dict[str, set[str]] = defaultdict(set)
    for p in pairs:
        if "a->b" in p.directions:
            out_links[p.a].add(p.b)
        if "b->a" in p.directions:
            out_links[p.b].add(p.a)
    state = State(settings.state_dir)
    memory = MemoryStore.open_for(settings)
    index = NoteIndex.open(settings)
    try:
        vectors_of = chunk_vectors(state)
        users = memory.users()
        notes = [(n, u) for n, u in memory.db.execute("SELECT note_id, user_id FROM notes ORDER BY note_id")]
        runs: dict[str, dict[str, list]] = {"content": {}, "with_links": {}}
        times: dict[str, list[float]] = {"content": [], "with_links": [], "store": []}
        t_all = time.monotonic()
        for note_id, user in notes:
            chunks = vectors_of(note_id) or []
            for name, links in (("content", ()), ("with_links", out_links.get(note_id, ()))):
                t = time.monotonic()
                runs[name][note_id] = related.compute(index.store, memory, user, note_id, chunks, min_score=0.0,
                                                      links=links, notes=users[user], top=50)
                times[name].append(time.monotonic() - t)
        total = time.monotonic() - t_all
        t = time.monotonic()
        for note_id, user in notes:  # the content-only pairs at the default threshold, as a sync keeps them
            found = [r for r in runs["content"][note_id] if r.score >= settings.memory.related_min_score]
            related.store_pairs(index.store, memory, user, note_id, found[: related.TOP])
        times["store"].append(time.monotonic() - t)

        def ranked(name, threshold=0.0):
            return lambda n: [r.note_id for r in runs[name].get(n, []) if r.score >= threshold]

        recall = {}
        for name in runs:
            for exclude in (False, True):
                r = recall_at_k(pairs, ranked(name), 5, exclude_links=exclude)
                recall[f"{name}{'_incoming_only' if exclude else ''}"] = {
                    k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if k != "per_note"}
        sweep = []
        for th in THRESHOLDS:
            r = recall_at_k(pairs, ranked("content", th), 5)
            lengths = [len([x for x in runs["content"][n][:5] if x.score >= th]) for n, _ in notes]
            sweep.append({"min_score": th, "recall@5_micro": round(r["micro"], 4), "recall@5_macro": round(r["macro"], 4),
                          "mean_list_length@5": round(statistics.mean(lengths), 2),
                          "notes_with_empty_list": sum(1 for x in lengths if x == 0)})
        linked_scores = sorted(r.score for p in pairs for r in runs["content"].get(p.a, []) if r.note_id == p.b)

        def ms(xs):
            xs = sorted(xs)
            return {"mean_ms": round(1000 * statistics.mean(xs), 2), "p95_ms": round(1000 * xs[int(0.95 * (len(xs) - 1))], 2),
                    "total_s": round(sum(xs), 2)}

        result = {
            "corpus": ("the sample notes (--tiny)" if args.tiny else "shared corpus (bench/corpus.yaml)")
            + ", notes in the memory: %d" % len(notes),
            "link_pairs": len(pairs),
            "parameters": {"neighbours": related.NEIGHBOURS, "entity_weight": related.ENTITY_WEIGHT,
                           "entity_cap": related.ENTITY_CAP, "link_boost": related.LINK_BOOST,
                           "rare_max": {u: related.rare_max(c) for u, c in users.items()},
                           "min_score_default": settings.memory.related_min_score,
                           "embedder": index.embedder.model_id},
            "recall@5": recall,
            "threshold_sweep_content": sweep,
            "linked_pair_scores_content": {"n": len(linked_scores),
                                           "median": round(statistics.median(linked_scores), 4) if linked_scores else None,
                                           "p10": round(linked_scores[len(linked_scores) // 10], 4) if linked_scores else None},
            "time_per_note": {k: ms(v) for k, v in times.items() if k != "store"},
            "store_pairs_s": round(times["store"][0], 2),
            "wall_s_both_runs": round(total, 2),
            "stored_pairs": memory.db.execute("SELECT COUNT(*) FROM related").fetchone()[0],
        }
    finally:
        index.close()
        memory.close()
        state.close()
    results_file("related_results.json", args.tiny).write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n",
                                                               encoding="utf-8")
    print(json.dumps(result, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
