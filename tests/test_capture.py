"""Capture into Leanote (sync.writeback.capture): the real Capture and outbox (SQLite) against a
fake Leanote speaking the real write API, and end to end through the daemon: a
capture is written once, in order, never over someone's edit, waits while Leanote
is down, and is answered from after the pass it triggers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from rag.capture import Attachment, Origin, compose, hashtags, title_of
from sync.writeback.capture import Capture
from sync.writeback.outbox import FILE, Outbox

from conftest import capture_alone, REPO, SCENARIO, make_settings, within
from fakes.leanote import FakeLeanote

ME = "5dbed2987db161bc2a85b919"
OTHER = "5dbed2987db161bc2a85b920"
PERSON = "telegram:111"


@pytest.fixture
def leanote(monkeypatch):
    monkeypatch.setenv("LR_PW_ME", "me-secret")
    monkeypatch.setenv("LR_PW_OTHER", "other-secret")
    with FakeLeanote() as fake:
        fake.add_user(ME, "me@example.com", "me-secret")
        fake.add_user(OTHER, "other@example.com", "other-secret")
        yield fake


def settings_for(tmp_path, fake, **capture):
    return make_settings(
        tmp_path, leanote={"base_url": fake.url},
        capture={"accounts": [{"email": "me@example.com", "password_env": "LR_PW_ME"}],
                 "retry_min": "0.05s", "retry_max": "0.2s", **capture})


def capture_for(settings) -> Capture:
    written = []
    cap = capture_alone(settings, on_written=lambda: written.append(time.time()))
    cap.written = written
    return cap


def notes_of(fake, user_id=ME) -> list[dict]:
    return sorted((n for n in fake.notes.values() if n["UserId"] == user_id), key=lambda n: n["Usn"])


def books_titled(fake, title, user_id=ME) -> list[dict]:
    return [b for b in fake.notebooks.values() if b["UserId"] == user_id and b["Title"] == title and not b["IsDeleted"]]


def status_of(tmp_path) -> dict:
    from bot.root import Parts
    from bot.usecases.status import status_report

    settings = make_settings(tmp_path)
    with Parts(settings) as parts:
        return status_report(settings, parts.state, None, outbox=parts.outbox_if_made())


def drive(cap: Capture, coro):
    """Run a capture call with the capture's background writer running, as in the daemon."""
    async def main():
        stop = asyncio.Event()
        writer = asyncio.create_task(cap.run(stop))
        try:
            return await within(coro, "the capture's receipt")
        finally:
            stop.set()
            await within(writer, "the capture writer to stop", 30)
    return asyncio.run(main())


# --- what a capture becomes -----------------------------------------------------------------

def test_title_tags_and_origin_of_a_capture():
    text = "# 路由器密码改了 #家里 #网络\n新密码在 1Password 里。 `#not-a-tag` http://x/#frag"
    assert title_of(text) == "路由器密码改了"  # the tags are the note's tags, not its title
    assert title_of("#家里 #网络\n周末换了路由器") == "周末换了路由器"  # a line of tags alone is no title
    assert title_of("买了 #咖啡豆 两包") == "买了 两包"
    assert hashtags(text) == ["家里", "网络"]
    when = time.struct_time((2026, 11, 30, 9, 5, 0, 0, 334, 0))
    from datetime import datetime
    draft = compose(text, extra_tags=["captured", "网络"],
                    origin=Origin("Alice", "Home ops", datetime(*when[:6]), "https://t.me/homeops/12"))
    assert draft.tags == ["家里", "网络", "captured"]
    assert "转发自 / Forwarded from: Alice · 「Home ops」 · 2026-11-30 09:05 — https://t.me/homeops/12" in draft.content
    assert title_of("x" * 100).endswith("…") and len(title_of("x" * 100)) == 60


# --- written once, into the inbox ------------------------------------------------------------

def test_a_note_lands_in_the_inbox_created_once_with_its_tags(tmp_path, leanote):
    cap = capture_for(settings_for(tmp_path, leanote))
    try:
        first = drive(cap, cap.note(PERSON, ME, "路由器密码改了 #家里\n新密码在保险箱"))
        second = drive(cap, cap.note(PERSON, ME, "第二条"))
    finally:
        cap.close()
    assert first.status == "written" and first.url == f"{leanote.url}/note/{first.note_id}"
    assert first.url in first.message and second.status == "written"
    assert len(books_titled(leanote, "Inbox")) == 1  # created by the first, found by the second
    note = leanote.notes[first.note_id]
    assert note["Title"] == "路由器密码改了" and note["Tags"] == ["家里", "captured"]  # the tag is a tag, not title
    assert note["IsMarkdown"] and "新密码在保险箱" in note["Content"] and "<!-- leanote-rag:" in note["Content"]
    assert len(cap.written) == 2


def test_an_attachment_and_an_image_go_with_the_note(tmp_path, leanote):
    cap = capture_for(settings_for(tmp_path, leanote))
    try:
        receipt = drive(cap, cap.note(PERSON, ME, "发票", files=[
            Attachment("scan.png", b"\x89PNG fake", "image/png"), Attachment("invoice.pdf", b"%PDF-1.4", "application/pdf")]))
    finally:
        cap.close()
    note = leanote.notes[receipt.note_id]
    assert [f["IsAttach"] for f in note["Files"]] == [False, True]
    ids = [f["FileId"] for f in note["Files"]]
    assert f"getImage?fileId={ids[0]}" in note["Content"] and f"getAttach?fileId={ids[1]}" in note["Content"]


def test_limits_and_a_source_without_an_api_account(tmp_path, leanote):
    settings = settings_for(tmp_path, leanote, max_chars=100, rate_limit=2, max_file_mb=0.001)
    cap = capture_for(settings)
    try:
        assert "too long" in drive(cap, cap.note(PERSON, ME, "长" * 101)).message.lower()
        assert "too large" in drive(cap, cap.note(PERSON, ME, "x", files=[Attachment("big.bin", b"0" * 2000)])).message
        assert drive(cap, cap.note(PERSON, ME, "一")).status == "written"
        assert drive(cap, cap.note(PERSON, ME, "二")).status == "written"
        limited = drive(cap, cap.note(PERSON, ME, "三"))
        assert limited.status == "refused" and "2 captures a minute" in limited.message
        assert drive(cap, cap.note("telegram:222", ME, "别人不受影响")).status == "written"  # per person
    finally:
        cap.close()
    no_account = make_settings(tmp_path / "b", leanote={"base_url": leanote.url}, capture={"target": "leanote"})
    cap = capture_for(no_account)
    try:
        receipt = drive(cap, cap.note(PERSON, ME, "想记一下"))
        assert receipt.status == "refused" and "capture.accounts" in receipt.message
        off = capture_for(settings_for(tmp_path / "c", leanote, enabled=False))
        assert "turned off" in drive(off, off.note(PERSON, ME, "x")).message
        off.close()
    finally:
        cap.close()
    assert [n["Title"] for n in notes_of(leanote)] == ["一", "二", "别人不受影响"]


def test_someone_elses_leanote_user_is_never_written_as(tmp_path, leanote):
    """The configured login is ME's: a capture for another Leanote user is not written as ME."""
    cap = capture_for(settings_for(tmp_path, leanote))
    try:
        receipt = drive(cap, cap.note("telegram:222", OTHER, "不是我的"))
    finally:
        cap.close()
    assert receipt.status == "refused" and "capture.accounts" in receipt.message
    assert notes_of(leanote, ME) == [] and notes_of(leanote, OTHER) == []


# --- append and remember ---------------------------------------------------------------------

def test_append_rereads_on_a_conflict_and_never_overwrites_an_edit(tmp_path, leanote):
    cap = capture_for(settings_for(tmp_path, leanote))
    try:
        first = drive(cap, cap.note(PERSON, ME, "买菜清单\n- 西红柿"))
        leanote.edit_note(first.note_id, content=leanote.notes[first.note_id]["Content"] + "\n- 鸡蛋（网页里加的）\n")
        # someone edits again between our read and our write: Leanote answers conflict
        leanote.after("note/getNoteAndContent", lambda params, body: leanote.edit_note(
            first.note_id, content=leanote.notes[first.note_id]["Content"] + "\n- 葱（手机上加的）\n"))
        appended = drive(cap, cap.append(PERSON, ME, "- 糖"))
    finally:
        cap.close()
    assert appended.status == "written" and appended.note_id == first.note_id
    content = leanote.notes[first.note_id]["Content"]
    assert "鸡蛋（网页里加的）" in content and "葱（手机上加的）" in content and content.rstrip().endswith("-->")
    assert content.index("葱") < content.index("- 糖")
    assert any(w[0] == "note/updateNote" for w in leanote.writes)


def test_append_needs_a_capture_and_remember_keeps_one_dated_note(tmp_path, leanote):
    cap = capture_for(settings_for(tmp_path, leanote))
    try:
        assert drive(cap, cap.append(PERSON, ME, "无处可加")).status == "refused"
        one = drive(cap, cap.remember(PERSON, ME, "路由器密码改成了 hunter2"))
        two = drive(cap, cap.remember(PERSON, ME, "我现在不喜欢蘑菇"))
    finally:
        cap.close()
    assert one.note_id == two.note_id
    memory = leanote.notes[one.note_id]
    assert memory["Title"] == "记住的事 / Remembered"
    lines = [line for line in memory["Content"].splitlines() if line.startswith("- ")]
    assert len(lines) == 2 and lines[0].endswith("hunter2") and lines[1].endswith("不喜欢蘑菇")
    assert time.strftime("%Y-%m-%d") in lines[0]


# --- the outbox ------------------------------------------------------------------------------

def test_while_leanote_is_down_captures_wait_and_go_in_order(tmp_path, leanote):
    cap = capture_for(settings_for(tmp_path, leanote))

    async def scenario():
        stop = asyncio.Event()
        writer = asyncio.create_task(cap.run(stop))
        try:
            assert (await cap.note(PERSON, ME, "先写的")).status == "written"
            leanote.down()
            queued = [await cap.note(PERSON, ME, f"排队 {i}") for i in range(3)]
            assert {r.status for r in queued} == {"queued"} and "/outbox" in queued[0].message
            waiting = cap.pending(PERSON)
            assert [i.payload["title"] for i in waiting] == ["排队 0", "排队 1", "排队 2"]
            assert cap.outbox.counts()["waiting"] == 3
            assert status_of(tmp_path)["capture"]["waiting"] == 3  # `status` counts them
            leanote.up()
            for _ in range(200):
                if not cap.pending(PERSON):
                    break
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await within(writer, "the capture writer to stop", 30)

    try:
        asyncio.run(scenario())
    finally:
        cap.close()
    titles = [n["Title"] for n in notes_of(leanote) if n["Title"] != "Inbox"]
    assert titles == ["先写的", "排队 0", "排队 1", "排队 2"]  # by USN: in the order captured
    assert Outbox.counts_at(tmp_path / "data")["waiting"] == 0


def test_a_refused_capture_is_parked_and_the_rest_go_on(tmp_path, leanote):
    leanote.max_upload_mb = 0.000001
    cap = capture_for(settings_for(tmp_path, leanote))
    try:
        refused = drive(cap, cap.note(PERSON, ME, "照片", files=[Attachment("a.png", b"x" * 100, "image/png")]))
        after = drive(cap, cap.note(PERSON, ME, "之后的"))
        parked = cap.pending(PERSON)
    finally:
        cap.close()
    assert refused.status == "refused" and "Leanote" in refused.message
    assert after.status == "written"
    assert [i.state for i in parked] == ["failed"] and parked[0].error


def test_a_write_whose_answer_was_lost_is_not_written_twice(tmp_path, leanote):
    """Leanote wrote the note, the answer never came back: the retry finds it by its marker."""
    cap = capture_for(settings_for(tmp_path, leanote))
    leanote.drop_response("note/addNote")
    try:
        receipt = drive(cap, cap.note(PERSON, ME, "只写一次"))
        assert receipt.status == "queued"

        async def settle():
            for _ in range(200):
                await cap.drain()
                if not cap.pending(PERSON):
                    return
                await asyncio.sleep(0.05)
        asyncio.run(settle())
    finally:
        cap.close()
    assert [n["Title"] for n in notes_of(leanote) if n["Title"] == "只写一次"] == ["只写一次"]


CHILD = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from conftest import capture_alone, make_settings
from pathlib import Path
settings = make_settings(Path({tmp!r}), leanote={{"base_url": {url!r}}},
    capture={{"accounts": [{{"email": "me@example.com", "password_env": "LR_PW_ME"}}]}})
cap = capture_alone(settings)
async def main():
    stop = asyncio.Event()
    asyncio.create_task(cap.run(stop))
    await cap.note("telegram:111", {me!r}, "kill -9 之前")
    await asyncio.sleep(60)
asyncio.run(main())
"""


def test_exactly_once_across_a_kill_between_write_and_acknowledgement(tmp_path, leanote):
    """A real kill -9 while Leanote has written the note and not yet answered; the
    next start finds the outbox row 'sending', looks, and does not write it again."""
    held = threading.Event()
    leanote.after("note/addNote", lambda params, body: held.wait(30))  # written; the answer waits
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(REPO / "tests"), tmp=str(tmp_path),
                                                                   url=leanote.url, me=ME)],
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        for _ in range(1200):  # 60 s: the child starts Python and imports first, on a busy machine too
            if any(n["Title"] == "kill -9 之前" for n in notes_of(leanote)):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the child never wrote")
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    held.set()
    settings = settings_for(tmp_path, leanote)
    [item] = Outbox(tmp_path / "data" / FILE).open_items()
    assert item.state == "sending"
    cap = capture_for(settings)
    try:
        asyncio.run(cap.drain())
        assert cap.pending("telegram:111") == []
    finally:
        cap.close()
    assert [n["Title"] for n in notes_of(leanote)].count("kill -9 之前") == 1


# --- searchable at once ----------------------------------------------------------------------

def test_a_capture_is_answered_after_the_pass_it_triggers(tmp_path, leanote):
    from bot.serve import Daemon

    leanote.put_notebook({"NotebookId": "a" * 24, "UserId": ME, "Title": "工作"})
    settings = make_settings(
        tmp_path, leanote={"base_url": leanote.url}, rerank={"kind": "none"}, ollama={"enabled": False},
        source={"kind": "leanote_api", "path": None, "accounts": [{"email": "me@example.com", "password_env": "LR_PW_ME"}]},
        sync={"interval": "1h", "trigger_debounce": "0.1s", "watch": False}, api={"enabled": False},
        capture={"sync_after": "0.2s"})

    async def main():
        daemon = Daemon(settings, services=[])
        task = asyncio.create_task(daemon.run())
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            passes = daemon.passes
            receipt = await daemon.capture.note(PERSON, ME, "家里 NAS 的管理端口改成了 5443 #家里")
            assert receipt.status == "written"
            await within(daemon.wait_for_pass(passes), "the pass the write asked for")
            answer = await daemon.answers.ask("NAS 管理端口是多少", ME)
            assert receipt.note_id in {c.note_id for c in answer.citations}
            summary = daemon.last_pass.summary
            assert summary.added == 1 and summary.chunks_embedded >= 1
            again = await within(daemon.schedule.sync_now(), "a sync pass")  # the note we wrote is known now: nothing to do
            assert (again.summary.added, again.summary.updated, again.summary.chunks_embedded) == (0, 0, 0)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(within(main(), "the scenario", SCENARIO))
    rows = json.loads(json.dumps(Outbox.counts_at(tmp_path / "data")))
    assert rows["written"] == 1 and rows["waiting"] == 0
