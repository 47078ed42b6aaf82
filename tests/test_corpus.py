"""On the shared corpus (skipped without it): a trashed note is never answered from,
and one user never sees another's notes. Indexes a slice of the real backup to stay fast."""

import json

import pytest

from rag.index.note_index import NoteIndex
from rag.model import Note
from rag.index.retrieve import search
from sync.indexer import Indexer
from sync.sources.mongodump import MongodumpSource
from sync.state import State

from conftest import make_settings

USER_ONE = "5dbed2987db161bc2a85b919"
USER_TWO = "5f38858837b4dcd92cefeb84"


def base_keywords(facts):
    """User two's keywords present before the change batch."""
    return [k for k in facts["user_two_only_keywords"] if k["where"] == "notes.jsonl"]


@pytest.fixture(scope="module")
def corpus_index(tmp_path_factory, use_embedder):
    from conftest import SHARED

    if not (SHARED / "corpus" / "notes.jsonl").exists():
        pytest.skip(f"shared material not found at {SHARED}")
    facts = json.loads((SHARED / "corpus" / "facts.json").read_text(encoding="utf-8"))
    tmp = tmp_path_factory.mktemp("corpus")
    archive = SHARED / "corpus" / "mongodump" / "backup_leanote_20250601.tar.gz"
    settings = make_settings(tmp, source={"kind": "mongodump", "path": str(archive)})
    trashed = {t["NoteId"] for t in facts["trashed_in_base"]}
    leak_notes = {k["NoteId"] for k in base_keywords(facts)}
    source = MongodumpSource(archive, settings.state_dir)
    # A slice: every trashed note, user two's keyword notes, and some of user one's notes.
    kept, n_one = [], 0
    for item in source.notes():
        if not isinstance(item, Note):
            continue
        if item.id in trashed or item.id in leak_notes:
            kept.append(item)
        elif item.user_id == USER_ONE and n_one < 25:
            kept.append(item)
            n_one += 1
    state = State(settings.state_dir)
    with NoteIndex.open(settings, create=True, embedder=use_embedder) as index:
        summary = Indexer(index, state, source.name).run(kept)
    state.close()
    return settings, facts, summary


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
