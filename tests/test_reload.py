"""`serve` as a systemd service: SIGHUP re-reads the config (what can change while
running changes, the rest is named), and the notify protocol (READY, RELOADING,
WATCHDOG, STOPPING) is spoken on systemd's datagram socket."""

from __future__ import annotations

import os
import signal
import socket
import threading
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from rag.index.note_index import NoteIndex
from bot.root import Parts

from conftest import make_settings, unix_http
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram

EXE = str(Path(sys.executable).with_name("leanote-rag"))
OWNER, FRIEND = 111, 222


def until(check, timeout=60.0, what="it"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_reload_takes_the_live_parts_and_names_the_rest(tmp_path):
    old = make_settings(tmp_path, users=[{"leanote_user_id": "local", "telegram_ids": [OWNER]}])
    new = make_settings(tmp_path, users=[{"leanote_user_id": "local", "telegram_ids": [OWNER, FRIEND]}],
                        sync={"interval": "30s", "page_size": 7}, embedder={"batch_size": 8},
                        exclude={"tags": ["secret"]})
    merged, live, restart = old.reloaded(new)
    assert merged.users == new.users and merged.exclude.tags == ["secret"] and merged.sync.interval == 30
    assert merged.sync.page_size == old.sync.page_size and merged.embedder == old.embedder  # not while running
    assert set(live) == {"users", "exclude", "sync.interval"}
    assert set(restart) == {"sync.page_size", "embedder"}


def first_pass_done(api_socket: str) -> bool:
    try:
        with unix_http(api_socket) as http:
            return http.get("/health", timeout=5).json()["passes"] >= 1
    except (httpx.HTTPError, ValueError):
        return False


def reloaded(messages: list[str], times: int = 1) -> bool:
    """systemd has heard READY=1 after the ``times``-th RELOADING=1: that reload is done."""
    seen = 0
    for m in messages:
        if m.startswith("RELOADING=1"):
            seen += 1
        elif m.startswith("READY=1") and seen >= times:
            return True
    return False


@pytest.fixture
def notify_socket():
    """systemd's notify socket, read as systemd reads it: all the time (a thread), so its
    queue never fills while the test looks elsewhere (a full queue is test_daemon_faults')."""
    path = f"/tmp/lr-notify-{uuid.uuid4().hex[:8]}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.1)
    messages: list[str] = []
    done = threading.Event()

    def drain() -> None:
        while not done.is_set():
            try:
                messages.append(sock.recv(4096).decode())
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    yield path, lambda: list(messages)
    done.set()
    reader.join(timeout=5)
    sock.close()
    os.unlink(path)


@pytest.mark.slow
def test_sighup_changes_who_may_ask_without_a_restart_and_systemd_hears_it(tmp_path, notify_socket):
    path, read = notify_socket
    with FakeTelegram() as tg, FakeOllama() as ollama:
        config = tmp_path / "config.yaml"
        api_socket = f"/tmp/lr-api-{tmp_path.name[-8:]}-{uuid.uuid4().hex[:6]}.sock"

        def write(users: str, extra: str = "") -> None:
            config.write_text(
                f"source: {{kind: files, path: '{Path(__file__).parents[1] / 'examples' / 'notes'}'}}\n"
                f"state_dir: data\nollama: {{host: '{ollama.url}'}}\nrerank: {{kind: none}}\n"
                f"api: {{socket: '{api_socket}'}}\n"
                f"telegram: {{enabled: true, token_env: LR_TG, base_url: '{tg.base_url}', edit_interval: 0.3s}}\n"
                f"users: {users}\nsync: {{interval: 1h}}\n{extra}")

        write(f"[{{leanote_user_id: local, telegram_ids: [{OWNER}]}}]")
        env = {**os.environ, "LR_TG": tg.token, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
        env.pop("WATCHDOG_PID", None)
        log_file = tmp_path / "serve.log"
        proc = subprocess.Popen([EXE, "--config", str(config), "serve"], env=env, stdout=subprocess.DEVNULL,
                                stderr=log_file.open("w"), text=True)
        try:
            until(lambda: any(m.startswith("READY=1") for m in read()), what="READY=1")
            until(lambda: first_pass_done(api_socket), what="the first pass")  # the notes are in the index
            until(lambda: tg.method_calls("getUpdates"), what="the bot to poll")
            tg.say(FRIEND, "番茄炒蛋怎么做？")
            until(lambda: tg.sent_to(FRIEND), what="a refusal")
            assert str(FRIEND) in tg.sent_to(FRIEND)[0]["text"]  # a stranger, for now

            # the owner adds FRIEND, and changes something that needs a restart
            write(f"[{{leanote_user_id: local, telegram_ids: [{OWNER}, {FRIEND}]}}]", "embedder: {batch_size: 8}\n")
            proc.send_signal(signal.SIGHUP)
            until(lambda: any(m.startswith("RELOADING=1") for m in read()), what="RELOADING=1")
            until(lambda: reloaded(read()), what="READY=1 after RELOADING=1 (the reload applied)")
            ollama.reply("先炒蛋[1]。")
            tg.say(FRIEND, "番茄炒蛋怎么做才不酸？")
            until(lambda: [m for m in tg.sent_to(FRIEND) if "来源" in m["text"]], what="an answer to FRIEND")

            config.write_text("source: [this is not valid\n")  # a broken file: the running config stays
            proc.send_signal(signal.SIGHUP)
            until(lambda: "reload refused" in log_file.read_text(), what="the broken file's reload to be refused")
            until(lambda: reloaded(read(), times=2), what="READY=1 after the second RELOADING=1")
            assert proc.poll() is None
            until(lambda: sum(m.startswith("WATCHDOG=1") for m in read()) >= 3, what="watchdog pings (every 0.2 s)")
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- serve's log ---\n{log_file.read_text()[-4000:]}") from None
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise AssertionError(f"serve did not stop\n{log_file.read_text()[-4000:]}") from None
    log = log_file.read_text()
    messages = read()
    assert proc.returncode == 0 and any(m.startswith("STOPPING=1") for m in messages)
    assert "reloaded" in log and "users" in log and "needs a restart to apply: embedder" in log
    assert "reload refused, the running configuration stays" in log
    assert "Traceback" not in log


def test_a_reload_that_changes_the_privacy_rules_during_a_pass_applies_them_right_after_it(tmp_path, notes_dir):
    """The reload asks for a pass at once (the rules apply to every note): one asked for while a
    pass runs is run right after it, not dropped by the scheduler (its one instance is busy)
    until the next interval, an hour away. The running pass is held by the fake Ollama at its
    embedding until the reload is in; the real daemon does the rest."""
    import asyncio

    from rag import config as config_mod
    from bot.serve import Daemon
    from sync.state import State

    from conftest import until as wait_until, within

    with FakeOllama() as ollama:
        config = tmp_path / "config.yaml"

        def write(extra: str = "") -> None:
            config.write_text(
                f"source: {{kind: files, path: '{notes_dir}'}}\nstate_dir: data\n"
                f"embedder: {{kind: ollama, host: '{ollama.url}'}}\nollama: {{enabled: false}}\nrerank: {{kind: none}}\n"
                f"sync: {{interval: 1h, watch: false, trigger_debounce: 0.1s}}\n{extra}", encoding="utf-8")

        write()
        settings = config_mod.load(config)
        held = ollama.hold_embed("HELD-IN-THE-PASS-9")

        def recipes() -> set[str]:
            state = State(settings.state_dir)
            try:
                return {r[0] for r in state.db.execute("SELECT status FROM notes WHERE notebook LIKE '%菜谱%'")}
            finally:
                state.close()

        async def scenario():
            daemon = Daemon(settings, services=[])
            task = asyncio.create_task(daemon.run())
            try:
                await within(daemon.wait_for_pass(0), "the first pass")
                assert recipes() == {"indexed"}
                (notes_dir / "巡检.md").write_text("# 巡检\n\n设备巡检 HELD-IN-THE-PASS-9。\n", encoding="utf-8")
                assert daemon.schedule.trigger(debounce=False)
                await wait_until(lambda: "HELD-IN-THE-PASS-9" in ollama.held, 60, "a pass to embed the new note")
                write("exclude: {notebooks: [菜谱]}\n")
                daemon.reload()  # what SIGHUP runs
                held.set()
                await wait_until(lambda: recipes() == {"excluded"}, 60, "the recipes to be excluded")
            finally:
                daemon.stop()
                await asyncio.wait_for(task, timeout=60)

        asyncio.run(within(scenario(), "the scenario"))


@pytest.mark.slow  # builds an index with the real model
def test_a_reload_reaches_every_part_the_root_built(tmp_path, use_embedder):
    """``Parts.apply`` is the one way running parts learn new settings: the index, the answer
    service (its conversations' limits too) and the sync read the new ones from then on."""
    old = make_settings(tmp_path, ollama={"enabled": False})
    new = make_settings(tmp_path, ollama={"enabled": False}, answer={"history_chars": 123, "idle_reset": 60},
                        retrieval={"top_k": 3})
    with NoteIndex.open(old, create=True, embedder=use_embedder) as index, Parts(old, index=index) as parts:
        answers, sync = parts.answers, parts.sync
        assert answers.conversations.max_chars != 123
        parts.apply(new)
        assert index.settings is new and answers.settings is new and sync.settings is new and parts.settings is new
        assert (answers.conversations.max_chars, answers.conversations.idle_reset) == (123, 60)
