"""Voice messages when the daemon stops or dies under them: a real ``serve`` process with the
Telegram bot on the fake Bot API and the real speech engine (the ``speech`` extra). SIGTERM while
a clip is being transcribed stops it cleanly (exit status 0, within seconds), and a status
message left saying "Transcribing…" by a stop or a kill -9 says at the next start that it was
interrupted. The tests wait for what the daemon says (its log, its messages, the lock it waits
for), with generous deadlines."""

from __future__ import annotations

import fcntl
import signal
import sqlite3
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

pytest.importorskip("faster_whisper")

import media_files  # noqa: E402
from bot.chat.texts import INTERRUPTED, TRANSCRIBING  # noqa: E402
from fakes.telegram import FakeTelegram  # noqa: E402
from test_daemon_faults import Serve, serves, until  # noqa: E402,F401  (the fixture)

OWNER = 111
needs_espeak = pytest.mark.skipif(not media_files.has_espeak(), reason="espeak-ng is not installed (speech is made with it)")
SENTENCES = ("Restart the web server after you change its configuration file. Check the disk usage before you "
             "delete any old logs. The backup job runs every night and keeps thirty days of snapshots. ")


def with_telegram(serves, tmp_path: Path, tg: FakeTelegram, state_dir: Path | None = None) -> Serve:
    return serves(tmp_path, state_dir=state_dir, env={"LR_TG_TOKEN": tg.token}, extra=(
        "sync: {interval: 1h}\nlog_level: INFO\n"
        f"telegram: {{enabled: true, token_env: LR_TG_TOKEN, base_url: '{tg.base_url}', edit_interval: 0.3}}\n"
        f"users: [{{leanote_user_id: local, telegram_ids: [{OWNER}]}}]\n"
        "media: {language: en, piece: 30s, threads: 1, max_clip: 15m}\n"))


def status_message(tg: FakeTelegram, before: int) -> dict | None:
    """The bot's status message for the voice message sent after ``before`` of its messages to OWNER."""
    sent = tg.sent_to(OWNER)[before:]
    return sent[0] if sent else None


def in_flight(state_dir: Path) -> int:
    """The status messages the daemon keeps as in flight (``rag.media.inflight``)."""
    path = state_dir / "media.sqlite"
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            return db.execute("SELECT COUNT(*) FROM shown").fetchone()[0]
    except sqlite3.OperationalError:  # not made yet
        return 0


def polling_again(tg: FakeTelegram, polls: int) -> bool:
    return len(tg.method_calls("getUpdates")) > polls


@pytest.mark.slow
@needs_espeak
def test_sigterm_while_a_clip_is_transcribed_stops_cleanly_and_the_next_start_says_it_was_interrupted(tmp_path,
                                                                                                      serves):
    """It exited 134 ("terminate called without an active exception"): the engine was destroyed
    under the transcription still running in its thread as the interpreter ended."""
    with FakeTelegram() as tg:
        s = with_telegram(serves, tmp_path, tg)
        proc = s.start()
        until(lambda: tg.method_calls("getUpdates"), what="the bot to poll", proc=proc, log=s.log)
        # about 10 minutes: twenty 30 s pieces on one thread, a minute or more of hearing on any machine
        # after the model is loaded, so the stop below always comes while a piece is being heard (with a
        # 40 s clip, a quiet box had heard it all before the stop)
        tg.add_file("v-long", media_files.spoken(SENTENCES * 30))
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-long", duration=600)
        until(lambda: status_message(tg, before), what="the status message", proc=proc, log=s.log)
        assert status_message(tg, before)["text"] == TRANSCRIBING
        # the model is loaded in the clip's first step, which then hears its first piece
        until(lambda: "media: speech (faster-whisper) loaded" in s.text(), timeout=180, what="the model to load",
              proc=proc, log=s.log)
        took = s.stop(timeout=30)
        log = s.text()
        assert proc.returncode == 0, log[-3000:]
        assert took < 15 and "terminate called" not in log and "Traceback" not in log, (took, log[-3000:])
        status = status_message(tg, before)
        assert status["text"] == TRANSCRIBING  # its job was cut off: nothing came of it

        # the next start: the status message says it was interrupted, once
        polls = len(tg.method_calls("getUpdates"))
        again = with_telegram(serves, tmp_path, tg, state_dir=s.state_dir)
        proc = again.start()
        until(lambda: status["text"] == INTERRUPTED, what="the status message to say it was interrupted",
              proc=proc, log=again.log)
        until(lambda: polling_again(tg, polls), what="the bot to poll again", proc=proc, log=again.log)
        # the record goes once Telegram has answered the edit (the fake saw it a moment before)
        until(lambda: in_flight(s.state_dir) == 0, what="the record of the status message to go", proc=proc,
              log=again.log)
        assert again.stop() < 15 and proc.returncode == 0


@pytest.mark.slow
def test_a_kill_9_while_a_clip_waits_for_the_line_leaves_a_status_the_next_start_says_was_interrupted(tmp_path,
                                                                                                   serves):
    with FakeTelegram() as tg, ExitStack() as held:
        s = with_telegram(serves, tmp_path, tg)
        s.state_dir.mkdir(parents=True, exist_ok=True)
        # the media line's lock files held here (as by another process with the same state): the clip's
        # first step waits for them, and nothing comes of it before the kill
        for name in ("media.lock", "media.lock.quick"):
            handle = held.enter_context(open(s.state_dir / name, "a+"))
            fcntl.flock(handle, fcntl.LOCK_EX)
        proc = s.start()
        until(lambda: tg.method_calls("getUpdates"), what="the bot to poll", proc=proc, log=s.log)
        tg.add_file("v-short", media_files.tone(2.0))
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-short", duration=2)
        update = tg.updates[-1]["update_id"]
        until(lambda: status_message(tg, before) and in_flight(s.state_dir) == 1, what="the status message kept",
              proc=proc, log=s.log)
        until(lambda: tg.confirmed > update, what="the update to be confirmed", proc=proc, log=s.log)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        held.close()  # the locks let go
        status = status_message(tg, before)
        assert status["text"] == TRANSCRIBING

        again = with_telegram(serves, tmp_path, tg, state_dir=s.state_dir)
        proc = again.start()
        until(lambda: status["text"] == INTERRUPTED, what="the status message to say it was interrupted",
              proc=proc, log=again.log)
        # the record goes once Telegram has answered the edit (the fake saw it a moment before)
        until(lambda: in_flight(s.state_dir) == 0, what="the record of the status message to go", proc=proc,
              log=again.log)
        assert [t for _, t in status["edits"]][-1] == INTERRUPTED and len(tg.sent_to(OWNER)) == before + 1
        assert again.stop() < 15 and proc.returncode == 0
