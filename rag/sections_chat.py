"""The sections of ``config.yaml`` about people and the doors they come through: who may ask
(``users``), the bots, the API, capture from chat, voice and images, what a person's knowledge
gaps may cost, and the limits every door applies. The notes' side (source, index, answers,
memory, sync) is ``rag.sections``, which also holds what both share (``Section``, durations)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, Field, model_validator

from rag.digest_plan import parse_plan
from rag.errors import UserError
from rag.sections import Account, Duration, Section, on_off

CHAT_DOORS = ("telegram", "discord")  # the chat doors a person of ``users:`` is known on, by their ids there


def open_doors(doors: list[str] | None, enabled: dict[str, bool]) -> dict[str, bool]:
    """Which chat doors ``serve`` opens, by name: when the config lists ``doors``, those (each
    listed one on, the others off), else each whose section says ``enabled: true`` (``enabled``).
    ``ValueError`` for a name that is no door, or one listed twice."""
    if doors is None:
        return dict(enabled)
    for name in doors:
        if name not in CHAT_DOORS:
            raise ValueError(f"doors: {name!r} is no door (the doors are {', '.join(CHAT_DOORS)})")
    if len(set(doors)) != len(doors):
        raise ValueError("doors: a door is listed twice")
    return {name: name in doors for name in CHAT_DOORS}


class UserMap(Section):
    """A person in chat, and whose notes they may query."""

    leanote_user_id: str | None = None
    leanote_email: str | None = Field(default=None, description="an account of source.accounts, instead of the id")
    telegram_ids: list[int] = []
    discord_ids: list[int] = []
    admin: bool = Field(default=False, description="may run /sync")
    digest: str | None = Field(default=None, description="a digest of the notes in a private chat: 'weekly mon 09:00' "
                                                         "or 'daily 08:30' (each person may change it with /digest)")
    timezone: str = Field(default="UTC", description="the person's IANA time zone (Asia/Shanghai): digests' times")

    def ids_on(self, platform: str) -> list[int]:
        """The person's ids on a chat door (``telegram``, ``discord``): ``<platform>_ids``; none on
        a door this entry has no ids for."""
        return list(getattr(self, f"{platform}_ids", None) or ()) if platform.isidentifier() else []

    @model_validator(mode="after")
    def _one_user(self) -> "UserMap":
        if bool(self.leanote_user_id) == bool(self.leanote_email):
            raise ValueError("give exactly one of leanote_user_id and leanote_email")
        try:
            if self.digest is not None:
                parse_plan(self.digest, self.timezone)
            else:
                parse_plan(f"daily 00:00 {self.timezone}")
        except UserError as err:
            raise ValueError(str(err)) from None
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

    @model_validator(mode="after")
    def _dms_reach_global_commands_only(self) -> "DiscordConfig":
        # Discord offers a server's (guild) commands in that server only: with guild_ids the
        # commands never show in a direct message, whatever allow_dms says.
        if self.enabled and self.allow_dms and self.guild_ids:
            raise ValueError(
                "discord.allow_dms: true cannot work with discord.guild_ids: the commands are then registered in "
                "those servers only, and Discord offers no server's commands in direct messages. Remove "
                "discord.guild_ids (the commands are then registered globally, which Discord may take up to an "
                "hour to show), or set discord.allow_dms: false"
            )
        return self


class ApiToken(Section):
    """A bearer token for the TCP listener, whose notes it may query, and who holds it (``name``)."""

    token_env: str = Field(description="environment variable holding the token")
    name: str = Field(default="", description="its holder, api:<name>, whatever its place in the list (default: token_env)")
    users: list[str] = Field(default=[], description="Leanote user ids (or emails of source.accounts) it may query")
    admin: bool = Field(default=False, description="may start syncs and rebuilds, and sees every account's status")

    @model_validator(mode="after")
    def _named(self) -> "ApiToken":
        if not re.fullmatch(r"(?!token\d+$)[A-Za-z0-9_.-]{1,64}", name := self.name or self.token_env):
            raise ValueError(f"name {name[:70]!r}: 1 to 64 letters, digits, _ - or . (not token<n>: an old name)")
        object.__setattr__(self, "name", name)  # (frozen once built; this is still its building)
        return self


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
    web_url: str | None = Field(
        default=None, description="the address people open the web chat at, as their browser sees it (the bots' "
        "/web links start with it; https makes its cookie Secure), e.g. https://notes.example.com; default "
        "http://<listen>")
    web_session: Duration = Field(default=30 * 86400.0, description="the web chat: a sign-in lasts this long")
    web_link: Duration = Field(default=600.0, description="the web chat: a /web sign-in link works once, within this")

    @model_validator(mode="after")
    def _listen_needs_tokens(self) -> "ApiConfig":
        if self.listen:
            host, _, port = self.listen.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError("api.listen must be host:port, e.g. 127.0.0.1:8765")
            if not self.tokens:
                raise ValueError("api.listen needs at least one entry in api.tokens (a token_env and its users)")
        if self.web_url is not None and not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", self.web_url):
            raise ValueError(f"api.web_url {self.web_url[:80]!r}: an address like https://notes.example.com")
        for seen in ([t.name for t in self.tokens], [t.token_env for t in self.tokens]):  # a holder, a variable
            if twice := [v for i, v in enumerate(seen) if v in seen[:i]]:
                raise ValueError(f"two entries of api.tokens share {twice[0]!r} (a name or token_env): give each its own")
        return self


class CaptureConfig(Section):
    """Writing from chat into Leanote (``sync.writeback.capture``)."""

    enabled: bool = Field(default=True, description="/note, forwards, /save, /append, /remember, Save as note")
    target: Literal["auto", "leanote", "folder"] = Field(
        default="auto", description="where captures are written: leanote (through its API, with capture.accounts or "
        "a leanote_api source's accounts), folder (Markdown files in a files source's folder), or auto: Leanote when "
        "there is an account to write with, else a files source's folder, else nowhere (the bots say why)")
    notebook: str = Field(default="Inbox", description="the notebook captures go into, created if missing (a folder: "
                                                       "its sub-folder)")
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
    draft_wait: Duration = Field(
        default=1800.0, description="after ✍️ under /gaps, how long the bot waits for the text of that gap's note "
        "(then the next message is a question again)")


class MediaConfig(Section):
    """Voice messages and photos, read on this machine (``rag.media``): the optional extras
    ``leanote-rag[speech]`` and ``leanote-rag[ocr]``; without them the bots say what to install."""

    speech: Annotated[Literal["faster-whisper", "off"], BeforeValidator(on_off)] = Field(
        default="faster-whisper", description="voice messages and audio: transcribed by Whisper base (CTranslate2), or off")
    ocr: Annotated[Literal["rapidocr", "off"], BeforeValidator(on_off)] = Field(
        default="rapidocr", description="photos and image files: their text recognised (PP-OCRv4, ONNX Runtime), or off")
    max_clip: Duration = Field(default=60.0, le=1800, description="the longest voice message or audio file transcribed")
    max_audio_mb: float = Field(default=10.0, gt=0, description="the largest audio file fetched for transcription")
    language: str = Field(
        default="", description="the spoken language when everyone speaks one (zh, en, ...): saves the ~3 s a short "
        "clip spends detecting it; empty: detected for each piece of a clip")
    piece: Duration = Field(
        default=15.0, ge=5, le=30,
        description="a long clip is transcribed in pieces of at most this long (cut at a pause), taking turns with "
        "other people's long clips; a short clip (one piece) or an image does not wait for a long clip's piece: it runs "
        "beside it")
    threads: int = Field(default=2, ge=1, le=64, description="CPU threads for one transcription or OCR (at most two run at once: a long "
                         "clip's piece and a short clip or an image beside it)")
    max_image_mb: float = Field(default=10.0, gt=0, description="the largest image read for its text")
    max_image_pixels: int = Field(default=40_000_000, ge=10_000, description="an image with more pixels is not read")
    ocr_pixels: int = Field(
        default=2_400_000, ge=100_000, le=40_000_000,
        description="an image is read at most this many pixels (and 2,000 on its long side), scaled down as it is "
        "decoded: the OCR's memory grows with it, about 130 MB a million pixels (a phone's screenshot is under 2 "
        "million)")


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


class GapsConfig(Section):
    """What a person's knowledge gaps may cost (``rag.answer.gaps``, ``bot.usecases.gaps``)."""

    LIVE: ClassVar[tuple[str, ...]] = ("max_open", "check_budget")
    max_open: int = Field(default=200, ge=1, description="open knowledge gaps kept per person and Leanote user; a new "
                          "one past this dismisses the one asked least recently")
    check_budget: Duration = Field(default=20.0, description="search time the closing check after a pass may take; "
                                   "the gaps it did not reach are checked after the next pass")
    join_at: float | None = Field(default=None, ge=-1.0, le=1.0, description="a question joins a gap when its cosine "
                                  "with one of the gap's questions is at least this; default: the one measured on the "
                                  "embedder's scale (rag.sections.SCALES: use 0.6, gemma 0.65)")
