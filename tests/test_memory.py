"""The memory's no-LLM tier: entities extracted from a note, kept in SQLite beside the
index, following the note through edits, deletes and privacy rules; the CLI doors."""

import json
import shutil
import sqlite3

import pytest

from rag.memory import entities as ex
from bot.cli import main
from rag.index.note_index import NoteIndex
from rag.memory.rows import Mention, NoteInfo
from rag.memory.schema import MIGRATIONS
from rag.memory.store import MemoryStore, path_for
from rag.model import Note

from conftest import EXAMPLES, make_settings, run_pass

# --- extraction ---------------------------------------------------------------------------

ZH = """## 连接池配置

事故之后把 `pool_size` 调到了 20，`max_overflow` 保持 10。详见 [SQLAlchemy 文档](https://docs.sqlalchemy.org/pool)。

```python
engine = create_engine(url, pool_size=20)
QueuePool.recycle(engine)
```

```bash
$ journalctl -u nginx --since today
```

连接池的大小要和数据库的 max_connections 一起算，2024 年 3 月那次事故就是连接池打满。
"""

EN = """# Reading logs

Use `journalctl -f` to follow the journal. The `SystemdJournal.reader` helper wraps it.

See [the systemd manual](https://example.org/man) for filters. Logs rotate weekly; 42 rotations are kept.
"""


def spans_hold_the_text(text, entity):
    return all(text[s.start:s.end].lower() == entity.name.lower() for s in entity.spans)


def test_code_identifiers_headings_links_and_tags_with_their_spans():
    found = ex.extract(ZH, title="PostgreSQL 连接池", tag_names=["数据库", " 数据库 ", "postgres"])
    by_kind = {}
    for e in found.entities:
        by_kind.setdefault(e.kind, {})[e.name] = e
    code = by_kind["code"]
    assert {"pool_size", "max_overflow", "create_engine", "QueuePool.recycle", "journalctl"} <= set(code)
    assert "engine" not in code and "url" not in code  # plain words are not identifiers
    assert "max_connections" not in code  # prose, not code: a term
    for e in code.values():
        assert spans_hold_the_text(ZH, e), e
    assert len(code["pool_size"].spans) == 2  # inline and in the fence
    assert set(by_kind["heading"]) == {"连接池配置"}
    assert spans_hold_the_text(ZH, by_kind["heading"]["连接池配置"])
    assert set(by_kind["link"]) == {"SQLAlchemy 文档"}
    assert spans_hold_the_text(ZH, by_kind["link"]["SQLAlchemy 文档"])
    assert set(by_kind["tag"]) == {"数据库", "postgres"}  # one per name, no spans
    assert all(not e.spans for e in by_kind["tag"].values())


def test_terms_are_words_of_the_prose_with_spans():
    found = ex.extract(ZH)
    terms = {e.name: e for e in found.entities if e.kind == "term"}
    assert "连接池" in terms and "max_connections" in terms
    assert len(terms) <= ex.MAX_TERMS
    for name, e in terms.items():
        assert spans_hold_the_text(ZH, e)
        assert not name.isdigit()
        if ex._CJK_RUN.fullmatch(name):
            assert len(name) >= 2
        else:
            assert sum(ch.isalpha() for ch in name) >= 3
    # code, URLs and link targets are not prose
    assert not {"engine", "recycle", "docs", "sqlalchemy.org", "nginx"} & set(found.terms)
    assert "的" not in found.terms and "2024" not in found.terms


def test_english_terms_drop_stopwords_and_numbers():
    found = ex.extract(EN)
    names = {e.name: e.kind for e in found.entities}
    assert names.get("journalctl") == "code" and names.get("SystemdJournal.reader") == "code"
    assert names.get("the systemd manual") == "link" and names.get("Reading logs") == "heading"
    assert {"journal", "logs", "rotate"} <= found.terms
    assert not {"the", "use", "42", "for"} & found.terms


def test_rare_terms_outrank_common_ones_once_there_are_enough_notes():
    text = "缓存 缓存 缓存 服务 服务 服务 灰度"
    spans = ex.term_spans(text)
    no_idf = [e.name for e in ex.distinctive_terms(spans, {}, 0)]
    assert no_idf[:2] == ["缓存", "服务"]  # tf alone, first place breaks ties
    common = {"缓存": 40, "服务": 40}  # in 40 of the person's 50 other notes
    with_idf = [e.name for e in ex.distinctive_terms(spans, common, 50)]
    assert with_idf[0] == "灰度"
    many = " ".join(f"word{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(40))
    assert len(ex.distinctive_terms(ex.term_spans(many), {}, 0)) == ex.MAX_TERMS


def test_text_of_chunks_keeps_offsets():
    from rag.index.chunk import chunk_text
    from rag.config import ChunkingConfig

    text = ZH * 6
    chunks = chunk_text(text, ChunkingConfig())
    rebuilt = ex.text_of(chunks)
    assert len(chunks) > 1
    assert all(rebuilt[c.char_start:c.char_end] == text[c.char_start:c.char_end] for c in chunks)


# --- the store ----------------------------------------------------------------------------


def ent(name, kind, *spans):
    return ex.Entity(name, kind, [ex.Span(a, b) for a, b in spans])


def rows(store, table, note_id=None):
    sql = f"SELECT COUNT(*) FROM {table}" + (" WHERE note_id = ?" if note_id else "")
    return store.db.execute(sql, (note_id,) if note_id else ()).fetchone()[0]


def test_store_lifecycle_and_user_scoping(tmp_path):
    store = MemoryStore(tmp_path / "memory.sqlite")
    m = [Mention("p1", 0, 3, "foo")]
    store.replace_note("u1", "n1", "h1", [(ent("Redis", "term"), m), (ent("pool_size", "code"), m)],
                       terms=["redis", "缓存"], info=NoteInfo("Note one", "书", "http://x/note/n1"))
    store.replace_note("u1", "n2", "h2", [(ent("redis", "term"), m * 2)], terms=["redis"])
    store.replace_note("u2", "n3", "h3", [(ent("Secret", "term"), m), (ent("Redis", "term"), m)], terms=["redis"])
    assert store.known("n1") == "h1" and store.known("nope") is None
    assert store.users() == {"u1": 2, "u2": 1}
    top = store.entities("u1")
    assert top[0] == {"name": "Redis", "kind": "term", "notes": 2, "mentions": 3}
    assert {e["name"] for e in store.entities("u1")} == {"Redis", "pool_size"}
    assert {e["name"] for e in store.entities("u2")} == {"Secret", "Redis"}
    assert store.entities("u1", top=1) == top[:1]
    notes = store.entity("u1", "REDIS")
    assert [n["note_id"] for n in notes] == ["n2", "n1"]  # the most mentions first
    assert notes[1]["title"] == "Note one" and notes[1]["url"] == "http://x/note/n1"
    assert notes[1]["mentions"][0] == {"name": "Redis", "kind": "term", "point_id": "p1", "char_start": 0,
                                       "char_end": 3, "snippet": "foo"}
    assert store.entity("u1", "secret") == [] and store.notes_for("u1", ["secret"]) == []
    assert store.notes_for("u1", ["redis", "pool_size"]) == [("n1", ["pool_size", "redis"]), ("n2", ["redis"])]
    assert store.term_stats("u1", "n1", ["redis", "缓存"]) == ({"redis": 1}, 1)  # n1 itself left out
    assert store.term_stats("u2", "n9", ["redis"]) == ({"redis": 1}, 1)

    # an edit: old mentions go, entities nobody mentions go, df follows
    store.replace_note("u1", "n1", "h1b", [(ent("Kafka", "term"), m)], terms=["kafka"])
    assert {e["name"] for e in store.entities("u1")} == {"Redis", "Kafka"}  # pool_size went
    assert store.db.execute("SELECT COUNT(*) FROM entities WHERE norm = 'pool_size'").fetchone()[0] == 0
    assert store.term_stats("u1", "x", ["redis", "缓存", "kafka"]) == ({"redis": 1, "kafka": 1}, 2)

    # everything derived from a note goes with it
    store.db.execute("INSERT INTO facts(user_id, subject, predicate, object, quote, note_id, origin, created) "
                     "VALUES ('u1', 'a', 'b', 'c', 'q', 'n2', 'llm', 0)")
    store.db.execute("INSERT INTO related(user_id, note_a, note_b, score, computed_at) VALUES ('u1', 'n1', 'n2', 1, 0)")
    store.db.execute("INSERT INTO jobs(note_id, kind, user_id, content_hash, next_try, created) "
                     "VALUES ('n2', 'llm', 'u1', 'h2', 0, 0)")
    store.remove_note("n2")
    for table in ("notes", "mentions", "facts", "jobs"):
        assert rows(store, table, "n2") == 0, table
    assert rows(store, "related") == 0
    assert {e["name"] for e in store.entities("u1")} == {"Kafka"}
    assert {e["name"] for e in store.entities("u2")} == {"Secret", "Redis"}  # the other user's untouched
    assert store.term_stats("u1", "x", ["redis"]) == ({}, 1)
    store.remove_note("n1")
    store.remove_note("n1")  # twice is harmless
    assert store.entities("u1") == [] and rows(store, "df") == 1  # u2's redis
    store.close()

    # the schema has a version; opening again migrates nothing
    again = MemoryStore(tmp_path / "memory.sqlite")
    assert again.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert again.users() == {"u2": 1}
    again.close()


def test_a_broken_file_says_what_to_do(tmp_path):
    from rag.errors import BrokenState

    (tmp_path / "memory.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(BrokenState, match="Move it aside"):
        MemoryStore(tmp_path / "memory.sqlite")


def test_remember_a_prepared_note_and_its_retag(tmp_path, settings_factory):
    settings = settings_factory()
    index = NoteIndex(settings, store=None, embedder=type("E", (), {"model_id": "x", "dim": 3})(), index_id="i")
    store = MemoryStore(tmp_path / "m.sqlite")
    note = Note("n1", "u1", "PostgreSQL 连接池", ZH, tags=("数据库",), notebook_path="编程")
    prepared = index.prepare(note)
    assert store.remember(prepared, "http://leanote") > 5
    notes = store.entity("u1", "pool_size")
    assert notes[0]["url"] == "http://leanote/note/n1" and notes[0]["notebook"] == "编程"
    points = {pc.point_id for pc in prepared.chunks}
    for m in notes[0]["mentions"]:
        assert m["point_id"] in points and "pool_size" in m["snippet"]
    store.remember_meta(Note("n1", "u1", "PostgreSQL 连接池", ZH, tags=("运维",), notebook_path="归档"), "http://leanote")
    assert store.entity("u1", "数据库") == [] or all(m["kind"] != "tag" for n in store.entity("u1", "数据库")
                                                     for m in n["mentions"])
    assert store.entity("u1", "运维")[0]["notebook"] == "归档"
    assert store.entity("u1", "pool_size")  # the text's entities stay
    store.close()


# --- through the sync -----------------------------------------------------------------------


def sync(settings, embedder):
    return run_pass(settings, embedder).summary


def snapshot(settings):
    db = sqlite3.connect(path_for(settings))
    try:
        return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in ("notes", "entities", "mentions", "df")}
    finally:
        db.close()


def memory_of(settings):
    return MemoryStore.open_for(settings)


def note_ids(store, user="local"):
    return {n for n, in store.db.execute("SELECT note_id FROM notes WHERE user_id = ?", (user,))}


def test_the_memory_follows_the_notes(tmp_path, notes_dir, use_embedder):
    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)})
    sync(settings, use_embedder)
    with memory_of(settings) as store:
        assert len(note_ids(store)) == 15
        names = {e["name"] for e in store.entities("local")}
        assert {"journalctl", "retry_count", "pool_size"} <= names
        pool = store.entity("local", "pool_size")
        assert [n["title"] for n in pool] == ["PostgreSQL 连接池配置（SQLAlchemy）"]
        pg_id = pool[0]["note_id"]
    before = snapshot(settings)

    sync(settings, use_embedder)  # nothing changed: nothing written
    assert snapshot(settings) == before

    # an edit: the new identifier comes, the one no longer written goes
    path = notes_dir / "编程" / "数据库" / "PostgreSQL连接池.md"
    path.write_text(path.read_text(encoding="utf-8").replace("pool_size", "pool_capacity"), encoding="utf-8")
    sync(settings, use_embedder)
    with memory_of(settings) as store:
        assert store.entity("local", "pool_size") == []
        assert [n["note_id"] for n in store.entity("local", "pool_capacity")] == [pg_id]

    # a deleted file takes its entities with it
    (notes_dir / "English" / "Reading systemd journal logs.md").unlink()
    sync(settings, use_embedder)
    with memory_of(settings) as store:
        assert store.entity("local", "journalctl") == []
        assert len(note_ids(store)) == 14

    # a notebook made private: its notes leave the memory as they leave the index
    private = make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)},
                            exclude={"notebooks": ["数据库"]})
    sync(private, use_embedder)
    with memory_of(private) as store:
        assert store.entity("local", "pool_capacity") == []
        assert pg_id not in note_ids(store) and len(note_ids(store)) == 12
        assert store.db.execute("SELECT COUNT(*) FROM mentions WHERE note_id = ?", (pg_id,)).fetchone()[0] == 0


def test_memory_turned_on_later_catches_up_and_off_means_no_file(tmp_path, use_embedder):
    off = make_settings(tmp_path, memory={"enabled": False})
    sync(off, use_embedder)
    assert not path_for(off).exists()
    on = make_settings(tmp_path)
    summary = sync(on, use_embedder)
    assert summary.chunks_embedded == 0 and summary.added == 0  # the index did nothing again
    with memory_of(on) as store:
        assert len(note_ids(store)) == 15


# --- the CLI ------------------------------------------------------------------------------


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_entities_and_memory(tmp_path, capsys, use_embedder):
    settings = make_settings(tmp_path)
    sync(settings, use_embedder)
    with memory_of(settings) as store:  # a second user's note beside the sample notes
        store.replace_note("other", "o1", "h", [(ent("journalctl", "code"), [Mention(None, 0, 10, "secret")]),
                                                (ent("only_theirs", "code"), [])])
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"source: {{kind: files, path: {tmp_path}}}\nstate_dir: {settings.state_dir}\n")

    code, _, err = run(capsys, "--config", str(cfg), "entities")
    assert code == 2 and "--user" in err  # two users: which one

    code, out, _ = run(capsys, "--config", str(cfg), "entities", "--user", "local", "--json", "--top", "5")
    assert code == 0
    result = json.loads(out)
    assert result["user_id"] == "local" and len(result["entities"]) == 5
    assert set(result["entities"][0]) == {"name", "kind", "notes", "mentions"}
    code, out, _ = run(capsys, "--config", str(cfg), "entities", "--user", "local", "--json", "--top", "1000")
    assert "only_theirs" not in {e["name"] for e in json.loads(out)["entities"]}

    code, out, _ = run(capsys, "--config", str(cfg), "memory", "journalctl", "--user", "local", "--json")
    assert code == 0
    result = json.loads(out)
    assert [n["title"] for n in result["notes"]] == ["Reading systemd journal logs"]
    hit = result["notes"][0]
    assert {"note_id", "title", "notebook", "url", "score", "mentions"} <= set(hit)
    assert all("secret" != m["snippet"] for m in hit["mentions"])
    assert any("journalctl" in m["snippet"] for m in hit["mentions"])

    code, out, err = run(capsys, "--config", str(cfg), "memory", "journalctl", "--user", "other", "--json")
    # not local's note; and not o1 either: the memory holds it, the index does not (never named)
    assert code == 2 and "holds no notes of user 'other'" in err and "o1" not in out + err
    code, out, _ = run(capsys, "--config", str(cfg), "memory", "journalctl", "--user", "local")
    assert code == 0 and "Reading systemd journal logs" in out

    cfg.write_text(f"source: {{kind: files, path: {tmp_path}}}\nstate_dir: {tmp_path / 'empty'}\n")
    code, _, err = run(capsys, "--config", str(cfg), "entities")
    assert code == 2 and "leanote-rag index" in err


def test_a_rebuild_forgets_what_the_memory_derived_and_builds_it_again(tmp_path, use_embedder):
    """`index --rebuild` starts the index over: the memory too, from the notes as they are now."""
    notes = tmp_path / "notes"
    shutil.copytree(EXAMPLES, notes)
    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes)}, rerank={"kind": "none"})
    run_pass(settings, use_embedder)
    with MemoryStore.open_for(settings) as memory:
        before = memory.counts("local")["notes"]
    gone = next(notes.rglob("*.md"))
    gone.unlink()
    with MemoryStore.open_for(settings) as memory:  # a row the next pass would not see go
        memory.replace_note("local", "stale", "x", [])
    run_pass(settings, use_embedder, rebuild=True)
    with MemoryStore.open_for(settings) as memory:
        after = memory.counts("local")["notes"]
        assert memory.known("stale") is None
    assert sum(after.values()) == sum(before.values()) - 1


def test_a_snapshot_pass_makes_the_notes_searchable_first_and_one_that_fails_still_remembers_what_it_committed(
        tmp_path, notes_dir, use_embedder, monkeypatch):
    """The memory's part of a snapshot pass comes after every note is in the index (the summary
    says when that was); when the source fails halfway, the notes already committed get their
    entities in that same pass, not only in the next one."""
    from contextlib import closing

    from sync import indexer as indexer_mod
    from bot.root import Parts
    from sync.sources import Known
    from sync.state import State

    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)}, memory={"llm": "off"})
    result = run_pass(settings, use_embedder)
    summary = result.summary
    assert 0 < summary.searchable_seconds <= summary.seconds
    with memory_of(settings) as store:
        assert {"journalctl", "retry_count", "pool_size"} <= {e["name"] for e in store.entities("local")}

    # a source that breaks after its first notes, each committed on its own (a small batch)
    monkeypatch.setattr(indexer_mod, "BATCH_CHUNKS", 1)
    other = make_settings(tmp_path / "again", source={"kind": "files", "path": str(notes_dir)}, memory={"llm": "off"})
    state = State(other.state_dir)
    try:
        with NoteIndex.open(other, create=True, embedder=use_embedder) as index:
            parts = Parts(other, index=index, state=state)
            indexer = indexer_mod.Indexer(index, state, parts.sync.source.name, derived=parts.derived, settings=other)
            read: list[str] = []

            def breaking(items):
                for item in items:
                    if len(read) == 3:
                        raise OSError("the share went away")
                    read.append(item.id)
                    yield item

            with closing(parts.sync.source.notes(Known())) as items, pytest.raises(OSError, match="went away"):
                indexer.run(breaking(items))
            assert set(state.indexed_notes()) == set(read)  # searchable: their rows committed as they went
            parts.sync.close()
    finally:
        state.close()
    with memory_of(other) as store:
        assert set(note_ids(store)) == set(read)  # the three committed notes, remembered in the failing pass
