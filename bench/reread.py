"""Read recorded real-model replies again with this checkout's answer check.

    .venv/bin/python bench/answers_eval.py --ollama-host URL --record replies.jsonl   # once: the model's work
    .venv/bin/python bench/reread.py replies.jsonl [--run "ollama qwen2.5-coder:1.5b-instruct"]
                                     [--labels bench/answer_labels.jsonl] [--show]
    .venv/bin/python bench/reread.py --tiny     # seconds: a handful of recorded English replies (a smoke run)

A change to how replies are read (refusals, which sentences stand on the evidence, specifics,
the answer-points judge) is measured on the very replies the model wrote, in a second,
instead of another hour of the model. Each recorded chat whose user message names an evidence
tag is an answer prompt: its blocks come from the prompt, the question from its last line, the
notes behind the blocks from the eval row of that question (``rows[].blocks`` of ``--run`` in
``bench/answers_eval_results.json``).

Printed per question: what the check makes of the reply (``rag.answer.support``: cited,
inferred, partly, uncited, refused, nothing), whether the gold note is cited, the units that say
something and those standing on the evidence, invented specifics, and the answer points stated
by what would be shown. Then the counts. With ``--labels`` (a JSON line per question, read by
hand: ``{"id", "reply_sha1", "points": [true, false, ...], "wrong": bool, "wrong_text": [...]}`` about
the reply as the model wrote it, whose sha1 (hex, first 12) it names), how often the answer-points judge (``rag.eval.point_stated``) and the wrong-claim flags
agree with that reading, and how many replies read as wrong by hand would still be shown. With ``--quote-labels`` (a
reading by hand of the answers shown with the note's words quoted under them, ``bench/quote_labels.jsonl``),
the answer points stated by hand and by the judge, without and with the quote, and how the quotes read. With
``--show``, each reply and what would be shown of it, for reading. With ``--role-labels`` (a reading by hand of the
shown sentences that state a number or a period: ``{id, sentence, role_wrong, why}``, ``bench/role_labels.jsonl``),
how many of those shown say a number of the note for something else than the note says it of (the cold water's
120 ml as the boiling water's, 每年 as 每天, the flight's price as the car hire's); ``--role-todo OUT`` writes the
shown ones not read yet, to be read. ``--quote`` reads them with another ``answer.quote_chars``
(the note's words quoted under an answer: the answer points are counted without and with them);
``--own``/``--min`` read them with other thresholds (``support.OWN_SHARE``, ``support.MIN_SHARE``), to see what a change costs.

``--tiny`` reads the first few answer prompts of ``bench/replies/en-1.5b.jsonl.gz``, whose questions are
``tests/data/dev_en.jsonl`` and whose rows are its own run's in ``bench/answers_eval_results.json``: all in the
repository, no shared corpus needed (those questions carry no answer points, so no points are judged); the JSON
(``--json``) goes to a temporary folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file, shared  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
RESULTS = REPO / "bench" / "answers_eval_results.json"
RUN = "ollama qwen2.5-coder:1.5b-instruct"
# --tiny: a recording whose questions are in the repository, its run, and how many of its answer prompts
TINY_RECORDING = REPO / "bench" / "replies" / "en-1.5b.jsonl.gz"
TINY_QUESTIONS = REPO / "tests" / "data" / "dev_en.jsonl"
TINY_RUN = f"{RUN}, file dev_en.jsonl"
TINY_PROMPTS = 8


def records(path: Path) -> list[dict]:
    """The answer prompts of a recording, with their question and blocks (later replies to the
    same question, e.g. a retry, replace earlier ones)."""
    from fakes.ollama import answer_prompt

    import gzip

    text = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" else path.read_text(encoding="utf-8")
    out: dict[str, dict] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        parts = answer_prompt(rec.get("messages") or [])
        if parts is None:
            continue
        question, blocks = parts
        out[question] = {"question": question, "blocks": blocks, "reply": rec["reply"]}
    return list(out.values())


def quote_of(check, blocks: dict[int, tuple[str, str]], question: str, width: int) -> str:
    """The note's words the service quotes under an answer (``AnswerService._quote``), from the
    prompt's blocks (their header line standing in for the citation's title)."""
    from rag.answer import support
    from rag.answer.outcomes import copied as _copied
    from rag.answer.types import Citation, quoted
    from rag.index.excerpt import excerpt

    where = support.behind(check)
    if not width or where is None:
        return ""
    n, said = where
    words = excerpt(blocks[n][1], said, width)
    if _copied(words, check.text):
        return ""
    head = blocks[n][0].split("] ", 1)[-1]
    return quoted(Citation(n, "", head, "", "", "", "", 0.0), words, "笔记原文 ")


# a period a sentence states (rag.answer.specifics.periods, here too for a checkout before it)
_PERIOD = re.compile(r"每(?:一)?(?:个)?(?:天|日|晚|周|星期|礼拜|月|季度|季|年|小时|钟头)|天天|日日|年年|月月"
                     r"|\b(?:daily|nightly|weekly|monthly|quarterly|yearly|annually|hourly)\b"
                     r"|\b(?:every|per|each)\s+(?:day|night|week|month|quarter|year|hour)\b", re.I)


def _sentence(text: str) -> str:
    """A shown sentence as the role labels name it: its markers and spacing aside."""
    return " ".join(re.sub(r"\s*\[\d{1,3}(?:\s*[,，、]\s*\d{1,3})*\]", "", text).split())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording", type=Path, nargs="?")
    ap.add_argument("--run", help=f"the run in bench/answers_eval_results.json whose rows map blocks to notes "
                                  f"(default: {RUN})")
    ap.add_argument("--labels", type=Path, help="a reading by hand: JSON lines {id, points, wrong}")
    ap.add_argument("--quote-labels", type=Path,
                    help="a reading by hand of answers with their quote: JSON lines {id, reply_sha1, quote_sha1, "
                         "answer_points, shown_points, quote_relevant, quote_contradicts_answer}")
    ap.add_argument("--show", action="store_true", help="print each reply and what would be shown of it")
    ap.add_argument("--role-labels", type=Path, help="a reading by hand of the shown sentences stating a number or "
                                                     "period: JSON lines {id, sentence, role_wrong, why}")
    ap.add_argument("--role-todo", type=Path, metavar="OUT",
                    help="with --role-labels: write the shown sentences it does not read yet (JSON lines to fill in)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="write the counts and rows as JSON")
    ap.add_argument("--own", type=float, help="support.OWN_SHARE for this reading (a unit's own words a block must hold)")
    ap.add_argument("--min", type=float, help="support.MIN_SHARE for this reading (the supported units a reply needs)")
    ap.add_argument("--quote", type=int, metavar="CHARS", help="answer.quote_chars for this reading (0: no quote)")
    ap.add_argument("--file", type=Path, action="append", metavar="JSONL",
                    help="the questions the recording asked, when not the dev set's (e.g. tests/data/dev_en.jsonl; "
                         "may be given more than once)")
    ap.add_argument("--tiny", action="store_true",
                    help=f"a smoke run: the first {TINY_PROMPTS} answer prompts of {TINY_RECORDING.name}")
    args = ap.parse_args()
    if args.tiny and (args.recording or args.file or args.run):
        ap.error("--tiny reads its own recording, questions and run: none of them with it")
    if args.tiny:
        args.recording, args.file, args.run = TINY_RECORDING, [TINY_QUESTIONS], TINY_RUN
        args.json = args.json or results_file("reread_results.json", True)
    if not args.recording:
        ap.error("a recording is needed (or --tiny)")
    args.run = args.run or RUN

    from rag.answer import support
    try:
        from rag.answer.copies import check as checked  # an answer to a question in another language, bounded
    except ImportError:  # a checkout before it (read again with the code before a change)
        checked = support.check
    if args.own is not None:
        support.OWN_SHARE = args.own
    if args.min is not None:
        support.MIN_SHARE = args.min
    from rag.config import AnswerConfig
    from rag.eval import contradicted, point_stated

    refusal = AnswerConfig().refusal
    quote_chars = AnswerConfig().quote_chars if args.quote is None else args.quote
    runs = json.loads(RESULTS.read_text(encoding="utf-8"))["runs"]
    rows = {r["id"]: r for r in runs[args.run]["report"]["rows"]} if args.run in runs else {}
    dev = {q["question"]: q for path in (args.file or [shared() / "eval" / "dev.jsonl"])
           for q in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if q}
    labels: dict[tuple[str, str], dict] = {}  # (question id, the reply's sha1, first 12) -> the reading
    if args.labels:
        labels = {(x["id"], x["reply_sha1"]): x
                  for x in map(json.loads, args.labels.read_text(encoding="utf-8").splitlines()) if x}
    counts = {"answerable": 0, "gold_by_llm": 0, "shown_llm": 0, "refused": 0, "passages_or_refusal": 0,
              "no_answer": 0, "no_answer_answered": 0, "traps_cited": 0, "reply_units": 0, "reply_supported": 0,
              "shown_units": 0, "replies_invented": 0, "points": 0, "points_stated": 0, "points_shown": 0,
              "wrong_flagged": 0}
    agree = {"points": 0, "points_judged": 0, "judge_yes_me_no": 0, "judge_no_me_yes": 0,
             "wrong_by_hand": 0, "wrong_by_hand_shown": 0, "wrong_by_hand_flagged": 0, "flagged_not_wrong": 0,
             "labelled": 0}
    quote_labels: dict[tuple[str, str], dict] = {}
    if args.quote_labels:
        quote_labels = {(x["id"], x["reply_sha1"]): x
                        for x in map(json.loads, args.quote_labels.read_text(encoding="utf-8").splitlines()) if x}
    by_hand = {"answers": 0, "points": 0, "answer_by_hand": 0, "answer_judge": 0, "answer_agree": 0,
               "shown_by_hand": 0, "shown_judge": 0, "shown_agree": 0, "quote_relevant": {},
               "quote_shows_the_answer_wrong": 0, "quote_changed": 0}
    out_rows = []
    roles = {(x["id"], _sentence(x["sentence"])): x for x in map(json.loads, args.role_labels.read_text(
        encoding="utf-8").splitlines()) if x} if args.role_labels and args.role_labels.exists() else {}
    role = {"shown_with_specifics": 0, "read": 0, "role_wrong_shown": 0, "ids": []}
    todo: list[dict] = []
    for rec in records(args.recording)[:TINY_PROMPTS if args.tiny else None]:
        q = dev.get(rec["question"])
        if q is None:
            continue
        check = checked(rec["reply"], rec["question"], rec["blocks"])
        how = support.verdict(rec["reply"], check, refusal)
        shown = how in ("cited", "inferred")
        row = rows.get(q["id"]) or {}
        notes = {row.get("blocks", {}).get(str(n)) for n in (check.cited if shown else [])} - {None}
        gold, traps = set(q.get("gold_note_ids") or []), set(q.get("trap_note_ids") or [])
        points = q.get("answer_points") or []
        text = check.text if shown else ""
        stated = [point_stated(p, text, rec["question"]) for p in points] if shown else []
        quote = quote_of(check, rec["blocks"], rec["question"], quote_chars) if shown else ""
        with_quote = [point_stated(p, f"{text}\n\n{quote}", rec["question"]) for p in points] if shown else []
        wrong = bool(contradicted(points, text) or check.invented_specifics and shown and
                     support.check(text, rec["question"], rec["blocks"]).invented_specifics)
        counts["reply_units"] += len(check.saying)
        counts["reply_supported"] += len(check.supported)
        counts["replies_invented"] += bool(check.invented_specifics)
        if gold:
            counts["answerable"] += 1
            counts["gold_by_llm"] += bool(gold & notes)
            counts["refused"] += how == "refused"
            counts["passages_or_refusal"] += not shown
        else:
            counts["no_answer"] += 1
            counts["no_answer_answered"] += shown
        counts["traps_cited"] += bool(traps & notes)
        if shown:
            counts["shown_llm"] += 1
            counts["shown_units"] += len([v for v in check.supported])
            counts["points"] += len(points)
            counts["points_stated"] += sum(stated)
            counts["points_shown"] += sum(with_quote)
            counts["wrong_flagged"] += wrong
        sha = hashlib.sha1(rec["reply"].encode()).hexdigest()[:12]
        qlabel = quote_labels.get((q["id"], sha)) if shown else None
        if qlabel is not None and qlabel["quote_sha1"] != hashlib.sha1(quote.encode()).hexdigest()[:12]:
            by_hand["quote_changed"] += 1  # read by hand with another quote: not compared
        elif qlabel is not None:
            by_hand["answers"] += 1
            by_hand["points"] += len(points)
            for hand, judge, key in ((qlabel["answer_points"], stated, "answer"), (qlabel["shown_points"], with_quote, "shown")):
                by_hand[f"{key}_by_hand"] += sum(hand)
                by_hand[f"{key}_judge"] += sum(judge)
                by_hand[f"{key}_agree"] += sum(a == b for a, b in zip(hand, judge))
            rel = by_hand["quote_relevant"]
            rel[qlabel["quote_relevant"]] = rel.get(qlabel["quote_relevant"], 0) + 1
            by_hand["quote_shows_the_answer_wrong"] += bool(qlabel.get("quote_contradicts_answer"))
        label = labels.get((q["id"], sha))
        if label is not None:
            agree["labelled"] += 1
            judged = [point_stated(p, rec["reply"], rec["question"]) for p in points]
            for mine, theirs in zip(label.get("points") or [], judged):
                agree["points_judged"] += 1
                agree["points"] += mine == theirs
                agree["judge_yes_me_no"] += theirs and not mine
                agree["judge_no_me_yes"] += mine and not theirs
            if label.get("wrong"):
                agree["wrong_by_hand"] += 1
                left = [w for w in label.get("wrong_text") or [] if w in text]
                agree["wrong_by_hand_shown"] += bool(left)  # the wrong claim still in what is shown
                agree["wrong_by_hand_flagged"] += bool(shown and wrong)
                if left:
                    agree.setdefault("wrong_shown_ids", []).append(q["id"])
            elif shown and wrong:
                agree["flagged_not_wrong"] += 1
        hit = "gold" if gold & notes else ("TRAP" if traps & notes else ("-" if gold else "no-answer"))
        share = f"{len(check.supported)}/{len(check.saying)}"
        print(f"{q['id']:6} {q.get('type', ''):11} {how:9} {hit:9} units {share:6} points "
              f"{sum(stated)}/{len(points) if shown else '-'}  invented {', '.join(check.invented_specifics)[:60]}")
        if args.show:
            print("   reply: " + rec["reply"].replace("\n", "\n          "))
            print("   shown: " + (text.replace("\n", "\n          ") if shown else "(not shown)"))
            if quote:
                print("          " + quote.replace("\n", "\n          "))
            for p, ok in zip(points, stated):
                print(f"   point {'+' if ok else '-'} {p}")
        for v in (check.supported if shown else []):
            if getattr(v, "cut", False) or v.code or not (support.numbers(_sentence(v.text)) or _PERIOD.search(v.text)):
                continue
            role["shown_with_specifics"] += 1
            label = roles.get((q["id"], _sentence(v.text)))
            if label is None:
                todo.append({"id": q["id"], "question": rec["question"], "sentence": _sentence(v.text),
                             "role_wrong": None, "why": ""})
                continue
            role["read"] += 1
            if label["role_wrong"]:
                role["role_wrong_shown"] += 1
                role["ids"].append(q["id"])
        out_rows.append({"id": q["id"], "verdict": how, "hit": hit, "units": len(check.saying),
                         "supported": len(check.supported), "invented": check.invented_specifics,
                         "points": len(points), "stated": sum(stated), "with_quote": sum(with_quote),
                         "wrong_flagged": wrong})
    print(json.dumps(counts))
    if args.role_labels:
        print(json.dumps({"roles": role}, ensure_ascii=False))
        if args.role_todo:
            args.role_todo.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in todo), encoding="utf-8")
    if labels:
        print(json.dumps(agree))
    if quote_labels:
        print(json.dumps({"quote_labels": by_hand}))
    if args.json:
        args.json.write_text(json.dumps({"counts": counts, "agreement": agree if labels else None, "rows": out_rows},
                                        ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
