"""Retrieval and answer metrics over a question set (format: ``../shared/eval/README.md``).

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

The answer eval (``answer_report``) judges what ``ask`` gave for each question, a pure
function of (question, ``Answer``) pairs: refusals (before the LLM, by the LLM),
answers citing nothing, gold notes cited, trap notes cited, no_answer questions
answered anyway, fallbacks, latency and prompt size.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, median
from typing import TYPE_CHECKING, Callable

from rag.config import AnswerConfig
from rag.errors import UserError
from rag.model import Hit
from rag.index.retrieve import RETRIEVERS

if TYPE_CHECKING:
    from rag.answer.types import Answer

# (question, user id, k, retriever) -> hits: a local index's search or the daemon's
Searcher = Callable[[str, str, int, str], list[Hit]]
# (question, user id) -> the answer: a local AnswerService's or the daemon's
Asker = Callable[[str, str], "Answer"]

_MARKS = re.compile(r"[\s*`#>|_~\\]+")


def normalise(text: str) -> str:
    return _MARKS.sub("", text).lower()


def load_questions(
    path: Path, required: tuple[str, ...] = ("question", "user_id"), check: Callable[[dict], str | None] | None = None
) -> list[dict]:
    """Read a JSONL question file, checking every line before any work is done.
    Every problem is reported with its line number; ``check`` may name one more."""
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
        problem = check(q) if check else None
        if problem:
            problems.append(f"{path}:{no}: {problem}")
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


# --- answers ------------------------------------------------------------------------------

REFUSAL = AnswerConfig().refusal
REFUSALS = (REFUSAL, AnswerConfig().refusal_english)  # shown for a question in Chinese, in English
ANSWER_REQUIRED = ("id", "question", "user_id")
_ID_LISTS = ("gold_note_ids", "trap_note_ids")


def check_answer_question(q: dict) -> str | None:
    """What is wrong with a question line for the answer eval (beyond the required strings)."""
    for key in _ID_LISTS:
        value = q.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return f"{key!r} must be a list of note id strings"
    if q.get("type") is not None and not isinstance(q["type"], str):
        return "'type' must be a string"
    return None


def ask_all(
    ask: Asker, questions: list[dict], with_changes: bool = False, progress: Callable[[int, int, dict, "Answer"], None] | None = None
) -> tuple[list[tuple[dict, "Answer"]], int]:
    """Ask every question (``after_changes`` ones only ``with_changes``), one at a time.
    Returns the (question, answer) pairs and how many questions were left out."""
    active = [q for q in questions if with_changes or not q.get("after_changes")]
    pairs = []
    for i, q in enumerate(active, start=1):
        answer = ask(q["question"], q["user_id"])
        pairs.append((q, answer))
        if progress is not None:
            progress(i, len(active), q, answer)
    return pairs, len(questions) - len(active)


def percentile(values: list[float], p: float) -> float | None:
    """The p-th percentile (0-100), linear between the closest ranks; None without values."""
    if not values:
        return None
    values = sorted(values)
    at = (len(values) - 1) * p / 100
    lo = int(at)
    hi = min(lo + 1, len(values) - 1)
    return round(values[lo] + (values[hi] - values[lo]) * (at - lo), 1)


def _spread(values: list[float]) -> dict:
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95)}


VERDICTS = ("refused", "llm_cited", "llm_inferred", "llm_refused", "llm_uncited", "fallback", "extractive",
            "listing", "cited_nothing")


def _verdict(answer: "Answer", outcome: str, refusal: str | tuple[str, ...]) -> str:
    """What the person got, by who decided it:

    - ``refused``: refused before any LLM (nothing plausible retrieved, or a name the notes
      never mention);
    - the LLM's reply (``Trace.citing``): ``llm_cited`` (its markers), ``llm_inferred``
      (no markers; cited by the blocks its sentences follow), ``llm_refused`` (it refused),
      ``llm_uncited`` (it said nothing from the evidence, or nothing of its own); the last
      two are shown as the best passages (``outcome == "llm_passages"``);
    - ``fallback`` (the LLM failed: passages), ``extractive`` (no LLM: passages), ``listing``;
    - ``cited_nothing``: a text shown as an answer that cites no note (should never be).
    """
    trace = answer.trace
    citing = trace.citing if trace is not None else ""
    if outcome == "refused":
        return "refused"
    if outcome in ("llm", "llm_passages", "llm_refused") and citing:
        if outcome == "llm" and not answer.citations:
            return "cited_nothing"
        return {"cited": "llm_cited", "inferred": "llm_inferred", "refused": "llm_refused"}.get(citing, "llm_uncited")
    if outcome in ("fallback", "extractive", "listing"):
        return outcome if answer.citations else "refused"
    if answer.answer.strip() in ((refusal,) if isinstance(refusal, str) else refusal):
        return "llm_refused" if outcome == "llm_refused" else "refused"
    return "cited_nothing" if not answer.citations else "llm_cited"


# --- what an answer says (not only what it cites) -----------------------------------------
# An answer point (``answer_points`` of a dev question) is stated when the answer gives one of
# its numbers that the question does not (with its unit), if it has any, and holds at least
# POINT_SHARE of its words that the question lacks (rag.answer.specifics.terms). Checked against a
# reading by hand of real-model answers (bench/answer_labels.jsonl; docs/answers.md).
POINT_SHARE = 0.2


def evidence_blocks(answer: "Answer") -> dict[int, tuple[str, str]]:
    """The evidence an answer's LLM read, as ``rag.answer.support`` takes it (from the trace)."""
    trace = answer.trace
    out = {}
    for n, text in (trace.evidence if trace is not None else {}).items():
        head, _, body = text.partition("\n")
        out[int(n)] = (head, body)
    return out


def point_stated(point: str, text: str, question: str = "") -> bool:
    """Does ``text`` (an answer to ``question``) state the answer point ``point``?"""
    from rag.answer import specifics

    held, asked = specifics.Held.of(text), specifics.Held.of(question)
    given = [(v, u) for v, u, _ in specifics.numbers(point) if not asked.holds_number(v, u)]
    if given and not any(held.holds_number(v, u) for v, u in given):
        return False
    words = specifics.terms(point)
    words = (words - specifics.terms(question)) or words
    if not words:
        return True
    return specifics.Body(text).share(words) >= POINT_SHARE


def contradicted(points: list[str], text: str) -> list[str]:
    """Numbers the text gives with a unit the points give other numbers with (``3 颗`` where
    a point says ``2 颗``), as written in the text."""
    from rag.answer import specifics

    given: dict[str, set[str]] = {}
    for point in points:
        for value, unit, _ in specifics.numbers(point):
            if unit:
                given.setdefault(unit, set()).add(value)
    out = []
    for value, unit, written in specifics.numbers(text):
        if unit in given and value not in given[unit]:
            out.append(written)
    return list(dict.fromkeys(out))


def said(q: dict, answer: "Answer") -> dict:
    """What the LLM's reply and the answer shown say, read against the evidence the LLM read:
    the units that say something and those that stand on a block (``rag.answer.support``), the
    specifics no evidence holds, the answer points stated (in what was shown as the LLM's
    answer), and whether a wrong claim was shown cited."""
    from rag.answer import support

    trace = answer.trace
    blocks = evidence_blocks(answer)
    out = {"reply_saying": None, "reply_supported": None, "reply_invented": [], "shown_saying": None,
           "shown_unsupported": None, "shown_invented": [], "points": None, "points_stated": None,
           "points_shown": None,
           "contradicted": [], "wrong_cited": None}
    if trace is None or not trace.reply or not blocks:
        return out
    question = trace.standalone or q["question"]
    checker = support.Checker(question, blocks)
    reply = checker.check(trace.reply)
    out.update(reply_saying=len(reply.saying), reply_supported=len(reply.supported),
               reply_invented=reply.invented_specifics)
    if trace.outcome != "llm":
        return out
    shown = checker.check(answer.answer)
    points = q.get("answer_points") or []
    stated = [p for p in points if point_stated(p, answer.answer, q["question"])]
    # what the person reads: the answer and, under it, the note's own words it stands on
    with_quote = [p for p in points if point_stated(p, answer.shown, q["question"])]
    wrong = contradicted(points, answer.answer)
    out.update(shown_saying=len(shown.saying), shown_unsupported=len(shown.dropped),
               shown_invented=shown.invented_specifics, contradicted=wrong,
               points=len(points) if points else None, points_stated=len(stated) if points else None,
               points_shown=len(with_quote) if points else None,
               wrong_cited=bool(wrong or shown.invented_specifics or shown.dropped))
    return out


def _row(q: dict, answer: "Answer", refusal: str | tuple[str, ...]) -> dict:
    trace = answer.trace
    outcome = trace.outcome if trace is not None else ""
    gold = set(q.get("gold_note_ids") or [])
    traps = set(q.get("trap_note_ids") or [])
    cited = list(dict.fromkeys(c.note_id for c in answer.citations))
    closest = [c.note_id for c in answer.closest]
    llm_answered = outcome in ("llm", "llm_passages", "llm_refused")
    verdict = _verdict(answer, outcome, refusal)
    # what the LLM's answer cited (passages shown instead are not the LLM's citations)
    answer_cited = cited if verdict in ("llm_cited", "llm_inferred") else []
    prompt_tokens, source = None, None
    usage = answer.usage or {}
    if usage.get("prompt_tokens"):
        prompt_tokens, source = usage["prompt_tokens"], "ollama"
    elif usage.get("prompt_tokens_estimated"):
        prompt_tokens, source = usage["prompt_tokens_estimated"], "estimated"
    # was a gold note among the evidence the LLM read? (tells a retrieval miss from the LLM's)
    evidence = {c.note_id for c in trace.candidates if c.evidence} if trace is not None else set()
    return {
        "id": q["id"],
        "type": q.get("type") or "untyped",
        "answerable": bool(gold),
        "outcome": outcome,
        "verdict": verdict,
        "cited": cited,
        "gold_cited": bool(gold & set(cited)) if gold else None,  # by whatever was shown
        "gold_cited_by_llm": bool(gold & set(answer_cited)) if gold else None,
        "all_gold_cited": gold <= set(cited) if gold else None,
        "gold_in_evidence": bool(gold & evidence) if gold else None,
        "trap_cited": sorted(traps & set(cited)),
        "trap_closest": sorted(traps & set(closest)),
        "unknown_names": list(trace.unknown_names) if trace is not None else [],
        "gate": dict(trace.gate) if trace is not None else {},
        "first_token_ms": answer.timings_ms.get("first_token") if llm_answered else None,
        "sources_ms": answer.timings_ms.get("sources"),
        "total_ms": answer.timings_ms.get("total"),
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_source": source,
        "decision": trace.decision if trace is not None else "",
        "citing": trace.citing if trace is not None else "",
        "reply": trace.reply if trace is not None else "",  # the LLM's own text (passages may be shown)
        # evidence block n -> its note, for reading a recorded reply again (bench/reread.py)
        "blocks": {str(c.evidence): c.note_id for c in trace.candidates if c.evidence} if trace is not None else {},
        "answer": answer.answer,
        **said(q, answer),
    }


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


def _counts(rows: list[dict]) -> dict:
    return {v: sum(1 for r in rows if r["verdict"] == v) for v in VERDICTS}


def _answerable(rows: list[dict]) -> dict:
    n = len(rows)
    v = _counts(rows)
    gold = sum(1 for r in rows if r["gold_cited"])
    by_llm = sum(1 for r in rows if r["gold_cited_by_llm"])
    # refused: before the LLM, by it (whatever was shown), or shown a refusal after it for another
    # reason (what it wrote did not stand on the notes, and the passages were not about the question)
    shown_refusal = sum(1 for r in rows if r["outcome"] == "llm_refused")
    refused = v["refused"] + v["llm_refused"] + sum(1 for r in rows if r["outcome"] == "llm_refused"
                                                     and r["verdict"] != "llm_refused")
    return {
        "n": n,
        "gold_cited": gold,  # by the answer shown: the LLM's citations or the passages instead
        "gold_cited_rate": _rate(gold, n),
        "gold_cited_by_llm": by_llm,  # by the LLM's own answer (markers or inferred)
        "gold_cited_by_llm_rate": _rate(by_llm, n),
        "all_gold_cited": sum(1 for r in rows if r["all_gold_cited"]),  # every gold note (multi_note)
        "gold_in_evidence": sum(1 for r in rows if r["gold_in_evidence"]),
        "llm_cited": v["llm_cited"],
        "llm_inferred": v["llm_inferred"],
        "refused_before_llm": v["refused"],
        "refused_by_llm": v["llm_refused"],
        "uncited_by_llm": v["llm_uncited"],
        "passages_instead": sum(1 for r in rows if r["outcome"] == "llm_passages"),
        "refusal_after_llm": shown_refusal,
        "false_refusals": refused,
        "false_refusal_rate": _rate(refused, n),
        "shown_uncited": v["cited_nothing"],  # a text shown as an answer citing nothing
        "cited_other_notes_only": sum(1 for r in rows if r["verdict"] in ("llm_cited", "llm_inferred")
                                      and not r["gold_cited"]),
    }


def _says(rows: list[dict]) -> dict:
    """What the answers say, summed (``said``): the LLM's replies' units that say something
    and those standing on the evidence; the units shown as the LLM's answer and those standing
    on none; the specifics no evidence holds, in replies and shown as cited; answer points
    stated by the answers shown (by the LLM's text, and with the note's words quoted under it);
    answers shown cited with a wrong claim."""
    replied = [r for r in rows if r["reply_saying"] is not None]
    shown = [r for r in rows if r["shown_saying"] is not None]
    with_points = [r for r in shown if r["points"]]
    reply_saying = sum(r["reply_saying"] for r in replied)
    reply_supported = sum(r["reply_supported"] for r in replied)
    shown_saying = sum(r["shown_saying"] for r in shown)
    shown_unsupported = sum(r["shown_unsupported"] for r in shown)
    points = sum(r["points"] for r in with_points)
    stated = sum(r["points_stated"] for r in with_points)
    with_quote = sum(r.get("points_shown") or 0 for r in with_points)
    return {
        "replies": len(replied),
        "reply_units": reply_saying, "reply_units_supported": reply_supported,
        "reply_supported_share": _rate(reply_supported, reply_saying),
        "replies_with_invented": sum(1 for r in replied if r["reply_invented"]),
        "shown_answers": len(shown),
        "shown_units": shown_saying, "shown_units_unsupported": shown_unsupported,
        "shown_supported_share": _rate(shown_saying - shown_unsupported, shown_saying),
        "shown_invented": sum(len(r["shown_invented"]) for r in shown),
        "answers_with_points": len(with_points), "points": points, "points_stated": stated,
        "points_stated_rate": _rate(stated, points),
        "points_shown": with_quote, "points_shown_rate": _rate(with_quote, points),
        "wrong_cited": sum(1 for r in shown if r["wrong_cited"]),
    }


def _no_answer(rows: list[dict]) -> dict:
    v = _counts(rows)
    passages = sum(1 for r in rows if r["outcome"] == "llm_passages")
    after = sum(1 for r in rows if r["outcome"] == "llm_refused")
    not_answered = v["refused"] + passages + after
    return {"n": len(rows), "refused_before_llm": v["refused"], "refused_by_llm": v["llm_refused"],
            "uncited_by_llm": v["llm_uncited"], "passages_instead": passages, "refusal_after_llm": after,
            "refused": v["refused"] + v["llm_refused"],
            # no answer claimed: refused, or the passages with "the model could not compose an answer"
            "not_answered": not_answered,
            # an answer or passages shown as the answer (the LLM's, or with no LLM the extractive ones)
            "answered_anyway": len(rows) - not_answered, "shown_uncited": v["cited_nothing"]}


def answer_report(pairs: list[tuple[dict, "Answer"]], refusal: str | tuple[str, ...] = REFUSALS, skipped: int = 0,
                  llm: dict | None = None) -> dict:
    """The answer metrics of (question, answer) pairs.

    - answerable questions (with gold notes): gold note cited by what was shown and by the
      LLM's own answer (markers, or inferred), gold note in the evidence the LLM read (else
      retrieval missed it), the LLM's replies counted apart (cited, inferred, refused,
      uncited: ``_verdict``), false refusals (before the LLM, and by it), the passages
      shown instead of an answer, texts shown as answers citing nothing, answers citing
      only other notes;
    - trap notes (``trap_note_ids``) cited, and shown as the closest notes of a refusal;
    - no_answer questions (no gold notes): refused before / by the LLM, passages instead,
      answered anyway;
    - outcomes (``Trace.outcome``), LLM fallbacks;
    - latency p50/p95: the sources shown, the first token where the LLM answered, total
      for every answer;
      prompt tokens where the LLM answered: Ollama's count when it reported one, else
      the product's estimate (``source`` says which);
    - per question type; one row per question.
    """
    rows = [_row(q, a, refusal) for q, a in pairs]
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]
    outcomes = {name: 0 for name in ("llm", "llm_passages", "refused", "fallback", "extractive")}
    for r in rows:
        outcomes[r["outcome"] or "unknown"] = outcomes.get(r["outcome"] or "unknown", 0) + 1
    tokens = [r for r in rows if r["prompt_tokens"] is not None]
    reported = sum(1 for r in tokens if r["prompt_tokens_source"] == "ollama")
    if not tokens:
        source = None
    elif reported == len(tokens):
        source = "ollama"
    elif reported == 0:
        source = "estimated"
    else:
        source = f"mixed: {reported} from ollama, {len(tokens) - reported} estimated"
    by_type = {}
    for kind in sorted({r["type"] for r in rows}):
        group = [r for r in rows if r["type"] == kind]
        with_gold = [r for r in group if r["answerable"]]
        without = [r for r in group if not r["answerable"]]
        entry: dict = {"n": len(group)}
        if with_gold:
            a = _answerable(with_gold)
            entry.update({k: a[k] for k in ("gold_cited", "gold_cited_by_llm", "gold_cited_rate", "false_refusals",
                                            "uncited_by_llm", "passages_instead")})
        if without:
            entry.update({f"no_answer_{k}": v for k, v in _no_answer(without).items() if k != "n"})
        by_type[kind] = entry
    return {
        "llm": llm,
        "questions": len(rows),
        "skipped_after_changes": skipped,
        "outcomes": outcomes,
        "answerable": _answerable(answerable),
        "no_answer": _no_answer(unanswerable),
        "traps": {
            "questions_with_traps": sum(1 for q, _ in pairs if q.get("trap_note_ids")),
            "cited": sum(1 for r in rows if r["trap_cited"]),
            "shown_as_closest": sum(1 for r in rows if r["trap_closest"]),
        },
        "fallbacks": outcomes["fallback"],
        "latency_ms": {
            "sources": _spread([r["sources_ms"] for r in rows if r["sources_ms"] is not None]),
            "first_token": _spread([r["first_token_ms"] for r in rows if r["first_token_ms"] is not None]),
            "total": _spread([r["total_ms"] for r in rows if r["total_ms"] is not None]),
        },
        "prompt_tokens": {**_spread([r["prompt_tokens"] for r in tokens]), "source": source},
        "says": _says(rows),
        "by_type": by_type,
        "rows": rows,
    }
