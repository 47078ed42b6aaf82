"""The memory of the notes in Telegram: /about, /related, the 👍 confirm / 👎 reject buttons
and /reject, /confirm. The real daemon and python-telegram-bot Application talk to the fake
Bot API; the memory is real, built by one sync pass over two Leanote users' notes in the
fake Leanote (tests/memory_world.py). Every reply and press reads the person's own user."""

from __future__ import annotations


import pytest

from bot.chat.texts import MEMORY_OFF
from bot.plain import telegram_text
from bot.usecases.memory import MemoryUnavailable, memory_of
from rag.memory.store import MemoryStore, path_for
from bot.root import Parts

from conftest import make_settings
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram
from memory_world import (A_ATLAS, A_BACKUP, A_POOL, ALICE, B_ATLAS, BOB, BOB_WORDS, PASSWORDS, build, facts_of,
                          verdicts)
from test_telegram import run as run_daemon, until

OWNER, FRIEND, BOBBY, GROUP = 111, 222, 333, -100500  # OWNER and FRIEND read Alice's notes, BOBBY Bob's


@pytest.fixture(scope="module")
def memory(tmp_path_factory, use_embedder):
    with pytest.MonkeyPatch.context() as mp, FakeLeanote() as leanote, FakeOllama() as ollama:
        for name, value in {**PASSWORDS, "LR_TG_TOKEN": "123:TEST"}.items():
            mp.setenv(name, value)
        world = build(tmp_path_factory.mktemp("tg-memory"), leanote, use_embedder, ollama={"host": ollama.url})
        yield world


def run(world, scenario, **sections):
    """The daemon with the Telegram bot, over the memory built once for the module."""
    with FakeTelegram() as tg:
        settings = world.settings(
            telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url},
            users=[{"leanote_user_id": ALICE, "telegram_ids": [OWNER], "admin": True},
                   {"leanote_user_id": ALICE, "telegram_ids": [FRIEND]},
                   {"leanote_user_id": BOB, "telegram_ids": [BOBBY]}], **sections)
        settings = settings.model_copy(update={"telegram": settings.telegram.model_copy(update={"allowed_chats": [GROUP]})})

        run_daemon(settings, tg, lambda daemon: scenario(tg, settings))


async def ask(tg, user, text, chat=None) -> tuple[int, dict]:
    """The bot's reply to ``text`` (its message id and message)."""
    chat = chat or user
    before = set(i for i, m in tg.messages.items() if m["chat_id"] == chat)
    tg.say(user, text, chat_id=chat, chat_type="private" if chat == user else "group")
    mid = await until(lambda: next((i for i, m in tg.messages.items() if m["chat_id"] == chat and i not in before),
                                   None))
    return mid, tg.messages[mid]


async def press(tg, user, chat, mid, data) -> dict:
    query = tg.press(user, chat, mid, data)
    [answer] = await until(lambda: tg.answered(query))
    return answer


def button(tg, mid, verdict, item_id) -> str:
    return next(data for _, data in tg.buttons(mid) if data == f"mem:{verdict}:{item_id}")


def test_about_lists_the_facts_with_quotes_and_links_and_the_notes_of_the_askers_user_only(memory):
    mine, theirs = facts_of(memory.settings(), ALICE), facts_of(memory.settings(), BOB)

    async def scenario(tg, settings):
        assert {"about", "related", "reject", "confirm"} <= {c["command"] for c in tg.commands}
        mid, got = await ask(tg, OWNER, "/about Atlas")
        text = got["text"]
        assert got["preview_off"]
        assert "Atlas —uses database→ PostgreSQL" in text and "Atlas —uses pooler→ pgbouncer" in text
        assert "“把项目 Atlas 的数据库从 MySQL 换成了 PostgreSQL”" in text and "“连接池用 pgbouncer”" in text
        assert f"{memory.leanote.url}/note/{A_ATLAS}" in text  # the fact's source note
        for title, note_id in (("PostgreSQL 连接池配置", A_POOL), ("PostgreSQL 备份", A_BACKUP)):  # notes mentioning it
            assert title in text and f"{memory.leanote.url}/note/{note_id}" in text
        assert mine["PostgreSQL"]["fact_id"] in text
        assert not [w for w in BOB_WORDS if w in text]  # nothing of Bob's, though his notes name Atlas too
        assert theirs["PostgreSQL"]["fact_id"] not in text
        datas = {data for _, data in tg.buttons(mid)}
        assert datas == {f"mem:{v}:{f['fact_id']}" for f in mine.values() for v in ("confirmed", "rejected")}
        assert {label for label, _ in tg.buttons(mid)} >= {"👍 1 confirm", "👎 1 reject"}

        # Bob asks the same: his facts and notes, none of Alice's
        _, got = await ask(tg, BOBBY, "/about Atlas")
        assert "机房 B3" in got["text"] and "Bob 的 Atlas 机房笔记" in got["text"]
        assert "pgbouncer" not in got["text"] and "PostgreSQL 连接池配置" not in got["text"]
        assert A_ATLAS not in got["text"]

        _, got = await ask(tg, OWNER, "/about 不存在的东西")
        assert "knows nothing" in got["text"]
        _, got = await ask(tg, OWNER, "/about")
        assert "usage" in got["text"]

    run(memory, scenario)


def test_related_by_note_id_and_by_question_with_links_shared_entities_and_pair_buttons(memory):
    async def scenario(tg, settings):
        mid, got = await ask(tg, OWNER, f"/related {A_ATLAS}")
        text = got["text"]
        assert "PostgreSQL 备份" in text and f"{memory.leanote.url}/note/{A_BACKUP}" in text
        assert "score" in text and "shared:" in text and "passage:" in text
        assert not [w for w in BOB_WORDS if w in text]
        pairs = [data for _, data in tg.buttons(mid) if data.startswith("mem:rejected:p")]
        assert pairs and len(pairs) == len([d for _, d in tg.buttons(mid) if d.startswith("mem:confirmed:p")])

        # a question: the notes search finds for it, then their related notes
        _, got = await ask(tg, OWNER, "/related PostgreSQL 每天怎么备份")
        assert "PostgreSQL 备份" in got["text"] and f"/note/{A_BACKUP}" in got["text"]
        assert not [w for w in BOB_WORDS if w in got["text"]]

        # Alice's note id from Bob: not his note, so a question over his notes; nothing of Alice's
        _, got = await ask(tg, BOBBY, f"/related {A_ATLAS}")
        assert "PostgreSQL 备份" not in got["text"] and "连接池" not in got["text"]
        _, got = await ask(tg, BOBBY, f"/related {B_ATLAS}")
        assert "Bob 的 PostgreSQL 调优" in got["text"] and "Atlas 数据库迁移" not in got["text"]

        # rejecting a pair: it is gone from the memory, and from the next /related
        data = pairs[0]
        pair_id = data.rsplit(":", 1)[1]
        answer = await press(tg, OWNER, OWNER, mid, data)
        assert "Rejected" in answer["text"] and " ↔ " in answer["text"]
        with MemoryStore.open_for(settings) as store:
            h = store.correction_history(ALICE, pair_id)
            assert h["verdict"] == "rejected" and h["rows"] == []
            other = next(n["note_id"] for n in h["notes"] if n["note_id"] != A_ATLAS)
            assert other not in {n["note_id"] for n in store.related_of(ALICE, A_ATLAS)}
        _, again = await ask(tg, OWNER, f"/related {A_ATLAS}")
        assert pair_id not in again["text"]
        assert data not in {d for _, d in tg.buttons(mid)}  # its buttons went from the message

    run(memory, scenario)


def test_reject_from_a_group_button_and_a_press_by_another_leanote_user_changes_nothing(memory):
    async def scenario(tg, settings):
        pool = facts_of(settings, ALICE)["pgbouncer"]["fact_id"]
        mid, got = await ask(tg, OWNER, "/about Atlas", chat=GROUP)  # shown where asked, as /search is
        assert "pgbouncer" in got["text"]
        reject = button(tg, mid, "rejected", pool)

        # Bob, in the same group, presses Alice's 👎: his memory has no such fact; nothing changes
        before = verdicts(settings, ALICE)
        answer = await press(tg, BOBBY, GROUP, mid, reject)
        assert answer["show_alert"] and "not in your memory" in answer["text"] and "nothing was changed" in answer["text"]
        assert "pgbouncer" in facts_of(settings, ALICE) and verdicts(settings, ALICE) == before
        assert reject in {d for _, d in tg.buttons(mid)}

        # Alice presses it: the fact goes, and the memory records it rejected (by her)
        answer = await press(tg, OWNER, GROUP, mid, reject)
        assert "Rejected: Atlas —uses pooler→ pgbouncer" in answer["text"] and not answer["show_alert"]
        assert "pgbouncer" not in facts_of(settings, ALICE)
        with MemoryStore.open_for(settings) as store:
            h = store.correction_history(ALICE, pool)
        assert h["verdict"] == "rejected" and h["log"][-1]["by"] == f"telegram:{OWNER}" and h["rows"] == []
        # its buttons go: the bot answers the press first (the toast shows at once), then edits them
        await until(lambda: reject not in {d for _, d in tg.buttons(mid)}, what="the rejected fact's buttons to go")
        _, again = await ask(tg, OWNER, "/about Atlas", chat=GROUP)
        assert "uses pooler" not in again["text"] and "uses database" in again["text"]
        assert pool not in again["text"]
        # FRIEND reads Alice's notes too: their press is on their own memory, so it counts
        answer = await press(tg, FRIEND, GROUP, mid, button(tg, mid, "rejected", facts_of(settings, ALICE)
                                                            ["PostgreSQL"]["fact_id"]))
        assert "Rejected: Atlas —uses database→ PostgreSQL" in answer["text"]
        assert facts_of(settings, ALICE) == {}
        assert set(facts_of(settings, BOB)) == {"PostgreSQL", "机房 B3"}  # Bob's facts untouched

        # the text commands: confirm, already rejected, another user's id, a malformed id
        b3 = facts_of(settings, BOB)["机房 B3"]["fact_id"]
        _, got = await ask(tg, BOBBY, f"/confirm {b3}")
        assert "Confirmed: Atlas —hosted in→ 机房 B3" in got["text"]
        assert facts_of(settings, BOB)["机房 B3"]["confirmed"]
        _, got = await ask(tg, OWNER, f"/reject {pool}")
        assert "Already rejected" in got["text"]
        _, got = await ask(tg, OWNER, f"/reject {b3}")
        assert "not in your memory" in got["text"] and "机房 B3" in facts_of(settings, BOB)
        _, got = await ask(tg, OWNER, "/reject xyz")
        assert "usage" in got["text"]

    run(memory, scenario)


def test_memory_off_or_not_built_says_so(memory, tmp_path):
    fresh = make_settings(tmp_path)
    with Parts(fresh) as parts:  # what a daemon gives its bots before its first pass
        with pytest.raises(MemoryUnavailable) as why:
            memory_of(parts)
        assert why.value.reason == "not_yet" and not path_for(fresh).exists()  # and nothing was created

    async def scenario(tg, settings):
        for text in ("/about Atlas", f"/related {A_ATLAS}", "/reject f0123456789ab"):
            _, got = await ask(tg, OWNER, text)
            assert got["text"] == telegram_text(MEMORY_OFF)  # as the door's rule shows it

    run(memory, scenario, memory={"enabled": False})
