"""The rerankers' real loading code, offline, on a tiny cross-encoder built here (random
2-layer BERT, WordPiece vocabulary trained on the spot): FlagEmbedding's FlagReranker
and sentence-transformers' CrossEncoder both load it from a local folder."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from rag.answer import rerank
from rag.config import RerankConfig
from rag.errors import ModelMissing
from rag.index.note_index import NoteIndex
from rag.model import Hit
from bot.root import Parts

# Whether torch is installed, without importing it: importing it here took every test process
# ~2 s of CPU at collection; the fixture imports it in the one worker that runs these tests.
if importlib.util.find_spec("torch") is None:
    pytest.skip("needs the [models] extra", allow_module_level=True)
pytestmark = pytest.mark.xdist_group("torch")  # torch and transformers imported in one worker of a run

WORDS = ["redis 持久化 快照 日志", "线程池 参数 动态 调整", "番茄 炒蛋 加糖", "retry backoff journal logs"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-reranker")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(WORDS * 10, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    fast = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]")
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=fast.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, num_labels=1, max_position_embeddings=128)
    BertForSequenceClassification(cfg).save_pretrained(folder)
    return str(folder)


def hit(i, text):
    return Hit(point_id=f"p{i}", note_id=f"n{i}", user_id="u", title=f"t{i}", notebook="", heading="", url="",
               text=text, chunk_index=0, char_start=0, char_end=len(text), score=1.0 - i / 10)


@pytest.mark.parametrize("kind", ["flagembedding", "sentence-transformers"])
@pytest.mark.slow
def test_real_loading_code_on_a_local_model(tiny_model, kind):
    r = rerank.load(RerankConfig(kind=kind, model=tiny_model, max_length=64))
    assert r.model_id == f"{kind}:{tiny_model}"
    scores = r.score("redis 快照", ["redis 持久化 快照", "番茄 炒蛋", "线程池"])
    assert len(scores) == 3 and all(isinstance(s, float) for s in scores)


def test_rerank_orders_by_the_models_scores(tiny_model):
    model = rerank.load(RerankConfig(kind="flagembedding", model=tiny_model, max_length=64))
    hits = [hit(i, w) for i, w in enumerate(WORDS)]
    outcome = rerank.BudgetedReranker(model, budget=30).rerank("redis 快照", hits)
    scores = model.score("redis 快照", WORDS)
    assert [h.point_id for h in outcome.hits] == [f"p{i}" for i in sorted(range(4), key=lambda i: -scores[i])]
    assert outcome.note.startswith("reranked 4 candidates")


def test_rerank_scores_only_as_many_as_the_budget_allows(tiny_model):
    model = rerank.load(RerankConfig(kind="flagembedding", model=tiny_model, max_length=64))
    hits = [hit(i, WORDS[i % 4]) for i in range(40)]
    budgeted = rerank.BudgetedReranker(model, budget=10)
    first = budgeted.rerank("redis", hits)
    assert len(first.scores) == rerank.BudgetedReranker.FIRST_CALL  # speed unknown: a few first
    assert first.hits[4:] == hits[4:]  # the rest keep the fused order
    budgeted.per_candidate = 1.0  # a slow model: 1 s per candidate, 10 s budget
    second = budgeted.rerank("redis", hits)
    assert len(second.scores) == 8 and second.hits[8:] == hits[8:]
    assert "the other 32 kept their fused order" in second.note


def test_over_budget_keeps_the_fused_order(tiny_model):
    model = rerank.load(RerankConfig(kind="sentence-transformers", model=tiny_model, max_length=64))
    hits = [hit(i, w * 50) for i, w in enumerate(WORDS * 5)]
    budgeted = rerank.BudgetedReranker(model, budget=0.000001)
    outcome = budgeted.rerank("redis", hits)
    assert outcome.hits == hits and outcome.scores == {} and "budget" in outcome.note
    busy = budgeted.rerank("redis", hits)  # the overrun call may still be running
    assert busy.hits == hits
    budgeted.close()


def test_none_and_missing_models():
    assert rerank.load(RerankConfig(kind="none")) is None
    with pytest.raises(ModelMissing, match="not on this machine"):
        rerank.load(RerankConfig(kind="flagembedding", model="BAAI/no-such-reranker"))


def test_answer_service_reranks_and_traces(tiny_model, tmp_path, use_embedder):
    from conftest import make_settings
    from sync.indexer import Indexer
    from sync.sources import open_source
    from sync.state import State

    settings = make_settings(tmp_path, rerank={"kind": "flagembedding", "model": tiny_model, "max_length": 64},
                             ollama={"enabled": False})
    state = State(settings.state_dir)
    source = open_source(settings)
    with NoteIndex.open(settings, create=True, embedder=use_embedder) as index:
        Indexer(index, state, source.name).run(source.notes())
        service = Parts(settings, index=index).answers
        answer = asyncio.run(service.ask("番茄炒蛋怎么做？", "local"))
        service.close()
    state.close()
    assert answer.trace.rerank.startswith("reranked")
    scored = [c for c in answer.trace.candidates if c.rerank is not None]
    assert len(scored) == min(len(answer.trace.candidates), rerank.BudgetedReranker.FIRST_CALL)
    assert "rerank" in answer.timings_ms


def test_a_reranker_that_cannot_load_is_reported_and_skipped(tmp_path, use_embedder):
    from conftest import make_settings

    settings = make_settings(tmp_path, rerank={"kind": "flagembedding", "model": "BAAI/no-such-reranker"})
    with NoteIndex.open(settings, create=True, embedder=use_embedder) as index:
        service = Parts(settings, index=index).answers
    assert service.reranker is None and "not on this machine" in service.rerank_unavailable
