"""Capture text in the notes it becomes: names, titles, file names and someone else's text
are shown as written (never a link or markup); the person's own words stay their Markdown.
Rendered with a permissive Markdown renderer, against the fake Leanote over real HTTP."""

from __future__ import annotations

import asyncio

import pytest
from markdown_it import MarkdownIt

from rag.capture import Attachment, Origin, Quote, answer_note, compose, md_escape
from sync.capture import Capture

from conftest import make_settings, until
from fakes.leanote import FakeLeanote

ONE_ID = "5dbed2987db161bc2a85b919"
TWO_ID = "5dbed2987db161bc2a85b920"
ONE = "telegram:111"
EVIL = "a](javascript:alert(1)) [b"


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
                 "retry_min": "0.2s", "retry_max": "1s", **capture})


async def submit(cap: Capture, coro):
    """A capture call, its write delivered by ``drain`` (no background writer: the fake clock
    decides what is due); the receipt."""
    task = asyncio.ensure_future(coro)
    await until(lambda: cap.outbox.open_items() or task.done(), what="the capture's row")
    await cap.drain()
    return await task


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
    cap = Capture(lambda: settings)
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
    cap = Capture(lambda: settings)
    try:
        receipt = asyncio.run(submit(cap, cap.note(ONE, ONE_ID, "", files=[
            Attachment("[点我](javascript:alert(1)).pdf", b"%PDF-1.4", "application/pdf")])))
    finally:
        cap.close()
    note = leanote.notes[receipt.note_id]
    assert note["Title"] == "[点我](javascript:alert(1)).pdf"
    hrefs, text = links(note["Content"])
    assert [h.split("?")[0] for h in hrefs] == ["/api/file/getAttach"] and text == "[点我](javascript:alert(1)).pdf"
