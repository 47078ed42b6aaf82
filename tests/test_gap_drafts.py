"""The note begun with ✍️ under /gaps, through the real doors: the daemon with the real Telegram
bot (python-telegram-bot against the fake Bot API) and the real Discord bot (discord.py against
the fake Discord), a fake Leanote taking the notes. A draft never traps the person: it ends when
its write is refused, on /reset and any other command, on ✖ (cancel, or dismissing its gap),
and a question typed while it waits is asked about, never silently saved."""

from __future__ import annotations

import shutil

import pytest
import yarl
from discord.gateway import DiscordWebSocket

from bot.discord import service as discord_service
from bot.telegram import service as telegram_service

from conftest import EXAMPLES, make_settings, unix_ahttp, until
from fakes.discord import FakeDiscord
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram
from test_gaps_doors import mid, new_message, open_gaps, run

OWNER = 111
Q_EN = "How do I configure nginx rate limiting?"
LONG = "limit_req_zone " + "zone=one:10m rate=5r/s burst=10 " * 5  # over capture.max_chars (100)
EGG = "先把鸡蛋炒好盛出[1]。"


def notes_titled(leanote, title):
    return [n for n in leanote.notes.values() if n["Title"] == title]


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
            users=[{"leanote_user_id": "local", "telegram_ids": [OWNER], "admin": True}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, sync={"interval": "1h", "trigger_debounce": "0.1s"},
            leanote={"base_url": leanote.url}, api={"socket": str(tmp_path / "api.sock")},
            capture={"accounts": [{"email": "me@example.com", "password_env": "LR_LEANOTE_PW"}], "sync_after": "1h",
                     "max_chars": 100},
        )
        yield settings, tg, leanote, ollama


@pytest.mark.slow
def test_telegram_a_draft_never_traps_the_person(tg_world):
    settings, tg, leanote, ollama = tg_world

    def draft(daemon):
        return daemon.parts.gaps.draft("telegram:111")

    async def said(text, containing, **kw):
        before = len(tg.sent_to(OWNER))
        tg.say(OWNER, text, **kw)
        return await new_message(tg, OWNER, before, containing)

    async def write_pressed(listed, gap_id):
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, OWNER, mid(tg, listed), f"gap:w:{gap_id}")
        return await new_message(tg, OWNER, before, "Your next message becomes the note")

    async def scenario(daemon):
        tg.say(OWNER, Q_EN)
        await until(lambda: open_gaps(daemon, "telegram:111"), what="the gap kept")
        gap = open_gaps(daemon, "telegram:111")[0]
        listed = await said("/gaps", "What your notes could not answer")
        assert "your next message becomes it" in listed["text"]
        # ✍️: what happens next, for how long, and a ✖ cancel under it
        writing = await write_pressed(listed, gap.id)
        assert "within 30 min" in writing["text"] and f"«{Q_EN}»" in writing["text"]
        assert tg.buttons(mid(tg, writing)) == [("✖ 取消 cancel", f"gap:c:{gap.id}")]
        # the write is refused (too long): it says so, and the draft is over
        refused = await said(LONG, "Too long")
        assert "was not written" in refused["text"] and draft(daemon) is None
        # the next question is answered, not refused as a capture again nor saved as the note
        ollama.reply(EGG)
        before = len(tg.sent_to(OWNER))
        await said("番茄炒蛋怎么做", "先把鸡蛋炒好盛出")
        assert not notes_titled(leanote, Q_EN) and not [m for m in tg.sent_to(OWNER)[before:] if "Too long" in m["text"]]

        # /reset ends it, and says so (then the fresh start)
        await write_pressed(listed, gap.id)
        await said("/reset", "Fresh start")
        assert any("Cancelled: the note" in m["text"] for m in tg.sent_to(OWNER)[-2:]) and draft(daemon) is None
        # any other command ends it as well
        await write_pressed(listed, gap.id)
        await said("/outbox", "Cancelled: the note")
        assert draft(daemon) is None
        # ✖ cancel under the ✍️ reply
        writing = await write_pressed(listed, gap.id)
        q = tg.press(OWNER, OWNER, mid(tg, writing), f"gap:c:{gap.id}")
        assert "Cancelled" in (await until(lambda: tg.answered(q)))[0]["text"] and draft(daemon) is None

        # a question while it waits is asked about; ❓ answers it and the draft ends
        await write_pressed(listed, gap.id)
        ollama.reply(EGG)
        asked = await said("番茄炒蛋要先炒蛋吗？", "This looks like a question")
        assert [a for _, a in tg.buttons(mid(tg, asked))] == [f"gap:s:{gap.id}", f"gap:a:{gap.id}", f"gap:c:{gap.id}"]
        assert not notes_titled(leanote, Q_EN) and draft(daemon) is not None
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, OWNER, mid(tg, asked), f"gap:a:{gap.id}")
        await new_message(tg, OWNER, before, "先把鸡蛋炒好盛出")
        assert draft(daemon) is None and not notes_titled(leanote, Q_EN)
        # ... and 💾 saves it as the note after all, titled by the gap's question, once
        await write_pressed(listed, gap.id)
        asked = await said("limit_req 要放在 location 里吗？", "This looks like a question")
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, OWNER, mid(tg, asked), f"gap:s:{gap.id}")
        await new_message(tg, OWNER, before, "已记下")
        written = notes_titled(leanote, Q_EN)
        assert len(written) == 1 and "limit_req 要放在 location 里吗" in written[0]["Content"]
        assert draft(daemon) is None
        # /note while it waits is that note
        await write_pressed(listed, gap.id)
        await said("/note limit_req_zone $binary_remote_addr zone=one:10m rate=5r/s;", "已记下")
        assert len(notes_titled(leanote, Q_EN)) == 2 and draft(daemon) is None
        assert len(leanote.notes) == 2  # and not a second note of its own as well

        # ✍️ then ✖ on the same gap: the next message is a question again, not that gap's note
        await write_pressed(listed, gap.id)
        q = tg.press(OWNER, OWNER, mid(tg, listed), f"gap:x:{gap.id}")
        assert "Dismissed" in (await until(lambda: tg.answered(q)))[0]["text"]
        ollama.reply(EGG)
        await said("番茄炒蛋先炒蛋", "先把鸡蛋炒好盛出")
        assert len(notes_titled(leanote, Q_EN)) == 2 and draft(daemon) is None

    run(settings, scenario, telegram_service, lambda: tg.method_calls("getUpdates"))


# --- Discord, and the API --------------------------------------------------------------------------

TOKEN = "MTAx.fake.discord-token"
ONE = 310000000000000001
GUILD, CHANNEL, ROLE = 320000000000000042, 320000000000004201, 330000000000000077


@pytest.fixture
def dc_world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_DISCORD_TOKEN", TOKEN)
    monkeypatch.setenv("LR_LEANOTE_PW", "pw-secret")
    notes = tmp_path / "notes"
    shutil.copytree(EXAMPLES, notes)
    with FakeDiscord(token=TOKEN, guilds={GUILD: {"channels": [CHANNEL], "roles": [ROLE]}}) as fake, \
            FakeOllama() as ollama, FakeLeanote() as leanote:
        leanote.add_user("local", "me@example.com", "pw-secret")
        monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(fake.gateway_url))
        settings = make_settings(
            tmp_path, source={"kind": "files", "path": str(notes)},
            discord={"enabled": True, "token_env": "LR_DISCORD_TOKEN", "api_base": fake.api_base,
                     "guild_ids": [GUILD], "channel_ids": [CHANNEL], "role_ids": [ROLE], "edit_interval": 0.3},
            users=[{"leanote_user_id": "local", "discord_ids": [ONE], "admin": True}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, sync={"interval": "1h", "trigger_debounce": "0.1s"},
            leanote={"base_url": leanote.url}, api={"socket": str(tmp_path / "api.sock")},
            capture={"accounts": [{"email": "me@example.com", "password_env": "LR_LEANOTE_PW"}], "sync_after": "1h",
                     "max_chars": 100},
        )
        yield settings, fake, leanote


@pytest.mark.slow
def test_discord_and_the_api_a_draft_never_traps_the_person(dc_world):
    settings, fake, leanote = dc_world

    def slash(name, options=None):
        return fake.slash(ONE, name, options, guild_id=GUILD, channel_id=CHANNEL, roles=[ROLE])

    async def done(it, containing=""):
        await until(lambda: [t for t in it.texts() if containing in t], what=f"{it!r} saying {containing!r}")
        return it

    def draft(daemon):
        return daemon.parts.gaps.draft(f"discord:{ONE}")

    async def write_pressed(listed, gap_id):
        it = fake.press(ONE, listed.last_message(), f"gap:w:{gap_id}", roles=[ROLE])
        return await done(it, "Your next /note becomes the note")

    async def scenario(daemon):
        slash("ask", {"question": Q_EN})
        await until(lambda: open_gaps(daemon, f"discord:{ONE}"), what="the gap kept")
        gap = open_gaps(daemon, f"discord:{ONE}")[0]
        listed = await done(slash("gaps"), "What your notes could not answer")
        footer = listed.texts()[-1].splitlines()[-1]
        assert "your next /note becomes it" in footer and "message" not in footer
        writing = await write_pressed(listed, gap.id)
        assert [b.get("custom_id") for b in writing.buttons()] == [f"gap:c:{gap.id}"]
        # /note too long: refused, and the draft is over; the next /note is a note of its own
        refused = await done(slash("note", {"text": LONG}), "Too long")
        assert "was not written" in refused.texts()[-1] and draft(daemon) is None
        await done(slash("note", {"text": "葱油拌面：葱油 3 勺，生抽 2 勺"}), "已记下")
        assert not notes_titled(leanote, Q_EN)
        # any other command ends it, and says so
        await write_pressed(listed, gap.id)
        searched = await done(slash("search", {"query": "番茄"}), "Cancelled: the note")
        assert draft(daemon) is None and searched.ephemeral
        await done(slash("note", {"text": "凉拌黄瓜：拍碎，加蒜末"}), "已记下")
        assert not notes_titled(leanote, Q_EN)
        # ✖ cancel under the ✍️ reply
        writing = await write_pressed(listed, gap.id)
        cancelled = await done(fake.press(ONE, writing.last_message(), f"gap:c:{gap.id}", roles=[ROLE]), "Cancelled")
        assert cancelled.texts() and draft(daemon) is None
        # ✍️ then ✖ on the same gap: the next /note is not that gap's note
        await write_pressed(listed, gap.id)
        await done(fake.press(ONE, listed.last_message(), f"gap:x:{gap.id}", roles=[ROLE]), "Dismissed")
        await done(slash("note", {"text": "拍黄瓜要用刀背拍"}), "已记下")
        assert not notes_titled(leanote, Q_EN) and draft(daemon) is None
        # the API: a note for a gap its write refuses leaves nothing waiting
        store = daemon.parts.gaps
        api_gap, _ = store.add("cli", "local", "怎么煮溏心蛋", "怎么煮溏心蛋", [1.0, 0.0], "refused")
        async with unix_ahttp(settings.api.socket) as http:
            got = await http.post(f"/gaps/{api_gap}/note", json={"text": LONG})
        assert "Too long" in got.text and store.draft("cli") is None

    run(settings, scenario, discord_service, lambda: fake.ready and fake.commands_for(GUILD))
