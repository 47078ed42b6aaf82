"""index, status and doctor on a live (fake) Leanote, as a user runs them."""

import json
import socket

import pytest

from bot.cli import main

from fakes.leanote import FakeLeanote

ALICE = "5dbed2987db161bc2a85b919"


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_PW_ALICE", "alice-pw")
    with FakeLeanote() as fake:
        fake.add_user(ALICE, "alice@example.com", "alice-pw")
        fake.put_notebook({"NotebookId": "5e16ca22f6ffdbad5b4ba501", "UserId": ALICE, "Title": "工作"})
        fake.put_note({"NoteId": "6" + "0" * 23, "UserId": ALICE, "NotebookId": "5e16ca22f6ffdbad5b4ba501",
                       "Title": "周报", "Content": "本周完成了 CLI-SYNC-1"})
        cfg = tmp_path / "config.yaml"
        cfg.write_text(
            f"leanote: {{base_url: '{fake.url}'}}\nstate_dir: data\n"
            f"source:\n  kind: leanote_api\n  accounts:\n    - {{email: alice@example.com, password_env: LR_PW_ALICE}}\n"
            "rerank: {kind: none}\nollama: {enabled: false}\n"
        )
        yield fake, cfg


def test_index_then_status_shows_cursor_and_lag(setup, capsys):
    fake, cfg = setup
    code, out, _ = run(capsys, "--config", str(cfg), "index", "--json")
    assert code == 0 and json.loads(out)["added"] == 1
    fake.put_note({"NoteId": "6" + "0" * 22 + "9", "UserId": ALICE, "NotebookId": "", "Title": "新", "Content": "x"})
    code, out, _ = run(capsys, "--config", str(cfg), "status", "--json")
    assert code == 0
    acc = json.loads(out)["accounts"][0]
    assert acc["account"] == "alice@example.com" and acc["user_id"] == ALICE
    assert acc["lag"] == 0 and acc["notes_indexed"] == 1 and acc["last_error"] is None
    code, out, _ = run(capsys, "--config", str(cfg), "status")
    assert "account alice@example.com: up to date with the server; last synced " in out
    # the source named whole: where Leanote is, and whose accounts
    assert f"source:   leanote_api {fake.url} (1 account: alice@example.com)" in out
    code, out, _ = run(capsys, "--config", str(cfg), "search", "CLI-SYNC-1", "--json")
    assert json.loads(out)["hits"][0]["url"] == f"{fake.url}/note/{'6' + '0' * 23}"


def test_index_reports_a_wrong_password_and_exits_1(setup, capsys, monkeypatch):
    _, cfg = setup
    monkeypatch.setenv("LR_PW_ALICE", "wrong")
    code, _, err = run(capsys, "--config", str(cfg), "index")
    assert code == 1 and "refused the login of alice@example.com" in err


def test_doctor_all_good(setup, capsys):
    _, cfg = setup
    run(capsys, "--config", str(cfg), "index")
    code, out, _ = run(capsys, "--config", str(cfg), "doctor")
    assert code == 0, out
    assert "ok   leanote_api account alice@example.com: logged in as user" in out
    assert "ok   embedder (use)" in out


def test_doctor_before_the_first_index_says_so_and_passes(setup, capsys):
    """The README's order: doctor, then index. Nothing is wrong yet."""
    _, cfg = setup
    code, out, _ = run(capsys, "--config", str(cfg), "doctor")
    assert code == 0, out
    assert "WARN index (edge): not indexed yet: run `leanote-rag index`" in out and "FAIL" not in out
    assert "ok   leanote_api account alice@example.com: logged in as user" in out


def test_doctor_says_how_to_fix_each_failure(setup, capsys, monkeypatch, tmp_path):
    _, cfg = setup
    monkeypatch.setenv("LR_PW_ALICE", "wrong")
    code, out, _ = run(capsys, "--config", str(cfg), "doctor")
    assert code == 1
    assert "FAIL leanote_api account alice@example.com" in out and "fix: put the right password" in out
    assert "WARN index (edge): not indexed yet: run `leanote-rag index`" in out  # not a failure of its own
    # Leanote unreachable
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    down = tmp_path / "down.yaml"
    down.write_text(cfg.read_text().replace(cfg.read_text().split("'")[1], f"http://127.0.0.1:{port}"))
    code, out, _ = run(capsys, "--config", str(down), "doctor")
    assert code == 1 and "cannot reach Leanote" in out and "fix: check leanote.base_url" in out
    monkeypatch.delenv("LR_PW_ALICE")
    code, out, _ = run(capsys, "--config", str(cfg), "doctor")
    assert "LR_PW_ALICE (named by the password_env of account alice@example.com) is not set" in out


def test_a_one_shot_index_reports_a_failure_without_promising_a_retry(setup, capsys, caplog):
    fake, cfg = setup
    fake.fail("user/getSyncState", times=1)
    code, _, err = run(capsys, "--config", str(cfg), "index")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert code == 1 and "HTTP 500" in err
    assert "sync of alice@example.com failed" in logged and "retrying in" not in logged + err


def test_user_takes_an_account_email_as_users_does(setup, capsys):
    """`--user` takes what `users:` takes: a Leanote user id, or the email of a source.accounts
    account (any case), which names its Leanote user once it has synced."""
    _, cfg = setup
    cfg.write_text(cfg.read_text().replace(
        "password_env: LR_PW_ALICE}\n", "password_env: LR_PW_ALICE}\n    - {email: carol@example.com, password_env: LR_PW_ALICE}\n"))
    assert run(capsys, "--config", str(cfg), "index")[0] == 1  # carol is no user of this Leanote: never synced
    for name in ("alice@example.com", "Alice@Example.COM", ALICE):
        code, out, err = run(capsys, "--config", str(cfg), "search", "CLI-SYNC-1", "--user", name, "--json")
        assert code == 0, err
        assert json.loads(out)["user_id"] == ALICE and json.loads(out)["hits"][0]["title"] == "周报"
    code, out, _ = run(capsys, "--config", str(cfg), "ask", "CLI-SYNC-1 是什么？", "--user", "alice@example.com", "--json")
    assert code == 0 and json.loads(out)["citations"][0]["title"] == "周报"
    code, out, _ = run(capsys, "--config", str(cfg), "entities", "--user", "alice@example.com", "--json")
    assert code == 0 and json.loads(out)["user_id"] == ALICE
    code, _, err = run(capsys, "--config", str(cfg), "search", "x", "--user", "carol@example.com")
    assert code == 2 and "account carol@example.com has not synced yet" in err and "leanote-rag status" in err
    code, _, err = run(capsys, "--config", str(cfg), "search", "x", "--user", "bob@example.com")
    assert code == 2 and "no notes of user 'bob@example.com'" in err  # no such account: taken as an id, and unknown


@pytest.mark.slow
def test_leanote_unreachable_is_one_human_line_and_v_gives_the_details(setup, capsys, tmp_path):
    _, cfg = setup
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    down = tmp_path / "down.yaml"
    down.write_text(cfg.read_text().replace(cfg.read_text().split("'")[1], f"http://127.0.0.1:{port}"))
    code, _, err = run(capsys, "--config", str(down), "index")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and lines == [f"error: alice@example.com: cannot reach Leanote at http://127.0.0.1:{port}: "
                                   "the connection was refused (is Leanote running, on that port?)"], err
    import os
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).with_name("leanote-rag"))
    out = subprocess.run([exe, "--config", str(down), "-v", "index"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "LR_PW_ALICE": "alice-pw"})
    assert out.returncode == 1 and "Max retries exceeded" in out.stderr  # the library's words, asked for
    assert "connection was refused" in out.stderr
