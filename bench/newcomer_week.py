"""A newcomer's week through Telegram: a person's own notes as a folder install, their questions
of a week asked one at a time, and for each what they were shown.

    .venv/bin/python bench/newcomer_week.py --ollama-host http://127.0.0.1:11435 \\
        --model qwen2.5-coder:1.5b-instruct [--questions W01,W05]
    .venv/bin/python bench/newcomer_week.py --tiny   # seconds: five of the questions, the reader stand-in

The notes are ``tests/data/newcomer/notes`` (39 short notes of one person: home lab, runbooks,
cooking, travel, reading notes; Chinese mostly, some English, some code), copied into a temporary
folder and indexed by the daemon itself (``leanote-rag serve``'s ``Daemon`` with the Telegram bot,
in its own process, the config a newcomer writes: ``source.kind: files``, the default embedder,
no reranker weights, the memory's LLM tier off so that it does not compete for the model). The
questions are ``tests/data/newcomer/week.jsonl``: English, paraphrased, one a follow-up, one a
photo (a terminal screenshot drawn here, sent with a caption), one that no note answers. This
process plays Telegram (``tests/fakes/telegram.py``) and, with ``--tiny``, the model (the reader
stand-in of ``bench/answers_eval.py``).

For each question: the first words of what was shown, the notes cited (or, with a refusal, the
closest notes offered), what was shown (``answer``; ``passages``: the notes' passages under a
notice; ``refusal``), whether the note that answers it was cited (the refusal, for the question
with no answer), and when the person saw the placeholder, the sources, the first text and the
finished reply. Prints a Markdown table and writes ``bench/newcomer_week_results.json`` (one run
per model and commit, with the load average before and after).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))

from fakes.ollama import FakeOllama  # noqa: E402
from fakes.telegram import FakeTelegram  # noqa: E402

NEWCOMER = REPO / "tests" / "data" / "newcomer"
STAND_IN = "stand-in-reader"
PERSON = 7301
WAIT = 600.0  # seconds one reply may take before it counts as lost (the 1.5B on a busy box: minutes)
TINY = ("W01", "W03", "W04", "W05", "W13")  # --tiny: a question, a follow-up, the photo, the one no note answers
SETTLE = 1.0  # seconds to wait after a finished reply for its further parts (a reply over 4,096 characters)
CURSOR = " ▌"
STATUS = ("🔎", "🎙", "⏳")  # a photo's or a clip's status line, above the answer
SOURCES = ("来源", "Sources")
CLOSEST = ("最接近的笔记", "Closest notes")
NOTE_QUOTE = re.compile(r"<blockquote>(?:In your note: |笔记原文 ).*?</blockquote>", re.S)
PASSAGES = ("最相关的段落", "most relevant passages", "most relevant ones")


def questions(only: list[str] | None = None) -> list[dict]:
    rows = [json.loads(line) for line in (NEWCOMER / "week.jsonl").read_text(encoding="utf-8").splitlines() if line]
    if only:
        known = {q["id"] for q in rows}
        missing = [i for i in only if i not in known]
        if missing:
            raise SystemExit(f"not in week.jsonl: {', '.join(missing)}")
        rows = [q for q in rows if q["id"] in only]
    return rows


def config(folder: Path, notes: Path, host: str, model: str, base_url: str, edit_interval: float | None) -> Path:
    raw = {
        "source": {"kind": "files", "path": str(notes)},
        "state_dir": str(folder / "data"),
        "ollama": {"host": host, "model": model},
        "rerank": {"kind": "none"},
        "memory": {"llm": "off"},
        "sync": {"interval": "1h", "watch": False},
        "telegram": {"enabled": True, "token_env": "BENCH_TG", "base_url": base_url},
        "users": [{"leanote_user_id": "local", "telegram_ids": [PERSON], "admin": True}],
    }
    if edit_interval is not None:
        raw["telegram"]["edit_interval"] = edit_interval
    path = folder / "newcomer.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


def child(config_path: str, ready: str) -> None:
    """The daemon; ``ready`` is touched after its first pass (the notes indexed). Stopped when the
    parent closes our stdin."""
    import asyncio

    from bot.serve import Daemon
    from bot.telegram import service
    from rag.config import load

    async def first_pass(host) -> None:
        await host.wait_for_pass(0)
        Path(ready).touch()

    async def run() -> None:
        daemon = Daemon(load(config_path), services=[service, first_pass])
        asyncio.get_running_loop().add_reader(sys.stdin.fileno(), daemon.stop)
        await daemon.run()

    asyncio.run(run())


def plain(text: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", text)).split())


def read_reply(text: str) -> dict:
    """What a finished Telegram reply showed: its kind, first words and the notes it names."""
    head = None
    for label in SOURCES + CLOSEST:
        if f"<b>{label}</b>" in text:
            head = label
            break
    body, _, listed = text.partition(f"<b>{head}</b>") if head else (text, "", "")
    said = NOTE_QUOTE.sub("", body)  # the note's own words under an answer are not the answer's
    # a folder note is listed as "title — path/in/the/folder.md": the title is what is compared
    notes = [re.sub(r" — [^—]*\.\w+$", "", plain(m)) for m in re.findall(r"^\[\d+\]\s*(.+)$", listed, re.M)]
    words = plain(said)
    if head in CLOSEST:
        shown = "refusal"
    elif any(p in words for p in PASSAGES):
        shown = "passages"
    elif head in SOURCES:
        shown = "answer"
    else:
        shown = "other"
    return {"shown": shown, "first_words": words[:80], "notes": notes}


def is_right(expected: str | None, got: dict) -> bool:
    """The note that answers it cited (an answer, or its passages); with no such note, refused."""
    if not expected:
        return got["shown"] == "refusal"
    return got["shown"] in ("answer", "passages") and expected in got["notes"]


def finished(msg: dict) -> bool:
    text = msg["text"]
    return msg.get("parse_mode") == "HTML" and not text.startswith("📚") and not text.endswith(CURSOR) \
        and text.strip() not in ("…", "")


def ask(tg: FakeTelegram, q: dict) -> dict:
    """Send the question (with its screenshot, for a photo) and follow the reply to its end."""
    import media_files

    before = {id(m) for m in tg.sent_to(PERSON)}
    asked = time.monotonic()
    if q.get("photo"):
        tg.add_file(q["id"], media_files.text_png(q["photo"], size=28, width=1100))
        tg.send_photo(PERSON, q["id"], caption=q["question"])
    else:
        tg.say(PERSON, q["question"])
    msg, status, placeholder = None, None, None
    while time.monotonic() - asked < WAIT:
        new = [m for m in tg.sent_to(PERSON) if id(m) not in before]
        status = next((m for m in new if m["text"].startswith(STATUS)), status)
        replies = [m for m in new if not m["text"].startswith(STATUS)]
        if replies and msg is None:
            msg, placeholder = replies[0], time.monotonic() - asked
        if msg is not None and finished(msg):
            break
        time.sleep(0.02)
    row = {"id": q["id"], "day": q["day"], "kind": q["kind"], "question": q["question"], "expected": q["note"]}
    if status is not None:
        row["read_from_image"] = plain(status["text"])[:200]
    if msg is None or not finished(msg):
        return {**row, "lost": True, "shown": "lost", "first_words": "", "notes": []}
    # a reply too long for one message goes on in the next ones: wait a moment for them
    settle = time.monotonic() + SETTLE
    while time.monotonic() < settle:
        time.sleep(0.05)
    more = [m for m in tg.sent_to(PERSON) if id(m) not in before and m is not msg and not m["text"].startswith(STATUS)]
    edits = [(t - asked, text) for t, text in msg["edits"]]
    sources = next((t for t, text in edits if text.startswith("📚")), None)
    first_text = next((t for t, text in edits if text.endswith(CURSOR)), None)
    final = edits[-1][0] if edits else placeholder
    text = "\n".join([msg["text"], *(m["text"] for m in more)])
    got = read_reply(text)
    return {**row, **got, "lost": False, "right": is_right(q["note"], got), "placeholder_s": round(placeholder, 2),
            "sources_s": None if sources is None else round(sources, 2),
            "first_text_s": None if first_text is None else round(first_text, 2), "final_s": round(final, 2),
            "text": text}


def table(rows: list[dict]) -> str:
    """The run as a Markdown table: one line per question."""
    out = ["| # | question | first words shown | note cited (closest, for a refusal) | shown | right | final s |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        q = r["question"] + (" (photo)" if r["kind"] == "photo" else "") + (" (follow-up)" if r["kind"] == "follow_up"
                                                                             else "")
        words = r["first_words"].replace("|", "\\|")
        notes = "; ".join(r["notes"][:3]).replace("|", "\\|") or "—"
        right = "—" if r.get("lost") else ("yes" if r["right"] else "no")
        out.append(f"| {r['id']} | {q} | {words} | {notes} | {r['shown']} | {right} | {r.get('final_s', '—')} |")
    return "\n".join(out)


def tables(path: Path) -> int:
    """Each recorded run's table, its replies read again (``read_reply``)."""
    runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
    for name, run in runs.items():
        rows = [{**r, **read_reply(r["text"])} if r.get("text") else r for r in run["rows"]]
        rows = [{**r, "right": is_right(r["expected"], r)} if r.get("text") else r for r in rows]
        right = sum(bool(r.get("right")) for r in rows)
        print(f"## {name}: {run['date']}, load {run['load_before']} → {run['load_after']}, {right} of {len(rows)} "
              "right\n")
        print(table(rows) + "\n")
    return 0


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ""


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return done.stdout.strip() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ollama-host", metavar="URL", help="the real Ollama (or the real-llm server); required")
    ap.add_argument("--model", help="required")
    ap.add_argument("--questions", metavar="ID,ID", help="only these questions of week.jsonl")
    ap.add_argument("--tiny", action="store_true", help=f"a smoke run with the reader stand-in: {', '.join(TINY)}")
    ap.add_argument("--table", action="store_true", help="print the table of each recorded run (its replies read "
                    "again as this script reads them) and stop")
    args = ap.parse_args()
    if args.table:
        return tables(results_file("newcomer_week_results.json", False))
    if args.tiny:
        if args.ollama_host or args.model:
            ap.error("--tiny runs the reader stand-in, never a real model")
        args.model = STAND_IN
    elif not (args.ollama_host and args.model):
        ap.error("the following arguments are required: --ollama-host, --model (or --tiny)")
    week = questions(args.questions.split(",") if args.questions else list(TINY) if args.tiny else None)
    try:
        import rapidocr_onnxruntime  # noqa: F401
    except ImportError:
        print("the ocr extra is not installed: the photo question is left out", file=sys.stderr)
        week = [q for q in week if not q.get("photo")]

    rows, started_load, at = [], load(), commit()
    stand_in = FakeOllama(models=(STAND_IN,), speed=(20_000, 300), reader=True) if args.tiny else nullcontext()
    with tempfile.TemporaryDirectory() as tmp, FakeTelegram() as tg, stand_in as fake:
        notes = Path(tmp) / "notes"
        shutil.copytree(NEWCOMER / "notes", notes)
        host = fake.url if args.tiny else args.ollama_host
        path = config(Path(tmp), notes, host, args.model, tg.base_url, 0.1 if args.tiny else None)
        ready = Path(tmp) / "ready"
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(path), str(ready)], stdin=subprocess.PIPE,
                                env={**os.environ, "BENCH_TG": "123:TEST"})
        try:
            began = time.monotonic()
            while not (ready.exists() and tg.method_calls("getUpdates")):
                if proc.poll() is not None or time.monotonic() - began > 900:
                    print("the daemon did not index the notes and poll Telegram", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            indexed_s = round(time.monotonic() - began, 1)
            for q in week:
                row = ask(tg, q)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "text"}, ensure_ascii=False), file=sys.stderr)
        finally:
            proc.stdin.close()
            proc.wait(timeout=120)

    done = [r for r in rows if not r["lost"]]
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "commit": at, "cpu_count": os.cpu_count(),
              "model": args.model, "load_before": started_load, "load_after": load(), "start_to_ready_s": indexed_s,
              "asked": len(rows), "lost": len(rows) - len(done), "right": sum(r["right"] for r in done),
              "shown": {k: sum(r["shown"] == k for r in rows) for k in ("answer", "passages", "refusal", "other", "lost")},
              "rows": rows}
    out = results_file("newcomer_week_results.json", args.tiny)
    try:
        runs = json.loads(out.read_text(encoding="utf-8")).get("runs") or {}
    except (OSError, ValueError):
        runs = {}
    runs[f"{args.model} @ {result['commit']}"] = result
    out.write_text(json.dumps({"runs": runs}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(table(rows))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main())
