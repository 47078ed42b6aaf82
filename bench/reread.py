"""Read recorded real-model replies again with this checkout's ``rag.answer.grounding``.

    .venv/bin/python bench/answers_eval.py --ollama-host URL --record replies.jsonl   # once: the model's work
    .venv/bin/python bench/reread.py replies.jsonl ["ollama qwen2.5-coder:1.5b-instruct"]

A change to how replies are read (refusals, markers, inferred citations) is measured on
the very replies the model wrote, in a second, instead of another hour of the model.
Each recorded chat whose user message names an evidence tag is an answer prompt: its
blocks come from the prompt, the question from its last line, the notes behind the blocks
from the eval row of that question (``rows[].blocks`` of the run in
``bench/answers_eval_results.json``). What is printed: per question, what the reading
makes of the reply then and now; and the answer eval's counts that the reading decides
(gold note cited by the LLM's own answer, refused, uncited, no-answer questions cited,
trap notes cited).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("LEANOTE_RAG_SHARED", REPO.parent / "shared"))
RESULTS = REPO / "bench" / "answers_eval_results.json"
DEV = SHARED / "eval" / "dev.jsonl"


def citing(reply: str, question: str, blocks: dict, refusal: str) -> tuple[str, list[int]]:
    """How the product reads the reply now (``rag.answer.grounding``), and the blocks it cites."""
    from rag.answer import grounding

    reading = grounding.read(reply, question, blocks)
    how = grounding.citing(reply, reading, refusal)
    return how, reading.cited if how in ("cited", "inferred") else []


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    records = [json.loads(line) for line in Path(sys.argv[1]).read_text(encoding="utf-8").splitlines() if line]
    key = sys.argv[2] if len(sys.argv) > 2 else "ollama qwen2.5-coder:1.5b-instruct"
    from fakes.ollama import answer_prompt

    from rag.config import AnswerConfig

    refusal = AnswerConfig().refusal
    rows = {r["id"]: r for r in json.loads(RESULTS.read_text(encoding="utf-8"))["runs"][key]["report"]["rows"]}
    dev = {q["question"]: q for q in map(json.loads, DEV.read_text(encoding="utf-8").splitlines()) if q}
    counts = {"answerable": 0, "gold_by_llm": 0, "refused": 0, "uncited": 0, "no_answer": 0,
              "no_answer_cited": 0, "traps_cited": 0, "changed": 0}
    for rec in records:
        parts = answer_prompt(rec.get("messages") or [])
        if parts is None:
            continue
        question, blocks = parts
        q = dev.get(question)
        row = rows.get(q["id"]) if q else None
        if row is None:
            continue
        now, ns = citing(rec["reply"], question, blocks, refusal)
        notes = {row["blocks"].get(str(n)) for n in ns} - {None}
        gold, traps = set(q.get("gold_note_ids") or []), set(q.get("trap_note_ids") or [])
        if gold:
            counts["answerable"] += 1
            counts["gold_by_llm"] += bool(gold & notes)
            counts["refused"] += now == "refused"
            counts["uncited"] += now in ("uncited", "nothing")
        else:
            counts["no_answer"] += 1
            counts["no_answer_cited"] += bool(notes)
        counts["traps_cited"] += bool(traps & notes)
        then = row.get("citing") or "-"
        mark = "" if then == now else "  <- was " + then
        counts["changed"] += bool(mark)
        hit = "gold" if gold & notes else ("TRAP" if traps & notes else ("-" if gold else "no-answer"))
        print(f"{q['id']:6} {q.get('type', ''):11} {now:9} {hit:9}{mark}  {' '.join(rec['reply'].split())[:90]}")
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
