"""The pre-LLM gates on the shared corpus (skipped without it): no answerable dev question
is refused before the LLM, and the no_answer questions naming what no note mentions are. A slice keeps it fast
(``conftest.corpus_slice``, indexed once per run): every dev question's gold notes and as many other notes
of the same users, with the real default embedder."""

import asyncio

import pytest

from rag.index.note_index import NoteIndex
from bot.root import Parts

pytestmark = pytest.mark.slow  # the shared corpus's slice


def test_no_answerable_dev_question_is_refused_before_the_llm(corpus_slice, use_embedder):
    settings, questions = corpus_slice.settings, corpus_slice.questions
    refused = {"answerable": [], "no_answer": []}
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        service = Parts(settings, index=index).answers
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


def test_english_questions_are_not_refused_for_the_words_english_capitalises(corpus_slice, use_embedder):
    """The English dev questions (tests/data/dev_en*.jsonl, about the same notes): a possessive
    (Sentinel's, SPDY's), a place or people (Hunan, North Indian) is no name the Chinese notes
    would write in Latin script. One is still refused: "M-theory" (the note writes M 理论)."""
    import json
    from pathlib import Path

    data = Path(__file__).parent / "data"
    questions = [json.loads(line) for name in ("dev_en.jsonl", "dev_en2.jsonl", "no_answer_en.jsonl")
                 for line in open(data / name, encoding="utf-8")]
    refused = {"answerable": [], "no_answer": []}
    with NoteIndex.open(corpus_slice.settings, embedder=use_embedder) as index:
        service = Parts(corpus_slice.settings, index=index).answers
        try:
            for q in questions:
                answer = asyncio.run(service.ask(q["question"], q["user_id"]))
                if answer.trace.outcome == "refused":
                    refused["answerable" if q["gold_note_ids"] else "no_answer"].append(q["id"])
        finally:
            service.close()
    assert refused["answerable"] == ["B019-en"], refused
    assert {"A105-en", "A108-en", "B067-en", "B076-en", "B079-en", "B082-en"} <= set(refused["no_answer"]), refused
