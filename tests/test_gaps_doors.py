"""Knowledge gaps and digests through the real doors: the daemon with the real Telegram bot
(python-telegram-bot against the fake Bot API), the real Discord bot (discord.py against the
fake Discord), and the API on its Unix socket; a fake Leanote takes the notes written for a
gap, a fake Ollama stands in for the LLM (the questions here are refused before it is asked)."""

from __future__ import annotations

import asyncio
import shutil

import pytest
import yarl
from discord.gateway import DiscordWebSocket

from bot.discord import service as discord_service
from bot.serve import Daemon
from bot.telegram import service as telegram_service

from conftest import EXAMPLES, SCENARIO, make_settings, unix_ahttp, until, within
from fakes.discord import FakeDiscord
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram

OWNER, FRIEND, GROUP = 111, 222, -100500
NGINX = ("# Nginx rate limiting\n\nTo configure rate limiting in nginx, define a zone with limit_req_zone "
         "$binary_remote_addr zone=one:10m rate=5r/s; and use limit_req zone=one burst=10 in the location.\n")
Q_EN, Q_ZH = "How do I configure nginx rate limiting?", "怎么给 nginx 配置限流"


def open_gaps(daemon, person):
    store = daemon.parts.gaps_if_made() if daemon.parts is not None else None
    return store.gaps(person, "local") if store is not None else []


def mid(tg, message) -> int:
    return next(i for i, m in tg.messages.items() if m is message)


async def new_message(tg, chat, before, containing=""):
    got = await until(lambda: [m for m in tg.sent_to(chat)[before:] if containing in m["text"]],
                      what=f"a message to {chat} with {containing!r}")
    return got[0]


@pytest.fixture
def tg_world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_TG_TOKEN", "123:TEST")
    monkeypatch.setenv("LR_LEANOTE_PW", "pw-secret")
    notes = tmp_path / "notes"
    shutil.copytree(EXAMPLES, notes)
    with FakeTelegram() as tg, FakeOllama() as ollama, FakeLeanote() as leanote:
        leanote.add_user("local", "me@example.com", "pw-secret")
        settings = make_settings(
            tmp_path, source={"kind": "files", "path": str(notes)},
            telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url, "edit_interval": 0.3},
            users=[{"leanote_user_id": "local", "telegram_ids": [OWNER], "admin": True},
                   {"leanote_user_id": "local", "telegram_ids": [FRIEND]}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, sync={"interval": "1h", "trigger_debounce": "0.1s"},
            leanote={"base_url": leanote.url}, api={"socket": str(tmp_path / "api.sock")},
            capture={"accounts": [{"email": "me@example.com", "password_env": "LR_LEANOTE_PW"}], "sync_after": "0.2s"},
        )
        settings = settings.model_copy(update={"telegram": settings.telegram.model_copy(update={"allowed_chats": [GROUP]})})
        yield settings, tg, leanote, notes, ollama


@pytest.mark.slow
def test_telegram_gaps_from_asking_to_a_note_that_answers_them(tg_world):
    settings, tg, leanote, notes, ollama = tg_world

    async def scenario(daemon):
        for who, q in ((OWNER, Q_EN), (OWNER, Q_ZH), (FRIEND, Q_EN)):
            tg.say(who, q)
        await until(lambda: len(open_gaps(daemon, "telegram:111")) == 1 and open_gaps(daemon, "telegram:111")[0].count
                    == 2 and open_gaps(daemon, "telegram:222"), what="the gaps kept")
        # /gaps in the group: the list goes to the person's private chat, with ✍️ / ✖ under it
        before = len(tg.sent_to(OWNER))
        tg.say(OWNER, "/gaps", chat_id=GROUP, chat_type="group")
        listed = await new_message(tg, OWNER, before, "What your notes could not answer")
        await until(lambda: [m for m in tg.sent_to(GROUP) if "Sent to you privately" in m["text"]])
        assert Q_EN in listed["text"] and Q_ZH in listed["text"] and "asked 2×" in listed["text"]
        assert not [m for m in tg.sent_to(GROUP) if Q_ZH in m["text"]]  # the group sees none of it
        mine = open_gaps(daemon, "telegram:111")[0]
        assert tg.buttons(mid(tg, listed)) == [("✍️ 1", f"gap:w:{mine.id}"), ("✖ 1", f"gap:x:{mine.id}")]
        # the friend forges a press with the owner's gap id under their own list: refused, nothing changes
        before = len(tg.sent_to(FRIEND))
        tg.say(FRIEND, "/gaps")
        theirs = await new_message(tg, FRIEND, before, "What your notes could not answer")
        q = tg.press(FRIEND, FRIEND, mid(tg, theirs), f"gap:x:{mine.id}")
        answer = (await until(lambda: tg.answered(q)))[0]
        assert answer["show_alert"] and "not one of your gaps" in answer["text"]
        q = tg.press(FRIEND, FRIEND, mid(tg, theirs), "gap:x:")
        assert (await until(lambda: tg.answered(q)))[0]["show_alert"]
        assert open_gaps(daemon, "telegram:111")[0].state == "open"
        # ✍️: what the owner sends next becomes the note, titled by the question, written once
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, OWNER, mid(tg, listed), f"gap:w:{mine.id}")
        await new_message(tg, OWNER, before, "Your next message becomes the note")
        before = len(tg.sent_to(OWNER))
        tg.say(OWNER, "limit_req_zone $binary_remote_addr zone=one:10m rate=5r/s;")
        receipt = await new_message(tg, OWNER, before, "已记下")
        written = [n for n in leanote.notes.values() if n["Title"] == mine.question]
        assert len(written) == 1, (receipt["text"], [n["Title"] for n in leanote.notes.values()])
        assert "limit_req_zone" in written[0]["Content"]
        assert leanote.url in receipt["text"]
        # the next message is a question again, not a second note
        before = len(tg.sent_to(OWNER))
        ollama.reply("先把鸡蛋炒好盛出[1]。")
        tg.say(OWNER, "番茄炒蛋怎么做？")
        await until(lambda: len(tg.sent_to(OWNER)) > before)
        assert len([n for n in leanote.notes.values() if n["Title"] == mine.question]) == 1
        # a note that answers it reaches the index: both gaps close, each person told once, privately
        (notes / "运维" / "nginx.md").write_text(NGINX)
        owner_before, friend_before = len(tg.sent_to(OWNER)), len(tg.sent_to(FRIEND))
        tg.say(OWNER, "/sync")
        told = await new_message(tg, OWNER, owner_before, "now answers")
        assert f"«Nginx rate limiting» now answers «{mine.question}» (asked 2 times)" in told["text"]
        await new_message(tg, FRIEND, friend_before, "now answers")
        assert mine.id not in [g.id for g in open_gaps(daemon, "telegram:111")]
        await asyncio.sleep(0.5)
        assert len([m for m in tg.sent_to(OWNER) if "now answers" in m["text"]]) == 1
        # the old ✖ pressed again: it says the gap is answered, and changes nothing
        q = tg.press(OWNER, OWNER, mid(tg, listed), f"gap:x:{mine.id}")
        assert "answered already" in (await until(lambda: tg.answered(q)))[0]["text"]
        # /digest: bad input says what is wrong; a good plan is scheduled in the person's time zone
        for bad, said in (("/digest weekly someday 09:00", "unknown day"), ("/digest daily 25:00", "unknown time"),
                          ("/digest daily 08:30 Mars/Olympus", "unknown time zone")):
            before = len(tg.sent_to(OWNER))
            tg.say(OWNER, bad)
            await new_message(tg, OWNER, before, said)
        before = len(tg.sent_to(OWNER))
        tg.say(OWNER, "/digest weekly mon 09:00 Asia/Shanghai")
        await new_message(tg, OWNER, before, "weekly mon 09:00 Asia/Shanghai")
        when = await until(lambda: daemon.digests.next_run("telegram:111"), what="the digest job")
        assert (when.weekday(), when.hour, when.minute, str(when.tzinfo)) == (0, 9, 0, "Asia/Shanghai")
        before = len(tg.sent_to(OWNER))
        tg.say(OWNER, "/digest off")
        await new_message(tg, OWNER, before, "no more digests")
        await until(lambda: daemon.digests.next_run("telegram:111") is None)
        # /forget: the person's gaps and plan go; the friend's stay
        before = len(tg.sent_to(OWNER))
        tg.say(OWNER, "/forget")
        await new_message(tg, OWNER, before, "Forgot your")
        assert daemon.parts.gaps.gaps("telegram:111", "local", ("open", "closed", "dismissed")) == []
        assert daemon.parts.gaps.gaps("telegram:222", "local", ("closed",))

    run(settings, scenario, telegram_service, lambda: tg.method_calls("getUpdates"))


def run(settings, scenario, service, connected):
    async def main():
        daemon = Daemon(settings, services=[service])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(connected, what="the bot to connect")
            await within(scenario(daemon), "the scenario", SCENARIO)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())


# --- Discord and the API ----------------------------------------------------------------------------

TOKEN = "MTAx.fake.discord-token"
ONE, TWO = 310000000000000001, 310000000000000002
GUILD, CHANNEL, ROLE = 320000000000000042, 320000000000004201, 330000000000000077


@pytest.fixture
def dc_world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_DISCORD_TOKEN", TOKEN)
    notes = tmp_path / "notes"
    shutil.copytree(EXAMPLES, notes)
    with FakeDiscord(token=TOKEN, guilds={GUILD: {"channels": [CHANNEL], "roles": [ROLE]}}) as fake, \
            FakeOllama() as ollama:
        monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(fake.gateway_url))
        settings = make_settings(
            tmp_path, source={"kind": "files", "path": str(notes)},
            discord={"enabled": True, "token_env": "LR_DISCORD_TOKEN", "api_base": fake.api_base,
                     "guild_ids": [GUILD], "channel_ids": [CHANNEL], "role_ids": [ROLE], "edit_interval": 0.3},
            users=[{"leanote_user_id": "local", "discord_ids": [ONE], "admin": True},
                   {"leanote_user_id": "local", "discord_ids": [TWO]}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, sync={"interval": "1h", "trigger_debounce": "0.1s"},
            api={"socket": str(tmp_path / "api.sock")},
        )
        yield settings, fake, notes


def slash(fake, user, name, options=None):
    return fake.slash(user, name, options, guild_id=GUILD, channel_id=CHANNEL, roles=[ROLE])


async def said(fake, user, name, options=None) -> str:
    it = slash(fake, user, name, options)
    await until(it.answered, what=f"/{name}")
    await until(lambda: it.texts(), what=f"/{name}'s reply")
    return it


@pytest.mark.slow
def test_discord_and_the_api_list_dismiss_and_tell_gaps(dc_world):
    settings, fake, notes = dc_world

    async def scenario(daemon):
        for user, q in ((ONE, Q_EN), (ONE, Q_ZH), (TWO, Q_EN)):
            slash(fake, user, "ask", {"question": q})
        await until(lambda: len(open_gaps(daemon, f"discord:{ONE}")) == 1 and open_gaps(
            daemon, f"discord:{ONE}")[0].count == 2 and open_gaps(daemon, f"discord:{TWO}"), what="the gaps kept")
        mine = open_gaps(daemon, f"discord:{ONE}")[0]
        it = await said(fake, ONE, "gaps")
        assert it.ephemeral and Q_ZH in it.texts()[-1] and Q_EN in it.texts()[-1]
        ids = [b.get("custom_id") for b in it.buttons()]
        assert ids == [f"gap:w:{mine.id}", f"gap:x:{mine.id}"]
        # the list is ONE's alone: the other person cannot see it, so cannot press under it; a forged
        # press with ONE's gap id under their own list is dropped by discord.py (no such button
        # there) and changes nothing
        with pytest.raises(AssertionError, match="cannot see"):
            fake.press(TWO, it.last_message(), f"gap:x:{mine.id}", roles=[ROLE])
        theirs = await said(fake, TWO, "gaps")
        fake.press(TWO, theirs.last_message(), f"gap:x:{mine.id}", roles=[ROLE], forged=True)
        own = await said(fake, TWO, "gaps")
        assert open_gaps(daemon, f"discord:{ONE}")[0].state == "open" and Q_EN in own.texts()[-1]
        # /digest: an unknown time zone is an error that says so
        bad = await said(fake, ONE, "digest", {"when": "daily 08:30 Mars/Olympus"})
        assert "unknown time zone" in bad.texts()[-1]
        # the API: the local socket is the operator's own person ("cli"): none of ONE's gaps
        async with unix_ahttp(settings.api.socket) as http:
            assert (await http.get("/gaps")).json() == []
            refused = await http.post(f"/gaps/{mine.id}/dismiss")
            assert refused.status_code == 400 and "not one of yours" in refused.json()["error"]
            assert (await http.get("/gaps", params={"state": "nowhere"})).status_code == 400
            got = await http.get("/digest")
            assert got.status_code == 200 and "changed" in got.json()
        # the note that answers it is synced: ONE and TWO get a direct message, once
        (notes / "运维" / "nginx.md").write_text(NGINX)
        await said(fake, ONE, "sync")
        await until(lambda: any("now answers" in t for t in fake.dms.get(ONE, [])) and
                    any("now answers" in t for t in fake.dms.get(TWO, [])), what="the direct messages")
        assert f"now answers «{mine.question}» (asked 2 times)" in fake.dms[ONE][0]
        # a press on the old ✖: answered already
        again = fake.press(ONE, it.last_message(), f"gap:x:{mine.id}", roles=[ROLE])
        await until(lambda: again.texts())
        assert "answered already" in again.texts()[-1]
        gone = await said(fake, ONE, "forget")
        assert "Forgot your 1 knowledge gap" in gone.texts()[-1]

    run(settings, scenario, discord_service, lambda: fake.ready and fake.commands_for(GUILD))
