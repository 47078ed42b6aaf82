"""What reading a clip or an image gives back, the engines' small interfaces, and the errors
a person is told (each says what to do; none loses what they sent)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from rag.errors import UserError

SPEECH_EXTRA = "pip install 'leanote-rag[speech]'"
OCR_EXTRA = "pip install 'leanote-rag[ocr]'"


class MediaError(UserError):
    """A clip or image that cannot be read as it is: the message is for the person who sent it."""


class NotInstalled(MediaError):
    """The extra that reads this kind of file is not installed (or turned off in ``media``)."""


class NoSpeech(MediaError):
    def __init__(self):
        super().__init__("没听到说话的声音。 / No speech found in that clip.")


class NoText(MediaError):
    def __init__(self):
        super().__init__("图里没认出文字。 / No text found in that image.")


class Unreadable(MediaError):
    """A file that does not decode as audio (or as an image)."""


class TooLong(MediaError):
    pass


class TooBig(MediaError):
    pass


@dataclass
class Transcript:
    """A clip's words: ``text`` one line per piece, ``language`` as detected (or given)."""

    text: str
    language: str = ""
    seconds: float = 0.0  # the clip's length
    took: float = 0.0  # wall time of the work (waiting in line not counted)

    def line(self, width: int = 300) -> str:
        """The words on one line, cut at ``width`` characters: what a person sees first."""
        one = " ".join(self.text.split())
        return one if len(one) <= width else one[: width - 1] + "…"


@dataclass
class Reading:
    """An image's text, line by line in reading order."""

    lines: list[str] = field(default_factory=list)
    took: float = 0.0

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class Transcriber(Protocol):
    """Words from 16 kHz mono samples. ``language``: "" to detect it."""

    name: str

    def transcribe(self, samples: np.ndarray, language: str = "") -> tuple[str, str]:
        """(the words, the language)."""
        ...


class Reader(Protocol):
    """Text lines from an image file's bytes (already checked to be an image)."""

    name: str

    def read(self, data: bytes) -> list[str]:
        ...
