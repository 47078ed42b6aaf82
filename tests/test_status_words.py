"""`status` (the command line) and `/status` (the bots) in words a person running the service
understands: no line speaks of cursors, USNs, lags, chunks, tiers, jobs, parked or pending work,
extractions that "gave way", generations or backlogs. The report is the one ``status_report``
makes for a Leanote account, a memory whose LLM work is paused by questions (the daemon's
worker), a note given up on, a long queue and written questions waiting for their hours."""

from __future__ import annotations

import re

import pytest

from rag.memory.store import MemoryStore
from rag.speed import Speed
from sync.memory_jobs import MemoryJobs, outlook

from bot.chat.texts import status_text
from bot.cli.report import print_status
from bot.usecases.people import Person
from bot.usecases.status import _speed, memory_counts

JARGON = re.compile(r"\b(gave way|extractions?|USN|cursor|lag|chunks?|tiers?|parked|jobs?|pending|generations?|"
                    r"backlog|dim|by terms|by llm|tokens written)\b", re.I)
MODEL = "qwen2.5-coder:1.5b-instruct"


class Clock:
    t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def report(tmp_path, settings_factory):
    settings = settings_factory(ollama={"model": MODEL},
                                memory={"llm": "auto", "questions": "auto", "questions_window": "01:00-06:00"})
    clock = Clock()
    store = MemoryStore(tmp_path / "memory.sqlite", clock=clock)
    for i in range(6):
        store.replace_note("u1", f"n{i}", f"h{i}", [])
        store.enqueue_llm("u1", f"n{i}", f"h{i}", "番茄炒蛋" * 300, title=f"n{i}", updated=100.0 + i)
    job = store.due_job(clock(), ["llm"])
    store.fail_job(job, "the model's reply is not the JSON asked for", ())  # given up on at once
    memory = memory_counts(settings, store, None)

    class Answers:  # what the worker reads of the answer service
        chat = None
        answers_waiting_or_writing = 0
        observers: list = []

    jobs = MemoryJobs(settings, lambda: store, Answers(), clock=clock)
    jobs.gave_up, jobs.preempted = True, 3  # paused: questions came before each note was read
    worker = jobs.state()
    memory["llm"]["worker"] = worker
    memory["questions"].update(notes=10, questions=30, generations_dropped=2, jobs_pending=5, seconds_per_note=5.9,
                               eta_seconds=30, output_tokens=400, done_last_hour=3)  # as asked_counts gives them
    memory["questions"]["worker"] = worker.pop("questions")
    memory["llm"]["outlook"] = outlook(settings.model_copy(update={"memory": settings.memory.model_copy(
        update={"llm_auto_max": 3600.0})}), 519, 4_900_000, MODEL, Speed(read_tps=40.0, write_tps=8.2))
    speed = Speed(read_tps=40.0, write_tps=8.2, samples=12, updated=1.0)
    store.close()
    return {
        "index": "/var/lib/leanote-rag/index", "backend": "edge", "embedder": "use:multilingual-v3", "dim": 512,
        "source": {"kind": "leanote_api", "path": None, "text": "leanote_api http://leanote.home (1 account: a@b.c)"},
        "users": [{"user_id": "u1", "notes": 36, "chunks": 210}],
        "accounts": [{"source": "leanote_api", "account": "a@b.c", "user_id": "u1", "cursor_usn": 120,
                      "server_usn": 123, "lag": 3, "notes_indexed": 36, "last_success": "2026-12-06T10:00:00",
                      "last_error": None, "failing_since": None, "next_run": "2026-12-06T10:05:00",
                      "usn_went_back": None}],
        "last_sync": {"source": "leanote_api", "started": 1.0, "finished": 2.0, "error": None, "ok": True,
                      "summary": {"added": 1, "updated": 2, "deleted": 0}},
        "skipped": [], "llm": {MODEL: _speed(MODEL, speed, settings, everyone=True)}, "capture": None,
        "memory": memory, "problems": [],
    }


def test_status_speaks_plainly_on_the_command_line(report, capsys):
    print_status(report)
    out = capsys.readouterr().out
    assert not JARGON.findall(out), "\n".join(line for line in out.splitlines() if JARGON.search(line))
    assert "3 changes on the server not synced yet" in out
    assert "paused" in out and "30 min without a question" in out
    assert "210 passages" in out


def test_status_speaks_plainly_in_the_bots(report):
    text = status_text(report, Person(user_id="u1", admin=True, key="telegram:1"))
    assert not JARGON.findall(text), "\n".join(line for line in text.splitlines() if JARGON.search(line))
    assert "3 changes on the server not synced yet" in text and "paused" in text
