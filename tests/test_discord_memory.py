"""The memory of the notes in Discord: /about, /related, the 👍 confirm / 👎 reject buttons
(``MemoryButton``, understood by custom id after a restart) and /reject, /confirm. The real
daemon and discord.py client talk to the fake Discord; the memory is real, built by one sync
pass over two Leanote users' notes in the fake Leanote (tests/memory_world.py). Every reply
is ephemeral, like /search, and reads the person's own Leanote user."""

from __future__ import annotations


import pytest
import yarl
from discord.gateway import DiscordWebSocket

from bot.chat.texts import MEMORY_OFF
from bot.plain import discord_text
from rag.memory.store import MemoryStore

from conftest import until
from fakes.discord import FakeDiscord
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from memory_world import A_ATLAS, A_BACKUP, A_POOL, ALICE, B_ATLAS, BOB, BOB_WORDS, PASSWORDS, build, facts_of, verdicts
from test_discord_capture import GUILD, run

TOKEN = "MTAx.fake.discord-token"
ONE, FRIEND, BOBBY = 410000000000000001, 410000000000000002, 410000000000000003  # ONE, FRIEND: Alice; BOBBY: Bob
CHANNEL = 420000000000004201


@pytest.fixture(scope="module")
def memory(tmp_path_factory, use_embedder):
    with pytest.MonkeyPatch.context() as mp, FakeLeanote() as leanote, FakeOllama() as ollama:
        for name, value in {**PASSWORDS, "LR_DISCORD_TOKEN": TOKEN}.items():
            mp.setenv(name, value)
        yield build(tmp_path_factory.mktemp("dc-memory"), leanote, use_embedder, ollama={"host": ollama.url})


@pytest.fixture
def fake(monkeypatch):
    with FakeDiscord(token=TOKEN, guilds={GUILD: {"channels": [CHANNEL], "roles": []}}) as fake:
        monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(fake.gateway_url))
        yield fake


def settings_for(world, fake, **sections):
    return world.settings(
        discord={"enabled": True, "token_env": "LR_DISCORD_TOKEN", "api_base": fake.api_base, "guild_ids": [GUILD],
                 "public_answers": True},
        users=[{"leanote_user_id": ALICE, "discord_ids": [ONE], "admin": True},
               {"leanote_user_id": ALICE, "discord_ids": [FRIEND]},
               {"leanote_user_id": BOB, "discord_ids": [BOBBY]}], **sections)


async def command(fake, user, name, options=None):
    it = fake.slash(user, name, options, guild_id=GUILD, channel_id=CHANNEL)
    await until(lambda: it.answered() and not it.thinking(), what=f"/{name}")
    return it, "\n".join(m.text() for m in it.messages())


async def press(fake, user, message, custom_id):
    it = fake.press(user, message, custom_id)
    await until(lambda: it.answered() and not it.thinking(), what=f"the press on {custom_id}")
    return it.texts()[-1]


def test_about_and_related_show_the_askers_own_memory_privately_with_buttons(memory, fake):
    mine = facts_of(memory.settings(), ALICE)
    url = memory.leanote.url

    async def scenario(daemon):
        assert {"about", "related", "reject", "confirm"} <= set(fake.commands_for(GUILD))
        it, text = await command(fake, ONE, "about", {"name": "Atlas"})
        assert it.ephemeral  # as /search: only the asker sees it (public_answers is for /ask)
        assert "Atlas —uses database→ PostgreSQL" in text and "Atlas —uses pooler→ pgbouncer" in text
        assert "“连接池用 pgbouncer”" in text and f"<{url}/note/{A_ATLAS}>" in text
        assert "PostgreSQL 连接池配置" in text and f"<{url}/note/{A_POOL}>" in text
        assert not [w for w in BOB_WORDS if w in text]
        ids = {b["custom_id"] for b in it.buttons()}
        assert ids == {f"mem:{v}:{f['fact_id']}" for f in mine.values() for v in ("confirmed", "rejected")}
        assert {(b.get("label"), b["emoji"]["name"]) for b in it.buttons()} >= {("1 confirm", "👍"), ("1 reject", "👎")}

        it, text = await command(fake, BOBBY, "about", {"name": "Atlas"})
        assert "机房 B3" in text and "pgbouncer" not in text and A_ATLAS not in text

        it, text = await command(fake, ONE, "related", {"target": A_ATLAS})
        assert "PostgreSQL 备份" in text and f"<{url}/note/{A_BACKUP}>" in text and "shared:" in text
        assert not [w for w in BOB_WORDS if w in text] and it.ephemeral
        assert [b for b in it.buttons() if b["custom_id"].startswith("mem:rejected:p")]
        it, text = await command(fake, ONE, "related", {"target": "PostgreSQL 每天怎么备份"})
        assert "PostgreSQL 备份" in text and not [w for w in BOB_WORDS if w in text]
        it, text = await command(fake, BOBBY, "related", {"target": B_ATLAS})
        assert "Bob 的 PostgreSQL 调优" in text and "Atlas 数据库迁移" not in text
        # nothing of Alice's memory ever reached Bob, nor the channel
        assert "pgbouncer" not in fake.seen_by(BOBBY) and "连接池用" not in fake.public_texts()
        assert fake.unknown == []

    run(settings_for(memory, fake), fake, scenario)


@pytest.mark.slow
def test_reject_by_button_survives_a_restart_and_another_users_id_changes_nothing(memory, fake):
    settings = settings_for(memory, fake)
    seen = {}

    async def scenario(daemon):
        pool = facts_of(settings, ALICE)["pgbouncer"]["fact_id"]
        it, text = await command(fake, ONE, "about", {"name": "Atlas"})
        seen["message"], seen["pool"] = it.last_message(), pool

        # Bob cannot see Alice's reply, so not its buttons; her id typed by him changes nothing
        before = verdicts(settings, ALICE)
        it, text = await command(fake, BOBBY, "reject", {"id": pool})
        assert "not in your memory" in text and "nothing was changed" in text and it.ephemeral
        assert "pgbouncer" in facts_of(settings, ALICE) and verdicts(settings, ALICE) == before

        # his own fact: confirmed
        b3 = facts_of(settings, BOB)["机房 B3"]["fact_id"]
        it, text = await command(fake, BOBBY, "confirm", {"id": b3})
        assert "Confirmed: Atlas —hosted in→ 机房 B3" in text and facts_of(settings, BOB)["机房 B3"]["confirmed"]
        it, text = await command(fake, ONE, "reject", {"id": "nonsense"})
        assert "usage" in text

    run(settings, fake, scenario)

    async def after_restart(daemon):
        # a new process, the same message: 👎 is understood by its custom id
        text = await press(fake, ONE, seen["message"], f"mem:rejected:{seen['pool']}")
        assert "Rejected: Atlas —uses pooler→ pgbouncer" in text
        assert "pgbouncer" not in facts_of(settings, ALICE)
        with MemoryStore.open_for(settings) as store:
            h = store.correction_history(ALICE, seen["pool"])
        assert h["verdict"] == "rejected" and h["log"][-1]["by"] == f"discord:{ONE}"
        it, text = await command(fake, ONE, "about", {"name": "Atlas"})
        assert "uses pooler" not in text and "uses database" in text
        text = await press(fake, ONE, seen["message"], f"mem:rejected:{seen['pool']}")
        assert "Already rejected" in text
        assert set(facts_of(settings, BOB)) == {"PostgreSQL", "机房 B3"}  # Bob's untouched

    run(settings, fake, after_restart)


def test_memory_off_says_so(memory, fake):
    async def scenario(daemon):
        for name, options in (("about", {"name": "Atlas"}), ("related", {"target": A_ATLAS}),
                              ("reject", {"id": "f0123456789ab"})):
            it, text = await command(fake, ONE, name, options)
            assert text == discord_text(MEMORY_OFF) and it.ephemeral  # as the door's rule shows it

    run(settings_for(memory, fake, memory={"enabled": False}), fake, scenario)
