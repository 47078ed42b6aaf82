"""What the owner and the people see of capture's trouble: a refused login names the config
key holding its password, the log says once when an account's captures start failing and
once when they go again (each try at DEBUG), and ``status`` shows captures waiting for a login
that fails, to whom it concerns. The real Capture and outbox against the fake Leanote."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from sync.sources.leanote_api import ApiSource

from bot.chat.texts import status_text
from bot.usecases import status
from bot.usecases.people import Person
from bot.root import Parts
from conftest import capture_alone, SCENARIO, make_settings, within
from test_capture import ME, OTHER, PERSON, drive, leanote  # noqa: F401 (leanote: the fixture)
from test_capture_once import Clock, submit


@pytest.fixture(autouse=True)
def wrong_password(monkeypatch):
    monkeypatch.setenv("LR_PW_WRONG", "not-the-password")


def capture_settings(tmp_path, fake, password_env="LR_PW_ME", **capture):
    return make_settings(tmp_path, leanote={"base_url": fake.url}, capture={
        "accounts": [{"email": "other@example.com", "password_env": "LR_PW_OTHER"},
                     {"email": "me@example.com", "password_env": password_env}], **capture})


def source_settings(tmp_path, fake, password_env="LR_PW_ME"):
    return make_settings(tmp_path, leanote={"base_url": fake.url}, source={
        "kind": "leanote_api", "path": None, "accounts": [{"email": "me@example.com", "password_env": password_env}]})


def login_refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused the login" in r.getMessage()]


# --- the refusal names the right config key -------------------------------------------------------------


def test_a_refused_login_names_the_config_key_and_variable_holding_its_password(tmp_path, leanote, caplog):
    caplog.set_level(logging.DEBUG)
    cap = capture_alone(capture_settings(tmp_path, leanote, "LR_PW_WRONG"))
    try:
        assert drive(cap, cap.note(PERSON, ME, "密码错了")).status == "queued"
    finally:
        cap.close()
    [message] = set(login_refusals(caplog))
    assert "capture.accounts[1].password_env (LR_PW_WRONG)" in message and "source.accounts" not in message

    # capture borrowing the source's account: the source's key
    cap = capture_alone(source_settings(tmp_path / "b", leanote, "LR_PW_WRONG"))
    caplog.clear()
    try:
        assert drive(cap, cap.note(PERSON, ME, "密码错了")).status == "queued"
    finally:
        cap.close()
    [message] = set(login_refusals(caplog))
    assert "source.accounts[0].password_env (LR_PW_WRONG)" in message

    # and the sync's own login
    api = ApiSource(source_settings(tmp_path / "c", leanote, "LR_PW_WRONG")).session("me@example.com").api
    with pytest.raises(Exception, match=r"named by source\.accounts\[0\]\.password_env \(LR_PW_WRONG\)"):
        api.login()


# --- the log: one line per change, each try at DEBUG ------------------------------------------------------


def noted(caplog, level=logging.INFO) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("sync.writeback") and r.levelno >= level]


def test_the_log_says_once_when_captures_start_failing_and_once_when_they_go_again(tmp_path, leanote, caplog):
    caplog.set_level(logging.DEBUG)
    settings = make_settings(tmp_path, leanote={"base_url": leanote.url}, capture={
        "accounts": [{"email": "me@example.com", "password_env": "LR_PW_WRONG"}]})
    clock = Clock(1_000_000.0)
    cap = capture_alone(settings, clock=clock)

    def tries(n):
        for _ in range(n):
            clock.now = cap.pending(PERSON)[0].next_try
            asyncio.run(cap.drain())

    try:
        assert asyncio.run(submit(cap, cap.note(PERSON, ME, "等密码"))).status == "queued"
        tries(5)  # six refused logins
        assert leanote.calls["auth/login"] == 6
        [warning] = noted(caplog)
        assert warning.levelno == logging.WARNING and "cannot log in to Leanote as me@example.com" in warning.getMessage()
        assert "refused the login" in warning.getMessage() and "backoff" in warning.getMessage()
        assert len([r for r in caplog.records if "next try in" in r.getMessage()]) == 6  # each try: DEBUG
        caplog.clear()

        leanote.users[ME]["password"] = "not-the-password"  # the owner fixes the password
        tries(1)
        assert cap.pending(PERSON) == []
        [back] = noted(caplog)
        assert back.levelno == logging.INFO and "logged in to Leanote as me@example.com again" in back.getMessage()
        assert any("written to note" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
        caplog.clear()

        leanote.fail("notebook/getNotebooks", times=3, status=503)  # Leanote fails this user's writes a while
        assert asyncio.run(submit(cap, cap.note(PERSON, ME, "Leanote 503"))).status == "queued"
        tries(3)
        assert cap.pending(PERSON) == []
        [start, end] = noted(caplog)
        assert start.levelno == logging.WARNING and f"captures for Leanote user {ME} (me@example.com)" in start.getMessage()
        assert "HTTP 503" in start.getMessage()
        assert end.levelno == logging.INFO and "Leanote takes them again" in end.getMessage()
    finally:
        cap.close()


# --- status: captures waiting for a login that fails ------------------------------------------------------


def status_for(settings, users=None) -> dict:
    from bot.usecases.status import status_report

    with Parts(settings) as parts:
        return status_report(settings, parts.state, None, users, outbox=parts.outbox_if_made())


def test_status_shows_captures_waiting_for_a_failing_login_to_whom_it_concerns(tmp_path, leanote, capsys):
    """ME's Leanote password changed: ME's captures wait. The admin sees the account, since when
    and the error (CLI ``status``, the bots' /status); ME sees that their login fails, without the
    error; OTHER sees nothing of it, not even ME's count."""
    from bot.serve import Daemon
    from bot.cli.report import print_status

    settings = make_settings(
        tmp_path, leanote={"base_url": leanote.url}, rerank={"kind": "none"}, ollama={"enabled": False},
        sync={"interval": "1h"}, capture={"accounts": [{"email": "other@example.com", "password_env": "LR_PW_OTHER"},
                                                       {"email": "me@example.com", "password_env": "LR_PW_ME"}],
                                          "retry_min": "1h"})

    async def main():
        daemon = Daemon(settings, services=[])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the first pass")
            assert (await daemon.capture.note(PERSON, ME, "密码改之前")).status == "written"
            assert (await daemon.capture.note("telegram:222", OTHER, "OTHER 的")).status == "written"
            leanote.users[ME]["password"] = "changed-in-leanote"
            leanote.expire_tokens()
            assert (await daemon.capture.note(PERSON, ME, "密码改之后")).status == "queued"
            said = []
            for person in (Person("telegram:1", "", admin=True), Person("telegram:2", ME), Person("telegram:3", OTHER)):
                said.append(status_text(await status.status(daemon.parts, person), person))
            return said
        finally:
            daemon.stop()
            await within(task, "the daemon to stop", 30)

    admin, mine, other = asyncio.run(within(main(), "the scenario", SCENARIO))
    assert "captures waiting for Leanote: 1" in admin
    assert "capture login of me@example.com failing since" in admin and "1 capture(s) waiting" in admin
    assert "refused the login of me@example.com" in admin and "capture.accounts[1].password_env (LR_PW_ME)" in admin
    assert "your captures waiting for Leanote: 1" in mine and "login of your account fails" in mine
    assert "refused" not in mine and "LR_PW_ME" not in mine
    assert "captures" not in other and "me@example.com" not in other and "login" not in other

    report = status_for(settings)
    [failing] = report["capture"]["logins_failing"]
    assert (failing["account"], failing["user_id"], failing["waiting"]) == ("me@example.com", ME, 1)
    print_status(report)
    out = capsys.readouterr().out
    assert "login of me@example.com failing since" in out and "refused the login of me@example.com" in out
    for text in (admin, mine, other, out, json.dumps(report)):
        assert "me-secret" not in text and "changed-in-leanote" not in text
    assert status_for(settings, [ME])["capture"]["logins_failing"] == [failing]
    theirs = status_for(settings, [OTHER])
    assert theirs["capture"]["logins_failing"] == [] and "me@example.com" not in json.dumps(theirs)
    assert theirs["capture"]["waiting"] == 0
