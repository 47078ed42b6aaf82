"""Every text a door sends follows the rule answers follow (issue 53 item 5): a note titled
``[docs.python.org](http://evil.example/steal)`` and a question asked with a Markdown link and
``@everyone`` in it (a knowledge gap's wording) go through the real daemon's Telegram bot (the fake
Bot API) and Discord bot (the fake Discord): ``/gaps``, the direct message that a note answers a gap
now, ``/search``, ``/why``, ``/related`` and a digest. Nowhere is the title's Markdown a link
(Discord shows ``[words](address)`` as a masked link), nor any address or ``@name`` of the
title's or the person's words live: in Telegram they are ``<code>``, in Discord in code; the
address of the note itself (``{leanote}/note/<id>``) stays a link."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yarl
from bs4 import BeautifulSoup, NavigableString
from discord.gateway import DiscordWebSocket

from bot.chat.digest import digest_text
from bot.discord import service as discord_service
from bot.serve import Daemon
from bot.telegram import service as telegram_service
from bot.usecases import digest as digest_case
from rag.config import AnswerConfig

from conftest import SCENARIO, make_settings, until, within
from fakes.discord import FakeDiscord
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram, html_error, visible

TG_USER = 111
DC_USER, GUILD, CHANNEL = 510000000000000001, 520000000000000042, 520000000000004201
TOKEN = "MTAx.fake.discord-token"
USER, EMAIL = "5f0000000000000000000001", "me@example.com"
BOOK = "5f00000000000000000000b1"
TITLE = "[docs.python.org](http://evil.example/steal)"
HOSTILE_ID = "5f00000000000000000000a9"
KEYS = ("Zorblax 签名密钥怎么轮换：运行 zorblax keys rotate --all，然后重启 signer 服务。旧的签名密钥还能再用一天，"
        "之后作废。轮换 Zorblax 签名密钥前先备份 /etc/zorblax/keys。\n")
ASKED = "Zorblax 签名密钥怎么轮换？参考 [docs.python.org](http://evil.example/q) @everyone"
CLEAN = "Zorblax 签名密钥怎么轮换？"  # (an address in a question is a name the notes lack: no note answers ASKED)
OTHER = "Quuxle 的配额怎么调？见 [python.org](https://evil.example/quota) @here"
EVIL = "evil.example"


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_TG_TOKEN", "123:TEST")
    monkeypatch.setenv("LR_DISCORD_TOKEN", TOKEN)
    monkeypatch.setenv("LR_PW_ME", "me-pw")
    sock = Path(f"/tmp/lr-texts-{uuid.uuid4().hex[:8]}.sock")
    with FakeLeanote() as leanote, FakeTelegram() as tg, FakeOllama() as ollama, \
            FakeDiscord(token=TOKEN, guilds={GUILD: {"channels": [CHANNEL], "roles": []}}) as fake:
        leanote.add_user(USER, EMAIL, "me-pw")
        leanote.put_notebook({"NotebookId": BOOK, "UserId": USER, "Title": "学习"})
        leanote.put_note({"NoteId": "5f00000000000000000000a1", "UserId": USER, "NotebookId": BOOK,
                          "Title": "番茄炒蛋", "Content": "# 番茄炒蛋\n\n先把鸡蛋炒好盛出，再炒番茄，最后一起翻炒。\n"})
        monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(fake.gateway_url))
        settings = make_settings(
            tmp_path, leanote={"base_url": leanote.url},
            source={"kind": "leanote_api", "path": None, "accounts": [{"email": EMAIL, "password_env": "LR_PW_ME"}]},
            telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url, "edit_interval": 0.3},
            discord={"enabled": True, "token_env": "LR_DISCORD_TOKEN", "api_base": fake.api_base,
                     "guild_ids": [GUILD], "edit_interval": 0.3},
            users=[{"leanote_user_id": USER, "telegram_ids": [TG_USER], "discord_ids": [DC_USER], "admin": True}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, retrieval={"expand": "off"},
            sync={"interval": "1h", "trigger_debounce": "0.1s"}, api={"socket": str(sock)})
        yield settings, tg, fake, ollama, leanote
    sock.unlink(missing_ok=True)


NOTES = re.compile(r"http://127\.0\.0\.1:\d+/note/[0-9a-f]{24}")  # the fake Leanote's notes


def telegram_inert(html: str, where: str) -> str:
    """A Telegram message (HTML) shows no address or @name of the hostile words as a link: each is in
    <code> (Telegram makes no link there); its only links are the notes' own addresses. Its text."""
    assert html_error(html) is None, (where, html)
    soup = BeautifulSoup(html, "html.parser")
    for a in soup.find_all("a"):
        assert NOTES.fullmatch(a.get("href")) and a.get_text() == a.get("href"), (where, html)
    for node in soup.find_all(string=True):
        if isinstance(node, NavigableString) and node.parent.name != "code":
            assert EVIL not in node and "python.org" not in node and "@every" not in node and "@here" not in node, \
                (where, html)
    return visible(html)


def discord_inert(markdown: str, where: str) -> str:
    """A Discord message shows no masked link and no live address or mention of the hostile words:
    outside code spans they are not there, and no ``[words](`` is left unescaped."""
    outside = "".join(re.split(r"`[^`\n]*`", markdown))
    assert EVIL not in outside and "python.org" not in outside, (where, markdown)
    assert not re.search(r"(?<!\\)\]\(", outside) and not re.search(r"(?<!\\)\[", outside), (where, markdown)
    assert "@everyone" not in outside and "@here" not in outside, (where, markdown)
    return markdown


def open_gaps(daemon, person):
    store = daemon.parts.gaps_if_made() if daemon.parts is not None else None
    return store.gaps(person, USER) if store is not None else []


async def tg_said(tg, text: str, containing: str, chat: int = TG_USER) -> dict:
    before = len(tg.sent_to(chat))
    tg.say(TG_USER, text)
    got = await until(lambda: [m for m in tg.sent_to(chat)[before:] if containing in visible(m["text"])], 60,
                      f"Telegram's reply to {text!r}")
    return got[0]


async def dc_said(fake, name: str, options: dict, containing: str) -> str:
    it = fake.slash(DC_USER, name, options, guild_id=GUILD, channel_id=CHANNEL)
    await until(lambda: any(containing in t for t in it.texts()), 60, f"Discord's reply to /{name}")
    return next(t for t in it.texts() if containing in t)


@pytest.mark.slow
def test_titles_and_gap_wordings_are_inert_on_every_door(world):
    settings, tg, fake, ollama, leanote = world
    refusal = AnswerConfig().refusal
    note_url = f"{leanote.url}/note/{HOSTILE_ID}"

    async def scenario(daemon):
        # a question with a Markdown link and @everyone in it, refused: a gap of each person's
        for _ in range(4):
            ollama.reply(refusal)
        tg.say(TG_USER, ASKED)
        fake.slash(DC_USER, "ask", {"question": ASKED}, guild_id=GUILD, channel_id=CHANNEL)
        await until(lambda: open_gaps(daemon, f"telegram:{TG_USER}") and open_gaps(daemon, f"discord:{DC_USER}"),
                    60, "the gaps kept")

        # /gaps: the wording as written, nothing in it live
        listed = await tg_said(tg, "/gaps", "What your notes could not answer")
        assert "[docs.python.org](http://evil.example/q)" in telegram_inert(listed["text"], "Telegram /gaps")
        discord_inert(await dc_said(fake, "gaps", {}, "What your notes could not answer"), "Discord /gaps")

        # the note titled as a link, that answers the question asked plainly: each person told in a direct message
        for _ in range(4):
            ollama.reply(refusal)
        tg.say(TG_USER, CLEAN)
        fake.slash(DC_USER, "ask", {"question": CLEAN}, guild_id=GUILD, channel_id=CHANNEL)
        await until(lambda: any(CLEAN in g.wordings for g in open_gaps(daemon, f"telegram:{TG_USER}")) and
                    any(CLEAN in g.wordings for g in open_gaps(daemon, f"discord:{DC_USER}")), 60, "the plain asks")
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000+00:00")
        leanote.put_note({"NoteId": HOSTILE_ID, "UserId": USER, "NotebookId": BOOK, "Title": TITLE,
                          "Content": f"# Zorblax 签名密钥\n\n{KEYS}", "UpdatedTime": stamp, "CreatedTime": stamp})
        told = await tg_said(tg, "/sync", "now answers")
        shown = telegram_inert(told["text"], "Telegram: a gap a note answers")
        assert f"«{TITLE}»" in shown and note_url in told["text"]
        dm = await until(lambda: [t for t in fake.dms.get(DC_USER, []) if "now answers" in t], 60, "the Discord DM")
        discord_inert(dm[0], "Discord: a gap a note answers")
        assert f"<{note_url}>" in dm[0]  # the note's own address: a link

        # /search: the title as a hit
        hits = await tg_said(tg, "/search Zorblax 签名密钥", "Zorblax")
        assert TITLE in telegram_inert(hits["text"], "Telegram /search")
        discord_inert(await dc_said(fake, "search", {"query": "Zorblax 签名密钥"}, "Zorblax"), "Discord /search")

        # /why after an answer from that note: the title among the candidates
        ollama.reply("运行 zorblax keys rotate --all，然后重启 signer 服务[1]。")
        await tg_said(tg, "Zorblax 签名密钥怎么轮换？", "zorblax keys rotate")
        why = await tg_said(tg, "/why", "candidates")
        assert "docs.python.org" in telegram_inert(why["text"], "Telegram /why")
        ollama.reply("运行 zorblax keys rotate --all，然后重启 signer 服务[1]。")
        await dc_said(fake, "ask", {"question": "Zorblax 签名密钥怎么轮换？"}, "zorblax keys rotate")
        discord_inert(await dc_said(fake, "why", {}, "candidates"), "Discord /why")

        # /related of that note: its title heads the reply
        related = await tg_said(tg, f"/related {HOSTILE_ID}", "docs.python.org")
        telegram_inert(related["text"], "Telegram /related")
        discord_inert(await dc_said(fake, "related", {"target": HOSTILE_ID}, "docs.python.org"), "Discord /related")

        # a digest: the note changed, and another gap asked with a link and @here in it
        for _ in range(4):
            ollama.reply(refusal)
        tg.say(TG_USER, OTHER)
        fake.slash(DC_USER, "ask", {"question": OTHER}, guild_id=GUILD, channel_id=CHANNEL)
        await until(lambda: any(OTHER in g.wordings for g in open_gaps(daemon, f"telegram:{TG_USER}")) and
                    any(OTHER in g.wordings for g in open_gaps(daemon, f"discord:{DC_USER}")), 60, "the new gaps")
        before, dms = len(tg.sent_to(TG_USER)), len(fake.dms.get(DC_USER, []))
        assert await digest_case.send(daemon.parts, f"telegram:{TG_USER}", digest_text, now=time.time())
        assert await digest_case.send(daemon.parts, f"discord:{DC_USER}", digest_text, now=time.time())
        digest = [m["text"] for m in tg.sent_to(TG_USER)[before:]]
        shown = "\n".join(telegram_inert(t, "Telegram digest") for t in digest)
        assert "Quuxle" in shown and TITLE in shown, shown
        sent = fake.dms[DC_USER][dms:]
        assert sent and "Quuxle" in "\n".join(sent)
        for text in sent:
            discord_inert(text, "Discord digest")

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


# --- one path: a new message cannot forget the rule -------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
# Sending text, as each platform's library does it; only the bot's one path (bot.py) calls these, and
# answering.py for the answer itself (rendered by bot.render, the rule's other half).
RAW_SENDS = {
    "telegram": re.compile(r"\.(reply_text|reply_html|reply_markdown\w*|send_message|edit_text|edit_message_text|"
                           r"edit_caption|reply_photo|send_photo|reply_document|send_document)\("),
    "discord": re.compile(r"\.send_message\(|\bfollowup\.send\(|\.edit_original_response\(|\.send\(|\.edit\(content"),
}
ONE_PATH = {"bot.py", "answering.py"}


def raw_sends(platform: str, text: str) -> list[str]:
    return [m.group(0) for m in RAW_SENDS[platform].finditer(text)]


@pytest.mark.parametrize("platform", sorted(RAW_SENDS))
def test_every_text_a_door_sends_goes_through_its_one_path(platform):
    offenders = {p.name: raw_sends(platform, p.read_text(encoding="utf-8"))
                 for p in sorted((REPO / "bot" / platform).glob("*.py")) if p.name not in ONE_PATH}
    assert {name: found for name, found in offenders.items() if found} == {}
    assert len(offenders) >= 6  # every handler module was looked at
    # the scan sees what it looks for (a check that cannot fail is no check)
    assert raw_sends("telegram", "await message.reply_text(title)") == [".reply_text("]
    assert raw_sends("discord", "await channel.send(part)\nawait interaction.followup.send(t)") == [
        ".send(", "followup.send("]
    assert raw_sends(platform, (REPO / "bot" / platform / "bot.py").read_text(encoding="utf-8"))
