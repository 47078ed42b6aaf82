"""Both store backends through the same tests: Qdrant Edge (the default) and the
server backend through qdrant-client's local mode (the same client API)."""

import math
import random
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

from rag.config import QdrantConfig
from rag.errors import StoreLocked
from rag.index.lexical import document_vector, query_vector, term_id
from rag.index.points import _ID_NAMESPACE, PointData, _point_key, point_id
from rag.index.store_edge import EdgeStore, _Payloads
from rag.index.store_server import ServerStore

DIM = 8


def unit(*xs):
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(xs)] = xs
    return v / np.linalg.norm(v)


def point(note_id, idx, user, text, vec):
    return PointData(
        point_id(note_id, idx),
        vec,
        document_vector(text),
        {"note_id": note_id, "user_id": user, "text": text, "chunk_index": idx, "notebook": "A / B", "tags": ["t"]},
    )


@pytest.fixture(params=["edge", "server"])
def store(request, tmp_path):
    if request.param == "edge":
        s = EdgeStore(tmp_path / "qdrant", DIM)
    else:
        s = ServerStore(QdrantConfig(local_path=tmp_path / "local"), DIM)
    yield s
    s.close()


def fill(store):
    store.upsert(
        [
            point("n1", 0, "u1", "redis 持久化 RDB 快照", unit(1, 0)),
            point("n1", 1, "u1", "redis AOF 日志 重写", unit(0.9, 0.1)),
            point("n2", 0, "u1", "番茄炒蛋 加糖", unit(0, 1)),
            point("n3", 0, "u2", "redis 集群 分片 私有", unit(1, 0)),
        ]
    )


def test_search_is_filtered_to_the_user(store):
    fill(store)
    dense, sparse = store.search(unit(1, 0), query_vector("redis"), "u1", 10)
    assert {r.note_id for r in dense} <= {"n1", "n2"}
    assert {r.note_id for r in sparse} == {"n1"}
    assert dense[0].note_id == "n1"
    dense2, sparse2 = store.search(unit(1, 0), query_vector("redis"), "u2", 10)
    assert [r.note_id for r in dense2] == ["n3"] and [r.note_id for r in sparse2] == ["n3"]


def test_search_can_be_restricted_to_some_notes(store):
    fill(store)
    store.upsert([point("n4", 0, "u1", "redis 哨兵 故障转移", unit(0.8, 0.2))])
    everywhere = store.search(unit(1, 0), query_vector("redis"), "u1", 10)
    dense, sparse = store.search(unit(1, 0), query_vector("redis"), "u1", 10, note_ids=["n1", "n2"])
    assert {r.note_id for r in dense} == {"n1", "n2"} and {r.note_id for r in sparse} == {"n1"}
    # the same scores as without the restriction: only which chunks may come back changes
    for restricted, full in zip((dense, sparse), everywhere):
        scores = {r.id: r.score for r in full}
        assert all(r.score == pytest.approx(scores[r.id]) for r in restricted)
    assert [r.id for r in dense] == [r.id for r in everywhere[0] if r.note_id in ("n1", "n2")]
    # still only the user's own: n3 is u2's
    assert store.search(unit(1, 0), query_vector("redis"), "u1", 10, note_ids=["n3"]) == ([], [])
    only4 = store.search(unit(1, 0), query_vector("redis"), "u1", 10, note_ids=["n4"])
    assert [r.id for r in only4[0]] == [r.id for r in only4[1]] == [point_id("n4", 0)]


def test_sparse_scores_use_idf(store):
    fill(store)
    # "快照" is in one chunk, "redis" in three: the rare term must weigh more.
    _, rare = store.search(None, query_vector("快照"), "u1", 10)
    _, common = store.search(None, query_vector("redis"), "u1", 10)
    assert rare[0].score > common[0].score


def test_sparse_idf_is_counted_over_the_asking_users_points(store):
    """BM25's IDF over the user's own chunks, ln(1 + (N - df + 0.5) / (df + 0.5)): N is the user's
    chunks, df those holding the term; another user's chunks count for nothing, in both backends."""
    fill(store)
    query = query_vector("redis 快照")

    def expected(text, n, df):
        vector = document_vector(text)
        weights = dict(zip(vector.indices, vector.values))
        return sum(weights.get(term_id(t), 0.0) * math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items())

    _, got = store.search(None, query, "u1", 10)
    # u1: 3 chunks, "redis" in 2, "快照" in 1 (u2's chunk with "redis" is not counted)
    assert [r.id for r in got] == [point_id("n1", 0), point_id("n1", 1)]
    assert [r.score for r in got] == pytest.approx(
        [expected(text, 3, {"redis": 2, "快照": 1}) for text in ("redis 持久化 RDB 快照", "redis AOF 日志 重写")], rel=1e-4)
    store.upsert([point(f"m{i}", 0, "u2", "redis 快照 备份", unit(1, 0)) for i in range(5)])
    assert store.search(None, query, "u1", 10)[1] == got
    store.delete_note("n2")  # N of u1 is 2 now
    _, fewer = store.search(None, query, "u1", 10)
    assert fewer[0].score == pytest.approx(expected("redis 持久化 RDB 快照", 2, {"redis": 2, "快照": 1}), rel=1e-4)


def test_upsert_with_the_same_ids_overwrites(store):
    fill(store)
    store.upsert([point("n2", 0, "u1", "番茄炒蛋 先炒蛋", unit(0, 1))])
    assert store.count_by_user() == {"u1": 3, "u2": 1}
    assert store.payloads([point_id("n2", 0)])[point_id("n2", 0)]["text"] == "番茄炒蛋 先炒蛋"


def test_delete_points_and_notes(store):
    fill(store)
    store.delete([point_id("n1", 1)])
    assert store.count_by_user() == {"u1": 2, "u2": 1}
    store.delete_note("n1")
    assert store.note_ids("u1") == {"n2"}
    assert store.note_ids() == {"n2", "n3"}


def test_set_payload_changes_metadata_only(store):
    fill(store)
    ids = [point_id("n1", 0), point_id("n1", 1)]
    store.set_payload(ids, {"notebook": "新 / 路径"})
    payloads = store.payloads(ids)
    assert {p["notebook"] for p in payloads.values()} == {"新 / 路径"}
    assert payloads[ids[0]]["text"] == "redis 持久化 RDB 快照"


def test_payloads_read_before_a_write_are_not_shown_after_it(store):
    """A running daemon showed a note's chunks, then the note changed: the next read shows it
    as it is now (the embedded store keeps the payloads it read last)."""
    fill(store)
    ids = [point_id("n1", 0), point_id("n1", 1), point_id("n2", 0)]
    assert store.payloads(ids)[ids[2]]["text"] == "番茄炒蛋 加糖"
    store.upsert([point("n2", 0, "u1", "番茄炒蛋 先炒蛋", unit(0, 1))])
    assert store.payloads(ids)[ids[2]]["text"] == "番茄炒蛋 先炒蛋"
    store.set_payload(ids[:2], {"notebook": "新 / 路径"})
    assert [store.payloads(ids)[i]["notebook"] for i in ids] == ["新 / 路径", "新 / 路径", "A / B"]
    store.delete([ids[1]])
    assert set(store.payloads(ids)) == {ids[0], ids[2]}
    store.delete_note("n1")
    assert set(store.payloads(ids)) == {ids[2]}
    store.drop(DIM)
    assert store.payloads(ids) == {}


def test_kept_payloads_drop_what_a_write_may_have_changed_and_the_oldest():
    kept = _Payloads(2)
    found, missing, writes = kept.get(["a"])
    assert (found, missing) == ({}, ["a"])
    kept.clear()  # a write while "a" was being read: what was read may be older than the write
    kept.keep({"a": {"text": "old"}}, writes)
    assert kept.get(["a"])[1] == ["a"]
    writes = kept.get([])[2]
    kept.keep({"a": {"text": "A"}, "b": {"text": "B"}}, writes)
    assert kept.get(["a"])[0] == {"a": {"text": "A"}}  # read last: "b" is now the oldest
    kept.keep({"c": {"text": "C"}}, writes)
    assert kept.get(["a", "b", "c"])[1] == ["b"]


def test_manifest_round_trip_and_drop(store):
    assert store.manifest() is None
    store.write_manifest({"schema": 1, "embedder": "use:multilingual-v3", "dim": DIM, "index_id": "x"})
    assert store.manifest()["embedder"] == "use:multilingual-v3"
    fill(store)
    store.drop(DIM)
    assert store.count_by_user() == {}
    assert store.manifest() is None


def test_missing_ids_are_simply_absent(store):
    fill(store)
    assert store.payloads([point_id("nope", 0)]) == {}


def test_edge_index_survives_reopen(tmp_path):
    s = EdgeStore(tmp_path / "qdrant", DIM)
    fill(s)
    s.close()
    s = EdgeStore(tmp_path / "qdrant", DIM)
    try:
        assert s.count_by_user() == {"u1": 3, "u2": 1}
        dense, _ = s.search(unit(0, 1), None, "u1", 1)
        assert dense[0].note_id == "n2"
    finally:
        s.close()


def test_a_reopened_index_names_every_candidates_note(tmp_path):
    """A reopened index learns its points' notes from the notes' chunk counts; a note whose
    chunks are not 0..n-1 any more (its first one deleted) still comes back as itself."""
    s = EdgeStore(tmp_path / "qdrant", DIM)
    fill(s)
    s.upsert([point("n4", i, "u1", f"第 {i} 段 redis", unit(1, 0.1 * i)) for i in range(3)])
    s.delete([point_id("n1", 0), point_id("n4", 1)])
    s.close()
    s = EdgeStore(tmp_path / "qdrant", DIM)
    try:
        dense, sparse = s.search(unit(1, 0), query_vector("redis"), "u1", 10)
        expected = {point_id("n1", 1): "n1", point_id("n2", 0): "n2", point_id("n4", 0): "n4", point_id("n4", 2): "n4"}
        assert {c.id: c.note_id for c in dense} == expected
        assert {c.id: c.note_id for c in sparse} == {k: v for k, v in expected.items() if k != point_id("n2", 0)}
    finally:
        s.close()


@pytest.mark.parametrize("note_id", ["5f1a2b3c4d5e6f7a8b9c0d1e", "notes/日记 2024.md", "", "a:b"])
def test_point_ids_are_uuid5_of_note_and_chunk(note_id):
    """Every index written before keeps its points' ids: uuid5 of "note:chunk" in the project's namespace."""
    for i in (0, 1, 17, 4096):
        expected = uuid.uuid5(_ID_NAMESPACE, f"{note_id}:{i}")
        assert point_id(note_id, i) == str(expected)
        assert _point_key(note_id, i) == (expected.int, str(expected))


def test_a_second_process_gets_a_clear_message(tmp_path):
    s = EdgeStore(tmp_path / "qdrant", DIM)
    try:
        code = textwrap.dedent(
            f"""
            from rag.index.store_edge import EdgeStore
            from rag.errors import StoreLocked
            try:
                EdgeStore({str(tmp_path / 'qdrant')!r}, {DIM})
            except StoreLocked as err:
                print("LOCKED", err)
            """
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.stdout.startswith("LOCKED"), out.stderr
        assert "open in another process" in out.stdout and "qdrant.url" in out.stdout
    finally:
        s.close()
    # released: the next opener gets in
    EdgeStore(tmp_path / "qdrant", DIM).close()


def test_server_local_mode_second_opener_is_locked(tmp_path):
    s = ServerStore(QdrantConfig(local_path=tmp_path / "local"), DIM)
    try:
        with pytest.raises(StoreLocked):
            ServerStore(QdrantConfig(local_path=tmp_path / "local"), DIM)
    finally:
        s.close()


def test_edge_index_serves_searches_while_a_sync_writes(tmp_path):
    """serve answers from the index while a sync writes to it, from other threads."""
    import threading
    import time

    store = EdgeStore(tmp_path / "qdrant", DIM)
    stop, errors, searches, writes = threading.Event(), [], [], []

    def writer():
        i = 0
        while not stop.is_set():
            try:
                store.upsert([point(f"n{i % 50}", j, "u1", f"redis 快照 {i}", unit(1, j)) for j in range(5)])
                store.delete([point_id(f"n{(i + 7) % 50}", 3)])
                writes.append(len(searches))  # how many searches had run by then
            except Exception as err:  # pragma: no cover - the failure being tested for
                errors.append(err)
            i += 1

    def reader():
        while not stop.is_set():
            try:
                dense, sparse = store.search(unit(1, 0), query_vector("redis 快照"), "u1", 20)
                searches.append(len(dense) + len(sparse))
            except Exception as err:  # pragma: no cover
                errors.append(err)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    # until both have done enough, however slow the machine (a deadline only against a hang)
    deadline = time.monotonic() + 300
    while (len(writes) < 40 or len(searches) < 100) and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    store.close()
    assert errors == [] and len(writes) >= 40 and len(searches) >= 100 and max(searches) > 0
    assert writes[-1] > writes[0]  # searches ran between the writes, not only before or after them


def open_store(kind, path):
    return EdgeStore(path / "qdrant", DIM) if kind == "edge" else ServerStore(QdrantConfig(local_path=path / "local"), DIM)


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_deleted_points_leave_bm25_as_if_they_had_never_been_there(kind, tmp_path):
    """Deleting points (and rewriting some) while the store stays open, as `serve` keeps it,
    leaves the BM25 scores of a store that only ever held the points that are left."""
    texts = {f"n{i}": ("redis 快照 持久化" if i % 3 == 0 else "redis 集群 分片") + f" 第{i}篇" for i in range(30)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    used, fresh = open_store(kind, tmp_path / "a"), open_store(kind, tmp_path / "b")
    try:
        used.upsert([point(n, 0, "u1", t, unit(1, i)) for i, (n, t) in enumerate(texts.items())])
        gone = [n for i, n in enumerate(texts) if i % 3 == 0 and i < 20]  # most of the 快照 notes
        used.delete([point_id(n, 0) for n in gone])
        used.upsert([point("n1", 0, "u1", "redis 快照 第1篇", unit(1, 1))])  # a rewrite that adds a term
        left = {n: t for n, t in texts.items() if n not in gone} | {"n1": "redis 快照 第1篇"}
        fresh.upsert([point(n, 0, "u1", t, unit(1, i)) for i, (n, t) in enumerate(left.items())])
        for query in ("快照", "redis 集群", "持久化 快照 redis"):
            _, want = fresh.search(None, query_vector(query), "u1", 30)
            _, got = used.search(None, query_vector(query), "u1", 30)
            assert [(r.id, r.score) for r in got] == [(r.id, r.score) for r in want], query
    finally:
        used.close()
        fresh.close()


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_equal_scores_come_back_by_id_whatever_order_the_points_were_written_in(kind, tmp_path):
    """Twenty chunks score alike for a query (the same words, the same vector): whatever order
    they were written in, and whichever were rewritten, the best five are the same five, in the
    same order, and the order is their ids'."""
    same = [point(f"n{i}", 0, "u1", "番茄 鸡蛋 汤", unit(1, 1)) for i in range(20)]
    other = [point(f"m{i}", 0, "u1", f"番茄 炒饭 {i} 号", unit(1, 0.2 * i)) for i in range(20)]
    lists = []
    for order in range(3):
        (tmp_path / str(order)).mkdir()
        s = open_store(kind, tmp_path / str(order))
        try:
            points = same + other
            random.Random(order).shuffle(points)
            for i in range(0, len(points), 7):
                s.upsert(points[i:i + 7])
            if order == 2:  # rewritten after the rest
                s.delete([p.id for p in same[::2]])
                s.upsert(same[::2])
            dense, sparse = s.search(unit(1, 1), query_vector("番茄 鸡蛋"), "u1", 5)
            lists.append(([r.id for r in dense], [r.id for r in sparse]))
        finally:
            s.close()
    best = sorted(p.id for p in same)[:5]
    assert lists[0] == lists[1] == lists[2] == (best, best)


@pytest.mark.slow
def test_dense_search_is_exact_also_once_the_index_is_optimized(tmp_path):
    """An index past Qdrant's indexing threshold (~10 MB of vectors) gets an HNSW graph when it
    is optimized; the dense side still returns the exact nearest chunks, which do not depend
    on how that graph happened to be built."""
    dim, n = 1024, 2700
    rng = np.random.default_rng(18)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = EdgeStore(tmp_path / "qdrant", dim)
    try:
        for i in range(0, n, 300):
            store.upsert([PointData(point_id(f"n{j}", 0), vectors[j], document_vector("x"),
                                    {"note_id": f"n{j}", "user_id": "u1"}) for j in range(i, min(n, i + 300))])
        store.optimize()
        assert any(info.get("index", {}).get("type") == "hnsw" for info in _dense_segment_indexes(tmp_path / "qdrant"))
        for q in rng.standard_normal((20, dim)).astype(np.float32):
            q /= np.linalg.norm(q)
            exact = [point_id(f"n{j}", 0) for j in np.argsort(-(vectors @ q))[:10]]
            dense, _ = store.search(q, None, "u1", 10)
            assert [r.id for r in dense] == exact
    finally:
        store.close()


def _dense_segment_indexes(path):
    import json

    return [json.loads(f.read_text())["config"]["vector_data"]["dense"] for f in path.glob("segments/*/segment.json")]
