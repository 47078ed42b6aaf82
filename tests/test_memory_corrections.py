"""Corrections of the memory: a rejected fact or related pair is a
tombstone keyed by content that re-extraction never revives, a confirmed one is marked, each
verdict has a history, they are per Leanote user, and they travel as JSON (export, import).
The LLM is the fake Ollama; the CLI is driven through ``main``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rag import config as config_mod
from rag.answer.service import AnswerService
from rag.index.note_index import NoteIndex
from rag.model import Note
from bot.cli import main
from rag.llm import OllamaChat
from rag.errors import UserError
from rag.memory.rows import NoteInfo, correction_id, correction_target
from rag.memory.store import MemoryStore
from sync.memory_jobs import MemoryJobs

from conftest import THREADS
from test_memory_llm import ATLAS_PG, ATLAS_SQLITE, POSTGRES, POSTGRES_2025, Clock, add_note, run

from fakes.ollama import FakeOllama


@pytest.fixture
def world(tmp_path, settings_factory):
    """The memory, the fake Ollama and the LLM tier's worker on a fake clock (as in test_memory_llm)."""
    with FakeOllama() as fake:
        settings = settings_factory(ollama={"host": fake.url, "timeout": 10}, answer={"first_token_budget": 5}, memory={"llm": "on"})
        clock = Clock()
        store = MemoryStore(tmp_path / "memory.sqlite", clock=clock)
        answers = AnswerService(settings, index=None, chat=OllamaChat(settings.ollama))
        jobs = MemoryJobs(settings, lambda: store, answers, clock=clock, poll=0.01, quiet=0.0)
        try:
            yield SimpleNamespace(settings=settings, clock=clock, store=store, answers=answers, jobs=jobs, fake=fake)
        finally:
            answers.close()
            store.close()


def fact_id(store, user, obj, subject="Atlas"):
    [f] = [f for f in store.facts_about(user, subject) if f["object"] == obj]
    return f["fact_id"]


def put_note(store, user, note_id, title, content_hash="h"):
    store.replace_note(user, note_id, content_hash, [],
                       info=NoteInfo(title, "nb", f"http://leanote/note/{note_id}", "2024-01-02"))


def put_facts(store, user, note_id, facts, updated=100.0, content_hash="h"):
    """What the LLM tier stores for the note, without the LLM."""
    rows = [{"subject": s, "predicate": p, "object": o, "quote": q, "char_start": 0, "char_end": len(q)}
            for s, p, o, q in facts]
    assert store.store_llm({"note_id": note_id, "user_id": user, "content_hash": content_hash, "updated": updated},
                           "", rows, {})


PG = ("Atlas", "uses database", "PostgreSQL", "换成了 PostgreSQL")
POOL = ("Atlas", "uses pooler", "pgbouncer", "连接池用 pgbouncer")


# --- facts ---------------------------------------------------------------------------------


def test_a_rejected_fact_stays_rejected_after_the_note_is_edited_and_re_extracted(world):
    w = world
    add_note(w, "n1", POSTGRES, updated=100.0)
    w.fake.reply_structured(ATLAS_PG)
    assert run(w.jobs.step())
    pg = fact_id(w.store, "u1", "PostgreSQL")
    done = w.store.correct("u1", pg, "rejected")
    assert done["changed"] and done["removed"] == 1 and done["object"] == "PostgreSQL"
    assert [f["object"] for f in w.store.facts_about("u1", "Atlas")] == ["pgbouncer"]

    # the note is edited; the LLM states the same relation again (another case and spacing too)
    add_note(w, "n1", POSTGRES + "\n补充：监控。", updated=150.0, content_hash="h-edited")
    w.fake.reply_structured(ATLAS_PG.replace('"uses database"', '"Uses  Database"'))
    assert run(w.jobs.step())
    assert {f["object"] for f in w.store.facts("u1")} == {"pgbouncer"}
    # the id is stable: it still names the rejected fact, and rejecting again changes nothing
    assert w.store.correct("u1", pg, "rejected")["changed"] is False
    h = w.store.correction_history("u1", pg)
    assert h["verdict"] == "rejected" and [e["verdict"] for e in h["log"]] == ["rejected"] and h["rows"] == []

    # confirming lifts the tombstone: the next extraction brings the fact back, marked confirmed
    assert w.store.correct("u1", pg, "confirmed")["changed"]
    add_note(w, "n1", POSTGRES, updated=160.0, content_hash="h-again")
    w.fake.reply_structured(ATLAS_PG)
    assert run(w.jobs.step())
    [back] = [f for f in w.store.facts_about("u1", "PostgreSQL")]
    assert back["fact_id"] == pg and back["confirmed"] and back["status"] == "active"


def test_confirm_and_history_with_supersession_and_sources(world):
    w = world
    add_note(w, "old", POSTGRES, updated=100.0)
    w.fake.reply_structured(ATLAS_PG)
    assert run(w.jobs.step())
    pg = fact_id(w.store, "u1", "PostgreSQL")
    assert w.store.correct("u1", pg, "confirmed", by="telegram")["changed"]
    # a newer note states another object: the confirmed fact is superseded, and shown so
    add_note(w, "new", POSTGRES_2025, updated=200.0)
    w.fake.reply_structured(ATLAS_SQLITE)
    assert run(w.jobs.step())
    facts = {f["object"]: f for f in w.store.facts_about("u1", "Atlas")}
    assert facts["PostgreSQL"]["confirmed"] and facts["PostgreSQL"]["status"] == "superseded"
    assert facts["PostgreSQL"]["superseded_by_note"] == "new" and not facts["SQLite"]["confirmed"]
    assert facts["PostgreSQL"]["quote"] == "把项目 Atlas 的数据库从 MySQL 换成了 PostgreSQL"

    h = w.store.correction_history("u1", pg)
    assert h["verdict"] == "confirmed" and h["log"][0]["by"] == "telegram"
    assert [(f["object"], f["status"], f["note_id"]) for f in h["supersession"]] == [
        ("SQLite", "active", "new"), ("PostgreSQL", "superseded", "old")]
    # rejecting the newer statement: it goes, the older one is the newest again
    sqlite = fact_id(w.store, "u1", "SQLite")
    w.store.correct("u1", sqlite, "rejected")
    assert [(f["object"], f["status"]) for f in w.store.facts_about("u1", "Atlas") if f["predicate"] == "uses database"] \
        == [("PostgreSQL", "active")]
    w.store.correct("u1", pg, "rejected")
    assert [e["verdict"] for e in w.store.correction_history("u1", pg)["log"]] == ["confirmed", "rejected"]


# --- related pairs -------------------------------------------------------------------------


def test_a_rejected_pair_is_not_recreated_by_a_recompute(tmp_path):
    with MemoryStore(tmp_path / "memory.sqlite") as store:
        for n in "abc":
            put_note(store, "u1", n, f"note {n}")
        store.replace_related("u1", "a", [("b", 0.9, {}, {}), ("c", 0.8, {}, {})])
        pair = correction_id("u1", "pair", correction_target("pair", "b", "a"))
        assert pair == correction_id("u1", "pair", correction_target("pair", "a", "b"))  # either order
        done = store.correct("u1", pair, "rejected")
        assert done["removed"] == 2 and done["notes"] == ["a", "b"]
        assert [n["note_id"] for n in store.related_of("u1", "a")] == ["c"] and store.related_of("u1", "b") == []
        # recomputed from either side: still gone
        store.replace_related("u1", "a", [("b", 0.95, {}, {}), ("c", 0.8, {}, {})])
        store.replace_related("u1", "b", [("a", 0.95, {}, {})])
        assert [n["note_id"] for n in store.related_of("u1", "a")] == ["c"] and store.related_of("u1", "b") == []
        other = correction_id("u1", "pair", correction_target("pair", "a", "c"))
        assert store.correct("u1", other, "confirmed")["removed"] == 0
        h = store.correction_history("u1", other)
        assert h["verdict"] == "confirmed" and len(h["rows"]) == 1 and h["notes"][1]["title"] == "note c"


# --- users, export, import -----------------------------------------------------------------


def test_ids_are_per_user(tmp_path):
    with MemoryStore(tmp_path / "memory.sqlite") as store:
        put_note(store, "u1", "n1", "Atlas")
        put_note(store, "u2", "n2", "Atlas too")
        put_facts(store, "u1", "n1", [PG])
        put_facts(store, "u2", "n2", [PG])  # the same fact in another user's notes: another id
        mine, theirs = fact_id(store, "u1", "PostgreSQL"), fact_id(store, "u2", "PostgreSQL")
        assert mine != theirs
        with pytest.raises(UserError, match="no fact .* of user u2"):
            store.correct("u2", mine, "rejected")
        with pytest.raises(UserError, match="not a fact or pair id"):
            store.correct("u1", "42", "rejected")
        store.correct("u1", mine, "rejected")
        assert store.facts_about("u1", "Atlas") == [] and len(store.facts_about("u2", "Atlas")) == 1
        assert store.export_corrections("u2")["corrections"] == []
        with pytest.raises(UserError, match="of user u2"):
            store.correction_history("u2", mine)


def test_export_then_import_into_a_fresh_memory_applies_the_same_tombstones(tmp_path):
    with MemoryStore(tmp_path / "one.sqlite") as one:
        for n in "ab":
            put_note(one, "u1", n, n)
        put_facts(one, "u1", "a", [PG, POOL])
        one.replace_related("u1", "a", [("b", 0.9, {}, {})])
        one.correct("u1", fact_id(one, "u1", "PostgreSQL"), "rejected")
        one.correct("u1", fact_id(one, "u1", "pgbouncer"), "confirmed")
        one.correct("u1", correction_id("u1", "pair", correction_target("pair", "a", "b")), "rejected")
        exported = json.loads(json.dumps(one.export_corrections()))
    assert exported["version"] == 1 and len(exported["corrections"]) == 3
    assert {c["kind"] for c in exported["corrections"]} == {"fact", "pair"}

    with MemoryStore(tmp_path / "two.sqlite") as two:
        with pytest.raises(UserError, match="correction 1: verdict"):
            two.import_corrections({"version": 1, "corrections": [{**exported["corrections"][0], "verdict": "maybe"},
                                                                   exported["corrections"][1]]})
        assert two.export_corrections()["corrections"] == []  # nothing applied
        first = two.import_corrections(exported)
        assert (first["records"], first["applied"], first["unchanged"]) == (3, 3, 0)
        again = two.import_corrections(exported)
        assert (again["applied"], again["unchanged"]) == (0, 3)
        for n in "ab":
            put_note(two, "u1", n, n)
        put_facts(two, "u1", "a", [PG, POOL])
        two.replace_related("u1", "a", [("b", 0.9, {}, {})])
        facts = two.facts_about("u1", "Atlas")
        assert [(f["object"], f["confirmed"]) for f in facts] == [("pgbouncer", True)]
        assert two.related_of("u1", "a") == []


# --- the CLI --------------------------------------------------------------------------------


@pytest.fixture
def cli_world(tmp_path, capsys, use_embedder):
    state = tmp_path / "state"
    state.mkdir()
    with MemoryStore(state / "memory.sqlite") as store:
        for n in "ab":
            put_note(store, "u1", n, f"note {n}")
        put_note(store, "u2", "z", "theirs")
        put_facts(store, "u1", "a", [PG, POOL])
        store.replace_related("u1", "a", [("b", 0.9, {"entities": []}, {"entities": []})])
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"source: {{kind: files, path: {tmp_path}}}\nstate_dir: {state}\nembedder: {{threads: {THREADS}}}\n")
    # the index holds the notes the memory names (the CLI names no note the index does not hold)
    with NoteIndex.open(config_mod.load(cfg), create=True, embedder=use_embedder) as index:
        for user, note_id, title in (("u1", "a", "note a"), ("u1", "b", "note b"), ("u2", "z", "theirs")):
            prepared = index.prepare(Note(note_id, user, title, f"# {title}\n\nAtlas 换成了 PostgreSQL，连接池用 pgbouncer。"))
            index.write(prepared, index.embed([c.embed_text for c in prepared.chunks]))

    def cli(*args):
        code = main(["--config", str(cfg), *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return cli


def test_cli_memory_entity_shows_facts_and_corrections_work(cli_world, tmp_path):
    cli = cli_world
    code, out, _ = cli("memory", "Atlas", "--user", "u1", "--json")  # `memory ENTITY` as before
    assert code == 0
    shown = json.loads(out)
    assert shown["entity"] == "Atlas" and shown["notes"] == []
    facts = {f["object"]: f for f in shown["facts"]}
    pg = facts["PostgreSQL"]
    assert pg["quote"] == PG[3] and pg["title"] == "note a" and pg["url"] == "http://leanote/note/a"
    assert pg["status"] == "active" and pg["confirmed"] is False and pg["time"] == 100.0
    code, out, _ = cli("memory", "show", "PostgreSQL", "--user", "u1")
    assert code == 0 and pg["fact_id"] in out and "换成了 PostgreSQL" in out and "note a" in out

    code, out, _ = cli("memory", "reject", pg["fact_id"], "--user", "u1", "--json")
    assert code == 0 and json.loads(out)["removed"] == 1 and json.loads(out)["verdict"] == "rejected"
    code, out, _ = cli("memory", "confirm", facts["pgbouncer"]["fact_id"], "--user", "u1")
    assert code == 0 and "confirmed" in out
    code, out, _ = cli("memory", "history", pg["fact_id"], "--user", "u1", "--json")
    h = json.loads(out)
    assert code == 0 and h["verdict"] == "rejected" and h["log"][0]["by"] == "cli" and h["subject"] == "Atlas"
    code, out, _ = cli("memory", "history", pg["fact_id"], "--user", "u1")
    assert code == 0 and "rejected by cli" in out

    # pairs: `related NOTE` shows their ids
    code, out, _ = cli("related", "a", "--user", "u1", "--json")
    [pair] = json.loads(out)["notes"]
    code, out, _ = cli("memory", "reject", pair["pair_id"], "--user", "u1")
    assert code == 0 and "rejected" in out
    code, out, _ = cli("related", "a", "--user", "u1", "--json")
    assert json.loads(out)["notes"] == []

    # export, import (idempotent), bad input
    code, out, _ = cli("memory", "export", "--user", "u1")
    exported = json.loads(out)
    assert code == 0 and len(exported["corrections"]) == 3
    path = tmp_path / "corrections.json"
    path.write_text(out, encoding="utf-8")
    code, out, _ = cli("memory", "import", str(path), "--json")
    assert code == 0 and json.loads(out)["applied"] == 0 and json.loads(out)["unchanged"] == 3
    code, out, _ = cli("memory", "import", str(path))
    assert code == 0 and "3 corrections: 0 applied, 3 already there" in out
    path.write_text("{not json", encoding="utf-8")
    code, _, err = cli("memory", "import", str(path))
    assert code == 2 and "is not JSON" in err
    path.write_text(json.dumps({"version": 1, "corrections": [{"kind": "fact"}]}), encoding="utf-8")
    code, _, err = cli("memory", "import", str(path))
    assert code == 2 and "correction 1: user_id missing" in err

    # user scoping and bad ids: exit 2 with a clear message
    code, _, err = cli("memory", "reject", facts["pgbouncer"]["fact_id"], "--user", "u2")
    assert code == 2 and "no fact" in err and "user u2" in err
    code, out, _ = cli("memory", "Atlas", "--user", "u2", "--json")
    assert code == 0 and json.loads(out)["facts"] == []
    code, _, err = cli("memory", "confirm", "nonsense", "--user", "u1")
    assert code == 2 and "not a fact or pair id" in err
