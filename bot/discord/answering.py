"""A question's flow in Discord: ``/ask`` defers at once (Discord's 3-second rule), streams
into the original response (edits at least ``discord.edit_interval`` apart), then shows the
answer as embed(s) within Discord's limits, sources as lines with ``<url>`` links; a longer
answer continues in follow-ups, the buttons under its last part. When Discord refuses any of
it, what went out goes and the response says the answer could not be delivered (nobody is left
with half an answer and its cursor), and no answer is kept for buttons that never showed. A
channel is a shared room: answers are private (ephemeral, only the asker sees them) unless
``discord.public_answers`` is on or the asker passes ``private:false``."""

from __future__ import annotations

import logging
from contextlib import suppress

import discord

from rag.index.excerpt import open_fence
from rag.language import label
from bot.chat.pacing import Pacer, Wait
from bot.chat.texts import EMPTY, SORRY, UNDELIVERED, cut_message, notes_root, sources_first
from bot.discord.bot import DiscordBot
from bot.discord.buttons import feedback_view
from bot.render import (DISCORD_CONTENT, DISCORD_DESCRIPTION, NoteLinks, SourceLinks, discord_pages,
                        discord_plain_links, discord_sources)
from bot.usecases import asking, capture

log = logging.getLogger(__name__)
COLOR = 0x2E7D32


async def ask(bot: DiscordBot, interaction: discord.Interaction, question: str, private: bool | None = None,
              heard: str | None = None, spoken: bool = False, counted: bool = False, seen: str = "") -> None:
    """``heard``: the line a voice clip or an image was read as (plain text: shown above the answer by
    the door's rule; the interaction was deferred already, while it was read); ``spoken``: the
    question holds a clip's words; ``counted``: against the person's rate limit already (before the
    clip or image was downloaded); ``seen``: the text read from an image sent with it (``asking.ask``)."""
    person = await bot.person(interaction)
    if person is None:
        return
    if not (question or "").strip() and not seen.strip():
        await _say(bot, interaction, EMPTY)
        return
    if not counted and not await bot.may_search(interaction):
        return
    heard = bot.markdown(heard)[0] if heard else None  # the words heard or read: nothing in them is Markdown
    question, notice = cut_message(bot.host.settings, question)
    if private is None:
        private = not bot.cfg.public_answers
    if not interaction.response.is_done():
        await interaction.response.defer(thinking=True, ephemeral=private)
    above = f"{heard}\n" if heard else ""

    reading = SourceLinks()  # the sources' links, once they are known

    def sources(found) -> None:
        reading.found(found)
        pacer.show_first(sources_first(found, label(question or seen, "reading"), notes_root(bot.host.settings)))

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
    pacer.start()
    try:
        asked = await asking.ask(bot.parts, person, question, on_token=pacer.feed, on_sources=sources, keep=True,
                                 heard=spoken, seen=seen)
    except Exception:
        log.exception("answering a Discord question failed")
        bot.count_error()
        asked = None
    finally:  # whatever happened, the streaming edits end here
        await pacer.stop()
    if asked is None:
        await _error(interaction)
        return
    sent: list[discord.WebhookMessage] = []
    try:
        await _deliver(interaction, asked, private, notice, sent, heard, notes_root(bot.host.settings),
                       capture.offered(bot.parts))
    except Exception:  # Discord refused the answer (or a part of it): nobody is left with half of it
        log.exception("delivering a Discord answer failed")
        bot.count_error()
        await asking.undelivered(bot.parts, person, asked)
        await _undelivered(interaction, sent)


def discord_tail(text: str, limit: int = DISCORD_CONTENT) -> str:
    """The end of a text that streams into one Discord message (its last ``limit`` characters,
    from a line's start where one is near): a code block it begins inside is opened again, so
    the code's closing fence does not open one that swallows the rest."""
    if len(text) <= limit:
        return text
    cut, head = len(text) - limit, ""
    for _ in range(3):
        line = text.find("\n", cut)
        if 0 <= line < cut + 200:
            cut = line + 1
        opener = open_fence(text, cut)
        head = "" if opener is None else opener[:200] + "\n"
        if len(head) + len(text) - cut <= limit:
            return head + text[cut:]
        cut = len(text) - limit + len(head)
    return (head + text[cut:])[-limit:]


async def _say(bot: DiscordBot, interaction: discord.Interaction, text: str) -> None:
    """A one-line reply for the asker alone, before or after the interaction was deferred."""
    if interaction.response.is_done():
        await bot.edit(interaction, text)
    else:
        await bot.say(interaction, text)


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


async def _deliver(interaction: discord.Interaction, asked: asking.Asked, private: bool, notice: str | None,
                   sent: list[discord.WebhookMessage], heard: str | None = None, root=None,
                   can_save: bool = True) -> None:
    """``root``: the notes folder its note files are named in; ``can_save``: "Save as note" goes under it."""
    answer = asked.answer
    if answer.citations:
        sources = discord_sources(answer.citations, label(answer.question, "sources"), answer.question, root)
    else:
        sources = discord_sources(answer.closest, label(answer.question, "closest"), answer.question, root)
    body = discord_plain_links(answer.shown, NoteLinks(answer.citations)) + "".join(
        f"\n\n*{n}*" for n in (answer.notice, notice) if n)
    embeds = embeds_for(body, sources)
    first, rest = embeds[0], embeds[1:]
    # the buttons go under the last part of the answer
    buttons = {"view": feedback_view(asked.answer_id, can_save)} if asked.answer_id else {}
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
