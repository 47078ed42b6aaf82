"""Retrieval steps side by side on the dev set: what each step adds, per question type.

    .venv/bin/leanote-rag --config bench/corpus.yaml index      # once (needs ../shared)
    .venv/bin/python bench/retrieval_steps.py --config bench/corpus.yaml
    .venv/bin/python bench/retrieval_steps.py --tiny     # seconds, on the sample notes (a smoke run)

Every dev question (after_changes ones left out) through each variant in one run, on
one open index: hit@5 (a top-5 chunk holds a gold quote), recall@5 and recall@20 of
the gold notes, MRR@10 of the first gold note (as `leanote-rag eval`), passage MRR@10
(of the first chunk holding a gold quote: finer than hit@5, and the one a passage
step moves, since it leaves note ranks alone), and the search's own latency (query
embedding included) p50, per question type and overall. The variants run in turn on
each question, three rounds (the first a warm-up), so they share the machine's
state alike. Prints JSON and writes bench/retrieval_steps_results.json.

Variants are a list of ``Variant(name, make)``: ``make(index)`` returns a function
``(question, user_id, k) -> hits``. "(c) + expansion (stand-in)" fuses in the query
expansion of a stand-in LLM that returns the question itself (an expansion must never
make a question worse; a real LLM's terms can only be measured with a real LLM).
"(d) + entities (memory)" is (b) with the "entities" ranking fused in at
``rag.index.retrieve.ENTITY_WEIGHT``, made as ``AnswerService`` makes it (``named_entities`` then
``entity_ranking`` over the index's memory, ``<state_dir>/memory.sqlite``; its time counts in
the variant's p50); (b) is the same search without it, as with ``memory.enabled: false``.
Left out (with a note) when the index has no memory.
``--variant "NAME:key=value,..."`` adds a variant with other ``retrieval`` settings
from the command line. ``--expand-with URL --model NAME`` adds "(e) (b) + expansion" by a
real model at that Ollama: each question's expansion is asked for once, as
``rag.answer.expand.Expander`` asks (its prompt, schema and output cap), timed, and not
cut by any budget, so it shows what the terms add and what they cost on this machine;
``--types paraphrase`` keeps the run to one kind of question.

``--tiny`` indexes the sample notes (``bench/common.py``'s ``tiny_world``) into a temporary
folder as ``bench/answers_eval.py`` indexes the corpus (``leanote-rag index``, bench/corpus.yaml's
settings) and runs their questions the same way; the JSON goes apart from the recorded one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, median
from typing import Callable

import yaml

from rag import config
from rag.answer.expand import OUTPUT_TOKENS, SCHEMA, SYSTEM, parse
from rag.eval import _outcome, load_questions, normalise
from rag.index.note_index import NoteIndex
from rag.memory.store import MemoryStore, path_for
from rag.model import Hit
from rag.index.retrieve import ENTITY_WEIGHT, entity_ranking, named_entities, search

sys.path.insert(0, str(Path(__file__).resolve().parent))
from answers_eval import index_corpus  # noqa: E402
from common import REPO, results_file, shared, tiny_world  # noqa: E402

K = 20  # as `leanote-rag eval`: hits per question, enough for recall@20

Search = Callable[[str, str, int], list[Hit]]


@dataclass
class Variant:
    name: str
    make: Callable[[NoteIndex], Search]


def _view(index: NoteIndex, retrieval: dict) -> NoteIndex:
    """The open index, searched with these ``retrieval`` settings changed."""
    cfg = index.settings.retrieval.model_copy(update=retrieval)
    return NoteIndex(index.settings.model_copy(update={"retrieval": cfg}), index.store, index.embedder, index.index_id)


def hybrid(**retrieval) -> Callable[[NoteIndex], Search]:
    """Hybrid search on the open index with these ``retrieval`` settings changed."""

    def make(index: NoteIndex) -> Search:
        view = _view(index, retrieval)
        return lambda question, user_id, k: search(view, question, user_id, k)

    return make


def echoed(**retrieval) -> Callable[[NoteIndex], Search]:
    """As ``hybrid``, with the query expansion of a stand-in LLM that returns the question
    itself as its terms and its hypothetical answer: the check that an expansion never
    makes a question worse (rag.answer.expand)."""

    def make(index: NoteIndex) -> Search:
        view = _view(index, retrieval)
        return lambda question, user_id, k: search(view, question, user_id, k, expansion=([question], question))

    return make


ENTITY_STATS: dict[str, set] = {"questions_with_entities": set()}
MEMORIES: list[MemoryStore] = []  # opened by ``remembered`` variants, closed after the run


def remembered(**retrieval) -> Callable[[NoteIndex], Search]:
    """As ``hybrid``, with the entities ranking of the index's memory fused in, as an
    answer fuses it (``AnswerService._remembered``)."""

    def make(index: NoteIndex) -> Search:
        view = _view(index, retrieval)
        memory = MemoryStore(path_for(index.settings))
        MEMORIES.append(memory)

        def fn(question: str, user_id: str, k: int) -> list[Hit]:
            named = named_entities(memory, user_id, question)
            if named:
                ENTITY_STATS["questions_with_entities"].add((user_id, question))
            ranking = entity_ranking(memory, user_id, named, max(view.settings.retrieval.candidates, k))
            return search(view, question, user_id, k, entities=ranking)

        return fn

    return make


EXPANSIONS: dict[str, dict] = {}  # question -> the real model's terms, sentence and seconds


def real_expansions(url: str, model: str, questions: list[dict]) -> None:
    """Ask the Ollama at ``url`` for each question's expansion, as ``Expander`` does."""
    import requests

    for q in questions:
        body = {"model": model, "stream": False, "format": SCHEMA,
                "options": {"num_predict": OUTPUT_TOKENS, "temperature": 0},
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q["question"]}]}
        started = time.perf_counter()
        reply = requests.post(url.rstrip("/") + "/api/chat", json=body, timeout=600)
        reply.raise_for_status()
        found = parse(reply.json()["message"]["content"])
        EXPANSIONS[q["question"]] = {"terms": found.terms, "answer": found.answer,
                                     "seconds": round(time.perf_counter() - started, 2)}


def expanded(**retrieval) -> Callable[[NoteIndex], Search]:
    """As ``hybrid``, with the real model's expansion (``EXPANSIONS``) fused in."""

    def make(index: NoteIndex) -> Search:
        view = _view(index, retrieval)

        def fn(question: str, user_id: str, k: int) -> list[Hit]:
            e = EXPANSIONS.get(question) or {}
            terms, answer = e.get("terms") or [], e.get("answer") or ""
            return search(view, question, user_id, k, expansion=(terms, answer) if terms or answer else None)

        return fn

    return make


VARIANTS = [
    Variant("(a) hybrid", hybrid(passages=False)),
    Variant("(b) + passages", hybrid(passages=True)),
    Variant("(c) + expansion (stand-in)", echoed(passages=True)),
]
ENTITIES = Variant(f"(d) (b) + entities (memory, weight {ENTITY_WEIGHT})", remembered(passages=True))


def parse_variant(text: str) -> Variant:
    """``NAME:key=value,key=value`` -> a hybrid variant with those retrieval settings."""
    name, _, settings = text.partition(":")
    changes = {}
    for pair in filter(None, settings.split(",")):
        key, _, value = pair.partition("=")
        changes[key.strip()] = yaml.safe_load(value)
    config.RetrievalConfig(**changes)  # a misspelt key fails here, before any work
    return Variant(name.strip(), hybrid(**changes))


def passage_rr(q: dict, hits: list[Hit]) -> float | None:
    """1 / rank of the first of the top 10 chunks that holds a gold quote (0 if none)."""
    quotes = [normalise(s) for s in q.get("gold_quotes") or [] if s.strip()]
    if not quotes:
        return None
    rank = next((r for r, h in enumerate(hits[:10], 1) if any(qt in normalise(h.text) for qt in quotes)), None)
    return 1.0 / rank if rank else 0.0


def metrics(rows: list[tuple], times: list[float]) -> dict:
    """rows: (outcome, passage reciprocal rank) per question."""
    outcomes = [o for o, _ in rows]
    with_quotes = [o for o in outcomes if o.hit5 is not None]
    prr = [r for _, r in rows if r is not None]
    return {
        "n": len(outcomes),
        "hit@5": round(mean(1.0 if o.hit5 else 0.0 for o in with_quotes), 3) if with_quotes else None,
        "recall@5": round(mean(o.recall5 for o in outcomes), 3),
        "recall@20": round(mean(o.recall20 for o in outcomes), 3),
        "mrr@10": round(mean(o.rr10 for o in outcomes), 3),
        "passage_mrr@10": round(mean(prr), 3) if prr else None,
        "p50_ms": round(median(times) * 1000, 1),
    }


def run(settings, questions: list[dict], variants: list[Variant], rounds: int = 3) -> dict:
    with NoteIndex.open(settings) as index:
        searches = [v.make(index) for v in variants]
        hits: dict[tuple[int, str], list[Hit]] = {}
        times: dict[tuple[int, str], list[float]] = {}
        for round_ in range(rounds):
            for q in questions:
                for i, fn in enumerate(searches):
                    t = time.perf_counter()
                    result = fn(q["question"], q["user_id"], K)
                    elapsed = time.perf_counter() - t
                    if round_ == 0:
                        hits[i, q["id"]] = result  # the ranking does not change between rounds
                    if round_ > 0 or rounds == 1:
                        times.setdefault((i, q["id"]), []).append(elapsed)
        out = {}
        for i, v in enumerate(variants):
            rows = [(_outcome(q, hits[i, q["id"]], "hybrid"), passage_rr(q, hits[i, q["id"]])) for q in questions]
            per_q = {q["id"]: times[i, q["id"]] for q in questions}
            kinds = sorted({o.type for o, _ in rows})
            out[v.name] = {
                "overall": metrics(rows, [t for ts in per_q.values() for t in ts]),
                "by_type": {
                    kind: metrics([r for r in rows if r[0].type == kind],
                                  [t for o, _ in rows if o.type == kind for t in per_q[o.id]])
                    for kind in kinds
                },
                "hit@5_misses": [o.id for o, _ in rows if o.hit5 is False],
            }
        for memory in MEMORIES:
            memory.close()
        MEMORIES.clear()
        return out


def table(results: dict) -> str:
    """Markdown: one row per question type (and overall), one column group per variant."""
    names = list(results)
    kinds = ["overall"] + list(next(iter(results.values()))["by_type"])
    head = "| type | n | " + " | ".join(f"{n}: hit@5 / R@20 / MRR@10 / passage MRR@10 / p50 ms" for n in names) + " |"
    rows = [head, "|" + "---|" * (2 + len(names))]
    for kind in kinds:
        cells = []
        for n in names:
            m = results[n]["overall"] if kind == "overall" else results[n]["by_type"][kind]
            cells.append(
                f"{m['hit@5']:.3f} / {m['recall@20']:.3f} / {m['mrr@10']:.3f} / {m['passage_mrr@10']:.3f} / {m['p50_ms']}"
            )
        n_q = (results[names[0]]["overall"] if kind == "overall" else results[names[0]]["by_type"][kind])["n"]
        rows.append(f"| {kind} | {n_q} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", help="an index of the shared corpus (default: bench/corpus.yaml)")
    ap.add_argument("--questions", help="the questions (default: the shared dev set)")
    ap.add_argument("--variant", action="append", default=[], help='"NAME:key=value,..." (retrieval settings)')
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the questions; the first is a warm-up")
    ap.add_argument("--no-entities", action="store_true", help="leave out the entities variant (d)")
    ap.add_argument("--out", help="where to write the JSON ('-': nowhere; default: bench/retrieval_steps_results.json)")
    ap.add_argument("--expand-with", metavar="URL", help="an Ollama whose model expands each question: variant (e)")
    ap.add_argument("--model", help="with --expand-with: the model")
    ap.add_argument("--types", help="only these question types (comma-separated), e.g. paraphrase")
    ap.add_argument("--tiny", action="store_true", help="a smoke run: the sample notes indexed in a temporary folder")
    args = ap.parse_args()
    if args.tiny and (args.config or args.expand_with):
        ap.error("--tiny indexes the sample notes itself and asks no real model: no --config, no --expand-with")
    work = tempfile.TemporaryDirectory(prefix="lr-bench-steps-") if args.tiny else None  # removed at exit
    if work:
        tiny_world()
        args.config = str(index_corpus(Path(work.name), Path(work.name) / "data"))
    args.config = args.config or str(REPO / "bench" / "corpus.yaml")
    args.questions = args.questions or str(shared() / "eval" / "dev.jsonl")
    args.out = args.out or str(results_file("retrieval_steps_results.json", args.tiny))
    settings = config.load(args.config)
    questions = [
        q for q in load_questions(Path(args.questions)) if q.get("gold_note_ids") and not q.get("after_changes")
    ]
    if args.types:
        kinds = set(args.types.split(","))
        questions = [q for q in questions if q.get("type") in kinds]
    variants = list(VARIANTS)
    if args.expand_with:
        if not args.model:
            ap.error("--expand-with needs --model")
        real_expansions(args.expand_with, args.model, questions)
        variants.append(Variant(f"(e) (b) + expansion, {args.model}", expanded(passages=True)))
    memory_note = None
    if not args.no_entities:
        if path_for(settings).exists():
            variants.append(ENTITIES)
        else:
            memory_note = f"no memory at {path_for(settings)}: the entities variant is left out"
            print(memory_note)
    variants += [parse_variant(v) for v in args.variant]
    results = run(settings, questions, variants, max(1, args.rounds))
    report = {
        "questions": len(questions),
        "source": Path(args.questions).name,
        "retrieval": settings.retrieval.model_dump(),
        "variants": results,
        "table": table(results),
    }
    if ENTITIES in variants:
        report["entities"] = {"weight": ENTITY_WEIGHT,
                              "questions_naming_an_entity": len(ENTITY_STATS["questions_with_entities"]),
                              "memory": str(path_for(settings))}
    elif memory_note:
        report["entities"] = {"note": memory_note}
    if EXPANSIONS:
        seconds = sorted(e["seconds"] for e in EXPANSIONS.values())
        report["expansion"] = {"model": args.model, "url": args.expand_with,
                               "seconds_p50": median(seconds), "seconds_max": seconds[-1],
                               "empty": sum(1 for e in EXPANSIONS.values() if not e["terms"] and not e["answer"]),
                               "by_question": EXPANSIONS}
    text = json.dumps(report, ensure_ascii=False, indent=1)
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
