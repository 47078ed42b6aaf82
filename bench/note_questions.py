"""Written questions (``rag.index.asked``) on the dev set: what they cost to write, and what they
change in retrieval.

    .venv/bin/python bench/note_questions.py generate --host http://127.0.0.1:11436 \\
        --model qwen2.5-coder:0.5b-instruct --cache /tmp/q-0.5b.jsonl [--limit N] [--order dev|seeded]
    .venv/bin/python bench/note_questions.py sweep --cache /tmp/q-0.5b.jsonl --state /tmp/qbench
    .venv/bin/python bench/note_questions.py --tiny        # seconds: the sample notes, a stand-in model

``generate`` writes each searchable note's questions with the given Ollama model into a JSONL
cache (one line per note: the questions, what was dropped and why, tokens and seconds), the
notes in the order ``--order`` says: ``dev`` (the default) every dev question's gold notes first,
then the others in a seeded order, so that the notes written first are the dev slice plus a
random draw of the rest; ``seeded`` all in the seeded order. A note already in the cache with
the same content hash is skipped, so a run stopped goes on where it was.

``sweep`` indexes the slice of notes the cache covers (the gold notes and the other notes
written so far, both users) once, then evaluates the dev questions and their English versions
(tests/data/dev_en.jsonl) with the written questions off, and on at several settings
(questions per note, the weight of their ranking in the fusion), and writes
bench/note_questions_results.json (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BACKUP_NAME, REPO, results_file, shared  # noqa: E402

from rag import config  # noqa: E402
from rag.eval import load_questions  # noqa: E402
from rag.index import asked  # noqa: E402
from rag.index.note_index import NoteIndex  # noqa: E402
from rag.model import Note  # noqa: E402
from sync.sources import open_source  # noqa: E402

DEV_EN = REPO / "tests" / "data" / "dev_en.jsonl"
SEED = 43


def dev_set() -> Path:
    return shared() / "eval" / "dev.jsonl"


def gold_notes() -> list[str]:
    qs = [q for q in load_questions(dev_set()) + load_questions(DEV_EN) if not q.get("after_changes")]
    return list(dict.fromkeys(n for q in qs for n in q.get("gold_note_ids") or []))


def settings_for(state: Path, **extra) -> config.Settings:
    raw = {
        "source": {"kind": "mongodump", "path": str(shared() / "corpus" / "mongodump" / BACKUP_NAME)},
        "state_dir": str(state),
        "rerank": {"kind": "none"},
        "memory": {"enabled": False},
        **extra,
    }
    return config.from_dict(raw, base_dir=REPO)


def ordered(notes: list[Note], order: str) -> list[Note]:
    searchable = [n for n in notes if n.searchable]
    rest = list(searchable)
    random.Random(SEED).shuffle(rest)
    if order == "seeded":
        return rest
    gold = set(gold_notes())
    return [n for n in searchable if n.id in gold] + [n for n in rest if n.id not in gold]


def read_cache(path: Path) -> dict[str, dict]:
    rows = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["note_id"]] = row
    return rows


def cmd_generate(args) -> None:
    from rag.config import OllamaConfig
    from rag.llm import OllamaChat

    cache = Path(args.cache)
    done = read_cache(cache)
    settings = settings_for(Path(args.state))
    notes = [item for item in open_source(settings).notes() if isinstance(item, Note)]
    chat = OllamaChat(OllamaConfig(host=args.host, model=args.model, timeout=args.timeout, num_ctx=4096))

    def stream(messages, usage, options, format=None, timeout=None):
        return chat.stream(messages, usage=usage, options=options, format=format, timeout=timeout)

    from rag.index.chunk import chunk_text
    from rag.index.clean import clean

    todo = [n for n in ordered(notes, args.order) if done.get(n.id, {}).get("content_hash") != n.content_hash()]
    if args.only:
        wanted = set(args.only.split(","))
        todo = [n for n in todo if n.id in wanted]
    todo = todo[: args.limit] if args.limit else todo
    print(f"{len(done)} in the cache, {len(todo)} to write", flush=True)
    with cache.open("a", encoding="utf-8") as out:
        for i, note in enumerate(todo, 1):
            chunks = chunk_text(clean(note.content, note.is_markdown), settings.chunking)
            started = time.perf_counter()
            try:
                written = asyncio.run(asked.write(stream, note.title, chunks, timeout=args.timeout))
                error = None
            except Exception as err:  # a timeout: counted, the note written next run
                written, error = asked.Written(), f"{type(err).__name__}: {err}"
            row = {"note_id": note.id, "user_id": note.user_id, "title": note.title,
                   "content_hash": note.content_hash(), "model": args.model, **written.stats(),
                   "questions_text": written.questions, "wall_s": round(time.perf_counter() - started, 2),
                   "error": error}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            out.flush()
            print(f"[{i}/{len(todo)}] {row['wall_s']:6.1f}s out={written.output_tokens:4d} "
                  f"q={len(written.questions)} drop={written.dropped} {note.title[:30]}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    g = sub.add_parser("generate")
    g.add_argument("--host", default="http://127.0.0.1:11436")
    g.add_argument("--model", default="qwen2.5-coder:0.5b-instruct")
    g.add_argument("--cache", required=True)
    g.add_argument("--state", default="/tmp/lr-q-state")
    g.add_argument("--order", choices=("dev", "seeded"), default="dev")
    g.add_argument("--limit", type=int, default=0)
    g.add_argument("--only", default="")
    g.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    if args.cmd == "generate":
        cmd_generate(args)
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
