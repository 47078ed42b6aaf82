"""The ``gaps`` section of ``config.yaml`` (``rag.sections`` holds the others and what they share):
what a person's knowledge gaps may cost."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from rag.sections import Duration, Section


class GapsConfig(Section):
    """What a person's knowledge gaps may cost (``rag.answer.gaps``, ``bot.usecases.gaps``)."""

    LIVE: ClassVar[tuple[str, ...]] = ("max_open", "check_budget")
    max_open: int = Field(default=200, ge=1, description="open knowledge gaps kept per person and Leanote user; a new "
                          "one past this dismisses the one asked least recently")
    check_budget: Duration = Field(default=20.0, description="search time the closing check after a pass may take; "
                                   "the gaps it did not reach are checked after the next pass")
