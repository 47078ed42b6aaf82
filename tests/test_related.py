"""Related notes (rag.memory.related): pairs from chunk vectors and shared rare entities, kept in the
memory with their reasons, recomputed after a sync pass only around the notes that changed."""

import json

from rag.memory import related
from bot.cli import main
from rag.index.note_index import NoteIndex
from rag.memory.store import MemoryStore
from sync.derived import chunk_vectors
from sync.state import State

from conftest import make_settings, run_pass

LOW = {"related_min_score": 0.5}


sync = run_pass  # one forced pass; its result (with .related, the notes recomputed)


def pairs(settings):
    with MemoryStore.open_for(settings) as store:
        return store.db.execute("SELECT note_a, note_b, user_id, score, reasons FROM related").fetchall()


def titles(settings):
    with MemoryStore.open_for(settings) as store:
        return dict(store.db.execute("SELECT title, note_id FROM notes"))


def test_related_pairs_follow_the_notes(tmp_path, notes_dir, use_embedder):
    # the 15 sample notes are on different topics: a lower threshold than the corpus's gives pairs to test
    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)}, memory=LOW)
    first = sync(settings, use_embedder)
    assert first.related == 15  # every note is new
    found = pairs(settings)
    assert found
    ids = titles(settings)
    min_score = settings.related_min_score
    for a, b, user, score, reasons in found:
        assert a != b and user == "local" and score >= min_score
        reasons = json.loads(reasons)
        assert "similarity" in reasons and "entities" in reasons
        p = reasons["passages"]
        assert p["chunk"] and p["other_chunk"] and p["snippet"] and p["other_snippet"]
    # notes that share a topic find each other
    with MemoryStore.open_for(settings) as store:
        pg = ids["PostgreSQL 连接池配置（SQLAlchemy）"]
        listed = store.related_of("local", pg)
        assert listed and all(n["note_id"] != pg for n in listed)
        assert set(listed[0]) == {"note_id", "title", "notebook", "url", "score", "reasons"}
        assert [n["score"] for n in listed] == sorted((n["score"] for n in listed), reverse=True)

    # nothing changed: nothing recomputed
    assert sync(settings, use_embedder).related == 0

    # one edit: that note and the notes whose pairs pointed at it, and only those
    before = {(a, b) for a, b, *_ in pairs(settings)}
    pointing = {a for a, b in before if b == pg}
    path = notes_dir / "编程" / "数据库" / "PostgreSQL连接池.md"
    path.write_text(path.read_text(encoding="utf-8") + "\n\n补充：连接池监控。\n", encoding="utf-8")
    edited = sync(settings, use_embedder)
    assert edited.related == len(pointing | {pg}) < 15

    # a deleted note's pairs go, on both sides
    (notes_dir / "编程" / "数据库" / "PostgreSQL连接池.md").unlink()
    sync(settings, use_embedder)
    assert not [p for p in pairs(settings) if pg in p[:2]]


def test_threshold_and_users(tmp_path, use_embedder):
    from conftest import index_samples

    settings = index_samples(tmp_path, use_embedder)
    state = State(settings.state_dir)
    try:
        with NoteIndex.open(settings, embedder=use_embedder) as index, MemoryStore.open_for(settings) as memory:
            # the sample notes entered the index without a memory: remember them as a sync would
            vectors_of = chunk_vectors(state)
            users = {n: "local" for n in index.store.note_ids("local")}
            for note_id in users:
                rec = state.note(note_id)
                memory.replace_note("local", note_id, rec.content_hash, [], info=_info(rec))
            memory.replace_note("other", "theirs", "h", [])  # another user's note: never a neighbour
            note = sorted(users)[0]
            low = related.compute(index.store, memory, "local", note, vectors_of(note), min_score=0.0)
            high = related.compute(index.store, memory, "local", note, vectors_of(note), min_score=0.8)
            assert low and all(r.note_id in users and r.note_id != note for r in low)
            assert all(r.score >= 0.8 for r in high) and len(high) <= len(low)
            assert related.compute(index.store, memory, "other", "theirs", vectors_of(note), min_score=0.0) == []
            related.store_pairs(index.store, memory, "local", note, low)
            assert memory.related_of("other", note) == [] and memory.related_of("local", note)
            # queued jobs: the note changed, plus the notes pointing at it
            assert memory.related_mark({note: "local"}) == 1 + len(low)
            done = related.refresh(index.store, memory, vectors_of)
            assert sorted(done.recomputed) == sorted({note} | {r.note_id for r in low})
            assert memory.related_jobs() == []
    finally:
        state.close()


def _info(rec):
    from rag.memory.rows import NoteInfo

    return NoteInfo(rec.title, rec.notebook, f"http://x/note/{rec.note_id}")


def test_cli_related_json(tmp_path, capsys, use_embedder):
    settings = make_settings(tmp_path, memory=LOW)
    sync(settings, use_embedder)
    ids = titles(settings)
    pg = ids["PostgreSQL 连接池配置（SQLAlchemy）"]
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"source: {{kind: files, path: {tmp_path}}}\nstate_dir: {settings.state_dir}\n"
                   "memory: {related_min_score: 0.5}\n")

    assert main(["--config", str(cfg), "related", pg, "--json", "-k", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["note_id"] == pg and 0 < len(out["notes"]) <= 3
    for n in out["notes"]:
        assert {"note_id", "title", "notebook", "url", "score", "reasons"} <= set(n) and n["note_id"] != pg

    assert main(["--config", str(cfg), "related", "数据库连接池怎么配置", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["query"] == "数据库连接池怎么配置" and out["notes"]
    assert pg in [n["note_id"] for n in out["notes"]]
    assert all({"note_id", "title", "notebook", "url", "score", "reasons"} <= set(n) for n in out["notes"])


def test_related_finds_a_note_by_the_words_of_its_title(tmp_path, notes_dir, use_embedder, capsys):
    """`related 溏心蛋` worked only as a note id: the words of one note's title name it too;
    words several titles hold (or none) are a question."""
    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)}, memory=LOW)
    sync(settings, use_embedder)
    ids = titles(settings)
    pg = ids["PostgreSQL 连接池配置（SQLAlchemy）"]
    with MemoryStore.open_for(settings) as store:
        assert related.note_named(store, "local", "PostgreSQL 连接池配置（SQLAlchemy）")["note_id"] == pg  # whole
        assert related.note_named(store, "local", "连接池配置")["note_id"] == pg  # the words of one title
        assert related.note_named(store, "local", pg)["note_id"] == pg  # the id, as before
        assert related.note_named(store, "local", "怎么配置数据库连接") is None  # a question
        by_id = store.related_of("local", pg)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"source: {{kind: files, path: '{notes_dir}'}}\nstate_dir: {settings.state_dir}\n"
                   "memory: {related_min_score: 0.5}\n")
    assert main(["--config", str(cfg), "related", "连接池配置", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["note_id"] == pg and [n["note_id"] for n in out["notes"]] == [n["note_id"] for n in by_id]
