"""Snapshot sources stay live under `serve`: the notes folder is listed again on every
pass and only new or changed files are read (size + mtime fingerprints); a folder of
mongodump backups follows its newest backup and extracts it only when it changed; the
file watcher syncs a change within seconds and never drops one (a change during a
pass, a trigger that is debounced). Real files, SQLite, embedded Qdrant, `serve`."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import bson
import pytest
from bson import ObjectId

from rag.errors import UserError
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search
from bot.serve import Daemon
from sync.sources.files import stable_id
from sync.sources.mongodump import MongodumpSource
from sync.state import State
from sync.watch import watch
from bot.root import Parts

from conftest import SCENARIO, THREADS, make_settings, within
from fakes.ollama import FakeOllama

EXE = str(Path(sys.executable).with_name("leanote-rag"))


def file_id(rel: str) -> str:
    return stable_id(f"file:{rel}")


def note_row(db: Path, note_id: str) -> tuple | None:
    """(status, content_hash, title) of a note in the state, read as another process would."""
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return con.execute("SELECT status, content_hash, title FROM notes WHERE note_id = ?",
                               (note_id,)).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None


def finished_runs(db: Path) -> int:
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return con.execute("SELECT COUNT(*) FROM runs WHERE finished IS NOT NULL").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def all_runs(db: Path) -> list[tuple]:
    con = sqlite3.connect(db, timeout=5)
    try:
        return con.execute("SELECT id, started, finished FROM runs ORDER BY id").fetchall()
    finally:
        con.close()


def wait_for(condition, what: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> float:
    """Seconds until condition() holds; fails after a generous deadline."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if condition():
            return time.monotonic() - start
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"serve exited while waiting for {what}: {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    pytest.fail(f"{what}: not within {timeout:.0f} s")


async def until(condition, what: str, timeout: float = 60.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if await asyncio.to_thread(condition):
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    pytest.fail(f"{what}: not within {timeout:.0f} s")


def old_mtime(path: Path) -> None:
    """An mtime well in the past, as a file synced long ago has (fresh ones are re-checked)."""
    t = time.time() - 3600
    os.utime(path, (t, t))


# --- `serve` polling the folder ----------------------------------------------------------------


@pytest.mark.slow
def test_serve_picks_up_a_file_added_changed_and_deleted_within_an_interval(notes_dir, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        f"state_dir: data\nsource: {{kind: files, path: '{notes_dir}'}}\n"
        "sync: {interval: 2s, watch: false}\nollama: {enabled: false}\nrerank: {kind: none}\n"
        f"embedder: {{threads: {THREADS}}}\n",
        encoding="utf-8",
    )
    db = tmp_path / "data" / "state.db"
    proc = subprocess.Popen([EXE, "--config", str(config), "serve"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: finished_runs(db) >= 1, "the first pass", timeout=120, proc=proc)
        hike = file_id("生活/周末徒步香山.md")
        before = note_row(db, hike)
        assert before is not None and before[0] == "indexed"

        (notes_dir / "新增").mkdir()
        (notes_dir / "新增" / "轮询新笔记.md").write_text(
            "# 轮询新笔记\n\n服务运行时新加的笔记，关键词 POLL-ADDED-1。\n", encoding="utf-8")
        wait_for(lambda: (note_row(db, file_id("新增/轮询新笔记.md")) or ("",))[0] == "indexed",
                 "a new file is indexed", proc=proc)

        path = notes_dir / "生活" / "周末徒步香山.md"
        path.write_text(path.read_text(encoding="utf-8") + "\n\n## 补记\n\n下山后吃了烤鸭 POLL-CHANGED-2。\n",
                        encoding="utf-8")
        wait_for(lambda: (note_row(db, hike) or ("", ""))[1] not in ("", before[1]), "a changed file is re-indexed",
                 proc=proc)

        (notes_dir / "生活" / "菜谱" / "番茄炒蛋.md").unlink()
        wait_for(lambda: note_row(db, file_id("生活/菜谱/番茄炒蛋.md")) is None, "a deleted file leaves", proc=proc)

        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        assert not [line for line in err.splitlines() if "WARNING" in line and "番茄炒蛋" in line]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    def hits(query: str) -> list[dict]:
        out = subprocess.run([EXE, "--config", str(config), "search", query, "--json"], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["hits"]

    assert hits("POLL-ADDED-1")[0]["title"] == "轮询新笔记"
    top = hits("POLL-CHANGED-2")[0]
    assert top["title"] == "周末徒步：香山" and "POLL-CHANGED-2" in top["text"]
    assert all(h["title"] != "番茄炒蛋" for h in hits("番茄炒蛋 加糖"))


# --- the file watcher --------------------------------------------------------------------------


def watcher_settings(tmp_path, notes_dir, **sync):
    return make_settings(
        tmp_path,
        source={"kind": "files", "path": str(notes_dir)},
        sync={"interval": "1h", "watch": True, "watch_debounce": "0.3s", **sync},
        ollama={"enabled": False},
        rerank={"kind": "none"},
    )


def observed(service):
    """The watcher as the daemon runs it, noting whether it ended by itself or was cancelled."""
    ends: list[str] = []

    async def run(host):
        try:
            await service(host)
            ends.append("returned")
        except asyncio.CancelledError:
            ends.append("cancelled")
            raise

    run.label = service.label
    return run, ends


async def started(daemon: Daemon) -> asyncio.Task:
    task = asyncio.create_task(daemon.run())
    await asyncio.wait_for(daemon.wait_for_pass(0), timeout=120)
    return task


async def listening(caplog) -> None:
    """Until the watcher listens: it logs "watching" right before it sets up its inotify watches,
    in the same step of the event loop, so once this coroutine sees the line they are set up."""
    await until(lambda: any(r.name == "sync.watch" and r.getMessage().startswith("watching ")
                            for r in caplog.records), "the watcher to listen")


def seen_by_the_watcher(caplog) -> list[str]:
    """The changes the watcher took for a note's (its debug lines: the first five paths of each batch)."""
    return [r.getMessage() for r in caplog.records if r.name == "sync.watch" and r.getMessage().startswith("changed: ")]


@pytest.mark.slow
def test_watcher_syncs_changes_within_seconds_and_ignores_other_files(notes_dir, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="sync.watch")
    # a trigger at most every 2 s: a change right after a pass finds the trigger debounced
    settings = watcher_settings(tmp_path, notes_dir, trigger_debounce="2s")
    db = settings.state_dir / "state.db"
    service, ends = observed(watch)

    async def scenario():
        daemon = Daemon(settings, services=[service])
        task = await started(daemon)
        await listening(caplog)

        # hidden files and folders, and files that are not notes, start no sync: the watcher does
        # not take them for changes (the note written after them reaches it after them, so by the
        # time it is indexed they would have been taken, and their pass would be over)
        (notes_dir / ".草稿.md").write_text("# 隐藏\n\nHIDDEN-1\n", encoding="utf-8")
        (notes_dir / ".git").mkdir()
        (notes_dir / ".git" / "x.md").write_text("# git\n", encoding="utf-8")
        (notes_dir / "生活" / "清单.txt").write_text("not a note\n", encoding="utf-8")

        added = notes_dir / "生活" / "监视新笔记.md"
        added.write_text("# 监视新笔记\n\n文件监视器看到的新笔记 WATCH-ADDED-1。\n", encoding="utf-8")
        await until(lambda: (note_row(db, file_id("生活/监视新笔记.md")) or ("",))[0] == "indexed",
                    "an added file is indexed")
        seen = seen_by_the_watcher(caplog)
        assert [line for line in seen if "监视新笔记.md" in line], seen
        assert not [line for line in seen if ".草稿" in line or ".git" in line or "清单.txt" in line], seen

        # changed right after: the daemon's trigger is still debounced, the change must not wait an hour
        first = note_row(db, file_id("生活/监视新笔记.md"))[1]
        added.write_text("# 监视新笔记\n\n改过的内容 WATCH-CHANGED-2。\n", encoding="utf-8")
        await until(lambda: (note_row(db, file_id("生活/监视新笔记.md")) or ("", ""))[1] != first,
                    "a changed file is re-indexed")

        (notes_dir / "生活" / "菜谱" / "红烧肉.md").unlink()
        await until(lambda: note_row(db, file_id("生活/菜谱/红烧肉.md")) is None, "a deleted file leaves")

        # a folder moved away takes its notes with it (one event, for the folder)
        os.rename(notes_dir / "编程" / "数据库", tmp_path / "数据库")
        await until(lambda: note_row(db, file_id("编程/数据库/PostgreSQL连接池.md")) is None,
                    "a folder moved away leaves")
        # and moved back in, they return
        os.rename(tmp_path / "数据库", notes_dir / "编程" / "数据库")
        await until(lambda: note_row(db, file_id("编程/数据库/PostgreSQL连接池.md")) is not None,
                    "a folder moved in is indexed")

        assert search(daemon.index, "WATCH-CHANGED-2", "local")[0].title == "监视新笔记"
        assert daemon.schedule.scheduler.get_job("sync").trigger.interval.total_seconds() == 3600
        daemon.stop()
        await asyncio.wait_for(task, timeout=60)

    asyncio.run(within(scenario(), "the scenario", SCENARIO))
    assert ends == ["returned"]  # it heard `stopping` and ended by itself


@pytest.mark.slow
def test_a_change_during_a_running_pass_is_synced_after_it(notes_dir, tmp_path, caplog):
    """A note written while a pass runs (after it listed the folder): the watcher's trigger during
    the pass is not debounced, the daemon is asked to run again after it. The pass is held at its
    embedding (the fake Ollama holds the request that embeds the first note) until the watcher
    has taken the second note for a change."""
    caplog.set_level(logging.DEBUG, logger="sync.watch")
    with FakeOllama() as ollama:
        settings = make_settings(
            tmp_path, source={"kind": "files", "path": str(notes_dir)}, embedder={"kind": "ollama", "host": ollama.url},
            sync={"interval": "1h", "watch": True, "watch_debounce": "0.3s", "trigger_debounce": "0.1s"},
            ollama={"enabled": False}, rerank={"kind": "none"})
        db = settings.state_dir / "state.db"
        held = ollama.hold_embed("HELD-IN-THE-PASS-7")

        def running() -> int | None:
            rows = [r for r in all_runs(db) if r[2] is None]
            return rows[-1][0] if rows else None

        async def scenario():
            daemon = Daemon(settings, services=[watch])
            task = await started(daemon)
            await listening(caplog)
            (notes_dir / "巡检记录.md").write_text("# 巡检记录\n\n设备巡检 HELD-IN-THE-PASS-7，温度正常。\n",
                                                   encoding="utf-8")
            await until(lambda: "HELD-IN-THE-PASS-7" in ollama.held, "the pass for the first note to embed it",
                        timeout=120)
            busy = running()
            assert busy is not None
            (notes_dir / "巡检期间.md").write_text("# 巡检期间\n\n巡检同步进行中写下的 DURING-PASS-3。\n", encoding="utf-8")
            written = time.time()
            await until(lambda: [line for line in seen_by_the_watcher(caplog) if "巡检期间.md" in line],
                        "the watcher to see the second note")
            assert running() == busy and note_row(db, file_id("巡检期间.md")) is None  # the pass is still held
            held.set()
            await until(lambda: (note_row(db, file_id("巡检期间.md")) or ("",))[0] == "indexed",
                        "the change made during the pass is indexed", timeout=120)
            assert any(started >= written for _, started, _ in all_runs(db))  # by a pass that started after it
            assert note_row(db, file_id("巡检记录.md"))[0] == "indexed"
            daemon.stop()
            await asyncio.wait_for(task, timeout=60)

        asyncio.run(within(scenario(), "the scenario", SCENARIO))


def test_watcher_off_or_without_a_folder(notes_dir, tmp_path):
    shutil.rmtree(notes_dir)
    notes_dir.write_text("now a file", encoding="utf-8")
    # off: it returns at once, without looking at the path
    off = watcher_settings(tmp_path, notes_dir, watch=False)
    assert asyncio.run(watch(Daemon(off, services=[]))) is None
    # on, for a path that is no folder: one clear error (the daemon logs it and syncs on)
    with pytest.raises(UserError, match="is not a folder.*sync.watch: false"):
        asyncio.run(watch(Daemon(watcher_settings(tmp_path, notes_dir), services=[])))


# --- fingerprints: what a pass reads -----------------------------------------------------------


@pytest.fixture
def files_service(notes_dir, tmp_path, use_embedder):
    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)})
    state = State(settings.state_dir)
    index = NoteIndex.open(settings, create=True, embedder=use_embedder)
    service = Parts(settings, index=index, state=state).sync
    yield service, notes_dir
    service.close()
    index.close()
    state.close()


def test_unchanged_files_are_not_read_again(files_service, caplog):
    service, notes_dir = files_service
    first = service.run_pass().summary
    assert first.added == 15 and not first.skipped

    # Same size, same mtime, other bytes (binary even): a pass that opened them would skip
    # them as "not a text file". They are not opened, so their notes stay as they were; the
    # export file's two notes both count as seen.
    path = notes_dir / "编程" / "Python" / "支付接口重试.md"
    for garbled in (path, notes_dir / "导出" / "旅行清单.leanote"):
        st = garbled.stat()
        garbled.write_bytes(b"\x00" * st.st_size)
        os.utime(garbled, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = service.run_pass().summary
    assert again.unchanged == 15 and not again.skipped
    assert again.added == again.updated == again.deleted == again.moved == again.chunks_embedded == 0
    assert search(service.index, "retry_count", "local")[0].title == "支付接口调用的重试策略"
    assert search(service.index, "二等座 06 车 11F", "local")[0].title == "回程火车票"

    # a real edit changes the mtime: only that file is read
    path.write_text("# 支付接口调用的重试策略\n\n改写后只剩一句 REWRITTEN-4。\n", encoding="utf-8")
    old_mtime(path)
    edited = service.run_pass().summary
    assert edited.updated == 1 and edited.unchanged == 14
    assert "REWRITTEN-4" in search(service.index, "REWRITTEN-4", "local")[0].text

    # a file added, one deleted (no warning for it), one touched; len() follows the folder
    assert len(service.source) == 14  # files: the export holds two notes
    (notes_dir / "生活" / "新.md").write_text("# 新\n\n新加的 ADDED-5\n", encoding="utf-8")
    (notes_dir / "生活" / "菜谱" / "番茄炒蛋.md").unlink()
    touched = notes_dir / "English" / "Git rebase vs merge.md"
    later = time.time() - 600
    os.utime(touched, (later, later))
    assert len(service.source) == 14
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        changed = service.run_pass().summary
    assert (changed.added, changed.deleted, changed.moved, changed.unchanged) == (1, 1, 1, 13)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_reconcile_reads_every_file_and_privacy_rules_apply_to_unchanged_files(files_service):
    service, notes_dir = files_service
    service.run_pass()
    path = notes_dir / "编程" / "Python" / "支付接口重试.md"
    st = path.stat()
    path.write_bytes(b"\x00" * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    full = service.run_pass(reconcile=True).summary  # the daily reconcile: no fingerprint trusted
    assert [s["note"] for s in full.skipped] == ["编程/Python/支付接口重试.md"]
    assert full.unchanged == 14

    # a notebook made private: its untouched files leave at the next pass all the same
    service.settings = service.settings.model_copy(
        update={"exclude": service.settings.exclude.model_copy(update={"notebooks": ["菜谱"]})})
    service.index.settings = service.settings
    private = service.run_pass().summary
    assert private.deleted == 2
    assert all(h.notebook != "生活 / 菜谱" for h in search(service.index, "红烧肉 番茄炒蛋", "local", 20))


def test_an_emptied_or_missing_folder_deletes_nothing(files_service):
    service, notes_dir = files_service
    service.run_pass()
    moved = notes_dir.with_name("elsewhere")
    shutil.move(notes_dir, moved)
    gone = service.run_pass()
    assert "is not a folder of notes" in gone.failures[service.source.name]
    notes_dir.mkdir()  # an unmounted share: an empty folder where the notes were
    empty = service.run_pass(force=True)  # (force: past the backoff the failure started)
    assert "holds no notes now" in empty.failures[service.source.name]
    assert service.state.indexed_count(service.source.name, "") == 15
    notes_dir.rmdir()
    shutil.move(moved, notes_dir)
    back = service.run_pass(force=True)
    assert back.ok and back.summary.unchanged == 15 and back.summary.chunks_embedded == 0


# --- mongodump: a folder of backups ------------------------------------------------------------

USER = ObjectId("5dbed2987db161bc2a85b919")
BOOK = ObjectId("5e16ca22f6ffdbad5b4ba595")


def oid(n: int) -> ObjectId:
    return ObjectId(f"{n:024x}")


def backup(path: Path, notes: dict[int, str], mtime: float | None = None) -> Path:
    """A backup_leanote_*.tar.gz as Leanote's admin page makes it, holding these notes."""
    files = {
        "users": [{"_id": USER, "Email": "one@example.com", "Usn": 9}],
        "notebooks": [{"_id": BOOK, "UserId": USER, "Title": "运维", "Usn": 1, "IsDeleted": False}],
        "notes": [{"_id": oid(n), "UserId": USER, "NotebookId": BOOK, "Title": f"笔记{n}", "IsMarkdown": True,
                   "IsTrash": False, "IsDeleted": False, "Usn": n} for n in notes],
        "note_contents": [{"_id": oid(n), "UserId": USER, "Content": text} for n, text in notes.items()],
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, docs in files.items():
            data = b"".join(bson.encode(d) for d in docs)
            info = tarfile.TarInfo(f"backup/leanote/{name}.bson")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def backups(tmp_path, use_embedder):
    folder = tmp_path / "mongodb_backup"
    folder.mkdir()
    settings = make_settings(tmp_path, source={"kind": "mongodump", "path": str(folder)})
    state = State(settings.state_dir)
    index = NoteIndex.open(settings, create=True, embedder=use_embedder)
    holder = {}

    def open_service():
        holder["service"] = Parts(settings, index=index, state=state).sync
        return holder["service"]

    yield folder, settings, open_service
    if "service" in holder:
        holder["service"].close()
    index.close()
    state.close()


def indexed_ids(state: State) -> set[str]:
    return {row[0] for row in state.db.execute("SELECT note_id FROM notes WHERE status = 'indexed'")}


def test_a_folder_of_backups_follows_the_newest_and_extracts_only_a_new_one(backups):
    folder, settings, open_service = backups
    with pytest.raises(UserError, match="holds no Leanote backup"):
        open_service()
    day = 86400
    now = time.time()
    # the time in the name decides, not the mtime: the newest by name is the oldest file
    backup(folder / "backup_leanote_20250101000000.tar.gz", {9: "旧备份里才有的笔记 OLD-ONLY-9"}, mtime=now - day)
    backup(folder / "backup_leanote_20250601000000.tar.gz",
           {1: "备份一的内容 FIRST-1", 2: "第二条 SECOND-2", 3: "第三条 THIRD-3"}, mtime=now - 3 * day)
    service = open_service()
    assert len(service.source) == 3
    first = service.run_pass()
    assert first.ok and first.summary.added == 3
    assert indexed_ids(service.state) == {str(oid(1)), str(oid(2)), str(oid(3))}
    tmp = settings.state_dir / "tmp"
    assert list(tmp.iterdir()) == []  # the extracted copy is gone

    # Unchanged (same path, size, mtime): nothing is extracted or read. Garbage of the same
    # size with the old mtime would fail any extraction; the pass does not even open it.
    newest = folder / "backup_leanote_20250601000000.tar.gz"
    st = newest.stat()
    original = newest.read_bytes()
    newest.write_bytes(b"\x00" * st.st_size)
    os.utime(newest, ns=(st.st_atime_ns, st.st_mtime_ns))
    idle = service.run_pass()
    assert idle.ok and idle.summary.unchanged == 3
    assert idle.summary.added == idle.summary.updated == idle.summary.deleted == 0
    newest.write_bytes(original)
    os.utime(newest, ns=(st.st_atime_ns, st.st_mtime_ns))

    # a newer backup replaces it: note 3 was deleted in Leanote, note 2 edited
    backup(folder / "backup_leanote_20250701000000.tar.gz", {1: "备份一的内容 FIRST-1", 2: "改过的第二条 EDITED-2"},
           mtime=now - 2 * day)
    newer = service.run_pass()
    assert newer.ok, newer.failures
    s = newer.summary
    assert (s.unchanged, s.updated, s.deleted) == (1, 1, 1)
    assert indexed_ids(service.state) == {str(oid(1)), str(oid(2))}
    assert search(service.index, "EDITED-2", str(USER))[0].note_id == str(oid(2))
    assert list(tmp.iterdir()) == []

    # an unreadable newest backup (a copy still being written) fails the pass; nothing leaves
    (folder / "backup_leanote_20250801000000.tar.gz").write_bytes(b"\x1f\x8b\x08 half a gzip")
    broken = service.run_pass()
    assert "cannot read backup archive" in broken.failures[service.source.name]
    assert indexed_ids(service.state) == {str(oid(1)), str(oid(2))}
    assert list(tmp.iterdir()) == []

    # every backup removed: a clear error, the index kept
    for path in folder.iterdir():
        path.unlink()
    empty = service.run_pass(force=True)
    assert "holds no Leanote backup" in empty.failures[service.source.name]
    assert indexed_ids(service.state) == {str(oid(1)), str(oid(2))}


def test_a_single_backup_file_is_extracted_again_only_when_it_changes(tmp_path, use_embedder):
    archive = backup(tmp_path / "backup_leanote_20250601.tar.gz", {1: "内容一 ONE-1", 2: "内容二 TWO-2"},
                     mtime=time.time() - 3600)
    settings = make_settings(tmp_path, source={"kind": "mongodump", "path": str(archive)})
    state = State(settings.state_dir)
    with NoteIndex.open(settings, create=True, embedder=use_embedder) as index:
        service = Parts(settings, index=index, state=state).sync
        assert service.run_pass().summary.added == 2
        st = archive.stat()
        archive.write_bytes(b"\x00" * st.st_size)  # same size and mtime: not opened
        os.utime(archive, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert service.run_pass().summary.unchanged == 2
        backup(archive, {1: "内容一 ONE-1"})  # replaced in place: new mtime
        again = service.run_pass()
        assert again.ok and again.summary.deleted == 1 and again.summary.unchanged == 1
        # the daily reconcile reads it again even so
        assert service.run_pass(reconcile=True).summary.unchanged == 1
        service.close()
    state.close()
    assert list((settings.state_dir / "tmp").iterdir()) == []
    assert MongodumpSource(archive, settings.state_dir).current().archive
