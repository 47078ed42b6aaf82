"""What the memory's LLM tier (rag.memory.extract) costs over the shared corpus, against the fake Ollama.

    .venv/bin/python bench/memory_llm.py                # needs ../shared
    .venv/bin/python bench/memory_llm.py --mangle-every 0 --out -
    .venv/bin/python bench/memory_llm.py --tiny         # seconds, on the sample notes (a smoke run)

Every note of the corpus that would be indexed (not trashed or deleted) is prepared as the
indexer prepares it (cleaned and chunked, ``text_of`` its chunks: the text an LLM job gets)
and extracted with ``rag.memory.extract.extract`` through the real client (``AnswerService._stream``,
``OllamaChat``) against tests/fakes/ollama.py, a real HTTP server speaking /api/chat. The fake
is given a stand-in extractor for requests with a ``format`` (``Extractor``): from the section
it is sent it replies with schema-valid JSON, a one-line summary, the no-LLM tier's entities of
the section and up to ``RELATIONS`` relations whose quotes are sentences copied from the section
(whitespace collapsed, as a model writes them); every ``--mangle-every``-th quote has its
Chinese punctuation turned into ASCII and one character dropped, a mistake small models make,
so the quote check has something to catch. Per note:

- calls (1 for a note under ``SECTION_CHARS``; one per section, at most ``MAX_CALLS``);
- prompt tokens: the project's estimate (``rag.speed.Speed().tokens``, calibration 1.0: the
  uncalibrated script-based estimate) of the messages the fake actually received, joined
  as ``AnswerService`` joins them for its speed book; the fake's own count is kept beside it;
- output tokens: the same estimate of the JSON the fake replied. A real model's reply may be
  longer or shorter; this is the size of a reply with the stand-in's contents;
- relations dropped by the quote check: split into verbatim quotes dropped (false drops)
  and mangled quotes dropped (caught).

Then the projected time for ``--notes`` notes (default 500) at given speeds:
sum(prompt tokens) / read + sum(output tokens) / write, scaled from the corpus's notes.
Prints a table and writes bench/memory_llm_results.json.
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
from statistics import mean, median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file, shared, tiny_world  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))

from fakes.ollama import FakeOllama, Reply, _content, _pieces  # noqa: E402

from rag import config  # noqa: E402
from rag.memory import entities as entities_mod  # noqa: E402
from rag.memory import extract as extract_mod  # noqa: E402
from rag.answer.service import AnswerService  # noqa: E402
from rag.memory.entities import text_of  # noqa: E402
from rag.index.note_index import NoteIndex  # noqa: E402
from rag.llm import OllamaChat  # noqa: E402
from rag.model import Note  # noqa: E402
from rag.speed import Speed  # noqa: E402

ESTIMATE = Speed()  # the project's token estimate, uncalibrated (calibration 1.0)
RELATIONS = 6  # relations per reply (a section)
ENTITIES = 12  # entities per reply
SUMMARY_CHARS = 60
# (name, read tok/s, write tok/s): the docs' slow CPU figure (docs/answers.md) and a GPU
SPEEDS = [("qwen2.5:7b on a 4-core CPU", 60.0, 6.0), ("a GPU", 1500.0, 60.0)]
_SENTENCES = re.compile(r"(?<=[。！？；!?])|(?<=[.;])\s+|\n+")
_HEAD = re.compile(r"^(Title: [^\n]*\n)?(\(part \d+ of \d+\)\n)?\n", re.S)
_ASCII = str.maketrans({"，": ",", "。": ".", "：": ":", "；": ";", "（": "(", "）": ")", "！": "!", "？": "?"})
_TYPES = {"code": "tool", "tag": "concept", "heading": "concept", "link": "other", "term": "concept"}


def _tokens(text: str) -> int:
    return ESTIMATE.tokens(text) if text else 0


def pct(values: list[float], p: float) -> float:
    """The p-th percentile, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


class Extractor:
    """The stand-in LLM for extraction requests: schema-valid JSON made of the section it is
    sent (module docstring); it remembers what it replied, for the bench to count."""

    def __init__(self, mangle_every: int):
        self.mangle_every = mangle_every
        self.relations = 0  # relations replied, over the run
        self.mangled = 0  # of them, quotes altered on purpose
        self.replies: list[tuple[str, set[str]]] = []  # (the JSON, the quotes in it mangled on purpose)

    def mangle(self, quote: str) -> str:
        changed = quote.translate(_ASCII)
        if changed == quote:  # no CJK punctuation: drop a character from the middle instead
            changed = quote[: len(quote) // 2] + quote[len(quote) // 2 + 1:]
        return changed

    def reply(self, messages: list[dict]) -> str:
        user = _content(messages, "user", last=True)
        title = user[len("Title: "):].split("\n", 1)[0] if user.startswith("Title: ") else ""
        section = _HEAD.sub("", user, count=1)
        found = entities_mod.extract(section, title=title).entities
        names, seen = [], set()
        for e in found:
            if e.norm not in seen and len(e.name) <= 40:
                seen.add(e.norm)
                names.append((e.name, _TYPES.get(e.kind, "other")))
            if len(names) == ENTITIES:
                break
        sentences = [" ".join(s.split()) for s in _SENTENCES.split(section)]
        sentences = [s for s in sentences if 8 <= len(s) <= 120 and not s.startswith(("#", "|", "```"))]
        relations, mangled = [], set()
        for s in sentences:
            inside = [n for n, _ in names if n in s]
            if not inside:
                continue
            self.relations += 1
            quote = s
            if self.mangle_every and self.relations % self.mangle_every == 0:
                quote = self.mangle(s)
                self.mangled += 1
                mangled.add(quote)
            obj = next((n for n in inside[1:]), s[:20])
            relations.append({"subject": inside[0], "predicate": "提到" if re.search(r"[\u4e00-\u9fff]", s) else "mentions",
                              "object": obj, "quote": quote})
            if len(relations) == RELATIONS:
                break
        first = sentences[0] if sentences else (title or section.strip()[:SUMMARY_CHARS])
        text = json.dumps({"summary": f"{title}：{first}"[:SUMMARY_CHARS] if title else first[:SUMMARY_CHARS],
                           "entities": [{"name": n, "type": t} for n, t in names],
                           "relations": relations}, ensure_ascii=False)
        self.replies.append((text, mangled))
        return text


class ExtractingOllama(FakeOllama):
    """The fake Ollama, with the stand-in extractor answering requests that carry a schema."""

    def __init__(self, extractor: Extractor):
        super().__init__()
        self.extractor = extractor

    def unscripted(self, body: dict) -> Reply:
        if isinstance(body.get("format"), dict):
            return Reply(_pieces(self.extractor.reply(body.get("messages") or [])))
        return super().unscripted(body)


def corpus_notes(settings) -> list:
    """The corpus's notes as the indexer prepares them (trashed and deleted ones left out)."""
    index = NoteIndex(settings, store=None, embedder=type("E", (), {"model_id": "bench", "dim": 3})(), index_id="bench")
    prepared = []
    with open(shared() / "corpus" / "notes.jsonl", encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            if d.get("IsTrash") or d.get("IsDeleted"):
                continue
            note = Note(d["NoteId"], d["UserId"], d.get("Title") or "", d.get("Content") or "",
                        is_markdown=bool(d.get("IsMarkdown", True)))
            p = index.prepare(note)
            if p.chunks:
                prepared.append(p)
    return prepared


async def run_all(fake: ExtractingOllama, settings, notes: list) -> list[dict]:
    answers = AnswerService(settings, index=None, chat=OllamaChat(settings.ollama))
    rows = []
    try:
        for p in notes:
            text = text_of([pc.chunk for pc in p.chunks])
            first = len(fake.structured_chats())
            replies = len(fake.extractor.replies)
            mangled = fake.extractor.mangled
            result = await extract_mod.extract(answers._stream, text, p.note.title, timeout=settings.ollama.timeout)
            bodies = fake.structured_chats()[first:]
            sent = ["\n".join(m.get("content", "") for m in b.get("messages", [])) for b in bodies]
            out = fake.extractor.replies[replies:]
            verbatim_dropped = mangled_dropped = 0
            for reply, bad in out:  # which relations the quote check dropped, and were they mangled?
                for rel in json.loads(reply)["relations"]:
                    if extract_mod.find_quote(rel["quote"], text) is None:
                        if rel["quote"] in bad:
                            mangled_dropped += 1
                        else:
                            verbatim_dropped += 1
            rows.append({
                "note_id": p.note.id, "chars": len(text), "calls": result.calls,
                "prompt_tokens": sum(_tokens(s) for s in sent),
                "output_tokens": sum(_tokens(r) for r, _ in out),
                "call_prompt_tokens": [_tokens(x) for x in sent], "call_output_tokens": [_tokens(r) for r, _ in out],
                "prompt_tokens_fake": result.prompt_tokens, "output_tokens_fake": result.output_tokens,
                "relations_kept": len(result.relations), "dropped": result.dropped,
                "mangled": fake.extractor.mangled - mangled, "mangled_dropped": mangled_dropped,
                "verbatim_dropped": verbatim_dropped, "entities": len(result.entities),
                "skipped_chars": result.skipped_chars,
            })
    finally:
        answers.close()
    return rows


def dist(values: list[float]) -> dict:
    return {"p50": round(median(values), 1), "p95": round(pct(values, 95), 1), "mean": round(mean(values), 1),
            "max": max(values), "total": sum(values)}


def hms(seconds: float) -> str:
    h, rest = divmod(int(round(seconds)), 3600)
    return f"{h} h {rest // 60:02d} min" if h else f"{rest // 60} min {rest % 60:02d} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mangle-every", type=int, default=10,
                    help="alter every N-th quote the stand-in writes (0: none), for the quote check to catch")
    ap.add_argument("--notes", type=int, default=500, help="project the time for this many notes")
    ap.add_argument("--speed", action="append", default=[], metavar="NAME:READ:WRITE",
                    help="another speed to project at (tokens per second), e.g. 'mine:300:20'")
    ap.add_argument("--limit", type=int, default=0, help="only the first N notes (0: all)")
    ap.add_argument("--out", help="where to write the JSON (default bench/memory_llm_results.json; '-': nowhere)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run on the sample notes")
    args = ap.parse_args()
    if args.tiny:
        tiny_world()
    args.out = args.out or str(results_file("memory_llm_results.json", args.tiny))
    if not (shared() / "corpus" / "notes.jsonl").exists():
        sys.exit(f"needs the shared corpus at {shared() / 'corpus'} (set LEANOTE_RAG_SHARED), or --tiny")
    speeds = list(SPEEDS)
    for s in args.speed:
        name, read, write = s.rsplit(":", 2)
        speeds.append((name, float(read), float(write)))

    extractor = Extractor(args.mangle_every)
    work = Path(tempfile.mkdtemp(prefix="leanote-rag-memllm-"))
    with ExtractingOllama(extractor) as fake:
        settings = config.from_dict({"source": {"kind": "files", "path": str(work)},  # chunking as bench/corpus.yaml: default
                                     "ollama": {"host": fake.url, "timeout": 60}, "memory": {"llm": "on"},
                                     "state_dir": str(work / "data")}, base_dir=work)
        notes = corpus_notes(settings)
        if args.limit:
            notes = notes[: args.limit]
        t = time.perf_counter()
        rows = asyncio.run(run_all(fake, settings, notes))
        wall = time.perf_counter() - t
    shutil.rmtree(work, ignore_errors=True)

    n = len(rows)
    prompt = [r["prompt_tokens"] for r in rows]
    output = [r["output_tokens"] for r in rows]
    calls = [r["calls"] for r in rows]
    dropped = sum(r["dropped"] for r in rows)
    mangled = sum(r["mangled"] for r in rows)
    scale = args.notes / n
    projection = []
    for name, read, write in speeds:
        read_s, write_s = sum(prompt) / read * scale, sum(output) / write * scale
        projection.append({"name": name, "read_tps": read, "write_tps": write,
                           "reading_s": round(read_s), "writing_s": round(write_s),
                           "total_s": round(read_s + write_s), "total": hms(read_s + write_s),
                           "per_note_s": round((read_s + write_s) / args.notes, 1)})
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "notes": n,
        "limits": {"SECTION_CHARS": extract_mod.SECTION_CHARS, "MAX_CALLS": extract_mod.MAX_CALLS,
                   "OUTPUT_TOKENS": extract_mod.OUTPUT_TOKENS},
        "token_estimate": "rag.speed.Speed().tokens (0.7 per CJK character, 0.28 per other; calibration 1.0) "
                          "of the messages received by the fake (joined with newlines) and of its JSON replies",
        "stand_in": {"relations_per_reply": RELATIONS, "entities_per_reply": ENTITIES,
                     "mangle_every": args.mangle_every},
        "calls": {**dist(calls), "notes_over_1_call": sum(c > 1 for c in calls),
                  "notes_at_cap": sum(c == extract_mod.MAX_CALLS for c in calls),
                  "notes_with_skipped_text": sum(r["skipped_chars"] > 0 for r in rows),
                  "skipped_chars": sum(r["skipped_chars"] for r in rows),
                  "histogram": {str(c): calls.count(c) for c in sorted(set(calls))}},
        "prompt_tokens": dist(prompt),
        "output_tokens": dist(output),
        "prompt_tokens_per_call": dist([t for r in rows for t in r["call_prompt_tokens"]]),
        "output_tokens_per_call": dist([t for r in rows for t in r["call_output_tokens"]]),
        "system_prompt_tokens": _tokens(extract_mod.SYSTEM),
        "fake_own_count": {"prompt_total": sum(r["prompt_tokens_fake"] for r in rows),
                           "output_total": sum(r["output_tokens_fake"] for r in rows)},
        "quote_check": {"relations_replied": extractor.relations, "kept": sum(r["relations_kept"] for r in rows),
                        "dropped": dropped, "mangled_on_purpose": mangled,
                        "mangled_dropped": sum(r["mangled_dropped"] for r in rows),
                        "verbatim_dropped": sum(r["verbatim_dropped"] for r in rows),
                        "notes_with_a_drop": sum(r["dropped"] > 0 for r in rows)},
        "harness_wall_s": round(wall, 1),
        "projection": {"notes": args.notes, "formula": "sum(prompt_tokens)/read + sum(output_tokens)/write, "
                       f"times {args.notes}/{n}", "speeds": projection},
        "per_note": rows,
    }
    print(table(results))
    if args.out != "-":
        Path(args.out).write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")


def table(r: dict) -> str:
    lines = [f"{r['notes']} notes; harness {r['harness_wall_s']} s against the fake (no model time)",
             "", "| per note | p50 | p95 | mean | max | total |", "|---|---|---|---|---|---|"]
    for key in ("calls", "prompt_tokens", "output_tokens", "prompt_tokens_per_call", "output_tokens_per_call"):
        d = r[key]
        lines.append(f"| {key} | {d['p50']} | {d['p95']} | {d['mean']} | {d['max']} | {d['total']} |")
    lines.append(f"(the system prompt is {r['system_prompt_tokens']} of each call's prompt tokens)")
    c, q = r["calls"], r["quote_check"]
    lines += ["", f"notes needing >1 call: {c['notes_over_1_call']} (at the cap of {r['limits']['MAX_CALLS']}: "
              f"{c['notes_at_cap']}; text past the cap in {c['notes_with_skipped_text']} notes, "
              f"{c['skipped_chars']} chars); calls: {c['histogram']}",
              f"quote check: {q['relations_replied']} relations replied, {q['kept']} kept, {q['dropped']} dropped "
              f"(of {q['mangled_on_purpose']} quotes mangled on purpose {q['mangled_dropped']} dropped; "
              f"verbatim quotes dropped: {q['verbatim_dropped']})",
              "", f"| projected for {r['projection']['notes']} notes | read tok/s | write tok/s | reading | writing "
              "| total | per note |", "|---|---|---|---|---|---|---|"]
    for p in r["projection"]["speeds"]:
        lines.append(f"| {p['name']} | {p['read_tps']:g} | {p['write_tps']:g} | {hms(p['reading_s'])} | "
                     f"{hms(p['writing_s'])} | **{p['total']}** | {p['per_note_s']} s |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
