"""Incremental sync from a Leanote server over its HTTP API (a local fake that follows
``leanote-api.md``), through the real sync code, into real embedded Qdrant."""

from __future__ import annotations

import itertools

import pytest

from rag.errors import AuthFailed, Unavailable
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search
from sync.sources.leanote_api import LeanoteApi, usn_pages
from sync.state import State
from bot.root import Parts

from conftest import make_settings
from fakes.leanote import FakeLeanote

ALICE = "5dbed2987db161bc2a85b919"
BOB = "5f38858837b4dcd92cefeb84"
WORK, PROJ, PRIVATE, DIARY = ("5e16ca22f6ffdbad5b4ba5%02d" % i for i in (1, 2, 3, 4))
_ids = itertools.count(1)


def nid() -> str:
    return "6%023x" % next(_ids)


class Clock:
    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def note(user, book, title, content, **kw):
    return {"NoteId": kw.pop("NoteId", None) or nid(), "UserId": user, "NotebookId": book, "Title": title,
            "Content": content, **kw}


@pytest.fixture
def leanote(monkeypatch):
    monkeypatch.setenv("LR_PW_ALICE", "alice-pw")
    monkeypatch.setenv("LR_PW_BOB", "bob-pw")
    with FakeLeanote() as fake:
        fake.add_user(ALICE, "alice@example.com", "alice-pw")
        fake.add_user(BOB, "bob@example.com", "bob-pw")
        fake.put_notebook({"NotebookId": WORK, "UserId": ALICE, "Title": "工作"})
        fake.put_notebook({"NotebookId": PROJ, "UserId": ALICE, "Title": "项目", "ParentNotebookId": WORK})
        fake.put_notebook({"NotebookId": PRIVATE, "UserId": ALICE, "Title": "私密"})
        fake.put_notebook({"NotebookId": DIARY, "UserId": ALICE, "Title": "日记", "ParentNotebookId": PRIVATE})
        yield fake


@pytest.fixture
def world(leanote, tmp_path, use_embedder):
    """Settings for the fake server, and a function that runs one sync pass."""
    settings = make_settings(
        tmp_path,
        leanote={"base_url": leanote.url},
        source={"kind": "leanote_api", "path": None, "accounts": [
            {"email": "alice@example.com", "password_env": "LR_PW_ALICE"},
            {"email": "bob@example.com", "password_env": "LR_PW_BOB"}]},
        exclude={"notebooks": ["私密"], "tags": ["private"]},
        sync={"page_size": 3, "http_timeout": 2},
    )
    clock = Clock()
    opened = {}

    def sync(reconcile=False, force=False):
        if not opened:
            opened["state"] = State(settings.state_dir)
            opened["index"] = NoteIndex.open(settings, create=True, embedder=use_embedder)
            opened["service"] = Parts(settings, index=opened["index"], state=opened["state"], clock=clock,
                                      rng=lambda: 0.5, scheduled=True).sync  # as in the daemon: passes repeat
        return opened["service"].run_pass(reconcile=reconcile, force=force)

    def find(query, user=ALICE, k=10):
        return search(opened["index"], query, user, k)

    yield settings, sync, find, clock, opened
    if opened:
        opened["index"].close()
        opened["state"].close()


def titles(hits):
    return [h.title for h in hits]


def test_first_sync_indexes_searchable_notes_only(leanote, world):
    settings, sync, find, _, opened = world
    leanote.put_note(note(ALICE, PROJ, "发布流程", "# 发布\n\n灰度发布先放 5% 流量，观察 30 分钟再全量。", Tags=["运维", ""]))
    leanote.put_note(note(ALICE, WORK, "废弃方案", "蓝绿部署的旧方案 OBSOLETE-PLAN-X", IsTrash=True))
    leanote.put_note(note(ALICE, DIARY, "心情", "今天的秘密 SECRET-DIARY-42"))
    leanote.put_note(note(ALICE, WORK, "私人标签", "带私有标签的内容 TAGGED-PRIVATE-7", Tags=["private"]))
    leanote.put_note(note(BOB, "", "Bob 的笔记", "Bob 的服务器在机房 B3 BOB-ONLY-99"))
    result = sync()
    assert result.ok and set(result.results) == {"alice@example.com", "bob@example.com"}
    hits = find("灰度发布放多少流量")
    assert hits[0].title == "发布流程" and hits[0].notebook == "工作 / 项目"
    assert hits[0].url == f"{leanote.url}/note/{hits[0].note_id}"
    for secret in ("OBSOLETE-PLAN-X", "SECRET-DIARY-42", "TAGGED-PRIVATE-7", "BOB-ONLY-99"):
        assert all(secret not in h.text for h in find(secret))
    assert "BOB-ONLY-99" in find("BOB-ONLY-99", user=BOB)[0].text
    acc = opened["state"].account(opened["service"].source.name, "alice@example.com")
    assert acc.cursor == acc.server_usn == leanote.users[ALICE]["Usn"]


def test_idle_sync_is_one_call_per_account(leanote, world):
    _, sync, _, _, _ = world
    leanote.put_note(note(ALICE, WORK, "a", "内容"))
    sync()
    leanote.calls.clear()
    result = sync()
    assert all(r.idle for r in result.results.values())
    assert dict(leanote.calls) == {"user/getSyncState": 2}


def test_edit_reembeds_only_changed_chunks_and_old_text_leaves(leanote, world):
    _, sync, find, _, _ = world
    body = "\n\n".join(f"## 第{i}节\n\n" + f"第{i}节讲的是一个独立的话题编号{i}，" * 40 for i in range(6))
    n = leanote.put_note(note(ALICE, WORK, "长笔记", body + "\n\n## 结尾\n\n旧结论 OLD-CONCLUSION-1。"))
    first = sync().summary
    assert first.chunks_embedded >= 6
    leanote.put_note({**n, "Content": body + "\n\n## 结尾\n\n新结论 NEW-CONCLUSION-2。"})
    second = sync().summary
    assert second.updated == 1 and second.chunks_embedded == 1
    assert second.chunks_cached >= first.chunks_embedded - 1
    assert "NEW-CONCLUSION-2" in find("NEW-CONCLUSION-2")[0].text
    assert all("OLD-CONCLUSION-1" not in h.text for h in find("OLD-CONCLUSION-1"))


def test_trash_restore_and_delete(leanote, world):
    _, sync, find, _, _ = world
    n = leanote.put_note(note(ALICE, WORK, "回收站测试", "独特关键词 TRASH-ME-3"))
    sync()
    assert find("TRASH-ME-3")[0].title == "回收站测试"
    leanote.put_note({**n, "IsTrash": True})
    assert sync().summary.deleted == 1
    assert all(h.title != "回收站测试" for h in find("TRASH-ME-3"))
    leanote.put_note({**n, "IsTrash": False})
    restored = sync().summary
    assert restored.added == 1 and restored.chunks_embedded == 0  # the vectors were cached
    assert find("TRASH-ME-3")[0].title == "回收站测试"
    leanote.put_note({**n, "IsTrash": True, "IsDeleted": True, "Content": ""})
    assert sync().summary.deleted == 1
    assert all(h.title != "回收站测试" for h in find("TRASH-ME-3"))


def test_move_and_notebook_rename_update_paths_without_reembedding(leanote, world):
    _, sync, find, _, _ = world
    n = leanote.put_note(note(ALICE, WORK, "搬家", "搬家用的纸箱放在阳台 MOVE-BOX-5"))
    sync()
    leanote.put_note({**n, "NotebookId": PROJ})
    moved = sync().summary
    assert moved.moved == 1 and moved.chunks_embedded == 0
    assert find("MOVE-BOX-5")[0].notebook == "工作 / 项目"
    leanote.put_notebook({"NotebookId": WORK, "UserId": ALICE, "Title": "公司"})
    renamed = sync().summary
    assert renamed.chunks_embedded == 0
    assert find("MOVE-BOX-5")[0].notebook == "公司 / 项目"
    leanote.put_notebook({"NotebookId": PROJ, "UserId": ALICE, "Title": "项目", "ParentNotebookId": ""})  # to root
    sync()
    assert find("MOVE-BOX-5")[0].notebook == "项目"


def test_privacy_follows_moves_tags_and_notebooks(leanote, world):
    _, sync, find, _, _ = world
    n = leanote.put_note(note(ALICE, WORK, "会变私密", "这条笔记会被挪进私密 GO-PRIVATE-8"))
    m = leanote.put_note(note(ALICE, WORK, "会加标签", "这条笔记会加私有标签 TAG-LATER-9"))
    leanote.put_note(note(ALICE, DIARY, "日记里的", "日记里的内容 DIARY-LEAVES-10"))
    sync()
    assert find("GO-PRIVATE-8")[0].title == "会变私密"
    leanote.put_note({**n, "NotebookId": DIARY})  # into a private notebook's child
    leanote.put_note({**m, "Tags": ["private"]})
    out = sync().summary
    assert out.deleted == 2
    assert all(h.title not in ("会变私密", "会加标签") for h in find("GO-PRIVATE-8 TAG-LATER-9"))
    assert all(h.title != "日记里的" for h in find("DIARY-LEAVES-10"))
    # the diary notebook moves out of the private tree: its notes come in, fetched by id
    leanote.put_notebook({"NotebookId": DIARY, "UserId": ALICE, "Title": "日记", "ParentNotebookId": WORK})
    back = sync().summary
    assert back.added == 2
    assert find("DIARY-LEAVES-10")[0].notebook == "工作 / 日记"


@pytest.mark.slow
def test_equal_usn_group_across_a_page_boundary(leanote, world):
    _, sync, find, _, _ = world
    usn = leanote.users[ALICE]["Usn"] + 1
    for i in range(7):  # one USN on 7 notes, pages of 3
        leanote.put_note(note(ALICE, WORK, f"博客{i}", f"同一批发布的第{i}篇 SAME-USN-{i}"), usn=usn)
    result = sync()
    assert result.summary.added == 7
    for i in range(7):
        assert find(f"SAME-USN-{i}")[0].title == f"博客{i}"


def test_usn_pages_widen_a_page_that_holds_only_one_group():
    rows = [{"NoteId": f"n{i}", "Usn": 5} for i in range(5)] + [{"NoteId": "last", "Usn": 6}]
    asked = []

    def fetch(after, limit):
        asked.append((after, limit))
        return [r for r in rows if r["Usn"] > after][:limit]

    pages = list(usn_pages(fetch, 0, 2, "NoteId"))
    got = [d["NoteId"] for items, _ in pages for d in items]
    assert sorted(got) == sorted(r["NoteId"] for r in rows) and len(got) == len(set(got))
    assert pages[-1][1] == 6  # covered everything at the end
    assert all(covered < 5 for _, covered in pages[:-1])  # never past an unfinished group
    assert any(limit > 2 for _, limit in asked)  # a page of one group made the page bigger


def test_expired_token_logs_in_again(leanote, world):
    _, sync, find, _, _ = world
    leanote.put_note(note(ALICE, WORK, "令牌", "第一条"))
    sync()
    leanote.expire_tokens()
    leanote.put_note(note(ALICE, WORK, "令牌二", "第二条 RELOGIN-11"))
    leanote.calls.clear()
    assert sync().ok
    assert leanote.calls["auth/login"] == 2  # once per account, after NOTLOGIN
    assert find("RELOGIN-11")[0].title == "令牌二"


def test_wrong_password_stops_that_account_only(leanote, world, monkeypatch):
    _, sync, find, _, opened = world
    monkeypatch.setenv("LR_PW_BOB", "wrong")
    leanote.put_note(note(ALICE, WORK, "照常", "Alice 的同步不受影响 ALICE-OK-12"))
    first = sync()
    assert "bob@example.com" in first.failures and "refused the login" in first.failures["bob@example.com"]
    assert find("ALICE-OK-12")[0].title == "照常"
    leanote.calls.clear()
    second = sync()
    assert second.skipped["bob@example.com"].startswith("stopped:")
    assert leanote.calls["auth/login"] == 0  # no retry storm
    acc = opened["state"].account(opened["service"].source.name, "bob@example.com")
    assert acc.last_error.startswith("auth:")


def test_server_errors_back_off_and_recover(leanote, world, caplog):
    _, sync, find, clock, opened = world
    leanote.put_note(note(ALICE, WORK, "稳定", "内容"))
    sync()
    leanote.put_note(note(ALICE, WORK, "故障期间写的", "服务器出错时写下的 DURING-OUTAGE-13"))
    leanote.fail("note/getSyncNotes", times=100)
    caplog.set_level("DEBUG", logger="sync.service")
    failed = sync()
    assert "alice@example.com" in failed.failures and "HTTP 500" in failed.failures["alice@example.com"]
    acc = opened["state"].account(opened["service"].source.name, "alice@example.com")
    assert acc.next_run == pytest.approx(clock.t + 30.0)  # backoff_min, jitter at its middle
    calls = sum(leanote.calls.values())
    assert "alice@example.com" in sync().skipped  # still backing off: no call made
    assert sum(leanote.calls.values()) == calls + 1  # only bob's getSyncState
    clock.t += 31
    sync()  # fails again: the delay doubles
    acc = opened["state"].account(opened["service"].source.name, "alice@example.com")
    assert acc.next_run == pytest.approx(clock.t + 60.0)
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "failing" in r.getMessage()]
    assert len(warnings) == 1  # logged once when failing starts
    leanote.fail("note/getSyncNotes", times=0)
    clock.t += 61
    assert sync().ok
    assert any("recovered" in r.getMessage() for r in caplog.records)
    assert find("DURING-OUTAGE-13")[0].title == "故障期间写的"
    acc = opened["state"].account(opened["service"].source.name, "alice@example.com")
    assert acc.last_error is None and acc.failing_since is None


def test_backoff_is_capped(world):
    settings, sync, _, _, opened = world
    sync()
    service = opened["service"]
    assert [round(service.backoff(n)) for n in (1, 2, 3, 10, 50)] == [30, 60, 120, 1800, 1800]


@pytest.mark.slow
def test_a_timeout_is_a_failure_not_a_crash(leanote, world):
    _, sync, _, _, _ = world
    sync()
    leanote.stall("user/getSyncState", 3.0)  # http_timeout is 2 s
    result = sync()
    assert "did not answer" in result.failures["alice@example.com"]


def test_malformed_id_and_vanished_note_are_skipped_not_fatal(leanote, world):
    _, sync, find, _, _ = world
    leanote.put_note(note(ALICE, WORK, "坏 id", "内容", NoteId="not-a-hex-id"))
    gone = leanote.put_note(note(ALICE, WORK, "消失", "马上就没了"))
    leanote.put_note(note(ALICE, WORK, "好的", "正常笔记 FINE-14"))
    real_dispatch = leanote.dispatch

    def vanishing(action, p):  # the note disappears between the listing and the fetch
        if action == "note/getNoteContent" and p.get("noteId") == gone["NoteId"]:
            return 200, {"NoteId": "", "UserId": "", "Content": ""}, False
        return real_dispatch(action, p)

    leanote.dispatch = vanishing
    result = sync()
    assert result.ok
    skipped = {s["note"] for s in result.summary.skipped}
    assert "note not-a-hex-id" in skipped
    assert find("FINE-14")[0].title == "好的"
    assert all(h.title != "消失" for h in find("马上就没了"))


def test_times_with_nine_fractional_digits_and_null_tags(leanote, world):
    _, sync, find, _, _ = world
    leanote.put_note(note(ALICE, WORK, "时间格式", "纳秒时间 NANO-15", Tags=None,
                          UpdatedTime="2015-03-31T00:25:01.149312407+08:00"))
    sync()
    hit = find("NANO-15")[0]
    assert hit.updated_at.startswith("2015-03-31T00:25:01.149312") and hit.tags == []


def test_reconcile_removes_what_the_stream_cannot_show(leanote, world):
    _, sync, find, _, opened = world
    n = leanote.put_note(note(ALICE, WORK, "被硬删除", "数据库里被手工删掉 HARD-DELETE-16"))
    sync()
    with leanote.lock:
        del leanote.notes[n["NoteId"]]  # gone without a tombstone or a USN bump
    assert sync().summary.deleted == 0  # the stream cannot see it
    result = sync(reconcile=True)
    assert result.summary.deleted == 1
    assert all(h.title != "被硬删除" for h in find("HARD-DELETE-16"))


def test_reconcile_applies_changed_privacy_rules(leanote, world, use_embedder):
    settings, sync, find, _, opened = world
    leanote.put_note(note(ALICE, DIARY, "日记", "原本私密的日记 WAS-PRIVATE-17"))
    leanote.put_note(note(ALICE, WORK, "工作", "原本公开的工作 WAS-PUBLIC-18"))
    sync()
    assert all(h.title != "日记" for h in find("WAS-PRIVATE-17"))
    # the user edits the config: 私密 is no longer private, 工作 is
    opened["index"].close()
    opened["state"].close()
    new = settings.model_copy(update={"exclude": settings.exclude.model_copy(update={"notebooks": ["工作"]})})
    opened["state"] = State(new.state_dir)
    opened["index"] = NoteIndex.open(new, create=True, embedder=use_embedder)
    opened["service"] = Parts(new, index=opened["index"], state=opened["state"]).sync
    result = opened["service"].run_pass()
    assert result.summary.added == 1 and result.summary.deleted == 1
    assert find("WAS-PRIVATE-17")[0].title == "日记"
    assert all(h.title != "工作" for h in find("WAS-PUBLIC-18"))


def test_login_with_username_and_wrong_password_messages(leanote):
    api = LeanoteApi(leanote.url, "alice", "alice-pw")
    assert api.server_usn() >= 0 and api.user_id == ALICE
    bad = LeanoteApi(leanote.url, "alice@example.com", "nope")
    with pytest.raises(AuthFailed, match="refused the login of alice@example.com"):
        bad.server_usn()


def test_an_answer_that_is_not_json_is_named_and_backed_off(leanote, world):
    """A proxy's page or a PHP error as HTTP 200 is not "HTTP 200": the message says what
    came back, and the account backs off like any outage."""
    _, sync, find, clock, opened = world
    sync()
    page = b"<!DOCTYPE html>\n<html><head><title>Leanote</title></head><body>" + b"x" * 500 + b"</body></html>"
    leanote.fail("note/getSyncNotes", times=100, status=200, body=page, content_type="text/html")
    leanote.put_note(note(ALICE, WORK, "稍后", "NOT-JSON-31"))
    failed = sync()
    error = failed.failures["alice@example.com"]
    assert error.startswith(f"Leanote at {leanote.url} answered /api/note/getSyncNotes with something that is not "
                            "JSON: <!DOCTYPE html> <html><head><title>Leanote</title>")
    assert error.endswith("…") and "HTTP 200" not in error and len(error) < 250
    acc = opened["state"].account(opened["service"].source.name, "alice@example.com")
    assert acc.next_run == pytest.approx(clock.t + 30.0)  # Unavailable: backoff_min, jitter at its middle
    assert "bob@example.com" not in failed.failures  # Bob had nothing new: his idle pass is one good call
    leanote.fail("note/getSyncNotes", times=0)
    clock.t += 31
    assert sync().ok and find("NOT-JSON-31")[0].title == "稍后"


def test_a_login_answer_that_is_not_json_says_what_it_was(leanote):
    leanote.fail("auth/login", status=200, body=b"Fatal error: Allowed memory size exhausted")
    with pytest.raises(Unavailable, match="answered /api/auth/login with something that is not JSON: Fatal error: "
                                          "Allowed memory size exhausted$"):
        LeanoteApi(leanote.url, "alice@example.com", "alice-pw").server_usn()
    leanote.fail("auth/login", status=200, body=b"")
    with pytest.raises(Unavailable, match="not JSON: an empty body"):
        LeanoteApi(leanote.url, "alice@example.com", "alice-pw").server_usn()
