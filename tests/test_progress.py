"""A first index a person can follow: how far a pass got, per source and account, page,
notes and chunks, the share done and the time left; kept up to date on a terminal, and off
one (systemd's journal, a pipe) a line for each account and then one a minute."""

from __future__ import annotations

import logging
import time

from bot.cli import main
from sync.progress import Every, Step, in_the_log

from fakes.leanote import FakeLeanote

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
