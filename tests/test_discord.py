"""The Discord bot's slash commands, called through discord.py's own command tree with a
fake Interaction (defer / edit_original_response / followup.send recorded in order),
inside the real daemon, answering from the sample notes with a fake Ollama."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import discord
import pytest

from bot.discord import build, embeds_for
from bot.render import DISCORD_FILES, discord_plain_links
from bot.serve import Daemon

from conftest import SCENARIO, long_reply, make_settings, within
from fakes.ollama import FakeOllama

OWNER, FRIEND, STRANGER = 3001, 3002, 3999
GUILD, CHANNEL, OTHER_CHANNEL, ROLE = 42, 4201, 4299, 77


class FakeInteraction:
    """Records what a command does with its interaction, in order, with times."""

    def __init__(self, user_id, guild_id=GUILD, channel_id=CHANNEL, roles=(ROLE,)):
        self.events: list[tuple[str, dict, float]] = []
        self.user = SimpleNamespace(id=user_id, roles=[SimpleNamespace(id=r) for r in roles])
        self.guild_id, self.channel_id = guild_id, channel_id
        log = self.events

        class Response:
            def is_done(self):  # as discord.py's: answered (deferred or sent) already
                return any(name in ("defer", "send_message") for name, _, _ in log)

            async def defer(self, **kw):
                log.append(("defer", kw, time.monotonic()))

            async def send_message(self, content=None, **kw):
                log.append(("send_message", {"content": content, **kw}, time.monotonic()))

        class Followup:
            async def send(self, content=None, **kw):
                log.append(("followup", {"content": content, **kw}, time.monotonic()))

        self.response, self.followup = Response(), Followup()

    async def edit_original_response(self, **kw):
        self.events.append(("edit", kw, time.monotonic()))

    async def delete_original_response(self):
        self.events.append(("delete", {}, time.monotonic()))

    def names(self):
        return [name for name, _, _ in self.events]


@pytest.fixture
def world(tmp_path):
    with FakeOllama() as ollama:
        settings = make_settings(
            tmp_path,
            discord={"enabled": True, "guild_ids": [GUILD], "channel_ids": [CHANNEL], "role_ids": [ROLE],
                     "edit_interval": 0.3},
            users=[{"leanote_user_id": "local", "discord_ids": [OWNER], "admin": True},
                   {"leanote_user_id": "local", "discord_ids": [FRIEND]}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, sync={"interval": "1h", "trigger_debounce": "0.1s"},
        )
        yield settings, ollama


def run(settings, scenario):
    async def main():
        daemon = Daemon(settings, services=[])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            bot = build(daemon)
            await within(scenario(daemon, bot, lambda name: bot.tree.get_command(name).callback), "the scenario",
                         SCENARIO)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())


@pytest.mark.slow
def test_ask_defers_first_streams_then_answers_in_an_embed(world):
    settings, ollama = world

    async def scenario(daemon, bot, command):
        ollama.reply("先把鸡蛋炒好盛出[1]。", "再下番茄", "中火炒出汁[1]。", "加一小勺糖[1]。", delay=0.3)
        it = FakeInteraction(OWNER)
        await command("ask")(it, question="番茄炒蛋怎么做才不酸？", private=False)  # the asker shares it
        assert it.names()[0] == "defer" and it.events[0][1] == {"thinking": True, "ephemeral": False}
        chat = [t for t in ollama.requests if t[0] == "/api/chat"]
        assert chat  # the work happened after the defer
        streamed = [kw["content"] for name, kw, _ in it.events if name == "edit" and kw.get("content")]
        # first the sources the answer reads, before any of its text; then the answer under them
        assert streamed[0].startswith("📚 读的笔记:\n[1] 番茄炒蛋") and "先把鸡蛋" not in streamed[0]
        assert streamed[1:] and all(t.startswith("📚") and t.endswith("▌") for t in streamed[1:])
        times = [t for name, _, t in it.events if name == "edit"]
        assert all(b - a >= 0.25 for a, b in zip(times, times[1:-1]))
        final = it.events[-1][1]["embed"]
        assert final.description.startswith("先把鸡蛋炒好盛出[1]。再下番茄中火炒出汁[1]。加一小勺糖[1]。")
        # under it, the note's own words it stands on, as a Discord quote
        assert "\n\n> 笔记原文 [1] 番茄炒蛋" in final.description and "\n> " in final.description.split("笔记原文", 1)[1]
        # a link in the LLM's words that no note holds is never shown
        ollama.reply("先把鸡蛋炒好盛出[1]。先登录 [Leanote](https://phish.example/login) 再炒蛋[1]。")
        it2 = FakeInteraction(FRIEND)  # another person: no history, no follow-up rewrite
        await command("ask")(it2, question="番茄炒蛋怎么做才不酸？")
        shown = it2.events[-1][1]["embed"].description
        assert shown.startswith("先把鸡蛋炒好盛出[1]。") and "phish" not in shown
        # where one is shown, it is with its address, not clickable
        plain = discord_plain_links("先登录 [Leanote](https://phish.example/login) 再炒蛋")
        assert "Leanote (`https://phish.example/login`)" in plain and "](https://phish" not in plain
        # a Markdown folder's note: its path as text, said why (Discord opens no file:// link)
        assert "file://" not in final.description.split("来源")[-1].split("（")[0]
        # a folder's note by its path in the folder, readable (no %-escapes)
        assert "[1] 番茄炒蛋 — 生活/菜谱/番茄炒蛋.md\n" in final.description
        assert DISCORD_FILES[0] in final.description and DISCORD_FILES[1] not in final.description  # one language
        assert len(final) <= 6000 and len(final.description) <= 4096

    run(settings, scenario)


def test_private_answers_and_long_answers_continue_in_ephemeral_follow_ups(world):
    settings, ollama = world

    async def scenario(daemon, bot, command):
        ollama.reply(long_reply(20, repeat=40))
        it = FakeInteraction(FRIEND)
        await command("ask")(it, question="番茄炒蛋怎么做？")  # private unless asked otherwise
        assert it.events[0][1]["ephemeral"] is True
        follow = [kw for name, kw, _ in it.events if name == "followup"]
        assert follow and all(kw["ephemeral"] is True for kw in follow)
        embeds = [it.events[-len(follow) - 1][1]["embed"]] + [kw["embed"] for kw in follow]
        assert all(len(e.description) <= 4096 and len(e) <= 6000 for e in embeds)

    run(settings, scenario)


def test_strangers_and_the_wrong_place_get_ephemeral_refusals_before_any_work(world):
    settings, ollama = world

    async def scenario(daemon, bot, command):
        cases = [
            (FakeInteraction(STRANGER), str(STRANGER)),
            (FakeInteraction(OWNER, channel_id=OTHER_CHANNEL), "channel"),
            (FakeInteraction(OWNER, guild_id=999), "server"),
            (FakeInteraction(OWNER, roles=()), "roles allowed"),
            (FakeInteraction(OWNER, guild_id=None, channel_id=None), "direct messages"),
        ]
        for it, expected in cases:
            await command("ask")(it, question="番茄炒蛋怎么做？")
            assert it.names() == ["send_message"], expected
            kw = it.events[0][1]
            assert kw["ephemeral"] is True and expected in kw["content"] and "番茄" not in kw["content"]
        assert ollama.chats() == []

    run(settings, scenario)


def test_errors_are_ephemeral_and_commands_work(world):
    settings, ollama = world

    async def scenario(daemon, bot, command):
        it = FakeInteraction(OWNER)
        await command("ask")(it, question="   ")
        assert it.names() == ["send_message"] and it.events[0][1]["ephemeral"] is True
        it = FakeInteraction(FRIEND)
        await command("sync")(it)
        assert "Only admins" in it.events[0][1]["content"] and it.events[0][1]["ephemeral"]
        passes = daemon.passes
        it = FakeInteraction(OWNER)
        await command("sync")(it)  # "Syncing…", then what the pass did
        assert "Syncing" in it.events[0][1]["content"] and it.events[0][1]["ephemeral"]
        assert "Synced:" in it.events[-1][1]["content"] and "0 deleted" in it.events[-1][1]["content"]
        assert daemon.passes > passes
        it = FakeInteraction(OWNER)
        await command("search")(it, query="红烧肉")
        assert it.names() == ["defer", "followup"] and "红烧肉（妈妈的做法）" in it.events[1][1]["content"]
        ollama.reply("先炒蛋[1]。")
        await command("ask")(FakeInteraction(OWNER), question="番茄炒蛋怎么做？")
        it = FakeInteraction(OWNER)
        await command("why")(it)
        assert "候选 candidates" in it.events[0][1]["content"] and it.events[0][1]["ephemeral"]
        it = FakeInteraction(OWNER)
        await command("reset")(it)
        assert "Fresh start" in it.events[0][1]["content"]
        it = FakeInteraction(OWNER)
        await command("status")(it)
        assert "last sync" in it.events[0][1]["content"]

    run(settings, scenario)


def test_commands_are_registered_for_the_tree():
    names = {"ask", "search", "reset", "status", "sync", "why", "web", "help", "about", "related", "reject", "confirm", "gaps",
             "digest", "forget"}
    settings = make_settings(__import__("pathlib").Path("/tmp"))
    host = SimpleNamespace(settings=settings, parts=None)
    bot = build(host)
    assert {c.name for c in bot.tree.get_commands()} == names
    ask = bot.tree.get_command("ask")
    assert [p.name for p in ask.parameters] == ["question", "private", "file"]  # file: a voice clip or an image


def test_embeds_stay_within_discord_limits():
    body = "\n\n".join("段落" * 900 for _ in range(6))
    sources = "\n".join(f"[{i}] 标题 <http://leanote/note/{i:024x}>" for i in range(6))
    embeds = embeds_for(body, sources)
    assert len(embeds) >= 3
    assert all(isinstance(e, discord.Embed) and len(e.description) <= 4096 and len(e) <= 6000 for e in embeds)
    assert "[5] 标题" in embeds[-1].description


def test_the_line_about_file_links_is_in_the_questions_language():
    """A Markdown folder's sources in Discord: the line saying why a path is no link speaks the
    question's language only (it was both at once)."""
    from bot.render import discord_sources
    from rag.answer.types import Citation

    c = Citation(1, "n1", "番茄炒蛋", "菜谱", "", "file:///srv/notes/%E8%8F%9C%E8%B0%B1/a.md", "", 1.0)
    english = discord_sources([c], "Sources", "How do I cook tomato and egg?")
    chinese = discord_sources([c], "来源", "番茄炒蛋怎么做？")
    assert DISCORD_FILES[1] in english and DISCORD_FILES[0] not in english and "/srv/notes/菜谱/a.md" in english
    assert DISCORD_FILES[0] in chinese and DISCORD_FILES[1] not in chinese


def test_search_over_a_folder_shows_each_note_by_its_path_with_a_snippet_and_help_speaks_of_the_folder(world):
    """A folder's notes in /search: the path in the folder as it reads (not a percent-encoded
    file:// address) and the lines that match; /help speaks of the folder and where a /note goes."""
    settings, ollama = world

    async def scenario(daemon, bot, command):
        it = FakeInteraction(OWNER)
        await command("search")(it, query="糖压酸味")
        shown = it.events[-1][1]["content"]
        first = shown.splitlines()[:2]
        assert first[0].startswith("1. 番茄炒蛋") and first[0].endswith("生活/菜谱/番茄炒蛋.md"), shown
        assert "糖" in first[1] and "file://" not in shown and "%E" not in shown, shown
        it = FakeInteraction(OWNER)
        await command("help")(it)
        text = it.events[0][1]["content"]
        assert "folder of notes" in text and "Leanote" not in text and "Markdown file in the folder's Inbox/" in text

    run(settings, scenario)
