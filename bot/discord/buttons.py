"""The buttons in Discord: every button a session gives (``bot.session.views.Button``) is one
``Pressed``: under an answer 👍, 👎, "Why?" and "Save as note" (custom id ``fb:<act>:<answer id>``);
under ``/about`` and ``/related`` 👍 confirm / 👎 reject (``mem:<verdict>:<id>``); under ``/gaps``
✍️ write / ✖ dismiss and under the note begun ✖ cancel (``gap:w|x|c:<id>``); under the reply to a
clip that asked nothing "Save as note" (``nq:<id>``). It is a ``DynamicItem`` registered at start:
its custom id holds all a press needs, so a press is understood after a restart too. What a
press does is the presser's session's (``bot.session.presses``); every reply is ephemeral."""

from __future__ import annotations

import discord

from bot.discord.bot import DiscordBot
from bot.session import Button, Session

STYLES = {"save": discord.ButtonStyle.primary, "w": discord.ButtonStyle.primary, "nq": discord.ButtonStyle.primary,
          "rejected": discord.ButtonStyle.danger}


async def press(bot: DiscordBot, interaction: discord.Interaction, data: str) -> None:
    """What the session says a press does, said to the presser alone; work that follows (a save)
    behind "thinking…"."""
    session = Session(bot.parts, "discord", interaction.user.id, interaction.channel_id or "dm")
    said = await session.press(data, denied=bot._denied(interaction))
    if said.then is not None:
        await interaction.response.defer(thinking=True, ephemeral=True)
        said = await said.then()
    await bot.say(interaction, said.text, view=bot.view(said.buttons))


class Pressed(discord.ui.DynamicItem[discord.ui.Button],
              template=r"(?P<data>(?:fb:(?:up|down|why|save)|mem:(?:rejected|confirmed)|gap:[wxcsa]|nq):"
                       r"[A-Za-z0-9_-]{1,64})"):
    """One button of a session's; its custom id is the data a press sends back (an answer's
    buttons keep Discord's ``fb:`` form: ``fb:why:<id>``)."""

    def __init__(self, data: str, emoji: str | None = None, label: str | None = None,
                 style: discord.ButtonStyle = discord.ButtonStyle.secondary):
        data = f"fb:{data}" if data.startswith(("why:", "save:")) else data
        super().__init__(discord.ui.Button(style=style, emoji=emoji, label=label, custom_id=data))
        self.data = data

    @classmethod
    def of(cls, b: Button) -> "Pressed":
        label = f"{b.n} {b.words}" if b.n is not None else b.words
        return cls(b.data, b.icon or None, label or None, STYLES.get(b.kind, discord.ButtonStyle.secondary))

    @classmethod
    async def from_custom_id(cls, interaction: discord.Interaction, item: discord.ui.Button, match, /):
        return cls(match["data"])

    async def callback(self, interaction: discord.Interaction) -> None:
        bot = getattr(interaction.client, "leanote_bot", None)
        if bot is not None:
            try:
                await press(bot, interaction, self.data)
            except Exception as err:
                await bot.failed(interaction, err)
