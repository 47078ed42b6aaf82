"""What the sync's comparison of the derived stores with the index costs per pass.

    .venv/bin/python bench/memory_align.py [--notes 10000]

Builds (in a temp folder) a state.db with N indexed notes and a memory.sqlite as the
memory of N notes would hold it (50 mentions per note, 3 of them tags; 2 facts; 8
related pairs each way; a feedback store of 2,000 answers naming 10 notes each), then
times ``Derived.align`` (``sync.derived``) (memory and feedback), wall and CPU time: with nothing
to repair (what a pass that changed notes pays; an idle pass skips it), and with 1 % of
the notes gone from the index (their memory
removed in one transaction, the answers naming them redacted). Prints JSON and writes
bench/memory_align_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from conftest import make_settings  # noqa: E402

from rag.answer.feedback import FeedbackStore  # noqa: E402
from rag.memory.entities import VERSION  # noqa: E402
from rag.memory.store import MemoryStore, path_for  # noqa: E402
from sync.state import INDEXED, NoteRecord, State  # noqa: E402
from bot.root import Parts  # noqa: E402

USER = "u1"


def build(tmp: Path, n: int):
    (tmp / "notes").mkdir()
    settings = make_settings(tmp, source={"kind": "files", "path": str(tmp / "notes")}, memory={"llm": "off"})
    rng = random.Random(1)
    ids = [f"{i:024x}" for i in range(n)]
    state = State(settings.state_dir)
    with state.transaction():
        for i, note_id in enumerate(ids):
            state.put_note(NoteRecord(note_id=note_id, source="files", user_id=USER, title=f"note {i}",
                                      notebook="work", content_hash=f"h{i}", meta_hash="m", pipeline="p",
                                      point_ids=[], chunk_keys=[], usn=i, account="", status=INDEXED,
                                      notebook_id="b", tags=[f"tag{i % 50}", f"tag{i % 7 + 50}", "all"],
                                      fingerprint="f"))
    memory = MemoryStore(path_for(settings))
    db = memory.db
    db.execute("BEGIN")
    db.executemany("INSERT INTO notes(note_id, user_id, content_hash, version, tier, processed_at, title, notebook) "
                   "VALUES (?,?,?,?,?,?,?,?)",
                   [(note_id, USER, f"h{i}", VERSION, "terms", 0.0, f"note {i}", "work") for i, note_id in enumerate(ids)])
    terms = 20_000
    db.executemany("INSERT INTO entities(id, user_id, name, norm, kind) VALUES (?,?,?,?,?)",
                   [(e, USER, f"term{e}", f"term{e}", "term") for e in range(terms)])
    db.executemany("INSERT INTO entities(id, user_id, name, norm, kind) VALUES (?,?,?,?,?)",
                   [(terms + t, USER, name, name, "tag") for t, name in
                    enumerate([f"tag{k}" for k in range(57)] + ["all"])])
    tag_id = {f"tag{k}": terms + k for k in range(57)} | {"all": terms + 57}
    rows = []
    for i, note_id in enumerate(ids):
        for e in rng.sample(range(terms), 47):
            rows.append((e, USER, note_id, "p", 0, 5, "a snippet of the text around the mention"))
        for tag in (f"tag{i % 50}", f"tag{i % 7 + 50}", "all"):
            rows.append((tag_id[tag], USER, note_id, None, None, None, ""))
    db.executemany("INSERT INTO mentions(entity_id, user_id, note_id, point_id, char_start, char_end, snippet) "
                   "VALUES (?,?,?,?,?,?,?)", rows)
    db.executemany("INSERT INTO facts(user_id, subject, subject_norm, predicate, object, quote, note_id, time, origin, "
                   "created) VALUES (?,?,?,?,?,?,?,?,?,?)",
                   [(USER, f"s{i}", f"s{i}", "p", f"o{k}", "q", note_id, 0.0, "llm", 0.0)
                    for i, note_id in enumerate(ids) for k in range(2)])
    pairs = set()
    for note_id in ids:
        for other in rng.sample(ids, 8):
            if other != note_id:
                pairs.add((note_id, other))
                pairs.add((other, note_id))
    db.executemany("INSERT OR IGNORE INTO related(user_id, note_a, note_b, score, computed_at) VALUES (?,?,?,?,?)",
                   [(USER, a, b, 1.0, 0.0) for a, b in pairs])
    db.execute("COMMIT")
    memory.close()
    feedback = FeedbackStore.open_for(settings)
    feedback.db.execute("BEGIN")
    for k in range(2000):
        named = rng.sample(ids, 10)
        cited = [{"n": j + 1, "note_id": x, "title": "t", "url": "u"} for j, x in enumerate(named[:3])]
        trace = {"candidates": [{"note_id": x, "title": "t", "heading": "", "evidence": None} for x in named],
                 "facts": []}
        feedback.db.execute("INSERT INTO answers(id, time, person, user_id, question, standalone, answer, cited, "
                            "outcome, used_llm, grounded, trace) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                            (f"a{k}", 0.0, "p", USER, "q", "q", "a", json.dumps(cited), "llm", 1, 1, json.dumps(trace)))
        feedback.db.executemany("INSERT INTO named(note_id, answer_id) VALUES (?,?)", [(x, f"a{k}") for x in named])
    feedback.db.execute("COMMIT")
    feedback.close()
    return settings, state, ids, len(rows), len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--notes", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings, state, ids, mentions, pairs = build(Path(tmp), args.notes)
        parts = Parts(settings, index=None, state=state)
        derived = parts.derived
        try:
            idle, idle_cpu = [], []
            for _ in range(5):
                t, c = time.perf_counter(), time.process_time()
                derived.align(feedback=True)
                idle.append(time.perf_counter() - t)
                idle_cpu.append(time.process_time() - c)
            gone = ids[:: 100]
            with state.transaction():
                for note_id in gone:
                    state.delete_note(note_id)
            t, c = time.perf_counter(), time.process_time()
            derived.align(feedback=True)
            repair, repair_cpu = time.perf_counter() - t, time.process_time() - c
            left = set(derived.memory.holdings())
            assert not left & set(gone) and len(left) == len(ids) - len(gone)
        finally:
            parts.close()
            state.close()
    result = {
        "notes": args.notes, "mentions": mentions, "related_rows": pairs, "feedback_answers": 2000,
        "align_nothing_to_do_ms": {"p50": round(statistics.median(idle) * 1000, 1), "max": round(max(idle) * 1000, 1),
                                   "cpu_p50": round(statistics.median(idle_cpu) * 1000, 1)},
        "align_removing_1pct_ms": {"wall": round(repair * 1000, 1), "cpu": round(repair_cpu * 1000, 1)},
        "removed_notes": len(gone),
        "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
    }
    print(json.dumps(result, indent=1))
    (REPO / "bench" / "memory_align_results.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
