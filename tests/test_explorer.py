"""The memory explorer: the daemon's /memory API and the page over it, in a real headless
Chromium (Debian's ``chromium``, driven by Playwright). A real `serve` over the sample
notes; the facts the LLM tier would store are stored directly (the LLM tier itself is
tested in test_memory_llm), one token may see the notes' user and another may not."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from rag.http import tls
from rag.memory.rows import NoteInfo

from rag.memory.store import MemoryStore
from sync.sources.files import stable_id

from conftest import EXAMPLES, THREADS, free_port

pytestmark = pytest.mark.slow  # a real `serve` process and a browser

EXE = str(Path(sys.executable).with_name("leanote-rag"))
TOKEN_ME, TOKEN_OTHER = "tok-me-" + uuid.uuid4().hex, "tok-other-" + uuid.uuid4().hex
EGGS = stable_id("file:生活/菜谱/番茄炒蛋.md")
SUGAR = ("番茄炒蛋", "加", "一小勺糖", "加一小勺糖（大概 5 克）")
EGGS_FIRST = ("番茄炒蛋", "先炒", "鸡蛋", "一定要先把鸡蛋炒好盛出")
SECRET_NOTE = "other-user-note"


def store_facts(store: MemoryStore, user: str, note_id: str, content_hash: str, facts, summary: str = "") -> None:
    """What the LLM tier stores for a note (``MemoryJobs``), without the LLM."""
    rows = [{"subject": s, "predicate": p, "object": o, "quote": q, "char_start": 0, "char_end": len(q)}
            for s, p, o, q in facts]
    assert store.store_llm({"note_id": note_id, "user_id": user, "content_hash": content_hash,
                            "updated": 1_700_000_000.0}, summary, rows, {})


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """`serve` over the sample notes, its memory holding two facts about the eggs note and,
    for another Leanote user, a note the first user's token must never reach."""
    root = tmp_path_factory.mktemp("explorer")
    notes = root / "notes"
    shutil.copytree(EXAMPLES, notes)
    sock = Path(f"/tmp/lr-exp-{uuid.uuid4().hex[:8]}.sock")
    port = free_port()
    config = root / "config.yaml"
    config.write_text(
        f"source: {{kind: files, path: '{notes}'}}\nstate_dir: '{root / 'data'}'\n"
        f"ollama: {{host: 'http://127.0.0.1:{free_port()}'}}\nrerank: {{kind: none}}\n"
        f"memory: {{llm: 'off'}}\nsync: {{interval: 1h}}\nembedder: {{threads: {THREADS}}}\n"
        f"api:\n  socket: '{sock}'\n  listen: '127.0.0.1:{port}'\n  tokens:\n"
        f"    - {{token_env: LR_TOKEN_ME, users: [local]}}\n"
        f"    - {{token_env: LR_TOKEN_OTHER, users: [somebody-else]}}\n", encoding="utf-8")
    env = {**os.environ, "LR_TOKEN_ME": TOKEN_ME, "LR_TOKEN_OTHER": TOKEN_OTHER}
    subprocess.run([EXE, "--config", str(config), "index"], env=env, check=True, capture_output=True, timeout=300)
    with MemoryStore(root / "data" / "memory.sqlite") as store:
        store_facts(store, "local", EGGS, store.hashes()[EGGS], [SUGAR, EGGS_FIRST], summary="番茄炒蛋的做法：先炒蛋，加糖压酸")
        store.replace_note("somebody-else", SECRET_NOTE, "h", [], info=NoteInfo("番茄炒蛋（别人的）", "x", "http://x/1", ""))
        store_facts(store, "somebody-else", SECRET_NOTE, "h", [("番茄炒蛋", "放", "辣椒", "放辣椒")])
    proc = subprocess.Popen([EXE, "--config", str(config), "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"{url}/health", timeout=2, verify=tls()).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve did not become ready"
            time.sleep(0.2)
        yield SimpleNamespace(url=url, root=root)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def get(daemon, path: str, token: str = TOKEN_ME, **params) -> httpx.Response:
    return httpx.get(f"{daemon.url}{path}", params=params, headers={"Authorization": f"Bearer {token}"}, timeout=10,
                     verify=tls())


def post(daemon, path: str, body: dict, token: str = TOKEN_ME) -> httpx.Response:
    return httpx.post(f"{daemon.url}{path}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10,
                      verify=tls())


# --- the API ----------------------------------------------------------------------------------


def test_search_graph_and_card_show_the_users_memory_with_sources(daemon):
    found = get(daemon, "/memory/find", q="番茄").json()
    assert found["user_id"] == "local"
    assert "番茄炒蛋" in [e["name"] for e in found["entities"]]
    assert EGGS in [n["note_id"] for n in found["notes"]]

    graph = get(daemon, "/memory/graph", note=EGGS).json()
    assert graph["center"] == f"n:{EGGS}"
    facts = [e for e in graph["edges"] if e["type"] == "fact"]
    assert {(e["label"], e["quote"]) for e in facts} == {(SUGAR[1], SUGAR[3]), (EGGS_FIRST[1], EGGS_FIRST[3])}
    assert any(e["type"] == "mention" for e in graph["edges"])  # the no-LLM tier's entities
    ids = {n["id"] for n in graph["nodes"]}
    assert all(e["from"] in ids and e["to"] in ids for e in graph["edges"])

    card = get(daemon, f"/memory/note/{EGGS}").json()
    assert card["title"] == "番茄炒蛋" and card["url"].startswith("file://") and card["url"].endswith(".md")
    assert card["summary"].startswith("番茄炒蛋的做法")
    assert {f["quote"] for f in card["facts"]} == {SUGAR[3], EGGS_FIRST[3]}

    entity = get(daemon, "/memory/entity", name="番茄炒蛋").json()
    assert {f["object"] for f in entity["facts"]} == {"一小勺糖", "鸡蛋"}  # never the other user's 辣椒


def test_one_users_token_never_reaches_another_users_memory(daemon):
    assert get(daemon, "/memory/find", q="辣椒").json()["entities"] == []
    assert get(daemon, f"/memory/note/{SECRET_NOTE}").status_code == 404
    refused = get(daemon, "/memory/entity", name="番茄炒蛋", user="somebody-else")
    assert refused.status_code == 400 and "somebody-else" in refused.json()["error"]
    other = get(daemon, "/memory/find", q="番茄", token=TOKEN_OTHER)  # a token whose user has no index here
    assert other.status_code == 400 and "番茄" not in other.text
    assert get(daemon, "/memory/find", q="番茄", token="wrong").status_code == 401
    assert httpx.get(f"{daemon.url}/memory/find", params={"q": "番茄"}).status_code == 401


def test_bad_requests_get_clear_errors(daemon):
    assert "entity=NAME or note=NOTE_ID" in get(daemon, "/memory/graph").json()["error"]
    assert get(daemon, "/memory/graph", note="no-such-note").status_code == 404
    bad = post(daemon, "/memory/verdict", {"id": "f123", "verdict": "maybe"})
    assert bad.status_code == 400 and "rejected" in bad.json()["error"]
    unknown = post(daemon, "/memory/verdict", {"id": "fdeadbeef", "verdict": "rejected"})
    assert unknown.status_code == 400
    assert get(daemon, "/explorer/passwd").status_code == 404
    # what a person sent is repeated in an error only in part: its first 64 characters
    long_id = "6" * 5000
    for refused in (get(daemon, f"/memory/note/{long_id}"), get(daemon, "/memory/graph", note=long_id[:1999]),
                    get(daemon, f"/explorer/{long_id}"), get(daemon, "/memory/find", q="番茄", user=long_id),
                    post(daemon, "/memory/verdict", {"id": long_id, "verdict": "rejected"}),
                    post(daemon, "/memory/verdict", {"id": "f123", "verdict": long_id})):
        assert refused.status_code in (400, 404), refused.text
        error = refused.json()["error"]
        assert "6" * 64 + "…" in error and "6" * 65 not in error and len(error) < 400, error


def test_the_page_and_its_graph_library_are_served_without_a_token(daemon):
    page = httpx.get(f"{daemon.url}/explorer", timeout=10)
    assert page.status_code == 200 and "Memory explorer" in page.text
    library = httpx.get(f"{daemon.url}/explorer/vis-network.min.js", timeout=10)
    assert library.status_code == 200 and len(library.content) > 100_000  # from the pyvis package


# --- the page, in a real browser --------------------------------------------------------------


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


def test_the_page_searches_draws_opens_a_card_and_rejects_a_fact(daemon, browser):
    page = browser.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(f"{daemon.url}/explorer")
    page.locator("#login").wait_for(state="visible")  # no token yet: it asks for one
    page.fill("#token", "wrong")
    page.click("#login button")
    page.locator("#login-error").filter(has_text="not known").wait_for()
    page.fill("#token", TOKEN_ME)
    page.click("#login button")
    page.locator("#login").wait_for(state="hidden")

    page.fill("#q", "番茄炒蛋")
    page.click("#search button")
    page.locator("#results .hit.entity").first.wait_for()
    page.locator("#card .fact").first.wait_for()  # the best entity opens at once
    sources = page.locator("#card .fact .meta a.source")  # a fact's note: its title as text, the link a word of ours
    assert sources.count() >= 1 and set(sources.all_inner_texts()) == {"open"}
    assert "番茄炒蛋" in page.locator("#card .fact .meta").first.inner_text()
    graph = page.evaluate("window.explorerGraph")
    assert graph["center"] == "e:番茄炒蛋" and len(graph["nodes"]) >= 3
    assert page.locator("#graph canvas").count() == 1  # vis-network drew it

    page.locator("#results .hit.note", has_text="番茄炒蛋").first.click()  # open the note's card
    page.locator("#card h2.title", has_text="番茄炒蛋").wait_for()
    link = get(daemon, f"/memory/note/{EGGS}").json()["url"]  # a files source links the file
    assert page.locator("#card a.open").get_attribute("href") == link
    assert "先炒蛋" in page.locator("#card .summary").inner_text()
    sugar = page.locator("#card .fact", has_text=SUGAR[3])
    assert sugar.count() == 1 and "辣椒" not in page.locator("#card").inner_text()

    sugar.locator("button.reject").click()
    page.locator("#message", has_text="rejected").wait_for()
    page.locator("#card .fact", has_text=SUGAR[3]).wait_for(state="detached")
    assert page.locator("#card .fact", has_text=EGGS_FIRST[3]).count() == 1
    page.locator("#card .fact", has_text=EGGS_FIRST[3]).locator("button.confirm").click()
    page.locator("#card .fact .badge.confirmed").wait_for()
    assert errors == []
    page.close()

    with MemoryStore(daemon.root / "data" / "memory.sqlite") as store:  # what the page did, as the memory has it
        kept = {f["object"]: f for f in store.facts_about("local", "番茄炒蛋")}
        assert "一小勺糖" not in kept and kept["鸡蛋"]["confirmed"]
        assert store.verdicts("local", "fact")
