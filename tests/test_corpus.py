"""On the shared corpus (skipped without it): a trashed note is never answered from,
and one user never sees another's notes. On a slice of the real backup, indexed once per run."""

import pytest

from rag.index.note_index import NoteIndex
from rag.index.retrieve import search

from conftest import USER_ONE

pytestmark = pytest.mark.slow  # the shared corpus's slice

USER_TWO = "5f38858837b4dcd92cefeb84"


def base_keywords(facts):
    """User two's keywords present before the change batch."""
    return [k for k in facts["user_two_only_keywords"] if k["where"] == "notes.jsonl"]


@pytest.fixture
def corpus_index(corpus_slice):
    """The slice of the real backup that ``conftest.corpus_slice`` indexes once per run: every
    trashed note, user two's keyword notes and some of user one's (and the gate tests' notes)."""
    return corpus_slice.settings, corpus_slice.facts, corpus_slice.summary


def test_trashed_notes_are_never_indexed(corpus_index):
    _, facts, summary = corpus_index
    assert summary.not_indexed == len(facts["trashed_in_base"])


def test_a_trashed_note_is_never_answered_from(corpus_index, use_embedder):
    settings, facts, _ = corpus_index
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        for t in facts["trashed_in_base"]:
            hits = search(index, t["keyword"], t["UserId"], k=20)
            assert all(h.note_id != t["NoteId"] for h in hits), t["keyword"]
            assert all(t["keyword"] not in h.text for h in hits), t["keyword"]


def test_one_user_never_sees_another_users_notes(corpus_index, use_embedder):
    settings, facts, _ = corpus_index
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        for k in base_keywords(facts):
            mine = search(index, k["keyword"], USER_TWO, k=5)
            assert any(h.note_id == k["NoteId"] for h in mine), k["keyword"]  # the owner finds it
            theirs = search(index, k["keyword"], USER_ONE, k=20)
            assert all(h.user_id == USER_ONE for h in theirs)
            assert all(h.note_id != k["NoteId"] for h in theirs)


def test_english_questions_find_their_chinese_notes(corpus_index, use_embedder):
    """The English versions of the dev questions (tests/data/dev_en.jsonl; their notes are in the
    slice): with the translation, BM25 finds the notes the question's words name in Chinese and
    hybrid finds the answering passage more often than without it (docs/performance.md has the
    whole corpus's figures)."""
    from pathlib import Path

    from rag.eval import evaluate, load_questions

    settings, _, _ = corpus_index
    questions = load_questions(Path(__file__).parent / "data" / "dev_en.jsonl")
    off = settings.retrieval.model_copy(update={"translate_english": False})
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        view = NoteIndex(settings.model_copy(update={"retrieval": off}), index.store, index.embedder, index.index_id)
        scores = {}
        for name, ix in (("on", index), ("off", view)):
            reports, _ = evaluate(lambda q, u, k, r, ix=ix: search(ix, q, u, k, retriever=r), questions,
                                  retrievers=("hybrid", "sparse"))
            scores[name] = {r.retriever: r.hit5 for r in reports}
    assert scores["on"]["sparse"] >= scores["off"]["sparse"] + 0.25, scores
    assert scores["on"]["hybrid"] >= scores["off"]["hybrid"] + 0.15, scores
    assert scores["on"]["hybrid"] >= 0.8, scores
