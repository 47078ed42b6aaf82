"""The gate before the LLM, drawn as a trade-off from one answer-eval run with the gate open.

    .venv/bin/python bench/answers_eval.py --set answer.refuse_unknown_names=false \\
        --set answer.outlier_z=0 --set retrieval.expand=off            # every question reaches the model
    .venv/bin/python bench/gate_tradeoff.py "reader stand-in, answer.refuse_unknown_names=false, ..."
    .venv/bin/python bench/gate_tradeoff.py [--tiny]                   # no key: the stand-in's run first, then its table
    ... [--results FILE] [--markdown] [--join NAME]                    # several run keys: one table each, or one
    ... --shown FILE.jsonl … [KEY …]                                   # what a refusal may show (module end)

With the gate open every question reaches the model, and each row of the run keeps what the gate
weighed (``rag.answer.gate.signals``: the best dense score, the best term coverage, how far the best
dense score stands out, the names no note mentions). For each setting of the gate
(``answer.refuse_unknown_names``, ``answer.outlier_z``, ``answer.min_dense`` with
``answer.min_coverage``) this works out which questions it would have refused before the model,
and takes what the model did with the others from the run: the false refusals (answerable
questions refused before the model, and by it) against the no-answer questions let through (and
of those, the ones the model answered anyway, shown as from the notes). No model is asked again.

    .venv/bin/python bench/gate_tradeoff.py --shown ../shared/eval/dev.jsonl tests/data/dev_en.jsonl ...

``--shown``: what a refusal may show, on the corpus index of ``bench/answers_eval.py`` (``bench/data``),
no model: for each question, its search as an answer's, and whether the best passages are about it
(``rag.answer.gate.plausible``), the question's words counted alike and weighted by their rarity in
the person's notes (``rag.answer.refusing.rarity``), at several shares: for an answerable question,
the gold note's passage among those about it; for a no-answer question, any.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPEN = ["answer.refuse_unknown_names=false", "answer.outlier_z=0", "retrieval.expand=off"]
STAND_IN_OPEN = "reader stand-in, " + ", ".join(OPEN)  # the key bench/answers_eval.py files that run under

# (name, refuse_unknown_names, outlier_z, min_dense, min_coverage)
SETTINGS = [("gate open", False, 0.0, None, None)]
for names in (True, False):
    for z in (3.0, 5.0):
        SETTINGS.append((f"names {'on' if names else 'off'}, outlier_z {z:g}", names, z, None, None))
    for dense, cover in ((0.35, 0.2), (0.4, 0.2), (0.4, 0.3), (0.45, 0.3), (0.5, 0.4)):
        SETTINGS.append((f"names {'on' if names else 'off'}, outlier_z 3, min_dense {dense:g} + min_coverage {cover:g}",
                         names, 3.0, dense, cover))


def refused_before(gate: dict, names: bool, z: float, dense: float | None, cover: float | None) -> str:
    """Why this setting would refuse the question before the model ("" when it would not): as
    ``rag.answer.service._refused`` and ``rag.answer.gate.too_weak`` decide, from the signals."""
    if not gate:
        return ""
    if names and gate.get("unknown"):
        return "name"
    stands_out = gate.get("z")
    if gate["cover"] == 0 and stands_out is not None and stands_out < z:
        return "weak"
    if dense is not None and cover is not None and gate["dense"] < dense and gate["cover"] < cover:
        return "absolute"
    return ""


def table(rows: list[dict]) -> list[dict]:
    """One line per setting: what it refuses before the model, and what the model did with the rest."""
    answerable = [r for r in rows if r["answerable"]]
    no_answer = [r for r in rows if not r["answerable"]]
    out = []
    for name, names, z, dense, cover in SETTINGS:
        def before(r):
            return refused_before(r["gate"], names, z, dense, cover)

        false_before = [r for r in answerable if before(r)]
        through = [r for r in answerable if not before(r)]
        # refused by the model, or its answer withdrawn for the refusal (passages are an answer)
        false_after = [r for r in through if r["outcome"] in ("llm_refused", "refused")]
        right = [r for r in through if r["gold_cited"]]
        caught = [r for r in no_answer if before(r)]
        let = [r for r in no_answer if not before(r)]
        anyway = [r for r in let if r["outcome"] == "llm"]
        passages = [r for r in let if r["outcome"] in ("llm_passages", "fallback")]
        out.append({
            "setting": name, "answerable": len(answerable), "no_answer": len(no_answer),
            "false_before": [r["id"] for r in false_before],
            "false_before_paraphrase": sum(1 for r in false_before if r["type"] == "paraphrase"),
            "false_after": [r["id"] for r in false_after], "gold_cited": len(right),
            "caught": [r["id"] for r in caught], "let_through": [r["id"] for r in let],
            "answered_anyway": [r["id"] for r in anyway], "passages_instead": [r["id"] for r in passages],
        })
    return out


def lines(key: str, result: list[dict], markdown: bool) -> list[str]:
    head = ["setting", "answerable refused before the model", "refused by it", "gold note cited",
            "no-answer let through", "answered anyway (shown as from the notes)", "passages instead"]
    body = []
    for t in result:
        body.append([t["setting"], f"{len(t['false_before'])}/{t['answerable']} ({t['false_before_paraphrase']} paraphrases)",
                     f"{len(t['false_after'])}", f"{t['gold_cited']}/{t['answerable']}",
                     f"{len(t['let_through'])}/{t['no_answer']}", f"{len(t['answered_anyway'])}",
                     f"{len(t['passages_instead'])}"])
    if markdown:
        return [f"{key}:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + \
            ["| " + " | ".join(row) + " |" for row in body] + [""]
    width = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    return [key] + ["  ".join(str(x).ljust(w) for x, w in zip(row, width)) for row in [head, *body]] + [""]


def shown(files: list[Path], only: set[str] | None = None) -> list[str]:
    """The ``--shown`` table (module docstring); ``only``: these questions alone."""
    import yaml

    from rag import config as config_mod
    from rag.answer import gate, refusing
    from rag.index.note_index import NoteIndex
    from rag.index.retrieve import search

    sys.path.insert(0, str(REPO / "bench"))
    from common import BACKUP_NAME, shared

    raw = yaml.safe_load((REPO / "bench" / "corpus.yaml").read_text(encoding="utf-8"))
    raw["source"]["path"] = str(shared() / "corpus" / "mongodump" / BACKUP_NAME)
    raw["state_dir"] = str(REPO / "bench" / "data")
    settings = config_mod.from_dict(raw, base_dir=REPO / "bench")
    shares = (0.25, 0.3, 0.35, 0.4, 0.5)
    out = ["| questions | words | " + " | ".join(f"{s:.0%}" for s in shares) + " |", "|---|---|" + "---|" * len(shares)]
    with NoteIndex.open(settings) as index:
        for path in files:
            questions = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            questions = [q for q in questions if not q.get("after_changes") and (only is None or q["id"] in only)]
            found = []
            for q in questions:
                hits = search(index, q["question"], q["user_id"], settings.rerank.candidates)[: settings.answer.top_k]
                weights = refusing.rarity(index, q["question"], q["user_id"])
                found.append((q, hits, weights))
            for label, weighted in (("alike", False), ("by rarity", True)):
                cells = []
                for share in shares:
                    gold = none = 0
                    for q, hits, weights in found:
                        notes = [h.note_id for h, held in gate.by_note(q["question"], hits, weights if weighted else None)
                                 if held >= share]
                        if q.get("gold_note_ids"):
                            gold += bool(set(notes) & set(q["gold_note_ids"]))
                        else:
                            none += bool(notes)
                    answerable = sum(1 for q, _, _ in found if q.get("gold_note_ids"))
                    cells.append(f"{gold}/{answerable} · {none}/{len(found) - answerable}")
                out.append(f"| {path.name} | {label} | " + " | ".join(cells) + " |")
    return out + ["", "each cell: answerable questions whose gold note's passage is about the question · no-answer "
                      "questions with a passage about them (of the best 3 notes of the evidence)"]


def stand_in_run(tiny: bool) -> Path:
    """``bench/answers_eval.py`` with the reader stand-in and the gate open (``--tiny``: on the sample
    notes, its results apart from the recorded ones); the results file it wrote."""
    import os
    import subprocess
    import tempfile

    env = dict(os.environ)
    out = REPO / "bench" / "answers_eval_results.json"
    if tiny:
        env["LEANOTE_RAG_BENCH_OUT"] = folder = os.environ.get("LEANOTE_RAG_BENCH_OUT") or tempfile.mkdtemp(
            prefix="lr-bench-")
        out = Path(folder) / "answers_eval_results.json"
    args = [sys.executable, str(REPO / "bench" / "answers_eval.py"), *(["--tiny"] if tiny else [])]
    for setting in OPEN:
        args += ["--set", setting]
    subprocess.run(args, check=True, env=env, stdout=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("keys", nargs="*", help="run keys of the results file (each run with the gate open)")
    ap.add_argument("--shown", type=Path, nargs="+", metavar="JSONL",
                    help="question files: what a refusal may show (with KEYS: only the questions whose model reply "
                         "those runs did not show)")
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "answers_eval_results.json")
    ap.add_argument("--tiny", action="store_true", help="with no key: the stand-in's run on the sample notes")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", action="store_true", help="the tables as JSON, with the question ids")
    ap.add_argument("--join", metavar="NAME", help="one table of all the runs' questions, under this name")
    ap.add_argument("--signals-from", metavar="KEY", action="append", default=[],
                    help="take each question's gate signals from this run (the same search, e.g. a stand-in run "
                         "of newer code), the model's outcomes from the KEYS")
    args = ap.parse_args()
    if not args.keys and not args.shown:
        args.results, args.keys = stand_in_run(args.tiny), [STAND_IN_OPEN]
    elif args.tiny:
        ap.error("--tiny is for the run without a key")
    runs = json.loads(args.results.read_text(encoding="utf-8"))["runs"] if args.results.exists() else {}
    if args.shown:
        only = None
        if args.keys:  # the questions whose model reply these runs did not show (refused, or withdrawn)
            only = {r["id"] for key in args.keys for r in runs[key]["report"]["rows"]
                    if r["outcome"] in ("llm_passages", "llm_refused")}
        print("\n".join(shown(args.shown, only)))
        return 0
    runs = json.loads(args.results.read_text(encoding="utf-8"))["runs"]
    out = {}
    for key in args.keys:
        if key not in runs:
            print(f"no run {key!r} in {args.results}", file=sys.stderr)
            return 2
        rows = runs[key]["report"]["rows"]
        if not all("gate" in r for r in rows):
            print(f"run {key!r} keeps no gate signals (recorded before they were): run it again", file=sys.stderr)
            return 2
        out[key] = rows
    if args.signals_from:
        signals = {}
        for key in args.signals_from:
            if key not in runs:
                print(f"no run {key!r} in {args.results}", file=sys.stderr)
                return 2
            signals.update({r["id"]: r["gate"] for r in runs[key]["report"]["rows"]})
        missing = sorted({r["id"] for rows in out.values() for r in rows} - signals.keys())
        if missing:
            print(f"no signals for {', '.join(missing)} in --signals-from", file=sys.stderr)
            return 2
        out = {key: [{**r, "gate": signals[r["id"]]} for r in rows] for key, rows in out.items()}
    if args.join:
        out = {args.join: [r for rows in out.values() for r in rows]}
    out = {key: table(rows) for key, rows in out.items()}
    if args.json:
        print(json.dumps(out, ensure_ascii=False, indent=1))
        return 0
    for key, result in out.items():
        print("\n".join(lines(key, result, args.markdown)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
