"""The Discord bot end to end: the real discord.py client inside the real daemon logs in
to a local fake Discord (REST + WebSocket gateway, tests/fakes/discord.py), receives
``INTERACTION_CREATE`` for its slash commands, and its defer, edits and follow-ups
arrive at the fake over HTTP; answers come from the sample notes and a fake Ollama.

Some tests state behaviour the bot is about to get (per-person memory in shared
channels, private answers by default, no mentions, a generic error for any failure).
"""

from __future__ import annotations

import asyncio
import logging
import json

import discord
import pytest
import yarl
from discord.gateway import DiscordWebSocket

from bot.discord import service
from rag.errors import ConfigError
from bot.serve import Daemon

from conftest import SCENARIO, long_reply, make_settings, until, within
from fakes.discord import EPHEMERAL, FakeDiscord, embed_text
from fakes.ollama import FakeOllama

TOKEN = "MTAx.fake.discord-token"
ONE, TWO, STRANGER = 310000000000000001, 310000000000000002, 310000000000000999
GUILD, CHANNEL, OTHER_CHANNEL, ROLE = 320000000000000042, 320000000000004201, 320000000000004299, 330000000000000077
COMMANDS = {"ask", "search", "reset", "status", "sync", "why", "web", "help", "gaps", "forget", "digest", "note", "append", "remember",
            "outbox", "Save to my notes",  # a folder install (the sample notes): its captures go into the folder
            "about", "related", "reject", "confirm"}


class World:
    def __init__(self, tmp_path, fake, ollama):
        self.tmp_path, self.fake, self.ollama = tmp_path, fake, ollama

    def settings(self, sync=None, **discord_config):
        return make_settings(
            self.tmp_path,
            discord={"enabled": True, "token_env": "LR_DISCORD_TOKEN", "api_base": self.fake.api_base,
                     "guild_ids": [GUILD], "channel_ids": [CHANNEL], "role_ids": [ROLE], "edit_interval": 0.3,
                     **discord_config},
            users=[{"leanote_user_id": "local", "discord_ids": [ONE], "admin": True},
                   {"leanote_user_id": "local", "discord_ids": [TWO]}],
            ollama={"host": self.ollama.url}, rerank={"kind": "none"},
            sync={"interval": "1h", "trigger_debounce": "0.1s", **(sync or {})}, bots={"rate_limit": 10},
        )


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_DISCORD_TOKEN", TOKEN)
    with FakeDiscord(token=TOKEN, guilds={GUILD: {"channels": [CHANNEL, OTHER_CHANNEL], "roles": [ROLE]}}) as fake, \
            FakeOllama() as ollama:
        # discord.py's plain Client connects to the gateway it has built in
        # (wss://gateway.discord.gg) without asking GET /gateway/bot; bot/discord.py points
        # only the REST base elsewhere, so the test points the gateway at the fake.
        monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(fake.gateway_url))
        yield World(tmp_path, fake, ollama)


def run(settings, fake, scenario, commands_in=GUILD):
    async def main():
        daemon = Daemon(settings, services=[service])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(lambda: fake.ready and fake.commands_for(commands_in), what="the bot to connect and sync")
            await within(scenario(daemon), "the scenario", SCENARIO)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())


def slash(fake, user, name, options=None, channel=CHANNEL, roles=(ROLE,)):
    return fake.slash(user, name, options, guild_id=GUILD, channel_id=channel, roles=list(roles))


def finished(it) -> bool:
    """The answer is complete: it is shown in embeds, the last of them numbered "n/n"
    when there are several."""
    embeds = it.final_embeds()
    if not embeds:
        return False
    page = (embeds[-1].get("footer") or {}).get("text", "")
    if "/" not in page:
        return len(embeds) == 1
    i, n = page.split("/")
    return i == n and len(embeds) == int(n)


async def answer(fake, user, question, timeout=15.0, **options):
    it = slash(fake, user, "ask", {"question": question, **options})
    await until(lambda: finished(it), timeout, what=f"the answer to {question!r}")
    return it


async def reply(fake, user, name):
    it = slash(fake, user, name)
    await until(it.answered, what=f"/{name}")
    return it


def prompts(ollama, since=0) -> str:
    return "\n".join(json.dumps(body, ensure_ascii=False) for body in ollama.chats()[since:])


# --- connecting, streaming, long answers --------------------------------------------------------


@pytest.mark.slow
def test_the_bot_connects_syncs_its_guild_commands_and_streams_an_answer_into_an_embed(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        identify = fake.identifies[0]
        assert identify["token"] == TOKEN and identify["intents"] == discord.Intents.default().value
        query = fake.connections[0]
        assert query["v"] == "10" and query["encoding"] == "json"
        assert query.get("compress") == "zlib-stream"
        assert fake.links[0].compress == "zlib-stream" and fake.links[0].frames >= 3  # HELLO, READY, GUILD_CREATE…
        assert set(fake.commands_for(GUILD)) == COMMANDS
        assert fake.commands_for(None) == {}  # guild_ids configured: synced there only
        ask = fake.commands_for(GUILD)["ask"]
        # (the question may be left out when a voice clip or an image is the question: a file)
        assert [(o["name"], o["type"], o.get("required", False)) for o in ask["options"]] == [
            ("question", 3, False), ("private", 5, False), ("file", 11, False)]

        ollama.reply("一定要先把鸡蛋炒好盛出[1]。", "加一小勺糖", "（大概 5 克）[1]。", "能压住番茄的酸味[1]。", delay=0.3)
        it = await answer(fake, ONE, "番茄炒蛋怎么做才不酸？")
        t0, first, callback = it.events[0]
        assert first == "callback" and callback["type"] == 5  # deferred …
        assert t0 - it.created < 3.0  # … within the three seconds Discord allows
        edits = [(t, body) for t, kind, body in it.events if kind == "edit"]
        streamed = [(t, b["content"]) for t, b in edits if b.get("content")]
        # the sources first (before any of the answer's text), then the answer streamed under them
        assert streamed[0][1].startswith("📚 读的笔记:\n[1] 番茄炒蛋") and "先把鸡蛋" not in streamed[0][1]
        assert len(streamed) >= 2 and all(text.endswith("▌") for _, text in streamed[1:])
        assert all(b - a >= 0.25 for (a, _), (b, _) in zip(streamed, streamed[1:]))  # paced
        final = edits[-1][1]
        assert final["content"] is None and len(final["embeds"]) == 1
        description = final["embeds"][0]["description"]
        assert description.startswith("一定要先把鸡蛋炒好盛出[1]。加一小勺糖（大概 5 克）[1]。能压住番茄的酸味[1]。")
        assert "[1] 番茄炒蛋" in description and "来源" in description
        assert it.followups == [] and not it.thinking()
        assert fake.unknown == [] and fake.unauthorized == 0  # it called nothing Discord would not serve

    run(world.settings(), fake, scenario)


def test_long_answers_continue_in_follow_ups_within_discords_limits(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        ollama.reply(long_reply(20))
        it = await answer(fake, ONE, "番茄炒蛋怎么做？", timeout=20)
        assert it.followups, "the rest of a long answer comes in follow-ups"
        embeds = it.final_embeds()
        assert len(embeds) >= 3
        assert all(len(e["description"]) <= 4096 for e in embeds)  # the fake refuses more, as Discord does
        whole = "".join(e["description"] for e in embeds)
        assert whole.index("第零段") < whole.index("第十九段") < whole.index("来源")
        # a follow-up is as public or private as the answer it continues
        assert {m.ephemeral for m in it.followups} == {it.ephemeral}

    run(world.settings(), fake, scenario)


# --- a. per-person memory in a shared channel -----------------------------------------------------

Q_ONE = "ONE想知道番茄炒蛋怎么做才不酸？"
A_ONE = "ONE专属答案：先炒蛋再下番茄，加一小勺糖[1]。"


def test_why_in_a_shared_channel_shows_only_the_askers_own_last_answer(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        ollama.reply(A_ONE)
        asked = await answer(fake, ONE, Q_ONE)
        assert "ONE专属答案" in embed_text(asked.final_embeds()[0])  # grounded: the LLM answered

        mine = (await reply(fake, ONE, "why")).texts()[-1]
        assert "ONE想知道" in mine
        titles = {line[2:].split(" › ")[0] for line in mine.splitlines() if line.startswith("• ")}
        assert "番茄炒蛋" in titles

        theirs = (await reply(fake, TWO, "why")).texts()[-1]
        assert "ONE想知道" not in theirs, "TWO's /why shows ONE's question"
        leaked = sorted(t for t in titles if t in theirs)
        assert not leaked, f"TWO's /why lists ONE's candidate notes: {leaked}"

    run(world.settings(), fake, scenario)


def test_a_follow_up_by_someone_else_in_the_channel_never_sees_the_first_persons_turn(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        ollama.reply(A_ONE)
        asked = await answer(fake, ONE, Q_ONE)
        assert "ONE专属答案" in embed_text(asked.final_embeds()[0])
        since = len(ollama.chats())
        ollama.reply("TWO的回答：五花肉先焯水[1]。")
        await answer(fake, TWO, "那红烧肉呢？")
        assert len(ollama.chats()) > since  # TWO's question reached the LLM: there are prompts to inspect
        sent = prompts(ollama, since)
        assert "ONE想知道" not in sent, "ONE's question went into a prompt for TWO's follow-up"
        assert "ONE专属答案" not in sent, "ONE's answer went into a prompt for TWO's follow-up"

    run(world.settings(), fake, scenario)


def test_reset_by_one_person_leaves_the_others_conversation_alone(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        ollama.reply(A_ONE)
        asked = await answer(fake, ONE, Q_ONE)
        assert "ONE专属答案" in embed_text(asked.final_embeds()[0])
        reset = await reply(fake, TWO, "reset")
        assert "Fresh start" in reset.texts()[-1] and reset.ephemeral
        since = len(ollama.chats())
        ollama.reply("番茄炒蛋怎么做才不酸，要放糖吗？")  # the follow-up, rewritten with ONE's history
        ollama.reply("要放一小勺糖[1]。")
        await answer(fake, ONE, "那要放糖吗？")
        assert "ONE想知道" in prompts(ollama, since), "ONE's conversation was forgotten after TWO's /reset"

    run(world.settings(), fake, scenario)


# --- b. answers are private unless opted in ---------------------------------------------------------

LONG_ONE = long_reply(12, "甲私密")


def test_answers_are_private_by_default_and_reach_nobody_else(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        ollama.reply(LONG_ONE)
        it = await answer(fake, ONE, Q_ONE, timeout=20)
        callback = it.callback
        assert callback["type"] == 5 and int(callback["data"].get("flags", 0)) & EPHEMERAL, \
            "the default /ask is deferred in public"
        assert it.followups, "a long answer continues in follow-ups"
        assert all(int(b.get("flags", 0)) & EPHEMERAL for b in it.bodies("followup")), \
            "a private answer continues in public follow-ups"
        assert it.ephemeral and all(m.ephemeral for m in it.followups)
        assert "甲私密第零段" in fake.seen_by(ONE)
        why = await reply(fake, TWO, "why")
        assert why.ephemeral
        assert "甲私密" not in fake.seen_by(TWO) and "ONE想知道" not in fake.seen_by(TWO)
        assert "甲私密" not in fake.public_texts()

    run(world.settings(), fake, scenario)


def test_the_asker_may_make_an_answer_public(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        ollama.reply(LONG_ONE)
        it = await answer(fake, ONE, Q_ONE, timeout=20, private=False)
        assert it.callback["type"] == 5 and not int(it.callback["data"].get("flags", 0)) & EPHEMERAL
        assert it.followups and not any(int(b.get("flags", 0)) & EPHEMERAL for b in it.bodies("followup"))
        assert "甲私密第十一段" in fake.seen_by(TWO)  # public: everyone in the channel sees it

    run(world.settings(), fake, scenario)


def test_public_answers_can_be_the_servers_default(world):
    fake, ollama = world.fake, world.ollama
    try:
        settings = world.settings(public_answers=True)
    except ConfigError as err:
        pytest.fail(f"discord.public_answers is not a config key yet: {err}")

    async def scenario(daemon):
        ollama.reply("公开的回答：先炒蛋[1]。")
        public = await answer(fake, ONE, "番茄炒蛋怎么做？")
        assert public.ephemeral is False and "公开的回答" in fake.seen_by(TWO)
        ollama.reply("私下的回答：先炒蛋[1]。")
        private = await answer(fake, TWO, "番茄炒蛋怎么做？", private=True)  # an explicit choice still counts
        assert private.ephemeral is True and "私下的回答" not in fake.seen_by(ONE)

    run(settings, fake, scenario)


# --- c. strangers, and the wrong place ------------------------------------------------------------------


def test_a_stranger_gets_one_ephemeral_refusal_and_no_llm_call(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        cases = [
            (STRANGER, CHANNEL, (ROLE,), str(STRANGER)),
            (ONE, CHANNEL, (), "roles allowed"),  # a mapped person without the role (resolved from GUILD_CREATE)
            (ONE, OTHER_CHANNEL, (ROLE,), "channel"),
        ]
        for user, channel, roles, expected in cases:
            it = fake.slash(user, "ask", {"question": "番茄炒蛋怎么做？"}, guild_id=GUILD, channel_id=channel,
                            roles=list(roles))
            await until(it.answered, what="the refusal")
            await asyncio.sleep(0.3)
            assert it.kinds() == ["callback"], (expected, it.kinds())
            assert it.callback["type"] == 4 and it.ephemeral
            text = it.texts()[-1]
            assert expected in text and "番茄" not in text
            assert expected not in fake.seen_by(TWO)
        assert ollama.chats() == []

    run(world.settings(), fake, scenario)


# --- d. no mentions ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_messages_allow_no_mentions(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        pinged = f"@everyone <@{TWO}> <@&{ROLE}> "
        ollama.reply(pinged, "先炒蛋", "，再下番茄", "[1]。\n\n" + long_reply(10, pinged), delay=0.4)
        await answer(fake, ONE, f"{pinged}番茄炒蛋怎么做？", timeout=20, private=False)
        bodies = fake.requests("edit", "followup")
        assert any(b.get("content") for b in bodies) and fake.requests("followup")  # streamed, and continued
        for body in bodies:
            mentions = body.get("allowed_mentions")
            assert mentions is not None, f"sent without allowed_mentions: {str(body)[:120]}"
            assert mentions.get("parse") == [] and not mentions.get("users") and not mentions.get("roles")
            assert not mentions.get("replied_user")

    run(world.settings(), fake, scenario)


# --- e. an unexpected failure ---------------------------------------------------------------------------


def test_an_unexpected_error_gets_a_short_generic_message_and_the_next_ask_works(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        async def broken(*args, **kwargs):
            raise RuntimeError("internal detail: index shard 7 is corrupt")

        daemon.answers.ask = broken  # this instance only, for one question
        it = slash(fake, ONE, "ask", {"question": "番茄炒蛋怎么做？"})
        try:
            await until(lambda: it.answered() and not it.thinking(), timeout=5,
                        what="an error message instead of 'thinking…'")
        finally:
            del daemon.answers.ask
        text = it.texts()[-1]
        assert text and len(text) < 300 and "shard 7" not in text and "RuntimeError" not in text
        assert "thinking" not in text.lower()
        assert "shard 7" not in fake.seen_by(ONE)
        assert text not in fake.seen_by(TWO)  # the error is the asker's business
        settled = len(it.events)
        await asyncio.sleep(1.0)  # nothing keeps editing it
        assert len(it.events) == settled

        ollama.reply("先炒蛋[1]。")
        again = await answer(fake, ONE, "番茄炒蛋怎么做？")
        assert "先炒蛋[1]" in embed_text(again.final_embeds()[0])

    run(world.settings(), fake, scenario)


def test_an_error_in_any_command_ends_in_the_bots_one_error_handler(world, caplog):
    """A command that fails, whatever it is (here /search), is logged once with its
    traceback by the bot's one error handler, and the person gets one short private line."""
    fake = world.fake

    async def scenario(daemon):
        async def broken(*args, **kwargs):
            raise RuntimeError("internal detail: index shard 7 is corrupt")

        daemon.answers.search = broken
        try:
            it = slash(fake, ONE, "search", {"query": "番茄"})
            await until(lambda: it.answered() and not it.thinking() and it.texts(), timeout=10,
                        what="an error message instead of 'thinking…'")
        finally:
            del daemon.answers.search
        text = it.texts()[-1]
        assert "Sorry, something went wrong" in text and "shard 7" not in text and it.ephemeral
        failed = [r for r in caplog.records if r.name.startswith("bot.discord") and r.levelno == logging.ERROR]
        assert [r.getMessage() for r in failed] == ["discord: /search failed"]
        assert "shard 7" in str(failed[0].exc_info[1])

    run(world.settings(), fake, scenario)


def test_without_guild_ids_commands_are_global_and_work_in_dms_when_allowed(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        assert set(fake.commands_for(None)) == COMMANDS and fake.commands_for(GUILD) == {}
        # every option says what it is for in Discord's command picker ("…": discord.py's stand-in for none)
        options = {(c["name"], o["name"]): o["description"] for c in fake.commands_for(None).values()
                   for o in c.get("options", [])}
        assert ("search", "query") in options and ("ask", "question") in options
        assert [key for key, description in options.items() if description in ("", "…")] == []
        ollama.reply("私信里的回答：先炒蛋[1]。")
        it = fake.slash(ONE, "ask", {"question": "番茄炒蛋怎么做？"})  # no guild: a DM with the bot
        await until(lambda: finished(it), what="the answer in a DM")
        assert "私信里的回答" in embed_text(it.final_embeds()[0]) and it.kinds()[0] == "callback"
        assert "私信里的回答" not in fake.seen_by(TWO)
        ollama.reply("频道里的回答：先炒蛋[1]。")
        await answer(fake, TWO, "番茄炒蛋怎么做？")  # a global command, run in the guild channel

    run(world.settings(guild_ids=[], allow_dms=True), fake, scenario, commands_in=None)


# --- the connection itself ---------------------------------------------------------------------------------


def test_the_bot_resumes_after_the_gateway_asks_it_to_reconnect_and_throttling_is_honoured(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        session = fake.session.id
        fake.reconnect()
        await until(lambda: fake.resumes and fake.ready, what="a RESUME")
        assert fake.resumes[0]["session_id"] == session and len(fake.identifies) == 1
        assert len(fake.connections) == 2 and fake.session.id == session

        fake.throttle_next("edit", times=2, retry_after=0.4)  # 429s while streaming
        ollama.reply("家里 DHCP 地址池是 ", "192.168.50.100–192.168.50.199", "[1]。", delay=0.3)
        it = await answer(fake, ONE, "家里路由器的 DHCP 范围是多少？", timeout=20)
        assert "192.168.50.100–192.168.50.199[1]。" in embed_text(it.final_embeds()[0])
        assert fake.throttle["edit"][0] == 0  # both 429s were served, and retried

    run(world.settings(), fake, scenario)


def test_a_wrong_token_stops_the_bot_with_one_clear_error_while_sync_goes_on(world, monkeypatch, caplog):
    fake = world.fake
    monkeypatch.setenv("LR_DISCORD_TOKEN", "not-the-token")
    settings = world.settings(sync={"backoff_min": "0.1s", "backoff_max": "0.2s"})

    async def main():
        daemon = Daemon(settings, services=[service])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(lambda: fake.unauthorized >= 1, what="a login")
            await asyncio.sleep(1.0)  # backoff is 0.1-0.2 s: a retry would have come by now
            assert fake.unauthorized == 1  # retrying cannot fix a wrong token
            assert daemon.last_pass.ok and not task.done()
            assert fake.identifies == []  # it never got as far as the gateway
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(within(main(), "the scenario", SCENARIO))
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "Discord bot stopped" in errors[0] and "LR_DISCORD_TOKEN" in errors[0]
