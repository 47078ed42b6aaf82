"""A second try from the single best block, measured on recorded replies.

    .venv/bin/python bench/retry_best_block.py bench/replies/plain2-1.5b.jsonl.gz \
        --ollama-host http://127.0.0.1:11435 --model qwen2.5-coder:1.5b-instruct [--out tries.jsonl]

For every answerable dev question whose recorded reply fails the answer check (refused, said
nothing of its own, or stands on no block: ``rag.answer.support``), the same instructions are sent
again with only evidence block 1 and the question, and the new reply is checked. Printed per
question: the first verdict, whether block 1 is the gold note's (``--run``'s rows map blocks to
notes), the second verdict, the seconds it took; then the counts. docs/answers.md says what it
measured.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
from reread import DEV, RESULTS  # noqa: E402


def main() -> int:
    from fakes.ollama import answer_prompt
    from rag.answer import support
    from rag.config import AnswerConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording", type=Path)
    ap.add_argument("--run", default="ollama qwen2.5-coder:1.5b-instruct")
    ap.add_argument("--ollama-host", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, help="write each try as a JSON line")
    args = ap.parse_args()

    refusal = AnswerConfig().refusal
    rows = {r["id"]: r for r in json.loads(RESULTS.read_text(encoding="utf-8"))["runs"][args.run]["report"]["rows"]}
    dev = {q["question"]: q for q in map(json.loads, DEV.read_text(encoding="utf-8").splitlines()) if q}
    opener = gzip.open if args.recording.suffix == ".gz" else open
    tries = []
    with opener(args.recording, "rt", encoding="utf-8") as f, httpx.Client(timeout=600) as http:
        for line in f:
            rec = json.loads(line)
            parts = answer_prompt(rec["messages"])
            q = dev.get(parts[0]) if parts else None
            if q is None or not q.get("gold_note_ids"):
                continue
            question, blocks = parts
            if support.verdict(rec["reply"], support.check(rec["reply"], question, blocks), refusal) in ("cited",
                                                                                                         "inferred"):
                continue
            user = rec["messages"][-1]["content"]
            second = re.search(r"\n\n\[2\] ", user)
            single = user[:second.start()] + "\n\n" + user.rsplit("\n\n", 1)[-1] if second else user
            started = time.monotonic()
            body = http.post(f"{args.ollama_host}/api/chat", json={
                "model": args.model, "stream": False, "options": {"temperature": 0, "num_predict": 300},
                "messages": [rec["messages"][0], {"role": "user", "content": single}]}).json()
            reply = body["message"]["content"]
            only = {1: blocks[1]} if 1 in blocks else blocks
            again = support.verdict(reply, support.check(reply, question, only), refusal)
            gold = rows.get(q["id"], {}).get("blocks", {}).get("1") in set(q["gold_note_ids"])
            tries.append({"id": q["id"], "block1_gold": gold, "second": again,
                          "seconds": round(time.monotonic() - started, 1), "reply": reply})
            print(f"{q['id']:6} block 1 {'gold' if gold else '-':5} -> {again:9} {tries[-1]['seconds']:5.1f} s", flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tries), encoding="utf-8")
    shown = sum(t["second"] in ("cited", "inferred") for t in tries)
    print(json.dumps({"failed_first": len(tries), "shown_second": shown,
                      "block1_gold": sum(t["block1_gold"] for t in tries)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
