"""Capture in Discord, when the daemon can write to Leanote: ``/note text [file]``, ``/append``,
``/remember``, ``/outbox``, and the message menu "Save to Leanote" (Discord's forward: the
message with its author, channel, time, link and files; the same message saved again answers
with the note it became). Only people the bot lets in may write; every reply is private (the
capture's receipt: the note's link, queued, or why not). A file's size is checked against
``capture.max_file_mb`` before it is downloaded. After ✍️ under ``/gaps``, the next ``/note``
(text alone) becomes the note for that gap, titled by its question."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import discord

from rag.capture import Attachment, Origin, Quote

from bot.chat.gaps import not_written_text
from bot.chat.texts import NO_CAPTURE, outbox_text, waiting_text
from bot.discord.bot import DiscordBot
from bot.chat.pacing import Coalesced
from bot.usecases import capture, gaps
from bot.usecases import media as media_case

PLACE = "discord"  # where a Discord person's note for a gap is written: their next /note, wherever

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
        if await bot.person(interaction) is not None:
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
    person = await bot.person(interaction)
    if person is None:
        return
    if not bot.can_capture:
        await bot.say(interaction, NO_CAPTURE)
        return
    await bot.say(interaction, outbox_text(await capture.outbox(bot.parts, person)))


async def _capture(bot: DiscordBot, interaction: discord.Interaction, kind: str, text: str,
                   files: list[discord.Attachment] = (), origin: Origin | None = None,
                   quote: Quote | None = None, once: str = "") -> None:
    """``once``: what the capture comes from (a message saved from the menu); by default
    the interaction itself (Discord sends each one once)."""
    once = once or f"discord:interaction:{interaction.id}"
    person = await bot.person(interaction)
    if person is None:
        return
    if not bot.can_capture:
        await bot.say(interaction, NO_CAPTURE)
        return
    why = _before_download(bot, files, person)
    if why:  # nothing downloaded, nothing written
        await bot.say(interaction, why)
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
    draft = None
    if kind == "note" and not files and origin is None:  # after ✍️ under /gaps: the note for that gap
        draft = await asyncio.to_thread(gaps.take_draft, bot.parts, person, PLACE)
    if draft is not None:
        receipt = await gaps.write_draft(bot.parts, person, draft, text or "", once=once)
        if receipt.status == "refused":  # said with it: the draft is over (✍️ again to retry)
            receipt = replace(receipt, message=not_written_text(draft, receipt.message))
    elif kind == "note":  # a photo's text goes under it, a clip's words become the text (read on this machine)
        paced = Coalesced(lambda ahead: bot.edit(interaction, waiting_text(ahead)))  # at most every few seconds

        async def wait(ahead: int) -> None:
            if ahead:
                await paced(ahead)

        try:
            receipt = await media_case.note(bot.parts, person, text or "", origin=origin, files=attachments,
                                            quote=quote, once=once, on_wait=wait)
        finally:
            await paced.close()
    elif kind == "append":
        receipt = await capture.append(bot.parts, person, text or "", once=once)
    else:
        receipt = await capture.remember(bot.parts, person, text or "", once=once)
    await bot.say(interaction, receipt.message)


def _before_download(bot: DiscordBot, files: list[discord.Attachment], person) -> str | None:
    """Refusals that need no download: capture turned off or with nowhere to write (for this
    person), a file larger than ``capture.max_file_mb`` (Discord says each file's size up front)."""
    cfg = bot.host.settings.capture
    why = capture.unavailable(bot.parts, person) or (capture.too_often(bot.parts, person) if files else None)
    if why:
        return why
    limit = cfg.max_file_mb * 1024 * 1024
    for f in files:
        if f.size > limit:
            return (f"文件 {f.filename} 太大：最多 {cfg.max_file_mb:g} MB，什么也没记。 / {f.filename} is too "
                    f"large: at most {cfg.max_file_mb:g} MB. Nothing was saved.")
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
