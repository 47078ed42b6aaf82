"""Voice messages and photos through the real Telegram door: the daemon with the real
python-telegram-bot Application, a fake Bot API, a fake Leanote and a fake Ollama, the real
speech and OCR engines (the ``speech`` and ``ocr`` extras), and clips and images made here
(``media_files``). Speech is spoken by espeak-ng where the machine has it; without it the
tests of heard words skip, and those of what cannot be heard still run."""

from __future__ import annotations

import sys
import threading

import pytest

pytest.importorskip("faster_whisper")
pytest.importorskip("rapidocr_onnxruntime")

import media_files  # noqa: E402
from fakes.telegram import visible  # noqa: E402
from test_telegram import run, until  # noqa: E402
import test_telegram_capture  # noqa: E402
from test_telegram_capture import OWNER, link_id, reply_to  # noqa: E402

world = test_telegram_capture.world  # the fixture: the daemon's fakes (Bot API, Leanote, Ollama)

needs_espeak = pytest.mark.skipif(not media_files.has_espeak(), reason="espeak-ng is not installed (speech is made with it)")


async def status_and_reply(tg, chat, before: int, done: str, timeout: float = 60.0):
    """The bot's media status message (once it reads ``done``-ish: no longer "…ing") and the message after it."""
    status = await reply_to(tg, chat, before)
    await until(lambda: "…" not in status["text"] or done in status["text"], timeout, "the status to settle")
    return status


@pytest.mark.slow
@needs_espeak
def test_a_voice_question_is_heard_shown_and_answered_and_a_spoken_note_is_captured_with_its_clip(world):
    make, tg, ollama, leanote = world

    async def scenario(daemon):
        # a question by voice: the words on one line first, then the answer from the notes
        tg.add_file("v-ask", media_files.spoken("How do I read the system journal?"))
        ollama.reply("Use journalctl -f -u with the service name [1].")
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-ask", duration=3)
        status = await status_and_reply(tg, OWNER, before, "🎙 「")
        assert status["text"].startswith("🎙 「") and "journal" in status["text"].lower(), status["text"]
        answer = await until(lambda: [m for m in tg.sent_to(OWNER)[before + 1:] if "journalctl" in m["text"]
                                      and "Sources" in m["text"]], 60, "the answer")
        assert answer
        asked = ollama.chats()[-1]["messages"][-1]["content"]
        assert "journal" in asked.lower()

        # "Note, …" said: a note with the words as its text, the clip attached, marked as transcribed
        clip = media_files.spoken("Note, buy a new router for the study.")
        tg.add_file("v-note", clip)
        before = len(tg.sent_to(OWNER))
        sent = tg.send_voice(OWNER, "v-note", duration=3)
        status = await status_and_reply(tg, OWNER, before, "🎙 「")
        receipt = await until(lambda: [m for m in tg.sent_to(OWNER)[before + 1:] if "已记下" in m["text"]], 60,
                              "the receipt")
        note = leanote.notes[link_id(receipt[0]["text"], leanote)]
        assert "router" in note["Title"].lower() and "router" in note["Content"].lower()
        assert "Transcribed from the voice message" in note["Content"]
        assert [f["Data"] for f in leanote.files.values() if f["NoteId"] == note["NoteId"]] == [clip]
        # the same message again (Telegram sends an update until it is confirmed): the same note, nothing new
        notes, before = len(leanote.notes), len(tg.sent_to(OWNER))
        again = tg.send_again(sent)
        assert again["voice"]["file_id"] == "v-note"
        got = await reply_to(tg, OWNER, before)
        await until(lambda: "…" not in got["text"], 30, "the second receipt")
        assert note["NoteId"] in got["text"] and "Already saved" in got["text"] and len(leanote.notes) == notes

        # "Remember, …" said: a dated line in the memory note
        tg.add_file("v-remember", media_files.spoken("Remember, the parking spot is B two."))
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-remember", duration=3)
        receipt = await until(lambda: [m for m in tg.sent_to(OWNER)[before + 1:] if "记住了" in m["text"]], 60,
                              "the receipt")
        memory = leanote.notes[link_id(receipt[0]["text"], leanote)]
        assert "parking spot" in memory["Content"]

    run(make(), tg, scenario)


@pytest.mark.slow
def test_what_cannot_be_heard_or_read_is_said_in_one_line_and_a_captured_photo_keeps_its_text(world):
    make, tg, ollama, leanote = world

    async def scenario(daemon):
        # a tone: sound, but no speech; sent while someone else's short clip is being heard, it says its
        # place in line first (the other's job here is one quick step that waits for the test; behind a long
        # clip's piece it would not wait at all: tests/test_media.py)
        other = threading.Event()

        def someone_elses():
            yield lambda: other.wait(60)

        daemon.parts.media.line.submit("telegram:222", someone_elses(), quick=True)
        tg.add_file("v-tone", media_files.tone(2.0))
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-tone", duration=2)
        status = await reply_to(tg, OWNER, before)
        await until(lambda: "ahead of you" in status["text"], 30, "the place in line")
        assert status["text"] == "⏳ 排队中，前面还有 1 个 / In line: 1 ahead of you"
        other.set()
        await until(lambda: "No speech" in status["text"], 60, "the clip's turn")
        assert "No speech found" in status["text"] and any("Transcribing" in t for _, t in status["edits"])
        # bytes that are no audio
        tg.add_file("v-junk", b"this is not audio at all" * 20)
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-junk", duration=2)
        status = await status_and_reply(tg, OWNER, before, "decoded")
        assert "could not be decoded as audio" in status["text"]
        # longer than media.max_clip by what Telegram says: refused before any download
        tg.add_file("v-long", media_files.tone(1.0))
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-long", duration=61)
        got = await reply_to(tg, OWNER, before)
        assert "Too long" in got["text"] and "60 s" in got["text"] and "v-long" not in tg.downloads

        # a photo with /note: the image attached, its text under it in the note, marked as recognised
        tg.add_file("p-note", media_files.text_png(["ConnectionTimeout after 30 seconds", "retry the upload"]))
        before = len(tg.sent_to(OWNER))
        tg.send_photo(OWNER, "p-note", caption="/note 报错截图")
        got = await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "已记下" in m["text"]], 60, "the receipt")
        note = leanote.notes[link_id(got[0]["text"], leanote)]
        content = note["Content"]
        assert content.index("getImage") < content.index("Recognised text") < content.index("ConnectionTimeout")
        assert "the upload" in content

        # a photo with a question: its text read, shown, and the question asked with it
        tg.add_file("p-ask", media_files.text_png(["$ journalctl -u caddy -f"]))
        ollama.reply("有：journalctl -u caddy -f 实时跟着看 caddy 的日志[1]。")
        before = len(tg.sent_to(OWNER))
        tg.send_photo(OWNER, "p-ask", caption="这个命令我的笔记里有吗？")
        status = await status_and_reply(tg, OWNER, before, "🔎 「")
        assert status["text"].startswith("🔎 「") and "caddy" in status["text"]
        answer = await until(lambda: [m for m in tg.sent_to(OWNER)[before + 1:] if "来源" in m["text"]
                                      or "最接近" in m["text"]], 60, "the answer")
        assert "来源" in answer[0]["text"] and "Reading systemd journal logs" in answer[0]["text"], answer[0]["text"]
        asked = ollama.chats()[-1]["messages"][-1]["content"]
        assert "这个命令我的笔记里有吗" in asked and "journalctl" in asked
        # a "photo" that is no image, with a question: said so, nothing asked
        chats = len(ollama.chats())
        tg.add_file("p-junk", b"GIF89a but not really")
        before = len(tg.sent_to(OWNER))
        tg.send_document(OWNER, "p-junk", "error.gif", "image/gif", caption="这是什么错误？")
        got = await reply_to(tg, OWNER, before)
        assert "not an image I can read" in got["text"] and len(ollama.chats()) == chats

    run(make(), tg, scenario)


@pytest.mark.slow
def test_a_terminal_screenshot_asked_about_is_answered_its_host_names_and_flags_not_taken_for_names_asked(world):
    make, tg, ollama, leanote = world

    async def scenario(daemon):
        # the error on a terminal, with a prompt, a host, sudo and a flag no note mentions: what the person
        # saw, not names they ask about (typed, "web-01" would be refused naming it)
        tg.add_file("p-error", media_files.text_png(["deploy@web-01:~$ sudo ./batch-import --dry-run",
                                                      "FATAL: sorry, too many clients already"]))
        ollama.reply("事故之后把 pool_size 调到了 20，并且打开了 pool_pre_ping[1]。")
        before = len(tg.sent_to(OWNER))
        tg.send_photo(OWNER, "p-error", caption="这个报错我的笔记里有说怎么处理吗？")
        status = await status_and_reply(tg, OWNER, before, "🔎 「")
        assert "web-01" in status["text"] and "clients" in status["text"], status["text"]
        answer = await until(lambda: [m for m in tg.sent_to(OWNER)[before + 1:] if "来源" in m["text"]
                                      or "最接近" in m["text"]], 60, "the answer")
        text = answer[0]["text"]
        assert "没有提到" not in text and "pool_pre_ping" in text and "PostgreSQL 连接池配置" in text, text
        asked = ollama.chats()[-1]["messages"][-1]["content"]
        assert "这个报错我的笔记里有说怎么处理吗" in asked and "too many clients" in asked
        # the host typed by the person is a name they ask about: refused, naming it
        chats = len(ollama.chats())
        tg.say(OWNER, "web-01 上跑批量导入时报 too many clients already，笔记里有处理办法吗？")
        got = await until(lambda: [m for m in tg.sent_to(OWNER) if "没有提到 web-01" in m["text"]], 60, "the refusal")
        assert got and len(ollama.chats()) == chats

    run(make(), tg, scenario)


@pytest.mark.slow
def test_without_speech_the_bot_says_so_and_a_voice_note_is_still_kept(world):
    make, tg, ollama, leanote = world

    async def scenario(daemon):
        tg.add_file("v-off", media_files.tone(1.0))
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-off", duration=1)
        got = await reply_to(tg, OWNER, before)
        assert "media.speech: off" in visible(got["text"]) and "v-off" not in tg.downloads
        # with /note: the clip is captured all the same, and the receipt says why it has no words
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-off", duration=1, caption="/note 语音备忘")
        got = await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "已记下" in m["text"]], 60, "the receipt")
        assert "media.speech: off" in visible(got[0]["text"])
        note = leanote.notes[link_id(got[0]["text"], leanote)]
        assert note["Title"] == "语音备忘" and note["Files"]

    run(make().model_copy(update={"media": make().media.model_copy(update={"speech": "off"})}), tg, scenario)


def test_without_the_extras_installed_the_bot_says_what_to_install(world, monkeypatch):
    make, tg, ollama, leanote = world
    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # as on a default install
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)

    async def scenario(daemon):
        tg.add_file("v-none", media_files.tone(1.0))
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-none", duration=1)
        got = await reply_to(tg, OWNER, before)
        assert "pip install 'leanote-rag[speech]'" in got["text"] and "v-none" not in tg.downloads
        tg.add_file("p-none", media_files.text_png(["journalctl -u caddy -f"]))
        before = len(tg.sent_to(OWNER))
        tg.send_photo(OWNER, "p-none", caption="这是什么命令？")
        got = await reply_to(tg, OWNER, before)
        assert "pip install 'leanote-rag[ocr]'" in got["text"] and "p-none" not in tg.downloads
        # a captured photo is kept all the same; the receipt says why its text was not read
        before = len(tg.sent_to(OWNER))
        tg.send_photo(OWNER, "p-none", caption="/note 命令截图")
        got = await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "已记下" in m["text"]], 60, "the receipt")
        assert "leanote-rag[ocr]" in got[0]["text"]
        note = leanote.notes[link_id(got[0]["text"], leanote)]
        assert note["Files"] and "Recognised text" not in note["Content"]

    run(make(), tg, scenario)


@pytest.mark.slow
def test_a_decode_bomb_sent_as_a_short_voice_message_and_images_claiming_billions_of_pixels_are_refused_as_such(world):
    """An 83-minute Matroska file in 10 MB sent as a 5 s voice message: "too long", from its header,
    with nothing loaded or decoded; a 40000² PNG and a JPEG header claiming 65500²: "too many pixels"."""
    make, tg, ollama, leanote = world

    async def scenario(daemon):
        tg.add_file("v-bomb", media_files.matroska_pcm(1, 5_000_000, 1000))
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-bomb", duration=5)
        status = await status_and_reply(tg, OWNER, before, "Too long")
        assert "Too long" in status["text"] and "at most 60 s" in status["text"], status["text"]
        assert "v-bomb" in tg.downloads and not daemon.parts.media._engines  # refused from its header
        chats = len(ollama.chats())
        for name, data, mime in (("bomb.png", media_files.png_claiming(40_000, 40_000), "image/png"),
                                 ("bomb.jpg", media_files.jpeg_claiming(65_500, 65_500), "image/jpeg")):
            tg.add_file(name, data)
            before = len(tg.sent_to(OWNER))
            tg.send_document(OWNER, name, name, mime, caption="这是什么错误？")
            got = await reply_to(tg, OWNER, before)
            assert "too many pixels" in got["text"] and "not an image" not in got["text"], got["text"]
        assert len(ollama.chats()) == chats and not daemon.parts.media._engines

    run(make(max_file_mb=20), tg, scenario)
