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
from rag.media.base import MediaError, NoText

from bot.chat.texts import INTERRUPTED, READING_IMAGE, TRANSCRIBING, heard_line, seen_line, waiting_text
from bot.discord import answering, unasked
from bot.discord.bot import DiscordBot
from bot.chat.pacing import Coalesced
from bot.usecases import media as media_case

log = logging.getLogger(__name__)

NEITHER = ("只能问语音或图片：这个文件两者都不是。 / Only a voice clip or an image can be asked about: that file is "
           "neither.")


async def ask(bot: DiscordBot, interaction: discord.Interaction, question: str, file: discord.Attachment,
              private: bool | None = None) -> None:
    person = await bot.person(interaction)
    if person is None:
        return
    kind = Attachment(file.filename, b"", file.content_type or "application/octet-stream")
    cfg = bot.host.settings.media
    if kind.is_audio:
        problem, most, doing = media_case.speech_problem(bot.parts), cfg.max_audio_mb, TRANSCRIBING
    elif kind.is_image:
        problem, most, doing = media_case.ocr_problem(bot.parts), cfg.max_image_mb, READING_IMAGE
    else:
        problem, most, doing = NEITHER, 0, ""
    if not problem and file.size > most * 1024 * 1024:
        problem = (f"文件 {file.filename} 太大：最多 {most:g} MB。 / {file.filename} is too large: at most {most:g} MB.")
    if problem:  # said before anything is downloaded
        await bot.say(interaction, problem)
        return
    if not await bot.may_search(interaction):  # a question's count, before it is downloaded, heard or read
        return
    if private is None:
        private = not bot.cfg.public_answers
    await interaction.response.defer(thinking=True, ephemeral=private)
    paced = Coalesced(lambda ahead: bot.edit(interaction, waiting_text(ahead) if ahead else doing))

    async def wait(ahead: int) -> None:  # its place in line, edited at most every few seconds
        await (paced(ahead) if ahead else paced.now(0))

    # the response says what is being done until the answer replaces it: kept on disk until then, so that
    # a stop or a crash in between is said at the next start (``interrupted``)
    shown = await media_case.shown(bot.parts, person, "discord", {
        "application_id": interaction.application_id, "token": interaction.token, "user_id": interaction.user.id})
    try:
        data = await file.read()
    except (discord.HTTPException, OSError) as err:
        log.warning("downloading Discord attachment %s failed: %s", file.filename, err)
        await bot.edit(interaction, f"没能下载文件 {file.filename}。 / Could not download {file.filename}.")
        await media_case.settled(bot.parts, shown)
        return
    seen = ""
    try:
        if kind.is_audio:
            heard = await _done(paced, media_case.hear(bot.parts, person, data, wait))
            line, asked = heard_line(heard.line()), "\n\n".join(t for t in (question.strip(), heard.text) if t)
            clip = Attachment(file.filename, data, kind.mime)
            if not question.strip() and await unasked.offer(bot, interaction, person, heard.text, line, clip):
                await media_case.settled(bot.parts, shown)
                return  # a reminder, a to-do said: not asked as a question
        else:
            try:
                reading = await _done(paced, media_case.read(bot.parts, person, data, wait))
            except NoText as err:
                if not question.strip():
                    raise
                reading, line = None, str(err)
            else:
                line = seen_line(" ".join(reading.lines)[:300])
            photo = media_case.photo_question(question, reading)
            asked, seen = photo.words, photo.seen
    except MediaError as err:
        await bot.edit(interaction, str(err))
        await media_case.settled(bot.parts, shown)
        return
    await media_case.settled(bot.parts, shown)
    await answering.ask(bot, interaction, asked, private, heard=line, spoken=kind.is_audio, counted=True, seen=seen)


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

    await media_case.interrupted(bot.parts, "discord", tell)
