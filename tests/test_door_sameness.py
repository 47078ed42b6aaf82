"""The differences between the two chat doors that had no reason (issue 54), made the same, each
through the real bot in the real daemon against its fake platform:

- Discord tells a person of a capture whose reply was cut off (the door's task ended between
  taking it and answering), in a direct message, as Telegram tells it in the chat: it used to show
  only in ``/outbox``;
- the replies to a press on a button under an answer are worded one way on both doors;
- Discord splits a long ``/gaps`` over several messages, its buttons under the last, as Telegram
  does: nothing is cut at 2,000 characters."""

from __future__ import annotations

import asyncio
import socket

import pytest

import test_discord_capture as dc
import test_telegram_capture as tc
from conftest import until
from test_telegram import run as tg_run

pytestmark = pytest.mark.slow  # a daemon with a bot, each

EXPIRED = "这个回答已经过期了，请再问一次。 / This answer has expired: ask again."
NOT_YOURS = "这是别人的回答。 / This is someone else's answer."
RATED = "谢谢，会用它来改进回答。 / Thanks: this helps improve the answers."
EGG = "先把鸡蛋炒好盛出[1]。"

world = dc.world
tg_world = tc.world


def test_discord_tells_a_person_of_a_capture_whose_reply_was_cut_off(world):
    fake, leanote = world.fake, world.leanote

    async def scenario(daemon):
        held = leanote.hold("note/addNote")  # Leanote takes its time: the write is on its way when the door ends
        taken = asyncio.create_task(daemon.capture.note(f"discord:{dc.ONE}", dc.LEANOTE_USER, "断线之前记的 CUT-OFF",
                                                        once="discord:interaction:1"))
        await until(lambda: leanote.calls["note/addNote"] == 1, what="the write to reach Leanote")
        taken.cancel()  # the door's task ended first: no receipt went out
        held.set()
        [told] = await until(lambda: fake.dms.get(dc.ONE), timeout=30, what="the receipt in a direct message")
        [note] = [n for n in leanote.notes.values() if "CUT-OFF" in n["Content"]]
        assert "已记下" in told and f"/note/{note['NoteId']}" in told, told
        await until(lambda: not daemon.capture.outbox.untold("discord"), what="the capture marked told")

    dc.run(world.settings(), fake, scenario)


def test_the_replies_to_a_press_are_worded_one_way_in_discord(world):
    fake = world.fake

    async def scenario(daemon):
        world.ollama.reply(EGG)
        asked = await dc.ask(fake, dc.ONE, "番茄炒蛋怎么做？", private=False)  # public: others see the buttons
        up = next(b["custom_id"] for b in asked.buttons() if b["custom_id"].startswith("fb:up:"))
        said = {}
        _, said["theirs"] = await dc.press(fake, dc.TWO, asked.last_message(), up)
        _, said["rated"] = await dc.press(fake, dc.ONE, asked.last_message(), up)
        await dc.command(fake, dc.ONE, "forget")  # the answers kept for the buttons go with it
        _, said["expired"] = await dc.press(fake, dc.ONE, asked.last_message(), up)
        assert said == {"theirs": NOT_YOURS, "expired": EXPIRED, "rated": RATED}

    dc.run(world.settings(), fake, scenario)


def test_the_replies_to_a_press_are_worded_one_way_in_telegram(tg_world):
    make, tg, ollama, _ = tg_world

    async def scenario(daemon):
        mid = await tc.answered(tg, ollama)
        up = next(data for _, data in tg.buttons(mid) if data.startswith("fb:up:"))
        said = {}
        for what, who in (("theirs", tc.FRIEND), ("rated", tc.OWNER), ("forget", None), ("expired", tc.OWNER)):
            if who is None:  # the answers kept for the buttons go with the rest
                before = len(tg.sent_to(tc.OWNER))
                tg.say(tc.OWNER, "/forget")
                await until(lambda: len(tg.sent_to(tc.OWNER)) > before, what="/forget done")
                continue
            q = tg.press(who, tc.OWNER, mid, up)
            said[what] = (await until(lambda: tg.answered(q)))[0]["text"]
        assert said == {"theirs": NOT_YOURS, "expired": EXPIRED, "rated": RATED}

    tg_run(make(), tg, scenario)


def test_discord_splits_a_long_gaps_list_over_several_messages(world):
    fake = world.fake
    topics = ("nginx rate limiting zone burst", "PostgreSQL autovacuum cost delay tuning",
              "Kubernetes pod disruption budget eviction")
    questions = [f"How do I set up {t}? " + f"I mean {t} " * 25 for t in topics]  # ~800 characters each

    async def scenario(daemon):
        for q in questions:
            it = fake.slash(dc.ONE, "ask", {"question": q}, guild_id=dc.GUILD, channel_id=dc.CHANNEL, roles=[dc.ROLE])
            await until(lambda: it.final_embeds() and not it.thinking(), what="the refusal")
        await until(lambda: len(daemon.parts.gaps.gaps(f"discord:{dc.ONE}", dc.LEANOTE_USER)) == 3,
                    what="three gaps kept")
        it = fake.slash(dc.ONE, "gaps", {}, guild_id=dc.GUILD, channel_id=dc.CHANNEL, roles=[dc.ROLE])
        await until(lambda: it.buttons(), what="the list with its buttons")
        shown = [m for m in it.messages() if m.versions]
        texts = [m.all_texts()[-1] for m in shown]
        assert len(shown) >= 2 and all(len(t) <= 2000 for t in texts)
        whole = "\n".join(texts)
        assert all(q.strip() in " ".join(whole.split()) for q in questions) and "✍️ n" in whole  # nothing cut off
        assert [m for m in shown if m.buttons()] == [shown[-1]] and len(shown[-1].buttons()) == 6

    dc.run(world.settings(), fake, scenario)


# --- /web: the web chat's one-time link, to the person alone, shown as a link ----------------------------

def _web(settings):
    """``settings`` with the API's listener on a free port, and the web chat's address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return settings.model_copy(update={"api": settings.api.model_copy(
        update={"listen": f"127.0.0.1:{port}", "web_url": "https://notes.example.com"})})


def test_telegram_web_in_a_group_sends_the_link_privately_as_a_link(tg_world):
    make, tg, _, _ = tg_world

    async def scenario(daemon):
        before = {c: len(tg.sent_to(c)) for c in (tc.OWNER, tc.GROUP)}
        tg.say(tc.OWNER, "/web", chat_id=tc.GROUP, chat_type="supergroup")
        [private] = await until(lambda: tg.sent_to(tc.OWNER)[before[tc.OWNER]:], what="the link in private")
        await until(lambda: [m for m in tg.sent_to(tc.GROUP)[before[tc.GROUP]:] if "私信" in m["text"]],
                    what="the group told it went privately")
        assert '<a href="https://notes.example.com/chat#code=' in private["text"], private["text"]
        assert not [m for m in tg.sent_to(tc.GROUP)[before[tc.GROUP]:] if "#code=" in m["text"]]

    tg_run(_web(make()), tg, scenario)


def test_discord_web_sends_the_link_to_the_person_alone_as_a_link(world):
    fake = world.fake

    async def scenario(daemon):
        it, text = await dc.command(fake, dc.ONE, "web")
        assert "<https://notes.example.com/chat#code=" in text, text
        assert not any(m.public for m in it.messages()), it.messages()  # only the asker sees a key

    dc.run(_web(world.settings()), fake, scenario)
