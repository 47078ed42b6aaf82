"""Typed settings, loaded once from one YAML file and validated at start-up.

Where the file comes from: ``--config PATH``, else ``$LEANOTE_RAG_CONFIG``, else
``./config.yaml``. Relative paths inside it are relative to the file's folder, so a
systemd unit and a shell in another directory read the same files.

Secrets never live in the YAML: keys ending in ``_env`` name an environment
variable, read with :func:`secret` only when the value is needed.

``Settings`` is the whole file; its sections, one class each, are ``rag.sections``.
"""

from __future__ import annotations

import difflib
import logging
import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from rag.errors import ConfigError

log = logging.getLogger(__name__)

CONFIG_ENV = "LEANOTE_RAG_CONFIG"
DEFAULT_CONFIG = "config.yaml"
SYSTEM_CONFIG = Path("/etc/leanote-rag/config.yaml")  # the systemd install's
from rag.sections import (AnswerConfig, Bm25Config, ChunkingConfig, EmbedderConfig, ExcludeConfig, LeanoteConfig,
                          MemoryConfig, OllamaConfig, QdrantConfig, RerankConfig, RetrievalConfig, SecondIndexConfig, Section,
                          SourceConfig, SyncConfig, scale)
from rag.sections_chat import (CHAT_DOORS, ApiConfig, BotsConfig, CaptureConfig, DiscordConfig, GapsConfig,
                               LimitsConfig, MediaConfig, TelegramConfig, UserMap, open_doors)


QUESTIONS_WEIGHT = 0.25  # retrieval.questions_weight unset while memory.questions is auto or on


class Settings(Section):
    # sections a running daemon takes whole from a reloaded config
    LIVE_SECTIONS: ClassVar[tuple[str, ...]] = ("users", "exclude", "answer", "retrieval", "bots", "log_level")
    leanote: LeanoteConfig = LeanoteConfig()
    source: SourceConfig
    state_dir: Path = Path("data")
    embedder: EmbedderConfig = EmbedderConfig()
    second_index: SecondIndexConfig = SecondIndexConfig()
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
    doors: list[str] | None = Field(default=None, description="the chat doors serve opens (telegram, discord); "
                                    "default: each whose section says enabled: true")
    telegram: TelegramConfig = TelegramConfig()
    discord: DiscordConfig = DiscordConfig()
    bots: BotsConfig = BotsConfig()
    limits: LimitsConfig = LimitsConfig()
    capture: CaptureConfig = CaptureConfig()
    gaps: GapsConfig = GapsConfig()
    memory: MemoryConfig = MemoryConfig()
    media: MediaConfig = MediaConfig()
    api: ApiConfig = ApiConfig()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    # Where the file was read from; relative paths were resolved against its folder.
    config_path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _questions_searched_when_written(self) -> "Settings":
        # Written questions turned on are searched at the weight measured not to lose a dev hit
        # (docs/memory.md), unless retrieval.questions_weight says otherwise.
        if self.memory.questions != "off" and "questions_weight" not in self.retrieval.model_fields_set:
            # (the sections are frozen once built; this is still their building)
            object.__setattr__(self, "retrieval", self.retrieval.model_copy(update={"questions_weight": QUESTIONS_WEIGHT}))
        return self

    @model_validator(mode="after")
    def _doors_open(self) -> "Settings":
        # doors: lists the chat doors serve opens; each section's enabled follows it (rag.sections_chat)
        try:
            opened = open_doors(self.doors, {name: getattr(self, name).enabled for name in CHAT_DOORS})
        except ValueError as err:
            raise ValueError(str(err)) from None
        for name, on in opened.items():
            section = getattr(self, name)
            if section.enabled != on:  # checked as written so (frozen once built; this is still their building)
                object.__setattr__(self, name, type(section).model_validate({**section.model_dump(), "enabled": on}))
        return self

    # --- thresholds on the embedder's cosine scale: the config's, else the ones measured on it (SCALES) ---

    @property
    def gap_join_at(self) -> float:
        """``gaps.join_at``, else the first embedder's (a gap's asks are its vectors)."""
        return self.gaps.join_at if self.gaps.join_at is not None else scale(self.embedder.kind).join_at

    @property
    def related_min_score(self) -> float:
        """``memory.related_min_score``, else the first embedder's (the pairs are its chunks' cosines)."""
        given = self.memory.related_min_score
        return given if given is not None else scale(self.embedder.kind).related

    def related_question_min_score(self, kind: str | None = None) -> float:
        """``memory.related_question_min_score``, else the one of ``kind``: the embedder whose cosines
        the question's search scored (``rag.memory.related.question_min_score``; default the first)."""
        given = self.memory.related_question_min_score
        return given if given is not None else scale(kind or self.embedder.kind).question

    @property
    def open_doors(self) -> list[str]:
        """The chat doors ``serve`` opens, in the order ``doors`` lists them (else telegram, discord)."""
        return [name for name in (self.doors or CHAT_DOORS) if getattr(self, name).enabled]

    @model_validator(mode="after")
    def _capture_target_exists(self) -> "Settings":
        # capture.target: folder needs a folder (leanote without an account: the bots say how to add one)
        target = self.capture.target
        if target == "folder" and self.source.kind != "files":
            raise ValueError(f"capture.target: folder writes into a files source's folder, and source.kind is "
                             f"{self.source.kind!r}: use capture.target: leanote (with capture.accounts) or auto")
        return self

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
    state_dir = absolute(settings.state_dir)
    embedder = resolved_embedder(settings.embedder, absolute, state_dir)
    second = settings.second_index.model_copy(
        update={"embedder": resolved_embedder(settings.second_index.embedder, absolute, state_dir)})
    api = settings.api.model_copy(update={"socket": absolute(settings.api.socket) or state_dir / "api.sock"})
    return settings.model_copy(
        update={
            "source": source,
            "qdrant": qdrant,
            "embedder": embedder,
            "second_index": second,
            "state_dir": state_dir,
            "api": api,
            "config_path": config_path,
        }
    )


def resolved_embedder(cfg: EmbedderConfig, absolute, state_dir: Path) -> EmbedderConfig:
    """An embedder section with its paths absolute; kind gemma's model, when not named, the
    folder ``leanote-rag models fetch gemma`` fills."""
    update: dict[str, Any] = {"cache": absolute(cfg.cache)}
    if cfg.kind == "gemma":
        update["model"] = str(absolute(Path(cfg.model)) if cfg.model else state_dir / "models" / "embeddinggemma-300m")
    return cfg.model_copy(update=update)


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


def secret(env_name: str, what: str) -> str:
    """Read a secret from the environment variable the config names."""
    value = os.environ.get(env_name)
    if not value:
        raise ConfigError(
            f"environment variable {env_name} (named by {what}) is not set: "
            f"export it, or put it in the service's EnvironmentFile"
        )
    return value
