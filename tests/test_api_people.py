"""An API caller is its token, not its place in ``api.tokens``: each token has a name (its own,
or its env var's), and its holder's gaps, captures and feedback stay theirs when the list is
reordered or an entry deleted; what earlier versions kept under a place (``api:token0``) is
moved to the name once; two entries with one name, one variable or one token are refused.
And every error the API answers has the documented shape ``{"error", "kind"}``, malformed
bodies included. The real app (FastAPI, the token middleware) over a real index of the sample
notes, called in process through httpx's ASGI transport; real SQLite stores."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

import httpx
import pytest

from rag.errors import ConfigError
from rag.index.note_index import NoteIndex

from bot.api.access import TokenAuth
from bot.api.app import create_app
from bot.root import Parts
from bot.serve import Daemon
from bot.usecases import people

from conftest import index_samples, make_settings

SECRETS = {"LR_T_ALICE": "alice-" + "a" * 32, "LR_T_BOB": "bob-" + "b" * 32, "LR_T_CAROL": "carol-" + "c" * 32}
ALICE = {"token_env": "LR_T_ALICE", "name": "alice", "users": ["local"]}
BOB = {"token_env": "LR_T_BOB", "users": ["local"]}  # named by its variable: LR_T_BOB
CAROL = {"token_env": "LR_T_CAROL", "name": "carol", "users": ["local"]}
REFUSED = "How do I configure nginx rate limiting?"  # the sample notes hold no answer


def bearer(env: str) -> dict:
    return {"Authorization": f"Bearer {SECRETS[env]}"}


@pytest.fixture
def secrets(monkeypatch):
    for env, value in SECRETS.items():
        monkeypatch.setenv(env, value)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, use_embedder):
    """The sample notes indexed once; each test copies the state directory it changes."""
    root = tmp_path_factory.mktemp("api-people")
    index_samples(root, use_embedder, ollama={"enabled": False}, rerank={"kind": "none"})
    return root / "data"


def settings_with(tmp_path, tokens):
    return make_settings(tmp_path, ollama={"enabled": False}, rerank={"kind": "none"},
                         api={"socket": str(tmp_path / "api.sock"), "listen": "127.0.0.1:1", "tokens": tokens})


@asynccontextmanager
async def api(settings, embedder):
    """The daemon's TCP app over the index, as ``serve`` builds it, and a client of it."""
    daemon = Daemon(settings, services=[])
    index = NoteIndex.open(settings, embedder=embedder)
    daemon.parts = Parts(settings, scheduled=False, index=index)
    try:
        await asyncio.to_thread(lambda: (daemon.parts.answers, daemon.parts.feedback))
        app = create_app(daemon, TokenAuth(daemon))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            yield client, daemon
    finally:
        daemon.parts.close()
        index.close()


def test_a_token_keeps_its_holders_gaps_when_the_list_is_reordered_or_an_entry_deleted(tmp_path, secrets, indexed,
                                                                                     use_embedder):
    import shutil

    shutil.copytree(indexed, tmp_path / "data")

    async def scenario():
        async with api(settings_with(tmp_path, [ALICE, BOB]), use_embedder) as (client, _):
            reply = await client.post("/ask", json={"question": REFUSED}, headers=bearer("LR_T_ALICE"))
            assert reply.status_code == 200
            mine = (await client.get("/gaps", headers=bearer("LR_T_ALICE"))).json()
            assert [g["wordings"] for g in mine] == [[REFUSED]] and mine[0]["person"] == "api:alice"
            assert (await client.get("/gaps", headers=bearer("LR_T_BOB"))).json() == []
        # restarted with the list reordered: each holder keeps their own
        async with api(settings_with(tmp_path, [BOB, ALICE]), use_embedder) as (client, _):
            assert [g["id"] for g in (await client.get("/gaps", headers=bearer("LR_T_ALICE"))).json()] == \
                [mine[0]["id"]]
            assert (await client.get("/gaps", headers=bearer("LR_T_BOB"))).json() == []
        # alice's entry deleted, carol's added where it stood: carol gets nothing of alice's
        async with api(settings_with(tmp_path, [CAROL, BOB]), use_embedder) as (client, _):
            assert (await client.get("/gaps", headers=bearer("LR_T_CAROL"))).json() == []
            assert (await client.get("/gaps", headers=bearer("LR_T_BOB"))).json() == []
            assert (await client.get("/gaps", headers=bearer("LR_T_ALICE"))).status_code == 401

    asyncio.run(scenario())


def test_what_was_kept_under_a_place_in_the_list_moves_to_its_name_once(tmp_path, secrets):
    """Rows of ``api:token0``, ``api:token1`` (earlier versions) become their holders' by the list at
    the first start; a place the list no longer has is nobody's; a later start with the list
    reordered moves nothing."""
    settings = settings_with(tmp_path, [ALICE, BOB])
    with Parts(settings, scheduled=True) as parts:
        for i, question in ((0, "alice's"), (1, "bob's"), (2, "gone's")):
            parts.gaps.add(f"api:token{i}", "local", question, question, [1.0, 0.0], "refused")
            parts.outbox.add(f"api:token{i}", "local", "note", {"title": question, "content": "x", "tags": []}, [], 0.0)
        db = parts.feedback.db
        for i in (0, 1):
            db.execute("INSERT INTO answers(id, time, person, user_id, conversation, question, standalone, answer, "
                       "cited, outcome, used_llm, grounded) VALUES (?, 0, ?, 'local', ?, 'q', 'q', 'a', '[]', "
                       "'refused', 0, 0)", (f"a{i}", f"api:token{i}", f"api:token{i}:talk"))
        assert people.name_api_people(parts) == {"api:token0": "api:alice", "api:token1": "api:LR_T_BOB",
                                                 "api:token2": "api:#token2"}
        assert [g.question for g in parts.gaps.gaps("api:alice", "local")] == ["alice's"]
        assert [g.question for g in parts.gaps.gaps("api:LR_T_BOB", "local")] == ["bob's"]
        assert [g.question for g in parts.gaps.gaps("api:#token2", "local")] == ["gone's"]
        assert [i.payload["title"] for i in parts.outbox.open_items("api:alice")] == ["alice's"]
        assert {(r["person"], r["conversation"]) for r in parts.feedback.export()} == {
            ("api:alice", "api:alice:talk"), ("api:LR_T_BOB", "api:LR_T_BOB:talk")}
    with Parts(settings_with(tmp_path, [BOB, ALICE]), scheduled=True) as parts:  # reordered: nothing moves
        assert people.name_api_people(parts) == {}
        assert [g.question for g in parts.gaps.gaps("api:alice", "local")] == ["alice's"]


def test_two_entries_with_one_name_variable_or_token_are_refused_with_the_fix(tmp_path, secrets, monkeypatch):
    with pytest.raises(ConfigError, match="two entries of api.tokens share 'alice'"):
        settings_with(tmp_path, [ALICE, {**BOB, "name": "alice"}])
    with pytest.raises(ConfigError, match="two entries of api.tokens share 'LR_T_ALICE'"):
        settings_with(tmp_path, [ALICE, {**ALICE, "name": "other"}])
    with pytest.raises(ConfigError, match="name 'token0': .*not token<n>"):
        settings_with(tmp_path, [{**ALICE, "name": "token0"}])
    with pytest.raises(ConfigError, match="name 'al:ice': 1 to 64 letters"):
        settings_with(tmp_path, [{**ALICE, "name": "al:ice"}])
    monkeypatch.setenv("LR_T_BOB", SECRETS["LR_T_ALICE"])
    with pytest.raises(ConfigError, match="LR_T_ALICE \\(alice\\) and LR_T_BOB \\(LR_T_BOB\\) hold the same token"):
        TokenAuth(Daemon(settings_with(tmp_path, [ALICE, BOB]), services=[]))
