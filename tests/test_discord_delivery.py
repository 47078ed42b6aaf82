"""An answer Discord will not take after it streamed: the fake Discord (tests/fakes/discord.py)
refuses the final edit of the response the answer streamed into (or a follow-up of a long one),
as Discord does with a 400 or a 5xx past discord.py's retries. Whatever it refused, the channel
is left with a line saying the answer could not be delivered, never the half-streamed text and
its cursor, and no answer is kept for buttons nobody will see."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from discord import app_commands

from bot.chat.texts import SORRY, UNDELIVERED
from bot.discord import build

from conftest import long_reply, make_settings, until
from test_discord import OWNER, FakeInteraction
import test_discord_gateway
from test_discord_gateway import ONE, run, slash

world = test_discord_gateway.world  # the fixture: the daemon, the fake Discord and the fake Ollama

QUESTION = "番茄炒蛋怎么做才不酸？"


def shown(it) -> list[str]:
    """What the interaction's messages show now."""
    return [m.text() for m in it.messages() if not m.deleted]


async def streamed_then_refused(fake, ollama, **options):
    """``/ask`` in public; the answer is let go on once its first sentence shows, with the cursor."""
    # a sentence shows once the next one begins
    go_on = ollama.reply("先把鸡蛋炒好盛出[1]。", "再下番茄", "中火炒出汁，加一小勺糖[1]。", paused_after=2)
    it = slash(fake, ONE, "ask", {"question": QUESTION, "private": False, **options})
    await until(lambda: it.original is not None and "先把鸡蛋" in it.original.text() and "▌" in it.original.text(),
                what="the answer streaming, with its cursor")
    go_on.set()
    return it


@pytest.mark.parametrize("refused", [1, 2], ids=["the-answer", "the-answer-and-the-line"])
def test_an_answer_discord_refuses_leaves_no_half_streamed_text_and_no_record(world, refused):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        # the answer's edit refused (its embeds: not the streamed text); with 2, the line after it too
        fake.refuse("edit", times=refused, when=lambda body: bool(body.get("embeds")) or body.get("content") == UNDELIVERED)
        it = await streamed_then_refused(fake, ollama)
        if refused == 1:  # the response the answer streamed into says it could not be delivered
            await until(lambda: it.original.text() == UNDELIVERED, what="the line replacing the half answer")
            assert it.original.public and not it.original.embeds and not it.buttons()
        else:  # Discord took neither: the response goes, and the asker alone is told
            await until(lambda: it.original.deleted and it.followups, what="the response deleted, a line sent")
            assert [(m.text(), m.ephemeral) for m in it.followups] == [(UNDELIVERED, True)]
        assert not any("▌" in text or "先把鸡蛋" in text for text in shown(it)), shown(it)
        assert SORRY not in "\n".join(shown(it))  # one line, not two
        assert daemon.parts.feedback.export() == []  # no answer kept for buttons that never showed

        ollama.reply("先炒蛋[1]。")  # the next question is answered as ever, and kept for its buttons
        again = slash(fake, ONE, "ask", {"question": QUESTION})
        await until(lambda: again.buttons(), what="the next answer with its buttons")
        assert [r["question"] for r in daemon.parts.feedback.export()] == [QUESTION]

    run(world.settings(), fake, scenario)


def test_a_long_answer_whose_follow_up_is_refused_leaves_none_of_its_parts(world):
    fake, ollama = world.fake, world.ollama

    async def scenario(daemon):
        ollama.reply(long_reply(20))
        fake.refuse("followup", when=lambda body: any((e.get("footer") or {}).get("text", "").startswith("3/")
                                                      for e in body.get("embeds") or []))
        it = slash(fake, ONE, "ask", {"question": "番茄炒蛋怎么做？", "private": False})
        await until(lambda: it.original is not None and it.original.text() == UNDELIVERED,
                    timeout=20, what="the line in place of the answer")
        assert it.followups and all(m.deleted for m in it.followups)  # the part that went out went again
        assert shown(it) == [UNDELIVERED] and not it.buttons()
        assert daemon.parts.feedback.export() == []

    run(world.settings(), fake, scenario)


def test_any_commands_error_reaches_the_one_handler_on_a_host_that_cannot_capture():
    """The command tree's error handler is there without the capture commands too."""
    bot = build(SimpleNamespace(settings=make_settings(Path("/tmp")), parts=None))
    assert "note" not in {c.name for c in bot.tree.get_commands()}
    it = FakeInteraction(OWNER)
    asyncio.run(bot.tree.on_error(it, app_commands.AppCommandError("internal detail")))
    assert [(name, kw["content"], kw["ephemeral"]) for name, kw, _ in it.events] == [("send_message", SORRY, True)]
