"""What the benchmarks share: where the shared corpus and dev set are, where a run's results go,
and a tiny stand-in for both made from the bundled sample notes, so that every benchmark can run
in seconds on a fresh clone (``--tiny``; the test suite runs each so).

The shared folder (``../shared``, or ``$LEANOTE_RAG_SHARED``) holds ``corpus/mongodump/
backup_leanote_20250601.tar.gz`` (the notes as a Leanote backup), ``corpus/notes.jsonl`` (the same
notes, one JSON object each, as Leanote's API gives them), ``corpus/notebooks.json`` and
``corpus/facts.json`` (its users), ``corpus/changes.jsonl`` (a batch of changes: ``{"op":
"update"|"add"|"trash"|"delete", "note": ...}``) and ``eval/dev.jsonl`` (questions with their gold
notes and quotes). ``tiny_shared`` writes a folder of that shape from
``examples/notes``: 15 notes of one user, a few changes, and questions about them.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tarfile
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TINY_USER = "5dbed2987db161bc2a85b919"
TINY_OTHER = "5f38858837b4dcd92cefeb84"  # a second user, with no notes
BACKUP_NAME = "backup_leanote_20250601.tar.gz"


def shared() -> Path:
    """The shared corpus and dev set: ``$LEANOTE_RAG_SHARED``, else ``../shared``."""
    return Path(os.environ.get("LEANOTE_RAG_SHARED", REPO.parent / "shared"))


def results_file(name: str, tiny: bool) -> Path:
    """Where a benchmark writes its results: ``bench/<name>`` for a real run; a tiny run's go to a
    temporary folder (``$LEANOTE_RAG_BENCH_OUT`` when set), never over the recorded ones."""
    if not tiny:
        return REPO / "bench" / name
    folder = Path(os.environ.get("LEANOTE_RAG_BENCH_OUT") or tempfile.mkdtemp(prefix="lr-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


# Questions about the sample notes, in the dev set's form: (id, note title, question, a quote of
# the note that answers it, type, language).
TINY_QUESTIONS = [
    ("T001", "番茄炒蛋", "番茄炒蛋的鸡蛋要先炒还是和番茄一起下锅？", "一定要先把鸡蛋炒好盛出", "fact", "zh"),
    ("T002", "支付接口调用的重试策略", "付款失败后第一次重试前要等多久？", "第一次等待 200 毫秒", "paraphrase", "zh"),
    ("T003", "支付接口调用的重试策略", "retry_count 设的是多少？", "retry_count = 3", "keyword", "zh"),
    ("T004", "用 restic 备份家里的服务器", "家里服务器的快照保留几天的？", "保留最近 7 个每日快照", "paraphrase", "zh"),
    ("T005", "Reading systemd journal logs", "How do I follow one service's logs live?", "journalctl -u NAME -f",
     "keyword", "en"),
    ("T006", "PostgreSQL 连接池配置（SQLAlchemy）", "支付服务那次超时是因为数据库连接用完了吗？",
     "sorry, too many clients already", "paraphrase", "zh"),
    ("T007", "", "我家猫下一次打疫苗是什么时候？", "", "no_answer", "zh"),
]


# Two sample notes that link each other in the tiny world: (the linking note's file, the link's
# words, the file linked to, relative to it).
LINKS = [("生活/菜谱/番茄炒蛋.md", "红烧肉", "红烧肉.md"), ("生活/菜谱/红烧肉.md", "番茄炒蛋", "番茄炒蛋.md")]


def tiny_shared(folder: Path) -> Path:
    """A folder shaped like the shared one, made from the sample notes (``examples/notes``):
    the backup, the notes as JSON, a batch of changes and the questions. Returns ``folder``."""
    import bson

    from sync.sources.files import FilesSource
    from rag.model import Note

    folder = Path(folder)
    notes = [n for n in FilesSource(REPO / "examples" / "notes").notes() if isinstance(n, Note)]
    books: dict[str, str] = {}  # notebook path -> its id
    when = datetime(2025, 5, 1, 8, 0, tzinfo=timezone.utc)
    rows = []
    for usn, note in enumerate(notes, start=1):
        book = note.notebook_path or "笔记"
        book_id = books.setdefault(book, f"{0x5e0000000000000000000000 + len(books) + 1:024x}")
        # ``Source``: where the note's text came from (as the shared corpus records it), so that a
        # relative link between two notes resolves (``bench/related_links.py``)
        content = note.content + "".join(f"\n\n另见 [{title}](./{target})" for origin, title, target in LINKS
                                         if origin == note.origin)
        rows.append({"NoteId": note.id, "NotebookId": book_id, "UserId": TINY_USER, "Title": note.title,
                     "Tags": list(note.tags), "IsMarkdown": True, "IsTrash": False, "IsDeleted": False,
                     "IsBlog": False, "Usn": usn, "CreatedTime": when.isoformat(),
                     "UpdatedTime": (when + timedelta(minutes=usn)).isoformat(),
                     "Source": f"examples/notes:{note.origin}", "Content": content})
    corpus = folder / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    with (corpus / "notes.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    changed = dict(rows[0], Usn=len(rows) + 1, Content=rows[0]["Content"] + "\n\n补充：周末再试一次。")
    added = dict(rows[1], NoteId=f"{0x6a0000000000000000000000:024x}", Title="新记的一条", Usn=len(rows) + 2,
                 Content="# 新记的一条\n\n阳台的绿萝每周浇一次水，冬天两周一次。")
    with (corpus / "changes.jsonl").open("w", encoding="utf-8") as f:
        for op, note in (("update", changed), ("add", added), ("trash", dict(rows[2], IsTrash=True, Usn=len(rows) + 3))):
            f.write(json.dumps({"op": op, "note": note}, ensure_ascii=False) + "\n")
    _backup(corpus / "mongodump" / BACKUP_NAME, rows, books, bson)
    # what a fake Leanote loads beside the notes (tests/fakes/leanote.py ``load_corpus``): the users (the
    # second has no notes here) and the notebooks
    (corpus / "facts.json").write_text(json.dumps({"users": {"user_one": TINY_USER, "user_two": TINY_OTHER}}))
    (corpus / "notebooks.json").write_text(json.dumps(
        [{"NotebookId": book_id, "UserId": TINY_USER, "ParentNotebookId": "", "Title": title.split(" / ")[-1],
          "Usn": usn, "IsDeleted": False} for usn, (title, book_id) in enumerate(books.items(), start=1)],
        ensure_ascii=False), encoding="utf-8")
    titles = {row["Title"]: row for row in rows}
    dev = folder / "eval"
    dev.mkdir(parents=True, exist_ok=True)
    with (dev / "dev.jsonl").open("w", encoding="utf-8") as f:
        for qid, title, question, quote, kind, lang in TINY_QUESTIONS:
            gold = titles[title] if title else None
            if gold is not None and quote not in gold["Content"]:
                raise AssertionError(f"{qid}: the quote is not in {title}")
            f.write(json.dumps({"id": qid, "user_id": TINY_USER, "question": question, "type": kind,
                                "gold_note_ids": [gold["NoteId"]] if gold else [],
                                "gold_quotes": [quote] if quote else [], "answer_points": [quote] if quote else [],
                                "after_changes": False, "lang": lang}, ensure_ascii=False) + "\n")
    return folder


def _backup(path: Path, rows: list[dict], books: dict[str, str], bson) -> None:
    """A mongodump backup of the notes, as Leanote's own backup script makes it (a tar.gz of
    ``dump/leanote/*.bson``)."""
    from bson import ObjectId

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "dump" / "leanote"
        db.mkdir(parents=True)
        user = ObjectId(TINY_USER)

        def write(name: str, docs: list[dict]) -> None:
            with open(db / f"{name}.bson", "wb") as f:
                for d in docs:
                    f.write(bson.encode(d))

        write("users", [{"_id": user, "Email": "me@example.com", "Usn": len(rows)}])
        write("notebooks", [{"_id": ObjectId(i), "UserId": user, "Title": title.split(" / ")[-1], "Usn": 1,
                             "IsDeleted": False} for title, i in books.items()])
        write("notes", [{"_id": ObjectId(r["NoteId"]), "UserId": user, "NotebookId": ObjectId(r["NotebookId"]),
                         "Title": r["Title"], "Tags": r["Tags"], "IsMarkdown": True, "IsTrash": False,
                         "IsDeleted": False, "Usn": r["Usn"],
                         "UpdatedTime": datetime.fromisoformat(r["UpdatedTime"])} for r in rows])
        write("note_contents", [{"_id": ObjectId(r["NoteId"]), "UserId": user, "Content": r["Content"]}
                                for r in rows])
        (db / "notes.metadata.json").write_text("{}")
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "w:gz") as tar:
            tar.add(Path(tmp) / "dump", arcname="dump")


def tiny_world() -> Path:
    """A tiny shared folder in a temporary place, gone when the benchmark ends, and
    ``$LEANOTE_RAG_SHARED`` pointing at it (for the benchmark's own children too): what
    ``--tiny`` runs on."""
    folder = tiny_shared(Path(tempfile.mkdtemp(prefix="lr-tiny-shared-")))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["LEANOTE_RAG_SHARED"] = str(folder)
    return folder
