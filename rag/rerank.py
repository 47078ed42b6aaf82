"""Rerankers behind one interface, chosen by ``rerank.kind``: a cross-encoder reads the
question with each candidate and scores the pair.

- ``flagembedding``: FlagEmbedding's ``FlagReranker`` (default ``BAAI/bge-reranker-v2-m3``);
- ``sentence-transformers``: ``CrossEncoder``;
- ``none``: keep the fused order.

Both real ones need the ``[models]`` extra and their weights on disk. When they
cannot be loaded (not installed, weights not downloaded) the answer service runs
without reranking and says why in the trace; ``doctor`` reports it with the fix.
On CPU a reranker is slow, so ``rerank()`` has a time budget: past it the fused
order stands (and the trace says so).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor, TimeoutError
from dataclasses import dataclass
from typing import Callable, Protocol

from .config import RerankConfig
from .errors import ModelMissing, UserError
from .model import Hit

log = logging.getLogger(__name__)

DEFAULT_MODEL = "BAAI/bge-reranker-v2-m3"


class Reranker(Protocol):
    model_id: str

    def score(self, query: str, passages: list[str]) -> list[float]:
        """One relevance score per passage (higher is better)."""
        ...


def _require_local(name: str) -> None:
    """Fail at once, not after the hub client's retries, when weights are not on disk."""
    if os.path.isdir(name):
        return
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return
    if not isinstance(try_to_load_from_cache(name, "config.json"), str):
        raise ModelMissing(
            f"reranker weights for {name!r} are not on this machine: download them where there is network "
            f"(huggingface-cli download {name}) and copy the cache, or set rerank.model to a local folder"
        )


class FlagEmbeddingReranker:
    def __init__(self, cfg: RerankConfig):
        try:
            from FlagEmbedding import FlagReranker
        except ImportError:
            raise UserError(
                "the flagembedding reranker needs the [models] extra: "
                "pip install torch==2.13.0 && pip install 'leanote-rag[models]'"
            ) from None
        name = cfg.model or DEFAULT_MODEL
        _require_local(name)
        self._model = FlagReranker(name, use_fp16=False, devices=cfg.device)
        self.model_id = f"flagembedding:{name}"
        self.batch_size, self.max_length = cfg.batch_size, cfg.max_length

    def score(self, query: str, passages: list[str]) -> list[float]:
        scores = self._model.compute_score(
            [(query, p) for p in passages], batch_size=self.batch_size, max_length=self.max_length, normalize=True
        )
        return [float(s) for s in (scores if isinstance(scores, list) else list(scores))]


class CrossEncoderReranker:
    def __init__(self, cfg: RerankConfig):
        try:
            from sentence_transformers import CrossEncoder
        except ImportError:
            raise UserError(
                "the sentence-transformers reranker needs the [models] extra: "
                "pip install torch==2.13.0 && pip install 'leanote-rag[models]'"
            ) from None
        name = cfg.model or DEFAULT_MODEL
        _require_local(name)
        self._model = CrossEncoder(name, device=cfg.device, max_length=cfg.max_length)
        self.model_id = f"sentence-transformers:{name}"
        self.batch_size = cfg.batch_size

    def score(self, query: str, passages: list[str]) -> list[float]:
        scores = self._model.predict([(query, p) for p in passages], batch_size=self.batch_size, show_progress_bar=False)
        return [float(s) for s in scores]


RERANKERS: dict[str, Callable[[RerankConfig], Reranker]] = {
    "flagembedding": FlagEmbeddingReranker,
    "sentence-transformers": CrossEncoderReranker,
}


def load(cfg: RerankConfig) -> Reranker | None:
    """The configured reranker, or None for ``kind: none``. Raises UserError (with the fix)
    when it cannot be loaded."""
    if cfg.kind == "none":
        return None
    try:
        return RERANKERS[cfg.kind](cfg)
    except (UserError, ModelMissing):
        raise
    except OSError as err:
        raise ModelMissing(f"cannot load reranker {cfg.model or DEFAULT_MODEL!r}: {err}") from None


@dataclass
class RerankOutcome:
    hits: list[Hit]
    scores: dict[str, float]  # point id -> rerank score
    note: str  # for the trace: "reranked 50 in 812 ms", "over budget: fused order kept", ...


class BudgetedReranker:
    """Runs a reranker in its own thread with a time budget. A call still running from
    a budget overrun makes the next one skip reranking rather than queue behind it."""

    def __init__(self, reranker: Reranker, budget: float):
        self.reranker = reranker
        self.budget = budget
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rerank")
        self._running = None

    def rerank(self, query: str, hits: list[Hit]) -> RerankOutcome:
        import time

        if not hits:
            return RerankOutcome(hits, {}, "nothing to rerank")
        if self._running is not None and not self._running.done():
            return RerankOutcome(hits, {}, "reranker still busy with an earlier question: fused order kept")
        started = time.perf_counter()
        self._running = self._pool.submit(self.reranker.score, query, [h.text for h in hits])
        try:
            scores = self._running.result(timeout=self.budget)
        except TimeoutError:
            return RerankOutcome(hits, {}, f"over the {self.budget:g} s budget: fused order kept")
        except Exception as err:  # a model failure must not lose the answer
            log.warning("reranking failed: %s", err)
            return RerankOutcome(hits, {}, f"reranker failed ({err}): fused order kept")
        by_id = {h.point_id: s for h, s in zip(hits, scores)}
        ordered = sorted(hits, key=lambda h: -by_id[h.point_id])
        ms = (time.perf_counter() - started) * 1000
        return RerankOutcome(ordered, by_id, f"reranked {len(hits)} candidates in {ms:.0f} ms")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
