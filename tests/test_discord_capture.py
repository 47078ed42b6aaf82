"""Writing into Leanote from Discord, end to end: the real discord.py client inside the
real daemon, logged in to the fake Discord (REST + gateway, tests/fakes/discord.py),
writing through the real capture outbox into the fake Leanote's write API, answering
from the sample notes with a fake Ollama.

/note (with #tags, with a file, a file too large), the message menu "Save to Leanote"
(the message's author, channel and link kept), /append, /remember, /outbox while
Leanote is down; the buttons under an answer (👍 by the asker, a press by someone
else, "Why?", "Save as note", a press after a restart); strangers and capture turned
off.
"""

from __future__ import annotations

import asyncio

import pytest
import yarl
from discord.gateway import DiscordWebSocket

from bot.discord import SAVE_MENU, service
from bot.serve import Daemon

from conftest import SCENARIO, long_reply, make_settings, until, within
from fakes.discord import FakeDiscord
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama

TOKEN = "MTAx.fake.discord-token"
ONE, TWO, STRANGER, ALICE = 410000000000000001, 410000000000000002, 410000000000000999, 410000000000000555
GUILD, CHANNEL, OTHER_CHANNEL, ROLE = 420000000000000042, 420000000000004201, 420000000000004299, 430000000000000077
LEANOTE_USER, EMAIL, PASSWORD = "local", "me@example.com", "leanote-secret"  # the sample notes' user
MAX_FILE_MB = 0.05  # 51,200 bytes


class World:
    def __init__(self, tmp_path, fake, ollama, leanote):
        self.tmp_path, self.fake, self.ollama, self.leanote = tmp_path, fake, ollama, leanote

    def settings(self, capture=None, **discord_config):
        return make_settings(
            self.tmp_path,
            discord={"enabled": True, "token_env": "LR_DISCORD_TOKEN", "api_base": self.fake.api_base,
                     "guild_ids": [GUILD], "channel_ids": [CHANNEL], "role_ids": [ROLE], "edit_interval": 0.3,
                     **discord_config},
            users=[{"leanote_user_id": LEANOTE_USER, "discord_ids": [ONE], "admin": True},
                   {"leanote_user_id": LEANOTE_USER, "discord_ids": [TWO]}],
            ollama={"host": self.ollama.url}, rerank={"kind": "none"},
            sync={"interval": "1h", "trigger_debounce": "0.1s"}, bots={"rate_limit": 10},
            leanote={"base_url": self.leanote.url},
            capture={"accounts": [{"email": EMAIL, "password_env": "LR_LEANOTE_PASSWORD"}], "retry_min": "0.3s",
                     "retry_max": "1s", "max_file_mb": MAX_FILE_MB, **(capture or {})},
        )


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_DISCORD_TOKEN", TOKEN)
    monkeypatch.setenv("LR_LEANOTE_PASSWORD", PASSWORD)
    with FakeDiscord(token=TOKEN, guilds={GUILD: {"channels": [CHANNEL, OTHER_CHANNEL], "roles": [ROLE]}}) as fake, \
            FakeOllama() as ollama, FakeLeanote() as leanote:
        leanote.add_user(LEANOTE_USER, EMAIL, PASSWORD)
        # the plain discord.py Client connects to its built-in gateway: point it at the fake
        monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(fake.gateway_url))
        yield World(tmp_path, fake, ollama, leanote)


def run(settings, fake, scenario):
    async def main():
        before = fake.session  # a restart: wait for the new process's session
        daemon = Daemon(settings, services=[service])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(lambda: fake.ready and fake.session is not before and fake.commands_for(GUILD),
                        what="the bot to connect and sync")
            await within(scenario(daemon), "the scenario", SCENARIO)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())


# --- driving it -----------------------------------------------------------------------------------


async def reply(it, what="the reply", timeout=15.0) -> str:
    """The interaction's final text, once it is neither unanswered nor "thinking…"."""
    await until(lambda: it.answered() and not it.thinking(), timeout, what=what)
    return it.texts()[-1]


async def command(fake, user, name, options=None, channel=CHANNEL, roles=(ROLE,)):
    it = fake.slash(user, name, options, guild_id=GUILD, channel_id=channel, roles=list(roles))
    return it, await reply(it, f"/{name}")


async def save_menu(fake, user, message, channel=CHANNEL, roles=(ROLE,), timeout=15.0):
    it = fake.message_command(user, SAVE_MENU, message, guild_id=GUILD, channel_id=channel, roles=list(roles))
    return it, await reply(it, SAVE_MENU, timeout)


async def ask(fake, user, question, **options):
    it = fake.slash(user, "ask", {"question": question, **options}, guild_id=GUILD, channel_id=CHANNEL,
                    roles=[ROLE])
    await until(lambda: finished(it), what=f"the answer to {question!r} with its buttons")
    return it


async def press(fake, user, message, custom_id, roles=(ROLE,)):
    it = fake.press(user, message, custom_id, roles=list(roles))
    return it, await reply(it, f"the press on {custom_id}")


def finished(it) -> bool:
    embeds = it.final_embeds()
    return bool(embeds) and it.buttons() != [] and not it.thinking()


def inbox(leanote, title="Inbox") -> list[dict]:
    """The notes in the inbox notebook, oldest first."""
    with leanote.lock:
        books = {b["NotebookId"] for b in leanote.notebooks.values() if b["Title"] == title and not b["IsDeleted"]}
        return sorted((dict(n) for n in leanote.notes.values() if n["NotebookId"] in books and not n["IsDeleted"]),
                      key=lambda n: n["Usn"])


def note_by_title(leanote, title: str) -> dict | None:
    return next((n for n in inbox(leanote) if n["Title"] == title), None)


def link(leanote, note: dict) -> str:
    return f"{leanote.url}/note/{note['NoteId']}"


# --- /note, files, /append, /remember -------------------------------------------------------------------


def test_note_append_remember_and_files_land_in_leanote_with_private_receipts(world):
    fake, leanote = world.fake, world.leanote

    async def scenario(daemon):
        assert {"note", "append", "remember", "outbox", SAVE_MENU} <= set(fake.commands_for(GUILD))
        note = fake.commands_for(GUILD)["note"]
        assert [(o["name"], o["type"], o.get("required", False)) for o in note["options"]] == [
            ("text", 3, True), ("file", 11, False)]

        it, text = await command(fake, ONE, "note", {"text": "周末买牛奶和鸡蛋 #购物 #家务\n记得带购物袋"})
        [written] = inbox(leanote)
        assert written["Title"].startswith("周末买牛奶和鸡蛋")
        assert {"购物", "家务", "captured"} <= set(written["Tags"] or [])
        assert "记得带购物袋" in written["Content"]
        assert link(leanote, written) in text
        assert it.ephemeral and text not in fake.seen_by(TWO)  # only the person who wrote it sees the receipt
        assert it.callback["type"] == 5  # deferred at once: writing may take seconds

        # a file, downloaded from Discord's CDN and attached to the note
        photo = fake.upload("receipt.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 2000, "image/png", channel_id=CHANNEL)
        it, text = await command(fake, ONE, "note", {"text": "超市小票 #账单", "file": photo})
        assert fake.downloads == ["receipt.png"]
        with_file = note_by_title(leanote, "超市小票 #账单") or inbox(leanote)[-1]
        assert "receipt.png" in with_file["Content"] and link(leanote, with_file) in text
        assert with_file["Files"], "the photo went to Leanote with the note"

        # too large: refused before it is downloaded, nothing written
        writes = len(inbox(leanote))
        big = fake.upload("scan.pdf", b"%PDF" + b"x" * 60_000, "application/pdf", channel_id=CHANNEL)
        it, text = await command(fake, ONE, "note", {"text": "扫描件", "file": big})
        assert "scan.pdf" in text and "MB" in text and it.ephemeral and it.kinds() == ["callback"]
        assert fake.downloads == ["receipt.png"] and len(inbox(leanote)) == writes

        # /append goes to the end of the last note captured (the one with the file)
        it, text = await command(fake, ONE, "append", {"text": "总共 85 元"})
        after = leanote.notes[with_file["NoteId"]]
        assert after["Content"].index("超市小票") < after["Content"].index("总共 85 元")
        assert with_file["NoteId"] in text and it.ephemeral

        # /remember: a dated line in the person's memory note
        it, text = await command(fake, ONE, "remember", {"text": "车停在 B2 层 17 号"})
        memory = [n for n in leanote.notes.values() if "车停在 B2 层 17 号" in n["Content"]]
        assert len(memory) == 1 and memory[0]["NoteId"] in text
        assert memory[0]["NoteId"] != with_file["NoteId"]

        it, text = await command(fake, ONE, "outbox")
        assert "Nothing waiting" in text and it.ephemeral
        assert fake.unknown == []

    run(world.settings(), fake, scenario)


# --- the message menu: Discord's forward -------------------------------------------------------------------


def test_save_to_leanote_keeps_the_messages_author_channel_link_and_files(world):
    fake, leanote = world.fake, world.leanote

    async def scenario(daemon):
        menu = fake.commands_for(GUILD)[SAVE_MENU]
        assert menu["type"] == 3 and not menu.get("description")
        doc = fake.upload("menu.txt", "红烧肉：五花肉、冰糖、生抽".encode(), "text/plain; charset=utf-8",
                          channel_id=CHANNEL)
        message = fake.user_message(ALICE, "周五聚餐菜单定了 #聚餐\n红烧肉、番茄炒蛋", channel_id=CHANNEL,
                                    author_name="alice", attachments=[doc])
        it, text = await save_menu(fake, ONE, message)
        [note] = inbox(leanote)
        content = note["Content"]
        assert note["Title"].startswith("周五聚餐菜单定了")
        assert "聚餐" in (note["Tags"] or [])
        assert "Alice" in content  # the author's display name
        assert f"channel-{CHANNEL}" in content and f"guild-{GUILD}" in content
        assert f"https://discord.com/channels/{GUILD}/{CHANNEL}/{message['id']}" in content
        assert "menu.txt" in content and note["Files"] and fake.downloads == ["menu.txt"]
        assert link(leanote, note) in text and it.ephemeral
        assert text not in fake.seen_by(ALICE)

        # a file too large in a saved message: nothing downloaded, nothing written
        big = fake.upload("video.mp4", b"\x00" * 60_000, "video/mp4", channel_id=CHANNEL)
        message = fake.user_message(ALICE, "看这个视频", channel_id=CHANNEL, attachments=[big])
        it, text = await save_menu(fake, ONE, message)
        assert "video.mp4" in text and it.ephemeral
        assert fake.downloads == ["menu.txt"] and len(inbox(leanote)) == 1

    run(world.settings(), fake, scenario)


# --- Leanote down: the outbox -------------------------------------------------------------------------------------


def test_a_capture_while_leanote_is_down_waits_in_the_outbox_and_is_written_after(world):
    fake, leanote = world.fake, world.leanote

    async def scenario(daemon):
        leanote.down()
        it, text = await command(fake, ONE, "note", {"text": "停电期间的想法 #灵感"})
        assert "queued" in text and it.ephemeral
        assert inbox(leanote) == []
        it, text = await command(fake, ONE, "outbox")
        assert "停电期间的想法" in text and "waiting" in text and it.ephemeral
        it, other = await command(fake, TWO, "outbox")  # each person's outbox is their own
        assert "停电期间的想法" not in other and "Nothing waiting" in other

        # "Save as note" while Leanote is down: queued too, and a second press does not queue it again
        world.ollama.reply("先炒蛋再下番茄[1]。")
        asked = await ask(fake, ONE, "番茄炒蛋怎么做？")
        save = next(b["custom_id"] for b in asked.buttons() if b["custom_id"].startswith("fb:save:"))
        it, text = await press(fake, ONE, asked.last_message(), save)
        assert "queued" in text
        it, text = await press(fake, ONE, asked.last_message(), save)
        assert "Queued already" in text and len(daemon.capture.pending(f"discord:{ONE}")) == 2

        leanote.up()
        await until(lambda: len(inbox(leanote)) == 2, timeout=20, what="the queued captures to reach Leanote")
        note, saved = inbox(leanote)  # in the order they were made
        assert note["Title"].startswith("停电期间的想法") and "灵感" in (note["Tags"] or [])
        assert "先炒蛋再下番茄[1]。" in saved["Content"]
        await until(lambda: not daemon.capture.pending(f"discord:{ONE}"), what="the outbox to empty")
        it, text = await command(fake, ONE, "outbox")
        assert "Nothing waiting" in text
        it, text = await press(fake, ONE, asked.last_message(), save)
        assert "Already saved" in text and len(inbox(leanote)) == 2

    run(world.settings(), fake, scenario)


# --- the buttons under an answer ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_buttons_under_an_answer_are_the_askers_alone(world):
    fake, ollama, leanote = world.fake, world.ollama, world.leanote
    seen = {}

    async def scenario(daemon):
        ollama.reply("先把鸡蛋炒好盛出，再下番茄，加一小勺糖[1]。")
        asked = await ask(fake, ONE, "番茄炒蛋怎么做才不酸？", private=False)  # public: others see the buttons
        message = asked.last_message()
        ids = [b["custom_id"] for b in message.buttons()]
        answer_id = ids[0].split(":")[2]
        assert ids == [f"fb:{a}:{answer_id}" for a in ("up", "down", "why", "save")]
        assert [b.get("emoji", {}).get("name") for b in message.buttons()[:2]] == ["👍", "👎"]
        record = daemon.feedback.get(answer_id)
        assert record.person == f"discord:{ONE}" and record.question == "番茄炒蛋怎么做才不酸？"

        # someone else presses: told so, privately; nothing recorded, nothing saved
        for action in ("up", "why", "save"):
            it, text = await press(fake, TWO, message, f"fb:{action}:{answer_id}")
            assert "someone else's answer" in text and it.ephemeral
            assert "候选" not in text
        assert daemon.feedback.get(answer_id).verdict is None and inbox(leanote) == []

        it, text = await press(fake, ONE, message, f"fb:up:{answer_id}")
        assert it.ephemeral and "Thanks" in text
        assert daemon.feedback.get(answer_id).verdict == "up"

        # Why? shows that answer's trace, even after another question
        await command(fake, ONE, "reset")  # a fresh conversation: no follow-up rewriting to script
        ollama.reply("五花肉先焯水[1]。")
        later = await ask(fake, ONE, "红烧肉怎么做？")
        assert "五花肉先焯水" in later.texts()[-1]
        it, text = await press(fake, ONE, message, f"fb:why:{answer_id}")
        assert it.ephemeral and "番茄炒蛋怎么做才不酸？" in text and "候选 candidates" in text
        assert "红烧肉怎么做" not in text
        assert "番茄炒蛋" in text.split("candidates", 1)[1]

        # Save as note: the question, the answer and its sources as links
        it, text = await press(fake, ONE, message, f"fb:save:{answer_id}", roles=(ROLE,))
        [saved] = inbox(leanote)
        assert "番茄炒蛋怎么做才不酸" in saved["Title"]
        assert "先把鸡蛋炒好盛出，再下番茄，加一小勺糖[1]。" in saved["Content"]
        cited = daemon.feedback.get(answer_id).cited
        assert cited and all(f"]({c['url']})" in saved["Content"] for c in cited)
        assert link(leanote, saved) in text and it.ephemeral
        assert daemon.feedback.get(answer_id).saved_note_id == saved["NoteId"]
        it, text = await press(fake, ONE, message, f"fb:save:{answer_id}")
        assert "Already saved" in text and link(leanote, saved) in text and len(inbox(leanote)) == 1

        # a private answer's buttons: under the asker's own message; a long answer's under its last part
        private = later.last_message()
        assert private.ephemeral and private.buttons()
        ollama.reply(long_reply(12))
        long = await ask(fake, TWO, "番茄炒蛋怎么做？")
        assert long.followups and long.last_message() is long.followups[-1]
        assert [m for m in long.messages() if m.buttons()] == [long.followups[-1]]
        assert fake.unknown == []
        seen["message"], seen["id"] = message, answer_id

    settings = world.settings()
    run(settings, fake, scenario)

    async def after_restart(daemon):
        # a new process, the same buttons: the press is understood by its custom id
        it, text = await press(fake, ONE, seen["message"], f"fb:down:{seen['id']}")
        assert "Thanks" in text and daemon.feedback.get(seen["id"]).verdict == "down"

    run(settings, fake, after_restart)


# --- who may write ---------------------------------------------------------------------------------------------


def test_strangers_and_people_outside_the_rules_cannot_capture(world):
    fake, leanote = world.fake, world.leanote

    async def scenario(daemon):
        message = fake.user_message(ALICE, "秘密 #机密", channel_id=CHANNEL)
        cases = [
            (STRANGER, CHANNEL, (ROLE,), str(STRANGER)),
            (ONE, CHANNEL, (), "roles allowed"),
            (ONE, OTHER_CHANNEL, (ROLE,), "channel"),
        ]
        for user, channel, roles, expected in cases:
            for name, options in (("note", {"text": "陌生人的笔记"}), ("remember", {"text": "陌生人"}),
                                  ("outbox", None)):
                it, text = await command(fake, user, name, options, channel=channel, roles=roles)
                if user == STRANGER and expected not in text:  # one refusal with the id, then a short one
                    assert "Not allowed" in text
                else:
                    assert expected in text, (name, user, text)
                assert it.ephemeral and it.kinds() == ["callback"]
            photo = fake.upload("x.png", b"\x89PNG" + b"\x00" * 100, "image/png", channel_id=channel)
            it, text = await command(fake, user, "note", {"text": "带文件", "file": photo}, channel=channel,
                                     roles=roles)
            assert it.ephemeral and it.kinds() == ["callback"]
            it, text = await save_menu(fake, user, message, channel=channel, roles=roles)
            assert it.ephemeral and it.kinds() == ["callback"]
        assert inbox(leanote) == [] and leanote.notes == {} and fake.downloads == []

    run(world.settings(), fake, scenario)


def test_with_capture_turned_off_no_capture_is_offered_and_help_says_why(world):
    fake, leanote = world.fake, world.leanote

    async def scenario(daemon):
        registered = set(fake.commands_for(GUILD))
        assert "ask" in registered and not registered & {"note", "append", "remember", "outbox", SAVE_MENU}
        it, text = await command(fake, ONE, "help", {})
        assert "turned off" in text and "/note" not in text and it.ephemeral
        assert leanote.notes == {} and fake.downloads == []

    run(world.settings(capture={"enabled": False}), fake, scenario)


def test_save_to_leanote_shows_someone_elses_message_as_written_and_keeps_your_own_markdown(world):
    from test_capture_once import links

    fake, leanote = world.fake, world.leanote

    async def scenario(daemon):
        sent = "看 [点我](javascript:alert(1)) **重要** #资料"
        await save_menu(fake, ONE, fake.user_message(ALICE, sent, channel_id=CHANNEL, author_name="a](x:y) [b"))
        [note] = inbox(leanote)
        hrefs, text = links(note["Content"])
        assert not [h for h in hrefs if not h.startswith("https://discord.com/")]  # not a link of Alice's
        assert sent in text and "a](x:y) [b" in text.lower() and "资料" in note["Tags"]  # (the fake title-cases names)
        mine = "我的 [链接](https://example.com/x)"
        await save_menu(fake, ONE, fake.user_message(ONE, mine, channel_id=CHANNEL))
        hrefs, _ = links(inbox(leanote)[-1]["Content"])
        assert hrefs == ["https://example.com/x"]  # their own message: their Markdown

    run(world.settings(), fake, scenario)


# --- the same message saved twice --------------------------------------------------------------------------------


def test_save_to_leanote_pressed_twice_on_a_message_makes_one_note_and_both_replies_link_it(world):
    """A double click on the menu (or a second look later): the message is saved once; the
    second press says it was saved already, with the same link. Another message is a new note."""
    fake, leanote = world.fake, world.leanote

    async def scenario(daemon):
        message = fake.user_message(ALICE, "周六早上九点爬山，带水 #周末", channel_id=CHANNEL, author_name="alice")
        first = fake.message_command(ONE, SAVE_MENU, message, guild_id=GUILD, channel_id=CHANNEL, roles=[ROLE])
        second = fake.message_command(ONE, SAVE_MENU, message, guild_id=GUILD, channel_id=CHANNEL, roles=[ROLE])
        texts = [await reply(first), await reply(second)]
        [note] = inbox(leanote)
        assert all(link(leanote, note) in text for text in texts), texts
        assert sum("Already saved" in text for text in texts) == 1
        it, text = await save_menu(fake, ONE, message)  # later again: the same note
        assert "Already saved" in text and link(leanote, note) in text and len(inbox(leanote)) == 1
        other = fake.user_message(ALICE, "周日休息", channel_id=CHANNEL, author_name="alice")
        it, text = await save_menu(fake, ONE, other)
        assert "Already saved" not in text and len(inbox(leanote)) == 2

    run(world.settings(), fake, scenario)
