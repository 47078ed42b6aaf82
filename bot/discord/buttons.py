"""The buttons in Discord. Under an answer: 👍, 👎, "Why?" and "Save as note" (``FeedbackButton``,
custom id ``fb:<action>:<answer id>``); only the person who asked may use them. Under
``/about`` and ``/related``: 👍 confirm / 👎 reject (``MemoryButton``, ``mem:<verdict>:<id>``),
the presser's own memory. Each is a ``DynamicItem`` registered at start, so a press works
after a restart; every reply is ephemeral."""

from __future__ import annotations

import asyncio

import discord

from rag.answer.feedback import NotYours, UnknownAnswer

from bot.chat.texts import (MEMORY_ITEMS, NO_TRACE_KEPT, REMAPPED_WHY, VERDICT_BUTTONS, MemoryReply, not_saved_text,
                            trace_text, verdict_reply)
from bot.discord.bot import DiscordBot
from bot.usecases import answers
from bot.usecases.people import Person, person_key

NOT_YOURS = "这是别人的回答。 / This is someone else's answer."
FORGOTTEN = "这个回答已经不记得了，请重新提问。 / This answer is no longer remembered: ask again."


async def press(bot: DiscordBot, interaction: discord.Interaction, action: str, answer_id: str) -> None:
    """👍 / 👎 / Why? / Save as note under an answer: only for the person who asked it."""
    try:  # checked before anything else: nothing changes, nothing is shown
        record = await asyncio.to_thread(answers.pressed, bot.parts, person_key("discord", interaction.user.id),
                                         answer_id)
    except NotYours:
        await bot.say(interaction, NOT_YOURS)
        return
    except UnknownAnswer:
        await bot.say(interaction, FORGOTTEN)
        return
    person = await bot.person(interaction)  # the asker must still be let in here
    if person is None:
        return
    try:
        if action in ("up", "down"):
            await asyncio.to_thread(answers.rate, bot.parts, person, record, action)
            text = ("谢谢！很高兴有帮助。 / Thanks, glad it helped." if action == "up" else
                    "谢谢反馈，会用它来改进。 / Thanks: this helps improve the answers.")
        elif action == "why":
            try:
                why = answers.why(person, record)
                text = trace_text(why) if why is not None else NO_TRACE_KEPT
            except answers.Remapped:  # another Leanote user's notes now
                text = REMAPPED_WHY
        else:
            await _save_answer(bot, interaction, person, record)
            return
    except NotYours:
        text = NOT_YOURS
    except UnknownAnswer:
        text = FORGOTTEN
    await bot.say(interaction, text)


async def _save_answer(bot: DiscordBot, interaction: discord.Interaction, person: Person, record) -> None:
    why_not = await answers.save_blocked(bot.parts, person, record)
    if why_not is not None:
        await bot.say(interaction, not_saved_text(why_not)[0])
        return
    await interaction.response.defer(thinking=True, ephemeral=True)
    receipt = await answers.save_answer(bot.parts, person, record)  # (an error: the error handler tells the person)
    await bot.say(interaction, receipt.message)


async def verdict(bot: DiscordBot, interaction: discord.Interaction, verdict: str, item_id: str) -> None:
    """``/reject`` or ``/confirm``, and the 👍 / 👎 under /about and /related: the presser's
    own memory; an id of another Leanote user's memory changes nothing."""
    person = await bot.person(interaction)
    if person is None:
        return
    _, text = await verdict_reply(bot.parts, person, item_id, verdict)
    await bot.say(interaction, text)


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
                await press(bot, interaction, self.action, self.answer_id)
            except Exception as err:
                await bot.failed(interaction, err)


def feedback_view(answer_id: str, can_save: bool = True) -> discord.ui.View:
    """👍, 👎, Why? and, where capture has somewhere to write (``can_save``), Save as note."""
    view = discord.ui.View(timeout=None)
    for action in ("up", "down", "why", "save") if can_save else ("up", "down", "why"):
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
                await verdict(bot, interaction, self.verdict, self.item_id)
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
