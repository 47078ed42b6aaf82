"""Asking the notes: an answer, a search, why the last answer is what it is, a fresh start."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from bot.usecases import gaps
from bot.usecases.people import Person
from bot.usecases.results import Asked, Found, Why

if TYPE_CHECKING:
    from rag.answer.service import OnSources, OnToken

    from bot.root import Parts

log = logging.getLogger(__name__)


async def ask(parts: "Parts", person: Person, question: str, *, on_token: "OnToken | None" = None,
              on_sources: "OnSources | None" = None, keep: bool = False, heard: bool = False,
              seen: str = "") -> Asked:
    """The answer to ``question`` from the person's notes, in their conversation (a follow-up
    is read with what came before), with their fair share of the LLM (``rag.answer.fair``).
    ``on_token`` hears the text as it is written, ``on_sources`` the notes the evidence comes
    from, before the LLM reads. ``keep``: the answer is recorded for the buttons under it (a
    chat door's 👍 / 👎 / Why? / Save as note); a failure to record it loses only the buttons.
    A question the notes could not answer is kept as one of the person's gaps (``gaps.noted``).
    ``heard``: the question is a voice clip's words (searched with the notes' words it sounds like);
    ``seen``: the text read from a photo sent with it (searched with it, never taken for names the
    person asks about: ``rag.answer.service.AnswerService.ask``)."""
    answer = await parts.answers.ask(question, person.user_id, conversation=person.conversation, on_token=on_token,
                                     on_sources=on_sources, caller=person.key, heard=heard, seen=seen)
    answer_id = None
    if keep:
        try:  # a write to the feedback store
            answer_id = await asyncio.to_thread(parts.feedback.record, person.key, person.user_id, answer,
                                                person.conversation)
        except Exception:
            log.exception("could not record an answer for its buttons")
    await gaps.noted(parts, person, answer, answer_id)
    return Asked(answer, answer_id)


async def undelivered(parts: "Parts", person: Person, asked: Asked) -> None:
    """The door could not show the person ``asked`` (the platform refused the message): the
    record kept for its buttons goes, since no button will ever be under it."""
    if asked.answer_id is None:
        return
    try:  # a write to the feedback store
        await asyncio.to_thread(parts.feedback.withdraw, asked.answer_id, person.key)
    except Exception:
        log.exception("could not withdraw an answer that was not delivered")


async def search(parts: "Parts", person: Person, query: str, k: int | None = None,
                 retriever: str = "hybrid") -> Found:
    """The chunks of the person's notes that best match ``query`` (``retrieval.top_k`` of them
    unless ``k``), on the threads answers search on."""
    return Found(query, person.user_id, await parts.answers.search(query, person.user_id, k, retriever))


def why(parts: "Parts", person: Person) -> Why | None:
    """Why the last answer in the person's conversation is what it is; None before any."""
    if person.conversation is None:
        return None
    trace = parts.answers.conversations.trace(person.user_id, person.conversation)
    return Why.of(trace) if trace is not None else None


def reset(parts: "Parts", person: Person) -> None:
    """Forget the person's conversation: the next question stands alone."""
    if person.conversation is not None:
        parts.answers.conversations.reset(person.user_id, person.conversation)
