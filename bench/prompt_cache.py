"""First-token time of the answer prompt, cold and warm, on a real Ollama (needs ../shared).

    .venv/bin/python bench/prompt_cache.py --ollama-host http://127.0.0.1:11435 \
        --model qwen2.5-coder:1.5b-instruct [--questions 12] [--chars 2000]

The product's prompt (``rag.answer.evidence.messages``: the fixed instructions first, then the
evidence, the question last) for dev questions, their evidence from the bench index
(``bench/corpus.yaml``, built by ``make eval``), cut to ``--chars`` characters as a slow
machine's budget would. Each question is sent twice:

- cold: right after a prompt with other instructions, so the server's prompt cache holds
  nothing of it (a model just loaded, or the memory's extraction ran in between);
- warm: right after another question's answer prompt, as when questions follow each
  other: the cache keeps the fixed instructions they share.

The difference between the two is what the cache saves of the reading time. Writes
bench/prompt_cache_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("LEANOTE_RAG_SHARED", REPO.parent / "shared"))
DEV = SHARED / "eval" / "dev.jsonl"
RESULTS = REPO / "bench" / "prompt_cache_results.json"
OTHER = [{"role": "system", "content": "You summarise a text in one sentence."},
         {"role": "user", "content": "Summarise: the weather was fine and we walked to the lake."}]


def first_token(http: httpx.Client, model: str, messages: list[dict]) -> dict:
    body = {"model": model, "messages": messages, "stream": True,
            "options": {"temperature": 0, "num_predict": 8}}
    started = time.monotonic()
    first, final = None, {}
    with http.stream("POST", "/api/chat", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line:
                continue
            obj = json.loads(line)
            if first is None and obj.get("message", {}).get("content"):
                first = time.monotonic() - started
            if obj.get("done"):
                final = obj
    return {"first_token_s": round(first if first is not None else time.monotonic() - started, 2),
            "prompt_tokens": final.get("prompt_eval_count")}


def spread(values: list[float]) -> dict:
    values = sorted(values)
    return {"p50": round(statistics.median(values), 2), "p95": round(values[min(len(values) - 1, int(0.95 * len(values)))], 2),
            "max": round(values[-1], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ollama-host", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--chars", type=int, default=2000, help="evidence characters (a slow machine's cut)")
    args = ap.parse_args()
    if not DEV.exists():
        print(f"needs the dev set at {DEV} (LEANOTE_RAG_SHARED)", file=sys.stderr)
        return 2

    from rag import config as config_mod
    from rag.answer.evidence import build_evidence, messages
    from rag.index.note_index import NoteIndex
    from rag.index.retrieve import search

    raw = yaml.safe_load((REPO / "bench" / "corpus.yaml").read_text(encoding="utf-8"))
    raw["state_dir"] = str(REPO / "bench" / "data")
    raw["source"]["path"] = str(SHARED / "corpus" / "mongodump" / "backup_leanote_20250601.tar.gz")
    settings = config_mod.from_dict(raw, base_dir=REPO / "bench")
    questions = [json.loads(line) for line in DEV.open(encoding="utf-8")]
    questions = [q for q in questions if q["gold_note_ids"] and not q.get("after_changes")]
    step = max(1, len(questions) // args.questions)
    questions = questions[::step][: args.questions]
    cfg = settings.answer.model_copy(update={"total_chars": args.chars})
    prompts = []
    with NoteIndex.open(settings) as index:
        for q in questions:
            hits = search(index, q["question"], q["user_id"], cfg.top_k)
            prompts.append(messages(q["question"], build_evidence(hits, cfg, question=q["question"]), cfg.refusal))
    rows = []
    with httpx.Client(base_url=args.ollama_host, timeout=httpx.Timeout(900, connect=10)) as http:
        for i, (q, prompt) in enumerate(zip(questions, prompts)):
            first_token(http, args.model, OTHER)  # the cache holds nothing of the answer prompt
            cold = first_token(http, args.model, prompt)
            first_token(http, args.model, prompts[i - 1] if i else prompts[-1])  # another question's prompt
            warm = first_token(http, args.model, prompt)
            rows.append({"id": q["id"], "cold": cold, "warm": warm})
            print(f"{q['id']}: cold {cold['first_token_s']} s ({cold['prompt_tokens']} prompt tokens), "
                  f"warm {warm['first_token_s']} s", file=sys.stderr, flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(), "model": args.model,
        "evidence_chars": args.chars, "questions": len(rows),
        "cold_first_token_s": spread([r["cold"]["first_token_s"] for r in rows]),
        "warm_first_token_s": spread([r["warm"]["first_token_s"] for r in rows]),
        "prompt_tokens": spread([r["cold"]["prompt_tokens"] or 0 for r in rows]),
        "rows": rows,
    }
    try:
        saved = json.loads(RESULTS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = {}
    saved[f"{args.model}, {args.chars} characters"] = result
    RESULTS.write_text(json.dumps(saved, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
