"""Capture into a folder of notes (``source.kind: files``, no Leanote): through the real daemon
and the real python-telegram-bot Application talking to a fake Bot API, over a private copy of
the sample notes. Each capture is a Markdown file in the folder (the inbox notebook a sub-folder),
written once, never over a person's file, found by the next pass (the watcher's) and searchable."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from rag.capture import MARKER_RE
from sync.sources.files import _front_matter, stable_id

from conftest import make_settings
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram, visible
from test_telegram import final, until
from test_telegram_capture import reply_to, said

OWNER, FRIEND, OTHER = 111, 222, 333
PNG = b"\x89PNG\r\n\x1a\n" + b"pixels" * 50


@pytest.fixture
def folder_world(tmp_path, notes_dir, monkeypatch):
    monkeypatch.setenv("LR_TG_TOKEN", "123:TEST")
    with FakeTelegram() as tg, FakeOllama() as ollama:
        settings = make_settings(
            tmp_path, source={"kind": "files", "path": str(notes_dir)},
            telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url, "edit_interval": 0.3},
            users=[{"leanote_user_id": "local", "telegram_ids": [OWNER], "admin": True},
                   {"leanote_user_id": "local", "telegram_ids": [FRIEND]},
                   {"leanote_user_id": "someone-else", "telegram_ids": [OTHER]}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, media={"speech": "off", "ocr": "off"},
            # no pass asked for by a write: the watcher alone sees the new file
            sync={"interval": "1h", "trigger_debounce": "0.1s", "watch_debounce": "0.2s"},
            capture={"sync_after": "1h", "rate_limit": 60, "max_file_mb": 1},
        )
        yield settings, tg, ollama, notes_dir


def run_with_watcher(settings, tg, scenario):
    from bot.serve import Daemon
    from bot.telegram import service
    from conftest import SCENARIO, within
    from sync.watch import watch

    async def main():
        daemon = Daemon(settings, services=[service, watch])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(lambda: tg.method_calls("getUpdates"))
            await within(scenario(daemon), "the scenario", SCENARIO)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())


def shown_path(text: str) -> str:
    """The file a receipt names (its path relative to the folder), as the message shows it."""
    m = re.search(r"(Inbox/[^\n]+?\.md)", visible(text))
    assert m, text
    return m.group(1)


def marked(path: Path) -> list[str]:
    return MARKER_RE.findall(path.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_notes_appends_memory_and_photos_become_files_in_the_folder_searchable_within_seconds(folder_world):
    settings, tg, ollama, notes = folder_world

    async def scenario(daemon):
        # /note: a Markdown file in the Inbox sub-folder, named by the title, tags in its front matter
        got = await said(tg, OWNER, "/note 买一个新的路由器 #home #todo\n旧的那台总掉线，书房信号差")
        assert "已记下" in got["text"], got["text"]
        rel = shown_path(got["text"])
        assert rel == "Inbox/买一个新的路由器.md"
        first = notes / rel
        text = first.read_text(encoding="utf-8")
        meta = _front_matter(text)
        assert meta["title"] == "买一个新的路由器" and {"home", "todo", "captured"} <= set(meta["tags"])
        assert "旧的那台总掉线" in text and len(marked(first)) == 1

        # the watcher sees it, the pass indexes it (no pass is asked for by the write here): /search
        # finds it, by its path in the folder and the lines that match
        await until(lambda: daemon.parts.read_state(lambda state: state.note(stable_id(f"file:{rel}"))), 60,
                    "the file indexed")
        hit = (await said(tg, OWNER, "/search 书房信号差"))["text"]
        assert "Inbox/买一个新的路由器.md" in hit and "书房信号差" in hit and "%E" not in hit, hit

        # the same title again: a second file beside it, the first untouched
        got = await said(tg, OWNER, "/note 买一个新的路由器\n要带 Wi-Fi 6")
        assert shown_path(got["text"]) == "Inbox/买一个新的路由器 (2).md"
        assert first.read_text(encoding="utf-8") == text

        # a person's own file of that name is never overwritten
        mine = notes / "Inbox" / "周末计划.md"
        mine.write_text("# 周末计划\n\n我自己写的\n", encoding="utf-8")
        got = await said(tg, OWNER, "/note 周末计划\n去爬山")
        assert shown_path(got["text"]) == "Inbox/周末计划 (2).md"
        assert mine.read_text(encoding="utf-8") == "# 周末计划\n\n我自己写的\n"

        # /append onto the last capture, keeping an edit the person made meanwhile
        last = notes / "Inbox" / "周末计划 (2).md"
        last.write_text(last.read_text(encoding="utf-8") + "\n我后来加的一行\n", encoding="utf-8")
        got = await said(tg, OWNER, "/append 带上水和雨衣")
        assert "已追加" in got["text"] and shown_path(got["text"]) == "Inbox/周末计划 (2).md"
        body = last.read_text(encoding="utf-8")
        assert "我后来加的一行" in body and body.index("我后来加的一行") < body.index("带上水和雨衣")
        assert len(marked(last)) == 2

        # /remember: a dated line in the person's own memory note; another person gets their own
        got = await said(tg, OWNER, "/remember 车停在 B2")
        memory = notes / shown_path(got["text"])
        got = await said(tg, FRIEND, "/remember 钥匙在抽屉里")
        assert notes / shown_path(got["text"]) != memory
        assert "车停在 B2" in memory.read_text(encoding="utf-8")
        assert "钥匙在抽屉里" not in memory.read_text(encoding="utf-8")

        # a photo with /note: the image beside the note, linked relatively; the same message again: no second file
        tg.add_file("photo-1", PNG)
        sent = tg.send_photo(OWNER, "photo-1", caption="/note 白板照片 #会议")
        got = await until(lambda: [m for m in tg.sent_to(OWNER) if "白板照片" in m["text"]])
        photo_note = notes / shown_path(got[0]["text"])
        link = re.search(r"!\[[^\]]*\]\(([^)]+)\)", photo_note.read_text(encoding="utf-8"))
        assert link and "/" not in link.group(1), photo_note.read_text(encoding="utf-8")
        assert (photo_note.parent / unquote(link.group(1))).read_bytes() == PNG
        files = sorted(p.name for p in (notes / "Inbox").iterdir())
        before = len(tg.sent_to(OWNER))
        tg.send_again(sent)
        again = await reply_to(tg, OWNER, before)
        assert "Already saved" in again["text"] and sorted(p.name for p in (notes / "Inbox").iterdir()) == files

        # someone mapped to another user than the folder's: told why, nothing written
        got = await said(tg, OTHER, "/note 不该写进去")
        assert "someone-else" in got["text"] and not [p for p in (notes / "Inbox").iterdir() if "不该" in p.name]
        assert not list((notes / "Inbox").glob(".*"))  # no temporary file left behind

    run_with_watcher(settings, tg, scenario)


@pytest.mark.slow
def test_save_as_note_writes_the_answer_into_the_folder_once(folder_world):
    settings, tg, ollama, notes = folder_world

    async def scenario(daemon):
        ollama.reply("先把鸡蛋炒好盛出，再下番茄，最后加一小勺糖[1]。")
        tg.say(OWNER, "番茄炒蛋怎么做才不酸？")
        done = (await until(lambda: final(tg, OWNER, "来源")))[0]
        mid = next(i for i, m in tg.messages.items() if m is done)
        assert "生活/菜谱/番茄炒蛋.md" in done["text"]  # a folder note's source names its file
        save = next(data for _, data in tg.buttons(mid) if data.startswith("save:"))
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, OWNER, mid, save)
        got = await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "已保存" in m["text"]])
        path = notes / shown_path(got[0]["text"])
        assert path.name == "番茄炒蛋怎么做才不酸？.md" and "最后加一小勺糖" in path.read_text(encoding="utf-8")
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, OWNER, mid, save)
        again = await reply_to(tg, OWNER, before)
        assert "Already saved" in again["text"] and "番茄炒蛋怎么做才不酸" in again["text"]
        assert len(list((notes / "Inbox").glob("*.md"))) == 1

    run_with_watcher(settings, tg, scenario)


# --- exactly once, across a kill ------------------------------------------------------------------

CHILD = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from conftest import capture_alone, make_settings
settings = make_settings(Path({tmp!r}), source={{"kind": "files", "path": {notes!r}}})
cap = capture_alone(settings)
async def main():
    stop = asyncio.Event()
    asyncio.create_task(cap.run(stop))
    await cap.note("telegram:111", "local", "kill -9 之前写好的\\n正文", once="telegram:111:7")
    await asyncio.sleep(60)
asyncio.run(main())
"""
# Holds the child inside the outbox's "written" update (after the file is in the folder): 4^14
# rows counted, seconds of CPU, as SQLite runs a trigger's query to its end; the test kills the
# child as soon as the file is there.
STALL = """
CREATE TABLE stall_rows (n INTEGER);
INSERT INTO stall_rows VALUES (1), (2), (3), (4);
CREATE TRIGGER stall BEFORE UPDATE OF state ON items WHEN NEW.state = 'done' BEGIN
  SELECT count(*) FROM stall_rows a, stall_rows b, stall_rows c, stall_rows d, stall_rows e, stall_rows f,
    stall_rows g, stall_rows h, stall_rows i, stall_rows j, stall_rows k, stall_rows l, stall_rows m, stall_rows n;
END;
"""


def test_a_kill_between_the_file_and_the_outbox_makes_no_second_file(tmp_path, notes_dir):
    """The file is in the folder, the process is killed (SIGKILL) before the outbox says so:
    started again, the capture is found by its marker, not written a second time, and the same
    message again answers with that file."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    from conftest import REPO, capture_alone
    from sync.writeback.outbox import Outbox

    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)})
    Outbox.open_for(settings).close()  # made, so the stall can be put in before the child writes
    db = sqlite3.connect(settings.state_dir / "capture.sqlite")
    db.executescript(STALL)
    db.close()
    inbox = notes_dir / "Inbox"
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(REPO / "tests"), tmp=str(tmp_path),
                                                                   notes=str(notes_dir))],
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 90
        while not list(inbox.glob("*.md")) and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.02)
        assert list(inbox.glob("*.md")), "the child wrote no file"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    db = sqlite3.connect(settings.state_dir / "capture.sqlite")
    db.executescript("DROP TRIGGER stall; DROP TABLE stall_rows;")
    db.close()
    cap = capture_alone(settings)
    try:
        [item] = cap.pending("telegram:111")
        assert item.state == "sending"  # the kill came before the outbox heard of the file
        asyncio.run(cap.drain())
        assert cap.pending("telegram:111") == []
        [note] = list(inbox.glob("*.md"))
        assert note.name == "kill -9 之前写好的.md" and len(marked(note)) == 1
        assert not list(inbox.glob(".*"))  # no temporary file left
        again = asyncio.run(cap.note("telegram:111", "local", "kill -9 之前写好的\n正文", once="telegram:111:7"))
        assert again.again and "Inbox/kill -9 之前写好的.md" in again.message
        assert [p.name for p in inbox.glob("*.md")] == [note.name]
    finally:
        cap.close()


# --- nowhere to write ------------------------------------------------------------------------------

def test_without_a_capture_target_the_bots_offer_no_capture_and_say_why(tmp_path, monkeypatch):
    """A mongodump backup and no capture.accounts: no "Save as note", no ✍️, no capture commands
    in the menu; /help and /note say why in one reply, a voice /note before anything is fetched."""
    from test_mongodump import U1, make_dump
    from test_telegram import run

    make_dump(tmp_path / "backup")
    monkeypatch.setenv("LR_TG_TOKEN", "123:TEST")
    with FakeTelegram() as tg, FakeOllama() as ollama:
        settings = make_settings(
            tmp_path, source={"kind": "mongodump", "path": str(tmp_path / "backup")},
            telegram={"enabled": True, "token_env": "LR_TG_TOKEN", "base_url": tg.base_url, "edit_interval": 0.3},
            users=[{"leanote_user_id": str(U1), "telegram_ids": [OWNER], "admin": True}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, sync={"interval": "1h"})

        async def scenario(daemon):
            names = [c["command"] for c in tg.commands]
            assert "ask" in names and not {"note", "append", "remember", "save", "outbox"} & set(names)
            got = await said(tg, OWNER, "/help")
            assert "/note" not in got["text"] and "mongodump" in got["text"] and "capture.accounts" in got["text"]
            for command in ("/note 记一下", "/append 再加一句", "/remember 车位 B2", "/outbox"):
                got = await said(tg, OWNER, command)
                assert "read-only" in got["text"] and "capture.accounts" in got["text"], (command, got["text"])
            tg.add_file("v-1", b"OggS" + b"\x00" * 200)
            before = len(tg.sent_to(OWNER))
            tg.send_voice(OWNER, "v-1", duration=2, caption="/note")
            got = await reply_to(tg, OWNER, before)
            assert "read-only" in got["text"] and "v-1" not in tg.downloads  # said before it is fetched, or heard
            await asyncio.sleep(0.3)
            assert len(tg.sent_to(OWNER)) == before + 1  # one reply: why

            # an answer from the notes: 👍 👎 Why?, no "Save as note"
            ollama.reply("核心参数可以动态调整[1]。")
            tg.say(OWNER, "线程池的核心参数能动态调整吗？")
            done = (await until(lambda: final(tg, OWNER, "来源")))[0]
            mid = next(i for i, m in tg.messages.items() if m is done)
            assert [t for t, _ in tg.buttons(mid)] == ["👍", "👎", "Why? / 依据"]
            # a question the notes cannot answer is a gap: /gaps offers ✖ only
            tg.say(OWNER, "火星有几颗卫星，分别叫什么？")
            await until(lambda: daemon.parts.gaps_if_made() and daemon.parts.gaps.gaps(f"telegram:{OWNER}", str(U1)), 30,
                        "the gap")
            got = await said(tg, OWNER, "/gaps")
            mid = next(i for i, m in tg.messages.items() if m is got)
            assert tg.buttons(mid) and all(not data.startswith("gap:w") for _, data in tg.buttons(mid))

        run(settings, tg, scenario)


def test_doctor_names_the_capture_target(tmp_path, notes_dir):
    from bot.cli.doctor import _capture

    [check] = _capture(make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)}))
    assert check.ok and not check.warn and str(notes_dir) in check.detail and "Inbox/" in check.detail
    [check] = _capture(make_settings(tmp_path, source={"kind": "mongodump", "path": str(tmp_path)}))
    assert check.ok and check.warn and "read-only" in check.detail and "capture.accounts" in check.fix
    [check] = _capture(make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)},
                                     capture={"accounts": [{"email": "me@example.com", "password_env": "LR_PW"}]}))
    assert check.ok and "into Leanote" in check.detail and "me@example.com" in check.detail


def test_file_names_from_titles_are_safe_everywhere():
    from sync.writeback.folder import safe_name

    assert safe_name("记住的事 / Remembered") == "记住的事 - Remembered"
    assert safe_name("..hidden?") == "hidden" and safe_name('a*b?"c<d>') == "abcd"  # never a hidden file
    assert safe_name("a:b|c\\d") == "a - b - c - d"
    assert safe_name("CON") == "CON_" and safe_name("   ") == "note" and safe_name("...") == "note"
    long = safe_name("很长的标题" * 40)
    assert len(long.encode("utf-8")) <= 150 and long.startswith("很长的标题")


# --- the command line and the API ------------------------------------------------------------------

def test_the_command_lines_note_writes_into_the_folder_with_or_without_a_daemon(tmp_path, notes_dir, capsys):
    """`leanote-rag note` without a daemon writes the file itself; with one, through its API
    (POST /note): the same file, the same receipt, once per --once id; the daemon's pass makes
    it searchable."""
    import uuid

    from bot.cli import main
    from bot.serve import Daemon
    from conftest import within

    sock = Path(f"/tmp/lr-note-{uuid.uuid4().hex[:8]}.sock")
    cfg = tmp_path / "notes.yaml"
    cfg.write_text(f"source: {{kind: files, path: '{notes_dir}'}}\nstate_dir: '{tmp_path / 'data'}'\n"
                   f"ollama: {{enabled: false}}\nrerank: {{kind: none}}\napi: {{socket: '{sock}'}}\n"
                   f"capture: {{sync_after: 0.2s}}\nsync: {{interval: 1h, watch: false}}\n", encoding="utf-8")
    assert main(["--config", str(cfg), "index"]) == 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "note", "路由器密码改了 #家里\n新密码写在抽屉里的卡片上", "--once", "a"]) == 0
    out = capsys.readouterr().out
    assert "已记下 ✅ Inbox/路由器密码改了.md" in out and "leanote-rag index" in out
    path = notes_dir / "Inbox" / "路由器密码改了.md"
    assert "家里" in _front_matter(path.read_text(encoding="utf-8"))["tags"]
    assert main(["--config", str(cfg), "note", "路由器密码改了 #家里\n新密码写在抽屉里的卡片上", "--once", "a"]) == 0
    assert "Already saved: Inbox/路由器密码改了.md" in capsys.readouterr().out
    assert main(["--config", str(cfg), "note", "  "]) == 2  # nothing to note: said, nothing written
    assert "What should I note" in capsys.readouterr().err
    assert [p.name for p in (notes_dir / "Inbox").iterdir()] == ["路由器密码改了.md"]

    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)}, ollama={"enabled": False},
                             rerank={"kind": "none"}, api={"socket": str(sock)}, capture={"sync_after": "0.2s"},
                             sync={"interval": "1h", "watch": False})

    async def scenario():
        daemon = Daemon(settings, services=[])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await until(lambda: sock.exists(), what="the API's socket")
            code = await asyncio.to_thread(main, ["--config", str(cfg), "note", "--title", "车位", "停在 B2 区 17 号"])
            out = capsys.readouterr().out
            assert code == 0 and "已记下 ✅ Inbox/车位.md" in out and "leanote-rag index" not in out, out
            code = await asyncio.to_thread(main, ["--config", str(cfg), "note", "路由器密码改了", "--once", "a"])
            out = capsys.readouterr().out  # the same --once through the daemon: the note written before
            assert code == 0 and "Already saved: Inbox/路由器密码改了.md" in out, out
            assert sorted(p.name for p in (notes_dir / "Inbox").iterdir()) == ["路由器密码改了.md", "车位.md"]

            async def found():
                code = await asyncio.to_thread(main, ["--config", str(cfg), "search", "车停在哪个区", "-k", "1"])
                return code == 0 and "车位" in capsys.readouterr().out

            for _ in range(100):
                if await found():
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the note written through the daemon was never found")
        finally:
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    try:
        asyncio.run(scenario())
    finally:
        sock.unlink(missing_ok=True)


# --- journeys on a folder install ------------------------------------------------------------------

NGINX_Q = "How do I configure nginx rate limiting?"


@pytest.mark.slow
def test_a_gap_written_with_its_button_becomes_a_file_that_answers_it(folder_world):
    """Asked, refused, /gaps, ✍️, the text sent: a file named by the question in the folder's
    Inbox, indexed after the watcher sees it; the gap closes and the question is answered."""
    settings, tg, ollama, notes = folder_world

    async def scenario(daemon):
        tg.say(OWNER, NGINX_Q)
        store = lambda: daemon.parts.gaps_if_made()  # noqa: E731
        await until(lambda: store() and store().gaps(f"telegram:{OWNER}", "local"), 30, "the gap")
        [gap] = store().gaps(f"telegram:{OWNER}", "local")
        listed = await said(tg, OWNER, "/gaps")
        mid = next(i for i, m in tg.messages.items() if m is listed)
        assert ("✍️ 1", f"gap:w:{gap.id}") in tg.buttons(mid)
        before = len(tg.sent_to(OWNER))
        tg.press(OWNER, OWNER, mid, f"gap:w:{gap.id}")
        await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "becomes the note" in m["text"]])
        got = await said(tg, OWNER, "To configure rate limiting in nginx, define a zone with limit_req_zone "
                                    "$binary_remote_addr zone=one:10m rate=5r/s; and use limit_req zone=one burst=10.")
        assert "已记下" in got["text"], got["text"]
        path = notes / shown_path(got["text"])
        assert path.name == "How do I configure nginx rate limiting.md"
        assert _front_matter(path.read_text(encoding="utf-8"))["title"] == gap.question
        told = await until(lambda: [m for m in tg.sent_to(OWNER) if "now answers" in m["text"]], 60,
                           "the gap closed by the file")
        assert gap.question in told[0]["text"]
        ollama.reply("Define a zone with limit_req_zone and use limit_req zone=one burst=10 [1].")
        tg.say(OWNER, NGINX_Q)
        answered = await until(lambda: [m for m in tg.sent_to(OWNER) if "来源" in m["text"] or "Sources" in m["text"]],
                               60, "the answer")
        assert "Inbox/How do I configure nginx rate limiting.md" in answered[-1]["text"]

    run_with_watcher(settings, tg, scenario)


@pytest.mark.slow
def test_a_voice_note_is_captured_into_the_folder_with_its_clip(folder_world):
    pytest.importorskip("faster_whisper")
    import media_files

    if not media_files.has_espeak():
        pytest.skip("espeak-ng is not installed (speech is made with it)")
    settings, tg, ollama, notes = folder_world
    settings = settings.model_copy(update={"media": settings.media.model_copy(update={"speech": "faster-whisper"})})

    async def scenario(daemon):
        clip = media_files.spoken("Note, buy a new router for the study.")
        tg.add_file("v-note", clip)
        before = len(tg.sent_to(OWNER))
        tg.send_voice(OWNER, "v-note", duration=3)
        receipt = await until(lambda: [m for m in tg.sent_to(OWNER)[before:] if "已记下" in m["text"]], 120,
                              "the receipt")
        path = notes / shown_path(receipt[0]["text"])
        text = path.read_text(encoding="utf-8")
        assert "router" in text.lower() and "Transcribed from the voice message" in text
        link = re.search(r"\[[^\]]*\]\(([^)]+\.ogg)\)", text)
        assert link and (path.parent / unquote(link.group(1))).read_bytes() == clip

    run_with_watcher(settings, tg, scenario)
