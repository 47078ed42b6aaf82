"""Knowledge gaps in Discord: ``/gaps`` (ephemeral, with ✍️ write / ✖ dismiss under it:
``GapButton``, custom id ``gap:w|x:<id>``), ``/forget``, and a gap a note answers now, told in a
direct message. After ✍️ the person's next ``/note`` becomes the note for that gap
(``bot.discord.capturing``), with ✖ cancel under the reply (``gap:c:<id>``); any other command
ends it (``before_command``, the command tree's check, and ``after_command``, which says so). A
press is checked against the presser: another person's gap id, forged or replayed, is refused and
changes nothing."""

from __future__ import annotations

import asyncio

import discord

from rag.answer.gaps import GapDone, UnknownGap
from rag.digest_plan import USAGE, plan_text
from rag.errors import UserError

from bot.chat.digest import plan_reply
from bot.chat.gaps import (CANCEL_BUTTON, DISMISSED, GAP_BUTTONS, NOT_YOUR_GAP, NOTHING_WAITS, GapsReply,
                           ended_text, forgot_text, gaps_text, writing_text)
from bot.chat.texts import NO_CAPTURE
from bot.discord.bot import DiscordBot
from bot.discord.capturing import PLACE
from bot.usecases import capture, digest, gaps
from bot.usecases.people import Person

ENDED = "gap_draft_ended"  # the draft a command ended, kept on the interaction until the command is done


async def show(bot: DiscordBot, interaction: discord.Interaction) -> None:
    person = await bot.person(interaction)
    if person is None:
        return
    reply = gaps_text(await asyncio.to_thread(gaps.shown, bot.parts, person), how="note")
    await bot.say(interaction, reply.text, view=gap_view(reply, capture.offered(bot.parts)))


async def forget(bot: DiscordBot, interaction: discord.Interaction) -> None:
    person = await bot.person(interaction)
    if person is None:
        return
    gone = await asyncio.to_thread(gaps.forget, bot.parts, person)
    await bot.say(interaction, forgot_text(gone))


async def plan(bot: DiscordBot, interaction: discord.Interaction, when: str | None) -> None:
    """``/digest when:weekly mon 09:00 [TZ]`` (or daily 08:30, off); without it: the plan now."""
    person = await bot.person(interaction)
    if person is None:
        return
    if not (when or "").strip():
        now = await asyncio.to_thread(digest.plan_of, bot.parts, person)
        text = f"摘要 digest: {plan_text(now)}\n" + USAGE.format(tz=now.tz if now else "UTC")
    else:
        try:
            text = plan_reply(await asyncio.to_thread(digest.set_plan, bot.parts, person, when),
                              private=interaction.guild_id is None)
        except UserError as err:
            text = str(err)
    await bot.say(interaction, text)


async def press(bot: DiscordBot, interaction: discord.Interaction, act: str, gap_id: str) -> None:
    person = await bot.person(interaction)
    if person is None:
        return
    view = None
    try:
        if act == "x":
            gap = await asyncio.to_thread(gaps.dismiss, bot.parts, person, gap_id)
            text = DISMISSED.format(q=gap.question)
        elif act == "c":
            ended = await asyncio.to_thread(gaps.end_draft, bot.parts, person, gap_id)
            text = ended_text(ended) if ended is not None else NOTHING_WAITS
        elif not bot.can_capture:
            text = NO_CAPTURE
        elif why := capture.unavailable(bot.parts, person):  # said now: a note that cannot be written is never begun
            text = why
        else:
            gap = await asyncio.to_thread(gaps.write, bot.parts, person, gap_id, PLACE)
            text = writing_text(gap, bot.host.settings.capture.draft_wait, how="note")
            view = discord.ui.View(timeout=None)
            view.add_item(GapButton("c", gap_id))
    except UnknownGap:
        text = NOT_YOUR_GAP
    except GapDone as err:
        text = str(err)
    await bot.say(interaction, text, view=view)


async def before_command(bot: DiscordBot, interaction: discord.Interaction) -> bool:
    """Before every command (the tree's check; always True: the command runs): while a note
    begun with ✍️ waits, a ``/note`` of text alone is that note (``bot.discord.capturing``), any
    other command ends it; ``after_command`` says so once the command has answered."""
    if interaction.type != discord.InteractionType.application_command or \
            getattr(bot.host, "parts", None) is None or bot.parts.gaps_if_made() is None:
        return True
    data = interaction.data or {}
    if data.get("name") == "note" and not any(o.get("name") == "file" for o in data.get("options") or ()):
        return True
    person = bot.access.person("discord", interaction.user.id)
    if isinstance(person, Person):
        ended = await asyncio.to_thread(gaps.end_draft, bot.parts, person)
        if ended is not None:
            interaction.extras[ENDED] = ended
    return True


async def after_command(bot: DiscordBot, interaction: discord.Interaction) -> None:
    """After a command that ended a waiting draft: the person is told, privately."""
    ended = interaction.extras.get(ENDED)
    if ended is not None and interaction.response.is_done():
        await bot.say(interaction, ended_text(ended))


class GapButton(discord.ui.DynamicItem[discord.ui.Button], template=r"gap:(?P<act>w|x|c):(?P<id>[A-Za-z0-9_-]{1,32})"):
    """✍️ write / ✖ dismiss under /gaps, ✖ cancel under the ✍️ reply: the custom id holds the
    gap's id, so a press is understood after a restart too."""

    def __init__(self, act: str, gap_id: str, n: int | None = None):
        icon, word = next((i, w) for a, i, w in GAP_BUTTONS + (CANCEL_BUTTON,) if a == act)
        label = f"{n} {word}" if n is not None else word
        style = discord.ButtonStyle.primary if act == "w" else discord.ButtonStyle.secondary
        super().__init__(discord.ui.Button(style=style, emoji=icon, label=label, custom_id=f"gap:{act}:{gap_id}"))
        self.act, self.gap_id = act, gap_id

    @classmethod
    async def from_custom_id(cls, interaction: discord.Interaction, item: discord.ui.Button, match, /):
        return cls(match["act"], match["id"])

    async def callback(self, interaction: discord.Interaction) -> None:
        bot = getattr(interaction.client, "leanote_bot", None)
        if bot is not None:
            try:
                await press(bot, interaction, self.act, self.gap_id)
            except Exception as err:
                await bot.failed(interaction, err)


def gap_view(reply: GapsReply, can_write: bool = True) -> discord.ui.View:
    """Two gaps a row (✍️ n write, where capture has somewhere to write; ✖ n dismiss), at most
    Discord's five rows."""
    view = discord.ui.View(timeout=None)
    for k, (n, gap_id) in enumerate(reply.items[:10]):
        for act, _, _ in GAP_BUTTONS:
            if act == "w" and not can_write:
                continue
            button = GapButton(act, gap_id, n)
            button.row = k // 2
            view.add_item(button)
    return view


async def tell(bot: DiscordBot, person: str, text: str) -> None:
    """A direct message to a Discord person (a gap a note answers now, a digest)."""
    await bot.dm(int(person.partition(":")[2]), text)
