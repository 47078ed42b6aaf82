"""Each person's ranking is their own: BM25's IDF is counted over the asking user's live notes
only (``rag.index.store``), so another person's notes never move my scores or my order, and my
scores say nothing of their words. Real sync from a local fake Leanote, real embedded Qdrant
(and qdrant-client's local mode, the server backend's code), the real USE model."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from rag.index.note_index import NoteIndex
from rag.index.retrieve import search
from bot.root import Parts
from sync.state import State

from conftest import make_settings
from fakes.leanote import FakeLeanote

ONE, TWO = "5dbed2987db161bc2a85b931", "5dbed2987db161bc2a85b932"
BOOK_ONE, BOOK_TWO = "5e16ca22f6ffdbad5b4ba531", "5e16ca22f6ffdbad5b4ba532"
WORD = "quokka"  # in one of TWO's notes, and nowhere else until ONE writes it
QUERY = f"{WORD} 服务迁移的步骤"
_ids = itertools.count(1)

TWO_NOTES = {
    "Quokka": f"# Quokka\n\n{WORD} 服务的迁移：先停写，再导出数据，最后切换域名。",
    "服务迁移": "# 服务迁移\n\n服务迁移的步骤：迁移前先做全量备份，服务迁移的步骤写在运维手册里。",
    "服务上线": "# 服务上线\n\n新服务上线前要压测，上线的步骤由值班的人确认。",
    "周末菜单": "# 周末菜单\n\n周六红烧肉，周日番茄炒蛋。",
}
ONE_NOTES = {
    "机房搬迁": "# 机房搬迁\n\n机房搬迁的步骤：先迁移备份服务，再迁移数据库，最后迁移网关。",
    "读书笔记": "# 读书笔记\n\n这个月读完了两本书，一本讲分布式系统，一本讲做菜。",
    "小动物": f"# 小动物\n\n在澳洲见到了 {WORD}，一种很爱笑的小动物。",
}


def note(user, book, title, content):
    return {"NoteId": "6%023x" % next(_ids), "UserId": user, "NotebookId": book, "Title": title, "Content": content}


@pytest.fixture(params=["edge", "server"])
def world(request, tmp_path, monkeypatch, use_embedder):
    """Two people's notes on a fake Leanote; ``sync()`` runs a pass into the backend's index,
    ``find(user)`` searches it, ``fresh(user)`` searches an index synced from nothing now."""
    monkeypatch.setenv("LR_PW_ONE", "one-pw")
    monkeypatch.setenv("LR_PW_TWO", "two-pw")
    opened: list = []

    def settings_in(folder):
        extra = {"qdrant": {"local_path": str(tmp_path / folder / "local")}} if request.param == "server" else {}
        return make_settings(
            tmp_path / folder, leanote={"base_url": leanote.url},
            source={"kind": "leanote_api", "path": None, "accounts": [
                {"email": "one@example.com", "password_env": "LR_PW_ONE"},
                {"email": "two@example.com", "password_env": "LR_PW_TWO"}]},
            memory={"enabled": False}, **extra)

    def open_in(folder):
        settings = settings_in(folder)
        state = State(settings.state_dir)
        index = NoteIndex.open(settings, create=True, embedder=use_embedder)
        service = Parts(settings, index=index, state=state).sync
        opened.append((service, index, state))
        return service, index

    def sync():
        result = service.run_pass(force=True)
        assert result.ok, result.failures

    def find(user, retriever="hybrid", query=QUERY, index=None):
        return [dataclasses.asdict(h) for h in search(index or main, query, user, 10, retriever)]

    def fresh(user, retriever="sparse", query=QUERY):
        """The ranking of an index that never saw the notes taken out: synced from nothing now."""
        other, index = open_in(f"fresh{len(opened)}")
        result = other.run_pass(force=True)
        assert result.ok, result.failures
        return find(user, retriever, query, index)

    with FakeLeanote() as leanote:
        for user, email, book in ((ONE, "one@example.com", BOOK_ONE), (TWO, "two@example.com", BOOK_TWO)):
            leanote.add_user(user, email, email.split("@")[0] + "-pw")
            leanote.put_notebook({"NotebookId": book, "UserId": user, "Title": "笔记"})
        for title, content in TWO_NOTES.items():
            leanote.put_note(note(TWO, BOOK_TWO, title, content))
        service, main = open_in("main")
        try:
            yield leanote, sync, find, fresh
        finally:
            for svc, index, state in opened:
                svc.close()
                index.close()
                state.close()


def sparse_scores(hits):
    return {h["title"]: h["sparse_score"] for h in hits if h["sparse_score"] is not None}


def test_notes_someone_else_writes_leave_my_scores_and_order_exactly(world):
    """TWO's word is rare; ONE writing it in note after note changes nothing of TWO's search for
    it: not the order, not one score (fused, dense or BM25). (With the IDF counted over everyone's
    notes, TWO's note holding the word fell from first to second here.) ONE's own scores do change."""
    leanote, sync, find, _ = world
    for title, content in list(ONE_NOTES.items())[:2]:
        leanote.put_note(note(ONE, BOOK_ONE, title, content))
    sync()
    two_before = {r: find(TWO, r) for r in ("hybrid", "sparse")}
    one_before = find(ONE, "sparse")
    assert two_before["sparse"][0]["title"] == "Quokka"

    leanote.put_note(note(ONE, BOOK_ONE, "小动物", ONE_NOTES["小动物"]))  # ONE writes TWO's rare word
    for day in range(1, 7):
        leanote.put_note(note(ONE, BOOK_ONE, f"观察日记 {day}", f"# 观察日记 {day}\n\n第 {day} 天，又见到了 {WORD}。"))
    sync()

    assert {r: find(TWO, r) for r in ("hybrid", "sparse")} == two_before
    one_after = find(ONE, "sparse")
    assert {"小动物", "观察日记 1"} <= {h["title"] for h in one_after}  # ONE's new notes are found ...
    before, after = sparse_scores(one_before), sparse_scores(one_after)
    assert after["机房搬迁"] != before["机房搬迁"]  # ... and ONE's statistics moved: N grew


def test_my_scores_follow_my_notes_as_i_trash_restore_and_delete_them(world):
    """ONE's IDF is that of ONE's live notes: after a note is trashed or deleted, ONE's BM25 scores
    are those of an index that never held it; restored, they are the first ones again."""
    leanote, sync, find, fresh = world
    kept = leanote.put_note(note(ONE, BOOK_ONE, "小动物", ONE_NOTES["小动物"]))
    other = leanote.put_note(note(ONE, BOOK_ONE, "动物园", f"# 动物园\n\n{WORD} 住在动物园的东区。"))
    leanote.put_note(note(ONE, BOOK_ONE, "机房搬迁", ONE_NOTES["机房搬迁"]))
    sync()
    first = find(ONE, "sparse")
    assert {"小动物", "动物园"} <= {h["title"] for h in first}

    leanote.put_note({**other, "IsTrash": True})
    sync()
    trashed = find(ONE, "sparse")
    assert "动物园" not in {h["title"] for h in trashed}
    assert sparse_scores(trashed)["小动物"] > sparse_scores(first)["小动物"]  # the word is rarer in ONE's notes
    assert trashed == fresh(ONE)

    leanote.put_note({**other, "IsTrash": False})
    sync()
    assert find(ONE, "sparse") == first

    leanote.put_note({**other, "IsTrash": True, "IsDeleted": True, "Content": ""})
    sync()
    assert find(ONE, "sparse") == trashed == fresh(ONE)
    assert kept["NoteId"] in {h["note_id"] for h in trashed}
