"""The web chat (``/chat``) in a real headless Chromium (Debian's ``chromium``, driven by
Playwright), over a real `serve` of a fake Leanote's notes and a fake Ollama: signing in with an
API token and with a bot's one-time link (used twice, or after its time: refused); a question
whose answer streams in (its first words shown before the rest is written), its citation a link
to the note in Leanote, opened; 👍, "Why?", "Save as note", related notes; the person's own gaps
(another person's never shown) written as a note or dismissed; a note captured; a forged request
from another site's page refused; and all of it at a phone's width (390 px)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from rag import config as config_mod
from bot.root import Parts
from bot.usecases import signin
from bot.usecases.people import Person

from conftest import THREADS, free_port
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama

pytestmark = pytest.mark.slow  # a real `serve` process and a browser

EXE = str(Path(sys.executable).with_name("leanote-rag"))
ALICE, BOB = "alice-" + uuid.uuid4().hex, "bob-" + uuid.uuid4().hex
ONE, BOOK = "5dbed2987db161bc2a85b901", "5e16ca22f6ffdbad5b4ba501"
EGGS, HIKE = "6dbed2987db161bc2a85b001", "6dbed2987db161bc2a85b002"
FRIEND = 111
QUESTION = "番茄炒蛋怎么做才不酸？"
# a sentence is shown once the next one begins (each is checked against the notes first)
FIRST, NEXT, REST = "先把鸡蛋炒好盛出[1]。", "加一小勺糖", "（大概 5 克）[1]。"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """`serve` over a fake Leanote (one user, two notes), alice's and bob's tokens on that user,
    a Telegram person mapped to it; alice has two open gaps, bob one."""
    root = tmp_path_factory.mktemp("web-chat")
    with FakeLeanote() as leanote, FakeOllama() as ollama:
        leanote.add_user(ONE, "one@example.com", "one-pw")
        leanote.put_notebook({"NotebookId": BOOK, "UserId": ONE, "Title": "生活"})
        leanote.put_note({"NoteId": EGGS, "UserId": ONE, "NotebookId": BOOK, "Title": "番茄炒蛋",
                          "Content": "# 番茄炒蛋\n\n一定要先把鸡蛋炒好盛出。加一小勺糖（大概 5 克），能压住番茄的酸味。"})
        leanote.put_note({"NoteId": HIKE, "UserId": ONE, "NotebookId": BOOK, "Title": "周末徒步香山",
                          "Content": "# 周末徒步香山\n\n从北宫门上山，带两升水。"})
        sock = Path(f"/tmp/lr-web-{uuid.uuid4().hex[:8]}.sock")
        port = free_port()
        config = root / "config.yaml"
        config.write_text(
            f"leanote: {{base_url: '{leanote.url}'}}\n"
            f"source: {{kind: leanote_api, accounts: [{{email: one@example.com, password_env: LR_PW_ONE}}]}}\n"
            f"state_dir: '{root / 'data'}'\nollama: {{host: '{ollama.url}'}}\nrerank: {{kind: none}}\n"
            f"retrieval: {{expand: 'off'}}\nmemory: {{llm: 'off'}}\nsync: {{interval: 1h}}\n"
            f"embedder: {{threads: {THREADS}}}\n"
            f"users: [{{leanote_user_id: '{ONE}', telegram_ids: [{FRIEND}]}}]\n"
            f"api:\n  socket: '{sock}'\n  listen: '127.0.0.1:{port}'\n  tokens:\n"
            f"    - {{token_env: LR_T_ALICE, name: alice, users: ['{ONE}']}}\n"
            f"    - {{token_env: LR_T_BOB, name: bob, users: ['{ONE}']}}\n", encoding="utf-8")
        env = {**os.environ, "LR_PW_ONE": "one-pw", "LR_T_ALICE": ALICE, "LR_T_BOB": BOB}
        settings = config_mod.load(config)
        with Parts(settings) as parts:  # what each person's questions left (the gaps' own store)
            gaps = {who: parts.gaps.add(f"api:{who}", ONE, q, q, [1.0, 0.0], "refused")[0]
                    for who, q in (("alice", "怎么煮溏心蛋"), ("bob", "bob 的秘密问题"))}
            gaps["alice2"] = parts.gaps.add("api:alice", ONE, "葱油怎么熬", "葱油怎么熬", [0.0, 1.0], "refused")[0]
        proc = subprocess.Popen([EXE, "--config", str(config), "serve"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 90
            while True:
                assert proc.poll() is None, proc.stderr.read()
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "serve did not become ready"
                time.sleep(0.2)
            yield SimpleNamespace(url=url, settings=settings, leanote=leanote, ollama=ollama, gaps=gaps)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
            sock.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the [test] extra")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def phone(browser):
    """A fresh browser profile at a phone's size, every script error and outside request noted."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                                  has_touch=True)
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.errors = []
    page.on("pageerror", lambda err: page.errors.append(str(err)))
    page.outside = []
    page.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1", "data:")) else page.outside.append(r.url))
    return page


def sign_in_with_token(page, world, token=ALICE):
    page.goto(f"{world.url}/chat")
    page.locator("#signin").wait_for(state="visible")
    page.fill("#token", token)
    page.click("#signin-form button")
    page.locator("#chat").wait_for(state="visible")


def fits(page) -> bool:
    """Nothing wider than the phone's screen: no sideways scrolling."""
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def link_code(world, clock=time.time) -> str:
    """A one-time link for the Telegram person, as their bot's /web makes it (``signin.link``)."""
    with Parts(world.settings, clock=clock) as parts:
        url = signin.link(parts, Person(f"telegram:{FRIEND}", ONE)).url
    assert url.startswith(f"{world.url}/chat#code=")
    return url


def test_sign_in_with_a_token_and_with_a_one_time_link(browser, world):
    page = phone(browser)
    page.goto(f"{world.url}/chat")
    page.fill("#token", "not-a-token")
    page.click("#signin-form button")
    page.locator("#signin-error", has_text="unknown token").wait_for()
    assert page.locator("#chat").is_hidden()
    sign_in_with_token(page, world)
    cookie = next(c for c in page.context.cookies() if c["name"] == "lr_chat")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # the page's own script cannot read it
    page.click("#signout")
    page.locator("#signin").wait_for(state="visible")
    page.reload()
    page.locator("#signin").wait_for(state="visible")  # signed out for good

    url = link_code(world)
    page.goto(url)
    page.locator("#chat").wait_for(state="visible")
    assert "code=" not in page.url  # out of the address bar (and of the history) at once
    assert page.evaluate("fetch('/chat/me').then(r => r.json()).then(me => me.person)") == f"telegram:{FRIEND}"

    other = phone(browser)  # the same link again, from another browser: it worked once
    other.goto(url)
    other.locator("#signin-error", has_text="used already").wait_for()
    assert other.locator("#chat").is_hidden()
    late = link_code(world, clock=lambda: time.time() - 601)  # made api.web_link (10 minutes) ago
    other.goto(late)
    other.locator("#signin-error", has_text="expired").wait_for()
    assert page.errors == [] and page.outside == [] and other.outside == []
    page.context.close()
    other.context.close()


def test_a_question_streams_its_answer_and_its_citation_opens_the_note(browser, world):
    page = phone(browser)
    sign_in_with_token(page, world)
    go_on = world.ollama.reply(FIRST, NEXT, REST, paused_after=2)
    page.fill("#q", QUESTION)
    page.keyboard.press("Enter")
    turn = page.locator("#log .turn").last
    turn.locator(".reading", has_text="番茄炒蛋").wait_for()  # the sources, before the model writes
    turn.locator(".stream", has_text=FIRST[:6]).wait_for()  # the first words, while the rest is not written
    assert turn.locator(".answer .text").count() == 0 and "一小勺糖" not in turn.inner_text()
    go_on.set()
    turn.locator(".answer .text", has_text="一小勺糖").wait_for()
    assert "null" not in turn.inner_text() and "undefined" not in turn.inner_text()
    cite = turn.locator(".sources a").first
    href = f"{world.leanote.url}/note/{EGGS}"
    assert cite.get_attribute("href") == href and "番茄炒蛋" in cite.inner_text()
    assert cite.get_attribute("rel") == "noopener noreferrer" and cite.get_attribute("target") == "_blank"
    with page.context.expect_page() as opened:
        cite.click()
    assert opened.value.url == href  # the note, in Leanote
    opened.value.close()
    assert fits(page)

    turn.locator("button.up").click()
    page.locator("#message", has_text="Thanks").wait_for()
    assert turn.locator("button.up").get_attribute("aria-pressed") == "true"
    turn.locator("button.why").click()
    turn.locator("pre.trace", has_text=QUESTION).wait_for()
    assert "番茄炒蛋" in turn.locator("pre.trace").inner_text()
    turn.locator("button.save").click()
    turn.locator(".receipt.written").wait_for()
    assert len(world.leanote.notes_titled(ONE, QUESTION)) == 1
    turn.locator("button.related").click()
    turn.locator(".related-notes").wait_for()
    page.fill("#q", "/why")
    page.keyboard.press("Enter")
    page.locator("#log .turn").last.locator("pre.trace", has_text=QUESTION).wait_for()
    assert fits(page) and page.errors == [] and page.outside == []
    page.context.close()


def test_the_persons_own_gaps_are_written_or_dismissed_and_a_note_is_captured(browser, world):
    page = phone(browser)
    sign_in_with_token(page, world)
    page.click("#open-gaps")
    page.locator("#gap-list .gap").first.wait_for()
    listed = page.locator("#gap-list").inner_text()
    assert "怎么煮溏心蛋" in listed and "葱油怎么熬" in listed and "bob 的秘密问题" not in listed  # bob's is bob's
    assert page.locator("#gap-list .gap").count() == 2
    gap = page.locator(f'.gap[data-id="{world.gaps["alice"]}"]')
    gap.locator("button.dismiss").click()
    gap.wait_for(state="detached")
    other = page.locator(f'.gap[data-id="{world.gaps["alice2"]}"]')
    other.locator("button.write").click()
    other.locator("textarea").fill("小火慢熬葱段，葱变焦黄就关火。")
    other.locator(".gap-note button").click()
    other.locator(".receipt.written").wait_for()
    assert [n["Title"] for n in world.leanote.notes_titled(ONE, "葱油怎么熬")] == ["葱油怎么熬"]
    assert fits(page)

    page.click("#open-note")
    page.fill("#note-title", "凉拌黄瓜")
    page.fill("#note-text", "拍碎，加蒜末和醋 #凉菜")
    page.click("#note-form button")
    page.locator("#message", has_text="已记下").wait_for()
    assert len(world.leanote.notes_titled(ONE, "凉拌黄瓜")) == 1
    assert page.locator("#capture").is_hidden() and page.errors == [] and page.outside == []
    page.context.close()


class _Evil(BaseHTTPRequestHandler):
    """Another site's page: it posts a note to the chat's API as soon as it is opened."""

    target = ""

    def do_GET(self):
        body = (f"<!doctype html><form id=f method=POST action='{self.target}/note' enctype='text/plain'>"
                "<input name='{\"text\": \"forged by a form\", \"x\": \"' value='\"}'></form>"
                f"<script>fetch('{self.target}/note', {{method: 'POST', mode: 'no-cors', credentials: 'include',"
                " body: JSON.stringify({text: 'forged by fetch'})}).finally(() => document.getElementById('f')"
                ".submit());</script>").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])  # another site; the same site on another port
def test_a_forged_request_from_another_sites_page_is_refused(browser, world, host):
    page = phone(browser)
    sign_in_with_token(page, world)  # the browser holds a session
    _Evil.target = world.url
    evil = ThreadingHTTPServer(("127.0.0.1", 0), _Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        refused = []
        page.on("response", lambda r: refused.append(r.status) if r.url == f"{world.url}/note" else None)
        page.goto(f"http://{host}:{evil.server_address[1]}/")
        page.wait_for_url(f"{world.url}/note")  # the form's post, after the fetch's
        assert len(refused) == 2 and all(s in (401, 403) for s in refused), refused
        if host == "127.0.0.1":  # same site: the cookie went along, and the Origin check refused it
            assert refused == [403, 403]
        assert "kind" in page.content()  # the refusal, as JSON
    finally:
        evil.shutdown()
        evil.server_close()
    assert not [n for n in world.leanote.notes.values() if "forged" in n.get("Content", "")]
    page.context.close()
