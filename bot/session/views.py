"""What a chat session gives back to a door: plain data each door only formats.

- ``Reply``: a text to show (plain: the door renders it by its rule, ``bot.plain``), the buttons
  under it, and how: where (``private``: the person's private chat, never a group), under a press
  (``how``: an ``alert`` they must see, a ``brief`` passing word, or a ``message``), a refusal's
  reason code (``refused``), work that follows (``then``: "Saving…" now, the receipt after), a
  question to answer now (``ask``), and which of the pressed message's buttons go (``unbutton``);
- ``Button``: what a press sends back (``data``, for ``Session.press``), its icon and words;
- ``AnswerView``: an answer as every door shows it: the text (with the quote of the note under an
  LLM's answer), the notices, the notes it cites or else the closest ones and their heading, whether
  what streamed was withdrawn, and the buttons under it;
- ``Heard``: what a voice clip or a photo was heard or read as, and what comes of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable

from bot.chat.words import BUTTONS


@dataclass(frozen=True)
class Button:
    """One button: ``data`` goes back to ``Session.press`` (at most 64 characters: Telegram's
    limit); ``kind`` names it (``up``, ``why``, ``w``, ``confirmed`` … : ``bot.chat.words.BUTTONS``),
    ``n`` the number of the item it is for in the text above it (a gap, a fact), if any."""

    data: str
    kind: str
    n: int | None = None

    @property
    def icon(self) -> str:
        return BUTTONS[self.kind][0]

    @property
    def words(self) -> str:
        return BUTTONS[self.kind][1]


@dataclass
class Reply:
    """What to tell the person. ``refused``: the reason code of a refusal (``bot.chat.words.REFUSALS``),
    "" when the session did what was asked. ``quiet``: a refusal said a short while ago (a chat
    may say nothing; a door that must answer says it). ``then``: work that follows, whose reply
    comes after this one (the door shows this one first: "Saving…", "Syncing…"). ``ask``: a
    question the person wants answered now (❓ under a question typed while a draft waited).
    ``unbutton``: the pressed message's buttons go ("*": all of them; else those for that item).
    ``receipt``: what became of a capture (``rag.capture.Receipt``), for a door that shows it as such."""

    text: str
    buttons: list[list[Button]] = field(default_factory=list)
    refused: str = ""
    how: str = "message"  # under a press: "alert", "brief" or "message"
    private: bool = False
    quiet: bool = False
    then: Callable[[], Awaitable["Reply"]] | None = None
    ask: str = ""
    unbutton: str = ""
    quote: bool = False  # (a chat) shown as a reply quoting the person's message
    receipt: object = None  # a capture's receipt (its status, the note's address), when the reply is one
    wait: float = 0.0  # (a "slow_down" refusal) seconds until the person may ask again


def refusal(reason: str, text: str, how: str = "alert", **more) -> Reply:
    """A refusal: ``text`` said, for ``reason`` (``bot.chat.words.REFUSALS``' keys, or a use case's own)."""
    return Reply(text, refused=reason, how=how, **more)


@dataclass
class AnswerView:
    """An answer as every door shows it. ``text``: the answer (Markdown: the LLM's words, the
    passages, or the refusal) and, under an LLM's answer, the quote of the note it stands on;
    ``notices``: what the person is told beside it (a sentence dropped, their message cut);
    ``sources``: the notes it cites, or else the closest ones, under ``sources_title``;
    ``citations``: the cited ones (their own links are the links the text may hold);
    ``withdrawn``: what streamed was the LLM's answer, and the notes do not back it: the final
    text replaces it; ``root``: the notes folder a note file is named in; ``asked``: the use case's
    result (``bot.usecases.results.Asked``), for ``Session.undelivered``."""

    question: str
    text: str
    notices: list[str]
    sources: list
    sources_title: str
    citations: list
    answer_id: str | None
    buttons: list[list[Button]]
    withdrawn: bool = False
    root: object = None
    asked: object = None


@dataclass
class Heard:
    """A voice clip or a photo as heard or read: ``line`` (its words on one line, for the status
    message), ``text`` (the words to ask or capture), ``kind`` ("ask", "note", "remember", or
    "" when there is nothing more to do), ``seen`` (a photo's text, asked with its caption),
    ``reply`` (what to say instead of an answer: a receipt, or why nothing was heard)."""

    line: str = ""
    text: str = ""
    kind: str = ""
    seen: str = ""
    reply: Reply | None = None
