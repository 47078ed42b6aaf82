"""The Telegram bot: the real python-telegram-bot Application inside the real daemon,
talking to a local fake Bot API (via ``base_url``), answering from the sample notes
with a fake Ollama."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from bot.render import telegram_html, telegram_messages, telegram_sources
from bot.telegram import service
from rag.answer.types import Citation
from bot.serve import Daemon

from conftest import RESTIC_CLAUSES, SCENARIO, distinct_sentences, free_port, make_settings, within, until as wait_until
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram, html_error

OWNER, FRIEND, STRANGER, GROUP = 111, 222, 999, -100500


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_TG_TOKEN", "123:TEST")
    with FakeTelegram() as tg, FakeOllama() as ollama:
        settings = make_settings(
            tmp_path,
            telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url, "edit_interval": 0.3},
            users=[{"leanote_user_id": "local", "telegram_ids": [OWNER], "admin": True},
                   {"leanote_user_id": "local", "telegram_ids": [FRIEND]}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, sync={"interval": "1h", "trigger_debounce": "0.1s"},
            bots={"rate_limit": 3},
        )
        settings = settings.model_copy(update={"telegram": settings.telegram.model_copy(update={"allowed_chats": [GROUP]})})
        yield settings, tg, ollama


async def until(check, timeout=30.0, what="the condition"):
    return await wait_until(check, timeout, what)


def run(settings, tg, scenario):
    async def main():
        daemon = Daemon(settings, services=[service])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(lambda: tg.method_calls("getUpdates"))
            await within(scenario(daemon), "the scenario", SCENARIO)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())


def final(tg, chat, containing):
    return [m for m in tg.sent_to(chat) if containing in m["text"]]


@pytest.mark.slow
def test_a_question_gets_a_streamed_edited_answer_with_sources(world):
    settings, tg, ollama = world

    async def scenario(daemon):
        # each sentence is shown once it is complete and checked against the notes
        ollama.reply("先把鸡蛋炒好盛出[1]。", "再下番茄", "中火炒出汁[1]。", "最后加一小勺糖压酸味", "[1]。", delay=0.25)
        tg.say(OWNER, "番茄炒蛋怎么做才不酸？")
        done = await until(lambda: final(tg, OWNER, "来源"))
        message = done[0]
        assert message["parse_mode"] == "HTML" and message["preview_off"]
        assert message["text"].startswith("先把鸡蛋炒好盛出[1]。再下番茄中火炒出汁[1]。最后加一小勺糖压酸味[1]。")
        assert "[1] 番茄炒蛋" in message["text"]
        assert html_error(message["text"]) is None
        # under the answer, the note's own words it stands on, as a quote
        quote = message["text"].split("<blockquote>", 1)[1].split("</blockquote>", 1)[0]
        assert quote.startswith("笔记原文 [1] 番茄炒蛋") and "炒出汁" in quote, quote
        streamed = [text for _, text in message["edits"][:-1]]
        # first the sources the answer reads, before any of its text: titles and links
        assert streamed[0].startswith("📚 读的笔记:\n[1] 番茄炒蛋") and "先把鸡蛋" not in streamed[0]
        assert streamed[0].endswith("…")
        # then the answer streams in under them
        assert streamed[1:] and all(t.startswith("📚") and t.endswith("▌") for t in streamed[1:])
        times = [t for t, _ in message["edits"]]
        assert all(b - a >= 0.25 for a, b in zip(times, times[1:-1]))  # paced
        assert tg.method_calls("sendChatAction")  # typing…
        assert [c["command"] for c in tg.commands] == ["ask", "search", "reset", "why", "web", "status", "sync", "note", "append",
                                                  "remember", "save", "outbox", "about", "related", "reject",
                                                  "confirm", "gaps", "digest", "forget", "help"]

    run(settings, tg, scenario)


def test_start_tells_a_newcomer_their_id(world):
    settings, tg, ollama = world

    async def scenario(daemon):
        tg.say(STRANGER, "/start")
        tg.say(OWNER, "/start")
        await until(lambda: tg.sent_to(STRANGER) and tg.sent_to(OWNER))
        assert str(STRANGER) in tg.sent_to(STRANGER)[0]["text"] and "/ask" in tg.sent_to(STRANGER)[0]["text"]
        assert "Sorry" not in tg.sent_to(OWNER)[0]["text"]

    run(settings, tg, scenario)


def test_a_stranger_gets_one_refusal_with_their_id_and_nothing_else(world):
    settings, tg, ollama = world

    async def scenario(daemon):
        tg.say(STRANGER, "番茄炒蛋怎么做？")
        await until(lambda: tg.sent_to(STRANGER))
        await asyncio.sleep(0.5)
        sent = tg.sent_to(STRANGER)
        assert len(sent) == 1 and str(STRANGER) in sent[0]["text"] and "番茄" not in sent[0]["text"]
        assert ollama.chats() == []

    run(settings, tg, scenario)


@pytest.mark.slow
def test_429_while_streaming_still_delivers_the_final_answer(world):
    settings, tg, ollama = world

    async def scenario(daemon):
        ollama.reply("家里 DHCP 地址池是 ", "192.168.50.100–192.168.50.199", "[1]。", delay=0.3)
        tg.throttle_next("editMessageText", times=3, retry_after=1)
        tg.say(OWNER, "家里路由器的 DHCP 范围是多少？")
        done = await until(lambda: final(tg, OWNER, "来源"), timeout=40)
        assert "192.168.50.100–192.168.50.199[1]。" in done[0]["text"]

    run(settings, tg, scenario)


def test_note_text_is_escaped_and_long_answers_are_split(world):
    settings, tg, ollama = world

    async def scenario(daemon):
        # what the restic note says, with its < and > (and & in the code), then a long answer
        line = "UUID=<移动硬盘的UUID> /mnt/backup-usb ext4 defaults,nofail 0 2"
        risky = (f"移动硬盘按 UUID 挂载：{line}[1]。\n\n```bash\necho '{line}' | sudo tee -a /etc/fstab && "
                 "sudo mount -a\n```\n\n")
        said = distinct_sentences(RESTIC_CLAUSES, 360, per=4)  # what the note says, none twice (else shown once)
        long_tail = "\n\n".join("".join(said[i * 12:(i + 1) * 12]) for i in range(30))
        ollama.reply(risky + long_tail)
        tg.say(OWNER, "家里的服务器用 restic 怎么备份到移动硬盘？")
        await until(lambda: final(tg, OWNER, "来源"), timeout=40)
        sent = tg.sent_to(OWNER)
        assert len(sent) >= 2
        for m in sent:
            assert len(m["text"]) <= 4096 and m["parse_mode"] == "HTML" and html_error(m["text"]) is None
        first = sent[0]["text"]
        assert "UUID=&lt;移动硬盘的UUID&gt; /mnt/backup-usb" in first
        assert ("<pre><code class=\"language-bash\">echo 'UUID=&lt;移动硬盘的UUID&gt; /mnt/backup-usb ext4 "
                "defaults,nofail 0 2' | sudo tee -a /etc/fstab &amp;&amp; sudo mount -a</code></pre>") in first

    run(settings, tg, scenario)


@pytest.mark.slow
def test_groups_need_a_mention_or_a_reply_and_commands_work(world):
    settings, tg, ollama = world

    async def scenario(daemon):
        tg.say(FRIEND, "番茄炒蛋怎么做？", chat_id=GROUP, chat_type="supergroup")
        await asyncio.sleep(1.0)
        assert tg.sent_to(GROUP) == []  # not addressed to the bot
        ollama.reply("先炒蛋[1]。")
        tg.say(FRIEND, "@notes_bot 番茄炒蛋怎么做？", chat_id=GROUP, chat_type="supergroup")
        await until(lambda: final(tg, GROUP, "来源"))
        ollama.reply("番茄炒蛋怎么做才不酸？")  # the follow-up, rewritten
        ollama.reply("加一小勺糖[1]。")
        tg.say(FRIEND, "那怎么不酸？", chat_id=GROUP, chat_type="supergroup", reply_to_bot=True)
        await until(lambda: final(tg, GROUP, "加一小勺糖"))
        tg.say(FRIEND, "/why", chat_id=GROUP, chat_type="supergroup")
        await until(lambda: final(tg, FRIEND, "候选 candidates"))  # in the person's private chat
        await until(lambda: final(tg, GROUP, "privately"))
        assert not final(tg, GROUP, "候选 candidates")
        tg.say(FRIEND, "/sync", chat_id=GROUP, chat_type="supergroup")
        await until(lambda: final(tg, GROUP, "Only admins"))
        passes = daemon.passes
        tg.say(OWNER, "/sync")
        done = await until(lambda: final(tg, OWNER, "Synced:"))  # "Syncing…", then what the pass did
        assert "notes: 0 added, 0 updated, 0 deleted" in done[0]["text"]
        assert done[0]["edits"]  # the "Syncing…" reply, edited once the pass ended
        assert daemon.passes > passes
        tg.say(OWNER, "/search 红烧肉")
        await until(lambda: final(tg, OWNER, "红烧肉（妈妈的做法）"))
        tg.say(OWNER, "/status")
        await until(lambda: final(tg, OWNER, "last sync"))
        tg.say(OWNER, "/reset")
        await until(lambda: final(tg, OWNER, "Fresh start"))

    run(settings, tg, scenario)


@pytest.mark.slow
def test_a_shared_group_keeps_each_persons_conversation_their_own(world):
    """ONE and TWO (both mapped) and a stranger in one listed group: nothing of ONE's
    question, answer, trace or notes reaches TWO's /why, /status, follow-up prompt or replies."""
    settings, tg, ollama = world
    ONE, TWO = OWNER, FRIEND
    secret_question = "家里路由器的 DHCP 地址池是多少，我急用？"
    secret_answer = "DHCP 地址池设为 192.168.50.100–192.168.50.199，租期 24 小时"

    async def scenario(daemon):
        ollama.reply(secret_answer + "[1]。")
        tg.say(ONE, "@notes_bot " + secret_question, chat_id=GROUP, chat_type="supergroup")
        # the answer once final (its sources under it): while it streams, its trace is not kept yet
        await until(lambda: [m for m in final(tg, GROUP, secret_answer) if "来源" in m["text"]], what="ONE's answer")
        one_trace = daemon.answers.conversations.trace("local", f"telegram:{GROUP}:{ONE}")
        one_titles = {c.title for c in one_trace.candidates}
        assert one_titles

        before = len(tg.sent_to(TWO))
        tg.say(TWO, "/why", chat_id=GROUP, chat_type="supergroup")
        why = await until(lambda: tg.sent_to(TWO)[before:])
        assert "No answer in this conversation yet" in why[0]["text"]

        # TWO's follow-up, replying to the bot's answer to ONE: TWO has no history, so no
        # rewrite with ONE's turn; nothing of ONE's reaches any prompt made for TWO
        chats_before = len(ollama.chats())
        ollama.reply("我笔记里没有相关内容")
        tg.say(TWO, "那密码呢？", chat_id=GROUP, chat_type="supergroup", reply_to_bot=True)
        # the LLM refused: the best passages for TWO's question, under the line that says so
        await until(lambda: final(tg, GROUP, "模型没能从这些段落里找到直接的回答"), what="TWO's answer")
        assert len(ollama.chats()) == chats_before + 1  # TWO has no history: no rewrite
        for chat in ollama.chats()[chats_before:]:
            prompt = "\n".join(m["content"] for m in chat["messages"])
            # (ONE's answer is the notes' own words, which TWO's evidence may hold: the question is ONE's)
            assert secret_question not in prompt

        tg.say(TWO, "/status", chat_id=GROUP, chat_type="supergroup")  # not an admin: own account only
        status = await until(lambda: final(tg, TWO, "your notes indexed"))
        assert "files:" not in status[0]["text"]

        tg.say(TWO, "/reset", chat_id=GROUP, chat_type="supergroup")
        await until(lambda: final(tg, GROUP, "Fresh start"))
        tg.say(ONE, "/why", chat_id=GROUP, chat_type="supergroup")  # ONE's memory survives TWO's reset
        mine = await until(lambda: final(tg, ONE, secret_question))
        assert "候选 candidates" in mine[0]["text"]

        # nothing sent to TWO, in private or in the group after ONE's answer, names ONE's question
        for m in tg.sent_to(TWO):
            assert secret_question not in m["text"]
            assert not one_titles & set(re.findall(r"• (.+?) ›", m["text"]))

        # a stranger in the group: one refusal, then silence (refusals are rate-limited too)
        tg.say(STRANGER, "@notes_bot 路由器密码是什么？", chat_id=GROUP, chat_type="supergroup")
        await until(lambda: final(tg, GROUP, str(STRANGER)))
        tg.say(STRANGER, "@notes_bot 路由器密码是什么？？", chat_id=GROUP, chat_type="supergroup")
        await asyncio.sleep(1.0)
        assert len(final(tg, GROUP, str(STRANGER))) == 1

    run(settings, tg, scenario)


@pytest.mark.slow
def test_an_unlisted_group_gets_no_answers(world):
    settings, tg, ollama = world
    OTHER_GROUP = -100777

    async def scenario(daemon):
        tg.say(OWNER, "@notes_bot 番茄炒蛋怎么做？", chat_id=OTHER_GROUP, chat_type="group")
        hint = await until(lambda: tg.sent_to(OTHER_GROUP))
        assert "allowed_chats" in hint[0]["text"] and str(OTHER_GROUP) in hint[0]["text"]
        tg.say(STRANGER, "@notes_bot 番茄炒蛋怎么做？", chat_id=OTHER_GROUP, chat_type="group")
        tg.say(OWNER, "/why", chat_id=OTHER_GROUP, chat_type="group")
        await asyncio.sleep(1.0)
        assert len(tg.sent_to(OTHER_GROUP)) == 1 and ollama.chats() == []
        assert tg.sent_to(OWNER) == []

    run(settings, tg, scenario)


def test_why_in_a_group_asks_for_a_private_chat_when_there_is_none(world):
    settings, tg, ollama = world
    tg.no_private_chat.add(FRIEND)

    async def scenario(daemon):
        tg.say(FRIEND, "/why", chat_id=GROUP, chat_type="supergroup")
        hint = await until(lambda: final(tg, GROUP, "private chat"))
        assert "@notes_bot" in hint[0]["text"] and "candidates" not in hint[0]["text"]

    run(settings, tg, scenario)


@pytest.mark.slow
def test_an_error_while_answering_never_leaves_the_chat_hanging(world, caplog):
    settings, tg, ollama = world

    async def scenario(daemon):
        store = daemon.index.store

        def broken(*args, **kwargs):  # the index fails in the middle of a search
            raise RuntimeError("segment file vanished")

        store.search = broken
        tg.say(OWNER, "番茄炒蛋怎么做？")
        sorry = await until(lambda: final(tg, OWNER, "Sorry, something went wrong"))
        assert "vanished" not in sorry[0]["text"] and "…" not in sorry[0]["text"]
        tg.say(OWNER, "/search 番茄")
        await until(lambda: len(final(tg, OWNER, "Sorry, something went wrong")) == 2)
        # each failure logged once, with where it happened: the question's by the answer (which ends its
        # streaming message), the search's by the bot's error handler
        failed = [r for r in caplog.records if r.name.startswith("bot.telegram") and r.levelno == logging.ERROR]
        assert [r.getMessage() for r in failed] == ["answering a Telegram question failed",
                                                    "telegram: handling an update failed"]
        assert all("segment file vanished" in str(r.exc_info[1]) for r in failed)
        typing = len(tg.method_calls("sendChatAction"))
        await asyncio.sleep(5)  # the typing loop (every 4 s) has stopped
        assert len(tg.method_calls("sendChatAction")) == typing
        del store.search  # the index works again: so does the next question
        ollama.reply("先炒蛋[1]。")
        tg.say(OWNER, "番茄炒蛋怎么做？")
        await until(lambda: final(tg, OWNER, "来源"))

    run(settings, tg, scenario)


def test_the_rate_limit_answers_kindly(world):
    settings, tg, ollama = world

    async def scenario(daemon):
        for i in range(4):  # rate_limit is 3 a minute
            ollama.reply(f"回答{i}[1]。")
            tg.say(OWNER, f"番茄炒蛋第{i}问")
        await until(lambda: final(tg, OWNER, "questions a minute"))
        await until(lambda: len(final(tg, OWNER, "来源")) == 3)

    run(settings, tg, scenario)


# --- rendering, without a server ---------------------------------------------------------------


def test_telegram_html_escapes_and_keeps_structure():
    out = telegram_html("# 标题\n\n**粗体** 与 `a<b` 和 [链接](https://x.example/?a=1&b=2)\n\n- 一\n- 二\n\n<script>x</script>")
    assert out.startswith("<b>标题</b>")
    assert "<b>粗体</b>" in out and "<code>a&lt;b</code>" in out
    # a link in the answer's text is never clickable: its address is shown, in code style
    assert "链接 (<code>https://x.example/?a=1&amp;b=2</code>)" in out and "<a " not in out
    assert "• 一\n• 二" in out and "<script>" not in out and "&lt;script&gt;" in out
    assert html_error(out) is None


def test_splitting_never_breaks_a_code_block_or_a_tag():
    code = "```\n" + "\n".join(f"line {i} <tag> & more" for i in range(600)) + "\n```"
    text = "前言。\n\n" + code + "\n\n" + "结尾段落。" * 300
    parts = telegram_messages(text, limit=4096)
    assert len(parts) >= 3
    for part in parts:
        assert len(part) <= 4096 and html_error(part) is None
    joined = "".join(parts)
    assert joined.count("line 599 &lt;tag&gt; &amp; more") == 1 and joined.count("line 0 ") == 1


def test_sources_link_only_web_urls():
    cites = [Citation(1, "a", "T<1>", "N", "H", "http://leanote/note/a", "", 1.0),
             Citation(2, "b", "T2", "N", "", "file:///tmp/x.md", "", 1.0)]
    out = telegram_sources(cites, "来源")
    assert '[1] <a href="http://leanote/note/a">T&lt;1&gt; › H</a>' in out and "[2] T2" in out
    assert html_error(out) is None


def test_pacer_edits_at_most_once_per_interval_under_a_fake_clock():
    from bot.chat.pacing import Pacer, Wait

    class Clock:
        t = 0.0

    clock = Clock()
    sent = []
    waits = {"n": 1}

    async def edit(text):
        if waits["n"]:
            waits["n"] -= 1
            raise Wait(3.0)  # the platform says: not now
        sent.append((clock.t, text))

    async def fake_sleep(seconds):
        clock.t += seconds
        await asyncio.sleep(0)

    async def main():
        pacer = Pacer(edit, 1.5, clock=lambda: clock.t, sleep=fake_sleep)
        pacer.start()
        for i in range(40):  # a token every 0.1 s of fake time
            pacer.feed(f"{i} ")
            await asyncio.sleep(0)
        for _ in range(30):
            await asyncio.sleep(0)
        await pacer.stop()
        return pacer

    asyncio.run(main())
    times = [t for t, _ in sent]
    assert times and all(b - a >= 1.5 for a, b in zip(times, times[1:]))
    assert times[0] >= 1.5 + 3.0  # the wait was honoured before the next edit


def test_a_refused_token_stops_the_bot_with_one_clear_error_while_sync_goes_on(world, monkeypatch, caplog):
    settings, tg, ollama = world
    monkeypatch.setenv("LR_TG_TOKEN", "999:WRONG")  # the fake answers 401, as Telegram does
    settings = settings.model_copy(update={"sync": settings.sync.model_copy(update={"backoff_min": 0.1, "backoff_max": 0.2})})

    async def main():
        daemon = Daemon(settings, services=[service])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(lambda: tg.unauthorized >= 1)
            await asyncio.sleep(1.0)  # backoff is 0.1-0.2 s: a retry would have come by now
            assert tg.unauthorized == 1  # retrying cannot fix a wrong token
            assert daemon.last_pass.ok and not task.done()  # the sync is unaffected
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(within(main(), "the scenario", SCENARIO))
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "Telegram bot stopped" in errors[0] and "LR_TG_TOKEN" in errors[0]
    assert "999:WRONG" not in "\n".join(r.getMessage() for r in caplog.records)


def test_an_unreachable_bot_api_is_retried_and_named_while_sync_goes_on(world, caplog):
    settings, tg, ollama = world
    settings = settings.model_copy(update={
        "sync": settings.sync.model_copy(update={"backoff_min": 0.1, "backoff_max": 0.2}),
        "telegram": settings.telegram.model_copy(update={"base_url": f"http://127.0.0.1:{free_port()}/bot"})})

    async def main():
        daemon = Daemon(settings, services=[service])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(lambda: sum("Telegram bot failed" in r.getMessage() for r in caplog.records) >= 2)
            assert daemon.last_pass.ok and not task.done()
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(within(main(), "the scenario", SCENARIO))


@pytest.mark.slow
def test_tokens_never_reach_the_logs(world, caplog):
    import logging

    settings, tg, ollama = world
    caplog.set_level("DEBUG")
    for noisy in ("httpx", "telegram", "httpcore"):
        logging.getLogger(noisy).setLevel("DEBUG")  # even with the chattiest logging

    async def scenario(daemon):
        ollama.reply("先炒蛋[1]。")
        tg.say(OWNER, "番茄炒蛋怎么做？")
        await until(lambda: final(tg, OWNER, "来源"))
        logging.getLogger("anything").warning("a message mentioning 123:TEST by accident")

    run(settings, tg, scenario)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "bot123:TEST" not in text and "123:TEST" not in text
    assert "***" in text


def test_a_link_in_the_llms_reply_is_shown_not_clickable(world):
    settings, tg, ollama = world

    async def scenario(daemon):
        ollama.reply("先把鸡蛋炒好盛出[1]。再下番茄中火炒出汁[1]。最后加一小勺糖压酸味[1]。"
                     "先确认账号：[点这里登录 Leanote](https://phish.example/login)，再炒蛋[1]。")
        tg.say(OWNER, "番茄炒蛋怎么做？")
        done = await until(lambda: final(tg, OWNER, "来源"))
        text = done[0]["text"]
        assert text.startswith("先把鸡蛋炒好盛出[1]。")
        assert "phish" not in text and "登录" not in text  # no note holds it: never shown
        assert "另有 2 句在你的笔记里找不到依据，已略去" in text

    run(settings, tg, scenario)
    # and where a link is shown, it is in plain sight, not behind words
    html_text = telegram_messages("先确认账号：[点这里登录 Leanote](https://phish.example/login)")[0]
    assert "https://phish.example/login" in html_text and not re.search(r'<a href="[^"]*phish', html_text)


ENGLISH_CHROME = ("Sources", "Closest notes", "Reading", "Your notes", "The model", "The language model")
CHINESE_CHROME = ("来源", "最接近的笔记", "读的笔记", "我笔记里没有相关内容", "模型", "语言模型")


@pytest.mark.slow
def test_an_answer_speaks_the_questions_language_on_every_path(world):
    """An English question was refused in English and then in Chinese, or shown an English
    notice over Chinese headers. Each path — a quick refusal, an answer the check withdrew, the
    passages when the LLM fails — now reads in the question's language only (the notes' own
    titles and words aside)."""
    settings, tg, ollama = world

    def last_to(chat, after: int) -> str:
        sent = tg.sent_to(chat)[after:]
        return sent[-1]["text"] if sent else ""

    async def ask(question: str, *reply: str, error: bool = False, who: int = OWNER) -> str:
        if reply or error:
            ollama.reply(*(reply or ("x",)), error_after=0 if error else None)
        before = len(tg.sent_to(who))
        tg.say(who, question)
        await until(lambda: len(tg.sent_to(who)) > before and not last_to(who, before).endswith(("…", "▌")),
                    what=f"the answer to {question!r}")
        return last_to(who, before)

    async def scenario(daemon):
        shown = {
            "quick refusal": await ask("How do I rebase a branch with Magit?"),
            "withdrawn": await ask("How do I make tomato scrambled eggs less sour?",
                                   "Pour a cup of vinegar and bake it for two hours at 300 degrees[1]."),
            "llm down": await ask("How do I make tomato scrambled eggs less sour?", error=True),
        }
        assert "Your notes never mention Magit." in shown["quick refusal"] and "rebase vs merge" in shown["quick refusal"]
        assert "Your notes have nothing on this." in shown["quick refusal"] and "Closest notes" in shown["quick refusal"]
        assert "not backed by your notes" in shown["withdrawn"] or "do not back" in shown["withdrawn"], shown["withdrawn"]
        assert "The language model is unavailable" in shown["llm down"] and "Sources" in shown["llm down"]
        for path, text in shown.items():
            assert [w for w in CHINESE_CHROME if w in text] == [], (path, text)
        zh = await ask("番茄炒蛋怎么做才不酸？", "倒一杯醋进去烤两个小时[1]。", who=FRIEND)  # (3 a minute each)
        assert "找不到依据" in zh and [w for w in ENGLISH_CHROME if w in zh] == [], zh

    run(settings, tg, scenario)
