"""The web chat is a door of the chat session: a person signed in at /chat by their Telegram bot's
one-time link is that person, as in Telegram. Their questions on the web and in Telegram count
against one ``bots.rate_limit``; an overlong message is cut with a notice, as a chat door does;
an answer asked on the web is theirs under a Telegram button; another's answer or gap is refused
with the session's words and status. A token's own requests keep the API's rules. The real
daemon in this process, its API on 127.0.0.1; answers without an LLM (the passages)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from bot.api.client import ONE_SHOT
from bot.session import Reply, Session
from bot.usecases import signin
from bot.usecases.people import Person

from conftest import free_port, make_settings, run_over_tcp

pytestmark = pytest.mark.slow  # a real daemon: a first pass over the sample notes

ALICE = "alice-" + uuid.uuid4().hex
FRIEND, OTHER, CHAT = 111, 222, 5000


@pytest.fixture
def settings(tmp_path, notes_dir, monkeypatch):
    monkeypatch.setenv("LR_T_ALICE", ALICE)
    sock = f"/tmp/lr-wss-{uuid.uuid4().hex[:8]}.sock"
    yield make_settings(
        tmp_path, source={"kind": "files", "path": str(notes_dir)}, ollama={"enabled": False}, rerank={"kind": "none"},
        sync={"interval": "1h"}, bots={"rate_limit": 3}, limits={"question_chars": 40},
        users=[{"leanote_user_id": "local", "telegram_ids": [FRIEND], "admin": True},
               {"leanote_user_id": "local", "telegram_ids": [OTHER]}],
        api={"socket": sock, "listen": f"127.0.0.1:{free_port()}", "rate_limit": 100,
             "tokens": [{"token_env": "LR_T_ALICE", "name": "alice", "users": ["local"]}]})
    Path(sock).unlink(missing_ok=True)


def run(settings, scenario):
    run_over_tcp(settings, scenario, page=True)


async def signed_in(daemon, http, who: int) -> str:
    """The browser signed in by the one-time link ``who``'s bot gave: the page's csrf."""
    code = signin.link(daemon.parts, Person(f"telegram:{who}", "local")).url.split("#code=")[1]
    opened = await http.post("/chat/signin", json={"code": code})
    assert opened.status_code == 200, opened.text
    http.cookies.set("lr_chat", opened.headers["set-cookie"].split(";")[0].split("=", 1)[1])
    return opened.json()["csrf"]


async def web_ask(http, csrf: str, question: str) -> tuple[int, list[dict]]:
    reply = await http.post("/ask", json={"question": question, "conversation": "tab1", "keep": True},
                            headers={"X-CSRF-Token": csrf})
    events = [json.loads(line) for line in reply.text.splitlines() if line.strip()] if reply.status_code == 200 \
        else [reply.json()]
    return reply.status_code, events


def test_one_person_at_two_doors_shares_their_rate_limit_and_their_answers(settings):
    async def scenario(daemon, http):
        parts = daemon.parts
        csrf = await signed_in(daemon, http, FRIEND)
        status, events = await web_ask(http, csrf, "番茄炒蛋怎么做")
        assert status == 200 and events[-1]["event"] == "answer", events
        answer_id = events[-1]["answer_id"]
        # the answer asked on the web is the person's under their Telegram button; not another's
        pressed = await Session(parts, "telegram", FRIEND).press(f"fb:down:{answer_id}")
        assert pressed.refused == "" and "fb" not in pressed.text
        assert (await Session(parts, "telegram", OTHER).press(f"fb:up:{answer_id}")).refused == "not_yours"
        # and the other way: asked in Telegram, the 👍 on the web ... and the rate limit is one
        asked = await Session(parts, "telegram", FRIEND, CHAT).ask("周末徒步")
        assert not isinstance(asked, Reply) and asked.answer_id
        up = await http.post(f"/answers/{asked.answer_id}/feedback", json={"verdict": "up"},
                             headers={"X-CSRF-Token": csrf})
        assert up.status_code == 200 and up.json()["verdict"] == "up", up.text
        # an overlong message is cut, said beside the answer (a chat door's rule), not refused
        long = "番茄炒蛋怎么做" + "，请详细说说" * 20
        status, events = await web_ask(http, csrf, long)
        assert status == 200 and any("40" in n for n in events[-1]["notices"]), events[-1]
        # three questions this minute, two of them on the web: the fourth is refused at either door
        status, events = await web_ask(http, csrf, "番茄炒蛋怎么做")
        assert status == 429 and events[0]["kind"] == "unavailable" and "3 questions a minute" in events[0]["error"], events
        again = await http.post("/ask", json={"question": "番茄炒蛋怎么做", "conversation": "tab1"},
                                headers={"X-CSRF-Token": csrf})
        assert again.status_code == 429 and 1 <= int(again.headers["retry-after"]) <= 60, again.headers
        assert (await Session(parts, "telegram", FRIEND, CHAT).ask("周末徒步")).refused == "slow_down"
        # the browser's session of an admin is no admin, and another's gap stays theirs
        theirs, _ = parts.gaps.add(f"telegram:{OTHER}", "local", "not yours", "not yours", [0.0, 1.0], "refused")
        refused = await http.post(f"/gaps/{theirs}/dismiss", headers={"X-CSRF-Token": csrf})
        assert refused.status_code == 400 and "not one of yours" in refused.json()["error"]
        assert parts.gaps.get(theirs, f"telegram:{OTHER}").state == "open"
        assert (await http.post("/sync", json={"wait": False}, headers={"X-CSRF-Token": csrf})).status_code == 403
        # a token's own requests keep the API's rules: an overlong question is refused, not cut
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=60, limits=ONE_SHOT) as bearer:
            too_long = await bearer.post("/ask", json={"question": long}, headers={"Authorization": f"Bearer {ALICE}"})
        assert too_long.status_code == 413

    run(settings, scenario)
