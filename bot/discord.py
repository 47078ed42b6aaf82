"""Discord front end (discord.py 2, application commands).

Slash commands ``/ask question [private]``, ``/search``, ``/reset``, ``/status``,
``/sync`` (admins), ``/why``; synced to the configured guilds at start-up (instant)
or globally. ``/ask`` defers at once (Discord's 3-second rule), streams into the
original response (edits at least ``discord.edit_interval`` apart), then shows the
answer as embed(s) within Discord's limits, sources as lines with ``<url>`` links;
longer answers continue in follow-ups.

A channel is a shared room: answers are private (ephemeral, only the asker sees
them) unless ``discord.public_answers`` is on or the asker passes ``private:false``.
Everything else (``/why``, ``/status``, ``/search``, errors, refusals) is always
ephemeral, each person's conversation is their own, and no message may mention
anyone. Access: guild, channel, user and role ids.

When the host can write to Leanote (``host.capture``): ``/note text [file]``,
``/append``, ``/remember``, ``/outbox``, and the message menu "Save to Leanote"
(Discord's forward: the message with its author, channel, time, link and files; the
same message saved again answers with the note it became).
Only people the rules above let in may write; every reply is private (the capture's
receipt: the note's link, queued, or why not). A file's size is checked against
``capture.max_file_mb`` before it is downloaded.

The memory of the notes: ``/about name`` (facts with their quotes, the notes that mention
it), ``/related target`` (a note id or a question), each fact or pair with 👍 confirm / 👎
reject buttons (``MemoryButton``, custom id ``mem:<verdict>:<id>``, so a press works after a
restart), and ``/reject id`` / ``/confirm id``. Always the person's own Leanote user;
every reply is ephemeral, like ``/search``.

Each final answer is recorded (``host.feedback``) and gets four buttons: 👍, 👎,
"Why?" and "Save as note". A button carries only the answer's id in its custom id
(``fb:up:<id>``) and is handled by a ``DynamicItem`` registered at start, so a press
works after a restart; only the person who asked may use them.

Long: one platform's front end, each slash command, menu and button on one client, as discord.py
keeps them; what both bots share is in ``bot.chat.common``.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Iterator

import discord
from discord import app_commands

from rag.answer.types import Candidate, Trace
from rag.capture import Attachment, Origin, Quote
from rag.config import secret
from rag.errors import ConfigError
from rag.answer.feedback import NotYours, UnknownAnswer
from rag.redact import redact_in_logs, safe_url

from bot.chat.access import Access, Person
from bot.chat.common import (CHECK_TIMEOUT, EMPTY, HELP, MEMORY_ITEMS, NO_CAPTURE, SORRY, VERDICT_BUTTONS, AnswerSaver, CheckResult, Host, MemoryReply,
                     Pacer, Wait, about_reply, conversation_key, count_error, cut_message, hits_text, memory_problem,
                     nobody_mapped, outbox_text, person_key, REMAPPED_WHY, related_reply, sources_first, token_or_problem, trace_text,
                     verdict_reply, with_notice)
from bot.render import (DISCORD_CONTENT, DISCORD_DESCRIPTION, NoteLinks, discord_escape, discord_pages,
                        discord_plain_links, discord_sources)

log = logging.getLogger(__name__)
COLOR = 0x2E7D32
SAVE_MENU = "Save to Leanote"
NOT_YOURS = "这是别人的回答。 / This is someone else's answer."
FORGOTTEN = "这个回答已经不记得了，请重新提问。 / This answer is no longer remembered: ask again."
# Discord has no "reply /save": a message is saved from its menu (Apps → Save to Leanote).
DISCORD_HELP = "\n".join(line for line in HELP.splitlines() if not line.startswith("/save")) + (
    f"\n右键一条消息 → Apps → {SAVE_MENU}：把它存成笔记 / right-click a message → Apps → {SAVE_MENU} to save it")


class DiscordBot:
    def __init__(self, host: Host):
        self.host = host
        # discord.py keeps the REST base (login, command sync, interaction callbacks and
        # follow-ups) in one class attribute; one client runs per process.
        discord.http.Route.BASE = self.cfg.api_base.rstrip("/")
        self.access = Access(host)
        # No message of ours may ping anyone: text from notes or the LLM can hold @everyone.
        self.client = discord.Client(intents=discord.Intents.default(), allowed_mentions=discord.AllowedMentions.none())
        self.tree = app_commands.CommandTree(self.client)
        self.client.leanote_bot = self  # the buttons under answers find their bot here
        self.pacers: list[Pacer] = []
        self.saver = AnswerSaver(host)  # "Save as note" under answers
        self._register()
        self.client.setup_hook = self._setup

    @property
    def cfg(self):
        """The bot's settings as they are now (a reload changes channels, roles, public answers)."""
        return self.host.settings.discord

    # --- commands -------------------------------------------------------------------------

    def _register(self) -> None:
        bot = self

        @self.tree.command(name="ask", description="向你的笔记提问 / ask your notes")
        @app_commands.describe(question="问题 / the question",
                               private="只有你能看到回答（默认是）/ only you see the answer (the default)")
        async def ask(interaction: discord.Interaction, question: str, private: bool | None = None) -> None:
            await bot.ask(interaction, question, private)

        @self.tree.command(name="search", description="搜索笔记 / search your notes")
        async def search_(interaction: discord.Interaction, query: str) -> None:
            await bot.search(interaction, query)

        @self.tree.command(name="reset", description="重新开始对话 / forget this conversation")
        async def reset(interaction: discord.Interaction) -> None:
            await bot.reset(interaction)

        @self.tree.command(name="status", description="同步状态 / sync status")
        async def status(interaction: discord.Interaction) -> None:
            await bot.status(interaction)

        @self.tree.command(name="sync", description="立即同步（管理员）/ sync now (admins)")
        async def sync(interaction: discord.Interaction) -> None:
            await bot.sync(interaction)

        @self.tree.command(name="why", description="上一个回答的依据 / why the last answer")
        async def why(interaction: discord.Interaction) -> None:
            await bot.why(interaction)

        @self.tree.command(name="about", description="记忆里关于它的事实和笔记 / what the memory knows about a name")
        @app_commands.describe(name="一个项目、术语或标签 / a project, a term or a tag, as your notes write it")
        async def about(interaction: discord.Interaction, name: str) -> None:
            await bot.memory(interaction, "about", name)

        @self.tree.command(name="related", description="相关笔记 / notes related to a note or a question")
        @app_commands.describe(target="笔记 id 或问题 / a note id, or a question")
        async def related(interaction: discord.Interaction, target: str) -> None:
            await bot.memory(interaction, "related", target)

        @self.tree.command(name="reject", description="删掉一条错的事实或相关 / reject a wrong fact or pair")
        @app_commands.describe(id="/about 或 /related 显示的 id / the f… or p… id /about and /related show")
        async def reject(interaction: discord.Interaction, id: str) -> None:
            await bot.verdict(interaction, "rejected", id)

        @self.tree.command(name="confirm", description="确认一条事实或相关 / confirm a fact or pair")
        @app_commands.describe(id="/about 或 /related 显示的 id / the f… or p… id /about and /related show")
        async def confirm(interaction: discord.Interaction, id: str) -> None:
            await bot.verdict(interaction, "confirmed", id)

        @self.tree.command(name="help", description="帮助 / help")
        async def help_(interaction: discord.Interaction) -> None:
            await interaction.response.send_message(DISCORD_HELP, ephemeral=True)

        if self.capturer is None:  # this host cannot write to Leanote: no capture commands
            return

        @self.tree.command(name="note", description="记一条笔记（收件箱）/ capture a note into your inbox")
        @app_commands.describe(text="内容，#标签 会成为标签 / the text; #hashtags become tags",
                               file="附件（可选）/ a file to attach (optional)")
        async def note(interaction: discord.Interaction, text: str, file: discord.Attachment | None = None) -> None:
            await bot.note(interaction, text, file)

        @self.tree.command(name="append", description="追加到上一条记录 / add to your last capture")
        @app_commands.describe(text="要追加的内容 / the text to add")
        async def append(interaction: discord.Interaction, text: str) -> None:
            await bot.append(interaction, text)

        @self.tree.command(name="remember", description="记住一件事 / a dated line in your memory note")
        @app_commands.describe(text="要记住的事 / what to remember")
        async def remember(interaction: discord.Interaction, text: str) -> None:
            await bot.remember(interaction, text)

        @self.tree.command(name="outbox", description="还没写进 Leanote 的记录 / captures waiting for Leanote")
        async def outbox(interaction: discord.Interaction) -> None:
            await bot.outbox(interaction)

        async def save_message(interaction: discord.Interaction, message: discord.Message) -> None:
            await bot.save_message(interaction, message)

        self.tree.add_command(app_commands.ContextMenu(name=SAVE_MENU, callback=save_message,
                                                       type=discord.AppCommandType.message))

        @self.tree.error
        async def on_error(interaction: discord.Interaction, error: app_commands.AppCommandError) -> None:
            await bot.failed(interaction, getattr(error, "original", error))

    async def failed(self, interaction: discord.Interaction, error: BaseException) -> None:
        """Where every unexpected error of a command or a button ends (the tree's error handler,
        the buttons' callbacks): logged once with its traceback, counted, and the person told in
        one private line that names no detail."""
        command = getattr(interaction, "command", None)
        what = f"/{command.name}" if command else (getattr(interaction, "data", None) or {}).get("custom_id", "?")
        log.error("discord: %s failed", what, exc_info=error)
        count_error(self.host, "discord")
        with suppress(discord.HTTPException):
            if interaction.response.is_done():
                await interaction.followup.send(SORRY, ephemeral=True)
            else:
                await interaction.response.send_message(SORRY, ephemeral=True)

    @property
    def capturer(self):
        """What writes into Leanote (``host.capture``), or None when this host cannot."""
        return getattr(self.host, "capture", None)

    @property
    def feedback(self):
        """Where answers are recorded for their buttons (``host.feedback``), or None."""
        return getattr(self.host, "feedback", None)

    async def _setup(self) -> None:
        # Presses on buttons under answers sent before this start are handled too.
        self.client.add_dynamic_items(FeedbackButton, MemoryButton)
        if self.cfg.guild_ids:
            for gid in self.cfg.guild_ids:
                guild = discord.Object(id=gid)
                self.tree.copy_global_to(guild=guild)
                await self.tree.sync(guild=guild)
        else:
            await self.tree.sync()

    async def run(self, token: str) -> None:
        """Connect until the host stops; a connection failure propagates to the host's
        supervisor, which retries with backoff."""
        runner = asyncio.create_task(self.client.start(token))
        stop = asyncio.create_task(self.host.stopping.wait())
        try:
            done, _ = await asyncio.wait({runner, stop}, return_when=asyncio.FIRST_COMPLETED)
            if runner in done:
                runner.result()  # raises what made it stop
        finally:
            stop.cancel()
            await self.client.close()
            if not runner.done():
                runner.cancel()

    # --- access -----------------------------------------------------------------------------

    def _denied(self, interaction: discord.Interaction) -> str | None:
        """Why this interaction may not be answered, or None. Instant: no I/O."""
        if interaction.guild_id is None:
            if not self.cfg.allow_dms:
                return "这里不接受私信提问。 / Questions in direct messages are off."
        else:
            if self.cfg.guild_ids and interaction.guild_id not in self.cfg.guild_ids:
                return "这个服务器没有开通。 / Not enabled on this server."
            if self.cfg.channel_ids and interaction.channel_id not in self.cfg.channel_ids:
                return "请到指定的频道提问。 / Please ask in the bot's channel."
            if self.cfg.role_ids:
                roles = {r.id for r in getattr(interaction.user, "roles", [])}
                if not roles.intersection(self.cfg.role_ids):
                    return ("在这个服务器上，你需要有指定的角色才能使用这个机器人。 / On this server you need one of "
                            "the roles allowed to use this bot.")
        return None

    async def _person(self, interaction: discord.Interaction) -> Person | None:
        """The asking person, or None after an ephemeral refusal (before any work)."""
        why = self._denied(interaction)
        person = None if why else self.access.person("discord", interaction.user.id)
        if why is None and person is None:
            why = self.access.stranger("discord", interaction.user.id)
            if why is None:  # refused a short while ago; an interaction still needs an answer
                why = "你没有权限。 / Not allowed."
        if why is None and isinstance(person, str):
            why = person
        if why is not None:
            await interaction.response.send_message(why, ephemeral=True)
            return None
        return person

    @staticmethod
    def conversation(interaction: discord.Interaction) -> str:
        return conversation_key("discord", interaction.channel_id or "dm", interaction.user.id)

    # --- handlers ---------------------------------------------------------------------------

    async def ask(self, interaction: discord.Interaction, question: str, private: bool | None = None) -> None:
        person = await self._person(interaction)
        if person is None:
            return
        if not (question or "").strip():
            await interaction.response.send_message(EMPTY, ephemeral=True)
            return
        if not await self._may_search(interaction):
            return
        question, notice = cut_message(self.host.settings, question)
        if private is None:
            private = not self.cfg.public_answers
        await interaction.response.defer(thinking=True, ephemeral=private)

        reading = {"links": NoteLinks()}  # the links of the passages read, once they are known

        def sources(found) -> None:
            reading["links"] = NoteLinks(found)
            pacer.show_first(sources_first(found))

        async def edit(text: str) -> None:
            try:
                await interaction.edit_original_response(
                    content=discord_plain_links(text, reading["links"])[-DISCORD_CONTENT:])
            except discord.HTTPException as err:
                if err.status == 429:
                    raise Wait(float(getattr(err, "retry_after", 1.0) or 1.0)) from None
                raise

        pacer = Pacer(edit, self.cfg.edit_interval)
        self.pacers.append(pacer)
        pacer.start()
        try:
            answer = await self.host.answers.ask(question, person.leanote_user_id,
                                                 conversation=self.conversation(interaction), on_token=pacer.feed,
                on_sources=sources, caller=person_key("discord", interaction.user.id))
        except Exception:
            log.exception("answering a Discord question failed")
            count_error(self.host, "discord")
            answer = None
        finally:  # whatever happened, the streaming edits end here
            await pacer.stop()
        if answer is None:
            await self._error(interaction)
            return
        answer_id = await asyncio.to_thread(self._record, interaction, person, answer)  # a write to the feedback store
        await self._deliver(interaction, answer, private, answer_id, notice)

    async def _may_search(self, interaction: discord.Interaction) -> bool:
        """Counts a question or a search against the person's ``bots.rate_limit``; when it
        is over, says so (privately) and returns False."""
        wait = self.access.rate("discord", interaction.user.id)
        if wait:
            await interaction.response.send_message(self.access.slow_down(wait), ephemeral=True)
            return False
        return True

    def _record(self, interaction: discord.Interaction, person: Person, answer) -> str | None:
        """The answer, remembered for the buttons under it; None without a feedback store
        (or when it failed: the answer goes out without buttons)."""
        if self.feedback is None:
            return None
        try:
            return self.feedback.record(person_key("discord", interaction.user.id), person.leanote_user_id, answer,
                                        self.conversation(interaction))
        except Exception:
            log.exception("recording a Discord answer for its buttons failed")
            return None

    async def _error(self, interaction: discord.Interaction) -> None:
        """Errors are for the asker only: the "thinking…" goes, an ephemeral note comes."""
        try:
            await interaction.delete_original_response()
        except discord.HTTPException:
            pass
        await interaction.followup.send(SORRY, ephemeral=True)

    async def _deliver(self, interaction: discord.Interaction, answer, private: bool,
                       answer_id: str | None = None, notice: str | None = None) -> None:
        if answer.citations:
            sources = discord_sources(answer.citations, "来源 Sources")
        else:
            sources = discord_sources(answer.closest, "最接近的笔记 Closest notes")
        body = discord_plain_links(answer.shown, NoteLinks(answer.citations)) + "".join(f"\n\n*{n}*" for n in (answer.notice, notice) if n)
        embeds = embeds_for(body, sources)
        first, rest = embeds[0], embeds[1:]
        # the buttons go under the last part of the answer
        buttons = {"view": feedback_view(answer_id)} if answer_id else {}
        await interaction.edit_original_response(content=None, embed=first, **({} if rest else buttons))
        for i, embed in enumerate(rest):
            await interaction.followup.send(embed=embed, ephemeral=private,
                                            **(buttons if i == len(rest) - 1 else {}))

    async def search(self, interaction: discord.Interaction, query: str) -> None:
        person = await self._person(interaction)
        if person is None:
            return
        if not (query or "").strip():
            await interaction.response.send_message("请写下关键词。 / Please write what to search for.", ephemeral=True)
            return
        if not await self._may_search(interaction):
            return
        query, notice = cut_message(self.host.settings, query)
        await interaction.response.defer(thinking=True, ephemeral=True)
        hits = await self.host.answers.search(query, person.leanote_user_id, 8)
        text = with_notice(hits_text(hits), notice)
        await interaction.followup.send(text[:DISCORD_CONTENT], ephemeral=True)

    async def reset(self, interaction: discord.Interaction) -> None:
        person = await self._person(interaction)
        if person is None:
            return
        self.host.answers.conversations.reset(person.leanote_user_id, self.conversation(interaction))
        await interaction.response.send_message("好的，重新开始。 / Fresh start.", ephemeral=True)

    async def status(self, interaction: discord.Interaction) -> None:
        person = await self._person(interaction)
        if person is None:
            return
        text = await asyncio.to_thread(self.host.status_text, None if person.admin else person.leanote_user_id)
        await interaction.response.send_message(text[:DISCORD_CONTENT], ephemeral=True)

    async def sync(self, interaction: discord.Interaction) -> None:
        person = await self._person(interaction)
        if person is None:
            return
        if not person.admin:
            await interaction.response.send_message("只有管理员可以 /sync。 / Only admins may /sync.", ephemeral=True)
            return
        await interaction.response.send_message("开始同步… / Syncing…", ephemeral=True)
        done = await self.host.sync_for_chat()  # what the pass did, when it is done
        try:
            await interaction.edit_original_response(content=done[:DISCORD_CONTENT])
        except discord.HTTPException as err:  # (an interaction's token lasts 15 minutes)
            log.info("could not say what /sync did: %s", err)

    async def why(self, interaction: discord.Interaction) -> None:
        person = await self._person(interaction)
        if person is None:
            return
        trace = self.host.answers.conversations.trace(person.leanote_user_id, self.conversation(interaction))
        await interaction.response.send_message(trace_text(trace)[:DISCORD_CONTENT], ephemeral=True)

    # --- the memory of the notes ------------------------------------------------------------------
    # Ephemeral, like /search: only the asker sees it (and so only they can press its buttons).

    async def memory(self, interaction: discord.Interaction, what: str, target: str) -> None:
        """``/about`` or ``/related`` for the asker's Leanote user, with 👍 / 👎 buttons."""
        person = await self._person(interaction)
        if person is None:
            return
        problem = memory_problem(self.host)
        if problem or not (target or "").strip():
            await interaction.response.send_message(problem or "请写下名称或问题。 / Please write a name or a question.",
                                                    ephemeral=True)
            return
        if not await self._may_search(interaction):
            return
        target, notice = cut_message(self.host.settings, target)
        await interaction.response.defer(thinking=True, ephemeral=True)
        link = (lambda url: f"<{url}>" if url else "")
        if what == "about":
            reply = await about_reply(self.host, person.leanote_user_id, target, link, discord_escape)
        else:
            reply = await related_reply(self.host, person.leanote_user_id, target, link, discord_escape)
        parts = _lines_within(with_notice(reply.text, notice), DISCORD_CONTENT)
        for i, part in enumerate(parts):
            view = {"view": memory_view(reply)} if reply.items and i == len(parts) - 1 else {}
            await interaction.followup.send(part, ephemeral=True, **view)

    async def verdict(self, interaction: discord.Interaction, verdict: str, item_id: str) -> None:
        """``/reject`` or ``/confirm``, and the 👍 / 👎 under /about and /related: the presser's
        own memory; an id of another Leanote user's memory changes nothing."""
        person = await self._person(interaction)
        if person is None:
            return
        _, text = await verdict_reply(self.host, person.leanote_user_id, item_id, verdict,
                                      person_key("discord", interaction.user.id))
        await interaction.response.send_message(text[:DISCORD_CONTENT], ephemeral=True)

    # --- capture: writing into the person's Leanote --------------------------------------------
    # Every reply here is ephemeral: what a person writes into their notes is theirs.

    async def note(self, interaction: discord.Interaction, text: str,
                   file: discord.Attachment | None = None) -> None:
        files = [file] if file is not None else []
        await self._capture(interaction, "note", text, files)

    async def append(self, interaction: discord.Interaction, text: str) -> None:
        await self._capture(interaction, "append", text)

    async def remember(self, interaction: discord.Interaction, text: str) -> None:
        await self._capture(interaction, "remember", text)

    async def save_message(self, interaction: discord.Interaction, message: discord.Message) -> None:
        """The message menu's "Save to Leanote": the message, where it came from, its files."""
        text = message.content or "\n\n".join(e.description for e in message.embeds if e.description)
        if not text.strip() and not message.attachments:
            if await self._person(interaction) is not None:
                await interaction.response.send_message(
                    "这条消息没有可保存的文字或文件。 / That message has no text or files to save.", ephemeral=True)
            return
        # the menu pressed twice on one message (a double click, a second look) saves it once
        once = f"discord:{message.channel.id}:{message.id}"
        if message.author.id == interaction.user.id:  # their own message: their words, as they wrote them
            await self._capture(interaction, "note", text, list(message.attachments),
                                origin=origin_of(message, interaction), once=once)
        else:  # someone else's: shown in the note as they wrote it, not as Markdown of ours
            await self._capture(interaction, "note", "", list(message.attachments),
                                origin=origin_of(message, interaction), quote=Quote(text), once=once)

    async def outbox(self, interaction: discord.Interaction) -> None:
        person = await self._person(interaction)
        if person is None:
            return
        if self.capturer is None:
            await interaction.response.send_message(NO_CAPTURE, ephemeral=True)
            return
        text = outbox_text(await asyncio.to_thread(self.capturer.pending, person_key("discord", interaction.user.id)))
        await interaction.response.send_message(text[:DISCORD_CONTENT], ephemeral=True)

    async def _capture(self, interaction: discord.Interaction, kind: str, text: str,
                       files: list[discord.Attachment] = (), origin: Origin | None = None,
                       quote: Quote | None = None, once: str = "") -> None:
        """``once``: what the capture comes from (a message saved from the menu); by default
        the interaction itself (Discord sends each one once)."""
        once = once or f"discord:interaction:{interaction.id}"
        person = await self._person(interaction)
        if person is None:
            return
        capture = self.capturer
        if capture is None:
            await interaction.response.send_message(NO_CAPTURE, ephemeral=True)
            return
        me = person_key("discord", interaction.user.id)
        why = self._before_download(capture, me, files)
        if why:  # nothing downloaded, nothing written
            await interaction.response.send_message(why[:DISCORD_CONTENT], ephemeral=True)
            return
        # Writing may take a few seconds (Leanote's answer, or the wait before "queued").
        await interaction.response.defer(thinking=True, ephemeral=True)
        attachments = []
        for f in files:
            try:
                data = await f.read()
            except (discord.HTTPException, OSError) as err:
                log.warning("downloading Discord attachment %s failed: %s", f.filename, err)
                await interaction.followup.send(
                    f"没能下载文件 {f.filename}，什么也没记。 / Could not download {f.filename}; nothing was saved.",
                    ephemeral=True)
                return
            attachments.append(Attachment(f.filename, data, f.content_type or "application/octet-stream"))
        if kind == "note":
            receipt = await capture.note(me, person.leanote_user_id, text or "", origin=origin, files=attachments,
                                         quote=quote, once=once)
        elif kind == "append":
            receipt = await capture.append(me, person.leanote_user_id, text or "", once=once)
        else:
            receipt = await capture.remember(me, person.leanote_user_id, text or "", once=once)
        await interaction.followup.send(receipt.message[:DISCORD_CONTENT], ephemeral=True)

    def _before_download(self, capture, me: str, files: list[discord.Attachment]) -> str | None:
        """Refusals that need no download: capture turned off or without an account, a file
        larger than ``capture.max_file_mb`` (Discord says each file's size up front)."""
        cfg = self.host.settings.capture
        why = capture.available()
        if why:
            return why
        limit = cfg.max_file_mb * 1024 * 1024
        for f in files:
            if f.size > limit:
                return (f"文件 {f.filename} 太大：最多 {cfg.max_file_mb:g} MB，什么也没记。 / {f.filename} is too "
                        f"large: at most {cfg.max_file_mb:g} MB. Nothing was saved.")
        return None

    # --- the buttons under answers -----------------------------------------------------------------

    async def press(self, interaction: discord.Interaction, action: str, answer_id: str) -> None:
        """👍 / 👎 / Why? / Save as note under an answer: only for the person who asked it."""
        store = self.feedback
        if store is None:
            await interaction.response.send_message(FORGOTTEN, ephemeral=True)
            return
        me = person_key("discord", interaction.user.id)
        record = await asyncio.to_thread(store.get, answer_id)
        if record is None:
            await interaction.response.send_message(FORGOTTEN, ephemeral=True)
            return
        if record.person != me:  # checked before anything else: nothing changes, nothing is shown
            await interaction.response.send_message(NOT_YOURS, ephemeral=True)
            return
        person = await self._person(interaction)  # the asker must still be let in here
        if person is None:
            return
        try:
            if action in ("up", "down"):
                await asyncio.to_thread(store.verdict, answer_id, me, action)
                text = ("谢谢！很高兴有帮助。 / Thanks, glad it helped." if action == "up" else
                        "谢谢反馈，会用它来改进。 / Thanks: this helps improve the answers.")
            elif action == "why" and person.leanote_user_id != record.user_id:  # another Leanote user's notes now
                text = REMAPPED_WHY
            elif action == "why":
                trace = stored_trace(record.trace) if record.trace else None
                text = trace_text(trace) if trace else "这个回答没有记录依据。 / No trace was kept for this answer."
            else:
                await self._save_answer(interaction, person, record)
                return
        except NotYours:
            text = NOT_YOURS
        except UnknownAnswer:
            text = FORGOTTEN
        await interaction.response.send_message(text[:DISCORD_CONTENT], ephemeral=True)

    async def _save_answer(self, interaction: discord.Interaction, person: Person, record) -> None:
        me = person_key("discord", interaction.user.id)
        why_not = await self.saver.not_now(me, person, record)
        if why_not is not None:
            await interaction.response.send_message(why_not.text, ephemeral=True)
            return
        await interaction.response.defer(thinking=True, ephemeral=True)
        receipt = await self.saver.save(me, record)  # (an error: the error handler tells the person)
        await interaction.followup.send(receipt.message[:DISCORD_CONTENT], ephemeral=True)


class FeedbackButton(discord.ui.DynamicItem[discord.ui.Button],
                     template=r"fb:(?P<action>up|down|why|save):(?P<id>[A-Za-z0-9_-]{1,64})"):
    """One of the four buttons under an answer; its custom id holds only the answer's id,
    so a press is understood whenever it comes (after a restart too)."""

    LOOKS = {"up": ("👍", None), "down": ("👎", None), "why": (None, "Why? 依据"), "save": (None, "Save as note 存为笔记")}

    def __init__(self, action: str, answer_id: str):
        emoji, label = self.LOOKS[action]
        style = discord.ButtonStyle.primary if action == "save" else discord.ButtonStyle.secondary
        super().__init__(discord.ui.Button(style=style, emoji=emoji, label=label, custom_id=f"fb:{action}:{answer_id}"))
        self.action, self.answer_id = action, answer_id

    @classmethod
    async def from_custom_id(cls, interaction: discord.Interaction, item: discord.ui.Button, match, /):
        return cls(match["action"], match["id"])

    async def callback(self, interaction: discord.Interaction) -> None:
        bot = getattr(interaction.client, "leanote_bot", None)
        if bot is not None:
            try:
                await bot.press(interaction, self.action, self.answer_id)
            except Exception as err:
                await bot.failed(interaction, err)


def feedback_view(answer_id: str) -> discord.ui.View:
    view = discord.ui.View(timeout=None)
    for action in ("up", "down", "why", "save"):
        view.add_item(FeedbackButton(action, answer_id))
    return view


class MemoryButton(discord.ui.DynamicItem[discord.ui.Button],
                   template=r"mem:(?P<verdict>rejected|confirmed):(?P<id>[fp][0-9a-f]{12})"):
    """👍 confirm / 👎 reject under /about or /related: its custom id holds the verdict and the
    fact's or pair's correction id, so a press is understood after a restart too."""

    def __init__(self, verdict: str, item_id: str, n: int | None = None):
        icon, word = next((i, w) for v, i, w in VERDICT_BUTTONS if v == verdict)
        label = f"{n} {word}" if n is not None else word
        style = discord.ButtonStyle.danger if verdict == "rejected" else discord.ButtonStyle.secondary
        super().__init__(discord.ui.Button(style=style, emoji=icon, label=label,
                                           custom_id=f"mem:{verdict}:{item_id}"))
        self.verdict, self.item_id = verdict, item_id

    @classmethod
    async def from_custom_id(cls, interaction: discord.Interaction, item: discord.ui.Button, match, /):
        return cls(match["verdict"], match["id"])

    async def callback(self, interaction: discord.Interaction) -> None:
        bot = getattr(interaction.client, "leanote_bot", None)
        if bot is not None:
            try:
                await bot.verdict(interaction, self.verdict, self.item_id)
            except Exception as err:
                await bot.failed(interaction, err)


def memory_view(reply: MemoryReply) -> discord.ui.View:
    """Two items a row (👍 n confirm, 👎 n reject), at most Discord's five rows."""
    view = discord.ui.View(timeout=None)
    for k, (n, item_id) in enumerate(reply.items[:MEMORY_ITEMS]):
        for verdict, _, _ in VERDICT_BUTTONS:
            button = MemoryButton(verdict, item_id, n)
            button.row = k // 2
            view.add_item(button)
    return view


def _lines_within(text: str, limit: int) -> list[str]:
    """Text cut between lines into parts of at most ``limit`` characters."""
    parts, current = [], ""
    for line in text.splitlines():
        line = line[:limit]
        if current and len(current) + 1 + len(line) > limit:
            parts.append(current)
            current = line
        else:
            current = f"{current}\n{line}" if current else line
    return parts + [current] if current or not parts else parts


def stored_trace(data: dict) -> Trace | None:
    """A trace as the feedback store keeps it (``asdict``), for ``trace_text``."""
    try:
        return Trace(**{**data, "candidates": [Candidate(**c) for c in data.get("candidates") or []]})
    except TypeError:  # a trace stored by another version
        log.warning("a stored trace does not fit this version's Trace")
        return None


def origin_of(message: discord.Message, interaction: discord.Interaction) -> Origin:
    """Where a saved message came from: its author, channel and server, time, and link."""
    channel = getattr(message.channel, "name", None) or getattr(interaction.channel, "name", None)
    guild = message.guild or interaction.guild
    if guild is not None:
        chat = f"#{channel} / {guild.name}" if channel else guild.name
    else:
        chat = "私信 DM"
    return Origin(who=message.author.display_name, chat=chat, when=message.created_at.astimezone(),
                  link=message.jump_url)


def embeds_for(body: str, sources: str) -> list[discord.Embed]:
    """The answer as embeds: each description ≤ 4,096 characters and each message's
    embeds ≤ 6,000 in total; the sources go into the last one (or one of their own)."""
    pages = discord_pages(body, DISCORD_DESCRIPTION - 96)
    if sources and len(pages[-1]) + 2 + len(sources) <= DISCORD_DESCRIPTION - 96:
        pages[-1] = f"{pages[-1]}\n\n{sources}"
    elif sources:
        pages.append(sources[: DISCORD_DESCRIPTION - 96])
    embeds = []
    for i, page in enumerate(pages):
        embed = discord.Embed(description=page, color=COLOR)
        if len(pages) > 1:
            embed.set_footer(text=f"{i + 1}/{len(pages)}")
        embeds.append(embed)
    return embeds


async def service(host: Host) -> None:
    """``leanote-rag serve`` runs this when ``discord.enabled``."""
    if not host.settings.discord.enabled:
        return
    token_env = host.settings.discord.token_env
    token = secret(token_env, "discord.token_env")
    redact_in_logs(token)
    try:
        await DiscordBot(host).run(token)
    except discord.LoginFailure:
        raise ConfigError(f"Discord refused the token in {token_env}: copy the bot's token from the Discord "
                          f"developer portal there, then restart") from None


service.label = "Discord bot"


def check(settings) -> Iterator[CheckResult]:
    """``doctor``: the token is set and Discord accepts it (a login, no gateway); someone may ask."""
    cfg = settings.discord
    if not cfg.enabled:
        return
    name = "discord bot"
    token, problem = token_or_problem(cfg.token_env, "discord.token_env", name)
    if problem:
        yield problem
        return
    discord.http.Route.BASE = cfg.api_base.rstrip("/")

    async def login():
        client = discord.Client(intents=discord.Intents.none())
        try:
            await client.login(token)
            return client.user
        finally:
            await client.close()

    try:
        me = asyncio.run(asyncio.wait_for(login(), CHECK_TIMEOUT))
    except discord.LoginFailure:
        yield name, False, f"Discord refused the token in {cfg.token_env}", \
            f"copy the bot's token from the Discord developer portal into {cfg.token_env}"
        return
    except (discord.HTTPException, OSError, asyncio.TimeoutError) as err:
        yield name, False, f"cannot reach Discord at {safe_url(cfg.api_base)}: {type(err).__name__}", \
            "check the network, or discord.api_base"
        return
    where = f"guilds {', '.join(map(str, cfg.guild_ids))}" if cfg.guild_ids else "every guild it is in"
    answers = "public" if cfg.public_answers else "private (only the asker sees them)"
    yield name, True, f"logged in as {me}; commands in {where}; answers {answers}", ""
    yield from nobody_mapped(settings, "discord")
