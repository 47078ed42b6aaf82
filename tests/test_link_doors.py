"""What a note's links look like on every door, end to end: a Leanote note (the fake Leanote,
read by the real daemon) holds a link whose words name another address than it goes to
(``[官方文档 https://docs.python.org](http://evil.example/steal)``) and an address written out
on a line of its own. The model finds no answer, so the note's own words are shown (its best
passage), in Telegram (the fake Bot API), Discord (the fake Discord) and the API's ``html``.
Everywhere, what a link shows is where it goes: the misleading words are text, the real
address beside them is the link; the written-out address is a link; the Leanote addresses of
the notes an answer reads are links while it streams in Discord too."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
import yarl
from bs4 import BeautifulSoup
from discord.gateway import DiscordWebSocket

from bot.discord import service as discord_service
from bot.serve import Daemon
from bot.telegram import service as telegram_service
from rag.config import AnswerConfig

from conftest import SCENARIO, make_settings, unix_ahttp, until, within
from fakes.discord import FakeDiscord
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram, html_error

TG_USER = 111
DC_USER, GUILD, CHANNEL = 510000000000000001, 520000000000000042, 520000000000004201
TOKEN = "MTAx.fake.discord-token"
USER, EMAIL = "5f0000000000000000000001", "me@example.com"
NOTE = ("# Python 资料\n\n学 Python 先看官方文档：[官方文档 https://docs.python.org](http://evil.example/steal)。\n\n"
        "Python 教程的地址写在这里：\nhttps://docs.python.org/3/tutorial/\n")
QUESTION = "Python 的官方文档和教程在哪里？"
EVIL, TUTORIAL = "http://evil.example/steal", "https://docs.python.org/3/tutorial/"


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_TG_TOKEN", "123:TEST")
    monkeypatch.setenv("LR_DISCORD_TOKEN", TOKEN)
    monkeypatch.setenv("LR_PW_ME", "me-pw")
    sock = Path(f"/tmp/lr-ldoors-{uuid.uuid4().hex[:8]}.sock")  # short: Unix socket paths are limited
    with FakeLeanote() as leanote, FakeTelegram() as tg, FakeOllama() as ollama, \
            FakeDiscord(token=TOKEN, guilds={GUILD: {"channels": [CHANNEL], "roles": []}}) as fake:
        leanote.add_user(USER, EMAIL, "me-pw")
        leanote.put_notebook({"NotebookId": "5f00000000000000000000b1", "UserId": USER, "Title": "学习"})
        leanote.put_note({"NoteId": "5f00000000000000000000a1", "UserId": USER,
                          "NotebookId": "5f00000000000000000000b1", "Title": "Python 资料", "Content": NOTE})
        monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(fake.gateway_url))
        settings = make_settings(
            tmp_path, leanote={"base_url": leanote.url},
            source={"kind": "leanote_api", "path": None, "accounts": [{"email": EMAIL, "password_env": "LR_PW_ME"}]},
            telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url, "edit_interval": 0.3},
            discord={"enabled": True, "token_env": "LR_DISCORD_TOKEN", "api_base": fake.api_base,
                     "guild_ids": [GUILD], "edit_interval": 0.3, "public_answers": True},
            users=[{"leanote_user_id": USER, "telegram_ids": [TG_USER], "discord_ids": [DC_USER], "admin": True}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, retrieval={"expand": "off"},
            sync={"interval": "1h"}, api={"socket": str(sock)})
        yield settings, tg, fake, ollama
    sock.unlink(missing_ok=True)


def anchors(html: str) -> list[tuple[str, str]]:
    return [(a.get("href"), a.get_text()) for a in BeautifulSoup(html, "html.parser").find_all("a")]


def honest(html: str, where: str) -> None:
    """The note's links as every HTML door must show them."""
    links = anchors(html)
    assert (EVIL, EVIL) in links and (TUTORIAL, TUTORIAL) in links, (where, html)
    assert not [href for href, text in links if "docs.python.org" in text and href != TUTORIAL], (where, html)
    text = BeautifulSoup(html, "html.parser").get_text()
    assert f"官方文档 https://docs.python.org (→ {EVIL})" in text, (where, text)


@pytest.mark.slow
def test_a_notes_links_show_where_they_go_on_every_door(world):
    settings, tg, fake, ollama = world
    refusal = AnswerConfig().refusal  # the model finds nothing: the note's best passage instead

    async def scenario(daemon):
        async with unix_ahttp(settings.api.socket, timeout=60) as http:
            ollama.reply(refusal)
            async with http.stream("POST", "/ask", json={"question": QUESTION}) as reply:
                events = [json.loads(line) async for line in reply.aiter_lines() if line]
        answer = events[-1]
        assert answer["event"] == "answer" and answer["answer"]["citations"], answer
        honest(answer["html"], "the API's html")
        note_url = answer["answer"]["citations"][0]["url"]
        assert note_url.startswith("http")

        ollama.reply(refusal)
        tg.say(TG_USER, QUESTION)
        sent = await until(lambda: [m for m in tg.sent_to(TG_USER) if "来源" in m["text"]], what="the Telegram answer")
        assert html_error(sent[0]["text"]) is None
        honest(sent[0]["text"], "Telegram")

        go_on = ollama.reply(refusal, paused_after=0)  # the notes it reads show first, while it waits
        it = fake.slash(DC_USER, "ask", {"question": QUESTION}, guild_id=GUILD, channel_id=CHANNEL)
        await until(lambda: it.original is not None and "📚" in it.original.text(), what="the notes read, in Discord")
        head = it.original.text()
        assert f"<{note_url}>" in head and f"`{note_url}`" not in head, head  # a link, not code
        go_on.set()
        await until(lambda: it.original.embeds, what="the Discord answer")
        shown = it.original.embeds[0]["description"]
        assert f"官方文档 `https://docs.python.org` (→ <{EVIL}>)" in shown, shown
        assert f"<{TUTORIAL}>" in shown and f"`{TUTORIAL}`" not in shown, shown
        assert f"](<{EVIL}>)" not in shown  # never the words as the link

    async def main():
        daemon = Daemon(settings, services=[telegram_service, discord_service])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(lambda: tg.method_calls("getUpdates") and fake.ready and fake.commands_for(GUILD),
                        what="the bots to connect")
            await within(scenario(daemon), "the scenario", SCENARIO)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())
