"""Capture under a slow or failing Leanote (sync.writeback.capture against the fake Leanote over real
HTTP): a write Leanote applies after the client gave up is found, not sent again (also across
a kill -9); a duplicate that lands anyway is moved to the trash; retries back off from
``retry_min`` doubling to ``retry_max``; one account's failure neither delays another
account's captures nor shows in their replies; capture text cannot become Markdown links.

The slow cases are the reported ones scaled down (a 3 s client deadline instead of 30 s), and
the fake applies the write when the test says so (``FakeLeanote.hold``), not after a delay; a
fake clock decides what is due, so nothing here depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from markdown_it import MarkdownIt

from bot.chat.texts import outbox_text
from rag.capture import Attachment, Origin, Quote, answer_note, compose, md_escape
from sync.writeback.capture import Capture

from conftest import capture_alone, REPO, make_settings, until, within
from fakes.leanote import FakeLeanote

ONE_ID = "5dbed2987db161bc2a85b919"
TWO_ID = "5dbed2987db161bc2a85b920"
ONE, TWO = "telegram:111", "telegram:222"
EVIL = "a](javascript:alert(1)) [b"


class Clock:
    def __init__(self, now: float | None = None):
        self.now = time.time() if now is None else now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def leanote(monkeypatch):
    monkeypatch.setenv("LR_PW_ONE", "one-secret")
    monkeypatch.setenv("LR_PW_TWO", "two-secret")
    monkeypatch.setenv("LR_PW_WRONG", "not-the-password")
    with FakeLeanote() as fake:
        fake.add_user(ONE_ID, "one@example.com", "one-secret")
        fake.add_user(TWO_ID, "two@example.com", "two-secret")
        yield fake


def slow_settings(tmp_path, fake, one_pw="LR_PW_ONE", timeout="3s", **capture):
    """The reported setup scaled by 1/10: a 3 s client deadline (30 s), a retry after 0.2 s (2 s)."""
    return make_settings(
        tmp_path, leanote={"base_url": fake.url}, sync={"http_timeout": timeout},
        capture={"accounts": [{"email": "one@example.com", "password_env": one_pw},
                              {"email": "two@example.com", "password_env": "LR_PW_TWO"}],
                 "retry_min": "0.2s", "retry_max": "1s", "resend_after": "12s", **capture})


async def submit(cap: Capture, coro):
    """A capture call, its write delivered by ``drain`` (no background writer: the fake clock
    decides what is due); the receipt."""
    task = asyncio.ensure_future(coro)
    await until(lambda: cap.outbox.open_items() or task.done(), what="the capture's row")
    await within(cap.drain(), "the capture's write")
    return await within(task, "the capture's receipt")


def titled(fake, title, user_id=ONE_ID, trash=False) -> list[dict]:
    return [n for n in fake.notes_titled(user_id, title) if n["IsTrash"] == trash]


def wait_for(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# --- exactly once under a slow Leanote ---------------------------------------------------------

@pytest.mark.slow
def test_a_write_leanote_applies_after_the_client_gave_up_is_found_not_sent_again(tmp_path, leanote):
    """addNote applied after the client's deadline (40 s vs 30 s, scaled): the retry looks
    for it and waits until it can have landed; one note, and the person gets its link."""
    settings = slow_settings(tmp_path, leanote)
    clock = Clock()
    cap = capture_alone(settings, clock=clock)
    held = leanote.hold("note/addNote")
    try:
        receipt = asyncio.run(submit(cap, cap.note(ONE, ONE_ID, "慢慢写的一条")))
        assert receipt.status == "queued" and "within 3 s" in cap.pending(ONE)[0].error  # the client gave up
        assert leanote.calls["note/addNote"] == 1 and not titled(leanote, "慢慢写的一条")
        sent = clock.now  # (the fake clock stood still meanwhile)
        for _ in range(11):  # the retries look for it, and send nothing while it may still land
            clock.now += 1
            asyncio.run(cap.drain())
        assert leanote.calls["note/addNote"] == 1 and leanote.calls["note/getSyncNotes"] >= 1
        [item] = cap.pending(ONE)
        assert item.next_try == sent + 12  # sent again only once it cannot still be on its way
        held.set()  # Leanote applies the write now, long after the client gave up
        wait_for(lambda: titled(leanote, "慢慢写的一条"), "the late write")
        clock.now = item.next_try
        asyncio.run(cap.drain())
        assert cap.pending(ONE) == []
        [note] = titled(leanote, "慢慢写的一条")
        assert cap.note_for(receipt.key) == note["NoteId"]
        assert leanote.calls["note/addNote"] == 1
    finally:
        cap.close()


@pytest.mark.slow
def test_a_duplicate_that_lands_anyway_is_moved_to_the_trash(tmp_path, leanote):
    """A write later than any grace: sent again, then the first lands too. The copy the
    person was not given is found by its marker and moved to the trash: one note remains."""
    settings = slow_settings(tmp_path, leanote)
    clock = Clock()
    cap = capture_alone(settings, clock=clock)
    held = leanote.hold("note/addNote")
    try:
        receipt = asyncio.run(submit(cap, cap.note(ONE, ONE_ID, "很晚才到的一条")))
        assert receipt.status == "queued"
        clock.now += 13  # past resend_after: nothing has landed, so it is sent again
        asyncio.run(cap.drain())
        assert leanote.calls["note/addNote"] == 2 and cap.pending(ONE) == []
        kept = cap.note_for(receipt.key)
        assert [n["NoteId"] for n in titled(leanote, "很晚才到的一条")] == [kept]
        held.set()  # and now the first one lands as well
        wait_for(lambda: len(titled(leanote, "很晚才到的一条")) == 2, "the late duplicate")
        asyncio.run(cap.drain())  # not yet: the duplicate check comes after the grace again
        assert len(titled(leanote, "很晚才到的一条")) == 2
        clock.now += 13
        asyncio.run(cap.drain())
        assert [n["NoteId"] for n in titled(leanote, "很晚才到的一条")] == [kept]  # the one whose link it sent
        [gone] = titled(leanote, "很晚才到的一条", trash=True)
        assert gone["NoteId"] != kept and f"leanote-rag:{receipt.key}" in gone["Content"]
        clock.now += 100
        asyncio.run(cap.drain())  # checked once: nothing more happens
        assert len(titled(leanote, "很晚才到的一条", trash=True)) == 1
    finally:
        cap.close()


CHILD = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from conftest import capture_alone, make_settings
settings = make_settings(Path({tmp!r}), leanote={{"base_url": {url!r}}}, sync={{"http_timeout": "30s"}},
    capture={{"accounts": [{{"email": "one@example.com", "password_env": "LR_PW_ONE"}}], "resend_after": "10m"}})
cap = capture_alone(settings)
async def main():
    stop = asyncio.Event()
    asyncio.create_task(cap.run(stop))
    await cap.note("telegram:111", {me!r}, "kill -9 时还在路上")
    await asyncio.sleep(60)
asyncio.run(main())
"""


def test_a_write_in_flight_when_the_process_is_killed_is_not_sent_again_after_a_restart(tmp_path, leanote):
    """A write Leanote takes 25 s to apply (within the 30 s deadline); the process is killed
    with SIGKILL meanwhile and started again: the send time survived, so the new process
    looks, waits until the write can have landed, finds it: one note."""
    held = leanote.hold("note/addNote")
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(REPO / "tests"), tmp=str(tmp_path),
                                                                   url=leanote.url, me=ONE_ID)],
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: leanote.calls["note/addNote"] == 1, "the child's write", timeout=90)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    settings = slow_settings(tmp_path, leanote, resend_after="10m")  # (the fake clock jumps there)
    clock = Clock()
    cap = capture_alone(settings, clock=clock)
    try:
        [item] = cap.pending(ONE)
        assert item.state == "sending"
        asyncio.run(cap.drain())  # at once after the restart: looks, finds nothing, does not send
        assert leanote.calls["note/addNote"] == 1 and cap.pending(ONE)
        held.set()  # the first write lands
        wait_for(lambda: titled(leanote, "kill -9 时还在路上"), "the write in flight")
        clock.now = cap.pending(ONE)[0].next_try
        asyncio.run(cap.drain())
        assert cap.pending(ONE) == []
        assert len(titled(leanote, "kill -9 时还在路上")) == 1 and leanote.calls["note/addNote"] == 1
    finally:
        cap.close()


# --- backoff -----------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["login refused", "Leanote answers 503"])
def test_retries_back_off_from_retry_min_doubling_to_retry_max(tmp_path, leanote, how):
    """The documented schedule (defaults: 30 s, 1 min, 2 min … up to 30 min), and never a try
    before its time: counted in the fake's calls under a fake clock."""
    settings = make_settings(tmp_path, leanote={"base_url": leanote.url}, capture={
        "accounts": [{"email": "one@example.com",
                      "password_env": "LR_PW_WRONG" if how == "login refused" else "LR_PW_ONE"}]})
    if how != "login refused":
        leanote.fail("auth/login", times=1000, status=503)
    clock = Clock(1_000_000.0)
    cap = capture_alone(settings, clock=clock)
    try:
        receipt = asyncio.run(submit(cap, cap.note(ONE, ONE_ID, "等 Leanote")))
        assert receipt.status == "queued"
        delays = []
        for _ in range(9):
            tries = leanote.calls["auth/login"]
            [item] = cap.pending(ONE)
            delays.append(round(item.next_try - clock.now))
            clock.now = item.next_try - 1
            asyncio.run(cap.drain())
            assert leanote.calls["auth/login"] == tries  # not early
            clock.now = item.next_try
            asyncio.run(cap.drain())
            assert leanote.calls["auth/login"] == tries + 1  # once, when due
    finally:
        cap.close()
    assert delays == [30, 60, 120, 240, 480, 960, 1800, 1800, 1800]


# --- one account's trouble stays its own ------------------------------------------------------

def test_one_accounts_refused_login_neither_holds_nor_shows_in_anothers_captures(tmp_path, leanote):
    settings = slow_settings(tmp_path, leanote, one_pw="LR_PW_WRONG")
    cap = capture_alone(settings)

    async def scenario():
        stop = asyncio.Event()
        writer = asyncio.create_task(cap.run(stop))
        try:
            first = await cap.note(ONE, ONE_ID, "ONE 的一条")
            assert first.status == "queued"
            second = await cap.note(TWO, TWO_ID, "TWO 的一条")
            return first, second, outbox_text(cap.pending(TWO))
        finally:
            stop.set()
            await within(writer, "the capture writer to stop", 30)

    try:
        first, second, outbox = asyncio.run(scenario())
    finally:
        cap.close()
    assert second.status == "written" and titled(leanote, "TWO 的一条", TWO_ID)
    for text in (second.message, outbox):
        assert "one@example.com" not in text and "Wrong username" not in text and "one-secret" not in text
    assert "Nothing waiting" in outbox
    assert not titled(leanote, "ONE 的一条")


@pytest.mark.parametrize("held_call", ["auth/login", "note/addNote"])
def test_one_account_stuck_in_a_slow_call_does_not_delay_another(tmp_path, leanote, held_call):
    """ONE's login (or write) hangs in Leanote; TWO's capture is written meanwhile, at once."""
    settings = slow_settings(tmp_path, leanote, timeout="60s")
    cap = capture_alone(settings)
    held = leanote.hold(held_call, ONE_ID)

    async def scenario():
        stop = asyncio.Event()
        writer = asyncio.create_task(cap.run(stop))
        try:
            one = asyncio.ensure_future(cap.note(ONE, ONE_ID, "ONE 卡住的一条"))
            await until(lambda: leanote.calls[held_call] >= 1, what="ONE's call")
            two = await cap.note(TWO, TWO_ID, "TWO 不受影响")
            assert not held.is_set() and not one.done()  # ONE's call is still hanging
            held.set()
            return two, await one
        finally:
            stop.set()
            await within(writer, "the capture writer to stop", 30)

    try:
        two, one = asyncio.run(scenario())
    finally:
        cap.close()
    assert two.status == "written" and len(titled(leanote, "TWO 不受影响", TWO_ID)) == 1
    assert one.status == "written" and len(titled(leanote, "ONE 卡住的一条")) == 1
    assert "one@example.com" not in two.message


def test_a_capture_queued_before_the_person_was_remapped_is_not_written_into_the_old_user(tmp_path, leanote):
    """Queued while Leanote was down; meanwhile the owner maps the person to another Leanote
    user (a reload): it is parked, saying why, and written into neither."""
    def mapped_to(user_id):
        users = make_settings(tmp_path, users=[{"leanote_user_id": user_id, "telegram_ids": [111]}]).users
        return slow_settings(tmp_path, leanote).model_copy(update={"users": users})

    cap = capture_alone(mapped_to(ONE_ID))
    try:
        leanote.down()
        assert asyncio.run(submit(cap, cap.note(ONE, ONE_ID, "映射改之前记的"))).status == "queued"
        cap.settings = mapped_to(TWO_ID)  # as a reload sets them (bot.root.Parts.apply)
        leanote.up()

        async def retried():
            await until(lambda: cap.pending(ONE)[0].next_try <= time.time(), what="the retry's time")
            await cap.drain()
        asyncio.run(retried())
        [item] = cap.pending(ONE)
        assert item.state == "failed" and "mapped to another Leanote user" in item.error
        assert "mapped to another Leanote user" in outbox_text(cap.pending(ONE))
    finally:
        cap.close()
    assert not leanote.notes_titled(ONE_ID, "映射改之前记的") and not leanote.notes_titled(TWO_ID, "映射改之前记的")


# --- Markdown: capture text cannot become a link or markup ------------------------------------

def links(markdown: str) -> tuple[list[str], str]:
    """The link targets a permissive Markdown renderer makes of ``markdown`` (one that does not
    filter javascript: itself), and the text it shows."""
    md = MarkdownIt("commonmark")
    md.validateLink = lambda url: True
    hrefs, text = [], []
    for block in md.parse(markdown):
        for t in block.children or []:
            if t.type == "link_open":
                hrefs.append(t.attrs["href"])
            elif t.type == "image":  # its label: the text its children show
                hrefs.append(t.attrs["src"])
                text.append("".join(c.content for c in t.children or [] if c.type == "text"))
            elif t.type in ("text", "code_inline"):
                text.append(t.content)
    return hrefs, "".join(text)


def test_names_titles_and_quoted_text_are_shown_as_written_never_as_links():
    assert links(md_escape(EVIL)) == ([], EVIL)
    # a forward: the sender's name, their chat's title and their text are someone else's
    draft = compose("", quote=Quote(f"转发的内容 [点我](javascript:alert(1)) {EVIL}\n# 不是标题\n- 不是列表"),
                    origin=Origin(who=EVIL, chat=EVIL, link="https://t.me/c/1"))
    hrefs, text = links(draft.content)
    assert hrefs == [] and text.count(EVIL) == 3 and "https://t.me/c/1" in text
    assert "[点我](javascript:alert(1))" in text
    assert "# 不是标题" in text and "- 不是列表" in text
    assert draft.title.startswith("转发的内容 [点我](javascript")  # the title field is plain text: as written
    # the person's own words stay their Markdown
    own = compose(f"[我的链接](https://example.com) {EVIL}")
    assert links(own.content)[0][0] == "https://example.com"
    # a saved answer: the question and the cited notes' titles are text; the links are ours
    saved = answer_note(EVIL, "答案 **加粗**", [{"n": 1, "title": EVIL, "url": "http://leanote/note/1"}])
    hrefs, text = links(saved)
    assert hrefs == ["http://leanote/note/1"] and text.count(EVIL) == 2


def test_a_file_named_like_a_link_is_attached_under_its_name(tmp_path, leanote):
    settings = slow_settings(tmp_path, leanote)
    cap = capture_alone(settings)
    try:
        receipt = asyncio.run(submit(cap, cap.note(ONE, ONE_ID, "附件", files=[
            Attachment(EVIL + ".pdf", b"%PDF-1.4", "application/pdf"), Attachment(EVIL + ".png", b"\x89PNG", "image/png")])))
    finally:
        cap.close()
    assert receipt.status == "written"
    note = leanote.notes[receipt.note_id]
    hrefs, text = links(note["Content"])
    assert all(h.startswith("/api/file/get") for h in hrefs) and len(hrefs) == 2  # the files' own links
    assert EVIL + ".pdf" in text and EVIL + ".png" in text
    assert sorted(f["Title"] for f in leanote.files.values()) == sorted([EVIL + ".pdf", EVIL + ".png"])


def test_a_file_sent_alone_is_titled_by_its_name_and_not_put_into_the_text(tmp_path, leanote):
    settings = slow_settings(tmp_path, leanote)
    cap = capture_alone(settings)
    try:
        receipt = asyncio.run(submit(cap, cap.note(ONE, ONE_ID, "", files=[
            Attachment("[点我](javascript:alert(1)).pdf", b"%PDF-1.4", "application/pdf")])))
    finally:
        cap.close()
    note = leanote.notes[receipt.note_id]
    assert note["Title"] == "[点我](javascript:alert(1)).pdf"
    hrefs, text = links(note["Content"])
    assert [h.split("?")[0] for h in hrefs] == ["/api/file/getAttach"] and text == "[点我](javascript:alert(1)).pdf"
