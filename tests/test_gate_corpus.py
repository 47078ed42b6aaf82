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
