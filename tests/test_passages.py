"""The passage step (retrieval.passages): the right passage of the right note.

A long note whose answer sits in one long, mixed section: the first ranking finds the
note, but dense and BM25 both prefer the note's short sections full of its topic words,
so the answering passage is not among the top five. Looking again inside the best notes
puts it there. Real parts: the USE embedder, Qdrant Edge and qdrant-client's local mode.
"""

from __future__ import annotations

import pytest

from rag.config import RetrievalConfig
from rag.index.note_index import NoteIndex
from rag.index.retrieve import cap_per_note, coverage, fuse, search
from rag.index.points import Ranked
from sync.indexer import Indexer
from sync.sources import open_source
from sync.state import State

from conftest import make_settings

ANSWER = "预投票（Pre-Vote）"

RAFT = """# Raft 共识笔记

## 领导者选举

Raft 集群里领导者靠心跳维持地位。跟随者超时没收到领导者心跳，就变成候选人发起选举，任期号加一，向其他节点请求投票。选举超时是随机的，避免多个候选人同时竞选领导者。

## 日志复制

领导者把客户端请求写进日志，再复制给跟随者，多数节点确认后提交。日志条目带着任期号，任期号用来判断日志新旧，冲突的日志以领导者为准覆盖。

## 任期与投票规则

每个任期最多一个领导者。节点在一个任期里只投一票，先到先得；候选人的日志至少要和投票者一样新才能拿到选票。任期号更大的消息会让领导者和候选人退回跟随者。

## 安全性

领导者只能直接提交当前任期的日志条目，旧任期的条目随新条目一起提交。这样保证已提交的日志不会被新领导者覆盖，选举限制和提交规则一起保证安全。

## 成员变更

集群成员变更用联合共识：新旧配置同时生效一段时间，决策要同时得到新旧两组多数的同意，避免同一任期出现两个领导者。

## 快照

日志太长时做快照，快照之前的日志可以删掉。领导者可以把快照发给落后太多的跟随者，跟随者装上快照后再接着复制日志。

## 杂记

部署 etcd 时数据目录放在 SSD 上，磁盘延迟高了心跳就不稳定；备份用 etcdctl snapshot save，每天凌晨跑一次，保留七天。监控看 wal_fsync 和 backend_commit 两个耗时指标，超过一百毫秒就报警。升级时一台一台滚动重启，先升级跟随者。断网的机器一直超时，于是不停自增，数字变得很大。等它重新连上，别人看到这个大数字，只好让位。解决办法是预投票（Pre-Vote）：先问一圈能否赢，拿不到多数就不自增。etcd 和 TiKV 都开启了它。压测用 benchmark 工具，写入吞吐大约每秒一万次，读远高于写；客户端要配置多个端点，连接失败时自动切换到下一个。

## 读请求

线性一致读可以走 ReadIndex 或者租约读：领导者先确认自己在当前任期仍是领导者，再返回状态机里的数据。
"""

OTHERS = {
    "家庭网络.md": "# 家庭网络\n\n路由器断网以后重启，机器重新连上就恢复了。断网时先看光猫的灯，再看路由器。",
    "NAS 断网.md": "# NAS 断网\n\nNAS 断网后重新连上，同步任务自动恢复。机器断网太久会超时，超时以后要手动重连。",
    "公司 VPN.md": "# 公司 VPN\n\n在家连公司 VPN，断网后客户端会自动重连，连上之后要重新登录。",
    "机房巡检.md": "# 机房巡检\n\n机房断网演练：拔掉上联，看机器能否自动切到备用线路，重新连上后检查服务。",
    "笔记本.md": "# 笔记本\n\n笔记本合上盖子会断网，打开后重新连上 Wi-Fi 要十几秒。",
    "树莓派.md": "# 树莓派\n\n树莓派断网时看门狗会重启网卡，机器重新连上后发一条通知。",
    "打印机.md": "# 打印机\n\n打印机断网后要重新连上才能打印，机器背面有个复位键。",
    "番茄炒蛋.md": "# 番茄炒蛋\n\n先炒鸡蛋盛出，再炒番茄，加一小勺糖，最后把鸡蛋倒回去。",
}

# Asked in other words than the answer's: the note's topic (Raft, 领导者) and words many notes share.
QUESTIONS = ["Raft 集群中断网的机器重新连上，领导者为什么会变", "机器断网后重新连上，Raft 集群的领导者会不会换"]


@pytest.fixture(scope="module", params=["edge", "server"])
def settings(request, tmp_path_factory, use_embedder):
    """An index of the notes above, in each backend; sections are their own chunks."""
    tmp = tmp_path_factory.mktemp(request.param)
    notes = tmp / "notes"
    notes.mkdir()
    (notes / "Raft 共识笔记.md").write_text(RAFT, encoding="utf-8")
    for name, text in OTHERS.items():
        (notes / name).write_text(text, encoding="utf-8")
    extra = {"qdrant": {"local_path": str(tmp / "local")}} if request.param == "server" else {}
    settings = make_settings(
        tmp, source={"kind": "files", "path": str(notes)}, chunking={"min_size": 40, "max_size": 400}, **extra
    )
    state = State(settings.state_dir)
    try:
        with NoteIndex.open(settings, create=True, embedder=use_embedder) as index:
            Indexer(index, state, "files").run(open_source(settings).notes())
    finally:
        state.close()
    return settings


def hits_for(settings, embedder, question, k=5, **retrieval):
    cfg = settings.retrieval.model_copy(update=retrieval)
    with NoteIndex.open(settings.model_copy(update={"retrieval": cfg}), embedder=embedder) as index:
        return search(index, question, "local", k)


def notes_in_order(hits):
    return list(dict.fromkeys(h.note_id for h in hits))


@pytest.mark.parametrize("question", QUESTIONS)
def test_the_answering_passage_of_a_long_note_reaches_the_top_five(settings, use_embedder, question):
    before = hits_for(settings, use_embedder, question, passages=False)
    after = hits_for(settings, use_embedder, question, passages=True)
    assert before[0].title == "Raft 共识笔记"  # the right note comes first ...
    assert not any(ANSWER in h.text for h in before)  # ... but not its answer
    found = [h for h in after if ANSWER in h.text]
    assert found and found[0].title == "Raft 共识笔记" and found[0].heading == "杂记"
    # The notes keep their order, the list stays sorted, and the trace still has every score.
    assert notes_in_order(after) == notes_in_order(before)[: len(notes_in_order(after))]
    assert [h.score for h in after] == sorted((h.score for h in after), reverse=True)
    assert all(h.dense_rank and h.dense_score is not None for h in after)
    assert found[0].sparse_rank and found[0].sparse_score > 0


def test_with_the_switch_off_the_ranking_is_the_first_one_exactly(settings, use_embedder, monkeypatch):
    """Off: one store query, fused and capped as before the step existed; on: a second
    query restricted to the best notes."""
    question = QUESTIONS[0]
    cfg = settings.retrieval.model_copy(update={"passages": False})
    off = settings.model_copy(update={"retrieval": cfg})
    with NoteIndex.open(off, embedder=use_embedder) as index:
        calls = []
        real = index.store.search

        def spy(*args, **kwargs):
            result = real(*args, **kwargs)
            calls.append((args, kwargs, result))
            return result

        monkeypatch.setattr(index.store, "search", spy)
        hits = search(index, question, "local", 8)
        assert len(calls) == 1 and calls[0][1].get("note_ids") is None
        dense, sparse = calls[0][2]
        expected = cap_per_note(fuse({"dense": dense, "sparse": sparse}, cfg), cfg.max_chunks_per_note, 8)
        assert [(h.point_id, h.score, h.dense_rank, h.sparse_rank) for h in hits] == [
            (c.id, c.score, c.ranks.get("dense"), c.ranks.get("sparse")) for c in expected
        ]

        calls.clear()
        index.settings = settings  # passages on (the default)
        on = search(index, question, "local", 8)
        assert len(calls) == 2
        best = notes_in_order([h for h in hits])[: settings.retrieval.passage_notes]
        assert sorted(calls[1][1]["note_ids"]) == sorted(best)
        assert [h.point_id for h in on] != [h.point_id for h in hits]


def test_dense_and_sparse_searches_alone_have_no_passage_step(settings, use_embedder, monkeypatch):
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        calls = []
        real = index.store.search
        monkeypatch.setattr(index.store, "search", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
        for retriever in ("dense", "sparse"):
            hits = search(index, QUESTIONS[0], "local", 5, retriever=retriever)
            assert hits and len(calls) == 1 and calls.pop().get("note_ids") is None


def test_coverage_weighs_the_words_the_note_does_not_repeat():
    texts = [
        "Raft 领导者 心跳 选举超时",
        "Raft 领导者 日志复制 多数确认",
        "Raft 领导者 预投票 防止任期号暴涨",
        "Raft 领导者 快照",
    ]
    scores = coverage(texts, "Raft 领导者 预投票")
    assert max(range(4), key=scores.__getitem__) == 2
    # Words in every chunk ("Raft", "领导者") weigh almost nothing next to "预投票".
    assert scores[0] < 0.25 * scores[2]


def test_coverage_matches_latin_words_as_words():
    # "assertI2I2" makes the terms asserti2i2, assert and 2: "assert" inside "reassertion" is no match.
    scores = coverage(["a reassertion of the rule", "assertI2I2 returns ok and a bool"], "assertI2I2")
    assert scores[0] == 0 and scores[1] > 0


@pytest.mark.parametrize("text, held", [
    ("spooling first, then setCorePoolSize(10)", True),  # looked for past a word it is only inside
    ("a spooling daemon", False),
    ("pool.size=4 in app.properties", True),  # a part of a dotted name
    ("İstanbul: a pool of 4", True),  # a letter whose lower case is longer: positions differ, still found
    ("İstanbul: no spooling", False),
])
def test_coverage_finds_a_latin_word_wherever_it_is_in_the_text(text, held):
    assert (coverage([text, "nothing here"], "pool")[0] > 0) is held


def test_cap_per_note_can_allow_some_notes_more():
    fused = fuse(
        {"dense": [Ranked(i, 1.0 / (n + 1), note) for n, (i, note) in enumerate(
            [("a1", "A"), ("a2", "A"), ("a3", "A"), ("a4", "A"), ("b1", "B"), ("b2", "B"), ("b3", "B"), ("b4", "B")]
        )]},
        RetrievalConfig(fusion="rrf"),
    )
    assert [f.id for f in cap_per_note(fused, 3, 10, caps={"A": 4})] == ["a1", "a2", "a3", "a4", "b1", "b2", "b3"]
    assert [f.id for f in cap_per_note(fused, 3, 10)] == ["a1", "a2", "a3", "b1", "b2", "b3"]
