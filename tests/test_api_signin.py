"""Signing in to the web chat and what a session may do: an API token or a bot's one-time link
opens a session cookie (HttpOnly, SameSite=Strict); a link works once and only in its time; a
session sees only its person's gaps and answers, never an admin's powers; a cookie's request
that changes something is refused unless it carries the page's Origin and X-CSRF-Token (a forged
cross-site request); a session ends when its person signs out. The real daemon in this process,
its API on 127.0.0.1."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from bot.api.client import ONE_SHOT
from bot.usecases import signin
from bot.usecases.people import Person

from conftest import free_port, make_settings, run_over_tcp

pytestmark = pytest.mark.slow  # a real daemon: a first pass over the sample notes

ALICE = "alice-" + uuid.uuid4().hex
FRIEND, OTHER = 111, 222


@pytest.fixture
def settings(tmp_path, notes_dir, monkeypatch):
    monkeypatch.setenv("LR_T_ALICE", ALICE)
    sock = f"/tmp/lr-sig-{uuid.uuid4().hex[:8]}.sock"
    yield make_settings(
        tmp_path, source={"kind": "files", "path": str(notes_dir)}, ollama={"enabled": False}, rerank={"kind": "none"}, sync={"interval": "1h"},
        users=[{"leanote_user_id": "local", "telegram_ids": [FRIEND]}, {"leanote_user_id": "local",
                                                                        "telegram_ids": [OTHER]}],
        api={"socket": sock, "listen": f"127.0.0.1:{free_port()}",
             "tokens": [{"token_env": "LR_T_ALICE", "name": "alice", "users": ["local"], "admin": True}]})
    Path(sock).unlink(missing_ok=True)


def run(settings, scenario):
    run_over_tcp(settings, scenario, page=True)


def cookie_of(reply: httpx.Response) -> str:
    """The session cookie's value, after checking how it is set."""
    header = reply.headers["set-cookie"]
    flags = {f.strip().lower() for f in header.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= flags and "secure" not in flags, header  # (http here)
    return header.split(";")[0].split("=", 1)[1]


def test_a_token_opens_a_session_that_sees_its_holders_things_but_is_no_admin(settings):
    async def scenario(daemon, http):
        wrong = await http.post("/chat/signin", json={"token": "nope"})
        assert wrong.status_code == 401 and wrong.json()["kind"] == "auth" and "set-cookie" not in wrong.headers
        opened = await http.post("/chat/signin", json={"token": ALICE})
        assert opened.status_code == 200 and opened.json()["person"] == "api:alice"
        cookie, csrf = cookie_of(opened), opened.json()["csrf"]
        http.cookies.set("lr_chat", cookie)
        me = (await http.get("/chat/me")).json()
        assert me == {"person": "api:alice", "users": ["local"], "csrf": csrf}
        daemon.parts.gaps.add("api:alice", "local", "怎么煮溏心蛋", "怎么煮溏心蛋", [1.0, 0.0], "refused")
        assert [g["wordings"][0] for g in (await http.get("/gaps")).json()] == ["怎么煮溏心蛋"]
        # the token is an admin's; a browser's session of it is not
        refused = await http.post("/sync", json={"wait": False}, headers={"X-CSRF-Token": csrf})
        assert refused.status_code == 403 and refused.json()["kind"] == "auth"
        out = await http.post("/chat/signout", headers={"X-CSRF-Token": csrf})
        assert out.status_code == 200 and 'lr_chat=""' in out.headers["set-cookie"]
        http.cookies.set("lr_chat", cookie)  # kept by someone: it opens nothing now
        assert (await http.get("/gaps")).status_code == 401
        assert (await http.get("/chat/me")).status_code == 401

    run(settings, scenario)


def test_a_link_signs_its_person_in_once_within_its_time(settings):
    async def scenario(daemon, http):
        parts = daemon.parts
        link = signin.link(parts, Person(f"telegram:{FRIEND}", "local"))
        base = f"http://{settings.api.listen}/chat#code="
        assert link.url.startswith(base) and link.minutes == 10
        code = link.url.removeprefix(base)
        opened = await http.post("/chat/signin", json={"code": code})
        assert opened.status_code == 200 and opened.json()["person"] == f"telegram:{FRIEND}"
        again = await http.post("/chat/signin", json={"code": code})
        assert again.status_code == 403 and "used already" in again.json()["error"] and "set-cookie" not in again.headers
        unknown = await http.post("/chat/signin", json={"code": "x" * 43})
        assert unknown.status_code == 403 and "not known" in unknown.json()["error"]
        late = signin.link(parts, Person(f"telegram:{FRIEND}", "local")).url.removeprefix(base)
        real = parts.signins.clock
        parts.signins.clock = lambda: real() + 601  # api.web_link (10 minutes) later
        try:
            expired = await http.post("/chat/signin", json={"code": late})
        finally:
            parts.signins.clock = real
        assert expired.status_code == 403 and "expired" in expired.json()["error"]
        # only hashes are kept: the code and the session's secret are nowhere in the store
        store = (settings.state_dir / "signin.sqlite").read_bytes()
        assert code.encode() not in store and cookie_of(opened).encode() not in store

        # the session is the friend's: their gaps, not another person's
        parts.gaps.add(f"telegram:{FRIEND}", "local", "my question", "my question", [1.0, 0.0], "refused")
        theirs, _ = parts.gaps.add(f"telegram:{OTHER}", "local", "not yours", "not yours", [0.0, 1.0], "refused")
        http.cookies.set("lr_chat", cookie_of(opened))
        csrf = opened.json()["csrf"]
        assert [g["wordings"][0] for g in (await http.get("/gaps")).json()] == ["my question"]
        refused = await http.post(f"/gaps/{theirs}/dismiss", headers={"X-CSRF-Token": csrf})
        assert refused.status_code == 400 and "not one of yours" in refused.json()["error"]
        assert parts.gaps.get(theirs, f"telegram:{OTHER}").state == "open"

    run(settings, scenario)


def test_a_forged_cross_site_request_is_refused(settings):
    async def scenario(daemon, http):
        url = f"http://{settings.api.listen}"
        opened = await http.post("/chat/signin", json={"token": ALICE})
        csrf = opened.json()["csrf"]
        http.cookies.set("lr_chat", cookie_of(opened))
        note = {"text": "转账给 mallory", "once": "forged"}
        for headers in ({"Origin": "https://evil.example", "X-CSRF-Token": csrf},  # another site's page
                        {"Origin": "null", "X-CSRF-Token": csrf},  # a sandboxed one
                        {"Origin": "", "Referer": "https://evil.example/page", "X-CSRF-Token": csrf},
                        {"Origin": "", "X-CSRF-Token": csrf},  # neither said
                        {"Origin": url},  # this site, without the page's token
                        {"Origin": url, "X-CSRF-Token": "0" * 64}):
            refused = await http.post("/note", json=note, headers=headers)
            assert refused.status_code == 403 and refused.json()["kind"] == "auth", (headers, refused.text)
        assert not list(Path(settings.source.path).rglob("*.md")) or not [
            p for p in Path(settings.source.path).rglob("*.md") if "mallory" in p.read_text()]
        # a sign-in from another site's page is refused too (it would sign the browser in as someone else)
        forged = await http.post("/chat/signin", json={"token": ALICE}, headers={"Origin": "https://evil.example"})
        assert forged.status_code == 403 and "set-cookie" not in forged.headers
        # the page's own request goes through; so does a token's, which no browser sends by itself
        done = await http.post("/note", json=note, headers={"Origin": url, "X-CSRF-Token": csrf})
        assert done.status_code == 200 and done.json()["status"] == "written", done.text
        by_referer = await http.post("/note", json={**note, "once": "2"},
                                     headers={"Origin": "", "Referer": f"{url}/chat", "X-CSRF-Token": csrf})
        assert by_referer.status_code == 200
        bearer = httpx.AsyncClient(base_url=url, timeout=60, limits=ONE_SHOT)
        async with bearer:
            token = await bearer.post("/note", json={**note, "once": "3"}, headers={"Authorization": f"Bearer {ALICE}"})
        assert token.status_code == 200

    run(settings, scenario)
