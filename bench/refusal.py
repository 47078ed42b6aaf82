"""Calibrating "no evidence, no LLM call" (answer.min_dense, answer.min_coverage).

    .venv/bin/python bench/refusal.py --config CONFIG   # an index of the shared corpus

For every dev question (after_changes ones left out unless --with-changes): the
best dense score among the 50 candidates and the best term coverage of a top-5
chunk, as the answer service computes them; then, for a grid of thresholds, how
many no_answer questions are refused before the LLM and how many answerable ones
would be wrongly refused. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rag import config
from rag.answer import relevance
from rag.index import NoteIndex
from rag.retrieve import search

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LEANOTE_RAG_SHARED", REPO.parent / "shared"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--with-changes", action="store_true")
    args = ap.parse_args()
    settings = config.load(args.config)
    rows = []
    with NoteIndex.open(settings) as index:
        for line in open(SHARED / "eval" / "dev.jsonl", encoding="utf-8"):
            q = json.loads(line)
            if q.get("after_changes") and not args.with_changes:
                continue
            hits = search(index, q["question"], q["user_id"], settings.rerank.candidates)
            dense, cover = relevance(q["question"], hits)
            rows.append({"id": q["id"], "no_answer": q["type"] == "no_answer", "dense": round(dense, 3), "coverage": round(cover, 3)})
    grid = []
    for min_dense in (0.30, 0.33, 0.36, 0.40):
        for min_cov in (0.3, 0.4, 0.5):
            refused = [r for r in rows if r["dense"] < min_dense and r["coverage"] < min_cov]
            grid.append({"min_dense": min_dense, "min_coverage": min_cov,
                         "no_answer_refused": sum(r["no_answer"] for r in refused),
                         "answerable_refused": sum(not r["no_answer"] for r in refused)})
    cfg = settings.answer
    chosen = [r for r in rows if r["dense"] < cfg.min_dense and r["coverage"] < cfg.min_coverage]
    print(json.dumps({
        "questions": len(rows),
        "no_answer": sum(r["no_answer"] for r in rows),
        "configured": {"min_dense": cfg.min_dense, "min_coverage": cfg.min_coverage,
                       "no_answer_refused": [r["id"] for r in chosen if r["no_answer"]],
                       "answerable_refused": [r["id"] for r in chosen if not r["no_answer"]]},
        "grid": grid,
        "questions_detail": sorted(rows, key=lambda r: r["dense"]),
    }, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
