"""``serve`` when what it stands on fails: systemd's notify socket not read, a disk that
fills up, a sync state file that is damaged, a Leanote restored from a backup (its USN
goes back), two daemons started at once on one state directory. Each case is a real
``serve`` process; the tests wait for conditions with generous deadlines."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from conftest import THREADS, unix_http
from bot.root import Parts

EXE = str(Path(sys.executable).with_name("leanote-rag"))
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "notes"


def until(check, timeout=90.0, what="it", proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"serve exited ({proc.returncode}) while waiting for {what}"
                                 + (f"\n{log.read_text()[-3000:]}" if log else ""))
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{log.read_text()[-3000:]}" if log else ""))


class Serve:
    """A config over the sample notes (or a Leanote) and a ``serve`` process on it."""

    def __init__(self, tmp_path: Path, state_dir: Path | None = None, extra: str = "", env: dict | None = None):
        self.sock = Path(f"/tmp/lr-f-{uuid.uuid4().hex[:8]}.sock")
        self.config = tmp_path / "config.yaml"
        self.state_dir = state_dir or tmp_path / "data"
        self.log = tmp_path / f"serve-{uuid.uuid4().hex[:4]}.log"
        if "source:" not in extra:
            extra = f"source: {{kind: files, path: '{EXAMPLES}'}}\n" + extra
        self.config.write_text(
            f"state_dir: '{self.state_dir}'\nollama: {{enabled: false}}\nrerank: {{kind: none}}\n"
            f"embedder: {{threads: {THREADS}}}\n"
            f"api: {{socket: '{self.sock}'}}\n{extra}")
        self.env = {**os.environ, **(env or {})}
        self.env.pop("NOTIFY_SOCKET", None)
        self.env.pop("WATCHDOG_USEC", None)
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None
        self.started: list[subprocess.Popen] = []

    def start(self, log: Path | None = None) -> subprocess.Popen:
        out = (log or self.log).open("w")
        self.proc = subprocess.Popen([EXE, "--config", str(self.config), "serve"], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=out, text=True)
        self.started.append(self.proc)
        return self.proc

    def cli(self, *args: str, timeout=120) -> subprocess.CompletedProcess:
        return subprocess.run([EXE, "--config", str(self.config), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def health(self, timeout=5.0) -> httpx.Response | None:
        try:
            with unix_http(self.sock) as http:
                return http.get("/health", timeout=timeout)
        except httpx.HTTPError:
            return None

    def ready(self) -> bool:
        reply = self.health()
        return reply is not None and reply.status_code == 200 and reply.json()["passes"] >= 1

    def text(self) -> str:
        return self.log.read_text()

    def stop(self, timeout=30.0) -> float:
        """SIGTERM; seconds until it exited (it is killed, and the test fails, past ``timeout``)."""
        assert self.proc is not None
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"serve did not stop within {timeout:g} s of SIGTERM\n{self.text()[-3000:]}") from None
        return time.monotonic() - start

    def kill(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def serves():
    started: list[Serve] = []

    def make(*args, **kwargs) -> Serve:
        s = Serve(*args, **kwargs)
        started.append(s)
        return s

    yield make
    for s in started:
        s.kill()
        s.sock.unlink(missing_ok=True)  # left behind by a killed one


# --- systemd's notify socket ------------------------------------------------------------------


@pytest.mark.slow
def test_an_unread_notify_socket_never_blocks_the_api_or_sigterm(tmp_path, serves):
    """systemd stuck (its notify socket not read): the watchdog pings fill the socket's
    queue and are dropped, said once; the API answers and SIGTERM stops the daemon."""
    path = f"/tmp/lr-notify-{uuid.uuid4().hex[:8]}"
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # full after a few messages
    sink.bind(path)
    try:
        s = serves(tmp_path, extra="sync: {interval: 1h}\n",
                   env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000"})  # a ping every 10 ms
        proc = s.start()
        until(lambda: "is full (systemd does not read it)" in s.text(), what="the dropped pings to be logged", proc=proc,
              log=s.log)
        until(s.ready, what="/health to answer ready", proc=proc, log=s.log)
        time.sleep(0.5)  # the queue stays full meanwhile: many more pings dropped
        assert s.ready()
        assert s.cli("search", "番茄炒蛋").returncode == 0  # through the API
        s.stop(timeout=30)
        log = s.text()
        assert s.proc.returncode == 0, log[-3000:]
        assert log.count("is full (systemd does not read it)") == 1 and "Traceback" not in log
    finally:
        sink.close()
        os.unlink(path)


# --- two serve at once ------------------------------------------------------------------------


@pytest.mark.slow
def test_two_serve_started_at_once_on_one_state_dir_one_serves_the_other_is_refused(tmp_path, serves):
    s = serves(tmp_path, extra="sync: {interval: 1h}\n")
    first, second = s.start(tmp_path / "a.log"), s.start(tmp_path / "b.log")  # the same instant, near enough
    procs = {tmp_path / "a.log": first, tmp_path / "b.log": second}
    refused = until(lambda: [(log, p) for log, p in procs.items() if p.poll() is not None],
                    what="one of them to be refused")
    assert len(refused) == 1
    log, loser = refused[0]
    (winner_log, winner), = [(lg, p) for lg, p in procs.items() if p is not loser]
    assert loser.returncode == 2
    assert "already runs for" in log.read_text() and "stop it first" in log.read_text()
    s.proc, s.log = winner, winner_log
    until(s.ready, what="the other one to serve", proc=winner, log=winner_log)
    assert s.cli("search", "番茄炒蛋").returncode == 0
    assert s.stop() and winner.returncode == 0


# --- a damaged state file ---------------------------------------------------------------------


def damage(db: Path, first: int = 2, step: int = 3) -> None:
    """Garbage over some of the file's pages, as a bad disk or a careless copy leaves it."""
    pages = db.stat().st_size // 4096
    with db.open("r+b") as f:
        for page in range(first, pages, step):
            f.seek(page * 4096)
            f.write(b"\xde\xad\xbe\xef" * 1024)


@pytest.mark.slow
def test_a_damaged_state_file_is_named_with_the_fix_by_serve_and_status_and_rebuild_mends_it(tmp_path, serves):
    s = serves(tmp_path, extra="sync: {interval: 1h}\n")
    assert s.cli("index").returncode == 0
    db = s.state_dir / "state.db"
    assert not db.with_name("state.db-wal").exists()  # everything is in the file itself
    damage(db)

    proc = s.start()
    try:
        proc.wait(timeout=120)  # not a retry loop: it says what is wrong, and exits
    except subprocess.TimeoutExpired:
        raise AssertionError(f"serve kept running on a damaged state file\n{s.text()[-3000:]}") from None
    log = s.text()
    assert proc.returncode == 2, log[-3000:]
    assert f"{db} is damaged" in log and "leanote-rag index --rebuild" in log and "Traceback" not in log

    status = s.cli("status")
    assert status.returncode == 2
    assert f"{db} is damaged" in status.stderr and "index --rebuild" in status.stderr

    rebuilt = s.cli("index", "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert list(s.state_dir.glob("state.db.broken-*"))  # set aside, not deleted
    assert s.cli("status").returncode == 0
    s.start()
    until(s.ready, what="serve on the rebuilt state", proc=s.proc, log=s.log)
    assert s.stop() and s.proc.returncode == 0


# --- Leanote restored from a backup: its USN goes back -----------------------------------------

ALICE, BOB = "5dbed2987db161bc2a85b919", "5f38858837b4dcd92cefeb84"
WORK, LINUX = "5e16ca22f6ffdbad5b4ba501", "5e16ca22f6ffdbad5b4ba504"


@pytest.mark.slow
def test_a_usn_below_the_synced_one_compares_every_note_at_once_and_status_says_why(tmp_path, monkeypatch,
                                                                                     use_embedder, caplog, capsys):
    from rag.index.note_index import NoteIndex
    from rag.index.retrieve import search
    from bot.cli.report import print_status
    from bot.usecases.status import status_report
    from sync.state import State

    from conftest import make_settings
    from fakes.leanote import FakeLeanote

    monkeypatch.setenv("LR_PW_ALICE", "alice-pw")
    monkeypatch.setenv("LR_PW_BOB", "bob-pw")
    ids = iter(range(1, 100))

    def note(user, book, title, content):
        return {"NoteId": "6%023x" % next(ids), "UserId": user, "NotebookId": book, "Title": title, "Content": content}

    with FakeLeanote() as leanote:
        leanote.add_user(ALICE, "alice@example.com", "alice-pw")
        leanote.add_user(BOB, "bob@example.com", "bob-pw")
        leanote.put_notebook({"NotebookId": WORK, "UserId": ALICE, "Title": "工作"})
        leanote.put_notebook({"NotebookId": LINUX, "UserId": BOB, "Title": "Linux"})
        first = leanote.put_note(note(ALICE, WORK, "周报", "BEFORE-BACKUP 第一版"))
        leanote.put_note(note(BOB, LINUX, "nginx", "BOB-NOTE 反向代理"))
        settings = make_settings(
            tmp_path, leanote={"base_url": leanote.url},
            source={"kind": "leanote_api", "path": None, "accounts": [
                {"email": "alice@example.com", "password_env": "LR_PW_ALICE"},
                {"email": "bob@example.com", "password_env": "LR_PW_BOB"}]},
            sync={"http_timeout": 5})
        state = State(settings.state_dir)
        index = NoteIndex.open(settings, create=True, embedder=use_embedder)
        service = Parts(settings, index=index, state=state, scheduled=True).sync

        def found(query: str, user=ALICE) -> set[str]:
            return {h.title for h in search(index, query, user, 10) if query in h.text}

        try:
            assert service.run_pass().ok
            backup = leanote.backup()
            leanote.put_note(note(ALICE, WORK, "后来的", "POSTBACKUP-NOTE 备份之后写的"))
            leanote.edit_note(first["NoteId"], content="SECOND-VERSION 第二版")
            assert service.run_pass().ok
            assert found("POSTBACKUP-NOTE") == {"后来的"} and found("SECOND-VERSION") == {"周报"}
            synced = state.account(service.source.name, "alice@example.com").cursor

            leanote.restore(backup)  # the server is back where it was; work goes on there
            leanote.put_note(note(ALICE, WORK, "恢复之后", "AFTER-RESTORE 恢复后新写的"))
            assert leanote.users[ALICE]["Usn"] < synced  # a USN we would take as seen
            caplog.clear()
            result = service.run_pass()  # the next ordinary pass, not the daily reconcile
            assert result.ok
            assert found("AFTER-RESTORE") == {"恢复之后"}
            assert found("POSTBACKUP-NOTE") == set() and found("SECOND-VERSION") == set()
            assert found("BEFORE-BACKUP") == {"周报"}
            assert found("BOB-NOTE", BOB) == {"nginx"}  # the other account as it was
            warned = [r.getMessage() for r in caplog.records if "went back" in r.getMessage()]
            assert len(warned) == 1 and "alice@example.com" in warned[0] and f"from {synced} to" in warned[0]

            report = status_report(settings, state, index.store)
            alice = next(a for a in report["accounts"] if a["account"] == "alice@example.com")
            assert alice["lag"] == 0 and alice["usn_went_back"]["from"] == synced
            print_status(report)
            out = capsys.readouterr().out
            assert f"the server's history changed: its USN went back from {synced} to" in out and "lag -" not in out

            leanote.put_note(note(ALICE, WORK, "再后来", "LATER-ON 之后的改动"))  # the cursors follow the server again
            assert service.run_pass().ok and found("LATER-ON") == {"再后来"}
        finally:
            service.close()
            index.close()
            state.close()


def test_a_restore_is_noticed_when_the_usn_climbed_back_past_the_cursor(tmp_path, monkeypatch, use_embedder,
                                                                       caplog, capsys):
    """Back up; add X1, X2 and sync; restore; add Y1-Y4 (the server's USN is above ours again);
    sync: X1 and X2 leave the index, Y1-Y4 come in, at once, and the log and status say why."""
    from rag.index.note_index import NoteIndex
    from rag.index.retrieve import search
    from bot.cli.report import print_status
    from bot.usecases.status import status_report
    from sync.state import State

    from conftest import make_settings
    from fakes.leanote import FakeLeanote

    monkeypatch.setenv("LR_PW_ALICE", "alice-pw")
    ids = iter(range(1, 100))

    def note(title, content):
        return {"NoteId": "6%023x" % next(ids), "UserId": ALICE, "NotebookId": WORK, "Title": title,
                "Content": content}

    with FakeLeanote() as leanote:
        leanote.add_user(ALICE, "alice@example.com", "alice-pw")
        leanote.put_notebook({"NotebookId": WORK, "UserId": ALICE, "Title": "工作"})
        leanote.put_note(note("旧笔记", "BEFORE-BACKUP 备份之前就有"))
        settings = make_settings(
            tmp_path, leanote={"base_url": leanote.url},
            source={"kind": "leanote_api", "path": None,
                    "accounts": [{"email": "alice@example.com", "password_env": "LR_PW_ALICE"}]},
            sync={"http_timeout": 5})
        state = State(settings.state_dir)
        index = NoteIndex.open(settings, create=True, embedder=use_embedder)
        service = Parts(settings, index=index, state=state, scheduled=True).sync

        def found(query: str) -> set[str]:
            return {h.title for h in search(index, query, ALICE, 20) if query in h.text}

        try:
            assert service.run_pass().ok
            backup = leanote.backup()
            for i in (1, 2):
                leanote.put_note(note(f"X{i}", f"LOST-IN-RESTORE X{i} 恢复时丢掉的"))
            assert service.run_pass().ok and found("LOST-IN-RESTORE") == {"X1", "X2"}
            synced = state.account(service.source.name, "alice@example.com").cursor

            leanote.restore(backup)
            for i in range(1, 5):
                leanote.put_note(note(f"Y{i}", f"AFTER-RESTORE Y{i} 恢复之后写的"))
            assert leanote.users[ALICE]["Usn"] > synced  # no USN went back by the time of the next pass
            caplog.clear()
            assert service.run_pass().ok  # the next ordinary pass
            assert found("LOST-IN-RESTORE") == set()
            assert found("AFTER-RESTORE") == {"Y1", "Y2", "Y3", "Y4"}
            assert found("BEFORE-BACKUP") == {"旧笔记"}
            warned = [r.getMessage() for r in caplog.records if "history for" in r.getMessage()]
            assert len(warned) == 1 and "is gone" in warned[0] and "alice@example.com" in warned[0]

            print_status(status_report(settings, state, index.store))
            out = capsys.readouterr().out
            assert "the server's history changed: note" in out and "is gone" in out

            caplog.clear()
            leanote.put_note(note("Z", "LATER-ON 之后的改动"))  # the cursors follow the server again
            assert service.run_pass().ok and found("LATER-ON") == {"Z"}
            assert not [r for r in caplog.records if "history for" in r.getMessage()]
            assert service.run_pass().ok  # idle
        finally:
            service.close()
            index.close()
            state.close()


# --- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A file system of its own (tmpfs) whose free space the test decides: the errors of a
    really full disk (ENOSPC, SQLite's SQLITE_FULL, SIGBUS in the index's mapped files),
    which no rlimit or mock reproduces. Needs root (mount); skipped otherwise."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (a real full disk)")
    mounted: list[Path] = []

    def make(mb: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m,mode=0700", "tmpfs", str(where)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(disk: Path, leave_mb: int) -> Path:
    """A file taking all but ``leave_mb`` of the disk's free space."""
    st = os.statvfs(disk)
    size = st.f_bavail * st.f_frsize - leave_mb * 2**20
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return filler


@pytest.mark.slow
def test_a_disk_too_full_at_start_is_a_clear_error_not_a_bus_error(tmp_path, small_disk, serves):
    disk = small_disk(8)  # the index alone maps two 32 MiB WAL segments
    s = serves(tmp_path, state_dir=disk / "data", extra="sync: {interval: 1h}\n")
    proc = s.start()
    proc.wait(timeout=120)
    log = s.text()
    assert proc.returncode == 1, log[-3000:]  # Unavailable: under systemd, Restart=on-failure tries again later
    assert f"the disk holding {disk / 'data'} is full" in log and "Free some space" in log
    assert "Traceback" not in log and not (disk / "data" / "qdrant").exists()  # nothing mapped
    index = s.cli("index")
    assert index.returncode == 1 and "is full" in index.stderr


@pytest.mark.slow
def test_a_disk_filling_up_while_serving_pauses_the_sync_says_so_and_it_resumes_by_itself(tmp_path, small_disk,
                                                                                          serves, notes_dir):
    disk = small_disk(200)
    s = serves(tmp_path, state_dir=disk / "data",
               extra=f"source: {{kind: files, path: '{notes_dir}'}}\n"
                     "sync: {interval: 1h, backoff_min: 1s, backoff_max: 3s, trigger_debounce: 0.1s}\n")
    proc = s.start()
    until(s.ready, what="serve to be ready", proc=proc, log=s.log)

    filler = fill(disk, leave_mb=40)
    (notes_dir / "while-full.md").write_text("# 磁盘满的时候\n\nWRITTEN-WHILE-FULL 这条笔记是在磁盘满时写的。\n")
    index = s.cli("index")  # a pass now, through the daemon
    assert index.returncode == 1 and f"the disk holding {disk / 'data'} is full" in index.stderr
    reply = s.health()
    assert reply.status_code == 503 and reply.json()["ready"] is False and reply.json()["problem"] == "the disk is full"
    assert str(disk) not in reply.text  # the unauthenticated door says what, not where
    status = s.cli("status")
    assert status.returncode == 0
    problem = [line for line in status.stdout.splitlines() if line.startswith("problem:")]
    assert len(problem) == 1 and "is full" in problem[0] and "Free some space" in problem[0]
    assert "waiting until" in problem[0]  # backing off, not a pass after pass
    assert s.cli("index").returncode == 1  # asked again: refused again, said once in the log
    assert s.text().count("sync paused: the disk holding") == 1

    filler.unlink()  # room again: the next retry (backoff, no trigger) syncs the note written meanwhile
    until(s.ready, what="the sync to resume", proc=proc, log=s.log)
    search = s.cli("search", "WRITTEN-WHILE-FULL")
    assert search.returncode == 0 and "磁盘满的时候" in search.stdout
    assert "there is room on the disk again" in s.text()
    assert s.stop() and proc.returncode == 0
    assert "Traceback" not in s.text()


class Scribbler:
    """Note files written under ``folder`` every 50 ms (the watcher hears each), until ``stop``."""

    def __init__(self, folder: Path):
        import threading

        self.folder, self.stop = folder, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stop.wait(0.05):
            (self.folder / "scribble.md").write_text(f"# 草稿\n\n第 {i} 次改动\n", encoding="utf-8")
            i += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def passes(s: Serve) -> int:
    reply = s.health()
    assert reply is not None, "the socket does not answer"
    return reply.json()["passes"]


@pytest.mark.slow
def test_a_short_disk_pauses_the_sync_whatever_the_watcher_says_and_it_resumes_once_there_is_room(
        tmp_path, small_disk, serves, notes_dir):
    """A file changing all the time (the watcher asks for a pass at each change) while the disk
    is too full: one pass per backoff step, not hundreds a second; and once space is freed
    the sync resumes within seconds, not at the next backoff step (a minute away here)."""
    disk = small_disk(200)
    s = serves(tmp_path, state_dir=disk / "data",
               extra=f"source: {{kind: files, path: '{notes_dir}'}}\n"
                     "sync: {interval: 1h, backoff_min: 60s, backoff_max: 30m, watch_debounce: 0.1s}\n")
    proc = s.start()
    until(s.ready, what="serve to be ready", proc=proc, log=s.log)
    filler = fill(disk, leave_mb=40)
    with Scribbler(notes_dir):
        until(lambda: "sync paused: the disk holding" in s.text(), what="the pause", proc=proc, log=s.log)
        paused_at = passes(s)
        time.sleep(6.0)  # a window for the watcher to ask, many times over
        during = passes(s) - paused_at
    assert during <= 1, f"{during} passes in 6 s while paused (backoff_min is 60 s)"
    (notes_dir / "while-full.md").write_text("# 磁盘满的时候\n\nWRITTEN-WHILE-FULL 这条笔记是在磁盘满时写的。\n")
    freed = time.monotonic()
    filler.unlink()  # room again: the daemon sees it, not at the next backoff step
    until(lambda: "磁盘满的时候" in s.cli("search", "WRITTEN-WHILE-FULL").stdout, timeout=40,
          what="the note written while full to be searchable", proc=proc, log=s.log)
    assert time.monotonic() - freed < 40
    log = s.text()
    assert "there is room on the disk again" in log and log.count("sync paused: the disk holding") == 1
    assert s.stop() and proc.returncode == 0 and "Traceback" not in s.text()


@pytest.mark.slow
def test_a_state_file_damaged_while_serving_stops_the_sync_once_whatever_the_watcher_says(tmp_path, serves,
                                                                                          notes_dir):
    s = serves(tmp_path, extra=f"source: {{kind: files, path: '{notes_dir}'}}\n"
                               "sync: {interval: 1h, watch_debounce: 0.1s}\n")
    proc = s.start()
    until(s.ready, what="serve to be ready", proc=proc, log=s.log)
    for name in ("state.db", "state.db-wal", "state.db-shm"):  # every page, whichever file holds it, and the index of them
        damage(s.state_dir / name, first=1, step=1)
    with Scribbler(notes_dir):
        until(lambda: "sync stopped:" in s.text(), what="the damage to be found", proc=proc, log=s.log)
        stopped_at = passes(s)
        time.sleep(6.0)
        during = passes(s) - stopped_at
    assert during <= 1, f"{during} passes in 6 s on a damaged state file"
    assert s.text().count("sync stopped:") == 1 and "index --rebuild" in s.text()
    status = s.cli("status")  # through the daemon, which is still there to say it
    assert "state.db" in status.stderr and "index --rebuild" in status.stderr
    assert s.stop() and proc.returncode == 0


def test_sqlites_own_disk_full_error_is_read_as_a_full_disk_naming_the_folder(tmp_path, small_disk):
    """A pass that meets the full disk past the free-space check (another program filled it
    meanwhile): SQLite's error on a really full file system becomes ``DiskFull``."""
    from rag.errors import DiskFull
    from sync.faults import state_fault
    from sync.state import State

    disk = small_disk(4)
    state = State(disk / "data")
    try:
        fill(disk, leave_mb=0)
        with pytest.raises(Exception) as caught:
            with state.transaction():
                state.cache_vectors({f"k{i}": np.ones(512, dtype=np.float32) for i in range(2000)})
        fault = state_fault(caught.value, state.path)
        assert isinstance(fault, DiskFull) and f"the disk holding {disk / 'data'} is full" in str(fault)
    finally:
        state.close()


# --- SIGTERM at the end of a pass -------------------------------------------------------------


@pytest.mark.slow
def test_a_stop_asked_for_at_the_end_of_a_pass_leaves_the_index_optimization_to_the_next(tmp_path, use_embedder):
    """Building the HNSW index may take long (seconds for the corpus on a busy machine): a
    stop asked for by then does not wait for it; the next pass does it."""
    from rag.index.note_index import NoteIndex
    from sync.indexer import OPTIMIZE_PENDING, Indexer
    from sync.sources import open_source
    from sync.state import State

    from conftest import make_settings

    settings = make_settings(tmp_path, qdrant={"optimize_after": 1})
    state = State(settings.state_dir)
    stop = [False]
    try:
        with NoteIndex.open(settings, create=True, embedder=use_embedder) as index:
            source = open_source(settings)
            indexer = Indexer(index, state, source.name, should_stop=lambda: stop[0])
            for note in source.notes():
                indexer.apply(note)
            indexer.commit()
            stop[0] = True  # SIGTERM now
            indexer.finish()
            assert indexer.summary.optimize_seconds == 0.0 and state.get_meta(OPTIMIZE_PENDING) == "1"

            service = Parts(settings, index=index, state=state).sync
            try:
                assert service.run_pass().ok  # nothing changed, and yet: optimized now
            finally:
                service.close()
            assert not state.get_meta(OPTIMIZE_PENDING)
    finally:
        state.close()


def test_the_memory_limit_is_the_smallest_of_the_process_group_and_those_above(tmp_path):
    """systemd's MemoryMax as the kernel shows it (cgroup v2 and v1), read from a copy of the tree."""
    from sync.faults import memory_limit

    root = tmp_path / "cgroup"
    unit = root / "system.slice" / "leanote-rag.service"
    unit.mkdir(parents=True)
    (root / "system.slice" / "memory.max").write_text("max\n")
    (unit / "memory.max").write_text(f"{2 << 30}\n")
    v2 = tmp_path / "v2"
    v2.write_text("0::/system.slice/leanote-rag.service\n")
    assert memory_limit(v2, root) == 2 << 30
    (root / "system.slice" / "memory.max").write_text(f"{1 << 30}\n")  # a slice holding less
    assert memory_limit(v2, root) == 1 << 30
    (root / "system.slice" / "memory.max").write_text("max\n")
    (unit / "memory.max").write_text("max\n")
    assert memory_limit(v2, root) is None  # no limit
    v1 = tmp_path / "v1"
    v1.write_text("12:cpu,cpuacct:/system.slice/x\n9:memory:/system.slice/leanote-rag.service\n")
    group = root / "memory" / "system.slice" / "leanote-rag.service"
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert memory_limit(v1, root) is None
    (group / "memory.limit_in_bytes").write_text(f"{3 << 30}\n")
    assert memory_limit(v1, root) == 3 << 30
    assert memory_limit(tmp_path / "absent", root) is None  # not Linux, or not readable
