"""Capture in Discord, when the daemon can write to Leanote: ``/note text [file]``, ``/append``,
``/remember``, ``/outbox``, and the message menu "Save to Leanote" (Discord's forward: the
message with its author, channel, time, link and files; the same message saved again answers
with the note it became). Only people the bot lets in may write; every reply is private (the
capture's receipt: the note's link, queued, or why not). A file's size is checked against
``capture.max_file_mb`` before it is downloaded. After ✍️ under ``/gaps``, the next ``/note``
(text alone) becomes the note for that gap, titled by its question."""

from __future__ import annotations

import logging

import discord

from rag.capture import Attachment, Origin, Quote

from bot.chat.pacing import Coalesced
from bot.chat.texts import waiting_text
from bot.discord.bot import DiscordBot

log = logging.getLogger(__name__)


async def note(bot: DiscordBot, interaction: discord.Interaction, text: str,
               file: discord.Attachment | None = None) -> None:
    await _capture(bot, interaction, "note", text, [file] if file is not None else [])


async def add_text(bot: DiscordBot, interaction: discord.Interaction, how: str, text: str) -> None:
    """``/append`` or ``/remember``."""
    await _capture(bot, interaction, how, text)


async def save_message(bot: DiscordBot, interaction: discord.Interaction, message: discord.Message) -> None:
    """The message menu's "Save to Leanote": the message, where it came from, its files."""
    text = message.content or "\n\n".join(e.description for e in message.embeds if e.description)
    if not text.strip() and not message.attachments:
        if await bot.session(interaction) is not None:
            await bot.say(interaction, "这条消息没有可保存的文字或文件。 / That message has no text or files to save.")
        return
    # the menu pressed twice on one message (a double click, a second look) saves it once
    once = f"discord:{message.channel.id}:{message.id}"
    if message.author.id == interaction.user.id:  # their own message: their words, as they wrote them
        await _capture(bot, interaction, "note", text, list(message.attachments),
                       origin=origin_of(message, interaction), once=once)
    else:  # someone else's: shown in the note as they wrote it, not as Markdown of ours
        await _capture(bot, interaction, "note", "", list(message.attachments),
                       origin=origin_of(message, interaction), quote=Quote(text), once=once)


async def outbox(bot: DiscordBot, interaction: discord.Interaction) -> None:
    session = await bot.session(interaction)
    if session is not None:
        await bot.show(interaction, await session.outbox())


async def _capture(bot: DiscordBot, interaction: discord.Interaction, kind: str, text: str,
                   files: list[discord.Attachment] = (), origin: Origin | None = None,
                   quote: Quote | None = None, once: str = "") -> None:
    """``once``: what the capture comes from (a message saved from the menu); by default
    the interaction itself (Discord sends each one once)."""
    session = await bot.session(interaction)
    if session is None:
        return
    once = once or session.once(interaction.id, "interaction")
    # nothing downloaded, nothing written: refused from what Discord says of each file up front
    why = session.may_capture(files=bool(files)) or next(
        (r for r in (session.too_large(f.filename, f.size) for f in files) if r), None)
    if why:
        await bot.say(interaction, why.text)
        return
    # Writing may take a few seconds (Leanote's answer, or the wait before "queued").
    await interaction.response.defer(thinking=True, ephemeral=True)
    attachments = []
    for f in files:
        try:
            data = await f.read()
        except (discord.HTTPException, OSError) as err:
            log.warning("downloading Discord attachment %s failed: %s", f.filename, err)
            await bot.say(interaction, f"没能下载文件 {f.filename}，什么也没记。 / Could not download {f.filename}; "
                                       f"nothing was saved.")
            return
        attachments.append(Attachment(f.filename, data, f.content_type or "application/octet-stream"))
    if kind != "note":
        said = await getattr(session, kind)(text or "", once)
    else:  # a photo's text goes under it, a clip's words become the text (read on this machine)
        paced = Coalesced(lambda ahead: bot.edit(interaction, waiting_text(ahead)))  # at most every few seconds

        async def wait(ahead: int) -> None:
            if ahead:
                await paced(ahead)

        try:  # (after ✍️ under /gaps, a note of text alone is the note for that gap)
            said = await session.note(text or "", origin=origin, files=attachments, quote=quote, once=once,
                                      on_wait=wait)
        finally:
            await paced.close()
    await bot.say(interaction, said.text)


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
