"""A message that asks nothing, through the real doors: typed and said in Telegram, a clip given
to /ask in Discord. The reply says it is not a question, no LLM runs, no knowledge gap is left,
and "Save as note" under the reply makes it a note (the clip attached), once, for its sender
alone; a question, an imperative one too, is answered as before."""

from __future__ import annotations

import pytest

import media_files
import test_discord_capture
import test_telegram_capture
from conftest import until
from test_discord_capture import CHANNEL, GUILD, ONE, ROLE, TWO, inbox, link
from test_telegram import run as run_telegram
from test_telegram_capture import FRIEND, OWNER, link_id, reply_to

needs_speech = pytest.mark.skipif(not media_files.has_espeak(), reason="espeak-ng is not installed (speech is made with it)")
world = test_telegram_capture.world  # the Telegram daemon's fakes: Bot API, Leanote, Ollama
discord_world = test_discord_capture.world


def buttons(tg, message_id: int) -> list[tuple[str, str]]:
    return tg.buttons(message_id)


@pytest.mark.slow
def test_a_typed_reminder_in_telegram_is_not_asked_and_is_saved_as_a_note_by_its_button(world):
    make, tg, ollama, leanote = world

    async def scenario(daemon):
        chats = len(ollama.chats())
        before = len(tg.sent_to(OWNER))
        tg.say(OWNER, "Remind me to call the dentist tomorrow at 9")
        got = await reply_to(tg, OWNER, before)
        assert "isn't a question" in got["text"] and "Save it as a note?" in got["text"], got["text"]
        mid = next(m for m, x in tg.messages.items() if x is got)
        [(label, data)] = buttons(tg, mid)
        assert label == "Save as note / 存为笔记" and data.startswith("nq:")
        # the Chinese one too; and neither ran the LLM
        before = len(tg.sent_to(OWNER))
        tg.say(OWNER, "提醒我明天下午三点给牙医打电话")
        assert "这不是一个问题" in (await reply_to(tg, OWNER, before))["text"]
        assert len(ollama.chats()) == chats
        # no knowledge gap was left by either
        before = len(tg.sent_to(OWNER))
        tg.say(OWNER, "/gaps")
        listed = (await reply_to(tg, OWNER, before))["text"]
        assert "dentist" not in listed and "牙医" not in listed, listed

        # someone else cannot save it; its sender can, once
        query = tg.press(FRIEND, OWNER, mid, data)
        await until(lambda: tg.answered(query), 30, "the answer to the friend's press")
        assert "no longer kept" in tg.answered(query)[0]["text"] and not leanote.notes
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, OWNER, mid, data)
        receipt = await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "已记下" in m["text"]], 60,
                              "the receipt")
        note = leanote.notes[link_id(receipt[0]["text"], leanote)]
        assert "dentist" in note["Content"] and len(leanote.notes) == 1
        await until(lambda: buttons(tg, mid) == [], 30, "the button to go")

        # an imperative that asks is a question, answered from the notes
        ollama.reply("Use journalctl -u with the service name [1].")
        before = len(tg.sent_to(OWNER))
        tg.say(OWNER, "explain how to read the system journal")
        answer = await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "journalctl" in m["text"]
                                      and "Sources" in m["text"]], 60, "the answer")
        assert answer and len(ollama.chats()) == chats + 1

    run_telegram(make(), tg, scenario)


@pytest.mark.slow
@needs_speech
def test_a_voice_memo_that_asks_nothing_is_heard_not_asked_and_saved_with_its_clip(world):
    pytest.importorskip("faster_whisper")
    make, tg, ollama, leanote = world

    async def scenario(daemon):
        chats = len(ollama.chats())
        clip = media_files.spoken("Remind me to call the dentist tomorrow morning.")
        tg.add_file("v-remind", clip)
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-remind", duration=3)
        offer = await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "isn't a question" in m["text"]], 90,
                            "the reply to the memo")
        status = tg.sent_to(OWNER)[before]
        assert status["text"].startswith("🎙 「") and "dentist" in status["text"].lower(), status["text"]
        assert len(ollama.chats()) == chats  # the LLM never ran
        mid = next(m for m, x in tg.messages.items() if x is offer[0])
        [(_, data)] = buttons(tg, mid)
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, OWNER, mid, data)
        receipt = await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "已记下" in m["text"]], 60,
                              "the receipt")
        note = leanote.notes[link_id(receipt[0]["text"], leanote)]
        assert "dentist" in note["Content"].lower() and "Transcribed from the voice message" in note["Content"]
        assert [f["Data"] for f in leanote.files.values() if f["NoteId"] == note["NoteId"]] == [clip]

    run_telegram(make(), tg, scenario)


@pytest.mark.slow
@needs_speech
def test_a_clip_asked_in_discord_that_asks_nothing_offers_save_as_note(discord_world):
    pytest.importorskip("faster_whisper")
    from test_discord_capture import press, run

    fake, ollama, leanote = discord_world.fake, discord_world.ollama, discord_world.leanote

    async def scenario(daemon):
        chats = len(ollama.chats())
        clip = fake.upload("voice-message.ogg", media_files.spoken("Remind me to call the dentist tomorrow morning."),
                           "audio/ogg", channel_id=CHANNEL)
        it = fake.slash(ONE, "ask", {"file": clip, "private": False}, guild_id=GUILD, channel_id=CHANNEL,
                        roles=[ROLE])  # public: another person sees the button too
        await until(lambda: it.buttons() and not it.thinking(), 90, "the reply with its button")
        shown = it.texts()[-1]
        assert shown.startswith("🎙 「") and "isn't a question" in shown, shown
        assert len(ollama.chats()) == chats and not it.final_embeds()
        message = it.last_message()
        [button] = message.buttons()
        assert button["label"] == "Save as note / 存为笔记"
        _, text = await press(fake, TWO, message, button["custom_id"])
        assert "no longer kept" in text and inbox(leanote) == []
        _, text = await press(fake, ONE, message, button["custom_id"])
        await until(lambda: inbox(leanote), 30, "the note")
        note = inbox(leanote)[-1]
        assert "dentist" in note["Content"].lower() and note["Files"]
        assert link(leanote, note) in text or "已记下" in text

    run(discord_world.settings(), fake, scenario)
