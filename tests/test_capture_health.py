"""What the owner and the people see of capture's trouble: a refused login names the config
key holding its password, the log says once when an account's captures start failing and
once when they go again (each try at DEBUG), and ``status`` shows captures waiting for a login
that fails, to whom it concerns. The real Capture and outbox against the fake Leanote."""

from __future__ import annotations

import logging

import pytest

from sync.capture import Capture
from sync.sources.leanote_api import ApiSource

from conftest import make_settings
from test_capture import ME, PERSON, drive, leanote  # noqa: F401 (leanote: the fixture)


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
    cap = Capture(lambda: capture_settings(tmp_path, leanote, "LR_PW_WRONG"))
    try:
        assert drive(cap, cap.note(PERSON, ME, "密码错了")).status == "queued"
    finally:
        cap.close()
    [message] = set(login_refusals(caplog))
    assert "capture.accounts[1].password_env (LR_PW_WRONG)" in message and "source.accounts" not in message

    # capture borrowing the source's account: the source's key
    cap = Capture(lambda: source_settings(tmp_path / "b", leanote, "LR_PW_WRONG"))
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
