"""The memory's schema over time: a store made by an older version upgrades in place and
keeps its rows (the corrections log, once made on first use, is a migration now), and
the facts an answer gets are found by their subject's key without reading them all."""

from __future__ import annotations

import sqlite3

from rag.memory.entities import norm
from rag.memory.rows import correction_id, correction_target
from rag.memory.schema import MIGRATIONS
from rag.memory.store import MemoryStore
from rag.sqlite import migrate

OLD = 2  # the schema version before correction_log was a migration
# what the code before that version ran on first use of the corrections
OLD_LOG = ("CREATE TABLE IF NOT EXISTS correction_log (id INTEGER PRIMARY KEY, user_id TEXT NOT NULL, "
           "kind TEXT NOT NULL, target TEXT NOT NULL, verdict TEXT NOT NULL, by TEXT NOT NULL, at REAL NOT NULL)")


def old_store(path, with_log: bool = False) -> None:
    """A memory.sqlite at schema version ``OLD`` with a note, two facts of it, a verdict,
    and (``with_log``) the log table the old code made, with that verdict logged."""
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, MIGRATIONS[:OLD])
    assert db.execute("PRAGMA user_version").fetchone()[0] == OLD
    db.execute("INSERT INTO notes(note_id, user_id, content_hash, version, tier, processed_at, title) "
               "VALUES ('n1', 'u1', 'h1', 1, 'llm', 1.0, 'Atlas')")
    for subject, obj in (("Atlas", "PostgreSQL"), ("pgbouncer", "20")):
        db.execute("INSERT INTO facts(user_id, subject, predicate, object, quote, note_id, time, origin, created) "
                   "VALUES ('u1', ?, 'uses', ?, 'q', 'n1', 100.0, 'llm', 1.0)", (subject, obj))
    target = correction_target("fact", "pgbouncer", "uses", "20")
    db.execute("INSERT INTO corrections(user_id, kind, target, verdict, at) VALUES ('u1', 'fact', ?, 'confirmed', 5.0)",
               (target,))
    if with_log:
        db.execute(OLD_LOG)
        db.execute("INSERT INTO correction_log(user_id, kind, target, verdict, by, at) "
                   "VALUES ('u1', 'fact', ?, 'confirmed', 'telegram', 5.0)", (target,))
    db.close()


def upgraded(path, logged_before: int) -> None:
    with MemoryStore(path) as store:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert store.users() == {"u1": 1}
        assert {f["subject"] for f in store.facts("u1")} == {"Atlas", "pgbouncer"}
        assert store.verdicts("u1", "fact") == {correction_target("fact", "pgbouncer", "uses", "20"): "confirmed"}
        # the old facts got their subject key: an answer finds them
        assert [f["object"] for f in store.facts_named("u1", "what does atlas use?")] == ["PostgreSQL"]
        # and corrections are recorded and logged
        atlas = correction_id("u1", "fact", correction_target("fact", "Atlas", "uses", "PostgreSQL"))
        done = store.correct("u1", atlas, "rejected", by="cli")
        assert done["changed"] and done["removed"] == 1
        assert [e["verdict"] for e in store.correction_history("u1", atlas)["log"]] == ["rejected"]
        pg = correction_id("u1", "fact", correction_target("fact", "pgbouncer", "uses", "20"))
        assert len(store.correction_history("u1", pg)["log"]) == logged_before
        assert len(store.export_corrections("u1")["corrections"]) == 2
    with MemoryStore(path) as again:  # opening again migrates nothing
        assert again.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert again.db.execute("SELECT COUNT(*) FROM correction_log").fetchone()[0] == logged_before + 1


def test_a_store_at_the_previous_version_upgrades_keeps_its_rows_and_records_corrections(tmp_path):
    path = tmp_path / "memory.sqlite"
    old_store(path)
    upgraded(path, logged_before=0)


def test_a_store_whose_log_the_old_code_made_on_first_use_upgrades_too(tmp_path):
    path = tmp_path / "memory.sqlite"
    old_store(path, with_log=True)
    upgraded(path, logged_before=1)


# --- facts for answers -------------------------------------------------------------------------


def reference(store: MemoryStore, user_id: str, text: str, subjects=(), limit: int = 20) -> list[int]:
    """The ids ``facts_named`` returned when it read all the user's facts (its old code)."""
    keys = {norm(s) for s in subjects if norm(s)}
    key = norm(text)
    rows = store.db.execute(
        "SELECT f.id, f.subject FROM facts f JOIN notes n ON n.note_id = f.note_id AND n.user_id = f.user_id "
        "WHERE f.user_id = ? AND f.status = 'active' AND length(f.subject) >= 2 ORDER BY f.time DESC, f.id DESC",
        (user_id,)).fetchall()
    out = [i for i, s in rows if norm(s) in keys or (norm(s) and norm(s) in key)]
    return out[:limit]


def fact(subject: str, predicate: str, obj: str) -> dict:
    return {"subject": subject, "predicate": predicate, "object": obj, "quote": f"{subject} {obj}"}


def test_facts_named_finds_the_facts_about_what_the_text_names_among_many(tmp_path):
    store = MemoryStore(tmp_path / "memory.sqlite")
    try:
        def note(user: str, note_id: str, facts: list[dict], updated: float) -> None:
            store.replace_note(user, note_id, f"h-{note_id}", [])
            assert store.store_llm({"note_id": note_id, "user_id": user, "content_hash": f"h-{note_id}",
                                    "updated": updated}, "", facts, {})

        for i in range(40):  # 4000 facts about other things
            note("u1", f"other{i}", [fact(f"topic {i}-{j}", f"has part {j}", f"thing {j}") for j in range(100)],
                 updated=1000.0 + i)
        note("u1", "old", [fact("atlas", "uses database", "PostgreSQL"), fact("ＡＴＬＡＳ  Team", "led by", "Mei")],
             updated=100.0)
        note("u1", "new", [fact("atlas", "uses database", "SQLite"), fact("pool_size", "set to", "20"),
                           fact("A", "is", "a letter")], updated=200.0)
        note("u2", "theirs", [fact("Atlas", "owned by", "someone else")], updated=300.0)
        text = "What database does the Atlas team use, and who leads it?"
        named = store.facts_named("u1", text, ["pool_size"])
        assert [(f["subject"], f["object"]) for f in named] == [
            ("pool_size", "20"), ("atlas", "SQLite"), ("ＡＴＬＡＳ Team", "Mei")]  # PostgreSQL: superseded
        assert [f["id"] for f in named] == reference(store, "u1", text, ["pool_size"])
        assert named[1]["note_id"] == "new" and set(named[1]) >= {"quote", "time", "title", "notebook", "url"}
        # a subject among many, a text naming nothing, the limit
        assert [f["object"] for f in store.facts_named("u1", "and topic 7-42?")] == ["thing 42", "thing 4"]  # 7-4 too
        assert store.facts_named("u1", "nothing here") == [] == reference(store, "u1", "nothing here")
        many = "topic 3-1 topic 3-2 topic 3-3 topic 3-5 topic 3-8 topic 3-9"
        assert [f["id"] for f in store.facts_named("u1", many, limit=3)] == reference(store, "u1", many, limit=3)
        assert store.facts_named("u2", text)[0]["object"] == "someone else"
        plan = " ".join(r[-1] for r in store.db.execute(
            "EXPLAIN QUERY PLAN SELECT f.id FROM facts f WHERE f.user_id = ? AND f.status = 'active' "
            "AND instr(?, f.subject_norm) > 0", ("u1", "x")))
        assert "facts_subject_norm" in plan
    finally:
        store.close()
