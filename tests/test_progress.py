"""A first index a person can follow: how far a pass got, per source and account, page,
notes and chunks, the share done and the time left; kept up to date on a terminal, and off
one (systemd's journal, a pipe) a line for each account and then one a minute."""

from __future__ import annotations

import fcntl
import logging
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time

from bot.cli import main
from sync.progress import Every, Step, columns, in_the_log

from conftest import DEADLINE, EXAMPLES, REPO, THREADS
from fakes.leanote import FakeLeanote
from test_mongodump import make_dump

ALICE, BOB = "5dbed2987db161bc2a85b919", "5f38858837b4dcd92cefeb84"
BOOK_A, BOOK_B = "5e16ca22f6ffdbad5b4ba501", "5e16ca22f6ffdbad5b4ba502"


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_step_says_where_it_is_and_how_long_is_left():
    step = Step("alice@example.com", notes=150, chunks=420, page=2, done=0.5, started=time.monotonic() - 60)
    line = step.line()
    assert line.startswith("alice@example.com: page 2, 150 notes read, 420 chunks embedded, 50%")
    assert "about 60 s left" in line or "about 1 min left" in line
    assert Step("notes", notes=3, total=12, done=0.25).line().startswith("notes: 3/12 notes read")
    assert "left" not in Step("x", done=0.01).line()  # too early to tell
    as_json = step.as_json()
    assert as_json["seen"] == 150 and as_json["embedded"] == 420 and as_json["line"] == line


def test_off_a_terminal_a_line_for_each_account_then_one_a_minute():
    clock, said = Clock(), []
    every = Every(said.append, clock=clock)
    a = Step("alice@example.com")
    for i in range(100):  # a hundred notes in 30 s
        a.notes = i
        every(a)
        clock.t += 0.3
    assert len(said) == 1 and said[0].startswith("alice@example.com: 0 notes")  # the account's first step
    clock.t = 1000.0 + 59.5
    every(a)
    assert len(said) == 1
    clock.t = 1000.0 + 60.0  # a minute since the first line
    every(a)
    assert len(said) == 2
    every(Step("bob@example.com"))  # another account: said at once
    assert len(said) == 3 and said[2].startswith("bob@example.com")


def test_the_daemon_logs_a_pass_only_once_it_has_lasted_a_minute(caplog):
    clock = Clock()
    caplog.set_level(logging.INFO)
    log_every = in_the_log()
    log_every.clock = clock
    step = Step("alice@example.com")
    for _ in range(50):  # 50 s: nothing
        log_every(step)
        clock.t += 1
    assert not [r for r in caplog.records if "syncing" in r.getMessage()]
    for _ in range(100):  # 100 s more: a line at 60 s and at 120 s
        log_every(step)
        clock.t += 1
    assert len([r for r in caplog.records if r.getMessage().startswith("syncing alice@example.com")]) == 2


def test_the_first_index_of_leanote_accounts_shows_each_account_and_page(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LR_PW_ALICE", "alice-pw")
    monkeypatch.setenv("LR_PW_BOB", "bob-pw")
    with FakeLeanote() as fake:
        for user, email, book in ((ALICE, "alice@example.com", BOOK_A), (BOB, "bob@example.com", BOOK_B)):
            fake.add_user(user, email, email.split("@")[0] + "-pw")
            fake.put_notebook({"NotebookId": book, "UserId": user, "Title": "工作"})
            for i in range(5):
                fake.put_note({"NoteId": f"6{user[1:-2]}{i:02d}", "UserId": user, "NotebookId": book,
                               "Title": f"{email} 第 {i} 条", "Content": f"PROGRESS-{i} 内容 {i}"})
        cfg = tmp_path / "config.yaml"
        cfg.write_text(
            f"leanote: {{base_url: '{fake.url}'}}\nstate_dir: data\nsync: {{page_size: 2}}\n"
            "source:\n  kind: leanote_api\n  accounts:\n"
            "    - {email: alice@example.com, password_env: LR_PW_ALICE}\n"
            "    - {email: bob@example.com, password_env: LR_PW_BOB}\n"
            "rerank: {kind: none}\nollama: {enabled: false}\n")
        code = main(["--config", str(cfg), "index"])
        out, err = capsys.readouterr()
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("indexing ")]
    assert [line.split(":")[0] for line in lines] == ["indexing alice@example.com", "indexing bob@example.com"]
    assert all("page 1" in line and "notes read" in line and "chunks embedded" in line for line in lines)
    assert "10 added" in out


def test_a_line_fits_the_width_keeping_the_counts_and_shortening_the_path():
    path = "files:/home/someone/Documents/Leanote/exported/notes/of/the/family/笔记"
    step = Step(path, notes=1234, total=5310, chunks=4567, done=0.232, started=time.monotonic() - 60)
    assert step.line() == f"{path}: 1,234/5,310 notes read, 4,567 chunks embedded, 23%, about 3 min left"
    for width in (200, 100, 79, 60):
        line = step.line(width=width, before="indexing ")
        assert columns(line) <= width, (width, line)
        assert "1,234/5,310 notes read" in line and "23%" in line and "about 3 min left" in line, line
    assert step.line(width=200, before="indexing ") == f"indexing {step.line()}"
    # 79 columns: the path loses its middle; its start and its last folder stay
    line = step.line(width=79, before="indexing ")
    assert line.startswith("indexing files:/home") and "…" in line and "/笔记: 1,234/5,310" in line, line
    # the chunks go before the path gets too short to tell; then the path goes; then the end is cut
    assert step.line(width=70) == "files:/home…family/笔记: 1,234/5,310 notes read, 23%, about 3 min left"
    assert step.line(width=60) == "1,234/5,310 notes read, 23%, about 3 min left"
    assert step.line(width=40, before="indexing ") == "indexing 1,234/5,310 notes read, 23%, a…"
    # a step the daemon told over the API keeps its time left
    told = Step.from_json(step.as_json())
    assert told.line(width=79) == step.line(width=79) and told.notes == 1234 and told.total == 5310


def on_a_terminal(args: list[str], width: int, env: dict | None = None) -> tuple[list[str], str]:
    """``leanote-rag ARGS`` with its stderr on a terminal ``width`` columns wide: the lines
    drawn there (each ``\\r`` starts one again), and stdout."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, width, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "bot.cli", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    os.close(slave)
    drawn, deadline = b"", time.monotonic() + DEADLINE
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # every writer closed the terminal: the process ended
                break
            if not data:
                break
            drawn += data
        out = proc.communicate(timeout=DEADLINE)[0].decode()
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, drawn.decode(errors="replace")
    return [line for line in drawn.decode().split("\r") if line.strip()], out


def counts(lines: list[str]) -> list[tuple[int, int]]:
    found = [re.search(r"(\d+)/(\d+) notes read", line) for line in lines]
    assert all(found), lines
    return [(int(m.group(1)), int(m.group(2))) for m in found]


def test_an_index_on_an_80_column_terminal_shows_how_far_it_got_and_counts_every_note_once(tmp_path):
    """The sample notes, in a folder whose path alone is wider than the terminal: every line
    keeps the counts and the share done; the total counts the notes (a .leanote export holds
    two), and the count ends on it."""
    notes = tmp_path / ("a-folder-with-a-long-name-" * 3) / "笔记"
    shutil.copytree(EXAMPLES, notes)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"source: {{kind: files, path: '{notes}'}}\nstate_dir: data\nrerank: {{kind: none}}\n"
                   f"ollama: {{enabled: false}}\nembedder: {{threads: {THREADS}}}\n")
    lines, out = on_a_terminal(["--config", str(cfg), "index"], 80)
    assert "15 added" in out
    assert all(columns(line) <= 79 for line in lines), lines
    assert all(line.startswith("indexing files:/") and "…" in line and "笔记: " in line for line in lines), lines
    seen = counts(lines)
    assert {total for _, total in seen} == {15} and seen[-1] == (15, 15)
    assert [n for n, _ in seen] == sorted(n for n, _ in seen)
    assert "100%" in lines[-1]
    # a terminal that says it has no columns, and $COLUMNS=0: a line for 80 columns
    for size, env in ((0, {}), (0, {"COLUMNS": "0"})):
        lines, out = on_a_terminal(["--config", str(cfg), "index", "--reconcile"], size, env)
        assert "15 unchanged" in out and lines and all(columns(line) <= 79 for line in lines), (size, lines)
        assert counts(lines)[-1] == (15, 15)


def test_a_mongodump_index_counts_its_notes_not_its_checkpoint(tmp_path):
    """A backup's 6 notes (a trashed one and a deleted one among them) read as 6 of 6, the
    first time and when the backup did not change."""
    make_dump(tmp_path)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"source: {{kind: mongodump, path: '{tmp_path / 'dump'}'}}\nstate_dir: data\n"
                   f"rerank: {{kind: none}}\nollama: {{enabled: false}}\nembedder: {{threads: {THREADS}}}\n")
    for _ in range(2):
        lines, _ = on_a_terminal(["--config", str(cfg), "index"], 100)
        seen = counts(lines)
        assert seen[-1] == (6, 6) and all(n <= total for n, total in seen), lines
