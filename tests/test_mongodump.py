"""The mongodump source: real BSON files (written with pymongo's bson) in the shapes
Leanote stores, and the shared corpus's real backup when it is there."""

import tarfile
from datetime import datetime, timezone

import bson
import pytest
from bson import ObjectId

from rag.errors import UserError
from rag.model import Note
from sync.sources import Skipped, notebook_paths
from sync.sources.mongodump import MongodumpSource

U1 = ObjectId("5dbed2987db161bc2a85b919")
U2 = ObjectId("5f38858837b4dcd92cefeb84")
ROOT = ObjectId("5e16ca22f6ffdbad5b4ba595")
CHILD = ObjectId("5e16ca22f6ffdbad5b4ba596")
RE_ROOTED = ObjectId("5e16ca22f6ffdbad5b4ba597")
NULL_PARENT = ObjectId("5e16ca22f6ffdbad5b4ba598")
T = datetime(2024, 5, 1, 8, 30, tzinfo=timezone.utc)


def oid(n: int) -> ObjectId:
    return ObjectId(f"{n:024x}")


def write_bson(path, docs):
    with open(path, "wb") as f:
        for d in docs:
            f.write(bson.encode(d))


def make_dump(folder):
    db = folder / "dump" / "leanote"
    db.mkdir(parents=True)
    write_bson(db / "users.bson", [{"_id": U1, "Email": "one@example.com", "Usn": 9}, {"_id": U2, "Email": "two@example.com", "Usn": 3}])
    write_bson(
        db / "notebooks.bson",
        [
            {"_id": ROOT, "UserId": U1, "Title": "Java", "Usn": 1, "IsDeleted": False},  # no ParentNotebookId: root
            {"_id": CHILD, "UserId": U1, "ParentNotebookId": ROOT, "Title": "并发编程", "Usn": 2, "IsDeleted": False},
            {"_id": RE_ROOTED, "UserId": U1, "ParentNotebookId": "", "Title": "随笔", "Usn": 3},  # "" after a drag to root
            {"_id": NULL_PARENT, "UserId": U2, "ParentNotebookId": None, "Title": "Linux", "Usn": 1},
        ],
    )
    notes = [
        {"_id": oid(1), "UserId": U1, "NotebookId": CHILD, "Title": "线程池", "IsMarkdown": True, "IsTrash": False,
         "IsDeleted": False, "Usn": 4, "UpdatedTime": T, "Tags": ["java", ""]},
        {"_id": oid(2), "UserId": U1, "NotebookId": RE_ROOTED, "Title": "富文本", "IsMarkdown": False, "IsTrash": False,
         "IsDeleted": False, "Usn": 5, "UpdatedTime": T},  # no Tags field at all
        {"_id": oid(3), "UserId": U1, "NotebookId": CHILD, "Title": "废纸篓", "IsMarkdown": True, "IsTrash": True,
         "IsDeleted": False, "Usn": 6, "UpdatedTime": T, "Tags": None},
        {"_id": oid(4), "UserId": U1, "NotebookId": CHILD, "Title": "已删除", "IsMarkdown": True, "IsTrash": True,
         "IsDeleted": True, "Usn": 7, "UpdatedTime": T},
        {"_id": oid(5), "UserId": U1, "NotebookId": CHILD, "Title": "没有正文", "IsMarkdown": True, "Usn": 8, "UpdatedTime": T},
        {"_id": oid(6), "UserId": U2, "NotebookId": NULL_PARENT, "Title": "systemd", "IsMarkdown": True, "Usn": 2, "UpdatedTime": T},
    ]
    write_bson(db / "notes.bson", notes)
    write_bson(
        db / "note_contents.bson",
        [
            {"_id": oid(1), "UserId": U1, "Content": "# 线程池\n\n核心参数可以动态调整。"},
            {"_id": oid(2), "UserId": U1, "Content": "<p>富文本&nbsp;正文</p>"},
            {"_id": oid(3), "UserId": U1, "Content": "回收站里的内容 PaintCode"},
            {"_id": oid(6), "UserId": U2, "Content": "RestartSec 控制重启间隔"},
            # oid(4) deleted and oid(5) never had a body: both missing here
        ],
    )
    (db / "notes.metadata.json").write_text("{}")
    return db


def read_all(source):
    items = list(source.notes())
    return {i.id: i for i in items if isinstance(i, Note)}, [i for i in items if isinstance(i, Skipped)]


def test_reads_notes_with_real_field_types(tmp_path):
    make_dump(tmp_path)
    notes, skipped = read_all(MongodumpSource(tmp_path, tmp_path / "state"))
    assert not skipped and len(notes) == 6
    n1 = notes[str(oid(1))]
    assert n1.user_id == str(U1) and n1.notebook_id == str(CHILD)
    assert n1.notebook_path == "Java / 并发编程" and n1.notebook_ids == (str(ROOT), str(CHILD))
    assert n1.tags == ("java",)  # "" dropped
    assert n1.usn == 4 and n1.updated_at == T and n1.is_markdown and n1.searchable
    assert "动态调整" in n1.content
    assert notes[str(oid(2))].notebook_path == "随笔" and not notes[str(oid(2))].is_markdown
    assert notes[str(oid(6))].notebook_path == "Linux" and notes[str(oid(6))].user_id == str(U2)
    assert not notes[str(oid(3))].searchable and not notes[str(oid(4))].searchable
    assert notes[str(oid(5))].content == ""  # a missing body is an empty note


def test_tar_gz_backup_is_read_like_the_folder(tmp_path):
    make_dump(tmp_path / "src")
    archive = tmp_path / "backup_leanote_20250601.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "dump", arcname="dump")
    state = tmp_path / "state"
    source = MongodumpSource(archive, state)
    assert len(source) == 6
    notes, _ = read_all(source)
    assert notes[str(oid(1))].notebook_path == "Java / 并发编程"
    assert list((state / "tmp").iterdir()) == []  # the extracted copy is removed


def test_truncated_dump_is_a_clear_error(tmp_path):
    db = make_dump(tmp_path)
    data = (db / "notes.bson").read_bytes()
    (db / "notes.bson").write_bytes(data[:-10])
    with pytest.raises(UserError, match="truncated"):
        MongodumpSource(tmp_path, tmp_path / "state")


def test_not_a_dump_is_a_clear_error(tmp_path):
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(UserError, match="no notes.bson"):
        MongodumpSource(tmp_path, tmp_path / "state")
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(UserError, match="cannot read backup archive"):
        MongodumpSource(bad, tmp_path / "state")
    with pytest.raises(UserError, match="does not exist"):
        MongodumpSource(tmp_path / "missing", tmp_path / "state")


def test_notebook_paths_survive_missing_parents_and_cycles():
    from rag.model import Notebook

    books = {
        "a": Notebook("a", "u", "A", parent_id="b"),
        "b": Notebook("b", "u", "B", parent_id="a"),  # a cycle
        "c": Notebook("c", "u", "C", parent_id="gone"),  # parent hard-deleted
    }
    paths = notebook_paths(books)
    assert paths["a"].path == "B / A" and paths["b"].path == "A / B" and paths["c"].path == "C"
    assert paths["a"].ids == ("b", "a") and paths["c"].ids == ("c",)


def test_shared_corpus_backup(shared, tmp_path):
    source = MongodumpSource(shared / "corpus" / "mongodump" / "backup_leanote_20250601.tar.gz", tmp_path)
    notes, skipped = read_all(source)
    assert not skipped and len(notes) == 531
    trashed = [n for n in notes.values() if n.is_trash]
    assert len(trashed) == 12
    assert {n.user_id for n in notes.values()} == {"5dbed2987db161bc2a85b919", "5f38858837b4dcd92cefeb84"}
    assert notes["5fae1d1df0f9e6f361c1b6d7"].notebook_path == "Java / 并发编程"
    assert sum(1 for n in notes.values() if not n.is_markdown) == 106
