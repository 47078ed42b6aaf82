"""Answers that repeat themselves: how often the recorded real-model replies did, and whether Ollama's
sampling options hold it back, replaying the very prompts that looped.

    .venv/bin/python bench/repeats.py                                   # count, in bench/replies/ (seconds)
    .venv/bin/python bench/repeats.py --ollama-host http://127.0.0.1:11435 --model qwen2.5-coder:1.5b-instruct \\
        [--variant presence_penalty=0.5] [--variant repeat_penalty=1.2] [--limit 6] [--seed 1]
    .venv/bin/python bench/repeats.py --tiny                            # a smoke run: the reader stand-in

1. Every recorded reply of ``bench/replies/*.jsonl.gz`` (the 1.5B's dev runs and the 0.5B's) split into
   units as the answer check splits them (``rag.answer.support``): how many replies say a unit again (the
   same words, markers, list numbers and punctuation aside), how many go round (``rag.answer.repeats.RUN``
   units in a row said before: the answer service stops those), and how many of those, stopped there,
   lose a unit that says something new.
2. With ``--ollama-host``: the prompts of the replies that went round (one per question, at most
   ``--limit``) sent again as they were, once with the server's defaults and once with each
   ``--variant`` (Ollama options, e.g. ``presence_penalty=0.5``), all with the same ``--seed``,
   ``temperature`` 0.1 and at most 512 tokens written: the units said again, whether it went round,
   the ``[n]`` it cited, and what the answer check makes of it (``rag.answer.support.verdict``; the
   share of its units standing on the evidence). ``--normal N`` replays as many prompts whose reply
   said nothing again (the first answerable ones of ``plain5-1.5b``), to see what the options cost
   an ordinary answer. The variants of one prompt run one after the other, so the server reads
   the prompt once (its cache).

Writes ``bench/repeats_results.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
REPLIES = REPO / "bench" / "replies"
TINY_RECORDING = REPLIES / "en-1.5b.jsonl.gz"
NUM_PREDICT = 512


def units_said_again(reply: str) -> tuple[int, int]:
    """Units of ``reply`` that say again what an earlier one said, and the longest run of them."""
    from rag.answer.support import said, split

    seen: set[str] = set()
    again = run = longest = 0
    for u in split(reply):
        key = said(u.text)
        if not key:
            continue
        if key in seen:
            again += 1
            run += 1
            longest = max(longest, run)
        else:
            seen.add(key)
            run = 0
    return again, longest


def lost_by_stopping(reply: str) -> int | None:
    """Stopped where ``RUN`` units in a row were said before (as the answer service stops a reply):
    how many units after that say something new (not said before, nor the start of what was);
    None when the reply never goes round."""
    from rag.answer.repeats import RUN
    from rag.answer.support import said, split

    units = split(reply)
    seen: set[str] = set()
    run = 0
    for i, u in enumerate(units):
        key = said(u.text)
        if not key:
            continue
        if key not in seen:
            seen.add(key)
            run = 0
            continue
        run += 1
        if run >= RUN:
            rest = [said(v.text) for v in units[i + 1:]]
            return sum(1 for k in rest if k and k not in seen and not any(s.startswith(k) for s in seen))
    return None


def question_of(messages: list[dict]) -> str:
    return (messages[-1].get("content") or "").rsplit("\n", 1)[-1]


def count(paths: list[Path]) -> list[dict]:
    """Per recording: replies, those saying a unit again, those going round."""
    from rag.answer.repeats import RUN

    out = []
    for path in paths:
        rows = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8") if line.strip()]
        stats = [units_said_again(r["reply"]) for r in rows]
        lost = [n for n in (lost_by_stopping(r["reply"]) for r in rows) if n is not None]
        out.append({"file": path.name, "replies": len(rows), "say_again": sum(1 for a, _ in stats if a),
                    "go_round": sum(1 for _, run in stats if run >= RUN),
                    "units_said_again": sum(a for a, _ in stats), "stopped_losing_a_new_unit": sum(1 for n in lost if n)})
    return out


def looping_prompts(paths: list[Path], limit: int) -> list[dict]:
    """The recorded prompts whose reply went round, one per question, the longest runs first."""
    from rag.answer.repeats import RUN

    found: dict[str, dict] = {}
    for path in paths:
        for line in gzip.open(path, "rt", encoding="utf-8"):
            if not line.strip():
                continue
            rec = json.loads(line)
            again, run = units_said_again(rec["reply"])
            question = question_of(rec["messages"])
            if run >= RUN and (question not in found or run > found[question]["run"]):
                found[question] = {"file": path.name, "question": question, "messages": rec["messages"], "run": run,
                                   "again": again, "chars": len(rec["reply"])}
    return sorted(found.values(), key=lambda r: -r["run"])[:limit]


def normal_prompts(path: Path, limit: int) -> list[dict]:
    """The first ``limit`` answer prompts of a recording whose reply said nothing again and was no refusal."""
    from fakes.ollama import answer_prompt

    out = []
    for line in gzip.open(path, "rt", encoding="utf-8"):
        rec = json.loads(line) if line.strip() else None
        if rec is None or len(out) >= limit or not (answer_prompt(rec["messages"]) or ("", {}))[1]:
            continue
        if units_said_again(rec["reply"])[0] == 0 and "没有相关内容" not in rec["reply"]:
            out.append({"file": path.name, "question": question_of(rec["messages"]), "messages": rec["messages"],
                        "run": 0, "again": 0, "chars": len(rec["reply"])})
    return out


def replay(host: str, model: str, messages: list[dict], options: dict, seed: int) -> dict:
    import httpx

    from fakes.ollama import answer_prompt
    from rag.answer import support
    from rag.answer.evidence import cited

    body = {"model": model, "messages": messages, "stream": False,
            "options": {"temperature": 0.1, "num_ctx": 8192, "num_predict": NUM_PREDICT, "seed": seed, **options}}
    started = time.monotonic()
    reply = httpx.post(f"{host.rstrip('/')}/api/chat", json=body, timeout=900).json()
    text = (reply.get("message") or {}).get("content") or ""
    again, run = units_said_again(text)
    question, blocks = answer_prompt(messages) or ("", {})
    check = support.check(text, question, blocks)
    return {"again": again, "run": run, "chars": len(text), "tokens": reply.get("eval_count"),
            "cited": cited(text, set(blocks) or set(range(1, 21)))[1], "verdict": support.verdict(text, check),
            "share": round(check.share, 2), "seconds": round(time.monotonic() - started, 1), "reply": text}


def variant(text: str) -> tuple[str, dict]:
    key, _, value = text.partition("=")
    if not key or not value:
        raise SystemExit(f"--variant takes OPTION=VALUE, e.g. presence_penalty=0.5: {text!r}")
    return text, {key: json.loads(value)}


def main() -> int:
    from rag.answer.repeats import RUN

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ollama-host", metavar="URL", help="replay the prompts that went round on this server")
    ap.add_argument("--model", default="qwen2.5-coder:1.5b-instruct")
    ap.add_argument("--variant", action="append", default=[], metavar="OPTION=VALUE",
                    help="Ollama options to replay with, beside the server's defaults (repeatable)")
    ap.add_argument("--limit", type=int, default=6, help="prompts replayed at most")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--normal", type=int, default=0, metavar="N",
                    help="also replay N prompts whose reply said nothing again (what the options cost)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run: one recording, the reader stand-in")
    args = ap.parse_args()
    variants = [("server defaults", {})] + [variant(v) for v in args.variant]
    paths = [TINY_RECORDING] if args.tiny else sorted(REPLIES.glob("*.jsonl.gz"))
    report: dict = {"counted": count(paths), "run": RUN}
    print(f"| recording | replies | say a unit again | go round ({RUN}+ in a row) | stopped there, lose a new unit |")
    print("|---|---|---|---|---|")
    for c in report["counted"]:
        print(f"| {c['file']} | {c['replies']} | {c['say_again']} | {c['go_round']} | {c['stopped_losing_a_new_unit']} |")
    host, fake = args.ollama_host, None
    if args.tiny:
        from fakes.ollama import FakeOllama

        fake = FakeOllama(models=(args.model,), reader=True).__enter__()
        host = fake.url
    try:
        if host:
            prompts = looping_prompts(paths, args.limit)
            if args.normal:
                prompts += normal_prompts(REPLIES / "plain5-1.5b.jsonl.gz", args.normal)
            if args.tiny and not prompts:  # the stand-in's recording holds none: any prompt, to run the path
                rec = json.loads(gzip.open(TINY_RECORDING, "rt", encoding="utf-8").readline())
                prompts = [{"file": TINY_RECORDING.name, "question": question_of(rec["messages"]),
                            "messages": rec["messages"], "run": 0, "again": 0, "chars": len(rec["reply"])}]
            rows = []
            print(f"\n| question (recording: run) | {' | '.join(name for name, _ in variants)} |")
            print("|---|" + "---|" * len(variants))
            for p in prompts:
                got = {name: replay(host, args.model, p["messages"], options, args.seed) for name, options in variants}
                rows.append({**{k: p[k] for k in ("file", "question", "run", "again", "chars")}, "replays": got})
                cells = [f"{g['again']} again, run {g['run']}, {g['chars']} chars, cites {g['cited']}, {g['verdict']} "
                         f"{g['share']:.2f}" for g in got.values()]
                print(f"| {p['question'][:40]} ({p['file']}: {p['run']}) | {' | '.join(cells)} |", flush=True)
            key = f"{args.model}, seed {args.seed}: " + ", ".join(name for name, _ in variants)
            report["replays"] = {key: {"host": "stand-in" if args.tiny else host, "model": args.model,
                                       "seed": args.seed, "num_predict": NUM_PREDICT, "variants": dict(variants),
                                       "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                       "load": os.getloadavg()[0], "rows": rows}}
    finally:
        if fake is not None:
            fake.__exit__(None, None, None)
    out = results_file("repeats_results.json", args.tiny)
    if out.exists():  # the other replays stay (one entry per model, seed and options)
        try:
            kept = json.loads(out.read_text(encoding="utf-8"))
            report["replays"] = {**kept.get("replays", {}), **report.get("replays", {})}
        except ValueError:
            pass
    out.write_text(json.dumps(report, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
