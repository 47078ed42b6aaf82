"""The pre-LLM gates on the shared corpus (skipped without it): no answerable dev question
is refused before the LLM, and the no_answer questions naming what no note mentions are. A slice keeps it fast: every dev question's gold notes and as
many other notes of the same users, with the real default embedder."""

import asyncio
import json

import pytest

from rag.answer.service import AnswerService
from rag.index.note_index import NoteIndex
from rag.model import Note
from sync.indexer import Indexer
from sync.sources.mongodump import MongodumpSource
from sync.state import State

from conftest import SHARED, make_settings


@pytest.fixture(scope="module")
def dev_slice(tmp_path_factory, use_embedder):
    if not (SHARED / "eval" / "dev.jsonl").exists():
        pytest.skip(f"shared material not found at {SHARED}")
    questions = [json.loads(line) for line in open(SHARED / "eval" / "dev.jsonl", encoding="utf-8")]
    questions = [q for q in questions if not q.get("after_changes")]
    gold = {n for q in questions for n in q["gold_note_ids"]}
    tmp = tmp_path_factory.mktemp("gate")
    archive = SHARED / "corpus" / "mongodump" / "backup_leanote_20250601.tar.gz"
    settings = make_settings(tmp, source={"kind": "mongodump", "path": str(archive)}, ollama={"enabled": False},
                             rerank={"kind": "none"})
    source = MongodumpSource(archive, settings.state_dir)
    kept, others = [], 0
    for item in source.notes():
        if isinstance(item, Note) and item.searchable:
            if item.id in gold:
                kept.append(item)
            elif others < 30:
                kept.append(item)
                others += 1
    state = State(settings.state_dir)
    with NoteIndex.open(settings, create=True, embedder=use_embedder) as index:
        Indexer(index, state, source.name).run(kept)
    state.close()
    return settings, questions


def test_no_answerable_dev_question_is_refused_before_the_llm(dev_slice, use_embedder):
    settings, questions = dev_slice
    refused = {"answerable": [], "no_answer": []}
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        service = AnswerService.from_settings(settings, index)
        try:
            for q in questions:
                answer = asyncio.run(service.ask(q["question"], q["user_id"]))
                if answer.trace.outcome == "refused":
                    refused["no_answer" if q["type"] == "no_answer" else "answerable"].append(q["id"])
        finally:
            service.close()
    assert refused["answerable"] == [], refused
    # the names no note mentions (Flink, Ansible, Logstash, firewall-cmd, PowerJob, Gradle, XGBoost)
    assert {"A105", "A108", "B067", "B070", "B076", "B079", "B082"} <= set(refused["no_answer"]), refused
