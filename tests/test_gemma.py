"""``embedder.kind: gemma`` (``rag.index.gemma``) on a tiny stand-in of EmbeddingGemma's
architecture (``gemma_world``): its prompts, its Matryoshka cuts, its sequence length, int8, the
vector cache keeping its full rows, the index refusing another cut, and a missing model named
with the command that fetches it."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from rag import config as config_mod
from rag.config import EmbedderConfig
from rag.errors import ConfigError, IndexMismatch, ModelMissing
from rag.index import embed
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search

from sync.indexer import Indexer
from sync.sources import open_source
from sync.state import State

from conftest import make_settings
from gemma_world import DOCUMENT_PROMPT, QUERY_PROMPT, tiny_gemma

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the [gemma] extra")
pytestmark = pytest.mark.xdist_group("torch")  # torch imported in one worker of a run (test_rerank too)


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    pytest.importorskip("sentence_transformers", reason="needs the [gemma] extra")
    return tiny_gemma(tmp_path_factory.mktemp("gemma") / "embeddinggemma-300m")


def gemma(folder, **options):
    return embed.load(EmbedderConfig(kind="gemma", model=str(folder), threads=1, **options), cache=False)


def rows_ok(v, n, dim):
    assert v.shape == (n, dim) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)


@needs_torch
@pytest.mark.slow
def test_questions_and_passages_are_embedded_with_the_models_prompts(gemma_folder):
    from sentence_transformers import SentenceTransformer

    e = gemma(gemma_folder)
    text = "番茄炒蛋的鸡蛋要先炒吗"
    q, d = e.embed_query([text]), e.embed([text])
    rows_ok(q, 1, 768)
    assert not np.allclose(q, d)  # the two sides differ
    raw = SentenceTransformer(str(gemma_folder), device="cpu")
    as_query = raw.encode([QUERY_PROMPT + text], normalize_embeddings=True)
    as_document = raw.encode([DOCUMENT_PROMPT + text], normalize_embeddings=True)
    assert np.allclose(q, as_query, atol=1e-5) and np.allclose(d, as_document, atol=1e-5)
    assert e.model_id.startswith("gemma:local/embeddinggemma-300m/768d/256t")
    assert e.embed([]).shape == (0, 768)


@needs_torch
@pytest.mark.slow
def test_a_smaller_output_is_the_first_dimensions_normalised_again(gemma_folder):
    full = gemma(gemma_folder).embed(["红烧肉要炖多久", "git rebase rewrites history"])
    for dim in (512, 256):
        e = gemma(gemma_folder, dimensions=dim)
        v = e.embed(["红烧肉要炖多久", "git rebase rewrites history"])
        rows_ok(v, 2, dim)
        expect = full[:, :dim] / np.linalg.norm(full[:, :dim], axis=1, keepdims=True)
        assert np.allclose(v, expect, atol=1e-5)
        assert e.dim == dim and f"/{dim}d/" in e.model_id


@needs_torch
@pytest.mark.slow
def test_a_passage_is_read_up_to_max_tokens(gemma_folder):
    e = gemma(gemma_folder, max_tokens=40)
    head = "鸡蛋先炒到半熟盛出再炒番茄最后放在一起加盐"  # with the prompt: past 40 tokens
    assert np.allclose(e.embed([head + "然后加一点糖"]), e.embed([head + "再撒上葱花出锅"]), atol=1e-5)
    longer = gemma(gemma_folder, max_tokens=200)
    assert not np.allclose(longer.embed([head + "然后加一点糖"]), longer.embed([head + "再撒上葱花出锅"]), atol=1e-3)
    assert "/40t" in e.model_id and "/200t" in longer.model_id


@needs_torch
@pytest.mark.slow
def test_int8_stays_close_to_float32(gemma_folder):
    texts = ["红烧肉要炖多久", "猪肉炖一个小时", "git rebase rewrites history"]
    f32 = gemma(gemma_folder).embed(texts)
    e = gemma(gemma_folder, quantize="int8")
    q8 = e.embed(texts)
    rows_ok(q8, 3, 768)
    assert e.model_id.endswith("/int8")
    assert not np.allclose(q8, f32, atol=1e-6)  # it is another computation
    assert (np.sum(q8 * f32, axis=1) > 0.95).all()


@needs_torch
@pytest.mark.slow
def test_the_vector_cache_keeps_full_rows_and_serves_every_cut(gemma_folder, tmp_path):
    texts = ["红烧肉要炖多久", "猪肉炖一个小时"]
    cfg = EmbedderConfig(kind="gemma", model=str(gemma_folder), threads=1, cache=tmp_path / "v.db")
    first = embed.load(cfg)
    full = first.embed(texts)
    assert first.loaded
    cut = embed.load(cfg.model_copy(update={"dimensions": 256}))
    v = cut.embed(texts)
    assert not cut.loaded  # every row was in the cache: the model was not loaded
    rows_ok(v, 2, 256)
    assert np.allclose(v, full[:, :256] / np.linalg.norm(full[:, :256], axis=1, keepdims=True), atol=1e-6)
    assert cut.model_id == gemma(gemma_folder, dimensions=256).model_id
    q = cut.embed_query(texts)  # questions are another side: not in the cache yet
    assert cut.loaded and not np.allclose(q, v)


@needs_torch
@pytest.mark.slow
def test_an_index_of_the_notes_searches_and_refuses_another_cut(gemma_folder, tmp_path):
    settings = make_settings(tmp_path, embedder={"kind": "gemma", "model": str(gemma_folder), "threads": 1})
    state = State(settings.state_dir)
    try:
        with NoteIndex.open(settings, create=True) as index:
            source = open_source(settings)
            assert Indexer(index, state, source.name).run(source.notes()).chunks_written > 0
    finally:
        state.close()
    with NoteIndex.open(settings) as index:
        assert index.embedder.dim == 768
        assert search(index, "付款失败后第一次重试要等多久", "local", 3)  # it answers from the index
    other = make_settings(tmp_path, embedder={"kind": "gemma", "model": str(gemma_folder), "threads": 1,
                                              "dimensions": 256})
    with pytest.raises(IndexMismatch):
        NoteIndex.open(other)


def test_a_missing_model_names_the_command_that_fetches_it(tmp_path):
    settings = make_settings(tmp_path, embedder={"kind": "gemma"})
    assert settings.embedder.model == str(tmp_path / "data" / "models" / "embeddinggemma-300m")
    with pytest.raises(ModelMissing, match="leanote-rag models fetch gemma"):
        embed.load(settings.embedder, cache=False)


def test_gemma_options_belong_to_gemma(tmp_path):
    with pytest.raises(ConfigError, match="embedder.dimensions and embedder.quantize are kind gemma's"):
        make_settings(tmp_path, embedder={"kind": "use", "dimensions": 256})
    with pytest.raises(ConfigError, match="dimensions"):
        make_settings(tmp_path, embedder={"kind": "gemma", "dimensions": 300})
    named = config_mod.from_dict({"source": {"kind": "files", "path": "notes"}, "state_dir": "data",
                                  "embedder": {"kind": "gemma", "model": "models/gemma"}}, base_dir=tmp_path)
    assert named.embedder.model == str(tmp_path / "models" / "gemma")
