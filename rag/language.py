"""One language per answer: the question's. A question with Chinese (or other CJK) characters
gets everything around its answer in Chinese: the refusal, every notice, the headers over the
sources; any other question gets them in English. Every door takes them from here, so a quick
refusal, an answer withdrawn by the check and the passages shown instead read the same way.
"""

from __future__ import annotations

import re

from rag.config import Settings

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")

LABELS = {
    "sources": ("来源", "Sources"),
    "closest": ("最接近的笔记", "Closest notes"),
    "reading": ("读的笔记", "Reading"),
}


def chinese(question: str) -> bool:
    """The question is asked in Chinese (or another CJK script)."""
    return bool(_CJK.search(question))


def say(question: str, zh: str, en: str) -> str:
    """``zh`` for a question asked in Chinese, else ``en``."""
    return zh if chinese(question) else en


def label(question: str, name: str) -> str:
    """A header over an answer's notes (``LABELS``) in the question's language."""
    return say(question, *LABELS[name])


def refusal(settings: Settings, question: str) -> str:
    """What is shown when the notes hold no answer: ``answer.refusal`` for a question in
    Chinese, ``answer.refusal_english`` for one in English. (The prompt asks the model for
    ``answer.refusal`` whatever the language: that phrase is how its reply is read.)"""
    return settings.answer.refusal if chinese(question) else settings.answer.refusal_english
