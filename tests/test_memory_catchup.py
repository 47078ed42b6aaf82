"""The memory's catch-up in the incremental sync (``AccountSync._memory_catch_up``) and the
LLM tier's parked jobs: a note whose extraction keeps failing is parked, and it is not
read from the server again on every pass (the catch-up follows the no-LLM tier, which the
note has); only a change of its text queues it again."""

from __future__ import annotations

import asyncio

import pytest

from bot.cli import main
from rag import config as config_mod
from rag.answer.service import AnswerService
from rag.index.note_index import NoteIndex
from rag.llm import OllamaChat
from sync.memory_jobs import MemoryJobs
from sync.state import State
from bot.root import Parts

from conftest import THREADS, make_settings
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama

ALICE = "5dbed2987db161bc2a85b919"
WORK = "5e16ca22f6ffdbad5b4ba501"
NOTE, OTHER = "6" + "0" * 22 + "1", "6" + "0" * 22 + "2"
READ_AGAIN = "note/getNoteAndContent"  # how the catch-up reads a note by id


@pytest.fixture
def world(monkeypatch, tmp_path, use_embedder):
    monkeypatch.setenv("LR_PW_ALICE", "alice-pw")
    with FakeLeanote() as leanote, FakeOllama() as ollama:
        leanote.add_user(ALICE, "alice@example.com", "alice-pw")
        leanote.put_notebook({"NotebookId": WORK, "UserId": ALICE, "Title": "工作"})
        leanote.put_note({"NoteId": NOTE, "UserId": ALICE, "NotebookId": WORK, "Title": "数据库迁移",
                          "Content": "<p>项目 Atlas 的数据库从 MySQL 换成了 PostgreSQL。</p>"})
        settings = make_settings(
            tmp_path, leanote={"base_url": leanote.url},
            source={"kind": "leanote_api", "path": None,
                    "accounts": [{"email": "alice@example.com", "password_env": "LR_PW_ALICE"}]},
            ollama={"host": ollama.url, "timeout": 5}, answer={"first_token_budget": 2}, memory={"llm": "on"}, rerank={"kind": "none"},
        )
        state = State(settings.state_dir)
        index = NoteIndex.open(settings, create=True, embedder=use_embedder)
        service = Parts(settings, index=index, state=state, scheduled=True).sync
        answers = AnswerService(settings, index=None, chat=OllamaChat(settings.ollama))
        try:
            yield leanote, ollama, settings, service, answers
        finally:
            answers.close()
            service.close()
            index.close()
            state.close()


def test_a_parked_note_is_not_read_again_every_pass_only_when_it_changes(world):
    leanote, ollama, settings, service, answers = world
    assert service.run_pass().ok
    memory = service.derived.memory
    assert memory.known(NOTE) and memory.llm_counts()["jobs_pending"] == 1
    # the extraction fails (a reply that is not the schema's JSON) until the job is parked
    jobs = MemoryJobs(settings, lambda: memory, answers, delays=(), poll=0.01, quiet=0.0)
    ollama.reply_structured("not json")
    assert asyncio.run(jobs.step()) and jobs.parked == 1
    assert memory.llm_counts()["jobs_parked"] == 1

    # passes with nothing new, and one with another note: the parked note is not read again
    leanote.calls.clear()
    assert service.run_pass().ok and service.run_pass().ok
    leanote.put_note({"NoteId": OTHER, "UserId": ALICE, "NotebookId": WORK, "Title": "别的", "Content": "<p>别的事。</p>"})
    assert service.run_pass().ok
    assert leanote.calls[READ_AGAIN] == 0 and leanote.calls["note/getNoteContent"] == 1  # OTHER's body only
    counts = memory.llm_counts()
    assert counts["jobs_parked"] == 1 and counts["jobs_pending"] == 1  # OTHER's job

    # its text changes: read, and queued again from scratch
    leanote.edit_note(NOTE, content="<p>项目 Atlas 的数据库又换成了 SQLite。</p>")
    assert service.run_pass().ok
    counts = memory.llm_counts()
    assert counts["jobs_parked"] == 0 and counts["jobs_pending"] == 2

    # (the catch-up does read again a note the memory lacks: what it is there for)
    leanote.calls.clear()
    memory.remove_note(NOTE)
    assert service.run_pass().ok
    assert leanote.calls[READ_AGAIN] == 1 and memory.known(NOTE)


def test_status_says_what_a_parked_note_means_and_what_to_do(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "迁移.md").write_text("# 数据库迁移\n\n项目 Atlas 的数据库从 MySQL 换成了 PostgreSQL。\n", encoding="utf-8")
    with FakeOllama() as ollama:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(f"source: {{kind: files, path: notes}}\nstate_dir: data\nrerank: {{kind: none}}\n"
                       f"ollama: {{host: '{ollama.url}', timeout: 5}}\nanswer: {{first_token_budget: 2}}\nmemory: {{llm: 'on'}}\n"
                       f"embedder: {{threads: {THREADS}}}\n")
        assert main(["--config", str(cfg), "index"]) == 0
        settings = config_mod.load(str(cfg))
        answers = AnswerService(settings, index=None, chat=OllamaChat(settings.ollama))
        try:
            with Parts(settings) as parts:
                memory = parts.memory
                jobs = MemoryJobs(settings, lambda: memory, answers, delays=(), poll=0.01, quiet=0.0)
                ollama.reply_structured("not json")
                assert asyncio.run(jobs.step()) and jobs.parked == 1
        finally:
            answers.close()
        capsys.readouterr()
        assert main(["--config", str(cfg), "status"]) == 0
    out = capsys.readouterr().out
    assert "0 notes waiting, 1 given up on" in out
    said = " ".join(out.split())
    assert ("given up: the LLM failed on these notes at every try and no longer reads them. They are still searched "
            "and answered from, without the facts and summary the LLM adds.") in said
    assert "a note given up on is tried again when its text changes" in said
    assert "after 1 try:" in out
