"""Incremental sync straight from Leanote's MongoDB: the query logic against mongomock,
and the same scenario against a real server when LEANOTE_RAG_TEST_MONGO_URL is set."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone

import mongomock
import pytest
from bson import ObjectId

from rag.errors import UserError
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search
from sync.sources.mongodb import MongoSource
from sync.state import State
from bot.root import Parts

from conftest import make_settings

U1 = ObjectId("5dbed2987db161bc2a85b919")
U2 = ObjectId("5f38858837b4dcd92cefeb84")
ROOT, CHILD, SLASHED, NULLED = (ObjectId("5e16ca22f6ffdbad5b4ba5%02d" % i) for i in range(1, 5))
T = datetime(2024, 5, 1, tzinfo=timezone.utc)


def oid(n: int) -> ObjectId:
    return ObjectId(f"{n:024x}")


def seed(db) -> None:
    db.users.insert_many([{"_id": U1, "Email": "one@example.com", "Username": "one", "Usn": 8},
                          {"_id": U2, "Email": "two@example.com", "Username": "two", "Usn": 3}])
    db.notebooks.insert_many([
        {"_id": ROOT, "UserId": U1, "Title": "Java", "Usn": 1, "IsDeleted": False},  # no ParentNotebookId
        {"_id": CHILD, "UserId": U1, "ParentNotebookId": ROOT, "Title": "并发", "Usn": 2, "IsDeleted": False},
        {"_id": SLASHED, "UserId": U1, "ParentNotebookId": "", "Title": "随笔", "Usn": 3},
        {"_id": NULLED, "UserId": U2, "ParentNotebookId": None, "Title": "Linux", "Usn": 1},
    ])
    db.notes.insert_many([
        {"_id": oid(1), "UserId": U1, "NotebookId": CHILD, "Title": "线程池", "IsMarkdown": True, "IsTrash": False,
         "IsDeleted": False, "Usn": 4, "UpdatedTime": T, "Tags": ["java", ""]},
        {"_id": oid(2), "UserId": U1, "NotebookId": SLASHED, "Title": "富文本", "IsMarkdown": False, "Usn": 5, "UpdatedTime": T},
        {"_id": oid(3), "UserId": U1, "NotebookId": CHILD, "Title": "废纸篓", "IsMarkdown": True, "IsTrash": True, "Usn": 6},
        {"_id": oid(4), "UserId": U1, "NotebookId": CHILD, "Title": "没有正文", "IsMarkdown": True, "Usn": 7},
        {"_id": oid(5), "UserId": U2, "NotebookId": NULLED, "Title": "systemd", "IsMarkdown": True, "Usn": 2},
    ])
    db.note_contents.insert_many([
        {"_id": oid(1), "UserId": U1, "Content": "# 线程池\n\n核心参数可以动态调整 DYN-POOL-1。"},
        {"_id": oid(2), "UserId": U1, "Content": "<p>富文本&nbsp;正文 RICH-2</p>"},
        {"_id": oid(3), "UserId": U1, "Content": "回收站里的内容 TRASHED-3"},
        {"_id": oid(5), "UserId": U2, "Content": "RestartSec 控制重启间隔 SYSTEMD-5"},
    ])


def run_scenario(settings, client, db, use_embedder):
    """Sync, change things the way Leanote does (USN bumps), sync again."""
    state = State(settings.state_dir)
    index = NoteIndex.open(settings, create=True, embedder=use_embedder)
    service = Parts(settings, index=index, state=state).sync
    service.source = MongoSource(settings, client=client)
    try:
        first = service.run_pass()
        assert first.ok and set(first.results) == {str(U1), str(U2)}
        hit = search(index, "DYN-POOL-1", str(U1))[0]
        assert hit.title == "线程池" and hit.notebook == "Java / 并发" and hit.tags == ["java"]
        assert search(index, "RICH-2", str(U1))[0].notebook == "随笔"
        assert all("TRASHED-3" not in h.text for h in search(index, "TRASHED-3", str(U1)))
        assert search(index, "SYSTEMD-5", str(U2))[0].notebook == "Linux"
        assert all(h.user_id == str(U1) for h in search(index, "SYSTEMD-5", str(U1)))
        assert first.results[str(U1)].cursor == 7  # the highest USN received (users.Usn says 8)

        # users.Usn (8) is above every note and notebook USN (a tag edit, say): still idle
        assert all(r.idle for r in service.run_pass().results.values())

        # an edit, a trash, a move: USNs bumped, users.Usn bumped, nothing else touched
        db.note_contents.update_one({"_id": oid(1)}, {"$set": {"Content": "# 线程池\n\n改成了 NEW-POOL-9。"}})
        db.notes.update_one({"_id": oid(1)}, {"$set": {"Usn": 9}})
        db.notes.update_one({"_id": oid(2)}, {"$set": {"IsTrash": True, "Usn": 10}})
        db.notes.update_one({"_id": oid(5)}, {"$set": {"NotebookId": NULLED, "Usn": 4}})
        db.users.update_one({"_id": U1}, {"$set": {"Usn": 10}})
        second = service.run_pass().summary
        assert second.updated == 1 and second.deleted == 1
        assert "NEW-POOL-9" in search(index, "NEW-POOL-9", str(U1))[0].text
        assert all(h.title != "富文本" for h in search(index, "RICH-2", str(U1)))
        # a note removed by hand: only the reconcile can see it
        db.notes.delete_one({"_id": oid(1)})
        assert service.run_pass(reconcile=True).summary.deleted == 1
        assert all(h.title != "线程池" for h in search(index, "NEW-POOL-9", str(U1)))
    finally:
        index.close()
        state.close()


def test_mongodb_sync_with_mongomock(tmp_path, use_embedder, monkeypatch):
    monkeypatch.setenv("LR_TEST_MONGO", "mongodb://127.0.0.1:27017/leanote")
    client = mongomock.MongoClient(tz_aware=True)
    seed(client.leanote)
    settings = make_settings(tmp_path, source={"kind": "mongodb", "path": None, "url_env": "LR_TEST_MONGO"})
    run_scenario(settings, client, client.leanote, use_embedder)


def test_users_filter_by_email_or_id(tmp_path, monkeypatch):
    client = mongomock.MongoClient(tz_aware=True)
    seed(client.leanote)
    settings = make_settings(tmp_path, source={"kind": "mongodb", "path": None, "url_env": "X",
                                               "users": ["two@example.com"]})
    assert MongoSource(settings, client=client).accounts() == [str(U2)]
    settings = make_settings(tmp_path, source={"kind": "mongodb", "path": None, "url_env": "X",
                                               "users": [str(U1), "nobody@example.com"]})
    with pytest.raises(UserError, match="nobody@example.com"):
        MongoSource(settings, client=client).accounts()


def test_database_name_comes_from_the_url(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_TEST_MONGO", "mongodb://u:p@db.home:27018/myleanote?authSource=admin")
    settings = make_settings(tmp_path, source={"kind": "mongodb", "path": None, "url_env": "LR_TEST_MONGO"})
    source = MongoSource(settings)
    try:
        assert source.dbname == "myleanote" and source.name == "mongodb:db.home:27018"
    finally:
        source.close()


@pytest.mark.skipif(not os.environ.get("LEANOTE_RAG_TEST_MONGO_URL"), reason="set LEANOTE_RAG_TEST_MONGO_URL to test a real MongoDB")
def test_mongodb_sync_with_a_real_server(tmp_path, use_embedder, monkeypatch):
    from pymongo import MongoClient

    url = os.environ["LEANOTE_RAG_TEST_MONGO_URL"]
    dbname = f"leanote_rag_test_{uuid.uuid4().hex[:8]}"
    client = MongoClient(url, tz_aware=True, serverSelectionTimeoutMS=5000)
    try:
        seed(client[dbname])
        monkeypatch.setenv("LR_TEST_MONGO", url)
        settings = make_settings(tmp_path, source={"kind": "mongodb", "path": None, "url_env": "LR_TEST_MONGO",
                                                   "database": dbname})
        run_scenario(settings, MongoSource(settings).client, client[dbname], use_embedder)
    finally:
        client.drop_database(dbname)
        client.close()
