"""The chat session every door talks to (``bot.session``), through real parts: the sample notes
indexed (Qdrant Edge, the USE model), real SQLite stores, the capture writer writing into the
notes folder; answers without an LLM (the passages). No door: what a door would show is read from
the session's plain data. A refusal is a value with a reason code, never an exception."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from bot.root import Parts
from bot.session import AnswerView, Reply, Session
from bot.chat.words import PRESSED, REFUSALS

from conftest import EXAMPLES, make_settings

pytestmark = pytest.mark.slow  # the sample notes indexed with the USE model

ME, FRIEND, STRANGER, CHAT = 1, 2, 999, 100
UNANSWERED = "How do I configure nginx rate limiting?"
REMINDER = "提醒我明天下午三点给牙医打电话"


@pytest.fixture
def world(tmp_path, monkeypatch):
    notes = tmp_path / "notes"
    shutil.copytree(EXAMPLES, notes)
    settings = make_settings(
        tmp_path, source={"kind": "files", "path": str(notes)}, ollama={"enabled": False}, rerank={"kind": "none"},
        users=[{"leanote_user_id": "local", "telegram_ids": [ME, FRIEND], "discord_ids": [ME]}],
        api={"tokens": [{"token_env": "LR_WEB_TOKEN", "name": "alice", "users": ["local"]},
                        {"token_env": "LR_TWO_TOKEN", "name": "both", "users": ["local", "other"]}]},
        bots={"rate_limit": 3}, limits={"question_chars": 40}, capture={"sync_after": "1h"},
    )
    return settings, notes


def run(settings, scenario):
    async def main():
        with Parts(settings, create=True, scheduled=True) as parts:
            await asyncio.to_thread(parts.sync.run_pass, False, True)
            stopping = asyncio.Event()
            writer = asyncio.create_task(parts.capture().run(stopping))
            try:
                await scenario(parts)
            finally:
                stopping.set()
                await writer

    asyncio.run(main())


def test_the_person_is_found_by_their_id_on_any_door(world):
    settings, _ = world

    async def scenario(parts):
        me = Session(parts, "telegram", ME, CHAT).who()
        assert (me.key, me.user_id, me.conversation) == ("telegram:1", "local", "telegram:100:1")
        assert Session(parts, "discord", ME, "dm").who().key == "discord:1"
        # a third door: a page signed in with an API token is its holder, in a conversation of its own
        page = Session(parts, "api", "alice", "web").who()
        assert (page.key, page.user_id, page.conversation) == ("api:alice", "local", "api:web:alice")
        several = Session(parts, "api", "both", "web").who()
        assert isinstance(several, Reply) and several.refused == "many_users"
        # a stranger: refused with their id, as a value; the same again soon after is quiet
        refused = Session(parts, "telegram", STRANGER, CHAT).who()
        assert isinstance(refused, Reply) and refused.refused == "stranger" and not refused.quiet
        assert "Your Telegram id is 999" in refused.text
        again = await Session(parts, "telegram", STRANGER, CHAT).ask("番茄炒蛋怎么做")
        assert again.refused == "stranger" and again.quiet
        assert Session(parts, "discord", STRANGER).presser().refused == "stranger"  # a press is always told
        assert Session(parts, "api", "nobody").who().refused == "stranger"
        # the capture idempotency keys: the door, the place, the message
        session = Session(parts, "telegram", ME, CHAT)
        assert session.once(42) == "telegram:100:42" and session.once(7, "interaction") == "telegram:interaction:7"

    run(settings, scenario)


def test_asking_applies_the_limits_and_gives_one_view_of_the_answer(world):
    settings, _ = world

    async def scenario(parts):
        me = Session(parts, "telegram", ME, CHAT)
        assert (await me.ask("   ")).refused == "empty"
        shown = []
        view = await me.ask("番茄炒蛋怎么做", ready=_mark(shown))
        assert isinstance(view, AnswerView) and shown == ["ready"]
        assert view.citations and view.sources == view.citations and view.sources[0].title == "番茄炒蛋"
        assert view.sources_title == "来源" and "番茄炒蛋" in view.text and view.notices == []
        data = [b.data for b in view.buttons[0]]
        assert data == [f"fb:up:{view.answer_id}", f"fb:down:{view.answer_id}", f"why:{view.answer_id}",
                        f"save:{view.answer_id}"]
        # nothing in the notes: the closest notes instead of citations, and nothing worth saving
        refused = await me.ask(UNANSWERED)
        assert not refused.citations and refused.sources == refused.asked.answer.closest
        assert [b.kind for b in refused.buttons[0]] == ["up", "down", "why"]
        # over the rate limit (3 a minute): a value saying how long to wait, and nothing asked
        assert isinstance(await me.ask("红烧肉怎么做"), AnswerView)  # the third this minute
        slow = await me.ask("红烧肉要炖多久")
        assert slow.refused == "slow_down" and "3 questions a minute" in slow.text
        assert (await me.search("红烧肉")).refused == "slow_down"
        # another person's minute is their own; an overlong question is cut, and they are told
        friend = Session(parts, "telegram", FRIEND, CHAT)
        cut = await friend.ask("番茄炒蛋怎么做才不酸？" + "请详细说明每一个步骤" * 10)
        assert any("40" in n for n in cut.notices) and len(cut.asked.answer.trace.question) <= 40
        found = await friend.search("番茄炒蛋")
        assert not found.refused and "番茄炒蛋" in found.text

    run(settings, scenario)


def _mark(log):
    async def ready():
        log.append("ready")
    return ready


def test_a_press_is_refused_as_a_value_and_never_changes_anothers_answer(world):
    settings, _ = world

    async def scenario(parts):
        view = await Session(parts, "telegram", ME, CHAT).ask("番茄炒蛋怎么做")
        up = f"fb:up:{view.answer_id}"
        theirs = await Session(parts, "telegram", FRIEND).press(up)
        assert theirs.refused == "not_yours" and theirs.how == "alert" and theirs.text == REFUSALS["not_yours"]
        assert parts.feedback.get(view.answer_id).verdict is None
        # the same words whatever the door (Discord's buttons carry fb:why:, fb:save:)
        assert (await Session(parts, "discord", ME).press(up)).text == REFUSALS["not_yours"]
        assert (await Session(parts, "telegram", ME).press("fb:up:nosuchanswer")).refused == "unknown_answer"
        assert (await Session(parts, "telegram", ME).press("gap:q:x")).refused == "unknown_button"
        rated = await Session(parts, "telegram", ME).press(up)
        assert (rated.refused, rated.how, rated.text) == ("", "brief", PRESSED["rated"])
        assert parts.feedback.get(view.answer_id).verdict == "up"
        why = await Session(parts, "telegram", ME).press(f"fb:why:{view.answer_id}")
        assert why.private and "番茄炒蛋" in why.text
        # a door's own refusal of the presser here comes after the answer is known to be theirs
        denied = await Session(parts, "discord", FRIEND).press(up, denied="not in this channel")
        assert denied.refused == "not_yours"

    run(settings, scenario)


def test_gaps_and_the_note_begun_for_one(world):
    settings, notes = world

    async def scenario(parts):
        me = Session(parts, "telegram", ME, ME)
        await me.ask(UNANSWERED)
        listed = await me.gaps()
        assert listed.private and "nginx" in listed.text and "your next message becomes it" in listed.text
        [[write, dismiss]] = listed.buttons
        assert write.kind == "w" and dismiss.kind == "x" and write.n == 1
        assert (await Session(parts, "telegram", FRIEND).press(dismiss.data)).refused == "unknown_gap"
        begun = await Session(parts, "telegram", ME).press(write.data)
        assert begun.private and "Your next message becomes the note" in begun.text
        assert [b.kind for b in begun.buttons[0]] == ["c"]
        # a question typed meanwhile is asked about, never saved
        asked = await me.message("What is the default rate?")
        assert asked.quote and [b.kind for b in asked.buttons[0]] == ["s", "a", "c"]
        written = await me.message("limit_req_zone $binary_remote_addr zone=one:10m rate=5r/s;", once=me.once(5))
        assert not written.refused and "nginx" in written.text.lower()
        assert (await me.message("番茄炒蛋怎么做")) is None  # no draft waits now: a question
        # Discord's drafts take the next /note
        dc = Session(parts, "discord", ME, "dm")
        await dc.ask(UNANSWERED)
        [[w, x]] = (await dc.gaps()).buttons
        assert "next /note" in (await Session(parts, "discord", ME).press(w.data)).text
        assert (await dc.command("note", "text")) == (None, False)
        done = await dc.note("nginx limit_req burst=10", once=dc.once(9, "interaction"))
        assert "nginx" in done.text.lower()
        assert "Dismissed" in (await Session(parts, "discord", ME).press(x.data)).text
        assert (await Session(parts, "discord", ME).press(x.data)).refused == "gap_done"

    run(settings, scenario)


def test_a_message_that_asks_nothing_is_offered_as_a_note(world):
    settings, _ = world

    async def scenario(parts):
        me = Session(parts, "telegram", ME, ME)
        offered = await me.message(REMINDER)
        assert "isn't a question" in offered.text and offered.buttons[0][0].kind == "nq"
        press = offered.buttons[0][0].data
        gone = await Session(parts, "telegram", FRIEND).press(press)
        assert gone.refused == "gone"
        saving = await Session(parts, "telegram", ME).press(press)
        assert saving.text == PRESSED["saving"] and saving.unbutton == "*" and saving.then is not None
        receipt = await saving.then()
        assert receipt.private and "牙医" in receipt.text
        assert (await Session(parts, "telegram", STRANGER).message(REMINDER)).refused == "stranger"

    run(settings, scenario)
