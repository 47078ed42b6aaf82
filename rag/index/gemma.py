"""``embedder.kind: gemma``: EmbeddingGemma-300M (Google, Gemma Terms of Use) through
sentence-transformers on the CPU. The ``[gemma]`` extra; the weights are fetched once into
``<state_dir>/models/embeddinggemma-300m`` (``rag.index.gemma_fetch``, ``leanote-rag models fetch
gemma``), or ``embedder.model`` names another folder of the same model.

- **Prompts**: the model was trained with a task prefix; questions are embedded with its
  ``query`` prompt ("task: search result | query: "), passages with its ``document`` prompt
  ("title: none | text: "), both read from the model folder.
- **Output size** (``embedder.dimensions``): 768, or a Matryoshka cut to 512 or 256 (the first
  dimensions, normalised again): a smaller index and a quicker search for a little quality.
- **Sequence length** (``embedder.max_tokens``): a passage is read up to this many tokens (the
  model takes 2,048; the cost grows with it). The notes' chunks are 345 tokens at the median.
- **Backend** (``embedder.backend``): ``onnx`` (the default) runs the model through ONNX Runtime,
  exported once beside its folder (``rag.index.gemma_onnx``): the same vectors as ``torch``'s,
  several times as many chunks a second here (docs/performance.md). ``torch`` runs it in torch.
- **int8** (``embedder.quantize: int8``): torch's dynamic quantisation of the linear layers (the
  torch backend's; it finds a little less).

The model id names the weights (the first digits of the checked zip's SHA-256), the output
size, the sequence length and the quantisation: an index built with one refuses another. It does
not name the backend: both give the same vectors, so either serves an index the other built.
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from rag.config import EmbedderConfig
from rag.errors import ModelMissing, UserError
from rag.index import gemma_fetch, gemma_onnx

log = logging.getLogger(__name__)

FULL_DIM = 768
DIMENSIONS = (768, 512, 256, 128)
EXTRA = "pip install torch==2.13.0 && pip install 'leanote-rag[gemma]'"


def weights_id(folder: Path) -> str:
    """The weights, named without reading them: the fetched model by its checked SHA-256, another
    folder by its name."""
    mark = Path(folder) / gemma_fetch.CHECKED
    try:
        return f"{gemma_fetch.GEMMA.name}-{mark.read_text().strip()[:12]}"
    except OSError:
        return f"local/{Path(folder).name}"


def backend(cfg: EmbedderConfig) -> str | None:
    """The backend a gemma embedder runs on: ``embedder.backend``, else ``onnx`` (``torch`` when
    ``quantize: int8`` asks for torch's quantisation); None for another kind."""
    if cfg.kind != "gemma":
        return None
    return cfg.backend or ("torch" if cfg.quantize != "none" else "onnx")


def exported(cfg: EmbedderConfig) -> bool:
    """Is the ONNX export of the configured model made and current (``rag.index.gemma_onnx``)?"""
    model = Path(cfg.model or "")
    try:
        return gemma_onnx._current(gemma_onnx.export_folder(model), gemma_onnx.weights_mark(model, weights_id(model)))
    except (ModelMissing, OSError):
        return False


def model_id(cfg: EmbedderConfig, dimensions: int | None = None) -> str:
    dims = dimensions or cfg.dimensions or FULL_DIM
    quant = "" if cfg.quantize == "none" else f"/{cfg.quantize}"
    return f"gemma:{weights_id(Path(cfg.model or ''))}/{dims}d/{cfg.max_tokens}t{quant}"


def cut(rows: np.ndarray, dim: int) -> np.ndarray:
    """A Matryoshka cut: the first ``dim`` dimensions of each row, normalised again."""
    rows = np.asarray(rows, dtype=np.float32)
    if rows.shape[1] == dim:
        return rows
    part = rows[:, :dim]
    norms = np.linalg.norm(part, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return part / norms


class GemmaEmbedder:
    """EmbeddingGemma-300M; rows L2-normalised, ``dim`` wide (module docstring)."""

    def __init__(self, cfg: EmbedderConfig):
        if not cfg.model:
            raise UserError("embedder.model: the gemma model's folder is not known (no state_dir?)")
        folder = Path(cfg.model)
        if not (folder / "modules.json").is_file():
            raise ModelMissing(f"the EmbeddingGemma model is not in {folder}: fetch it once with "
                               f"`leanote-rag models fetch gemma`, or point embedder.model at its folder")
        self.dim = cfg.dimensions or FULL_DIM
        self.model_id = model_id(cfg)
        self.batch_size = cfg.batch_size
        self.max_chars = cfg.max_chars
        self.backend = backend(cfg)
        self._model = _gemma_model(str(folder), cfg.max_tokens, cfg.quantize, cfg.threads, self.backend,
                                   weights_id(folder))
        self._lock = threading.Lock()  # one model: its calls one at a time (each runs on all its threads)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, "document")

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, "query")

    def _embed(self, texts: list[str], prompt: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        texts = [(t[: self.max_chars] if t.strip() else " ") for t in texts]
        with self._lock:
            rows = self._model.encode(texts, prompt_name=prompt, batch_size=self.batch_size,
                                      normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        return cut(rows, self.dim)


@lru_cache(maxsize=2)
def _gemma_model(folder: str, max_tokens: int, quantize: str, threads: int, backend: str = "torch",
                 weights: str = ""):
    """One loaded model per process and setting (loading reads 1.2 GB)."""
    if backend == "onnx":
        gemma_onnx.require_packages()
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise UserError(f"embedder.kind gemma needs the [gemma] extra: {EXTRA}") from None
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)  # torch's pool is the process's: the reranker's too
    try:
        if backend == "onnx":
            model = gemma_onnx.loaded(Path(folder), weights, threads)
        else:
            model = SentenceTransformer(folder, device="cpu", local_files_only=True)
    except (OSError, ValueError) as err:
        raise ModelMissing(f"cannot load the EmbeddingGemma model from {folder}: {err}; fetch it again "
                           f"(`leanote-rag models fetch gemma`)") from None
    model.max_seq_length = max_tokens
    if quantize == "int8":
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    model.eval()
    for name in ("query", "document"):
        if name not in model.prompts:
            raise ModelMissing(f"{folder} has no {name!r} prompt in config_sentence_transformers.json: not the "
                               f"EmbeddingGemma model")
    model.encode(["warm up"], prompt_name="query", show_progress_bar=False)
    return model
