"""Retrieval metrics over a question set (format: ``../shared/eval/README.md``).

Per retriever (hybrid, dense alone, sparse alone), over the questions that have
gold notes:

- note recall@5 / @20: share of a question's gold notes among the notes of its top-k hits;
- chunk hit@5: a top-5 chunk contains one of the gold quotes (compared after
  dropping whitespace and Markdown marks, since HTML notes were converted);
- MRR@10: reciprocal rank of the first hit from a gold note;
- trap leaks: hits from a ``trap_note_ids`` note (another user's, trashed, removed) in the top 20.

``no_answer`` questions only count for leaks; their top scores are reported for
calibrating a refusal threshold. ``after_changes`` questions count only when the
change batch is synced (``with_changes``).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, median
from typing import Callable

from .errors import UserError
from .model import Hit
from .retrieve import RETRIEVERS

# (question, user id, k, retriever) -> hits: a local index's search or the daemon's
Searcher = Callable[[str, str, int, str], list[Hit]]

_MARKS = re.compile(r"[\s*`#>|_~\\]+")


def normalise(text: str) -> str:
    return _MARKS.sub("", text).lower()


def load_questions(path: Path, required: tuple[str, ...] = ("question", "user_id")) -> list[dict]:
    """Read a JSONL question file, checking every line before any work is done.
    Every problem is reported with its line number."""
    questions, problems = [], []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read {path}: {err}") from None
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
        except json.JSONDecodeError as err:
            problems.append(f"{path}:{no}: not JSON ({err.msg})")
            continue
        missing = [k for k in required if not (isinstance(q, dict) and isinstance(q.get(k), str) and q[k].strip())]
        if missing:
            problems.append(f"{path}:{no}: needs a non-empty {' and '.join(repr(k) for k in missing)} string")
            continue
        questions.append(q)
    if problems:
        more = f"\n... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise UserError("\n".join(problems[:20]) + more)
    return questions


@dataclass
class Outcome:
    """One question's result for one retriever."""

    id: str
    type: str
    gold_ranks: list[int]  # 1-based ranks of hits from gold notes (top 20)
    recall5: float | None
    recall20: float | None
    hit5: bool | None
    rr10: float | None
    leaks: list[str]
    top_score: float
    top_dense: float | None = None


@dataclass
class Report:
    retriever: str
    questions: int = 0
    recall5: float = 0.0
    recall20: float = 0.0
    hit5: float = 0.0
    mrr10: float = 0.0
    leaks: int = 0
    by_type: dict[str, dict] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    p50_ms: float = 0.0


def _outcome(q: dict, hits, retriever: str) -> Outcome:
    gold = set(q.get("gold_note_ids") or [])
    quotes = [normalise(s) for s in q.get("gold_quotes") or [] if s.strip()]
    traps = set(q.get("trap_note_ids") or [])
    notes20 = [h.note_id for h in hits[:20]]
    ranks = [i for i, n in enumerate(notes20, start=1) if n in gold]
    leaks = sorted({n for n in notes20 if n in traps})
    top_dense = max((h.dense_score for h in hits if h.dense_score is not None), default=None)
    if not gold:
        return Outcome(q["id"], q.get("type", ""), [], None, None, None, None, leaks, hits[0].score if hits else 0.0, top_dense)

    def recall(k: int) -> float:
        return len(gold & set(notes20[:k])) / len(gold)

    hit5 = any(qt in normalise(h.text) for h in hits[:5] for qt in quotes) if quotes else None
    rr = next((1.0 / r for r in ranks if r <= 10), 0.0)
    return Outcome(q["id"], q.get("type", ""), ranks, recall(5), recall(20), hit5, rr, leaks, hits[0].score if hits else 0.0, top_dense)


def _aggregate(retriever: str, outcomes: list[Outcome], times: list[float]) -> Report:
    scored = [o for o in outcomes if o.recall5 is not None]
    report = Report(retriever, questions=len(scored), outcomes=outcomes)
    if scored:
        report.recall5 = mean(o.recall5 for o in scored)
        report.recall20 = mean(o.recall20 for o in scored)
        with_quotes = [o for o in scored if o.hit5 is not None]
        report.hit5 = mean(1.0 if o.hit5 else 0.0 for o in with_quotes) if with_quotes else 0.0
        report.mrr10 = mean(o.rr10 for o in scored)
    report.leaks = sum(len(o.leaks) for o in outcomes)
    report.p50_ms = round(median(times) * 1000, 1) if times else 0.0
    for kind in sorted({o.type for o in scored}):
        group = [o for o in scored if o.type == kind]
        report.by_type[kind] = {
            "n": len(group),
            "recall5": round(mean(o.recall5 for o in group), 3),
            "hit5": round(mean(1.0 if o.hit5 else 0.0 for o in group), 3),
        }
    return report


def evaluate(
    search: Searcher,
    questions: list[dict],
    retrievers: tuple[str, ...] = RETRIEVERS,
    with_changes: bool = False,
) -> tuple[list[Report], int]:
    """Run every question through every retriever. Returns reports and how many
    after_changes questions were left out."""
    active = [q for q in questions if with_changes or not q.get("after_changes")]
    skipped = len(questions) - len(active)
    reports = []
    for retriever in retrievers:
        outcomes, times = [], []
        for q in active:
            t = time.perf_counter()
            hits = search(q["question"], q["user_id"], 20, retriever)
            times.append(time.perf_counter() - t)
            outcomes.append(_outcome(q, hits, retriever))
        reports.append(_aggregate(retriever, outcomes, times))
    return reports, skipped


def report_json(reports: list[Report], skipped: int) -> dict:
    return {
        "skipped_after_changes": skipped,
        "retrievers": {
            r.retriever: {
                "questions": r.questions,
                "recall@5": round(r.recall5, 4),
                "recall@20": round(r.recall20, 4),
                "hit@5": round(r.hit5, 4),
                "mrr@10": round(r.mrr10, 4),
                "trap_leaks": r.leaks,
                "search_p50_ms": r.p50_ms,
                "by_type": r.by_type,
                "misses": [
                    {"id": o.id, "type": o.type, "gold_ranks": o.gold_ranks, "hit@5": o.hit5}
                    for o in r.outcomes
                    if o.recall5 is not None and (o.recall5 < 1.0 or o.hit5 is False)
                ],
                "no_answer_top_scores": {o.id: round(o.top_score, 5) for o in r.outcomes if o.recall5 is None},
            }
            for r in reports
        },
    }
