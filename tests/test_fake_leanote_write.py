"""The fake Leanote's write API (addNote, updateNote, addNotebook), its listing calls and its
outage controls, spoken to over real HTTP with ``requests`` as a client would."""

from __future__ import annotations

import re

import pytest
import requests

from fakes.leanote import NOTE_KEYS, NOTEBOOK_KEYS, FakeLeanote, Upload

ALICE = "5dbed2987db161bc2a85b919"
BOB = "5f38858837b4dcd92cefeb84"
WORK, HOME, BOBS = "5e16ca22f6ffdbad5b4ba501", "5e16ca22f6ffdbad5b4ba502", "5e16ca22f6ffdbad5b4ba503"
LOCAL_IMAGE, LOCAL_ATTACH = "64a000000000000000000001", "64a000000000000000000002"
NEW_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?\+08:00$")
BINARY = bytes(range(256)) + b"\r\n--boundary-like\r\n\n\r" + bytes(range(255, -1, -1))
RE_KEYS = ["Ok", "Code", "Msg", "Id", "List", "Item"]


@pytest.fixture
def leanote():
    with FakeLeanote() as fake:
        fake.add_user(ALICE, "alice@example.com", "alice-pw")
        fake.add_user(BOB, "bob@example.com", "bob-pw")
        fake.put_notebook({"NotebookId": WORK, "UserId": ALICE, "Title": "工作"})
        fake.put_notebook({"NotebookId": HOME, "UserId": ALICE, "Title": "家"})
        fake.put_notebook({"NotebookId": BOBS, "UserId": BOB, "Title": "Bob"})
        yield fake


def login(fake: FakeLeanote, email: str = "alice@example.com", pwd: str = "alice-pw") -> str:
    return requests.post(f"{fake.url}/api/auth/login", data={"email": email, "pwd": pwd}, timeout=5).json()["Token"]


@pytest.fixture
def api(leanote):
    """``api(action, files=None, **params)``: one call as Alice, the token in the query
    string, the parameters as a form (multipart when there are files); the response."""
    token = login(leanote)

    def call(action: str, files=None, token=token, **params):
        return requests.post(f"{leanote.url}/api/{action}", params={"token": token}, data=params, files=files,
                             timeout=5)

    return call


def usn(api) -> int:
    return api("user/getSyncState").json()["LastSyncUsn"]


def add(api, title="笔记", content="内容", book=WORK, **fields) -> dict:
    body = api("note/addNote", NotebookId=book, Title=title, Content=content, IsMarkdown="true", **fields).json()
    assert body.get("Ok", True), body
    return body


def test_add_note_with_tags_image_and_attachment(leanote, api):
    before = usn(api)
    content = (f"![图](https://leanote.example/api/file/getImage?fileId={LOCAL_IMAGE})\n"
               f"[报告](https://leanote.example/api/file/getAttach?fileId={LOCAL_ATTACH})")
    answer = api("note/addNote", files={
        f"FileDatas[{LOCAL_IMAGE}]": ("pic.png", BINARY, "image/png"),
        f"FileDatas[{LOCAL_ATTACH}]": ("报告.PDF", b"%PDF-1.4 report", "application/pdf"),
    }, **{"NotebookId": WORK, "Title": "带附件", "Content": content, "IsMarkdown": "true",
          "Tags[0]": "旅行", "Tags[1]": "2024",
          "Files[0][LocalFileId]": LOCAL_IMAGE, "Files[0][IsAttach]": "false", "Files[0][HasBody]": "true",
          "Files[0][Type]": "png",
          "Files[1][LocalFileId]": LOCAL_ATTACH, "Files[1][IsAttach]": "true", "Files[1][HasBody]": "true",
          "Files[1][Type]": "pdf", "Files[1][Title]": "报告.PDF"})
    assert answer.status_code == 200
    note = answer.json()
    assert list(note) == NOTE_KEYS
    image_id, attach_id = note["Files"][0]["FileId"], note["Files"][1]["FileId"]
    assert all(re.fullmatch(r"[0-9a-f]{24}", i) for i in (note["NoteId"], image_id, attach_id))
    assert note["Usn"] == before + 1 == usn(api)
    assert (note["UserId"], note["NotebookId"], note["IsMarkdown"]) == (ALICE, WORK, True)
    assert note["Tags"] == ["旅行", "2024"]
    assert (note["Content"], note["Abstract"]) == ("", "")
    assert note["Files"][1] == {"FileId": attach_id, "LocalFileId": LOCAL_ATTACH, "Type": "pdf", "Title": "报告.PDF",
                                "HasBody": True, "IsAttach": True}  # the request's list, ids filled in
    assert NEW_TIME.match(note["CreatedTime"]) and note["PublicTime"] == "0001-01-01T00:00:00Z"

    stored = api("note/getNoteAndContent", noteId=note["NoteId"]).json()
    assert stored["Content"] == content.replace(LOCAL_IMAGE, image_id).replace(LOCAL_ATTACH, attach_id)
    synced = api("note/getSyncNotes", afterUsn=before).json()
    assert [n["NoteId"] for n in synced] == [note["NoteId"]] and synced[0]["Usn"] == note["Usn"]
    assert synced[0]["Files"] == [
        {"FileId": image_id, "LocalFileId": "", "Type": "", "Title": "", "HasBody": False, "IsAttach": False},
        {"FileId": attach_id, "LocalFileId": "", "Type": "pdf", "Title": "报告.PDF", "HasBody": False,
         "IsAttach": True}]
    assert synced[0]["PublicTime"] == synced[0]["CreatedTime"]  # NoteService.AddNote sets it
    assert leanote.files[image_id]["Data"] == BINARY and leanote.files[image_id]["ContentType"] == "image/png"
    action, params = leanote.writes[-1]
    assert action == "note/addNote" and "token" not in params and params["Tags[1]"] == "2024"
    assert params[f"FileDatas[{LOCAL_ATTACH}]"] == Upload("报告.PDF", b"%PDF-1.4 report", "application/pdf")


def test_add_note_urlencoded_without_files(api):
    note = add(api, title="纯文本", content="a&b=c\r\n第二行\n")
    assert note["Files"] is None and note["Tags"] is None  # not sent: null, as Revel binds them
    assert api("note/getNoteContent", noteId=note["NoteId"]).json()["Content"] == "a&b=c\r\n第二行\n"


def test_add_note_notebook_id_is_only_checked_to_be_hex(leanote, api):
    before = usn(api)
    for book in ("", "not-a-notebook"):
        answer = api("note/addNote", NotebookId=book, Title="无处可放").json()
        assert answer == {"Ok": False, "Code": 0, "Msg": "notebookIdNotExists", "Id": "", "List": None, "Item": None}
    assert usn(api) == before and leanote.notes_titled(ALICE, "无处可放") == []
    orphan = add(api, title="孤儿", book="64a0000000000000000000ff")  # Leanote accepts an unknown notebook id
    assert orphan["Usn"] == before + 1 and orphan["NotebookId"] == "64a0000000000000000000ff"


def test_upload_errors(leanote, api):
    leanote.max_upload_mb = 0.001  # 1048 bytes
    before = usn(api)
    fields = {"NotebookId": WORK, "Title": "大文件", "Files[0][LocalFileId]": LOCAL_ATTACH,
              "Files[0][IsAttach]": "true", "Files[0][HasBody]": "true"}
    big = {f"FileDatas[{LOCAL_ATTACH}]": ("big.zip", b"x" * 2000, "application/zip")}
    answer = api("note/addNote", files=big, **fields).json()
    assert list(answer) == RE_KEYS and (answer["Ok"], answer["Msg"]) == (False, "fileUploadError")
    empty = {f"FileDatas[{LOCAL_ATTACH}]": ("empty.zip", b"", "application/zip")}
    assert api("note/addNote", files=empty, **fields).json()["Msg"] == ""
    missing = api("note/addNote", files={"other": ("a.txt", b"a", "text/plain")}, **fields)
    assert missing.status_code == 500 and missing.text.startswith("runtime error")  # a Go panic
    assert usn(api) == before and leanote.notes_titled(ALICE, "大文件") == []

    note = add(api)
    fields.update(NoteId=note["NoteId"], Usn=str(note["Usn"]))
    assert api("note/updateNote", files=big, **fields).json() == {"Ok": False, "Msg": "fileIsTooLarge", "Usn": 0}


def test_update_note_changes_only_what_is_sent(leanote, api):
    note = add(api, title="旧标题", content="旧内容", **{"Tags[0]": "keep"})
    answer = api("note/updateNote", NoteId=note["NoteId"], Usn=note["Usn"], Title="新标题").json()
    assert list(answer) == NOTE_KEYS and answer["Usn"] == note["Usn"] + 1 == usn(api)
    assert (answer["Title"], answer["Content"], answer["UserId"]) == ("新标题", "", ALICE)
    stored = leanote.notes[note["NoteId"]]
    assert (stored["Title"], stored["Content"], stored["Tags"]) == ("新标题", "旧内容", ["keep"])
    assert stored["Usn"] == answer["Usn"]

    moved = api("note/updateNote", NoteId=note["NoteId"], Usn=answer["Usn"], NotebookId=HOME, IsTrash="true",
                **{"Tags[0]": "a", "Tags[1]": "b"}).json()
    assert (stored["NotebookId"], stored["IsTrash"], stored["Tags"]) == (HOME, True, ["a", "b"])
    assert stored["Usn"] == moved["Usn"]

    updated_time = stored["UpdatedTime"]
    edited = api("note/updateNote", NoteId=note["NoteId"], Usn=moved["Usn"], Content="新内容").json()
    assert edited["Usn"] == moved["Usn"] + 1 and stored["Content"] == "新内容"
    assert stored["UpdatedTime"] == updated_time  # Leanote's content-only update leaves the note's time
    synced = api("note/getSyncNotes", afterUsn=moved["Usn"]).json()
    assert [(n["NoteId"], n["Usn"]) for n in synced] == [(note["NoteId"], edited["Usn"])]


def test_update_conflict_changes_nothing(leanote, api):
    note = add(api, title="共享", content="我的版本")
    other = leanote.edit_note(note["NoteId"], content="别人的版本")
    assert other["Usn"] == note["Usn"] + 1
    answer = api("note/updateNote", NoteId=note["NoteId"], Usn=note["Usn"], Title="标题", Content="我的").json()
    assert answer == {"Ok": False, "Msg": "conflict", "Usn": 0}
    stored = leanote.notes[note["NoteId"]]
    assert (stored["Title"], stored["Content"], stored["Usn"]) == ("共享", "别人的版本", other["Usn"])
    assert usn(api) == other["Usn"]


def test_update_note_errors(leanote, api):
    note = add(api)
    bobs = leanote.put_note({"NoteId": "64b000000000000000000001", "UserId": BOB, "NotebookId": BOBS, "Title": "b"})
    before = usn(api)
    assert api("note/updateNote", Usn="1", Title="x").json() == {"Ok": False, "Msg": "noteIdNotExists", "Usn": 0}
    for bad_usn in ({}, {"Usn": "0"}, {"Usn": "-3"}, {"Usn": "abc"}):
        answer = api("note/updateNote", NoteId=note["NoteId"], Title="x", **bad_usn).json()
        assert answer == {"Ok": False, "Msg": "usnNotExists", "Usn": 0}
    for other in (bobs["NoteId"], "64b0000000000000000000ff"):
        assert api("note/updateNote", NoteId=other, Usn="1", Title="x").json()["Msg"] == "notExists"
    assert api("note/updateNote", NoteId="not-hex", Usn="1", Title="x").status_code == 500
    nothing = api("note/updateNote", NoteId=note["NoteId"], Usn=note["Usn"]).json()
    assert nothing == {"Ok": False, "Msg": "", "Usn": 0}  # nothing to change is not a success
    assert usn(api) == before and leanote.notes[note["NoteId"]]["Title"] == "笔记"


def test_update_deletes_the_attachments_it_does_not_list(leanote, api):
    files = {f"FileDatas[{LOCAL_ATTACH}]": ("a.txt", b"attached", "text/plain")}
    note = api("note/addNote", files=files, **{
        "NotebookId": WORK, "Title": "附件",
        "Files[0][IsAttach]": "true", "Files[0][LocalFileId]": LOCAL_ATTACH, "Files[0][HasBody]": "true"}).json()
    attach_id = note["Files"][0]["FileId"]
    kept = api("note/updateNote", NoteId=note["NoteId"], Usn=note["Usn"], Title="改名",
               **{"Files[0][FileId]": attach_id, "Files[0][IsAttach]": "true"}).json()
    assert kept["Usn"] == note["Usn"] + 1
    assert [f["FileId"] for f in leanote.notes[note["NoteId"]]["Files"]] == [attach_id]
    dropped = api("note/updateNote", NoteId=note["NoteId"], Usn=kept["Usn"], Title="再改").json()
    assert dropped["Usn"] == kept["Usn"] + 2  # one USN for the deletion, one for the update
    assert leanote.notes[note["NoteId"]]["Files"] == [] and attach_id not in leanote.files


def test_listing_calls(leanote, api):
    def put(title, time, **kw):
        return leanote.put_note({"NoteId": "64c0000000000000000000%02d" % len(leanote.notes), "UserId": ALICE,
                                 "NotebookId": WORK, "Title": title, "UpdatedTime": time, **kw})
    put("旧", "2024-01-01T08:00:00+08:00")
    put("新", "2024-03-01T00:00:00.5Z")
    put("中", "2024-02-01T00:00:00.123456789+08:00")
    put("回收站", "2024-04-01T00:00:00+08:00", IsTrash=True)
    put("已删除", "2024-05-01T00:00:00+08:00", IsDeleted=True)
    put("别的本子", "2024-06-01T00:00:00+08:00", NotebookId=HOME)
    listed = api("note/getNotes", notebookId=WORK).json()
    assert [n["Title"] for n in listed] == ["新", "中", "旧"]
    assert all(n["Content"] == "" and list(n) == NOTE_KEYS for n in listed)
    assert [n["Title"] for n in api("note/getNotes").json()] == ["别的本子", "新", "中", "旧"]
    assert [n["Title"] for n in api("note/getTrashNotes").json()] == ["回收站"]
    assert api("note/getNotes", notebookId="bad").json() == {"Ok": False, "Msg": "notebookIdInvalid"}

    one = listed[0]
    assert api("note/getNote", noteId=one["NoteId"]).json() == one
    assert api("note/getNote", noteId="bad").json() == {"Ok": False, "Msg": "noteIdInvalid"}
    assert api("note/getNote", noteId="64c0000000000000000000ff").json() == {"Ok": False, "Msg": "notExists"}


def test_add_notebook(leanote, api):
    before = usn(api)
    book = api("notebook/addNotebook", title="新本子", parentNotebookId=WORK, seq="3").json()
    assert list(book) == NOTEBOOK_KEYS and re.fullmatch(r"[0-9a-f]{24}", book["NotebookId"])
    assert (book["Title"], book["ParentNotebookId"], book["Seq"], book["Usn"]) == ("新本子", WORK, 3, before + 1)
    assert NEW_TIME.match(book["CreatedTime"]) and not book["IsDeleted"]
    top = api("notebook/addNotebook", title="顶层").json()
    assert (top["ParentNotebookId"], top["Seq"], top["Usn"]) == ("", 0, before + 2)
    assert [b["Title"] for b in api("notebook/getNotebooks").json()] == ["工作", "家", "新本子", "顶层"]
    assert [b["NotebookId"] for b in api("notebook/getSyncNotebooks", afterUsn=before).json()] == [
        book["NotebookId"], top["NotebookId"]]


def test_unknown_token_is_notlogin(leanote, api):
    for action in ("note/addNote", "note/updateNote", "notebook/addNotebook", "note/getNotes", "note/getNote"):
        assert api(action, token="stale", NotebookId=WORK, title="x").json() == {"Ok": False, "Msg": "NOTLOGIN"}
    assert leanote.writes == [] and leanote.notes == {}


def test_down_and_up(leanote, api):
    note = add(api)
    leanote.down()
    answer = api("note/updateNote", NoteId=note["NoteId"], Usn=note["Usn"], Title="宕机时")
    assert answer.status_code == 502 and answer.headers["Content-Type"] == "text/html"
    with pytest.raises(ValueError):
        answer.json()
    assert leanote.calls["note/updateNote"] == 0 and leanote.notes[note["NoteId"]]["Title"] == "笔记"

    session = requests.Session()  # a kept-alive connection from before the port closed
    session.post(f"{leanote.url}/api/auth/login", data={"email": "alice@example.com", "pwd": "alice-pw"}, timeout=5)
    leanote.down(refuse=True)
    with pytest.raises(requests.ConnectionError):
        api("user/getSyncState")
    with pytest.raises(requests.ConnectionError):
        session.post(f"{leanote.url}/api/user/getSyncState", timeout=5)
    leanote.up()
    back = api("note/updateNote", NoteId=note["NoteId"], Usn=note["Usn"], Title="恢复后").json()
    assert back["Title"] == "恢复后"


def test_drop_response_applies_the_write_but_never_answers(leanote, api):
    before = usn(api)
    leanote.drop_response("note/addNote")
    with pytest.raises(requests.ConnectionError):
        api("note/addNote", NotebookId=WORK, Title="写了没回")
    [written] = leanote.notes_titled(ALICE, "写了没回")
    assert written["Usn"] == before + 1 == usn(api)
    assert add(api, title="写了没回")["Usn"] == before + 2  # a blind retry makes a duplicate
    assert len(leanote.notes_titled(ALICE, "写了没回")) == 2


def test_after_runs_once_between_the_write_and_the_answer(leanote, api):
    note = add(api)
    seen = []
    leanote.after("note/updateNote", lambda params, body: seen.append(
        (params["Title"], body["Usn"], leanote.notes[note["NoteId"]]["Title"])))
    first = api("note/updateNote", NoteId=note["NoteId"], Usn=note["Usn"], Title="一").json()
    api("note/updateNote", NoteId=note["NoteId"], Usn=first["Usn"], Title="二")
    assert seen == [("一", first["Usn"], "一")]
