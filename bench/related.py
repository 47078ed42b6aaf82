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
threshold in the corpus memory. Then ``related QUESTION`` (``rag.memory.related.for_text``) for the dev set's
answerable questions, searched as ``search`` does (top 10): at each question threshold, the share of the
gold notes found that are kept and of the other notes found that are dropped, and the list's length.
Writes ``bench/related_results.json`` (``--out``).

    .venv/bin/python bench/related.py
    .venv/bin/python bench/related.py --tiny     # seconds, on the sample notes (a smoke run)
    .venv/bin/python bench/related.py --config CFG --out bench/related_gemma_results.json   # another index
    .venv/bin/python bench/related.py --config CFG --second model=DIR   # with a second index (gemma) over it

``--config``: a config naming an indexed corpus with its memory (another embedder's, e.g.); the
thresholds swept (``--thresholds``, ``--question-thresholds``) are cosines on that embedder's scale.
``--second KEY=VALUE``: a second dense index (``rag.index.second``, gemma with that embedder section)
is filled beside the index from the vector cache and searched with it, covering every note, for the
question part (a question's scores are then on the second embedder's scale); the note pairs are the
first index's either way. The state is written to: use a copy.

``--tiny`` indexes the sample notes (``bench/common.py``'s ``tiny_world``) into a temporary folder as
``bench/answers_eval.py`` indexes the corpus, and runs the same on them (two recipes link each other: one
pair). The results go apart from the recorded ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from answers_eval import index_corpus  # noqa: E402
from common import REPO, results_file, shared, tiny_world  # noqa: E402
from related_links import load_notes, recall_at_k, scan  # noqa: E402

from rag import config as config_mod  # noqa: E402
from rag.eval import load_questions  # noqa: E402
from rag.memory import related  # noqa: E402
from rag.index.note_index import NoteIndex  # noqa: E402
from rag.index.retrieve import search  # noqa: E402
from rag.memory.store import MemoryStore  # noqa: E402
from sync.derived import chunk_vectors  # noqa: E402
from sync.state import State  # noqa: E402

THRESHOLDS = "0.0,0.5,0.55,0.6,0.65,0.7,0.75,0.8"
QUESTION_THRESHOLDS = "0.0,0.2,0.25,0.3,0.35,0.4,0.45,0.5,0.55,0.6"
QUESTION_K = 10  # the notes a question's search finds, as the threshold was first chosen (docs/memory.md)


def with_second(settings, index, options: list[str]):
    """A second dense index (gemma, ``options`` its embedder section) beside ``index``, filled
    from the vector cache and searched with it; the second index, to close."""
    import yaml

    from rag.index.second import SecondIndex

    section = {"kind": "gemma", **{k: yaml.safe_load(v) for k, _, v in (o.partition("=") for o in options)}}
    settings = settings.model_copy(update={"second_index": settings.second_index.model_copy(update={
        "enabled": "on", "embedder": config_mod.EmbedderConfig(**section)})})
    second = SecondIndex.open(settings)
    second.plan(index.store)
    while second.fill(64):
        pass
    index.second = second
    return second


def questions(index, memory, dev: Path, thresholds: list[float]) -> dict:
    """``related QUESTION`` at each threshold: of the notes the search found (top ``QUESTION_K``),
    the gold ones kept and the others dropped (a note is kept when its score, or the one it gets
    through a related note, is at least the threshold); and the list's length as shown (at most
    ``QUESTION_K``: related notes of those found included)."""
    asked = [q for q in load_questions(dev) if q.get("gold_note_ids") and not q.get("after_changes")]
    everything = 10 ** 6
    rows = []
    for q in asked:
        hits = search(index, q["question"], q["user_id"], QUESTION_K)
        found = set(h.note_id for h in hits)
        gold = set(q["gold_note_ids"]) & found
        direct = {}
        for note_id in found:  # each found note's own score: the question's cosine + rare entities
            alone = related.for_text(memory, q["user_id"], q["question"], [h for h in hits if h.note_id == note_id],
                                     everything, min_score=0.0)
            direct.update((n["note_id"], n["score"]) for n in alone if n["note_id"] == note_id)
        listed = {th: [n["note_id"] for n in related.for_text(memory, q["user_id"], q["question"], hits, everything,
                                                              min_score=th)] for th in thresholds}
        rows.append((found, gold, direct, listed))
    gold_scores = sorted(d[n] for _, gold, d, _ in rows for n in gold if n in d)
    other_scores = sorted(d[n] for found, gold, d, _ in rows for n in found - gold if n in d)
    sweep = []
    for th in thresholds:
        gold_found = sum(len(gold) for _, gold, _, _ in rows)
        gold_kept = sum(len(gold & set(listed[th])) for _, gold, _, listed in rows)
        others = sum(len(found - gold) for found, gold, _, _ in rows)
        dropped = sum(len(found - gold - set(listed[th])) for found, gold, _, listed in rows)
        sweep.append({"min_score": th, "gold_found": gold_found, "gold_kept": gold_kept, "others_found": others,
                      "others_dropped": dropped, "others_dropped_share": round(dropped / others, 3) if others else None,
                      "mean_list_length": round(statistics.mean(min(QUESTION_K, len(listed[th])) for *_, listed in rows), 2),
                      "questions_with_empty_list": sum(1 for *_, listed in rows if not listed[th])})

    def spread(xs):
        return {"n": len(xs), "p10": round(xs[len(xs) // 10], 4), "median": round(statistics.median(xs), 4),
                "p90": round(xs[(9 * len(xs)) // 10], 4)} if xs else {"n": 0}

    return {"questions": len(rows), "k": QUESTION_K, "gold_direct_scores": spread(gold_scores),
            "other_direct_scores": spread(other_scores), "threshold_sweep": sweep}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a smoke run: the sample notes indexed in a temporary folder")
    ap.add_argument("--config", default=str(REPO / "bench" / "corpus.yaml"), help="the indexed corpus's config")
    ap.add_argument("--second", action="append", default=[], metavar="KEY=VALUE",
                    help="a second index (gemma) over the index, this its embedder section (repeatable)")
    ap.add_argument("--thresholds", default=THRESHOLDS, help="related_min_score values swept")
    ap.add_argument("--question-thresholds", default=QUESTION_THRESHOLDS,
                    help="related_question_min_score values swept")
    ap.add_argument("--out", help="where the results go (default bench/related_results.json)")
    args = ap.parse_args()
    config = Path(args.config)
    work = tempfile.TemporaryDirectory(prefix="lr-bench-related-") if args.tiny else None  # removed at exit
    if work:
        tiny_world()
        config = index_corpus(Path(work.name), Path(work.name) / "data")
    settings = config_mod.load(str(config))
    thresholds = [float(t) for t in args.thresholds.split(",")]
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
    second = None
    started = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg_start": os.getloadavg()}
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
            found = [r for r in runs["content"][note_id] if r.score >= settings.related_min_score]
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
        for th in thresholds:
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

        if args.second:
            second = with_second(settings, index, args.second)
        asked = questions(index, memory, shared() / "eval" / "dev.jsonl",
                          [float(t) for t in args.question_thresholds.split(",")])
        result = {
            **started,
            "corpus": ("the sample notes (--tiny)" if args.tiny else f"shared corpus ({config.name})")
            + ", notes in the memory: %d" % len(notes),
            "link_pairs": len(pairs),
            "parameters": {"neighbours": related.NEIGHBOURS, "entity_weight": related.ENTITY_WEIGHT,
                           "entity_cap": related.ENTITY_CAP, "link_boost": related.LINK_BOOST,
                           "rare_max": {u: related.rare_max(c) for u, c in users.items()},
                           "min_score_default": settings.related_min_score,
                           "question_min_score_default": related.question_min_score(settings, index, next(iter(users), "")),
                           "embedder": index.embedder.model_id,
                           "second": second.embedder.model_id if second is not None else None},
            "recall@5": recall,
            "threshold_sweep_content": sweep,
            "linked_pair_scores_content": {"n": len(linked_scores),
                                           "median": round(statistics.median(linked_scores), 4) if linked_scores else None,
                                           "p10": round(linked_scores[len(linked_scores) // 10], 4) if linked_scores else None},
            "time_per_note": {k: ms(v) for k, v in times.items() if k != "store"},
            "store_pairs_s": round(times["store"][0], 2),
            "wall_s_both_runs": round(total, 2),
            "stored_pairs": memory.db.execute("SELECT COUNT(*) FROM related").fetchone()[0],
            "question": asked,
            "load_avg_end": os.getloadavg(),
        }
    finally:
        if second is not None:
            index.second = None
            second.close()
        index.close()
        memory.close()
        state.close()
    (Path(args.out) if args.out else results_file("related_results.json", args.tiny)).write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n",
                                                               encoding="utf-8")
    print(json.dumps(result, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
