"""The gate before the LLM ("no evidence, no LLM call"): what it refuses on the dev set.

    .venv/bin/python bench/refusal.py --config CONFIG   # an index of the shared corpus

For every dev question (after_changes ones left out unless --with-changes): the best
term coverage of a top-5 chunk and how far the best dense score stands out from the
other candidates (in standard deviations), as the answer service computes them; then,
for a range of ``answer.outlier_z``, how many no_answer questions are refused before the
LLM and how many answerable ones would be wrongly refused. The optional absolute rule
(answer.min_dense with answer.min_coverage) is shown beside it for comparison. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rag import config
from rag.answer.gate import dense_outlier, relevance
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search

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
            rows.append({"id": q["id"], "no_answer": q["type"] == "no_answer", "dense": round(dense, 3),
                         "coverage": round(cover, 3), "z": round(dense_outlier(hits), 2)})

    def count(refused):
        return {"no_answer_refused": sum(r["no_answer"] for r in refused),
                "answerable_refused": sum(not r["no_answer"] for r in refused)}

    outlier = [{"outlier_z": z, **count([r for r in rows if r["coverage"] == 0 and r["z"] < z])}
               for z in (2.0, 2.5, 3.0, 3.5, 4.0, 5.0)]
    absolute = [{"min_dense": d, "min_coverage": c,
                 **count([r for r in rows if r["dense"] < d and r["coverage"] < c])}
                for d in (0.30, 0.33, 0.36) for c in (0.3, 0.4)]
    cfg = settings.answer
    chosen = [r for r in rows if r["coverage"] == 0 and r["z"] < cfg.outlier_z]
    print(json.dumps({
        "questions": len(rows),
        "no_answer": sum(r["no_answer"] for r in rows),
        "configured": {"outlier_z": cfg.outlier_z,
                       "no_answer_refused": [r["id"] for r in chosen if r["no_answer"]],
                       "answerable_refused": [r["id"] for r in chosen if not r["no_answer"]]},
        "outlier_z": outlier,
        "absolute_rule": absolute,
        "questions_detail": sorted(rows, key=lambda r: r["z"]),
    }, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
