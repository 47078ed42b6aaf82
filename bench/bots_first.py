"""What a person on Telegram sees, and when, with a real model: the daemon answering dev
questions over the shared corpus through the real python-telegram-bot Application.

    .venv/bin/python bench/bots_first.py --ollama-host http://127.0.0.1:11435 \\
        --model qwen2.5-coder:1.5b-instruct [--questions A002,A011] [--count 10] [--follow-ups 3]
    .venv/bin/python bench/bots_first.py --tiny     # seconds, on the sample notes with the fake Ollama (a smoke run)

The daemon (``leanote-rag serve``'s ``Daemon`` with the Telegram bot) runs in its own
process on ``bench/data`` (index it first: ``answers_eval.py`` does; nothing else may
hold it while this runs), with the LLM given here and its memory's LLM tier off (it
would compete for the CPU). This process plays Telegram (``tests/fakes/telegram.py``,
the Bot API over HTTP). Questions go one at a time, each from the person mapped to the
question's Leanote user, and for each the fake's own clock says when the person saw:

- ``placeholder``: the "…" reply (polled every 20 ms: the fake does not time sends);
- ``sources``: the edit that puts the notes the answer reads (titles, links) under it;
- ``first_text``: the first edit with streamed answer text (the edit pacing,
  ``telegram.edit_interval``, is part of this);
- ``final``: the finished answer (HTML, sources and buttons).

``--tiny``: the sample notes (bench/common.py's ``tiny_world``) indexed into a temporary folder
instead of ``bench/data``, the reader stand-in (``FakeOllama(reader=True)``, as answers_eval.py's)
instead of a model, writing 300 tokens/s with ``telegram.edit_interval`` 0.1 s (so that answers
stream in a few edits), 3 questions and one follow-up.

Prints JSON and writes ``bench/bots_first_results.json`` (one run per model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file, tiny_world  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))

from answers_eval import DATA, STAND_IN, backup, dev_set, host_url, leanote_rag, write_config  # noqa: E402
from fakes.ollama import FakeOllama  # noqa: E402
from fakes.telegram import FakeTelegram  # noqa: E402

WAIT = 400.0  # seconds one answer may take before it counts as lost
FOLLOW_UP = "还有别的办法吗？"  # "any other way?": a follow-up (rag.answer.followup), asked after a question
SOURCES_HEAD = "📚"
CURSOR = " ▌"  # bot.chat.pacing.Pacer: streamed text ends with it until the final edit


def config(folder: Path, host: str, model: str, base_url: str, people: dict[str, int],
           budget: float | None, data: Path, edit_interval: float | None = None) -> Path:
    """answers_eval's config (the corpus, the index in ``data``, the LLM, the budget) with the bot
    (``telegram.edit_interval``, when given), the people, no memory LLM tier and no watcher."""
    path = write_config(folder, host, model, budget=budget, data=data)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["memory"] = {"llm": "off"}
    raw["sync"] = {"interval": "1h", "watch": False}
    raw["telegram"] = {"enabled": True, "token_env": "BENCH_TG", "base_url": base_url}
    if edit_interval is not None:
        raw["telegram"]["edit_interval"] = edit_interval
    raw["users"] = [{"leanote_user_id": user, "telegram_ids": [pid]} for user, pid in people.items()]
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


def child(config_path: str) -> None:
    """The daemon, stopped when the parent closes our stdin."""
    from bot.telegram import service
    from rag.config import load
    from bot.serve import Daemon

    async def run() -> None:
        daemon = Daemon(load(config_path), services=[service])
        asyncio.get_running_loop().add_reader(sys.stdin.fileno(), daemon.stop)
        await daemon.run()

    asyncio.run(run())


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(round(q * (len(values) - 1))))], 2)


def finished(msg: dict) -> bool:
    """The finished answer: an HTML edit that is neither the sources shown first nor streamed text
    (those are HTML too, each link-like token made inert)."""
    text = msg["text"]
    return msg.get("parse_mode") == "HTML" and not text.startswith(SOURCES_HEAD) and not text.endswith(CURSOR)


def one(tg: FakeTelegram, person: int, question: str) -> dict:
    """Ask, and time what the person sees until the final answer (or WAIT)."""
    before = {id(m) for m in tg.sent_to(person)}
    asked = time.monotonic()
    tg.say(person, question)
    placeholder = msg = None
    while time.monotonic() - asked < WAIT:
        if msg is None:
            new = [m for m in tg.sent_to(person) if id(m) not in before]
            if new:
                msg, placeholder = new[0], time.monotonic() - asked
        if msg is not None and finished(msg):
            break
        time.sleep(0.02)
    if msg is None:
        return {"question": question, "lost": True}
    edits = [(t - asked, text) for t, text in msg["edits"]]
    sources = next((t for t, text in edits if text.startswith(SOURCES_HEAD)), None)
    first_text = next((t for t, text in edits if text.endswith(CURSOR)), None)
    final = msg["edits"][-1][0] - asked if finished(msg) and msg["edits"] else None
    return {"question": question, "lost": final is None, "placeholder_s": round(placeholder, 2),
            "sources_s": None if sources is None else round(sources, 2),
            "first_text_s": None if first_text is None else round(first_text, 2),
            "final_s": None if final is None else round(final, 2), "streaming_edits": sum(
                1 for _, text in edits if text.endswith(CURSOR)), "final_text": msg["text"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ollama-host", metavar="URL", help="the real Ollama (or the real-llm server); required")
    ap.add_argument("--model", help="required")
    ap.add_argument("--questions", metavar="ID,ID", help="these dev questions (default: the first --count answerable)")
    ap.add_argument("--count", type=int, default=10, help="without --questions: how many (default 10)")
    ap.add_argument("--follow-ups", type=int, default=0, metavar="N",
                    help=f"after each of the first N questions, the same person asks {FOLLOW_UP!r}")
    ap.add_argument("--budget", type=float, metavar="SECONDS", help="answer.first_token_budget (default: the config's)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run on the sample notes with the fake Ollama: "
                    "3 questions, one follow-up")
    args = ap.parse_args()
    if args.tiny:
        if args.ollama_host or args.model:
            ap.error("--tiny runs the fake Ollama, never a real model")
        tiny_world()
        args.model, args.count, args.follow_ups = STAND_IN, 3, max(args.follow_ups, 1)
    elif not (args.ollama_host and args.model):
        ap.error("the following arguments are required: --ollama-host, --model (or --tiny)")
    if not dev_set().exists() or not backup().exists():
        print(f"needs the shared corpus and dev set: {backup()} and {dev_set()} (LEANOTE_RAG_SHARED), or --tiny",
              file=sys.stderr)
        return 2
    if not args.tiny and not (DATA / "qdrant").exists():
        print(f"index the corpus into {DATA} first (bench/answers_eval.py does)", file=sys.stderr)
        return 2
    dev = [json.loads(line) for line in dev_set().read_text(encoding="utf-8").splitlines() if line.strip()]
    if args.questions:
        wanted = args.questions.split(",")
        known = {q["id"]: q for q in dev}
        missing = [i for i in wanted if i not in known]
        if missing:
            ap.error(f"not in the dev set: {', '.join(missing)}")
        chosen = [known[i] for i in wanted]
    else:
        chosen = [q for q in dev if q["gold_note_ids"] and not q.get("after_changes")][: args.count]
    people = {user: 700 + n for n, user in enumerate(sorted({q["user_id"] for q in dev}))}

    rows = []
    stand_in = FakeOllama(models=(STAND_IN,), speed=(20_000, 300), reader=True) if args.tiny else nullcontext()
    with tempfile.TemporaryDirectory() as tmp, FakeTelegram() as tg, stand_in as fake:
        data = Path(tmp) / "data" if args.tiny else DATA
        if args.tiny:  # the index a real run finds in bench/data
            leanote_rag("--config", str(write_config(Path(tmp), fake.url, STAND_IN, data=data)), "index")
        host = fake.url if args.tiny else host_url(args.ollama_host)
        path = config(Path(tmp), host, args.model, tg.base_url, people, args.budget, data,
                      edit_interval=0.1 if args.tiny else None)
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(path)], stdin=subprocess.PIPE,
                                env={**os.environ, "BENCH_TG": "123:TEST"})
        try:
            started = time.monotonic()
            while not tg.method_calls("getUpdates"):
                if proc.poll() is not None or time.monotonic() - started > 600:
                    print("the daemon did not start polling Telegram", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            time.sleep(1.0 if args.tiny else 5.0)  # the first sync pass (no changes) before the first question
            for n, q in enumerate(chosen):
                asks = [(q["question"], False)] + ([(FOLLOW_UP, True)] if n < args.follow_ups else [])
                for text, follow in asks:
                    row = one(tg, people[q["user_id"]], text)
                    row["id"], row["follow_up"] = q["id"], follow
                    row["gold_cited"] = any(g in row.get("final_text", "") for g in q["gold_note_ids"])
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "final_text"}, ensure_ascii=False),
                          file=sys.stderr)
        finally:
            proc.stdin.close()
            proc.wait(timeout=120)

    done = [r for r in rows if not r["lost"]]

    def summary(key: str, follow: bool = False) -> dict:
        values = [r[key] for r in done if r.get(key) is not None and r["follow_up"] == follow]
        return {"n": len(values), "p50": pct(values, 0.5), "p95": pct(values, 0.95), "max": pct(values, 1.0)}

    result = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(), "model": args.model,
              "first_token_budget": args.budget, "asked": len(rows), "answered": len(done),
              "gold_in_final_answer": sum(r["gold_cited"] for r in done if not r["follow_up"]),
              **{key: summary(key) for key in ("placeholder_s", "sources_s", "first_text_s", "final_s")},
              "follow_ups": {key: summary(key, True) for key in ("sources_s", "first_text_s", "final_s")},
              "rows": [{k: v for k, v in r.items() if k != "final_text"} for r in rows]}
    out = results_file("bots_first_results.json", args.tiny)
    try:
        runs = json.loads(out.read_text(encoding="utf-8")).get("runs") or {}
    except (OSError, ValueError):
        runs = {}
    runs[args.model + (f", budget {args.budget:g} s" if args.budget else "")] = result
    out.write_text(json.dumps({"runs": runs}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
