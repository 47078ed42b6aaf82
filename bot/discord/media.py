"""A voice clip or an image with ``/ask`` in Discord (its ``file`` option): heard or read on
this machine, the words shown on one line above the answer (a mishearing is seen: ask again
with the right words), then answered as a typed question, with the words typed beside it
first. While it waits in the machine's line, the response says how many are ahead. A clip or
image given to ``/note``, or in a message saved from the menu, is read by the capture
(``bot.usecases.media.note``)."""

from __future__ import annotations

import logging
import time

import discord

from rag.capture import Attachment

from bot.chat.pacing import Coalesced
from bot.chat.texts import INTERRUPTED, READING_IMAGE, TRANSCRIBING, waiting_text
from bot.discord import answering
from bot.discord.bot import DiscordBot
from bot.session import doors

log = logging.getLogger(__name__)

NEITHER = ("只能问语音或图片：这个文件两者都不是。 / Only a voice clip or an image can be asked about: that file is "
           "neither.")


async def ask(bot: DiscordBot, interaction: discord.Interaction, question: str, file: discord.Attachment,
              private: bool | None = None) -> None:
    session = await bot.session(interaction)
    if session is None:
        return
    kind = Attachment(file.filename, b"", file.content_type or "application/octet-stream")
    cfg = bot.host.settings.media
    if kind.is_audio or kind.is_image:
        problem = session.media_problem("audio" if kind.is_audio else "image")
        most, doing = (cfg.max_audio_mb, TRANSCRIBING) if kind.is_audio else (cfg.max_image_mb, READING_IMAGE)
    else:
        problem, most, doing = NEITHER, 0, ""
    if not problem and file.size > most * 1024 * 1024:
        problem = (f"文件 {file.filename} 太大：最多 {most:g} MB。 / {file.filename} is too large: at most {most:g} MB.")
    if problem:  # said before anything is downloaded
        await bot.say(interaction, problem)
        return
    slow = session.may_ask()  # a question's count, before it is downloaded, heard or read
    if slow:
        await bot.say(interaction, slow.text)
        return
    if private is None:
        private = not bot.cfg.public_answers
    await interaction.response.defer(thinking=True, ephemeral=private)
    paced = Coalesced(lambda ahead: bot.edit(interaction, waiting_text(ahead) if ahead else doing))

    async def wait(ahead: int) -> None:  # its place in line, edited at most every few seconds
        await (paced(ahead) if ahead else paced.now(0))

    # the response says what is being done until the answer replaces it: kept on disk until then, so that
    # a stop or a crash in between is said at the next start (``interrupted``)
    shown = await session.shown({"application_id": interaction.application_id, "token": interaction.token,
                                 "user_id": interaction.user.id})
    try:
        data = await file.read()
    except (discord.HTTPException, OSError) as err:
        log.warning("downloading Discord attachment %s failed: %s", file.filename, err)
        await bot.edit(interaction, f"没能下载文件 {file.filename}。 / Could not download {file.filename}.")
        await session.settled(shown)
        return
    if kind.is_audio:
        got = await _done(paced, session.hear(data, wait))
        asked = "\n\n".join(t for t in (question.strip(), got.text) if t)
        offered = None if question.strip() or got.reply else session.unasked(got.text, Attachment(file.filename, data,
                                                                                                 kind.mime))
    else:
        got = await _done(paced, session.read(data, question, wait))
        asked, offered = got.text, None
    said = got.reply or offered  # why it was not read; or, a clip that asks nothing, said so: not asked
    if said is not None:
        await bot.edit(interaction, f"{got.line}\n{said.text}".strip(), view=bot.view(said.buttons))
        await session.settled(shown)
        return
    await session.settled(shown)
    await answering.ask(bot, interaction, asked, private, heard=got.line, spoken=kind.is_audio, counted=True,
                        seen=got.seen)


async def _done(paced: Coalesced, work):
    """What the media work gives; its place in line is said no more once it ends (an edit under
    way ends first), so what comes next is the response's last word."""
    try:
        return await work
    finally:
        await paced.close()


# an interaction's token edits its response for 15 minutes; later the person gets a direct message
EDITABLE = 14 * 60


async def interrupted(bot: DiscordBot) -> None:
    """At the start: each ``/ask file:`` response a stop or a crash left saying it was at work now
    says the job was interrupted (a direct message once the response can no longer be edited)."""

    async def tell(shown) -> None:
        place = shown.place
        if time.time() - shown.time < EDITABLE:
            webhook = discord.Webhook.partial(int(place["application_id"]), place["token"], client=bot.client)
            await webhook.edit_message("@original", content=INTERRUPTED)  # (the route Discord gives the response)
        else:
            await bot.dm(int(place["user_id"]), f"/ask: {INTERRUPTED}")

    await doors.interrupted(bot.parts, "discord", tell)
