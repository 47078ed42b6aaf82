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

``--scope title`` writes them from the title alone (the note scope's call reading nothing else).
``--scope sections`` writes them per heading section (``rag.index.asked_sections``; the cache
keeps each question's section as the chunks it points to); ``per-call`` measures one call per
section against the note's one call.

``sweep`` indexes the slice of notes the cache covers (the gold notes and the other notes
written so far, both users; ``--slice``: a fixed list of notes instead) once, then evaluates the dev questions and their English versions
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
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BACKUP_NAME, REPO, results_file, shared, tiny_world  # noqa: E402

from rag import config  # noqa: E402
from rag.eval import load_questions  # noqa: E402
from rag.index import asked, asked_scopes, asked_sections  # noqa: E402
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

    order = ordered(notes, args.order)
    if args.first:  # these next after the gold notes (e.g. the notes dev questions find besides their gold ones)
        first = json.loads(Path(args.first).read_text())
        at = {n: i for i, n in enumerate(first)}
        gold = set(gold_notes()) if args.order == "dev" else set()
        order = ([n for n in order if n.id in gold] + sorted([n for n in order if n.id in at and n.id not in gold],
                                                             key=lambda n: at[n.id])
                 + [n for n in order if n.id not in at and n.id not in gold])
    if args.stride > 1:  # two runs sharing the work: this one's share first, then what is left
        order = [n for i, n in enumerate(order) if i % args.stride == args.offset] + \
                [n for i, n in enumerate(order) if i % args.stride != args.offset]
    todo = [n for n in order if done.get(n.id, {}).get("content_hash") != n.content_hash()]
    if args.only:
        wanted = set(args.only.split(","))
        todo = [n for n in todo if n.id in wanted]
    todo = todo[: args.limit] if args.limit else todo
    print(f"{len(done)} in the cache, {len(todo)} to write", flush=True)
    with cache.open("a", encoding="utf-8") as out:
        for i, note in enumerate(todo, 1):
            if args.others and any(r.get("content_hash") == note.content_hash()
                                   for r in [read_cache(Path(o)).get(note.id, {}) for o in args.others.split(",")]):
                continue  # written by another run (two models sharing the work)
            chunks = chunk_text(clean(note.content, note.is_markdown), settings.chunking)
            started = time.perf_counter()
            payload = asked_scopes.job(args.scope, note.title, chunks)
            extra = {"scope": args.scope}
            if args.scope == "sections":
                extra.update(sections=len(payload["sections"]), chunks=len(chunks), digest_chars=len(payload["digest"]))
            try:
                written = asyncio.run(asked_scopes.write(stream, payload, timeout=args.timeout))
                error = None
            except Exception as err:  # a timeout: counted, the note written next run
                written, error = asked.Written(), f"{type(err).__name__}: {err}"
            row = {"note_id": note.id, "user_id": note.user_id, "title": note.title,
                   "content_hash": note.content_hash(), "model": args.model, **written.stats(),
                   "questions_text": written.questions, **extra, "ties": written.ties,
                   "wall_s": round(time.perf_counter() - started, 2),
                   "error": error}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            out.flush()
            print(f"[{i}/{len(todo)}] {row['wall_s']:6.1f}s out={written.output_tokens:4d} "
                  f"q={len(written.questions)} drop={written.dropped} {note.title[:30]}", flush=True)


def cmd_per_call(args) -> None:
    """What one call per section would cost against the one call per note of ``--scope sections``:
    the first ``--limit`` notes of the cache written in that scope, each of their shown sections
    asked alone (its own prompt, the same instructions), the server's seconds and tokens summed."""
    from dataclasses import replace

    from rag.config import OllamaConfig
    from rag.index.chunk import chunk_text
    from rag.index.clean import clean
    from rag.llm import OllamaChat

    cache = read_cache(Path(args.cache))
    settings = settings_for(Path(args.state))
    notes = {n.id: n for n in open_source(settings).notes() if isinstance(n, Note)}
    chat = OllamaChat(OllamaConfig(host=args.host, model=args.model, timeout=args.timeout, num_ctx=4096))

    def stream(messages, usage, options, format=None, timeout=None):
        return chat.stream(messages, usage=usage, options=options, format=format, timeout=timeout)

    rows = [r for r in cache.values() if r.get("scope") == "sections" and not r.get("error") and r["note_id"] in notes]
    out = []
    for row in rows[: args.limit]:
        note = notes[row["note_id"]]
        shown = asked_sections.sections(note.title, chunk_text(clean(note.content, note.is_markdown), settings.chunking))
        each = []
        for s in shown:
            alone = replace(s, number=1)
            w = asyncio.run(asked_sections.write(stream, asked_sections.digest(note.title, [alone]), note.title,
                                                 [list(s.chunks)], timeout=args.timeout))
            each.append(w.stats())
        one = {k: row[k] for k in ("prompt_tokens", "output_tokens", "server_seconds", "questions")}
        per = {k: round(sum(e[k] for e in each), 2) for k in ("prompt_tokens", "output_tokens", "server_seconds",
                                                               "questions")}
        out.append({"note_id": note.id, "title": note.title, "sections": len(shown), "one_call": one,
                    "per_section_calls": per})
        print(json.dumps(out[-1], ensure_ascii=False), flush=True)
        Path(args.out).write_text(json.dumps({"model": args.model, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                       time.gmtime()), "notes": out},
                                             indent=1, ensure_ascii=False))  # after each note: a stopped run keeps them


def slice_ids(cache: dict[str, dict], notes: list[Note], limit: int = 0) -> set[str]:
    """The notes a sweep indexes: the gold notes and the notes the cache has, the first
    ``limit`` of them in the generation's order (0: all)."""
    order = [n.id for n in ordered(notes, "dev") if n.id in cache]
    return set(order[:limit] if limit else order) | set(gold_notes())


def recheck_sections(title: str, chunks, qs: list[str], english_n: int, ties: list[list[int]]) -> asked.Written:
    """A cached sections generation checked again with this checkout's checks (its reply
    rebuilt from the questions and their sections)."""
    shown = asked_sections.sections(title, chunks)
    number = {tuple(s.chunks): s.number for s in shown}
    entries: dict[int, dict] = {}
    for i, (q, tie) in enumerate(zip(qs, ties)):
        n = number.get(tuple(tie), 0)
        entries.setdefault(n, {"section": n, "questions": [], "english": []})[
            "english" if i >= len(qs) - english_n else "questions"].append(q)
    return asked_sections.check(json.dumps({"sections": list(entries.values())}, ensure_ascii=False),
                                asked_sections.digest(title, shown), title, [list(s.chunks) for s in shown])


def firsts(pairs: list, per: int) -> list:
    """The first ``per`` of each section's questions ((question, ties) pairs; the note scope's, with
    no ties: the note's first ``per``)."""
    out, counted = [], Counter()
    for q, tie in pairs:
        counted[tuple(tie)] += 1
        if counted[tuple(tie)] <= per:
            out.append((q, tie))
    return out


def _grouped(report) -> dict:
    out = {"hit@5": round(report.hit5, 3), "mrr@10": round(report.mrr10, 3), "p50_ms": report.p50_ms}
    for kind in sorted({o.type for o in report.outcomes if o.recall5 is not None}):
        group = [o for o in report.outcomes if o.type == kind and o.recall5 is not None]
        hits = [o for o in group if o.hit5 is not None]
        out[kind] = {"n": len(group), "hit@5": round(sum(bool(o.hit5) for o in hits) / max(1, len(hits)), 3),
                     "mrr@10": round(sum(o.rr10 for o in group) / len(group), 3)}
    return out


def cmd_sweep(args) -> None:
    import os
    import shutil

    from rag.eval import evaluate
    from rag.index.points import asked_user
    from rag.index.retrieve import search
    from sync.indexer import Indexer
    from sync.state import State

    cache: dict[str, dict] = {}
    for one in reversed(args.cache.split(",")):  # the first named wins
        cache.update({n: r for n, r in read_cache(Path(one)).items() if not r.get("error")})
    state_dir = Path(args.state)
    settings = settings_for(state_dir)
    notes = [item for item in open_source(settings).notes() if isinstance(item, Note)]
    keep = slice_ids(cache, notes, args.limit)
    if args.slice:  # a fixed slice (the notes of an earlier sweep), whatever the cache covers of it
        keep = set(json.loads(Path(args.slice).read_text())) | set(gold_notes())
    if args.whole:  # every note searched; the written questions still only those of the slice
        keep = {n.id for n in notes}
    kept = [n for n in notes if n.id in keep and n.searchable]
    if (args.fresh or args.copy) and state_dir.exists():
        shutil.rmtree(state_dir)
    if args.copy:  # an index of the whole corpus: copied, the notes outside the slice taken out
        shutil.copytree(args.copy, state_dir, ignore=shutil.ignore_patterns("*.lock"))
    dev = load_questions(dev_set())
    english = load_questions(DEV_EN)
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg_start": os.getloadavg(),
               "cache": args.cache, "models": dict(Counter(r["model"] for r in cache.values())),
               "notes": len(kept), "gold_notes": len(set(gold_notes())),
               "written": sum(1 for n in kept if cache.get(n.id, {}).get("questions")), "variants": {}}
    state = State(settings.state_dir)
    try:
        with NoteIndex.open(settings, create=True) as index:
            if args.copy and not args.whole:
                for note_id in sorted(index.store.note_ids() - keep):
                    index.delete_note(note_id)
            else:
                Indexer(index, state, open_source(settings).name).run(kept)
            chunks = sum(index.store.count_by_user().values())
            results["chunks"] = chunks

            from rag.index.chunk import chunk_text
            from rag.index.clean import clean

            # each cached generation checked again with this checkout's checks (a cache written
            # before a check was added keeps nothing it would drop now)
            # note id -> (own, english): each a list of (question, ties: its section's chunks, [] the note's)
            checked: dict[str, tuple[list, list]] = {}
            rechecked = Counter()
            for n in kept:
                row = cache.get(n.id)
                if not row or row["content_hash"] != n.content_hash() or not row.get("questions_text"):
                    continue
                qs, english_n = row["questions_text"], row.get("english", 0)
                chunks = chunk_text(clean(n.content, n.is_markdown), settings.chunking)
                if row.get("scope") == "sections":
                    w = recheck_sections(n.title, chunks, qs, english_n, row["ties"])
                else:
                    title_only = row.get("scope") == "title"
                    digest_text = asked_scopes.job("title" if title_only else "note", n.title, chunks)["digest"]
                    w = asked.check(json.dumps({"questions": qs[: len(qs) - english_n],
                                                "english": qs[len(qs) - english_n:]}, ensure_ascii=False),
                                    digest_text, n.title, system=asked.TITLE_SYSTEM if title_only else asked.SYSTEM)
                rechecked.update(w.dropped)
                ties = w.ties if w.ties and not args.untied else [[] for _ in w.questions]
                pairs = list(zip(w.questions, ties))
                checked[n.id] = (pairs[: len(pairs) - w.english], pairs[len(pairs) - w.english:])
            results["rechecked_dropped"] = dict(rechecked)
            results["notes_with_questions"] = sum(1 for own, eng in checked.values() if own or eng)

            def put(per_language: int | None) -> int:
                total = 0
                for n in kept:
                    own, eng = checked.get(n.id, ([], []))
                    if per_language is not None:  # per section (a section's questions share their ties)
                        own, eng = firsts(own, per_language), firsts(eng, per_language)
                    total += asked.index_questions(index, n.id, n.user_id, n.content_hash(), [q for q, _ in own + eng],
                                                   [t for _, t in own + eng])
                return total

            rankings = asked.rankings

            def sided(side: str):
                def only(*a, **kw):
                    return {k: v for k, v in rankings(*a, **kw).items() if side == "both" or k == f"asked_{side}"}
                return only

            def run(label: str, weight: float) -> dict:
                cfg = index.settings.retrieval.model_copy(update={"questions_weight": weight})
                view = NoteIndex(index.settings.model_copy(update={"retrieval": cfg}), index.store, index.embedder,
                                 index.index_id)

                def searcher(question, user_id, k, retriever):
                    return search(view, question, user_id, k, retriever=retriever)

                row = {}
                for name, qs in (("dev", dev), ("english", english)):
                    reports, _ = evaluate(searcher, qs, retrievers=("hybrid",))
                    row[name] = _grouped(reports[0])
                    row[name]["hits"] = sorted(o.id for o in reports[0].outcomes if o.hit5)
                print(label, json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "hits"} for k, v in row.items()},
                                        ensure_ascii=False), flush=True)
                return row

            size = sum(f.stat().st_size for f in (state_dir / "qdrant").rglob("*") if f.is_file())
            results["index_bytes_off"] = size
            results["variants"]["off"] = run("off", 0.0)
            for per in [int(x) if x != "all" else None for x in args.per.split(",")]:
                n_points = put(per)
                size = sum(f.stat().st_size for f in (state_dir / "qdrant").rglob("*") if f.is_file())
                for side in args.sides.split(","):
                    asked.rankings = sided(side)  # the search's ranking, one side or both
                    for w in [float(x) for x in args.weights.split(",")]:
                        label = f"per={per or 'all'} weight={w}" + ("" if side == "both" else f" {side} only")
                        row = run(label, w)
                        row["question_points"] = n_points
                        row["index_bytes"] = size
                        results["variants"][label] = row
                asked.rankings = rankings
            counts = index.store.count_by_user()
            results["question_points_users"] = {u: index.store.note_ids(asked_user(u)).__len__() for u in counts}
    finally:
        state.close()
    base = results["variants"]["off"]
    for label, row in results["variants"].items():
        for name in ("dev", "english"):
            row[name]["lost"] = sorted(set(base[name]["hits"]) - set(row[name]["hits"]))
            row[name]["gained"] = sorted(set(row[name]["hits"]) - set(base[name]["hits"]))
    results["load_avg_end"] = os.getloadavg()
    out = Path(args.out) if args.out else results_file("note_questions_results.json", False)
    out.write_text(json.dumps(results, indent=1, ensure_ascii=False))
    print("written", out)


ANSWER_PROMPT = [{"role": "system", "content": "Answer in one short sentence."},
                 {"role": "user", "content": "线程池的核心线程数和最大线程数有什么区别？"}]


def cmd_preempt(args) -> None:
    """An answer's first token, alone and while the memory's worker writes a note's questions
    (the real worker, the real LLM): the worker gives way the moment the answer wants the LLM;
    what the answer waits longer is the server's stop (one prompt chunk or one token)."""
    import tempfile
    from statistics import median

    from rag.answer.service import AnswerService
    from rag.index.chunk import chunk_text
    from rag.index.clean import clean
    from rag.llm import OllamaChat
    from rag.memory.store import MemoryStore
    from sync.memory_jobs import MemoryJobs

    tmp = Path(tempfile.mkdtemp(prefix="lr-preempt-"))
    settings = settings_for(tmp, ollama={"host": args.host, "model": args.model, "timeout": 600},
                            answer={"first_token_budget": 300},
                            memory={"enabled": True, "llm": "off", "questions": "on", "questions_scope": "note"})
    notes = [n for n in open_source(settings).notes() if isinstance(n, Note) and n.searchable]
    store = MemoryStore(tmp / "memory.sqlite")
    chat = OllamaChat(settings.ollama)
    answers = AnswerService(settings, index=None, chat=chat)
    jobs = MemoryJobs(settings, lambda: store, answers, poll=0.05, quiet=0.0)
    writing = asyncio.Event()  # the questions' call has written its first token (``--phase writing``)
    stream = answers._stream

    async def watched(*a, **kw):
        async for piece in stream(*a, **kw):
            writing.set()
            yield piece

    answers._stream = watched  # the worker's calls go through it

    async def first_token() -> tuple[float, float]:
        """(seconds to the answer's first token from when it wanted the LLM, seconds per written token)."""
        from rag.speed import Usage
        usage = Usage()
        async with answers.llm_slot():
            t = time.perf_counter()
            first = None
            async for _ in chat.stream(ANSWER_PROMPT, usage=usage, options={"num_predict": 24, "temperature": 0}):
                first = first or time.perf_counter() - t
        return first, (usage.output_seconds / usage.output_tokens if usage.output_tokens else 0.0)

    async def scenario() -> dict:
        rows = []
        for trial, note in enumerate(notes[: args.trials]):
            chunks = chunk_text(clean(note.content, note.is_markdown), settings.chunking)
            payload = json.dumps({"digest": asked.digest(note.title, chunks), "title": note.title}, ensure_ascii=False)
            for interrupted in (False, True):
                h = f"{note.content_hash()}-{trial}-{interrupted}"
                store.replace_note(note.user_id, note.id, h, [], asked_job=payload)
                writing.clear()
                step = asyncio.create_task(jobs.step())
                if interrupted and args.phase == "writing":  # the answer comes while the questions are written
                    await writing.wait()
                    await asyncio.sleep(args.after)
                elif interrupted:
                    await asyncio.sleep(args.after)  # the questions' call is reading its prompt by now
                else:
                    await step  # it ends first: the answer alone (the KV cache as after a questions call)
                alone = step.done() and not interrupted
                ft, per_token = await first_token()
                await step
                rows.append({"note": note.id, "interrupted": interrupted, "first_token_s": round(ft, 3),
                             "s_per_token": round(per_token, 3), "alone": alone})
                print(rows[-1], flush=True)
        base = [r["first_token_s"] for r in rows if not r["interrupted"]]
        cut = [r["first_token_s"] for r in rows if r["interrupted"]]
        step_s = median(r["s_per_token"] for r in rows if r["s_per_token"])
        return {"model": args.model, "trials": len(base), "phase": args.phase, "after_s": args.after, "rows": rows,
                "first_token_alone_p50_s": round(median(base), 3), "first_token_interrupting_p50_s": round(median(cut), 3),
                "delay_p50_s": round(median(c - b for b, c in zip(base, cut)), 3),
                "delay_max_s": round(max(c - b for b, c in zip(base, cut)), 3),
                "generation_step_s": round(step_s, 3), "preempted": jobs.asked["preempted"],
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

    try:
        out = asyncio.run(scenario())
    finally:
        answers.close()
        store.close()
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}))
    Path(args.out).write_text(json.dumps(out, indent=1))


def cmd_tiny() -> None:
    """``generate`` and ``sweep`` on the sample notes, a stand-in writing each note's questions
    from its title (tests/fakes/ollama.py behind it), the results in a temporary folder."""
    import tempfile

    sys.path.insert(0, str(REPO / "tests"))
    from fakes.ollama import FakeOllama, Reply, _content, _pieces

    class Asking(FakeOllama):
        def unscripted(self, body: dict) -> Reply:
            if isinstance(body.get("format"), dict):
                digest_text = _content(body.get("messages") or [], "user", last=True)
                title = digest_text.split("\n", 1)[0].removeprefix("Title: ").strip()
                if "sections" in body["format"]["properties"]:  # questions_scope: sections, the first section's
                    return Reply(_pieces(json.dumps({"sections": [{"section": 1, "questions": [f"{title}先做什么？"],
                                                                   "english": [f"What comes first in {title}?"]}]},
                                                    ensure_ascii=False)))
                return Reply(_pieces(json.dumps({"questions": [f"{title}怎么做？"], "english": [f"How about {title}?"]},
                                                ensure_ascii=False)))
            return super().unscripted(body)

    tiny_world()
    folder = Path(tempfile.mkdtemp(prefix="lr-tiny-questions-"))
    cache = folder / "questions.jsonl"
    sections = folder / "sections.jsonl"
    with Asking(models=("stand-in",)) as fake:
        main(["generate", "--host", fake.url, "--model", "stand-in", "--cache", str(cache),
              "--state", str(folder / "gen"), "--timeout", "30"])
        main(["generate", "--host", fake.url, "--model", "stand-in", "--cache", str(sections),
              "--state", str(folder / "gen"), "--timeout", "30", "--scope", "sections"])
    main(["sweep", "--cache", str(cache), "--state", str(folder / "sweep"), "--per", "all", "--weights", "0.5",
          "--out", str(results_file("note_questions_results.json", True))])
    main(["sweep", "--cache", str(sections), "--state", str(folder / "sweep-sections"), "--per", "1,all",
          "--weights", "0.5", "--sides", "both,sparse", "--out", str(folder / "sections-results.json")])


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--tiny"]:
        return cmd_tiny()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a smoke run on the sample notes, a stand-in model")
    sub = ap.add_subparsers(dest="cmd")
    g = sub.add_parser("generate")
    g.add_argument("--host", default="http://127.0.0.1:11436")
    g.add_argument("--model", default="qwen2.5-coder:0.5b-instruct")
    g.add_argument("--cache", required=True)
    g.add_argument("--state", default="/tmp/lr-q-state")
    g.add_argument("--order", choices=("dev", "seeded"), default="dev")
    g.add_argument("--limit", type=int, default=0)
    g.add_argument("--only", default="")
    g.add_argument("--first", default="", help="a JSON list of note ids to write after the gold notes")
    g.add_argument("--others", default="", help="caches of other runs: a note they hold is skipped")
    g.add_argument("--stride", type=int, default=1, help="with --offset: every stride-th note first")
    g.add_argument("--offset", type=int, default=0)
    g.add_argument("--timeout", type=float, default=600.0)
    g.add_argument("--scope", choices=("note", "sections", "title"), default="note",
                   help="memory.questions_scope")
    w = sub.add_parser("sweep")
    w.add_argument("--cache", required=True)
    w.add_argument("--state", default="/tmp/lr-q-sweep")
    w.add_argument("--limit", type=int, default=0, help="notes of the cache, in the generation's order (0: all)")
    w.add_argument("--per", default="1,2,all", help="questions per language and note (all: as written)")
    w.add_argument("--weights", default="0.25,0.5,1.0")
    w.add_argument("--whole", action="store_true", help="with --copy: search the whole corpus (questions only where "
                   "the cache has them: a bias towards them, reported as such)")
    w.add_argument("--sides", default="both", help="both, dense, sparse: which of the questions' rankings")
    w.add_argument("--fresh", action="store_true")
    w.add_argument("--copy", default="", help="a state folder with the whole corpus indexed: copied, then sliced")
    w.add_argument("--slice", default="", help="a JSON list of note ids to index (with the gold notes), whatever "
                   "the cache covers")
    w.add_argument("--untied", action="store_true", help="sections' questions count for the note's nearest chunk, "
                   "not their own section's (what the tie is worth)")
    w.add_argument("--out", default="")
    c = sub.add_parser("per-call", help="one call per section against one per note (--scope sections' cache)")
    c.add_argument("--host", default="http://127.0.0.1:11436")
    c.add_argument("--model", default="qwen2.5-coder:0.5b-instruct")
    c.add_argument("--cache", required=True)
    c.add_argument("--state", default="/tmp/lr-q-state")
    c.add_argument("--limit", type=int, default=3)
    c.add_argument("--timeout", type=float, default=900.0)
    c.add_argument("--out", required=True)
    p = sub.add_parser("preempt")
    p.add_argument("--host", default="http://127.0.0.1:11436")
    p.add_argument("--model", default="qwen2.5-coder:0.5b-instruct")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--after", type=float, default=4.0, help="seconds into the questions' call the answer comes")
    p.add_argument("--phase", choices=("reading", "writing"), default="reading",
                   help="writing: --after counts from the questions' first token")
    p.add_argument("--out", default=str(REPO / "bench" / "note_questions_preempt.json"))
    args = ap.parse_args(argv)
    if args.cmd == "preempt":
        cmd_preempt(args)
    elif args.cmd == "generate":
        cmd_generate(args)
    elif args.cmd == "sweep":
        cmd_sweep(args)
    elif args.cmd == "per-call":
        cmd_per_call(args)
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
