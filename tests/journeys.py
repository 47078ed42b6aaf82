"""The world of the journey tests (``tests/test_journeys.py``): a newcomer's own notes
(``tests/data/newcomer/notes``: 39 short notes of one person) on the two installs a person
starts with, and the real daemon with the real bots driven through the chat stand-ins.

- a **folder install**: ``source.kind: files`` over a copy of the notes, nothing else (no
  Leanote anywhere: what the README's first quick start sets up);
- a **Leanote install**: the same notes in a fake Leanote (``tests/fakes/leanote.py``, its sync
  and write API), synced through ``source.kind: leanote_api``, capture logged in to the same
  account.

Each runs ``bot.serve.Daemon`` in this process with the Telegram bot (python-telegram-bot on
the fake Bot API) or the Discord bot (discord.py on the fake Discord), the fake Ollama as the
reader stand-in (``FakeOllama(reader=True)``: it answers from the evidence it is given, quoting
the block that shares the most words with the question, or says the refusal), and the real
embedder, index, memory, gaps and capture outbox. What the tests look at is what the person
sees and what lands in their notes."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yarl
from discord.gateway import DiscordWebSocket

from bot.discord import service as discord_service
from bot.serve import Daemon
from bot.telegram import service as telegram_service

from conftest import REPO, SCENARIO, make_settings, until, within
from fakes.discord import FakeDiscord
from fakes.leanote import FakeLeanote
from fakes.ollama import FakeOllama
from fakes.telegram import FakeTelegram

NOTES = REPO / "tests" / "data" / "newcomer" / "notes"

# The person: one Telegram account, one Discord account, one Leanote user.
TG_ME = 5101
DC_ME = 520000000000000001
GUILD, CHANNEL, ROLE = 530000000000000042, 530000000000004201, 540000000000000077
DC_TOKEN = "MTAx.fake.journeys-token"
LEANOTE_USER = "65a1b2c3d4e5f60718293a4b"  # the newcomer's Leanote user id (the folder install's is "local")
EMAIL, PASSWORD = "newcomer@example.com", "newcomer-secret"

H1 = re.compile(r"\A# (.+)\n+")  # a note's heading, its title


def object_id(when: datetime, n: int) -> str:
    """A Leanote id (a MongoDB ObjectId) made at ``when``: its first 8 hex digits are the time."""
    return f"{int(when.timestamp()):08x}{n:016x}"


def load_into_leanote(leanote: FakeLeanote, notes: Path, made: datetime) -> dict[str, str]:
    """The folder's notes as the person's Leanote holds them: a notebook per top folder, the
    title from the note's heading (taken out of the text, as Leanote keeps it apart), made and
    last edited at ``made``. Returns title -> NoteId."""
    stamp = made.astimezone(timezone(timedelta(hours=8))).isoformat(timespec="milliseconds")
    books: dict[str, str] = {}
    ids: dict[str, str] = {}
    for n, path in enumerate(sorted(notes.rglob("*.md")), 1):
        rel = path.relative_to(notes)
        book = rel.parts[0]
        if book not in books:
            books[book] = object_id(made, 1000 + len(books))
            leanote.put_notebook({"NotebookId": books[book], "UserId": LEANOTE_USER, "Title": book,
                                  "CreatedTime": stamp, "UpdatedTime": stamp})
        text = path.read_text(encoding="utf-8")
        heading = H1.search(text)
        title = heading.group(1).strip() if heading else path.stem
        content = H1.sub("", text, count=1) if heading else text
        ids[title] = object_id(made, n)
        leanote.put_note({"NoteId": ids[title], "UserId": LEANOTE_USER, "NotebookId": books[book], "Title": title,
                          "Content": content, "IsMarkdown": True, "CreatedTime": stamp, "UpdatedTime": stamp})
    return ids


async def next_second() -> None:
    """Until the clock's next whole second: what is written after it is later than anything
    stamped before, in the one-second times files and Leanote keep."""
    import math

    after = math.floor(time.time()) + 1
    await until(lambda: time.time() >= after, 5, "the next second")


@dataclass
class World:
    """One install, its fakes, and how to build its settings for a door."""

    kind: str  # "folder" or "leanote"
    tmp: Path
    ollama: FakeOllama
    notes: Path | None = None  # the folder install's folder
    leanote: FakeLeanote | None = None  # the Leanote install's server
    ids: dict[str, str] = field(default_factory=dict)  # Leanote install: title -> NoteId
    tg: FakeTelegram | None = None
    dc: FakeDiscord | None = None
    started: float = field(default_factory=time.time)  # notes written after this are the journey's

    def settings(self, **sections):
        """Settings for this install and its door (``sections`` merged over them)."""
        common = dict(
            ollama={"host": self.ollama.url}, rerank={"kind": "none"},
            sync={"interval": "1h", "trigger_debounce": "0.1s", "watch_debounce": "0.2s"},
            memory={"llm": "off"}, api={"socket": str(self.tmp / "api.sock")},
        )
        user: dict = {"admin": True}
        if self.kind == "folder":
            common["source"] = {"kind": "files", "path": str(self.notes)}
            user["leanote_user_id"] = "local"
        else:
            common["source"] = {"kind": "leanote_api", "path": None,
                                "accounts": [{"email": EMAIL, "password_env": "LR_JOURNEY_PW"}]}
            common["leanote"] = {"base_url": self.leanote.url}
            common["capture"] = {"accounts": [{"email": EMAIL, "password_env": "LR_JOURNEY_PW"}],
                                 "sync_after": "0.2s", "retry_min": "0.3s", "retry_max": "1s"}
            user["leanote_user_id"] = LEANOTE_USER
        if self.tg is not None:
            common["telegram"] = {"enabled": True, "token_env": "LR_JOURNEY_TG", "base_url": self.tg.base_url,
                                  "edit_interval": 0.3}
            user["telegram_ids"] = [TG_ME]
        if self.dc is not None:
            common["discord"] = {"enabled": True, "token_env": "LR_JOURNEY_DC", "api_base": self.dc.api_base,
                                 "guild_ids": [GUILD], "channel_ids": [CHANNEL], "role_ids": [ROLE],
                                 "edit_interval": 0.3}
            user["discord_ids"] = [DC_ME]
        common["users"] = [user]
        for key, value in sections.items():
            common[key] = {**common[key], **value} if isinstance(common.get(key), dict) else value
        return make_settings(self.tmp, **common)

    def run(self, scenario, settings=None) -> None:
        """The daemon with this world's bot, until ``scenario(daemon)`` is done (each of its waits
        has its own deadline; the whole has ``SCENARIO``)."""
        settings = settings or self.settings()
        service = telegram_service if self.tg is not None else discord_service

        async def main():
            before = self.dc.session if self.dc is not None else None
            daemon = Daemon(settings, services=[service])
            task = asyncio.create_task(daemon.run())
            try:
                await within(daemon.wait_for_pass(0), "the daemon's first pass")
                if self.tg is not None:
                    await until(lambda: self.tg.method_calls("getUpdates"), 60, "the Telegram bot to poll")
                else:
                    await until(lambda: self.dc.ready and self.dc.session is not before and self.dc.commands_for(GUILD),
                                60, "the Discord bot to connect")
                await within(scenario(daemon), "the journey", SCENARIO)
            finally:
                daemon.stop()
                await asyncio.wait_for(task, timeout=30)

        asyncio.run(main())

    # --- what the person's notes hold ------------------------------------------------------------

    def written(self, words: str) -> list[str]:
        """The person's notes that hold ``words``, written after the start (the folder's new
        Markdown files, relative paths; the Leanote notes' ids)."""
        if self.kind == "folder":
            return sorted(str(p.relative_to(self.notes)) for p in self.notes.rglob("*.md")
                          if p.stat().st_mtime > self.started and words in p.read_text(encoding="utf-8"))
        return [n["NoteId"] for n in self.leanote.notes.values()
                if n["UserId"] == LEANOTE_USER and n["NoteId"] not in self.ids.values() and words in n["Content"]]


def folder_world(tmp: Path, ollama: FakeOllama, old: bool = True) -> World:
    """A copy of the newcomer's notes as a folder install; ``old``: the files last changed a
    month ago (written before the person set anything up), as notes copied with their times."""
    notes = tmp / "notes"
    shutil.copytree(NOTES, notes)
    if old:
        month_ago = time.time() - 30 * 86400
        for path in notes.rglob("*"):
            os.utime(path, (month_ago, month_ago))
    return World("folder", tmp, ollama, notes=notes)


def leanote_world(tmp: Path, ollama: FakeOllama, leanote: FakeLeanote, monkeypatch) -> World:
    monkeypatch.setenv("LR_JOURNEY_PW", PASSWORD)
    leanote.add_user(LEANOTE_USER, EMAIL, PASSWORD)
    ids = load_into_leanote(leanote, NOTES, datetime.now(timezone.utc) - timedelta(days=30))
    return World("leanote", tmp, ollama, leanote=leanote, ids=ids)


def with_telegram(world: World, tg: FakeTelegram, monkeypatch) -> World:
    monkeypatch.setenv("LR_JOURNEY_TG", "123:TEST")
    world.tg = tg
    return world


def with_discord(world: World, dc: FakeDiscord, monkeypatch) -> World:
    monkeypatch.setenv("LR_JOURNEY_DC", DC_TOKEN)
    monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(dc.gateway_url))
    world.dc = dc
    return world


def fake_discord() -> FakeDiscord:
    return FakeDiscord(token=DC_TOKEN, guilds={GUILD: {"channels": [CHANNEL], "roles": [ROLE]}})


def index_titles(daemon, user_id: str) -> set[str]:
    """The titles of the user's notes the daemon has indexed and shows (what a digest reads)."""
    memory = daemon.parts.memory_to_read if daemon.parts is not None else None
    return {n["title"] for n in memory.shown_notes(user_id)} if memory is not None else set()


# --- Telegram: what the person sends and sees ---------------------------------------------------------


def tg_mid(tg: FakeTelegram, message: dict) -> int:
    return next(i for i, m in tg.messages.items() if m is message)


async def tg_next(tg: FakeTelegram, before: int, containing: str = "", timeout: float = 60.0) -> dict:
    """The first message the bot sent the person after the first ``before``, holding ``containing``."""
    got = await until(lambda: [m for m in tg.sent_to(TG_ME)[before:] if containing in m["text"]], timeout,
                      f"a Telegram message with {containing!r}")
    return got[0]


async def tg_settled(message: dict, timeout: float = 60.0) -> str:
    """A reply's text once the bot is done editing it (no cursor, no "…" at its end)."""
    def done():
        text = message["text"]
        return not text.endswith(("▌", "…")) and not text.startswith(("📚", "⏳", "🎙 正在", "🔎 正在"))
    await until(done, timeout, "the reply to settle")
    return message["text"]


async def tg_ask(tg: FakeTelegram, question: str, timeout: float = 60.0) -> str:
    """Ask in the private chat; the finished reply's text."""
    before = len(tg.sent_to(TG_ME))
    tg.say(TG_ME, question)
    reply = await tg_next(tg, before, timeout=timeout)
    return await tg_settled(reply, timeout)


async def tg_search_until(tg: FakeTelegram, query: str, words: str, timeout: float = 30.0) -> str:
    """``/search query`` sent again until its reply holds ``words`` (a note being indexed)."""
    deadline = time.monotonic() + timeout
    while True:
        before = len(tg.sent_to(TG_ME))
        tg.say(TG_ME, f"/search {query}")
        text = (await tg_next(tg, before, timeout=timeout))["text"]
        if words.lower() in text.lower() or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.5)


# --- Discord --------------------------------------------------------------------------------------------


def dc_slash(dc: FakeDiscord, name: str, options: dict | None = None):
    return dc.slash(DC_ME, name, options, guild_id=GUILD, channel_id=CHANNEL, roles=[ROLE])


async def dc_done(it, timeout: float = 60.0) -> str:
    """What an interaction shows once it is answered and no longer "thinking" nor streaming."""
    await until(lambda: it.answered() and not it.thinking() and not dc_text(it).endswith(("▌", "…")), timeout,
                "the Discord reply")
    return dc_text(it)


async def dc_answer(it, timeout: float = 60.0) -> str:
    """What an /ask shows once its answer (an embed) is finished: not streaming any more."""
    await until(lambda: it.final_embeds() and not it.thinking() and not dc_text(it).endswith(("▌", "…")), timeout,
                "the finished answer")
    return dc_text(it)


def dc_text(it) -> str:
    """What an interaction shows now: each of its messages not deleted (contents and embeds)."""
    return "\n".join(m.text() for m in it.messages() if m.versions and not m.deleted)

