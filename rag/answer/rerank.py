"""Rerankers behind one interface, chosen by ``rerank.kind``: a cross-encoder reads the
question with each candidate and scores the pair.

- ``flagembedding``: FlagEmbedding's ``FlagReranker`` (default ``BAAI/bge-reranker-v2-m3``);
- ``sentence-transformers``: ``CrossEncoder``;
- ``none``: keep the fused order;
- ``auto`` (the default): ``flagembedding`` when the ``[models]`` extra is installed
  and the weights are on this machine, else ``none`` — a plain install answers
  without a reranker and without a warning.

Both real ones need the ``[models]`` extra and their weights on disk. When they
cannot be loaded (not installed, weights not downloaded) the answer service runs
without reranking and says why in the trace; ``doctor`` reports it with the fix.
On CPU a reranker is slow, so ``rerank()`` has a time budget: past it the fused
order stands (and the trace says so).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from concurrent.futures import ThreadPoolExecutor, TimeoutError
from dataclasses import dataclass
from typing import Callable, Protocol

from rag.config import RerankConfig
from rag.errors import ModelMissing, UserError
from rag.model import Hit

log = logging.getLogger(__name__)

DEFAULT_MODEL = "BAAI/bge-reranker-v2-m3"


class Reranker(Protocol):
    model_id: str

    def score(self, query: str, passages: list[str]) -> list[float]:
        """One relevance score per passage (higher is better)."""
        ...


def _on_disk(name: str) -> bool | None:
    """Whether a model's weights are here (a folder, or the hub cache); None: cannot tell."""
    if os.path.isdir(name):
        return True
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def resolve(cfg: RerankConfig) -> tuple[str, str]:
    """The reranker kind to run, and why (for ``auto``)."""
    if cfg.kind != "auto":
        return cfg.kind, ""
    name = cfg.model or DEFAULT_MODEL
    if importlib.util.find_spec("FlagEmbedding") is None:
        return "none", "auto: the [models] extra is not installed, so answers keep the fused order"
    if not _on_disk(name):
        return "none", f"auto: no weights for {name} on this machine, so answers keep the fused order"
    return "flagembedding", f"auto: {name}"


def _require_local(name: str) -> None:
    """Fail at once, not after the hub client's retries, when weights are not on disk."""
    if _on_disk(name) is False:
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
    kind, _ = resolve(cfg)
    if kind == "none":
        return None
    try:
        return RERANKERS[kind](cfg)
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
    """Runs a reranker in its own thread within a time budget, scoring only as many of
    the top candidates as its measured speed allows (a cross-encoder on CPU can need
    a second per candidate); the rest keep their fused order after them. A call that
    still overran makes the next one skip reranking rather than queue behind it."""

    FIRST_CALL = 4  # candidates scored before the speed is known

    def __init__(self, reranker: Reranker, budget: float):
        self.reranker = reranker
        self.budget = budget
        self.per_candidate: float | None = None  # seconds, measured
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rerank")
        self._running = None

    def how_many(self, available: int) -> int:
        if self.per_candidate is None:
            return min(available, self.FIRST_CALL)
        return max(1, min(available, int(0.8 * self.budget / self.per_candidate)))

    def rerank(self, query: str, hits: list[Hit]) -> RerankOutcome:
        import time

        if not hits:
            return RerankOutcome(hits, {}, "nothing to rerank")
        if self._running is not None and not self._running.done():
            return RerankOutcome(hits, {}, "reranker still busy with an earlier question: fused order kept")
        n = self.how_many(len(hits))
        head, rest = hits[:n], hits[n:]
        started = time.perf_counter()
        self._running = self._pool.submit(self.reranker.score, query, [h.text for h in head])
        try:
            scores = self._running.result(timeout=self.budget)
        except TimeoutError:
            # at least this slow: the next call scores fewer
            self.per_candidate = max(self.per_candidate or 0.0, self.budget / n)
            return RerankOutcome(hits, {}, f"over the {self.budget:g} s budget: fused order kept")
        except Exception as err:  # a model failure must not lose the answer
            log.warning("reranking failed: %s", err)
            return RerankOutcome(hits, {}, f"reranker failed ({err}): fused order kept")
        elapsed = time.perf_counter() - started
        measured = elapsed / n
        self.per_candidate = measured if self.per_candidate is None else 0.7 * self.per_candidate + 0.3 * measured
        by_id = {h.point_id: s for h, s in zip(head, scores)}
        ordered = sorted(head, key=lambda h: -by_id[h.point_id]) + rest
        note = f"reranked {n} candidates in {elapsed * 1000:.0f} ms"
        if rest:
            note += f" (the other {len(rest)} kept their fused order: {measured * 1000:.0f} ms per candidate)"
        return RerankOutcome(ordered, by_id, note)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
