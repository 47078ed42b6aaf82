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
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterator

import discord
from discord import app_commands

from rag.config import secret
from rag.errors import ConfigError
from rag.redact import redact_in_logs, safe_url

from .access import Access, Person
from .common import (CHECK_TIMEOUT, HELP, SORRY, CheckResult, Host, Pacer, Wait, conversation_key, count_error,
                     hits_text, nobody_mapped, token_or_problem, trace_text)
from .render import DISCORD_CONTENT, DISCORD_DESCRIPTION, discord_pages, discord_plain_links, discord_sources

log = logging.getLogger(__name__)
COLOR = 0x2E7D32


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
        self.pacers: list[Pacer] = []
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

        @self.tree.command(name="help", description="帮助 / help")
        async def help_(interaction: discord.Interaction) -> None:
            await interaction.response.send_message(HELP, ephemeral=True)

    async def _setup(self) -> None:
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
            await interaction.response.send_message("请写下问题。 / Please write a question.", ephemeral=True)
            return
        wait = self.access.rate("discord", interaction.user.id)
        if wait:
            await interaction.response.send_message(self.access.slow_down(wait), ephemeral=True)
            return
        if private is None:
            private = not self.cfg.public_answers
        await interaction.response.defer(thinking=True, ephemeral=private)

        async def edit(text: str) -> None:
            try:
                await interaction.edit_original_response(content=discord_plain_links(text)[-DISCORD_CONTENT:])
            except discord.HTTPException as err:
                if err.status == 429:
                    raise Wait(float(getattr(err, "retry_after", 1.0) or 1.0)) from None
                raise

        pacer = Pacer(edit, self.cfg.edit_interval)
        self.pacers.append(pacer)
        pacer.start()
        try:
            answer = await self.host.answers.ask(question, person.leanote_user_id,
                                                 conversation=self.conversation(interaction), on_token=pacer.feed)
        except Exception:
            log.exception("answering a Discord question failed")
            count_error(self.host, "discord")
            answer = None
        finally:  # whatever happened, the streaming edits end here
            await pacer.stop()
        if answer is None:
            await self._error(interaction)
            return
        await self._deliver(interaction, answer, private)

    async def _error(self, interaction: discord.Interaction) -> None:
        """Errors are for the asker only: the "thinking…" goes, an ephemeral note comes."""
        try:
            await interaction.delete_original_response()
        except discord.HTTPException:
            pass
        await interaction.followup.send(SORRY, ephemeral=True)

    async def _deliver(self, interaction: discord.Interaction, answer, private: bool) -> None:
        if answer.citations:
            sources = discord_sources(answer.citations, "来源 Sources")
        else:
            sources = discord_sources(answer.closest, "最接近的笔记 Closest notes")
        body = discord_plain_links(answer.answer) + (f"\n\n*{answer.notice}*" if answer.notice else "")
        embeds = embeds_for(body, sources)
        first, rest = embeds[0], embeds[1:]
        await interaction.edit_original_response(content=None, embed=first)
        for embed in rest:
            await interaction.followup.send(embed=embed, ephemeral=private)

    async def search(self, interaction: discord.Interaction, query: str) -> None:
        person = await self._person(interaction)
        if person is None:
            return
        await interaction.response.defer(thinking=True, ephemeral=True)
        try:
            hits = await self.host.answers.search(query, person.leanote_user_id, 8)
            text = hits_text(hits)
        except Exception:
            log.exception("discord /search failed")
            count_error(self.host, "discord")
            text = SORRY
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
        text = self.host.status_text(None if person.admin else person.leanote_user_id)
        await interaction.response.send_message(text[:DISCORD_CONTENT], ephemeral=True)

    async def sync(self, interaction: discord.Interaction) -> None:
        person = await self._person(interaction)
        if person is None:
            return
        if not person.admin:
            await interaction.response.send_message("只有管理员可以 /sync。 / Only admins may /sync.", ephemeral=True)
            return
        started = self.host.trigger()
        await interaction.response.send_message(
            "开始同步。 / Syncing now." if started else "刚刚同步过，稍等再试。 / A sync just ran; try again shortly.",
            ephemeral=True,
        )

    async def why(self, interaction: discord.Interaction) -> None:
        person = await self._person(interaction)
        if person is None:
            return
        trace = self.host.answers.conversations.trace(person.leanote_user_id, self.conversation(interaction))
        await interaction.response.send_message(trace_text(trace)[:DISCORD_CONTENT], ephemeral=True)


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
