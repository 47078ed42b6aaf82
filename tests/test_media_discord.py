"""Voice clips and images through the real Discord door: the daemon's discord.py client on
the fake Discord (REST, gateway, CDN), the real speech and OCR engines, a fake Ollama and a
fake Leanote; clips and images are made here (``media_files``)."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("faster_whisper")
pytest.importorskip("rapidocr_onnxruntime")

import media_files  # noqa: E402
from bot.chat.texts import INTERRUPTED  # noqa: E402
from rag.media.inflight import InFlight  # noqa: E402
import test_discord_capture  # noqa: E402
from conftest import until  # noqa: E402
from fakes.discord import embed_text  # noqa: E402
from test_discord_capture import CHANNEL, GUILD, ONE, ROLE, inbox, link, run, save_menu  # noqa: E402

world = test_discord_capture.world  # the fixture: the fake Discord, Ollama and Leanote

needs_espeak = pytest.mark.skipif(not media_files.has_espeak(), reason="espeak-ng is not installed (speech is made with it)")


def slash(fake, name, options):
    return fake.slash(ONE, name, options, guild_id=GUILD, channel_id=CHANNEL, roles=[ROLE])


@pytest.mark.slow
@needs_espeak
def test_a_voice_clip_asked_shows_its_words_above_the_answer_and_a_saved_voice_message_becomes_a_note(world):
    fake, ollama, leanote = world.fake, world.ollama, world.leanote

    async def scenario(daemon):
        # /ask with a voice clip: the words on one line above the answer from the notes
        clip = fake.upload("voice-message.ogg", media_files.spoken("How do I read the system journal?"), "audio/ogg",
                           channel_id=CHANNEL)
        ollama.reply("Use journalctl [1].")
        it = slash(fake, "ask", {"file": clip})
        await until(lambda: it.final_embeds() and not it.thinking(), 90, "the answer")
        first = it.messages()[0]
        assert first.content.startswith("🎙 「") and "journal" in first.content.lower(), first.content
        assert "Reading systemd journal logs" in embed_text(it.final_embeds()[-1])
        assert "journal" in ollama.chats()[-1]["messages"][-1]["content"].lower()

        # "Save to Leanote" on a voice message: a note whose text is what was said, the clip attached
        voice = fake.upload("voice-message.ogg", media_files.spoken("Buy a new router for the study."), "audio/ogg",
                            channel_id=CHANNEL)
        message = fake.user_message(ONE, "", channel_id=CHANNEL, guild_id=GUILD, attachments=[voice])
        it, text = await save_menu(fake, ONE, message, timeout=90)  # (hearing it: seconds on a busy box)
        await until(lambda: "已记下" in it.texts()[-1], 90, "the receipt")
        note = inbox(leanote)[-1]
        assert link(leanote, note) in it.texts()[-1]
        assert "router" in note["Content"].lower() and "Transcribed from the voice message" in note["Content"]
        assert note["Files"]

    run(world.settings(), fake, scenario)


@pytest.mark.slow
def test_an_image_asked_or_noted_is_read_and_what_is_neither_is_refused(world):
    fake, ollama, leanote = world.fake, world.ollama, world.leanote

    async def scenario(daemon):
        # /note with a screenshot: the image attached, its text under it, marked as recognised
        shot = fake.upload("shot.png", media_files.text_png(["ConnectionTimeout after 30 seconds"]), "image/png",
                           channel_id=CHANNEL)
        it = slash(fake, "note", {"text": "上传报错", "file": shot})  # (reading it may load the model first)
        await until(lambda: it.answered() and not it.thinking() and "已记下" in it.texts()[-1], 90, "the receipt")
        note = inbox(leanote)[-1]
        assert note["Content"].index("getImage") < note["Content"].index("Recognised text") \
            < note["Content"].index("ConnectionTimeout")

        # /ask with an image and a question: the image's text shown, the question asked with it
        page = fake.upload("page.png", media_files.text_png(["$ journalctl -u caddy -f"]), "image/png",
                           channel_id=CHANNEL)
        ollama.reply("journalctl -u caddy -f [1].")
        it = slash(fake, "ask", {"question": "这个命令我的笔记里有吗？", "file": page})
        await until(lambda: it.final_embeds() and not it.thinking(), 90, "the answer")
        assert it.messages()[0].content.startswith("🔎 「") and "caddy" in it.messages()[0].content
        asked = ollama.chats()[-1]["messages"][-1]["content"]
        assert "这个命令我的笔记里有吗" in asked and "journalctl" in asked

        # a file that is neither a clip nor an image: refused before it is downloaded
        doc = fake.upload("minutes.pdf", b"%PDF-1.4", "application/pdf", channel_id=CHANNEL)
        downloads = len(fake.downloads)
        it = slash(fake, "ask", {"question": "这是什么？", "file": doc})
        await until(lambda: it.answered(), 30, "the refusal")
        assert "neither" in it.texts()[-1] and it.ephemeral and len(fake.downloads) == downloads

    run(world.settings(), fake, scenario)


@pytest.mark.slow
def test_a_decode_bomb_asked_about_is_too_long_and_a_response_a_stop_cut_off_says_so_at_the_next_start(world):
    """``/ask file:`` with an 83-minute Matroska file in 10 MB: "too long", from its header, nothing
    loaded. A clip waiting in the line when the daemon stops: the next start edits its response to
    say it was interrupted (the response would say "in line" forever)."""
    fake = world.fake
    settings = world.settings(capture={"max_file_mb": 20})
    cut_off = {}

    async def first(daemon):
        bomb = fake.upload("voice-message.ogg", media_files.matroska_pcm(1, 5_000_000, 1000), "audio/ogg",
                           channel_id=CHANNEL)
        it = slash(fake, "ask", {"file": bomb})
        await until(lambda: it.answered() and not it.thinking() and "Too long" in it.texts()[-1], 60, "the refusal")
        assert "at most 60 s" in it.texts()[-1] and not daemon.parts.media._engines
        # the line busy with someone else's job (held here) when the daemon stops
        gate = threading.Event()

        def someone_elses():
            yield lambda: gate.wait(60)

        daemon.parts.media.line.submit("discord:999", someone_elses(), quick=True)
        clip = fake.upload("voice-message.ogg", media_files.tone(2.0), "audio/ogg", channel_id=CHANNEL)
        cut_off["it"] = it = slash(fake, "ask", {"file": clip})
        await until(lambda: it.texts() and "ahead of you" in it.texts()[-1], 60, "its place in line")
        cut_off["gate"] = gate

    try:
        run(settings, fake, first)
    finally:
        if "gate" in cut_off:
            cut_off["gate"].set()
    it = cut_off["it"]
    assert "ahead of you" in it.texts()[-1]

    # and one left by a run an hour ago: its response can no longer be edited, a direct message says it
    old = InFlight(settings.state_dir / "media.sqlite", clock=lambda: time.time() - 3600)
    old.shown("discord", f"discord:{ONE}", {"application_id": 1, "token": "gone", "user_id": ONE})
    old.close()

    async def second(daemon):
        await until(lambda: it.texts()[-1] == INTERRUPTED, 60, "the response to say it was interrupted")
        await until(lambda: fake.dms.get(ONE), 60, "the direct message")
        assert fake.dms[ONE] == [f"/ask: {INTERRUPTED}"]
        assert not daemon.parts.media.in_flight.left("discord")

    run(settings, fake, second)
