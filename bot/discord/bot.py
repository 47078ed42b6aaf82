"""The Discord bot itself: its client and command tree, who may use it where, and its life.

``service.build`` puts the slash commands, the menu and the buttons on it; each calls a handler
of ``answering``, ``commands``, ``capturing`` or ``buttons`` with this bot first. Every reply but a public answer is ephemeral,
and no message may mention anyone (text from notes or the LLM can hold ``@everyone``).

Every text the bot sends but an answer (``answering`` renders those with ``bot.render``) goes out
through one path, ``say``, ``edit`` or ``dm``: rendered by the door's rule (``bot.plain``: no
Markdown of the text's own, so no masked link; every link-like token inert but the addresses of
this install's notes), in parts within Discord's 2,000 characters with the buttons under the last.
Discord's rate limits are waited out by discord.py (it retries a 429 after ``retry_after``).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

import discord
from discord import app_commands

from bot.chat.texts import SORRY
from bot.chat.web import web_link
from bot.plain import discord_text, messages, own_links
from bot.render import DISCORD_CONTENT
from bot.session import Button, Reply, Session
from bot.chat.words import REFUSALS

log = logging.getLogger(__name__)


class _NoVoiceChannels(logging.Filter):
    """discord.py warns at every client it makes that PyNaCl and davey are not installed, "voice
    will NOT be supported": voice *channels*, which this bot never joins (its voice clips are
    files, heard by ``rag.media``). Said in the log of a bot that hears voice, it misleads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.WARNING and "voice will NOT be supported" in record.getMessage())


def quiet_voice_warnings() -> None:
    """Drop discord.py's warnings about voice channels (once, however many clients are made)."""
    logger = logging.getLogger("discord.client")
    if not any(isinstance(f, _NoVoiceChannels) for f in logger.filters):
        logger.addFilter(_NoVoiceChannels())


class DiscordBot:
    """One client for the daemon ``host`` (``settings``, ``parts``, ``stopping``, ``metrics``)."""

    def __init__(self, host):
        self.host = host
        # discord.py keeps the REST base (login, command sync, interaction callbacks and
        # follow-ups) in one class attribute; one client runs per process.
        discord.http.Route.BASE = self.cfg.api_base.rstrip("/")
        quiet_voice_warnings()
        # No message of ours may ping anyone: text from notes or the LLM can hold @everyone.
        self.client = discord.Client(intents=discord.Intents.default(), allowed_mentions=discord.AllowedMentions.none())
        self.tree = app_commands.CommandTree(self.client)
        self.client.leanote_bot = self  # the buttons under answers find their bot here
        self.pacers: list = []
        self.dynamic: tuple = ()  # the buttons' class (``buttons.Pressed``): a press is understood after a restart too
        self.client.setup_hook = self._setup
        self.after_login: list = []  # coroutine functions run once logged in (before the gateway connects)

    @property
    def cfg(self):
        """The bot's settings as they are now (a reload changes channels, roles, public answers)."""
        return self.host.settings.discord

    @property
    def parts(self):
        return self.host.parts

    def count_error(self) -> None:
        metrics = getattr(self.host, "metrics", None)
        if metrics is not None:
            metrics.bot_error("discord")

    async def failed(self, interaction: discord.Interaction, error: BaseException) -> None:
        """Where every unexpected error of a command or a button ends (the tree's error handler,
        the buttons' callbacks): logged once with its traceback, counted, and the person told in
        one private line that names no detail."""
        command = getattr(interaction, "command", None)
        what = f"/{command.name}" if command else (getattr(interaction, "data", None) or {}).get("custom_id", "?")
        log.error("discord: %s failed", what, exc_info=error)
        self.count_error()
        with suppress(discord.HTTPException):
            await self.say(interaction, SORRY)

    async def _setup(self) -> None:
        # Presses on buttons under answers sent before this start are handled too.
        self.client.add_dynamic_items(*self.dynamic)
        if self.cfg.guild_ids:
            for gid in self.cfg.guild_ids:
                guild = discord.Object(id=gid)
                self.tree.copy_global_to(guild=guild)
                await self.tree.sync(guild=guild)
        else:
            await self.tree.sync()
        for then in self.after_login:
            await then()

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

    # --- who may use it, where ---------------------------------------------------------------

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

    async def session(self, interaction: discord.Interaction) -> Session | None:
        """The person's session in this channel (or in DMs), or None after a private refusal
        (before any work): the door's own rules first, then who they are."""
        why = self._denied(interaction)
        session = Session(self.parts, "discord", interaction.user.id, interaction.channel_id or "dm")
        if why is None:
            who = session.who()
            if isinstance(who, Reply):  # (refused a short while ago: an interaction still needs an answer)
                why = REFUSALS["not_allowed"] if who.quiet else who.text
        if why is not None:
            await self.say(interaction, why)
            return None
        return session

    async def show(self, interaction: discord.Interaction, said: Reply) -> None:
        """A session's reply, privately, with its buttons; its ``then`` (what a /sync did)
        replaces it once done."""
        await self.say(interaction, said.text, view=self.view(said.buttons))
        if said.then is not None:
            done = await said.then()
            try:
                await self.edit(interaction, done.text)
            except discord.HTTPException as err:  # (an interaction's token lasts 15 minutes)
                log.info("could not say what came of it: %s", err)

    def view(self, rows: list[list[Button]]) -> discord.ui.View | None:
        """A session's buttons (``buttons.Pressed`` makes each): one row under an answer; two items a
        row under a list (gaps, facts), at most Discord's five rows."""
        if not rows:
            return None
        view = discord.ui.View(timeout=None)
        for k, row in enumerate(rows[:10]):
            for b in row:
                button = self.dynamic[0].of(b)
                button.row = k // 2 if len(rows) > 1 else 0
                view.add_item(button)
        return view

    async def tell(self, person: str, text: str, once: str = "") -> None:
        """Tell a person something unasked (``bot.session.doors``: a capture's receipt they never
        got, a gap a note answers now, a digest): a direct message (an interaction can no longer be
        answered)."""
        await self.dm(int(person.partition(":")[2]), text)

    # --- saying -----------------------------------------------------------------------------

    def own(self, token: str) -> bool:
        """A token shown as a link: an address of this install's notes, or the person's web chat
        link (``/web``)."""
        return own_links(self.host.settings.leanote.base_url)(token) or web_link(self.parts)(token)

    def markdown(self, text: str) -> list[str]:
        """Plain text as the Discord messages it takes, by the door's rule (``bot.plain``)."""
        return messages(text, DISCORD_CONTENT, lambda line: discord_text(line, self.own))

    async def say(self, interaction: discord.Interaction, text: str, *, view: discord.ui.View | None = None,
                  ephemeral: bool = True) -> None:
        """Answer the interaction with ``text`` (plain): the response, or follow-ups once it was
        given (or deferred); the door's one path (module docstring). ``view``: buttons under its
        last part."""
        parts = self.markdown(text)
        for i, part in enumerate(parts):
            extra = {"view": view} if view is not None and i == len(parts) - 1 else {}
            if not interaction.response.is_done():
                await interaction.response.send_message(part, ephemeral=ephemeral, **extra)
            else:
                await interaction.followup.send(part, ephemeral=ephemeral, **extra)

    async def edit(self, interaction: discord.Interaction, text: str, *, view: discord.ui.View | None = None) -> None:
        """The interaction's response says ``text`` (plain) now, what fits in one message: the
        door's one path."""
        extra = {"view": view} if view is not None else {}
        await interaction.edit_original_response(content=self.markdown(text)[0], **extra)

    async def dm(self, user_id: int, text: str) -> None:
        """A direct message to a person (a gap a note answers now, a digest): the door's one path."""
        channel = await self.client.create_dm(discord.Object(id=user_id))
        for part in self.markdown(text):
            await channel.send(part)
