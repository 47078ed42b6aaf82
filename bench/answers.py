"""Answer pipeline overhead with a fake LLM, and a reranker's cost per candidate.

    .venv/bin/leanote-rag --config bench/corpus.yaml index      # once (needs ../shared)
    .venv/bin/python bench/answers.py --config bench/corpus.yaml

1. Every dev question through ``AnswerService.ask`` with a local fake Ollama that
   answers at once (tests/fakes/ollama.py, the real ``ollama`` client talking to it):
   p50/p95 of total time and of time to the first streamed token. With an instant
   model, that is the pipeline's own overhead.
2. Reranker cost per candidate on this CPU. No real cross-encoder weights can be
   fetched here, so the architectures of bge-reranker-v2-m3 (XLM-RoBERTa large) and
   of an ms-marco MiniLM-L6 cross-encoder are built with random weights and timed on
   (question, chunk) pairs of 512 tokens: compute does not depend on weight values,
   quality does (and is not measured).
Prints JSON and writes bench/answers_results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
SHARED = Path(os.environ.get("LEANOTE_RAG_SHARED", REPO.parent / "shared"))

from fakes.ollama import FakeOllama  # noqa: E402

from rag import config  # noqa: E402
from rag.answer.service import AnswerService  # noqa: E402
from rag.index.note_index import NoteIndex  # noqa: E402
from rag.llm import OllamaChat  # noqa: E402


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * p))], 1)


async def pipeline(settings) -> dict:
    questions = [json.loads(line) for line in open(SHARED / "eval" / "dev.jsonl", encoding="utf-8")]
    with FakeOllama() as fake:
        cfg = settings.ollama.model_copy(update={"host": fake.url})
        settings = settings.model_copy(update={"ollama": cfg})
        with NoteIndex.open(settings) as index:
            service = AnswerService(settings, index, chat=OllamaChat(cfg))
            totals, firsts, retrieves, refused = [], [], [], 0
            for round_ in range(2):
                for q in questions:
                    fake.reply("根据笔记，", "答案见", "[1]。")
                    answer = await service.ask(q["question"], q["user_id"], on_token=lambda t: None)
                    if round_ == 0:
                        continue  # warm-up round
                    t = answer.timings_ms
                    totals.append(t["total"])
                    retrieves.append(t["retrieve"])
                    if "first_token" in t:
                        firsts.append(t["first_token"])
                    else:
                        refused += 1
            fake.replies.clear()
    return {
        "questions": len(totals),
        "total_ms": {"p50": pct(totals, 0.5), "p95": pct(totals, 0.95)},
        "first_token_ms": {"p50": pct(firsts, 0.5), "p95": pct(firsts, 0.95), "n": len(firsts)},
        "retrieve_ms": {"p50": pct(retrieves, 0.5)},
        "refused_without_llm": refused,
    }


def rerank_cost() -> dict:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, XLMRobertaConfig, XLMRobertaForSequenceClassification

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    out = {}
    archs = {
        "bge-reranker-v2-m3 architecture (XLM-R large, 568M)": lambda: XLMRobertaForSequenceClassification(
            XLMRobertaConfig(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                             intermediate_size=4096, max_position_embeddings=8194, num_labels=1)),
        "ms-marco MiniLM-L6 cross-encoder architecture (22M)": lambda: BertForSequenceClassification(
            BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                       intermediate_size=1536, num_labels=1)),
    }
    for name, build in archs.items():
        model = build().eval()
        batch, length = 8, 512
        ids = torch.randint(5, 1000, (batch, length))
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            model(input_ids=ids[:1, :64], attention_mask=mask[:1, :64])  # warm up
            t = time.perf_counter()
            model(input_ids=ids, attention_mask=mask)
            seconds = time.perf_counter() - t
        out[name] = {"ms_per_candidate_512_tokens": round(seconds / batch * 1000, 1),
                     "seconds_for_50_candidates": round(seconds / batch * 50, 1)}
        del model
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(REPO / "bench" / "corpus.yaml"))
    ap.add_argument("--skip-rerank", action="store_true")
    args = ap.parse_args()
    settings = config.load(args.config)
    results = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
               "pipeline_with_instant_llm": asyncio.run(pipeline(settings))}
    if not args.skip_rerank:
        try:
            results["rerank_cost_random_weights"] = rerank_cost()
        except ImportError:
            results["rerank_cost_random_weights"] = "needs the [models] extra"
    out = REPO / "bench" / "answers_results.json"
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
