"""Derived data goes with its note, whatever fails: a note that leaves the index (trashed,
excluded by the privacy rules) leaves the memory and the feedback store too, also when
the write that should remove it fails (``memory.sqlite`` locked by another process) or
the daemon is killed between the index's commit and the memory's. Each failure is
logged with the note; the next pass repairs; and no door (the bots' /about and /related,
the API's /memory endpoints, answers and their facts, the feedback store's "Why?") names
the note afterwards. Answers never use it even before the repair.

Real parts throughout: the fake Leanote over HTTP, embedded Qdrant, SQLite, the daemon
in-process (the lock) or ``leanote-rag serve`` killed with SIGKILL (the kill)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from contextlib import closing, contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from bot.chat.texts import about_text, related_text, trace_text
from bot.usecases import memory as memory_case
from bot.usecases.people import Person
from bot.usecases.results import About, Why
from rag.answer.types import Trace
from rag import config as config_mod
from rag.memory import explore
from rag.answer.service import AnswerService
from rag.index.note_index import NoteIndex
from rag.memory.store import MemoryStore, path_for
from bot.serve import Daemon
from sync.state import State
from bot.root import Parts

from conftest import SCENARIO, make_settings, run_pass, within, unix_http, unix_ahttp
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from memory_world import A_ATLAS, A_BOOK, A_POOL, ALICE, PASSWORDS, build

EXE = str(Path(sys.executable).with_name("leanote-rag"))
# what names the trashed note: its id (in links too), title, words only it holds, its facts
ATLAS_WORDS = (A_ATLAS, "Atlas 数据库迁移", "migrate_atlas", "MySQL", "连接池用 pgbouncer", "uses pooler")


def holdings_of(settings, note_id: str) -> dict[str, int]:
    """The memory's rows derived from the note, per table."""
    with sqlite3.connect(path_for(settings)) as db:
        return {table: db.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}", [note_id] * where.count("?")).fetchone()[0]
                for table, where in (("notes", "note_id = ?"), ("mentions", "note_id = ?"), ("facts", "note_id = ?"),
                                     ("related", "note_a = ? OR note_b = ?"), ("jobs", "note_id = ?"))}


async def memory_api(sock: str, *paths: str) -> list[tuple[int, str]]:
    """The daemon's /memory endpoints over its socket (status, body) for each path."""
    async with unix_ahttp(sock) as http:
        return [((r := await http.get(p, timeout=30)).status_code, r.text) for p in paths]


async def doors(daemon, sock: str) -> dict[str, str]:
    """What each door shows Alice about Atlas, the pool note and the trashed note's id."""
    alice = Person("telegram:111", ALICE)
    out = {"about": about_text(await memory_case.about(daemon.parts, alice, "Atlas")).text,
           "related note": related_text(await memory_case.related(daemon.parts, alice, A_POOL)).text,
           "related question": related_text(await memory_case.related(daemon.parts, alice, "Atlas 数据库 连接池")).text}
    for path, (status, body) in zip(
            ("find", "entity", "graph entity", "graph note", "note"),
            await memory_api(sock, f"/memory/find?q=Atlas&user={ALICE}", f"/memory/entity?name=Atlas&user={ALICE}",
                             f"/memory/graph?entity=Atlas&user={ALICE}", f"/memory/graph?note={A_POOL}&user={ALICE}",
                             f"/memory/note/{A_ATLAS}?user={ALICE}")):
        out[f"api {path}"] = f"{status} {body}"
    facts = await daemon.answers.ask("Atlas 用什么连接池？", ALICE)
    out["answer facts"] = json.dumps(facts.trace.facts, ensure_ascii=False) + json.dumps(
        [c.note_id for c in facts.citations])
    listing = await daemon.answers.ask("我写过哪些关于 Atlas 的笔记", ALICE)
    out["listing"] = listing.answer + json.dumps([c.note_id for c in listing.citations])
    return out


@pytest.mark.slow
def test_a_locked_memory_during_a_trash_is_logged_every_pass_and_repaired_by_the_next(tmp_path, use_embedder, caplog,
                                                                                         monkeypatch):
    for name, value in PASSWORDS.items():
        monkeypatch.setenv(name, value)
    sock = f"/tmp/lr-mf-{uuid.uuid4().hex[:8]}.sock"
    with FakeLeanote() as leanote:
        world = build(tmp_path, leanote, use_embedder, ollama={"enabled": False}, memory={"busy_timeout": "0.3s"},
                      api={"socket": sock})
        settings = world.settings()

        async def scenario(daemon: Daemon) -> None:
            # an answer citing the note, kept as the bots keep it (the "Why?" button reads it)
            asked = await daemon.answers.ask("Atlas 的迁移脚本放在哪里？", ALICE)
            assert A_ATLAS in [c.note_id for c in asked.citations]
            answer_id = daemon.feedback.record("telegram:111", ALICE, asked, "telegram:111:111")
            kept = daemon.feedback.get(answer_id, "telegram:111")
            assert "Atlas 数据库迁移" in trace_text(Why.of(Trace.from_json(kept.trace))) and "migrate_atlas" in kept.answer
            before = await doors(daemon, sock)
            for door in ("about", "related note", "api find", "api entity", "api graph entity", "api note",
                         "answer facts", "listing"):
                assert A_ATLAS in before[door], door  # each door did show the note
            assert "uses pooler" in before["answer facts"]

            locker = sqlite3.connect(path_for(settings), isolation_level=None)
            locker.execute("BEGIN IMMEDIATE")  # another process writing, for longer than busy_timeout
            try:
                leanote.put_note({**leanote.notes[A_ATLAS], "IsTrash": True})
                for n in (1, 2):
                    caplog.clear()
                    with caplog.at_level(logging.WARNING):
                        result = await within(daemon.schedule.sync_now(), "a sync pass")
                    assert result.ok and result.summary.deleted == (1 if n == 1 else 0)
                    assert A_ATLAS not in daemon.index.store.note_ids(ALICE)
                    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
                    assert [m for m in logged if A_ATLAS in m and "locked" in m], (n, logged)  # every pass says so
                    assert holdings_of(settings, A_ATLAS)["notes"] == 1  # (the memory could not be written)
                # before the repair: no door names it (the memory still holds it)
                during = await doors(daemon, sock)
                assert during.pop("api note").startswith("404")  # (the reply names the id asked for)
                for door, text in during.items():
                    assert not any(w in text for w in ATLAS_WORDS), (door, text)
                config = tmp_path / "config.yaml"  # the same settings, for the CLI
                config.write_text(yaml.safe_dump(settings.model_dump(mode="json"), allow_unicode=True), encoding="utf-8")
                cli = {args: await asyncio.to_thread(subprocess.run, [EXE, "--config", str(config), *args],
                                                     capture_output=True, text=True, timeout=120) for args in
                       (("memory", "Atlas", "--user", ALICE), ("related", "Atlas 数据库 连接池", "--user", ALICE),
                        ("related", A_POOL, "--user", ALICE))}
                for args, out in cli.items():  # the CLI, through the daemon's socket
                    assert out.returncode == 0, (args, out.stderr)
                    assert not any(w in out.stdout for w in ATLAS_WORDS), (args, out.stdout)
                assert "PostgreSQL 连接池配置" in during["listing"]  # the notes still indexed are listed
            finally:
                locker.execute("ROLLBACK")
                locker.close()

            caplog.clear()
            with caplog.at_level(logging.INFO, logger="sync"):
                result = await within(daemon.schedule.sync_now(), "a sync pass")
            assert result.ok
            assert holdings_of(settings, A_ATLAS) == {"notes": 0, "mentions": 0, "facts": 0, "related": 0, "jobs": 0}
            assert any(A_ATLAS in r.getMessage() and "removed" in r.getMessage() for r in caplog.records)
            after = await doors(daemon, sock)
            assert after.pop("api note").startswith("404")  # (the reply names the id asked for)
            for door, text in after.items():
                assert not any(w in text for w in ATLAS_WORDS), (door, text)
            assert "PostgreSQL 连接池配置" in after["listing"] and "PostgreSQL 备份" in after["about"]
            # the feedback store: the question and verdict stay; nothing of the note does
            record = daemon.feedback.get(answer_id, "telegram:111")
            shown = json.dumps(record.as_json(), ensure_ascii=False) + trace_text(Why.of(Trace.from_json(record.trace)))
            for word in ATLAS_WORDS[1:]:
                assert word not in shown, word
            assert record.question == asked.question

        async def main() -> None:
            daemon = Daemon(settings, services=[])
            task = asyncio.create_task(daemon.run())
            try:
                await asyncio.wait_for(daemon.wait_for_pass(0), 60)
                await within(scenario(daemon), "the scenario", SCENARIO)
            finally:
                daemon.stop()
                await asyncio.wait_for(task, timeout=30)

        asyncio.run(main())



@contextmanager
def locked(settings):
    """Another process holds a write transaction on memory.sqlite (for longer than busy_timeout)."""
    locker = sqlite3.connect(path_for(settings), isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        locker.execute("ROLLBACK")
        locker.close()


@contextmanager
def sync_service(settings, embedder):
    state = State(settings.state_dir)
    index = NoteIndex.open(settings, create=True, embedder=embedder)
    service = Parts(settings, index=index, state=state, scheduled=True).sync
    try:
        yield service
    finally:
        service.close()
        index.close()
        state.close()


@pytest.mark.slow
def test_a_retag_and_a_notebook_rename_the_locked_memory_missed_show_after_the_next_pass(tmp_path, use_embedder,
                                                                                         monkeypatch, caplog):
    for name, value in PASSWORDS.items():
        monkeypatch.setenv(name, value)
    with FakeLeanote() as leanote:
        world = build(tmp_path, leanote, use_embedder, memory={"busy_timeout": "0.3s"})
        settings = world.settings()
        with sync_service(settings, use_embedder) as service:
            caplog.set_level(logging.INFO, logger="sync")
            assert service.run_pass().ok  # (an ordinary pass relabels nothing)
            assert not [r for r in caplog.records if "now shown" in r.getMessage()]
            with locked(settings):
                leanote.put_note({**leanote.notes[A_POOL], "Tags": ["pgbouncer", "调优"]})  # metadata only
                leanote.put_notebook({**leanote.notebooks[A_BOOK], "Title": "工作区"})
                result = service.run_pass()
                assert result.ok and result.summary.moved >= 1 and result.summary.updated == 0
                assert [r for r in caplog.records if r.levelno == logging.WARNING and A_POOL in r.getMessage()]
            assert service.run_pass().ok
            assert [r for r in caplog.records if "now shown" in r.getMessage()]
            with MemoryStore.open_for(settings) as memory:
                tagged = {n["note_id"] for n in memory.entity(ALICE, "调优")}
                old_tag = {n["note_id"] for n in memory.entity(ALICE, "PostgreSQL")
                           if any(m["kind"] == "tag" for m in n["mentions"])}
                cards = {n: explore.note_card(memory, ALICE, n) for n in (A_POOL, A_ATLAS)}
            assert A_POOL in tagged and A_POOL not in old_tag  # the new tag, and the old one went
            assert {n: c["notebook"] for n, c in cards.items()} == {A_POOL: "工作区", A_ATLAS: "工作区"}


def test_a_snapshot_note_edited_while_the_memory_was_locked_is_processed_on_the_next_pass(tmp_path, notes_dir,
                                                                                          use_embedder):
    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)},
                             memory={"llm": "off", "busy_timeout": "0.3s"}, rerank={"kind": "none"})
    eggs = notes_dir / "生活" / "菜谱" / "番茄炒蛋.md"
    with sync_service(settings, use_embedder) as service:
        assert service.run_pass().ok
        with locked(settings):
            eggs.write_text(eggs.read_text(encoding="utf-8") + "\n\n火候的笔记记在 `tomato_heat_table.py` 里。\n",
                            encoding="utf-8")
            past = time.time() - 60  # not a file changed a moment ago (the files source reads those again)
            os.utime(eggs, (past, past))
            assert service.run_pass().summary.updated == 1 and service.run_pass().summary.updated == 0
        assert service.run_pass().ok
        with MemoryStore.open_for(settings) as memory:
            assert [n["title"] for n in memory.entity("local", "tomato_heat_table.py")] == ["番茄炒蛋"]


# --- kill -9 after a SIGHUP that makes a notebook private ------------------------------------------

WORK, DIARY = "5e16ca22f6ffdbad5b4ba601", "5e16ca22f6ffdbad5b4ba602"
PUBLIC = {"6%023x" % i: (f"ArrayList 笔记 {i}", f"# ArrayList {i}\n\nArrayList 的扩容是 1.5 倍，第 {i} 篇笔记讲 "
                         f"ensureCapacity 和 trimToSize。") for i in range(1, 4)}
PRIVATE = {"6%023x" % i: (f"日记 {i}", f"# 日记 {i}\n\n今天又用 ArrayList 写了记账脚本 SECRET-DIARY-{i}，"
                          f"密码放在 vault-{i} 里。ArrayList 的扩容让我想起了搬家。") for i in range(11, 19)}
PRIVATE_WORDS = ("日记", "SECRET-DIARY", "vault-", *PRIVATE)
SEED = 18  # the kill moments after the first round


@pytest.mark.slow
def test_kill_9_after_a_sighup_that_excludes_a_notebook_leaves_nothing_of_it_after_a_restart(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_PW_ALICE", PASSWORDS["LR_PW_ALICE"])
    env = {**os.environ}
    with FakeLeanote() as leanote, FakeOllama() as ollama:
        leanote.add_user(ALICE, "alice@example.com", PASSWORDS["LR_PW_ALICE"])
        leanote.put_notebook({"NotebookId": WORK, "UserId": ALICE, "Title": "工作"})
        leanote.put_notebook({"NotebookId": DIARY, "UserId": ALICE, "Title": "私密"})
        for book, notes in ((WORK, PUBLIC), (DIARY, PRIVATE)):
            for note_id, (title, content) in notes.items():
                leanote.put_note({"NoteId": note_id, "UserId": ALICE, "NotebookId": book, "Title": title,
                                  "Tags": ["java"], "Content": content})

        def config(folder: Path, exclude: bool) -> Path:
            path = folder / "config.yaml"
            path.write_text(
                f"leanote: {{base_url: '{leanote.url}'}}\nstate_dir: data\n"
                f"source: {{kind: leanote_api, accounts: [{{email: alice@example.com, password_env: LR_PW_ALICE}}]}}\n"
                f"embedder: {{kind: ollama, host: '{ollama.url}'}}\nollama: {{enabled: false}}\nrerank: {{kind: none}}\n"
                f"memory: {{llm: 'off', related_min_score: 0.3}}\nsync: {{interval: 1h}}\n"
                f"api: {{socket: '/tmp/lr-mk-{uuid.uuid4().hex[:8]}.sock'}}\n"
                + ("exclude: {notebooks: [私密]}\n" if exclude else ""), encoding="utf-8")
            return path

        # the state every round starts from: all notes indexed, facts stored for two diary notes
        base = tmp_path / "base"
        base.mkdir()
        run_pass(config_mod.load(config(base, False)), None)
        with MemoryStore(base / "data" / "memory.sqlite") as store:
            hashes = store.hashes()
            assert set(PRIVATE) | set(PUBLIC) <= set(hashes)
            for note_id in list(PRIVATE)[:2] + list(PUBLIC)[:1]:
                quote = "ArrayList 的扩容"
                assert store.store_llm({"note_id": note_id, "user_id": ALICE, "content_hash": hashes[note_id]},
                                       "", [{"subject": "ArrayList", "predicate": f"grows in {note_id}",
                                             "object": "1.5 倍", "quote": quote, "char_start": 0,
                                             "char_end": len(quote)}], {})

        rng = random.Random(SEED)
        moments = [("locked memory", 0.0)] + [(rng.choice(["after the SIGHUP", "after the commit"]), rng.uniform(0, 0.25))
                                              for _ in range(2)]
        for n, (moment, delay) in enumerate(moments):
            folder = tmp_path / f"round{n}"
            folder.mkdir()
            shutil.copytree(base / "data", folder / "data")
            cfg = config(folder, False)
            sock = cfg.read_text().split("socket: '")[1].split("'")[0]
            log_file = folder / "serve.log"
            proc = subprocess.Popen([EXE, "--config", str(cfg), "serve"], env=env, stdout=subprocess.DEVNULL,
                                    stderr=log_file.open("w"))
            locker = None
            try:
                wait_for_a_pass(proc, sock, log_file)
                if moment == "locked memory":  # the memory's removal waits (busy_timeout 10 s): kill then
                    locker = sqlite3.connect(folder / "data" / "memory.sqlite", isolation_level=None)
                    locker.execute("BEGIN IMMEDIATE")
                cfg.write_text(cfg.read_text() + "exclude: {notebooks: [私密]}\n", encoding="utf-8")
                proc.send_signal(signal.SIGHUP)
                if moment == "after the SIGHUP":
                    time.sleep(delay)
                else:
                    excluded_rows(folder, wait_for=len(PRIVATE))  # the index's commit is in
                    time.sleep(delay)
            finally:
                proc.kill()
                proc.wait(timeout=30)
                if locker is not None:
                    locker.execute("ROLLBACK")
                    locker.close()
            # a clean start, one pass (as `leanote-rag index` makes it)
            run_pass(config_mod.load(cfg), None)
            nothing_of_the_diary(cfg, f"round {n}: killed {moment} (+{delay:.3f} s)")


def wait_for_a_pass(proc: subprocess.Popen, sock: str, log_file: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log_file.read_text()
        try:
            with unix_http(sock) as http:
                if http.get("/health", timeout=5).json().get("passes", 0) >= 1:
                    return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"serve made no pass\n{log_file.read_text()[-3000:]}")


def excluded_rows(folder: Path, wait_for: int) -> None:
    """Wait until the state holds ``wait_for`` excluded notes (the reconcile's commit)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with sqlite3.connect(folder / "data" / "state.db", timeout=1) as db:
                if db.execute("SELECT COUNT(*) FROM notes WHERE status = 'excluded'").fetchone()[0] >= wait_for:
                    return
        except sqlite3.Error:
            pass
        time.sleep(0.005)
    raise AssertionError("the reconcile did not commit the excluded notes")


def nothing_of_the_diary(cfg: Path, when: str) -> None:
    """Neither the index nor the memory holds a diary note, and no door names one."""
    settings = config_mod.load(cfg)
    with closing(State(settings.state_dir)) as state:
        rows = {n: r.status for n in PRIVATE if (r := state.note(n)) is not None}
    assert rows == {n: "excluded" for n in PRIVATE}, when
    with NoteIndex.open(settings) as index, MemoryStore.open_for(settings) as memory:
        assert not set(PRIVATE) & index.store.note_ids(ALICE), when
        assert set(PUBLIC) <= index.store.note_ids(ALICE), when
        held = {n for (n,) in memory.db.execute(
            "SELECT note_id FROM notes UNION SELECT note_id FROM mentions UNION SELECT note_id FROM facts "
            "UNION SELECT note_a FROM related UNION SELECT note_b FROM related UNION SELECT note_id FROM jobs")}
        assert not set(PRIVATE) & held and set(PUBLIC) <= held, when
        answers = AnswerService(settings, index, memory=memory)
        try:
            listing = asyncio.run(answers.ask("我写过哪些关于 ArrayList 的笔记", ALICE))
            facts = asyncio.run(answers.ask("ArrayList 扩容多少？", ALICE))
        finally:
            answers.close()
        shown = {
            "about": about_text(About("ArrayList", ALICE, memory.facts_about(ALICE, "ArrayList"),
                                      memory.entity(ALICE, "ArrayList"))).text,
            "related": json.dumps([memory.related_of(ALICE, n) for n in PUBLIC], ensure_ascii=False),
            "api find": json.dumps(memory.find(ALICE, "ArrayList"), ensure_ascii=False),
            "api entity": json.dumps(explore.entity_card(memory, ALICE, "ArrayList"), ensure_ascii=False),
            "api graph": json.dumps(explore.entity_graph(memory, ALICE, "ArrayList"), ensure_ascii=False),
            "api note": json.dumps([explore.note_card(memory, ALICE, n) for n in PRIVATE]),
            "listing": listing.answer + json.dumps([c.note_id for c in listing.citations]),
            "answer facts": json.dumps(facts.trace.facts, ensure_ascii=False) + json.dumps(
                [c.note_id for c in facts.citations]),
        }
    assert "ArrayList 笔记 1" in shown["about"] and "ArrayList 笔记 1" in shown["listing"], when  # the rest shows
    for door, text in shown.items():
        assert not any(w in text for w in PRIVATE_WORDS), (when, door, text)


def test_answers_kept_before_the_upgrade_also_stop_naming_a_note_that_left_the_index(tmp_path):
    """A feedback store written by the version before ``named`` existed: the migration finds
    the notes its answers name, and the note's removal reaches them too."""
    from rag.answer.types import Answer, Candidate, Citation, Trace
    from rag.answer.feedback import FORGOTTEN, GONE_TITLE, MIGRATIONS, FeedbackStore
    from rag.sqlite import open_db

    path = tmp_path / "feedback.sqlite"
    trace = Trace("红烧肉怎么做？", "红烧肉怎么做？", facts=["[1] 红烧肉 — 炖 — 60 分钟", "[2] 高压锅 — 压 — 25 分钟"],
                  candidates=[Candidate("p1", "n1", "红烧肉秘方", "做法", 1, 0.8, 1, 7.5, 0.03, evidence=1),
                              Candidate("p3", "n3", "别的笔记", "", 3, 0.2, 4, 1.0, 0.01)])
    answer = Answer("红烧肉怎么做？", "小火炖 60 分钟[1]，或高压锅 25 分钟[2]。", True, True, trace=trace,
                    citations=[Citation(1, "n1", "红烧肉秘方", "菜谱", "做法", "http://x/note/n1", "小火炖", 0.9),
                               Citation(2, "n2", "Pressure cooker", "菜谱", "", "http://x/note/n2", "25 min", 0.5)])
    with FeedbackStore(tmp_path / "now.sqlite") as now:  # an answer row as recorded...
        answer_id = now.record("telegram:1", "u", answer)
        row = now.db.execute("SELECT * FROM answers").fetchone()
    old = open_db(path, MIGRATIONS[:1], "x")  # ...into the schema the version before wrote
    old.execute(f"INSERT INTO answers VALUES ({','.join('?' * len(row))})", row)
    old.close()
    with FeedbackStore(path) as store:
        assert store.named_notes() == {"n1", "n2", "n3"}
        assert store.forget_notes(["n1", "n9"]) == 1 and store.named_notes() == {"n2", "n3"}
        rec = store.get(answer_id)
        shown = json.dumps(rec.as_json(), ensure_ascii=False)
        assert "红烧肉秘方" not in shown and "http://x/note/n1" not in shown and "小火炖" not in shown
        assert rec.answer == FORGOTTEN and rec.question == "红烧肉怎么做？"
        assert rec.trace["facts"] == ["[2] 高压锅 — 压 — 25 分钟"]  # the other note's fact stays
        assert [c["title"] for c in rec.cited] == [GONE_TITLE, "Pressure cooker"]
        assert store.forget_notes(["n1"]) == 0  # done once
