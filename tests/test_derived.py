"""The derived stage's one error policy (``sync.derived``): nothing derived fails the sync, and
a store that cannot be written is left alone for the rest of the pass — that store only."""

from __future__ import annotations

import logging
import sqlite3

from rag.memory.store import MemoryStore
from sync.derived import Derived
from sync.state import State

from conftest import make_settings


def _world(tmp_path, feedback):
    settings = make_settings(tmp_path)
    state = State(settings.state_dir)
    memory = MemoryStore(tmp_path / "memory.sqlite", busy_timeout=0.2)
    return Derived(settings, state, lambda: None, memory, feedback=feedback), state, memory


def test_a_feedback_store_that_fails_stays_due_and_leaves_the_memory_written(tmp_path, caplog):
    def locked():
        raise sqlite3.OperationalError("database is locked")

    derived, state, memory = _world(tmp_path, locked)
    try:
        memory.replace_note("u1", "n1", "h1", [])
        with caplog.at_level(logging.WARNING, logger="sync.derived"):
            derived.align(memory=False, feedback=True)
        assert derived.feedback_due  # tried again next pass
        assert "feedback: comparing it with the index failed: OperationalError: database is locked" in caplog.text
        # the same pass still writes the memory: a note that left the index loses its rows
        derived.follow({"n1": None}, {}, {})
        assert "n1" not in memory.holdings()
    finally:
        memory.close()
        state.close()


def test_a_locked_memory_is_left_alone_for_the_rest_of_the_pass_naming_the_notes(tmp_path, caplog):
    derived, state, memory = _world(tmp_path, lambda: None)
    other = sqlite3.connect(tmp_path / "memory.sqlite", timeout=0)
    try:
        for n in ("n1", "n2", "n3"):
            memory.replace_note("u1", n, "h", [])
        other.execute("BEGIN EXCLUSIVE")  # another process holds the memory
        with caplog.at_level(logging.WARNING, logger="sync.derived"):
            derived.follow({"n1": None, "n2": None, "n3": None}, {}, {})
            assert not derived.lacks("n4", "h4")  # not asked while it is down: no wait per note
        assert "memory: queueing related notes failed" in caplog.text
        assert "not brought in line with 3 more note(s) (n1, n2, n3)" in caplog.text
        other.execute("ROLLBACK")
        derived.begin_pass()  # the next pass tries again, and repairs
        derived.follow({"n1": None, "n2": None, "n3": None}, {}, {})
        assert not set(memory.holdings()) & {"n1", "n2", "n3"}
    finally:
        other.close()
        memory.close()
        state.close()
