"""What the daemon's API tells whom: a token scoped to one Leanote user sees nothing of
another account in ``/status`` (its email, its login error); ``/health`` without a token
says ready or not and why in general terms, the details (a path, a pid) only with a token
or on the owner-only socket. The real daemon in this process, its API on real sockets,
a fake Leanote server."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import httpx
import pytest

from rag.index.note_index import NoteIndex
from bot.api.client import ONE_SHOT
from bot.serve import Daemon

from conftest import SCENARIO, free_port, make_settings, until, within, unix_ahttp
from fakes.leanote import FakeLeanote

pytestmark = pytest.mark.slow  # a real `serve` process

ONE, TWO = "5dbed2987db161bc2a85b901", "5dbed2987db161bc2a85b902"
BOOK_ONE, BOOK_TWO = "5e16ca22f6ffdbad5b4ba501", "5e16ca22f6ffdbad5b4ba502"
TOKEN_TWO, TOKEN_ADMIN = "tok-two-" + uuid.uuid4().hex, "tok-admin-" + uuid.uuid4().hex


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_PW_ONE", "one-pw")
    monkeypatch.setenv("LR_PW_TWO", "two-pw")
    monkeypatch.setenv("LR_TOKEN_TWO", TOKEN_TWO)
    monkeypatch.setenv("LR_TOKEN_ADMIN", TOKEN_ADMIN)
    sock = Path(f"/tmp/lr-priv-{uuid.uuid4().hex[:8]}.sock")  # short: Unix socket paths are limited
    with FakeLeanote() as leanote:
        for user, email, book in ((ONE, "one@example.com", BOOK_ONE), (TWO, "two@example.com", BOOK_TWO)):
            leanote.add_user(user, email, email.split("@")[0] + "-pw")
            leanote.put_notebook({"NotebookId": book, "UserId": user, "Title": "工作"})
            leanote.put_note({"NoteId": "6" + user[1:], "UserId": user, "NotebookId": book, "Title": f"{email} 的笔记",
                              "Content": f"{email} 记下的内容"})
        settings = make_settings(
            tmp_path,
            leanote={"base_url": leanote.url},
            source={"kind": "leanote_api", "path": None, "accounts": [
                {"email": "one@example.com", "password_env": "LR_PW_ONE"},
                {"email": "two@example.com", "password_env": "LR_PW_TWO"}]},
            api={"socket": str(sock), "listen": f"127.0.0.1:{free_port()}", "tokens": [
                {"token_env": "LR_TOKEN_TWO", "users": ["two@example.com"]},
                {"token_env": "LR_TOKEN_ADMIN", "users": [ONE, TWO], "admin": True}]},
            ollama={"enabled": False}, rerank={"kind": "none"}, sync={"interval": "1h"},
        )
        yield settings, leanote
    sock.unlink(missing_ok=True)


def clients(settings):
    """HTTP clients of the TCP listener and of the Unix socket."""
    tcp = httpx.AsyncClient(base_url=f"http://{settings.api.listen}", timeout=30, limits=ONE_SHOT)  # (unix_http)
    local = unix_ahttp(settings.api.socket, timeout=30)
    return tcp, local


def run(settings, scenario, wait_pass=True):
    async def main():
        daemon = Daemon(settings, services=[])
        task = asyncio.create_task(daemon.run())
        tcp, local = clients(settings)
        try:
            if wait_pass:
                await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await within(scenario(daemon, tcp, local), "the scenario", SCENARIO)
        finally:
            await tcp.aclose()
            await local.aclose()
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())


def test_a_scoped_token_sees_only_its_own_account_in_status(world):
    settings, leanote = world

    async def scenario(daemon, tcp, local):
        # ONE's password changed on the server: ONE's next login is refused
        leanote.users[ONE]["password"] = "changed"
        leanote.expire_tokens()
        result = await within(daemon.schedule.sync_now(), "a sync pass")
        assert "refused the login of one@example.com" in result.failures["one@example.com"]

        two = (await tcp.get("/status", headers={"Authorization": f"Bearer {TOKEN_TWO}"})).json()
        text = json.dumps(two, ensure_ascii=False)
        assert "one@example.com" not in text and ONE not in text and "refused" not in text
        assert [a["account"] for a in two["accounts"]] == ["two@example.com"]
        assert [u["user_id"] for u in two["users"]] == [TWO]
        last = two["last_sync"]
        assert last["ok"] is True and last["error"] is None and last["summary"] is None  # TWO's sync went fine

        for who in ((await tcp.get("/status", headers={"Authorization": f"Bearer {TOKEN_ADMIN}"})).json(),
                    (await local.get("/status")).json()):  # the admin, and the socket's user: everything
            assert "refused the login of one@example.com" in who["last_sync"]["error"]
            assert who["last_sync"]["ok"] is False and who["last_sync"]["summary"]["failures"]
            assert {a["account"] for a in who["accounts"]} == {"one@example.com", "two@example.com"}

        # TWO's own failure is TWO's to see (and still nothing of ONE's)
        leanote.fail("user/getSyncState", times=2)
        await within(daemon.schedule.sync_now(), "a sync pass")
        two = (await tcp.get("/status", headers={"Authorization": f"Bearer {TOKEN_TWO}"})).json()
        assert two["last_sync"]["ok"] is False
        assert two["last_sync"]["error"].startswith("two@example.com: ") and "HTTP 500" in two["last_sync"]["error"]
        assert "one@example.com" not in json.dumps(two, ensure_ascii=False)

    run(settings, scenario)


def test_health_without_a_token_says_ready_or_not_and_nothing_more(world):
    settings, _ = world
    holder = NoteIndex.open(settings, create=True)  # another process holds the index: not ready

    async def scenario(daemon, tcp, local):
        try:
            reply = await until(lambda: daemon.not_ready, what="the daemon to wait for the index")
            assert "open in another process" in reply
            anonymous = await tcp.get("/health")
            assert anonymous.status_code == 503
            assert anonymous.json() == {"live": True, "ready": False, "reason": "the index is not open yet"}
            assert "pid" not in anonymous.text and str(settings.state_dir) not in anonymous.text
            assert (await tcp.get("/health", headers={"Authorization": "Bearer nope"})).status_code == 401
            for detailed in (await tcp.get("/health", headers={"Authorization": f"Bearer {TOKEN_TWO}"}),
                             await local.get("/health")):
                assert detailed.status_code == 503 and "open in another process (pid" in detailed.json()["index"]
        finally:
            holder.close()
        await within(daemon.wait_for_pass(0), "the daemon's first pass")
        ready = await tcp.get("/health")
        assert ready.status_code == 200 and ready.json() == {"live": True, "ready": True, "reason": None}
        body = (await local.get("/health")).json()
        assert body["index"] == "open" and body["passes"] >= 1 and body["last_sync_ok"] is True

    run(settings, scenario, wait_pass=False)


def test_an_error_never_tells_a_token_which_leanote_user_an_email_is(world):
    """TWO asking for ONE's notes by ONE's email is refused in the words it asked with: not
    "the index holds no notes of user 5dbed…", which tells TWO whose account that is."""
    settings, _ = world

    async def scenario(daemon, tcp, local):
        two = {"Authorization": f"Bearer {TOKEN_TWO}"}
        for path, params in (("/search", {"q": "内容", "user": "one@example.com"}),
                             ("/users", None)):
            reply = await tcp.get(path, params=params, headers=two)
            assert ONE not in reply.text, reply.text
        refused = await tcp.get("/search", params={"q": "内容", "user": "one@example.com"}, headers=two)
        assert refused.status_code == 400 and "one@example.com" in refused.json()["error"]
        unknown = await tcp.get("/search", params={"q": "内容", "user": "nobody@example.com"}, headers=two)
        assert unknown.json()["error"].replace("nobody", "one") == refused.json()["error"]  # the same for both
        asked = await tcp.post("/ask", json={"question": "内容", "user": "one@example.com"}, headers=two)
        assert asked.status_code == 400 and ONE not in asked.text
        mine = await tcp.get("/search", params={"q": "内容", "user": "two@example.com"}, headers=two)
        assert mine.status_code == 200 and mine.json()["user_id"] == TWO

    run(settings, scenario)


def test_a_scoped_status_shows_the_llms_speed_but_not_how_many_replies_everyone_got(world):
    from rag.speed import FILE, SpeedBook, Usage

    settings, _ = world
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    book = SpeedBook(settings.state_dir / FILE)
    for _ in range(7):  # seven answers, whoever asked them
        book.observe("qwen2.5:1.5b", Usage(prompt_tokens=900, prompt_seconds=3.0, output_tokens=120,
                                           output_seconds=8.0), "问题" * 300)
    book.flush()

    async def scenario(daemon, tcp, local):
        scoped = (await tcp.get("/status", headers={"Authorization": f"Bearer {TOKEN_TWO}"})).json()["llm"]
        admin = (await tcp.get("/status", headers={"Authorization": f"Bearer {TOKEN_ADMIN}"})).json()["llm"]
        assert admin["qwen2.5:1.5b"]["replies"] == 7 and "(7 replies)" in admin["qwen2.5:1.5b"]["text"]
        speed = scoped["qwen2.5:1.5b"]
        assert "replies" not in speed and "updated" not in speed and "repl" not in speed["text"]
        assert speed["read_tps"] == admin["qwen2.5:1.5b"]["read_tps"] and "tok/s" in speed["text"]

    run(settings, scenario)
