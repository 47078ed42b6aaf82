"""Index the sample notes into real embedded Qdrant and search them, the way a user
does: the right note first, nothing stale, nothing lost."""

import os
import shutil
import time

import pytest

from rag.errors import IndexMismatch, UserError
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search
from sync.indexer import Indexer
from sync.sources import open_source
from sync.state import State

from conftest import EXAMPLES, make_settings


def run_index(settings, embedder, rebuild=False):
    source = open_source(settings)
    state = State(settings.state_dir)
    try:
        with NoteIndex.open(settings, create=True, rebuild=rebuild, embedder=embedder) as index:
            return Indexer(index, state, source.name).run(source.notes())
    finally:
        state.close()


def top(settings, embedder, query, k=5, user="local", retriever="hybrid"):
    with NoteIndex.open(settings, embedder=embedder) as index:
        return search(index, query, user, k, retriever=retriever)


@pytest.fixture
def indexed(settings_factory, notes_dir, use_embedder):
    """A private index of a private copy of the sample notes: tests may change both."""
    settings = settings_factory(source={"kind": "files", "path": str(notes_dir)})
    summary = run_index(settings, use_embedder)
    return settings, notes_dir, summary


@pytest.fixture(scope="module")
def shared_index(tmp_path_factory, use_embedder):
    """One index of the sample notes for the tests that only read it."""
    tmp = tmp_path_factory.mktemp("ro")
    settings = make_settings(tmp)
    summary = run_index(settings, use_embedder)
    return settings, EXAMPLES, summary


PARAPHRASES = [
    ("付款请求失败以后，第一次重新发起前要停顿多久？", "支付接口调用的重试策略", "第一次等待 200 毫秒"),
    ("三月份数据库那次故障之后，连接池的常驻连接数定成了多少？", "PostgreSQL 连接池配置（SQLAlchemy）", "pool_size 调到了 20"),
    ("家里那台主机的备份会留多少份历史版本？", "用 restic 备份家里的服务器", "保留最近 7 个每日快照和 4 个每周快照"),
    ("家里路由器自动分给设备的 IP 是从哪到哪？", "家庭网络与路由器设置", "192.168.50.100–192.168.50.199"),
    ("做西红柿炒鸡蛋时，怎样让味道不那么酸？", "番茄炒蛋", "加一小勺糖"),
    ("妈妈教的那道五花肉要小火焖多长时间？", "红烧肉（妈妈的做法）", "炖 60 分钟"),
    ("How do I watch one service's log output in real time as new entries show up?", "Reading systemd journal logs", "journalctl"),
    ("去关西玩那次打算带多少现钞？", "日本旅行打包清单", "日元现金 3 万"),
    ("从浦东回南京那趟高铁，我坐哪节车厢哪个位子？", "回程火车票", "二等座 06 车 11F"),
]


@pytest.mark.parametrize("question, title, answer", PARAPHRASES)
def test_paraphrase_finds_the_right_note_first(shared_index, use_embedder, question, title, answer):
    settings, _, _ = shared_index
    hits = top(settings, use_embedder, question)
    assert hits[0].title == title
    assert answer in hits[0].text
    assert hits[0].url.startswith("file://")


@pytest.mark.parametrize(
    "query, title",
    [
        ("processTransaction", "支付接口调用的重试策略"),
        ("retry_count", "支付接口调用的重试策略"),
        ("pool_pre_ping", "PostgreSQL 连接池配置（SQLAlchemy）"),
        ("idx_orders_user_created", "订单列表慢查询排查记录"),
        ("--force-with-lease", "Git: rebase vs merge"),
    ],
)
def test_identifier_query_finds_the_note_with_that_code(shared_index, use_embedder, query, title):
    settings, _, _ = shared_index
    assert top(settings, use_embedder, query, retriever="sparse")[0].title == title
    assert top(settings, use_embedder, query)[0].title == title


def test_index_summary_and_payload(shared_index, use_embedder):
    settings, _, summary = shared_index
    assert summary.added == 15 and summary.deleted == 0 and not summary.skipped
    hits = top(settings, use_embedder, "DHCP 地址池", k=1)
    h = hits[0]
    assert h.notebook == "运维"
    assert "__leanoteStat" not in h.text and "data-mce" not in h.text
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        payload = index.store.payloads([h.point_id])[h.point_id]
    for field in ("note_id", "user_id", "notebook_id", "notebook", "title", "heading_path", "chunk_index",
                  "char_start", "char_end", "text", "tags", "updated_at", "url", "content_hash"):
        assert field in payload, field


def test_second_run_with_nothing_changed_embeds_nothing(indexed, use_embedder):
    settings, _, _ = indexed
    again = run_index(settings, use_embedder)
    assert again.unchanged == 15
    assert again.added == again.updated == again.deleted == again.chunks_embedded == 0


def test_editing_a_note_reembeds_only_its_changed_chunks(indexed, use_embedder):
    settings, notes_dir, _ = indexed
    path = notes_dir / "编程" / "Python" / "支付接口重试.md"
    path.write_text(path.read_text(encoding="utf-8") + "\n\n## 补充\n\n退避上限后来改成了 7 秒，超过就放弃并报警。\n", encoding="utf-8")
    summary = run_index(settings, use_embedder)
    assert summary.updated == 1 and summary.unchanged == 14
    assert 1 <= summary.chunks_embedded < 4
    assert summary.chunks_cached >= 1  # untouched chunks of the edited note came from the cache
    hits = top(settings, use_embedder, "退避上限后来改成了多少秒")
    assert "7 秒" in hits[0].text


def test_removed_file_leaves_the_index(indexed, use_embedder):
    settings, notes_dir, _ = indexed
    (notes_dir / "生活" / "菜谱" / "番茄炒蛋.md").unlink()
    summary = run_index(settings, use_embedder)
    assert summary.deleted == 1
    hits = top(settings, use_embedder, "番茄炒蛋 加糖", k=10)
    assert all(h.title != "番茄炒蛋" for h in hits)


def test_moved_file_is_found_under_its_new_notebook_only(indexed, use_embedder):
    settings, notes_dir, _ = indexed
    (notes_dir / "生活" / "菜谱" / "新").mkdir()
    shutil.move(notes_dir / "生活" / "菜谱" / "红烧肉.md", notes_dir / "生活" / "菜谱" / "新" / "红烧肉.md")
    summary = run_index(settings, use_embedder)
    assert summary.added == 1 and summary.deleted == 1
    assert summary.chunks_embedded == 0  # same text: every vector came from the cache
    hits = [h for h in top(settings, use_embedder, "红烧肉 焯水", k=10) if h.title.startswith("红烧肉")]
    assert hits and {h.notebook for h in hits} == {"生活 / 菜谱 / 新"}


def test_touching_a_file_updates_metadata_without_reembedding(indexed, use_embedder):
    settings, notes_dir, _ = indexed
    path = notes_dir / "生活" / "周末徒步香山.md"
    later = time.time() + 3600
    os.utime(path, (later, later))
    summary = run_index(settings, use_embedder)
    assert summary.moved == 1 and summary.chunks_embedded == 0 and summary.updated == 0


def test_bad_notes_are_skipped_and_reported_without_losing_others(indexed, use_embedder):
    settings, notes_dir, _ = indexed
    bad = notes_dir / "坏"
    bad.mkdir()
    (bad / "二进制.md").write_bytes(b"\x00\x01\x02\xff\xfe" * 1000)
    (bad / "坏导出.leanote").write_text('{"notes": [ {"title": "x", ', encoding="utf-8")
    (bad / "空.md").write_text("", encoding="utf-8")
    (bad / "只有图.html").write_text('<p><img src="/api/file/getImage?fileId=1" alt="白板照片"></p>', encoding="utf-8")
    (bad / "表情.md").write_text("# 😀 表情\u200b笔记\n\n今天🙂心情不错，去了趟🏔️。\n", encoding="utf-8")
    (bad / "长行.md").write_text("# 长行\n\n" + "日志" * 50_000 + "\n", encoding="utf-8")
    (bad / "gbk编码.md").write_bytes("# 旧笔记\n\n这是用 GBK 编码保存的笔记，记录了打印机的墨盒型号 HP-802。\n".encode("gb18030"))
    (bad / "坏html.html").write_text("<div><p>没有闭合的 <b>标签 <table><tr><td>单元格里的内容 HP-9999", encoding="utf-8")
    summary = run_index(settings, use_embedder)
    reasons = {s["note"]: s["reason"] for s in summary.skipped}
    assert "坏/二进制.md" in reasons and "not a text file" in reasons["坏/二进制.md"]
    assert "坏/坏导出.leanote" in reasons and "invalid JSON" in reasons["坏/坏导出.leanote"]
    assert summary.unchanged == 15  # nothing else was lost or redone
    assert summary.empty == 1
    assert top(settings, use_embedder, "墨盒型号")[0].title == "旧笔记"
    assert top(settings, use_embedder, "HP-9999", retriever="sparse")[0].text.count("HP-9999") == 1
    assert top(settings, use_embedder, "白板照片")[0].title == "只有图"


def test_queries_that_are_empty_or_huge(shared_index, use_embedder):
    settings, _, _ = shared_index
    with pytest.raises(UserError, match="empty"):
        top(settings, use_embedder, "   ")
    hits = top(settings, use_embedder, "番茄炒蛋怎么做" * 1500)  # ~10,000 characters
    assert hits and hits[0].title == "番茄炒蛋"


def test_changing_the_embedder_asks_for_a_rebuild(shared_index, use_embedder):
    settings, _, _ = shared_index
    other = settings.model_copy(update={"embedder": settings.embedder.model_copy(update={"kind": "ollama"})})
    with pytest.raises(IndexMismatch, match=r"index --rebuild"):
        NoteIndex.open(other)


def test_rebuild_starts_over(indexed, use_embedder):
    settings, _, _ = indexed
    summary = run_index(settings, use_embedder, rebuild=True)
    assert summary.added == 15 and summary.chunks_embedded == 0  # the embedding cache survives
    assert top(settings, use_embedder, "retry_count")[0].title == "支付接口调用的重试策略"


def test_deleting_the_index_by_hand_is_noticed(indexed, use_embedder):
    settings, _, _ = indexed
    shutil.rmtree(settings.state_dir / "qdrant")
    summary = run_index(settings, use_embedder)
    assert summary.added == 15  # state rows for the lost index were dropped, notes indexed anew



@pytest.mark.slow
def test_a_multi_megabyte_note_is_cut_and_reported(shared_index, use_embedder):
    from rag.index.note_index import MAX_NOTE_CHARS
    from rag.model import Note

    settings, _, _ = shared_index
    body = ("## 第{}节\n\n" + "这是一段很长的日志记录，用来检查超大笔记的处理。" * 40 + "\n\n") * 2200
    note = Note(id="f" * 24, user_id="local", title="超大笔记", content=body.format(*range(2200)))
    assert len(note.content) > MAX_NOTE_CHARS
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        prepared = index.prepare(note)
    assert prepared.truncated
    assert len(prepared.chunks) > 2000
    assert not any("第2199节" in pc.chunk.text for pc in prepared.chunks)  # past the cut
    assert prepared.chunks[0].chunk.heading_path == ("第0节",)
