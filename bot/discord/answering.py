"""A question's flow in Discord: ``/ask`` defers at once (Discord's 3-second rule), streams
into the original response (edits at least ``discord.edit_interval`` apart), then shows the
answer as embed(s) within Discord's limits, sources as lines with ``<url>`` links; a longer
answer continues in follow-ups, the buttons under its last part. When Discord refuses any of
it, what went out goes and the response says the answer could not be delivered (nobody is left
with half an answer and its cursor), and no answer is kept for buttons that never showed. A
channel is a shared room: answers are private (ephemeral, only the asker sees them) unless
``discord.public_answers`` is on or the asker passes ``private:false``. The session
(``bot.session``) says whether the question is let through and gives the answer's view."""

from __future__ import annotations

import logging
from contextlib import suppress

import discord

from bot.chat.pacing import Pacer, Wait
from bot.chat.texts import SORRY, UNDELIVERED
from bot.discord.bot import DiscordBot
from bot.render import (DISCORD_CONTENT, DISCORD_DESCRIPTION, NoteLinks, SourceLinks, discord_pages,
                        discord_plain_links, discord_sources, discord_tail)
from bot.session import AnswerView

log = logging.getLogger(__name__)
COLOR = 0x2E7D32
__all__ = ["ask", "discord_tail", "embeds_for"]


async def ask(bot: DiscordBot, interaction: discord.Interaction, question: str, private: bool | None = None,
              heard: str | None = None, spoken: bool = False, counted: bool = False, seen: str = "") -> None:
    """``heard``: the line a voice clip or an image was read as (plain text: shown above the answer by
    the door's rule; the interaction was deferred already, while it was read); ``spoken``: the
    question holds a clip's words; ``counted``: against the person's rate limit already (before the
    clip or image was downloaded); ``seen``: the text read from an image sent with it."""
    session = await bot.session(interaction)
    if session is None:
        return
    heard = bot.markdown(heard)[0] if heard else None  # the words heard or read: nothing in them is Markdown
    if private is None:
        private = not bot.cfg.public_answers
    above = f"{heard}\n" if heard else ""
    reading = SourceLinks()  # the sources' links, once they are known

    def sources(found, head: str) -> None:
        reading.found(found)
        pacer.show_first(head)

    async def edit(text: str) -> None:  # every link-like token inert, but the sources' own
        try:
            shown = discord_plain_links(text, reading.links, reading.web)
            await interaction.edit_original_response(content=discord_tail(above + shown, DISCORD_CONTENT))
        except discord.HTTPException as err:
            if err.status == 429:
                raise Wait(float(getattr(err, "retry_after", 1.0) or 1.0)) from None
            raise

    pacer = Pacer(edit, bot.cfg.edit_interval)
    bot.pacers.append(pacer)
    started = []

    async def ready() -> None:  # let through: "thinking…", then the answer streams into the response
        if not interaction.response.is_done():
            await interaction.response.defer(thinking=True, ephemeral=private)
        started.append(True)
        pacer.start()

    try:
        got = await session.ask(question, on_token=pacer.feed, on_sources=sources, heard=spoken, seen=seen,
                                counted=counted, ready=ready)
    except Exception:
        if not started:
            raise  # (before anything was shown: the error handler says so)
        log.exception("answering a Discord question failed")
        bot.count_error()
        got = None
    finally:  # whatever happened, the streaming edits end here
        await pacer.stop()
    if got is None:
        await _error(interaction)
        return
    if not isinstance(got, AnswerView):  # a refusal: for the asker alone, before or after a deferral
        await (bot.edit(interaction, got.text) if interaction.response.is_done() else bot.say(interaction, got.text))
        return
    sent: list[discord.WebhookMessage] = []
    try:
        await _deliver(bot, interaction, got, private, sent, heard)
    except Exception:  # Discord refused the answer (or a part of it): nobody is left with half of it
        log.exception("delivering a Discord answer failed")
        bot.count_error()
        await session.undelivered(got)
        await _undelivered(interaction, sent)


async def _error(interaction: discord.Interaction) -> None:
    """Errors are for the asker only: the "thinking…" goes, an ephemeral note comes."""
    try:
        await interaction.delete_original_response()
    except discord.HTTPException:
        pass
    await interaction.followup.send(SORRY, ephemeral=True)


async def _undelivered(interaction: discord.Interaction, sent: list[discord.WebhookMessage]) -> None:
    """The answer could not be shown whole: the parts that went out go, and the message the
    answer streamed into (with its cursor, in public mode before the whole channel) says so
    instead, or, when Discord refuses that too, goes and the asker alone is told."""
    for part in sent:
        with suppress(discord.HTTPException):
            await part.delete()
    try:
        await interaction.edit_original_response(content=UNDELIVERED, embed=None, view=None)
        return
    except discord.HTTPException:
        pass
    with suppress(discord.HTTPException):
        await interaction.delete_original_response()
    with suppress(discord.HTTPException):
        await interaction.followup.send(UNDELIVERED, ephemeral=True)


async def _deliver(bot: DiscordBot, interaction: discord.Interaction, answer: AnswerView, private: bool,
                   sent: list[discord.WebhookMessage], heard: str | None = None) -> None:
    sources = discord_sources(answer.sources, answer.sources_title, answer.question, answer.root)
    body = discord_plain_links(answer.text, NoteLinks(answer.citations)) + "".join(
        f"\n\n*{n}*" for n in answer.notices)
    embeds = embeds_for(body, sources)
    first, rest = embeds[0], embeds[1:]
    view = bot.view(answer.buttons)  # the buttons go under the last part of the answer
    buttons = {"view": view} if view is not None else {}
    await interaction.edit_original_response(content=heard[:DISCORD_CONTENT] if heard else None, embed=first,
                                             **({} if rest else buttons))
    for i, embed in enumerate(rest):
        sent.append(await interaction.followup.send(embed=embed, ephemeral=private, wait=True,
                                                    **(buttons if i == len(rest) - 1 else {})))


def embeds_for(body: str, sources: str) -> list[discord.Embed]:
    """The answer as embeds: each description ≤ 4,096 characters and each message's
    embeds ≤ 6,000 in total; the sources go into the last one (or one of their own)."""
    pages = discord_pages(body, DISCORD_DESCRIPTION - 96)
    if sources and len(pages[-1]) + 2 + len(sources) <= DISCORD_DESCRIPTION - 96:
        pages[-1] = f"{pages[-1]}\n\n{sources}"
    elif sources:
        pages.append(sources[: DISCORD_DESCRIPTION - 96])
    embeds = []
    for i, page in enumerate(pages):
        embed = discord.Embed(description=page, color=COLOR)
        if len(pages) > 1:
            embed.set_footer(text=f"{i + 1}/{len(pages)}")
        embeds.append(embed)
    return embeds
