"""What a door outside the daemon needs of its API, per person: an answer kept for later
(``keep``), its trace (``/answers/{id}/why``, and ``/why`` of a conversation as the bots' ``/why``),
👍 / 👎 on it (a 👎 keeps the question as one of the person's gaps, a 👍 takes it back), saved as
a note once, and a note captured once per ``once`` id. A token's person never reaches another's
answer: it is not found, as one never kept. The real daemon in this process, its API on
127.0.0.1, a fake Ollama, captures into the notes folder."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest


from conftest import free_port, make_settings, run_over_tcp
from fakes.ollama import FakeOllama

pytestmark = pytest.mark.slow  # a real daemon: a first pass over the sample notes

ALICE, BOB = "alice-" + uuid.uuid4().hex, "bob-" + uuid.uuid4().hex
QUESTION = "番茄炒蛋怎么做才不酸？"


@pytest.fixture
def world(tmp_path, notes_dir, monkeypatch):
    monkeypatch.setenv("LR_T_ALICE", ALICE)
    monkeypatch.setenv("LR_T_BOB", BOB)
    with FakeOllama() as ollama:
        settings = make_settings(
            tmp_path, source={"kind": "files", "path": str(notes_dir)},
            ollama={"host": ollama.url}, rerank={"kind": "none"}, retrieval={"expand": "off"},
            sync={"interval": "1h", "trigger_debounce": "0.1s"},
            api={"socket": f"/tmp/lr-ans-{uuid.uuid4().hex[:8]}.sock", "listen": f"127.0.0.1:{free_port()}",
                 "tokens": [{"token_env": "LR_T_ALICE", "name": "alice", "users": ["local"]},
                            {"token_env": "LR_T_BOB", "name": "bob", "users": ["local"]}]})
        yield settings, ollama, notes_dir
        Path(settings.api.socket).unlink(missing_ok=True)


def run(settings, scenario):
    run_over_tcp(settings, scenario)


def as_(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


async def ask(http, token: str, question: str, **body) -> dict:
    """The last event of a streamed answer (``answer``, or ``error``)."""
    async with http.stream("POST", "/ask", json={"question": question, **body}, headers=as_(token)) as reply:
        assert reply.status_code == 200, await reply.aread()
        events = [json.loads(line) async for line in reply.aiter_lines() if line]
    return events[-1]


def test_a_kept_answer_has_its_trace_feedback_and_save_for_its_asker_only(world):
    settings, ollama, notes = world

    async def scenario(daemon, http):
        ollama.reply("先把鸡蛋炒好盛出[1]，", "再加一小勺糖[1]。")
        got = await ask(http, ALICE, QUESTION, keep=True)
        answer_id = got["answer_id"]
        assert got["event"] == "answer" and answer_id and got["answer"]["citations"]
        ollama.reply("先把鸡蛋炒好盛出[1]。")
        assert (await ask(http, ALICE, QUESTION))["answer_id"] is None  # not kept unless asked

        # the trace: its asker's; another token's person finds nothing, as for an id never kept
        why = (await http.get(f"/answers/{answer_id}/why", headers=as_(ALICE))).json()
        assert why["answer_id"] == answer_id and why["question"] == QUESTION
        assert dict(map(tuple, why["rows"]))["question"] == QUESTION and why["candidates"]
        assert "番茄炒蛋" in why["text"] and why["candidates"][0]["title"] == "番茄炒蛋"
        theirs = await http.get(f"/answers/{answer_id}/why", headers=as_(BOB))
        never = await http.get("/answers/nosuchanswer/why", headers=as_(BOB))
        assert theirs.status_code == never.status_code == 404 and theirs.json()["kind"] == "user"
        assert theirs.json()["error"].replace(answer_id, "X") == never.json()["error"].replace("nosuchanswer", "X")
        assert QUESTION not in theirs.text
        for path, body in ((f"/answers/{answer_id}/feedback", {"verdict": "down"}), (f"/answers/{answer_id}/save", {})):
            refused = await http.post(path, json=body, headers=as_(BOB))
            assert refused.status_code == 404 and set(refused.json()) == {"error", "kind"}

        # 👎: the question is one of alice's gaps (not bob's); 👍 after it takes it back
        down = await http.post(f"/answers/{answer_id}/feedback", json={"verdict": "down"}, headers=as_(ALICE))
        assert down.json() == {"answer_id": answer_id, "verdict": "down"}
        gaps = (await http.get("/gaps", headers=as_(ALICE))).json()
        assert [g["wordings"] for g in gaps] == [[QUESTION]] and gaps[0]["person"] == "api:alice"
        assert (await http.get("/gaps", headers=as_(BOB))).json() == []
        up = await http.post(f"/answers/{answer_id}/feedback", json={"verdict": "up"}, headers=as_(ALICE))
        assert up.json()["verdict"] == "up" and (await http.get("/gaps", headers=as_(ALICE))).json() == []
        bad = await http.post(f"/answers/{answer_id}/feedback", json={"verdict": "meh"}, headers=as_(ALICE))
        assert bad.status_code == 400 and "'up' or 'down'" in bad.json()["error"]
        assert daemon.parts.feedback.get(answer_id).verdict == "up"

        # saved as a note once, however often asked
        saved = (await http.post(f"/answers/{answer_id}/save", headers=as_(ALICE))).json()
        assert saved["status"] == "written" and saved["note_id"], saved
        again = (await http.post(f"/answers/{answer_id}/save", headers=as_(ALICE))).json()
        assert again["status"] == "saved" and again["again"]
        assert len([p for p in (notes / "Inbox").glob("*.md") if QUESTION.rstrip("？") in p.read_text()]) == 1

    run(settings, scenario)


def test_why_of_a_conversation_is_the_askers_own(world):
    settings, ollama, _ = world

    async def scenario(daemon, http):
        ollama.reply("先把鸡蛋炒好盛出[1]。")
        await ask(http, ALICE, QUESTION, conversation="kitchen")
        mine = (await http.get("/why", params={"conversation": "kitchen"}, headers=as_(ALICE))).json()
        assert mine["question"] == QUESTION and "番茄炒蛋" in mine["text"]
        theirs = (await http.get("/why", params={"conversation": "kitchen"}, headers=as_(BOB))).json()
        assert theirs["question"] is None and theirs["rows"] == [] and QUESTION not in json.dumps(theirs)
        assert "No answer in this conversation yet" in theirs["text"]
        assert (await http.get("/why", headers=as_(ALICE))).status_code == 400  # which conversation?

    run(settings, scenario)


def test_a_note_is_captured_once_per_once_id_and_person(world):
    settings, _, notes = world

    async def scenario(daemon, http):
        body = {"text": "葱油拌面：葱油 3 勺，生抽 2 勺 #面", "title": "葱油拌面", "once": "phone-1"}
        first = (await http.post("/note", json=body, headers=as_(ALICE))).json()
        assert first["status"] == "written" and not first["again"], first
        retry = (await http.post("/note", json=body, headers=as_(ALICE))).json()  # the reply was lost: sent again
        assert retry["status"] == "written" and retry["again"] and retry["note_id"] == first["note_id"]
        bobs = (await http.post("/note", json=body, headers=as_(BOB))).json()  # the same id is bob's own
        assert bobs["status"] == "written" and not bobs["again"] and bobs["note_id"] != first["note_id"]
        written = [p for p in (notes / "Inbox").glob("*.md") if "葱油 3 勺" in p.read_text()]
        assert len(written) == 2 and all("葱油拌面" in p.name for p in written)
        empty = (await http.post("/note", json={"text": "  "}, headers=as_(ALICE))).json()
        assert empty["status"] == "refused"

    run(settings, scenario)
