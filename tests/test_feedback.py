"""The feedback store on real SQLite: answers recorded per person, verdicts only by
the person who asked, the operator's export, and ``leanote-rag feedback``."""

import json
import re
import sqlite3
import threading
import time

import pytest

from rag.answer.types import Answer, Candidate, Citation, Trace
from bot.cli import main
from rag.errors import BrokenState, UserError
from rag.answer.feedback import FILE, MIGRATIONS, FeedbackStore, NotYours, UnknownAnswer

from conftest import EXAMPLES

ALICE, BOB = "telegram:111", "discord:222"


class Clock:
    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def pork(question: str = "它要炖多久？") -> Answer:
    """A grounded LLM answer to a follow-up, as ``Service.ask`` returns it."""
    trace = Trace(question, "红烧肉要炖多久？", decision="answered by the LLM", outcome="llm",
                  candidates=[Candidate("p1", "n1", "红烧肉", "做法", 1, 0.81, 2, 7.5, 0.0325, 0.97, 1)])
    citations = [Citation(1, "n1", "红烧肉", "菜谱", "做法", "http://notes.home:9000/note/n1", "小火炖 60 分钟", 0.97),
                 Citation(2, "n2", "Pressure cooker", "菜谱", "", "http://notes.home:9000/note/n2", "25 min", 0.5)]
    return Answer(question, "小火炖 60 分钟 [1]，高压锅 25 分钟 [2]。", used_llm=True, grounded=True,
                  citations=citations, trace=trace)


def refusal(question: str = "How tall is Everest?") -> Answer:
    return Answer(question, "笔记里没有找到答案。", used_llm=False, grounded=False)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    with FeedbackStore(tmp_path / FILE, clock=clock) as s:
        yield s


def test_record_then_get_returns_what_was_sent(store, clock):
    answer = pork()
    answer_id = store.record(ALICE, "u1", answer, conversation="telegram:chat-5:111")
    rec = store.get(answer_id)
    assert rec.id == answer_id and rec.time == clock.now
    assert (rec.person, rec.user_id, rec.conversation) == (ALICE, "u1", "telegram:chat-5:111")
    assert (rec.question, rec.standalone) == ("它要炖多久？", "红烧肉要炖多久？")
    assert rec.answer == answer.answer and rec.outcome == "llm" and rec.used_llm and rec.grounded
    assert rec.cited == [{"n": 1, "note_id": "n1", "title": "红烧肉", "url": "http://notes.home:9000/note/n1"},
                         {"n": 2, "note_id": "n2", "title": "Pressure cooker", "url": "http://notes.home:9000/note/n2"}]
    assert rec.trace == answer.as_json(with_trace=True)["trace"]
    assert (rec.verdict, rec.reason, rec.updated, rec.saved_note_id) == (None, None, None, None)


def test_an_answer_without_trace_keeps_its_own_question(store):
    rec = store.get(store.record(BOB, "u2", refusal()))
    assert rec.question == rec.standalone == "How tall is Everest?"
    assert rec.outcome == "" and rec.trace is None and rec.cited == [] and not rec.grounded


def test_ids_are_short_url_safe_and_unique(store):
    ids = [store.record(ALICE, "u1", refusal()) for _ in range(300)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) <= 16 and re.fullmatch(r"[A-Za-z0-9_-]+", i) for i in ids)


def test_the_asker_gives_a_verdict(store, clock):
    answer_id = store.record(ALICE, "u1", pork())
    clock.now += 30
    rec = store.verdict(answer_id, ALICE, "down", reason="wrong recipe")
    assert (rec.verdict, rec.reason, rec.updated) == ("down", "wrong recipe", clock.now)
    assert store.get(answer_id, ALICE) == rec


def test_someone_else_can_neither_change_nor_read_the_answer(store):
    answer_id = store.record(ALICE, "u1", pork())
    store.verdict(answer_id, ALICE, "up")
    before = store.get(answer_id)
    with pytest.raises(NotYours):
        store.verdict(answer_id, BOB, "down", reason="spite")
    with pytest.raises(NotYours):
        store.reason(answer_id, BOB, "spite")
    with pytest.raises(NotYours):
        store.mark_saved(answer_id, BOB, "note-x")
    with pytest.raises(NotYours):
        store.get(answer_id, BOB)
    assert store.get(answer_id) == before


def test_an_unknown_id_is_an_error_for_a_press_and_none_for_get(store):
    assert store.get("nope") is None
    with pytest.raises(UnknownAnswer):
        store.verdict("nope", ALICE, "up")
    with pytest.raises(ValueError):
        store.verdict(store.record(ALICE, "u1", pork()), ALICE, "meh")


def test_a_second_press_replaces_the_first(store, clock):
    answer_id = store.record(ALICE, "u1", pork())
    store.verdict(answer_id, ALICE, "down", reason="too slow")
    clock.now += 5
    rec = store.verdict(answer_id, ALICE, "down")
    assert (rec.verdict, rec.reason) == ("down", "too slow")  # the same press again keeps the reason
    clock.now += 5
    rec = store.verdict(answer_id, ALICE, "up")
    assert (rec.verdict, rec.reason, rec.updated) == ("up", None, clock.now)  # not the 👎's reason
    rec = store.reason(answer_id, ALICE, "  exactly right  ")
    assert (rec.verdict, rec.reason) == ("up", "exactly right")
    assert len(store.export()) == 1


def test_mark_saved_is_remembered(store):
    answer_id = store.record(ALICE, "u1", pork())
    assert store.mark_saved(answer_id, ALICE, "note-9").saved_note_id == "note-9"
    assert store.get(answer_id, ALICE).saved_note_id == "note-9"


def test_export_filters_by_user_and_since_newest_first(store, clock):
    first = store.record(ALICE, "u1", pork("first"))
    clock.now += 100
    second = store.record(BOB, "u2", refusal("second"))
    clock.now += 100
    third = store.record(ALICE, "u1", pork("third"))
    store.verdict(first, ALICE, "up")

    rows = store.export()
    assert [r["id"] for r in rows] == [third, second, first]
    assert rows[2]["verdict"] == "up" and rows[0]["verdict"] is None
    assert {"id", "time", "person", "user_id", "question", "standalone", "answer", "cited", "outcome", "verdict",
            "reason", "trace"} <= set(rows[0])
    json.dumps(rows)  # ready to write out as it is
    assert [r["id"] for r in store.export(user_id="u1")] == [third, first]
    assert [r["id"] for r in store.export(since=clock.now - 100)] == [third, second]
    assert [r["id"] for r in store.export(user_id="u2", since=clock.now - 100)] == [second]
    assert store.export(user_id="nobody") == []


def test_forget_drops_only_old_answers(store, clock):
    old = store.record(ALICE, "u1", pork())
    clock.now += 200 * 86400
    new = store.record(ALICE, "u1", pork())
    assert store.forget(clock.now - 180 * 86400) == 1
    assert store.get(old) is None and store.get(new) is not None


def test_records_survive_reopening_and_the_schema_is_versioned(tmp_path, clock):
    path = tmp_path / FILE
    with FeedbackStore(path, clock=clock) as s:
        answer_id = s.record(ALICE, "u1", pork())
    with FeedbackStore(path, clock=clock) as s:
        assert s.get(answer_id).cited[0]["title"] == "红烧肉"
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_several_threads_record_and_vote_at_once(store):
    ids: list[str] = []

    def work():
        for _ in range(25):
            answer_id = store.record(ALICE, "u1", pork())
            store.verdict(answer_id, ALICE, "up")
            ids.append(answer_id)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = store.export()
    assert len(rows) == len(set(ids)) == 100 and all(r["verdict"] == "up" for r in rows)


def test_a_file_that_cannot_be_used_says_so(tmp_path):
    path = tmp_path / FILE
    path.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(BrokenState, match="not a readable feedback store"):
        FeedbackStore(path)
    with pytest.raises(UserError, match="writable"):
        FeedbackStore(tmp_path / "missing" / FILE)


# --- leanote-rag feedback ----------------------------------------------------------------------


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(f"source:\n  kind: files\n  path: {EXAMPLES}\nstate_dir: data\n")
    return path


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_without_a_database_means_no_feedback_yet(cfg, capsys):
    assert run(capsys, "--config", str(cfg), "feedback", "--json") == (0, "[]\n", "")
    code, out, _ = run(capsys, "--config", str(cfg), "feedback")
    assert code == 0 and out == "no feedback yet\n"
    assert not (cfg.parent / "data" / FILE).exists()  # reading created nothing


def test_cli_json_and_table(cfg, capsys):
    (cfg.parent / "data").mkdir()
    now = time.time()
    with FeedbackStore(cfg.parent / "data" / FILE, clock=lambda: now - 10 * 86400) as s:
        old = s.record(BOB, "u2", refusal("An old question about something long forgotten by now, surely"))
    with FeedbackStore(cfg.parent / "data" / FILE) as s:
        new = s.record(ALICE, "u1", pork())
        s.verdict(new, ALICE, "down", reason="wrong recipe")

    code, out, _ = run(capsys, "--config", str(cfg), "feedback", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["id"] for r in rows] == [new, old]
    assert rows[0]["verdict"] == "down" and rows[0]["reason"] == "wrong recipe" and rows[0]["trace"]["outcome"] == "llm"
    assert [r["id"] for r in json.loads(run(capsys, "--config", str(cfg), "feedback", "--json", "--since", "5")[1])] == [new]
    assert [r["id"] for r in json.loads(run(capsys, "--config", str(cfg), "feedback", "--json", "--user", "u2")[1])] == [old]

    code, out, _ = run(capsys, "--config", str(cfg), "feedback")
    assert code == 0
    header, first, second = out.splitlines()[:3]
    assert header.split() == ["time", "person", "verdict", "question", "cited"]
    assert ALICE in first and "down" in first and "它要炖多久？" in first and "红烧肉; Pressure cooker" in first
    assert BOB in second and "An old question about something long fo…  -" in second and second.endswith("-")
    assert "2 answers: 0 up, 1 down, 1 without a verdict" in out
    code, out, _ = run(capsys, "--config", str(cfg), "feedback", "--user", "nobody")
    assert code == 0 and out == "no answers match --user/--since\n"


def test_cli_rejects_a_bad_since(cfg, capsys):
    code, _, err = run(capsys, "--config", str(cfg), "feedback", "--since", "0")
    assert code == 2 and "--since" in err
