"""A voice clip given to ``/ask`` that asks nothing (``bot.usecases.unasked``): the response shows
the words heard and says it is not a question, with "Save as note" (``nq:<id>``) where capture
works; a press saves it as the presser's note (only their own clip), the clip attached. A typed
``/ask`` is always answered: typing it there is asking."""

from __future__ import annotations

import discord

from rag.capture import Attachment

from bot.chat.unasked import ASK_ANYWAY_DISCORD, SAVE_BUTTON
from bot.chat.unasked import not_a_question as reply_text
from bot.discord.bot import DiscordBot
from bot.usecases import unasked as unasked_case
from bot.usecases.people import Person


async def offer(bot: DiscordBot, interaction: discord.Interaction, person: Person, heard: str, line: str,
                clip: Attachment) -> bool:
    """True when the words ``heard`` ask nothing and the (deferred) response says so under
    ``line`` (the words as heard, plain); False: ask them."""
    item = unasked_case.check(bot.parts, person, heard, clip)
    if item is None:
        return False
    can = unasked_case.can_save(bot.parts)
    view = discord.ui.View(timeout=None)
    if can:
        view.add_item(UnaskedButton(item.id))
    await bot.edit(interaction, f"{line}\n{reply_text(can, ASK_ANYWAY_DISCORD)}", view=view)
    return True


async def press(bot: DiscordBot, interaction: discord.Interaction, item_id: str) -> None:
    person = await bot.person(interaction)
    if person is None:
        return
    try:
        item = unasked_case.kept(bot.parts, person, item_id)
    except unasked_case.Gone as err:
        await bot.say(interaction, str(err))
        return
    await interaction.response.defer(thinking=True, ephemeral=True)
    receipt = await unasked_case.save(bot.parts, person, item)
    await bot.say(interaction, receipt.message)


class UnaskedButton(discord.ui.DynamicItem[discord.ui.Button], template=r"nq:(?P<id>[0-9a-f]{1,32})"):
    """"Save as note" under the reply to a clip that asked nothing; after a restart the message
    is no longer kept, and a press says so."""

    def __init__(self, item_id: str):
        super().__init__(discord.ui.Button(style=discord.ButtonStyle.primary, label=SAVE_BUTTON,
                                           custom_id=f"nq:{item_id}"))
        self.item_id = item_id

    @classmethod
    async def from_custom_id(cls, interaction: discord.Interaction, item: discord.ui.Button, match, /):
        return cls(match["id"])

    async def callback(self, interaction: discord.Interaction) -> None:
        bot = getattr(interaction.client, "leanote_bot", None)
        if bot is not None:
            try:
                await press(bot, interaction, self.item_id)
            except Exception as err:
                await bot.failed(interaction, err)
