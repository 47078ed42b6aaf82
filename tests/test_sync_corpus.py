"""The shared corpus through the HTTP sync (skipped without ../shared): the change batch
lands exactly, only changed chunks are embedded, and a sync killed at any point and run
again gives the index an uninterrupted sync gives."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rag.index.note_index import NoteIndex
from rag.index.retrieve import search
from sync.state import State
from bot.root import Parts

from conftest import SHARED, make_settings
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama

CORPUS = SHARED / "corpus"
EXE = str(Path(sys.executable).with_name("leanote-rag"))
pytestmark = [pytest.mark.slow,  # the shared corpus through real processes
              pytest.mark.skipif(not (CORPUS / "notes.jsonl").exists(), reason=f"shared corpus not found at {CORPUS}")]
USER_ONE = "5dbed2987db161bc2a85b919"


def api_settings(tmp: Path, leanote_url: str, ollama_url: str):
    return make_settings(
        tmp,
        leanote={"base_url": leanote_url},
        source={"kind": "leanote_api", "path": None, "accounts": [
            {"email": "one@example.com", "password_env": "LR_PW_ONE"},
            {"email": "two@example.com", "password_env": "LR_PW_TWO"}]},
        embedder={"kind": "ollama", "host": ollama_url},
        memory={"enabled": False},  # the sync alone; the memory through a kill is in the test below
    )


@pytest.fixture
def servers(monkeypatch):
    monkeypatch.setenv("LR_PW_ONE", "one-secret")
    monkeypatch.setenv("LR_PW_TWO", "two-secret")
    with FakeLeanote() as leanote, FakeOllama() as ollama:
        yield leanote, ollama


def embedded_inputs(ollama) -> int:
    return sum(len(body["input"]) for path, body in ollama.requests if path == "/api/embed")


def test_change_batch_lands_and_only_changed_chunks_are_embedded(servers, tmp_path):
    leanote, ollama = servers
    leanote.load_corpus(CORPUS)
    settings = api_settings(tmp_path, leanote.url, ollama.url)
    state = State(settings.state_dir)
    index = NoteIndex.open(settings, create=True)
    service = Parts(settings, index=index, state=state).sync
    try:
        assert service.run_pass().ok
        before = {k for (keys,) in state.db.execute("SELECT chunk_keys FROM notes") for k in json.loads(keys)}
        changes = [json.loads(line) for line in open(CORPUS / "changes.jsonl", encoding="utf-8")]
        for change in changes:
            leanote.apply_change(change)
        calls_before = embedded_inputs(ollama)
        result = service.run_pass()
        assert result.ok
        after = {k for (keys,) in state.db.execute("SELECT chunk_keys FROM notes WHERE status = 'indexed'")
                 for k in json.loads(keys)}
        new_texts = len(after - before)
        embedded = embedded_inputs(ollama) - calls_before
        assert 0 < embedded <= 1.2 * new_texts
        assert result.summary.chunks_embedded == embedded

        facts = json.loads((CORPUS / "facts.json").read_text(encoding="utf-8"))["changes"]
        for fact in facts:
            user = fact["UserId"]
            if "new_fact" in fact:
                probe = fact["new_fact"].replace("> ", "")[:40]
                # BM25 alone: the fake embedder's vectors are not meant to rank
                hits = search(index, probe, user, k=5, retriever="sparse")
                assert hits[0].note_id == fact["NoteId"], fact["kind"]
                assert hits[0].title == fact["Title"]
                text = " ".join(h.text for h in hits if h.note_id == fact["NoteId"])
                # new_fact paraphrases created notes; its identifiers and numbers are verbatim
                marks = re.findall(r"[A-Za-z0-9][A-Za-z0-9_.\-]{3,}", fact["new_fact"])
                assert any(m in text for m in marks), (fact["kind"], marks)
            if "removed_text" in fact:
                gone = fact["removed_text"].splitlines()[0][:30]
                assert all(gone not in h.text for h in search(index, gone, user, k=20))
            if fact["op"] in ("trash", "delete"):
                probe = fact.get("keyword") or fact["Title"]
                assert all(h.note_id != fact["NoteId"] for h in search(index, probe, user, k=20))
            if fact["op"] == "move":
                hits = [h for h in search(index, fact["Title"], user, k=20) if h.note_id == fact["NoteId"]]
                want = fact["to_notebook"].replace(" (root)", "").replace("/", " / ")
                assert hits and all(h.notebook == want for h in hits)
        again = service.run_pass()
        assert all(r.idle for r in again.results.values())
    finally:
        index.close()
        state.close()


def snapshot(settings) -> tuple[dict, dict, dict]:
    """Everything a sync leaves: points (payload + vectors), note rows, cursors."""
    import qdrant_edge as qe

    shard = qe.EdgeShard.load(str(settings.state_dir / "qdrant"))
    points, offset = {}, None
    while True:
        req = qe.ScrollRequest(limit=1000, offset=offset, with_payload=True, with_vector=True) if offset else \
            qe.ScrollRequest(limit=1000, with_payload=True, with_vector=True)
        recs, offset = shard.scroll(req)
        for r in recs:
            p = dict(r.payload)
            sparse = r.vector["bm25"]
            points[str(r.id)] = (json.dumps(p, sort_keys=True, ensure_ascii=False),
                                 tuple(np.round(r.vector["dense"], 5)), tuple(sparse.indices))
        if offset is None:
            break
    shard.close()
    db = sqlite3.connect(settings.state_dir / "state.db")
    rows = {r[0]: r[1:] for r in db.execute(
        "SELECT note_id, status, usn, content_hash, point_ids, chunk_keys, notebook FROM notes")}
    cursors = {r[0]: r[1:] for r in db.execute("SELECT account, notebooks_usn, notes_usn, synced_usn FROM accounts")}
    db.close()
    return points, rows, cursors


def kill_index_at(config: Path, env: dict, leanote: FakeLeanote, ollama: FakeOllama, embed: int | None = None) -> None:
    """`index` on ``config``, killed (SIGKILL) before its ``embed``-th embedding request (the
    first is the dimension probe) is answered, or else at its first note body: the kill comes
    from the fake's thread while the process waits for the answer, so it lands mid-work at the
    same place on any machine, however fast."""
    proc: dict[str, subprocess.Popen] = {}
    started = threading.Event()
    start = ollama.embed_calls

    def kill(*_):  # in the fake's thread, while the process waits for the answer
        started.wait(60)
        proc["p"].send_signal(signal.SIGKILL)

    if embed is None:
        leanote.after("note/getNoteContent", kill)
    else:
        ollama.on_embed = lambda n: kill() if n == start + embed else None
    try:
        proc["p"] = subprocess.Popen([EXE, "--config", str(config), "index"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started.set()
        _, err = proc["p"].communicate(timeout=300)
    finally:
        ollama.on_embed = None
        leanote.after("note/getNoteContent", lambda *_: None)  # an unused kill must not fire later
    assert proc["p"].returncode == -signal.SIGKILL, f"not killed mid-work: rc {proc['p'].returncode}\n{err}"


def test_killed_sync_resumes_to_the_same_index(servers, tmp_path):
    leanote, ollama = servers
    # a slice keeps this test short: user two's notes and 120 of user one's
    seen = {"n": 0}

    def keep(note):
        if note["UserId"] != USER_ONE:
            return True
        seen["n"] += 1
        return seen["n"] <= 120

    leanote.load_corpus(CORPUS, keep=keep)
    changes = [json.loads(line) for line in open(CORPUS / "changes.jsonl", encoding="utf-8")]
    env = {**os.environ, "LR_PW_ONE": "one-secret", "LR_PW_TWO": "two-secret"}

    def config(name: str) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        path = folder / "config.yaml"
        path.write_text(
            f"leanote: {{base_url: '{leanote.url}'}}\nstate_dir: data\n"
            f"source:\n  kind: leanote_api\n  accounts:\n"
            f"    - {{email: one@example.com, password_env: LR_PW_ONE}}\n"
            f"    - {{email: two@example.com, password_env: LR_PW_TWO}}\n"
            f"embedder: {{kind: ollama, host: '{ollama.url}'}}\nsync: {{page_size: 20}}\n"
        )
        return path

    reference, crashed = config("reference"), config("crashed")
    out = subprocess.run([str(Path(sys.executable).with_name("leanote-rag")), "--config", str(reference), "index"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr

    # killed three times, at seeded embedding batches of each run, spread over the sync (~37 batches
    # in all at 20 notes a page; a resumed run asks only for what is not cached)
    rnd = random.Random(27)
    for low, high in ((4, 7), (9, 13), (9, 13)):
        kill_index_at(crashed, env, leanote, ollama, embed=rnd.randint(low, high))
    out = subprocess.run([str(Path(sys.executable).with_name("leanote-rag")), "--config", str(crashed), "index"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr

    # then the change batch, applied to both, with one more kill in the middle
    gone = set()  # notes the batch trashes or deletes
    for change in changes:
        if change["note"]["UserId"] != USER_ONE or leanote.notes.get(change["note"]["NoteId"]) or change["op"] == "create":
            leanote.apply_change(change)
            if change["op"] in ("trash", "delete"):
                gone.add(change["note"]["NoteId"])
    kill_index_at(crashed, env, leanote, ollama, embed=2)  # after it took the trashed notes' points out
    for cfg in (reference, crashed):
        out = subprocess.run([str(Path(sys.executable).with_name("leanote-rag")), "--config", str(cfg), "index"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr

    from rag import config as config_mod

    ref = snapshot(config_mod.load(reference))
    got = snapshot(config_mod.load(crashed))
    assert got[2] == ref[2]  # cursors
    assert got[1] == ref[1]  # note rows: status, usn, hashes, point ids
    assert got[0].keys() == ref[0].keys()  # no point lost, none duplicated, none stale
    assert got[0] == ref[0]
    # the memory followed: the same notes processed, the same entities and mentions
    from rag.memory.store import MemoryStore

    with MemoryStore.open_for(config_mod.load(reference)) as a, MemoryStore.open_for(config_mod.load(crashed)) as b:
        assert b.counts() == a.counts() and a.counts()["mentions"] > 0
        # everything derived went with its note: the memory holds exactly the indexed notes, and
        # no mention or related pair names a trashed or deleted one
        live = {n for (n,) in sqlite3.connect(reference.parent / "data" / "state.db").execute(
            "SELECT note_id FROM notes WHERE status = 'indexed'")}
        assert gone and not gone & live
        assert {n for (n,) in a.db.execute("SELECT note_id FROM notes")} == live
        for sql in ("SELECT note_id FROM mentions", "SELECT note_a FROM related", "SELECT note_b FROM related"):
            assert {n for (n,) in a.db.execute(sql)} <= live, sql
        assert a.db.execute("SELECT COUNT(*) FROM related").fetchone()[0] > 0


def test_sigterm_mid_sync_stops_within_seconds_and_a_restart_finishes_it(servers, tmp_path):
    """`serve` is stopped (SIGTERM, as systemd does) in the middle of the corpus's first
    sync: it exits within 10 s with nothing alarming in the log, and the next start
    finishes the sync to exactly the index an undisturbed sync gives."""
    leanote, ollama = servers
    seen = {"n": 0}

    def keep(note):
        if note["UserId"] != USER_ONE:
            return True
        seen["n"] += 1
        return seen["n"] <= 120

    leanote.load_corpus(CORPUS, keep=keep)
    env = {**os.environ, "LR_PW_ONE": "one-secret", "LR_PW_TWO": "two-secret"}
    exe = str(Path(sys.executable).with_name("leanote-rag"))

    def config(name: str) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        path = folder / "config.yaml"
        path.write_text(
            f"leanote: {{base_url: '{leanote.url}'}}\nstate_dir: data\n"
            f"source:\n  kind: leanote_api\n  accounts:\n"
            f"    - {{email: one@example.com, password_env: LR_PW_ONE}}\n"
            f"    - {{email: two@example.com, password_env: LR_PW_TWO}}\n"
            f"embedder: {{kind: ollama, host: '{ollama.url}'}}\nollama: {{enabled: false}}\n"
            f"rerank: {{kind: none}}\nsync: {{page_size: 20, interval: 1h}}\nmemory: {{enabled: false}}\n"
        )
        return path

    reference, stopped = config("reference"), config("stopped")
    out = subprocess.run([exe, "--config", str(reference), "index"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    total = sqlite3.connect(reference.parent / "data" / "state.db").execute("SELECT COUNT(*) FROM notes").fetchone()[0]

    # the stop comes from the fake's thread while serve waits for its 14th embedding batch of the
    # pass (of ~37: a third of the way), as an embedding is in flight, on any machine however fast
    started, signalled = threading.Event(), {}
    start = ollama.embed_calls + 1  # the first: the dimension probe as the index opens

    def stop(n: int) -> None:
        if n == start + 14:
            started.wait(60)
            signalled["at"] = time.monotonic()
            proc.send_signal(signal.SIGTERM)

    ollama.on_embed = stop
    proc = subprocess.Popen([exe, "--config", str(stopped), "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    started.set()
    db_path = stopped.parent / "data" / "state.db"
    try:
        _, log = proc.communicate(timeout=300)
        assert "at" in signalled, f"serve ended before its pass was stopped: rc {proc.returncode}\n{log}"
        took = time.monotonic() - signalled["at"]
    finally:
        ollama.on_embed = None
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log
    assert took <= 10, f"serve took {took:.1f} s to stop"
    assert "Traceback" not in log and " ERROR " not in log and "CancelledError" not in log, log
    assert "stopped" in log
    notes = sqlite3.connect(db_path).execute("SELECT COUNT(*) FROM notes").fetchone()[0]
    assert 0 < notes < total  # it really stopped mid-sync, after some pages were in

    out = subprocess.run([exe, "--config", str(stopped), "index"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    from rag import config as config_mod

    ref, got = snapshot(config_mod.load(reference)), snapshot(config_mod.load(stopped))
    assert got[2] == ref[2] and got[1] == ref[1] and got[0] == ref[0]


def points_of(shard) -> dict:
    """Every point of an open Qdrant Edge shard: payload, dense vector, sparse indices and values."""
    import qdrant_edge as qe

    points, offset = {}, None
    while True:
        kwargs = {"offset": offset} if offset else {}
        recs, offset = shard.scroll(qe.ScrollRequest(limit=1000, with_payload=True, with_vector=True, **kwargs))
        for r in recs:
            sparse = r.vector["bm25"]
            points[str(r.id)] = (json.dumps(dict(r.payload), sort_keys=True, ensure_ascii=False),
                                 tuple(np.round(r.vector["dense"], 5)), tuple(sparse.indices),
                                 tuple(np.round(sparse.values, 6)))
        if offset is None:
            return points


def test_kills_mid_sync_leave_the_rankings_of_an_undisturbed_sync(servers, tmp_path, shared):
    """`index` killed (SIGKILL) at seeded points of the corpus's full sync, of its change batch and
    of a batch of malformed notes, each step then run to the end: the stored points and the top-10
    lists of the dev questions (BM25 alone after each step; dense alone and hybrid too after the
    last) are those of a sync never disturbed and held open through all three steps, as `serve`
    holds it. (Qdrant's IDF counts a deleted point until its segment is rebuilt, and orders equal
    scores by where points sit; the store counts the live points and orders equal scores by id.)

    The kills come from the fakes, while the process waits for its n-th embedding batch or its
    first note body, so each lands mid-work at the same place on any machine. In the full sync
    (pages of 30 notes, written 256 chunks at a time) the first lands before anything is written,
    the second and third while a page's first chunks are in the index and its rows not yet
    committed, the third after a page was; the change batch's kill comes after it took
    the trashed notes' points out."""
    leanote, ollama = servers
    seen = {"n": 0}

    def keep(note):  # a slice keeps this test short: user two's notes and 120 of user one's
        if note["UserId"] != USER_ONE:
            return True
        seen["n"] += 1
        return seen["n"] <= 120

    leanote.load_corpus(CORPUS, keep=keep)
    questions = [json.loads(line) for line in open(shared / "eval" / "dev.jsonl", encoding="utf-8")]
    env = {**os.environ, "LR_PW_ONE": "one-secret", "LR_PW_TWO": "two-secret"}
    exe = str(Path(sys.executable).with_name("leanote-rag"))
    (tmp_path / "crashed").mkdir()
    crashed = tmp_path / "crashed" / "config.yaml"
    crashed.write_text(
        f"leanote: {{base_url: '{leanote.url}'}}\nstate_dir: data\n"
        f"source:\n  kind: leanote_api\n  accounts:\n"
        f"    - {{email: one@example.com, password_env: LR_PW_ONE}}\n"
        f"    - {{email: two@example.com, password_env: LR_PW_TWO}}\n"
        f"embedder: {{kind: ollama, host: '{ollama.url}'}}\nsync: {{page_size: 30}}\nmemory: {{enabled: false}}\n"
    )
    settings = make_settings(
        tmp_path / "reference", leanote={"base_url": leanote.url},
        source={"kind": "leanote_api", "path": None, "accounts": [
            {"email": "one@example.com", "password_env": "LR_PW_ONE"},
            {"email": "two@example.com", "password_env": "LR_PW_TWO"}]},
        embedder={"kind": "ollama", "host": ollama.url}, sync={"page_size": 30}, memory={"enabled": False})
    from rag import config as config_mod

    crashed_settings = config_mod.load(crashed)

    def killed_run(embed: int | None = None) -> None:
        kill_index_at(crashed, env, leanote, ollama, embed)

    def finish() -> None:
        out = subprocess.run([exe, "--config", str(crashed), "index"], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr

    def rankings(index, retrievers) -> dict[str, list]:
        return {r: [[h.point_id for h in search(index, q["question"], q["user_id"], k=10, retriever=r)]
                    for q in questions] for r in retrievers}

    def compare(step: str, retrievers=("sparse",)) -> None:
        got_index = NoteIndex.open(crashed_settings)
        try:
            got_points, got = points_of(got_index.store._shard), rankings(got_index, retrievers)
        finally:
            got_index.close()
        ref_points, ref = points_of(index.store._shard), rankings(index, retrievers)
        assert got_points.keys() == ref_points.keys(), step  # none lost, none duplicated, none stale
        assert got_points == ref_points, step
        for retriever in ref:
            differ = [q["id"] for q, a, b in zip(questions, ref[retriever], got[retriever]) if a != b]
            assert not differ, f"after the {step}, {retriever}: top-10 lists differ for {differ}"

    rnd = random.Random(18)
    state = State(settings.state_dir)
    index = NoteIndex.open(settings, create=True)
    service = Parts(settings, index=index, state=state).sync
    try:
        # 1. the full sync (~30 embedding batches): killed three times, at seeded batches of each
        # run (a resumed run asks only for what is not cached), spread over its pages
        assert service.run_pass().ok
        for low, high in ((3, 6), (7, 11), (7, 11)):
            killed_run(embed=rnd.randint(low, high))
        finish()
        compare("full sync")

        # 2. the change batch (trashes, deletes, edits, moves): killed at its embedding
        for change in (json.loads(line) for line in open(CORPUS / "changes.jsonl", encoding="utf-8")):
            if change["note"]["UserId"] != USER_ONE or leanote.notes.get(change["note"]["NoteId"]) \
                    or change["op"] == "create":
                leanote.apply_change(change)
        assert service.run_pass().ok
        killed_run(embed=2)
        finish()
        compare("change batch")

        # 3. malformed notes beside good ones, and an edit that deletes a good note's points: killed
        # at its first note body
        leanote.malformed_batch(CORPUS, USER_ONE, rnd)
        result = service.run_pass()
        assert result.ok and len(result.summary.skipped) >= 8
        killed_run()
        finish()
        compare("malformed batch", ("sparse", "dense", "hybrid"))
    finally:
        index.close()
        state.close()
