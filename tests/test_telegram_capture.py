"""Capture from Telegram and the buttons under an answer: the real daemon (its capture
outbox, its feedback store) with the real python-telegram-bot Application, talking to a
fake Bot API, a fake Leanote (its write API) and a fake Ollama, over the sample notes."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime

import pytest


from conftest import make_settings
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram, origin_channel, origin_hidden, origin_user
from test_telegram import final, run, until

OWNER, FRIEND, STRANGER, GROUP = 111, 222, 999, -100500
USER = "local"  # the sample notes' user, and the Leanote account capture logs in as
PNG = b"\x89PNG\r\n\x1a\n" + b"pixels" * 50


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_TG_TOKEN", "123:TEST")
    monkeypatch.setenv("LR_LEANOTE_PW", "pw-secret")
    with FakeTelegram() as tg, FakeOllama() as ollama, FakeLeanote() as leanote:
        leanote.add_user(USER, "me@example.com", "pw-secret")

        def settings(**capture):
            s = make_settings(
                tmp_path,
                telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url, "edit_interval": 0.3},
                users=[{"leanote_user_id": USER, "telegram_ids": [OWNER], "admin": True},
                       {"leanote_user_id": USER, "telegram_ids": [FRIEND]}],
                ollama={"host": ollama.url}, rerank={"kind": "none"},
                sync={"interval": "1h", "trigger_debounce": "0.1s"},
                leanote={"base_url": leanote.url},
                capture={"accounts": [{"email": "me@example.com", "password_env": "LR_LEANOTE_PW"}],
                         "sync_after": "0.2s", "retry_min": "0.2s", "retry_max": "0.5s", "tags": ["captured"],
                         "max_file_mb": 1, "rate_limit": 60, **capture},
            )
            return s.model_copy(update={"telegram": s.telegram.model_copy(update={"allowed_chats": [GROUP]})})

        yield settings, tg, ollama, leanote


async def reply_to(tg, chat, before: int) -> dict:
    """The next message the bot sends to ``chat`` (there were ``before``)."""
    got = await until(lambda: tg.sent_to(chat)[before:])
    return got[0]


async def said(tg, user_id, text=None, **kwargs) -> dict:
    """The bot's reply to ``tg.say(user_id, text)`` (or to whatever ``kwargs['send']`` does)."""
    chat = kwargs.pop("chat", user_id)
    before = len(tg.sent_to(chat))
    send = kwargs.pop("send", None)
    if send is not None:
        send()
    else:
        tg.say(user_id, text, **kwargs)
    return await reply_to(tg, chat, before)


def link_id(text: str, leanote) -> str:
    m = re.search(re.escape(leanote.url) + r"/note/([0-9a-f]+)", text)
    assert m, text
    return m.group(1)


# --- capture --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_notes_forwards_saves_files_appends_and_memory_land_in_leanote(world):
    make, tg, ollama, leanote = world
    settings = make()

    async def scenario(daemon):
        # /note with #hashtags: a note in the Inbox notebook, tagged, and its link in the reply
        got = await said(tg, OWNER, "/note 买一个新的路由器 #home #todo\n旧的那台总掉线")
        assert "已记下" in got["text"] and got["preview_off"]
        first = leanote.notes[link_id(got["text"], leanote)]
        assert first["Title"].startswith("买一个新的路由器")
        assert {"home", "todo", "captured"} <= set(first["Tags"])
        assert "旧的那台总掉线" in first["Content"]
        inbox = leanote.notebooks[first["NotebookId"]]
        assert inbox["Title"] == "Inbox"
        got = await said(tg, OWNER, "/note 第二条")
        second = leanote.notes[link_id(got["text"], leanote)]
        assert second["NotebookId"] == first["NotebookId"]
        assert [b for b in leanote.notebooks.values() if b["Title"] == "Inbox"] == [inbox]  # created once

        # /append: onto the last note captured
        got = await said(tg, OWNER, "/append 补充一句")
        assert "已追加" in got["text"] and link_id(got["text"], leanote) == second["NoteId"]
        assert "第二条" in leanote.notes[second["NoteId"]]["Content"]
        assert "补充一句" in leanote.notes[second["NoteId"]]["Content"]

        # a forward from a public channel: captured with where it came from, not answered
        chats = len(ollama.chats())
        when = int(datetime(2024, 5, 1, 9, 30).timestamp())
        got = await said(tg, OWNER, send=lambda: tg.forward(
            OWNER, "路由器固件 3.0 发布了，修复掉线问题 #固件",
            origin=origin_channel(-1001, "路由器新闻", 42, username="router_news", signature="小王", date=when)))
        assert "已记下" in got["text"]
        fwd = leanote.notes[link_id(got["text"], leanote)]
        content = fwd["Content"]
        assert "路由器固件 3.0 发布了" in content and "固件" in fwd["Tags"]
        assert "小王" in content and "「路由器新闻」" in content and "2024-05-01 09:30" in content
        assert "https://t.me/router_news/42" in content
        await asyncio.sleep(0.3)
        assert len(ollama.chats()) == chats and not final(tg, OWNER, "来源")  # not a question

        # a forward from a person who hides their account: their name, no link
        got = await said(tg, OWNER, send=lambda: tg.forward(OWNER, "明天下午三点开会", origin=origin_hidden("老李")))
        hidden = leanote.notes[link_id(got["text"], leanote)]["Content"]
        assert "老李" in hidden and "t.me" not in hidden

        # a forwarded sticker: nothing a note can hold; said so, nothing written
        notes = len(leanote.notes)
        sticker = {"file_id": "st-1", "file_unique_id": "u-st-1", "type": "regular", "width": 512, "height": 512,
                   "is_animated": False, "is_video": False}
        got = await said(tg, OWNER, send=lambda: tg.forward(OWNER, origin=origin_hidden("老李"),
                                                              extra={"sticker": sticker}))
        assert "only text, photos and documents" in got["text"] and len(leanote.notes) == notes

        # /save replying to a forwarded message: that message, with its origin
        kept = tg.forward(OWNER, "周末去爬山", origin=origin_user(333, "Alice", "Chen"))
        await until(lambda: len([m for m in tg.sent_to(OWNER) if "已记下" in m["text"]]) >= 5)
        got = await said(tg, OWNER, send=lambda: tg.reply(OWNER, "/save 计划 #周末", to=kept["message_id"]))
        saved = leanote.notes[link_id(got["text"], leanote)]
        assert saved["Title"] == "计划" and "周末" in saved["Tags"]
        assert "周末去爬山" in saved["Content"] and "Alice Chen" in saved["Content"]
        got = await said(tg, OWNER, "/save")  # not a reply: how to use it
        assert "usage" in got["text"]

        # a photo with "/note ..." as its caption: the image is in Leanote, the note shows it
        tg.add_file("photo-1", PNG)
        got = await said(tg, OWNER, send=lambda: tg.send_photo(OWNER, "photo-1", caption="/note 白板照片 #会议"))
        photo_note = leanote.notes[link_id(got["text"], leanote)]
        assert "photo-1" in tg.downloads
        stored = leanote_files(leanote, photo_note)
        assert [f["data"] for f in stored] == [PNG]
        assert re.search(r"!\[[^\]]*\]\(/api/file/getImage\?fileId=" + re.escape(stored[0]["FileId"]) + r"\)",
                         photo_note["Content"]), photo_note["Content"]

        # a document forwarded from someone: attached to the note
        tg.add_file("doc-1", b"%PDF-1.4 minutes")
        got = await said(tg, OWNER, send=lambda: tg.forward(OWNER, "会议纪要", origin=origin_user(333, "Alice"),
                                                              document="doc-1", file_name="minutes.pdf",
                                                              mime_type="application/pdf"))
        doc_note = leanote.notes[link_id(got["text"], leanote)]
        assert [f["Title"] for f in doc_note["Files"] if f["IsAttach"]] == ["minutes.pdf"]
        assert [f["data"] for f in leanote_files(leanote, doc_note)] == [b"%PDF-1.4 minutes"]
        assert "会议纪要" in doc_note["Content"] and "Alice" in doc_note["Content"]

        # a document above capture.max_file_mb (1 MB): refused before any download, nothing written
        notes = len(leanote.notes)
        tg.add_file("big-1", b"x" * 100, file_size=3 * 1024 * 1024)
        got = await said(tg, OWNER, send=lambda: tg.send_document(OWNER, "big-1", "scan.pdf", "application/pdf",
                                                                    caption="/note 扫描件"))
        assert "scan.pdf" in got["text"] and "1 MB" in got["text"] and "too large" in got["text"]
        assert "big-1" not in tg.downloads and len(leanote.notes) == notes
        # a photo with no /note in a private chat: a hint, nothing written
        tg.add_file("photo-2", PNG)
        got = await said(tg, OWNER, send=lambda: tg.send_photo(OWNER, "photo-2"))
        assert "/note" in got["text"] and "/save" in got["text"] and len(leanote.notes) == notes

        # /remember twice: one memory note, two dated lines
        got = await said(tg, OWNER, "/remember 车位号是 B2-117")
        memory_id = link_id(got["text"], leanote)
        got = await said(tg, OWNER, "/remember 物业电话 5550-1234")
        assert link_id(got["text"], leanote) == memory_id
        lines = [ln for ln in leanote.notes[memory_id]["Content"].splitlines() if ln.startswith("- ")]
        assert len(lines) == 2 and "B2-117" in lines[0] and "5550-1234" in lines[1]
        assert all(re.match(r"- \d{4}-\d{2}-\d{2} \d{2}:\d{2} ", ln) for ln in lines)

        # a stranger's /note: the stranger's refusal, nothing written
        notes = len(leanote.notes)
        got = await said(tg, STRANGER, "/note 我也想记")
        assert str(STRANGER) in got["text"] and len(leanote.notes) == notes

        # /outbox: nothing waiting
        got = await said(tg, OWNER, "/outbox")
        assert "Nothing waiting" in got["text"]

    run(settings, tg, scenario)


def leanote_files(leanote, note) -> list[dict]:
    """The files Leanote keeps for a note, with their bytes."""
    return [{"FileId": file_id, "data": f["Data"], "image": not f["IsAttach"]}
            for file_id, f in leanote.files.items() if f["NoteId"] == note["NoteId"]]



async def answered(tg, ollama) -> int:
    """The owner's question answered from the notes: the id of the answer's message."""
    ollama.reply("先炒蛋再炒番茄[1]。")
    tg.say(OWNER, "番茄炒蛋怎么做？")
    done = (await until(lambda: final(tg, OWNER, "来源")))[0]
    return next(i for i, m in tg.messages.items() if m is done)


def remap(daemon) -> None:
    """The owner mapped to another Leanote user, as a reload applies it."""
    users = [u.model_copy(update={"leanote_user_id": "someone-else"}) if OWNER in u.telegram_ids else u
             for u in daemon.settings.users]
    daemon._apply(daemon.settings.model_copy(update={"users": users}), ["users"])  # the daemon and its parts

def test_a_capture_while_leanote_is_down_is_queued_and_written_when_it_is_back(world):
    make, tg, ollama, leanote = world
    settings = make()

    async def scenario(daemon):
        leanote.down()
        got = await said(tg, OWNER, "/note 断网时记的 #离线")
        assert "queued" in got["text"] and "/outbox" in got["text"]
        got = await said(tg, OWNER, "/outbox")
        assert "note: 断网时记的" in got["text"] and "waiting" in got["text"]
        assert not leanote.notes
        leanote.up()
        note = await until(lambda: [n for n in leanote.notes.values() if "断网时记的" in n["Content"]])
        assert "离线" in note[0]["Tags"]
        await until(lambda: not daemon.capture.pending(f"telegram:{OWNER}"))
        got = await said(tg, OWNER, "/outbox")
        assert "Nothing waiting" in got["text"]

        # "Save as note" while Leanote is down: queued; a second press does not queue it twice
        mid = await answered(tg, ollama)
        save = next(data for _, data in tg.buttons(mid) if data.startswith("save:"))
        leanote.down()
        got = await said(tg, OWNER, send=lambda: tg.press(OWNER, OWNER, mid, save))
        assert "queued" in got["text"]
        got = await said(tg, OWNER, send=lambda: tg.press(OWNER, OWNER, mid, save))
        assert "Queued already" in got["text"]
        assert len(daemon.capture.pending(f"telegram:{OWNER}")) == 1
        leanote.up()
        await until(lambda: leanote.notes_titled(USER, "番茄炒蛋怎么做？"))
        await until(lambda: not daemon.capture.pending(f"telegram:{OWNER}"))
        got = await said(tg, OWNER, send=lambda: tg.press(OWNER, OWNER, mid, save))
        assert "Already saved" in got["text"] and len(leanote.notes_titled(USER, "番茄炒蛋怎么做？")) == 1

    run(settings, tg, scenario)


@pytest.mark.parametrize("capture, says", [({"enabled": False}, "capture.enabled"),
                                           ({"accounts": [], "target": "leanote"}, "capture.accounts")])
def test_capture_turned_off_or_without_an_account_is_refused_politely(world, capture, says):
    make, tg, ollama, leanote = world
    settings = make(**capture)

    async def scenario(daemon):
        got = await said(tg, OWNER, "/note 记不下来")
        assert says in got["text"]
        tg.add_file("photo-3", PNG)
        got = await said(tg, OWNER, send=lambda: tg.forward(OWNER, "转发的", origin=origin_hidden("某人"),
                                                              photo="photo-3"))
        assert says in got["text"]
        if says == "capture.enabled":
            assert "photo-3" not in tg.downloads  # nothing fetched for a capture that cannot be taken
        assert not leanote.notes and not leanote.notebooks and not leanote.writes

    run(settings, tg, scenario)


# --- the buttons under an answer -----------------------------------------------------------------


def test_the_buttons_under_an_answer_are_the_askers_own(world):
    make, tg, ollama, leanote = world
    settings = make()

    async def scenario(daemon):
        ollama.reply("先把鸡蛋炒好盛出，再下番茄，最后加一小勺糖[1]。")
        tg.say(OWNER, "@notes_bot 番茄炒蛋怎么做才不酸？", chat_id=GROUP, chat_type="supergroup")
        done = (await until(lambda: final(tg, GROUP, "来源")))[0]
        mid = next(i for i, m in tg.messages.items() if m is done)
        buttons = {data.rsplit(":", 1)[0]: data for _, data in tg.buttons(mid)}
        assert set(buttons) == {"fb:up", "fb:down", "why", "save"}
        assert all(len(d.encode()) <= 64 for d in buttons.values())
        assert [t for t, _ in tg.buttons(mid)] == ["👍", "👎", "Why? / 依据", "Save as note / 存为笔记"]
        answer_id = buttons["why"].split(":", 1)[1]
        record = daemon.feedback.get(answer_id)
        assert record.person == f"telegram:{OWNER}" and record.question == "番茄炒蛋怎么做才不酸？"

        # 👍 by the asker: recorded, thanked
        q = tg.press(OWNER, GROUP, mid, buttons["fb:up"])
        ack = await until(lambda: tg.answered(q))
        assert "Thanks" in ack[0]["text"] and not ack[0]["show_alert"]
        assert daemon.feedback.get(answer_id).verdict == "up"

        # another mapped person in the group: an alert, nothing changes
        for data in (buttons["fb:down"], buttons["why"], buttons["save"]):
            q = tg.press(FRIEND, GROUP, mid, data)
            ack = await until(lambda: tg.answered(q))
            assert ack[0]["show_alert"] and "someone else's answer" in ack[0]["text"]
        assert daemon.feedback.get(answer_id).verdict == "up"
        assert not tg.sent_to(FRIEND) and not leanote.notes

        # Why: that answer's trace, in the asker's private chat
        before = len(tg.sent_to(OWNER))
        q = tg.press(OWNER, GROUP, mid, buttons["why"])
        why = await reply_to(tg, OWNER, before)
        assert "问题 question: 番茄炒蛋怎么做才不酸？" in why["text"] and "候选 candidates" in why["text"]
        assert "privately" in (await until(lambda: tg.answered(q)))[0]["text"]
        assert not final(tg, GROUP, "候选 candidates")

        # a later question does not change what Why shows for this one
        ollama.reply("先焯水是为了去掉血水和腥味[1]。")
        tg.say(OWNER, "红烧肉怎么做？")
        await until(lambda: final(tg, OWNER, "去掉血水和腥味"))
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, GROUP, mid, buttons["why"])
        assert "番茄炒蛋怎么做才不酸？" in (await reply_to(tg, OWNER, before))["text"]

        # Save as note (tapped twice): the answer and its sources as links, in Leanote, once
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, GROUP, mid, buttons["save"])
        tg.press(OWNER, GROUP, mid, buttons["save"])
        got = await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "已保存" in m["text"]])
        got = got[0]
        await asyncio.sleep(0.5)
        assert "已保存" in got["text"]
        note = leanote.notes[link_id(got["text"], leanote)]
        assert note["Title"] == "番茄炒蛋怎么做才不酸？"
        assert "最后加一小勺糖" in note["Content"]
        cited = record.cited[0]
        assert f"[{cited['title']}]({cited['url']})" in note["Content"]
        assert daemon.feedback.get(answer_id).saved_note_id == note["NoteId"]
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, GROUP, mid, buttons["save"])
        again = await reply_to(tg, OWNER, before)
        assert "Already saved" in again["text"] and note["NoteId"] in again["text"]
        assert len(leanote.notes) == 1

        # an answer id nobody knows (expired): a short alert
        q = tg.press(OWNER, GROUP, mid, "fb:up:nosuchanswer")
        ack = await until(lambda: tg.answered(q))
        assert ack[0]["show_alert"] and "expired" in ack[0]["text"]

    run(settings, tg, scenario)


@pytest.mark.slow
def test_a_restarted_bot_is_not_given_what_it_confirmed_and_captures_once(world):
    """Telegram forgets updates once an offset confirms them: a bot that restarts (a new
    process asks without an offset) gets only what came since. A capture before the restart
    is one note in Leanote, the one after it one more, each answered once."""
    make, tg, ollama, leanote = world
    settings = make()

    async def before(daemon):
        got = await said(tg, OWNER, "/note 重启之前记的 RESTART-ONE")
        assert "已记下" in got["text"]
        await until(lambda: not daemon.capture.pending(f"telegram:{OWNER}"))
        confirmed = tg.method_calls("getUpdates")
        await until(lambda: len(tg.method_calls("getUpdates")) > len(confirmed) + 1)  # its offset was sent

    run(settings, tg, before)
    replies = len(tg.sent_to(OWNER))

    async def after(daemon):
        got = await said(tg, OWNER, "/note 重启之后记的 RESTART-TWO")  # updates come in order: the old one first
        assert "已记下" in got["text"]
        await until(lambda: not daemon.capture.pending(f"telegram:{OWNER}"))

    run(settings, tg, after)
    assert [n["Title"] for n in leanote.notes.values() if "RESTART-" in n["Content"]] == [
        "重启之前记的 RESTART-ONE", "重启之后记的 RESTART-TWO"]
    assert len(tg.sent_to(OWNER)) == replies + 1


# --- the person's current Leanote user; text shown as written -----------------------------------


def test_save_as_note_after_the_person_was_remapped_is_refused(world):
    """An answer from the notes of the Leanote user the person was mapped to then: after the
    owner maps them to another user (a reload), its "Save as note" writes into neither."""
    make, tg, ollama, leanote = world
    settings = make()

    async def scenario(daemon):
        mid = await answered(tg, ollama)
        save = next(data for _, data in tg.buttons(mid) if data.startswith("save:"))
        remap(daemon)
        q = tg.press(OWNER, OWNER, mid, save)
        ack = (await until(lambda: tg.answered(q)))[0]
        assert ack["show_alert"] and "another Leanote account" in ack["text"]
        await asyncio.sleep(0.5)
        assert not leanote.notes and not daemon.capture.pending(f"telegram:{OWNER}")

    run(settings, tg, scenario)


def test_why_after_the_person_was_remapped_shows_nothing_of_the_old_users_notes(world):
    """Like "Save as note": the trace of an answer from the Leanote user the person was mapped
    to then names that user's notes; after a remap (a reload) "Why?" shows none of it."""
    make, tg, ollama, leanote = world
    settings = make()

    async def scenario(daemon):
        mid = await answered(tg, ollama)
        why = next(data for _, data in tg.buttons(mid) if data.startswith("why:"))
        before = len(tg.sent_to(OWNER))
        q = tg.press(OWNER, OWNER, mid, why)  # still mapped: the trace comes
        await until(lambda: tg.answered(q) and len(tg.sent_to(OWNER)) > before)
        assert "番茄炒蛋" in tg.sent_to(OWNER)[-1]["text"]
        remap(daemon)
        sent = len(tg.sent_to(OWNER))
        q = tg.press(OWNER, OWNER, mid, why)
        ack = (await until(lambda: tg.answered(q)))[0]
        assert ack["show_alert"] and "another Leanote" in ack["text"]
        await asyncio.sleep(0.5)
        assert len(tg.sent_to(OWNER)) == sent  # no trace sent

    run(settings, tg, scenario)


def test_a_forward_is_kept_as_its_sender_wrote_it_never_as_a_link(world):
    from test_capture_once import EVIL, links

    make, tg, ollama, leanote = world
    settings = make()

    async def scenario(daemon):
        tg.add_file("doc-evil", b"%PDF-1.4 x")
        sent = f"看这个 [点我](javascript:alert(1)) {EVIL} #资料"  # plain text in Telegram, not a link
        got = await said(tg, OWNER, send=lambda: tg.forward(
            OWNER, sent, origin=origin_user(333, EVIL), document="doc-evil",
            file_name=EVIL + ".pdf", mime_type="application/pdf"))
        note = leanote.notes[link_id(got["text"], leanote)]
        hrefs, text = links(note["Content"])
        assert [h.split("?")[0] for h in hrefs] == ["/api/file/getAttach"]  # only the file's own link
        assert sent in text and EVIL + ".pdf" in text and f"Forwarded from: {EVIL}" in text
        assert "资料" in note["Tags"]
        # the person's own /note keeps their Markdown
        got = await said(tg, OWNER, "/note 我的 [链接](https://example.com/x) *重点*")
        hrefs, _ = links(leanote.notes[link_id(got["text"], leanote)]["Content"])
        assert hrefs == ["https://example.com/x"]

    run(settings, tg, scenario)
