"""A voice clip or an image with ``/ask`` in Discord (its ``file`` option): heard or read on
this machine, the words shown on one line above the answer (a mishearing is seen: ask again
with the right words), then answered as a typed question, with the words typed beside it
first. While it waits in the machine's line, the response says how many are ahead. A clip or
image given to ``/note``, or in a message saved from the menu, is read by the capture
(``bot.usecases.media.note``)."""

from __future__ import annotations

import logging

import discord

from rag.capture import Attachment
from rag.media.base import MediaError, NoText

from bot.chat.texts import READING_IMAGE, TRANSCRIBING, heard_line, seen_line, waiting_text
from bot.discord import answering
from bot.discord.bot import DiscordBot
from bot.render import DISCORD_CONTENT
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
        await interaction.response.send_message(problem[:DISCORD_CONTENT], ephemeral=True)
        return
    if private is None:
        private = not bot.cfg.public_answers
    await interaction.response.defer(thinking=True, ephemeral=private)

    async def wait(ahead: int) -> None:
        await interaction.edit_original_response(content=waiting_text(ahead) if ahead else doing)

    try:
        data = await file.read()
    except (discord.HTTPException, OSError) as err:
        log.warning("downloading Discord attachment %s failed: %s", file.filename, err)
        await interaction.edit_original_response(content=f"没能下载文件 {file.filename}。 / Could not download "
                                                         f"{file.filename}.")
        return
    seen = ""
    try:
        if kind.is_audio:
            heard = await media_case.hear(bot.parts, person, data, wait)
            line, asked = heard_line(heard.line()), "\n\n".join(t for t in (question.strip(), heard.text) if t)
        else:
            try:
                reading = await media_case.read(bot.parts, person, data, wait)
            except NoText as err:
                if not question.strip():
                    raise
                reading, line = None, str(err)
            else:
                line = seen_line(" ".join(reading.lines)[:300])
            photo = media_case.photo_question(question, reading)
            asked, seen = photo.words, photo.seen
    except MediaError as err:
        await interaction.edit_original_response(content=str(err)[:DISCORD_CONTENT])
        return
    await answering.ask(bot, interaction, asked, private, heard=line, spoken=kind.is_audio, seen=seen)
