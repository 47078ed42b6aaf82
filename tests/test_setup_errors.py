"""Setup as a new user meets it: credentials in URLs never printed, broken or unwritable
state named with its fix (exit 2), and `doctor` telling apart what is really wrong."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from bot.cli import main
from rag.redact import Redact, redact_in_logs, safe_url

from conftest import EXAMPLES, THREADS, free_port
from fakes import LocalServer, QuietHandler
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram

PASSWORD = "s3cr3t-Pa55"


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err



def config(tmp_path, text: str = "", name: str = "config.yaml"):
    path = tmp_path / name
    path.write_text(f"source: {{kind: files, path: '{EXAMPLES}'}}\nstate_dir: data\nrerank: {{kind: none}}\n"
                    f"embedder: {{threads: {THREADS}}}\n{text}")
    return path


def test_log_redaction_is_installed_once_however_often_a_bot_restarts(caplog):
    root = logging.getLogger()
    before = list(root.filters)
    try:
        for token in ("123:AAA", "123:AAA", "456:BBB"):  # a supervisor restarting the bots
            redact_in_logs(token)
        mine = [f for f in root.filters if isinstance(f, Redact)]
        assert len(mine) == 1  # (another test in this process may have installed it first)
        assert [t for t in mine[0].secrets if t in ("123:AAA", "456:BBB")] == ["123:AAA", "456:BBB"]
        with caplog.at_level(logging.INFO):
            logging.getLogger("bot").info("GET https://api.telegram.org/bot123:AAA/getMe and 456:BBB")
        assert "123:AAA" not in caplog.text and "456:BBB" not in caplog.text and "bot***/getMe" in caplog.text
    finally:
        root.filters[:] = before


def test_safe_url_drops_credentials_wherever_they_are():
    text = "Qdrant at https://admin:pw%40x@q.home:6333/ failed; mongodb://u:p@a:1,b:2/db?replicaSet=r and http://h/"
    assert safe_url(text) == "Qdrant at https://q.home:6333/ failed; mongodb://a:1,b:2/db?replicaSet=r and http://h/"


@pytest.mark.slow
def test_url_credentials_never_reach_any_printed_path(tmp_path, capsys, caplog, monkeypatch):
    """qdrant.url, ollama.host, leanote.base_url and a MongoDB URL, each with user:password@:
    status, search, ask, doctor and index print and log none of the passwords."""
    caplog.set_level(logging.DEBUG)
    port = free_port()
    qdrant = config(tmp_path, f"qdrant: {{url: 'http://admin:{PASSWORD}@127.0.0.1:{port}'}}\n", "qdrant.yaml")
    ollama = config(tmp_path, f"ollama: {{host: 'http://bob:{PASSWORD}@127.0.0.1:{port}'}}\n", "ollama.yaml")
    monkeypatch.setenv("LR_PW", "pw")
    leanote = tmp_path / "leanote.yaml"
    leanote.write_text(f"leanote: {{base_url: 'http://alice:{PASSWORD}@127.0.0.1:{port}'}}\nstate_dir: data2\n"
                       "source: {kind: leanote_api, accounts: [{email: a@example.com, password_env: LR_PW}]}\n"
                       "rerank: {kind: none}\nollama: {enabled: false}\nsync: {http_timeout: 2}\n")
    monkeypatch.setenv("LR_MONGO", f"mongodb://reader:{PASSWORD}@127.0.0.1:{port},127.0.0.1:{free_port()}"
                       f"/leanote?replicaSet=rs0&authSource=admin")
    mongo = tmp_path / "mongo.yaml"
    mongo.write_text("source: {kind: mongodb, url_env: LR_MONGO}\nstate_dir: data3\nrerank: {kind: none}\n"
                     "ollama: {enabled: false}\nsync: {http_timeout: 1}\n")
    assert run(capsys, "--config", str(ollama), "index")[0] == 0
    printed = []
    for cfg, commands in ((qdrant, (["status"], ["search", "x"], ["doctor"], ["index"])),
                          (ollama, (["ask", "番茄炒蛋怎么做？", "--trace"], ["doctor"])),
                          (leanote, (["index"], ["status"], ["doctor"])),
                          (mongo, (["doctor"], ["index"]))):
        for args in commands:
            code, out, err = run(capsys, "--config", str(cfg), *args)
            printed.append(out + err)
            assert code in (0, 1), (cfg.name, args, err)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    everything = "\n".join(printed) + logged
    assert PASSWORD not in everything
    assert f"127.0.0.1:{port}" in everything  # the hosts themselves are shown, so the operator can act


@pytest.mark.slow
def test_a_corrupted_state_db_names_the_file_and_the_fix(tmp_path, capsys):
    cfg = config(tmp_path)
    assert run(capsys, "--config", str(cfg), "index")[0] == 0
    db = tmp_path / "data" / "state.db"
    for extra in ("-wal", "-shm"):
        (tmp_path / "data" / f"state.db{extra}").unlink(missing_ok=True)
    db.write_bytes(b"this is not a database" * 100)
    for command in ("status", "index"):
        code, _, err = run(capsys, "--config", str(cfg), command)
        assert code == 2 and str(db) in err and "index --rebuild" in err and "Traceback" not in err
    code, out, _ = run(capsys, "--config", str(cfg), "doctor")
    assert code == 1 and "FAIL sync state" in out and "fix: leanote-rag index --rebuild" in out
    code, out, err = run(capsys, "--config", str(cfg), "index", "--rebuild")
    assert code == 0, err
    assert list((tmp_path / "data").glob("state.db.broken-*"))  # set aside, not deleted
    code, out, _ = run(capsys, "--config", str(cfg), "search", "番茄炒蛋", "--json")
    assert code == 0 and json.loads(out)["hits"]


@pytest.mark.slow
def test_an_unreadable_index_names_the_folder_and_the_fix(tmp_path, capsys):
    cfg = config(tmp_path)
    assert run(capsys, "--config", str(cfg), "index")[0] == 0
    segments = tmp_path / "data" / "qdrant" / "segments"
    for path in segments.rglob("*"):
        if path.is_file():
            path.write_bytes(b"\x00garbage")
    code, _, err = run(capsys, "--config", str(cfg), "search", "番茄炒蛋")
    assert code == 2 and "qdrant" in err and "index --rebuild" in err, err
    assert run(capsys, "--config", str(cfg), "index", "--rebuild")[0] == 0
    code, out, _ = run(capsys, "--config", str(cfg), "search", "番茄炒蛋", "--json")
    assert code == 0 and json.loads(out)["hits"]


def test_a_state_dir_that_cannot_be_made_is_exit_2_with_the_fix(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    cfg = config(tmp_path, f"state_dir: '{blocker}/data'\n".replace("state_dir: data\n", ""))
    cfg.write_text(cfg.read_text().replace("state_dir: data\n", ""))
    for command in ("index", "status"):
        code, _, err = run(capsys, "--config", str(cfg), command)
        assert code == 2 and "cannot create the state directory" in err and "state_dir" in err, err


def test_the_state_dir_is_private_to_the_user(tmp_path, capsys):
    old = os.umask(0o022)  # a shell's usual umask, outside systemd
    try:
        cfg = config(tmp_path)
        assert run(capsys, "--config", str(cfg), "index")[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    (tmp_path / "data").chmod(0o755)
    (tmp_path / "data" / "state.db").chmod(0o644)
    # doctor says what it did, as any command opening the state would have done it; the next run finds it private
    code, out, _ = run(capsys, "--config", str(cfg), "doctor")
    assert f"WARN state directory: {tmp_path / 'data'} was readable by other users (mode 755): made it private" in out
    assert "FAIL state directory" not in out
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "data" / "state.db").stat().st_mode) == 0o600
    code, out, _ = run(capsys, "--config", str(cfg), "doctor")
    assert "state directory" not in out  # nothing to say about it any more


class NotOllama(LocalServer):
    """Any other web server: 404 for everything."""

    def __init__(self):
        class Handler(QuietHandler):
            def do_GET(self):
                self._404()

            do_POST = do_GET

            def _404(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = b"404 page not found"
                self.send_response(404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.url = self._listen(Handler)


def test_doctor_tells_a_web_server_that_is_not_ollama_from_a_missing_model(tmp_path, capsys):
    with NotOllama() as other, FakeOllama(models=()) as empty:
        cfg = config(tmp_path, f"ollama: {{host: '{other.url}'}}\n")
        code, out, _ = run(capsys, "--config", str(cfg), "doctor")
        assert code == 1 and "not an Ollama server" in out and "ollama pull" not in out
        cfg = config(tmp_path, f"ollama: {{host: '{empty.url}'}}\n")
        code, out, _ = run(capsys, "--config", str(cfg), "doctor")
        assert code == 1 and "fix: ollama pull qwen2.5:7b-instruct" in out


def test_doctor_checks_enabled_bots_and_names_them(tmp_path, capsys, monkeypatch):
    with FakeTelegram(token="123:GOOD") as tg:
        bots = (f"telegram: {{enabled: true, token_env: LR_TG, base_url: '{tg.base_url}'}}\n"
                f"users: [{{leanote_user_id: local, telegram_ids: [111]}}]\nollama: {{enabled: false}}\n")
        cfg = config(tmp_path, bots)
        assert run(capsys, "--config", str(cfg), "index")[0] == 0
        monkeypatch.delenv("LR_TG", raising=False)
        code, out, _ = run(capsys, "--config", str(cfg), "doctor")
        assert code == 1 and "FAIL telegram bot: environment variable LR_TG" in out
        monkeypatch.setenv("LR_TG", "999:WRONG")
        code, out, _ = run(capsys, "--config", str(cfg), "doctor")
        assert code == 1 and "FAIL telegram bot: Telegram refused the token in LR_TG" in out
        assert "999:WRONG" not in out
        monkeypatch.setenv("LR_TG", "123:GOOD")
        code, out, _ = run(capsys, "--config", str(cfg), "doctor")
        assert "ok   telegram bot: @notes_bot accepts the token; private chats only" in out, out
        assert code == 0


def test_doctor_warns_about_a_privacy_rule_that_matches_nothing(tmp_path, capsys):
    cfg = config(tmp_path, "exclude: {notebooks: ['生活 / 菜谱', 'Diary'], tags: ['PRIVAT']}\nollama: {enabled: false}\n")
    assert run(capsys, "--config", str(cfg), "index")[0] == 0
    code, out, _ = run(capsys, "--config", str(cfg), "doctor")
    assert code == 1 and "FAIL privacy rules" in out
    assert "notebook 'Diary'" in out and "tag 'PRIVAT'" in out and "生活 / 菜谱" not in out.split("FAIL privacy")[1]


def test_a_replica_set_mongodb_url_does_not_crash_doctor(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LR_MONGO", f"mongodb://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/notes?replicaSet=rs")
    cfg = tmp_path / "mongo.yaml"
    cfg.write_text("source: {kind: mongodb, url_env: LR_MONGO}\nstate_dir: data\nrerank: {kind: none}\n"
                   "ollama: {enabled: false}\nsync: {http_timeout: 1}\n")
    code, out, err = run(capsys, "--config", str(cfg), "doctor")
    assert code == 1 and "FAIL source (mongodb)" in out and "Traceback" not in err and "error:" not in err


@pytest.mark.parametrize("extra_installed", [False, True])
def test_the_default_reranker_follows_what_is_installed(tmp_path, capsys, monkeypatch, extra_installed):
    import importlib.util

    real = importlib.util.find_spec
    if not extra_installed:
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "FlagEmbedding" else real(name, *a))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"source: {{kind: files, path: '{EXAMPLES}'}}\nstate_dir: data\nollama: {{enabled: false}}\n")
    assert run(capsys, "--config", str(cfg), "index")[0] == 0
    code, out, _ = run(capsys, "--config", str(cfg), "doctor")
    assert code == 0, out  # no weights can be here: auto falls back to no reranker, and says so
    assert "ok   reranker (auto): auto:" in out
    code, out, err = run(capsys, "--config", str(cfg), "ask", "番茄炒蛋怎么做？")
    assert code == 0 and "WARNING" not in err and "reranker" not in err


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can act in another user's state directory")
def test_root_does_not_write_into_the_services_state_directory(tmp_path, capsys):
    cfg = config(tmp_path)
    assert run(capsys, "--config", str(cfg), "index")[0] == 0
    data = tmp_path / "data"
    for path in [data, *data.rglob("*")]:
        os.chown(path, 4242, 4242)  # as the service's (dynamic) user would own it
    before = {p: p.stat().st_uid for p in data.rglob("*")}
    for command in ("index", "status", "search"):
        code, _, err = run(capsys, "--config", str(cfg), command, *(["番茄"] if command == "search" else []))
        assert code == 2 and "belongs to another user" in err, (command, err)
    assert {p: p.stat().st_uid for p in data.rglob("*")} == before  # nothing new, nothing re-owned


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can look at another user's state directory")
def test_doctor_as_root_names_an_open_state_directory_of_the_service_and_leaves_it(tmp_path, capsys):
    cfg = config(tmp_path)
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    os.chown(data, 4242, 4242)  # the service's
    code, out, _ = run(capsys, "--config", str(cfg), "doctor")
    assert code == 1 and "FAIL state directory" in out and f"chmod 700 {data}, as its owner" in out
    assert stat.S_IMODE(data.stat().st_mode) == 0o755
