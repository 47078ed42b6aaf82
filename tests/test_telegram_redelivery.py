"""Telegram sends an update again until a later poll confirms it. A bot killed after it
handled a /note but before any poll confirmed it (here: Telegram's front answered the
confirming polls 502 Bad Gateway, as it does at times) gets the same /note again when it
starts anew: the capture is found by its message, not written a second time, and the person
is told it was saved already, with the link. A real child process running the daemon with
the bot, killed with SIGKILL; the fakes (Telegram, Leanote, Ollama) are this process's."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, make_settings
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram
from test_telegram import run, until

pytestmark = pytest.mark.slow  # a real process killed

OWNER = 111
USER = "local"  # the sample notes' user, and the Leanote account capture logs in as


def settings_for(tmp_path: Path, telegram_url: str, ollama_url: str, leanote_url: str):
    """The daemon's settings, the same in the child and here."""
    return make_settings(
        tmp_path,
        telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": telegram_url, "edit_interval": 0.3},
        users=[{"leanote_user_id": USER, "telegram_ids": [OWNER], "admin": True}],
        ollama={"host": ollama_url}, rerank={"kind": "none"}, sync={"interval": "1h", "trigger_debounce": "0.1s"},
        leanote={"base_url": leanote_url},
        capture={"accounts": [{"email": "me@example.com", "password_env": "LR_LEANOTE_PW"}], "sync_after": "0.2s",
                 "retry_min": "0.2s", "retry_max": "0.5s"},
    )


CHILD = """
import asyncio, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from bot.telegram import service
from bot.serve import Daemon
from test_telegram_redelivery import settings_for
asyncio.run(Daemon(settings_for(Path({tmp!r}), {tg!r}, {ollama!r}, {leanote!r}), services=[service]).run())
"""


def start_child(tmp_path: Path, world, log) -> subprocess.Popen:
    """The daemon with its Telegram bot in a child process (``CHILD``), against the world's fakes."""
    tg, ollama, leanote = world
    return subprocess.Popen(
        [sys.executable, "-c", CHILD.format(tests=str(REPO / "tests"), tmp=str(tmp_path), tg=tg.base_url,
                                            ollama=ollama.url, leanote=leanote.url)],
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log, stderr=subprocess.STDOUT)


def wait_for(check, what: str, child: subprocess.Popen, timeout: float = 120.0):
    """``check()``'s first truthy value; fails at once if the child died, after ``timeout`` if it never comes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        assert child.poll() is None, f"the child exited ({child.returncode}) before {what}"
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_TG_TOKEN", "123:TEST")
    monkeypatch.setenv("LR_LEANOTE_PW", "pw-secret")
    with FakeTelegram() as tg, FakeOllama() as ollama, FakeLeanote() as leanote:
        leanote.add_user(USER, "me@example.com", "pw-secret")
        yield tg, ollama, leanote


def test_a_note_delivered_again_after_a_kill_is_written_once_and_answered_as_saved(tmp_path, world):
    tg, ollama, leanote = world
    tg.bad_gateway_on_confirm = True
    log = (tmp_path / "child.log").open("w")
    child = start_child(tmp_path, world, log)
    try:
        wait_for(lambda: tg.method_calls("getUpdates"), "the child's bot to poll", child)
        tg.say(OWNER, "/note 杀掉之前记的 KILLED-ONCE")
        update_id = tg.updates[-1]["update_id"]
        [first] = wait_for(lambda: [m for m in tg.sent_to(OWNER) if "已记下" in m["text"]], "the receipt", child)
        # the bot tried to confirm it: the poll asking for what comes after it was answered 502
        wait_for(lambda: any(int(p.get("offset") or 0) > update_id for p in tg.method_calls("getUpdates")),
                 "a poll confirming the /note", child)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        log.close()
    assert tg.confirmed <= update_id  # not confirmed: Telegram sends it again
    link = re.search(re.escape(leanote.url) + r"/note/[0-9a-f]+", first["text"])[0]
    tg.bad_gateway_on_confirm = False
    replies = len(tg.sent_to(OWNER))
    settings = settings_for(tmp_path, tg.base_url, ollama.url, leanote.url)

    async def restarted(daemon):
        [again] = await until(lambda: tg.sent_to(OWNER)[replies:], timeout=60)
        assert "Already saved" in again["text"] and link in again["text"], again["text"]
        assert "已记下" not in again["text"]  # not a receipt for a new note
        await until(lambda: tg.confirmed > update_id, timeout=60)  # handled, and confirmed this time

    run(settings, tg, restarted)
    assert [n["Title"] for n in leanote.notes.values() if "KILLED-ONCE" in n["Content"]] == ["杀掉之前记的 KILLED-ONCE"]
    assert len(tg.sent_to(OWNER)) == replies + 1


def test_a_note_cut_off_by_a_kill_before_its_reply_is_told_when_it_lands(tmp_path, world):
    """The /note reached the daemon, its update was confirmed, its write went out to Leanote,
    and the daemon was killed before Leanote answered (so before any reply). Leanote applies
    the write anyway. Started again, the daemon finds the note in Leanote (not written twice)
    and tells the person, in the chat they wrote from, with the link."""
    tg, ollama, leanote = world
    held = leanote.hold("note/addNote")  # Leanote takes its time: the write is on its way at the kill
    log = (tmp_path / "child.log").open("w")
    child = start_child(tmp_path, world, log)
    try:
        wait_for(lambda: tg.method_calls("getUpdates"), "the child's bot to poll", child)
        tg.say(OWNER, "/note 回复之前被杀掉的 CUT-BEFORE-REPLY")
        update_id = tg.updates[-1]["update_id"]
        wait_for(lambda: leanote.calls["note/addNote"] == 1, "the write to reach Leanote", child)
        wait_for(lambda: tg.confirmed > update_id, "the /note to be confirmed (Telegram will not send it again)",
                 child)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        log.close()
    replies = len(tg.sent_to(OWNER))
    assert not [m for m in tg.sent_to(OWNER) if "已记下" in m["text"]]  # no receipt: killed first
    held.set()  # Leanote applies it after all
    wait_for_note = lambda: [n for n in leanote.notes.values() if "CUT-BEFORE-REPLY" in n["Content"]]  # noqa: E731
    deadline = time.monotonic() + 30
    while not wait_for_note() and time.monotonic() < deadline:
        time.sleep(0.05)
    [note] = wait_for_note()
    settings = settings_for(tmp_path, tg.base_url, ollama.url, leanote.url)

    # the bot, starting again, is held until the capture was found written: the receipt goes out
    # all the same, when the bot is up (it used to be dropped when the capture came first)
    bot_up = tg.hold("setMyCommands")

    async def restarted(daemon):
        await until(lambda: daemon.capture.outbox.untold("telegram"), timeout=60)
        bot_up.set()
        [told] = await until(lambda: tg.sent_to(OWNER)[replies:], timeout=60)
        assert "已记下" in told["text"] and f"/note/{note['NoteId']}" in told["text"], told["text"]
        # marked told once Telegram has answered the send, which is after the fake saw it
        await until(lambda: not daemon.capture.outbox.untold("telegram"), timeout=60)

    run(settings, tg, restarted)
    assert len([n for n in leanote.notes.values() if "CUT-BEFORE-REPLY" in n["Content"]]) == 1
    assert len(tg.sent_to(OWNER)) == replies + 1
