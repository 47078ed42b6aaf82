"""The Discord slash commands that are neither a question nor a capture: ``/search``,
``/reset``, ``/status``, ``/sync`` (admins), ``/why``, ``/web``, the memory's ``/about``, ``/related``,
``/reject``, ``/confirm`` (each fact or pair with 👍 confirm / 👎 reject buttons), and the
knowledge gaps' ``/gaps`` (✍️ write / ✖ dismiss under each), ``/forget``, ``/digest``. Each asks the
person's session (``bot.session``); every reply is ephemeral: only the asker sees it (and so only
they can press its buttons), and one too long for a message continues in the next. Before every
command a note begun with ✍️ ends (``before_command``), and the person is told once it has
answered (``after_command``); their next ``/note`` of text alone is that note."""

from __future__ import annotations

import discord

from bot.discord.bot import DiscordBot
from bot.session import Session

ENDED = "gap_draft_ended"  # what the person is told of the draft a command ended, until the command is done


async def run(bot: DiscordBot, interaction: discord.Interaction, what: str, *args, defer: bool = False) -> None:
    """The session's ``what`` for the person here, shown; ``defer``: "thinking…" once it is let
    through (a search may take longer than Discord's 3 seconds)."""
    session = await bot.session(interaction)
    if session is None:
        return

    async def ready() -> None:
        await interaction.response.defer(thinking=True, ephemeral=True)

    await bot.show(interaction, await getattr(session, what)(*args, **({"ready": ready} if defer else {})))


async def search(bot: DiscordBot, interaction: discord.Interaction, query: str) -> None:
    await run(bot, interaction, "search", query, defer=True)


async def memory(bot: DiscordBot, interaction: discord.Interaction, what: str, target: str) -> None:
    """``/about`` or ``/related`` for the asker's Leanote user, with 👍 / 👎 buttons."""
    await run(bot, interaction, what, target, defer=True)


async def digest(bot: DiscordBot, interaction: discord.Interaction, when: str | None) -> None:
    """``/digest when:weekly mon 09:00 [TZ]`` (or daily 08:30, off); without it: the plan now."""
    await run(bot, interaction, "digest", when or "", interaction.guild_id is None)


async def before_command(bot: DiscordBot, interaction: discord.Interaction) -> bool:
    """Before every command (the tree's check; always True: the command runs): while a note
    begun with ✍️ waits, a ``/note`` of text alone is that note (the session's ``note``), any
    other command ends it; ``after_command`` says so once the command has answered."""
    if interaction.type != discord.InteractionType.application_command or getattr(bot.host, "parts", None) is None:
        return True
    data = interaction.data or {}
    file = any(o.get("name") == "file" for o in data.get("options") or ())
    said, _ = await Session(bot.parts, "discord", interaction.user.id).command(data.get("name") or "", file=file)
    if said is not None:
        interaction.extras[ENDED] = said
    return True


async def after_command(bot: DiscordBot, interaction: discord.Interaction) -> None:
    """After a command that ended a waiting draft: the person is told, privately."""
    said = interaction.extras.get(ENDED)
    if said is not None and interaction.response.is_done():
        await bot.say(interaction, said.text)
