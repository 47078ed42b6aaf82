"""Words a voice question probably meant: Whisper base writes Chinese sound-alikes (备份 → 被份,
线程池 → 现成词, 坐标 → 作标, 视图 → 是图), which neither BM25 nor the embedding connects to the
note's word. The candidates a first search found hold the person's own words; a run of the
transcript that no candidate holds but that sounds exactly like (the same toneless pinyin) a word
they hold is taken to mean that word, and the word joins the search as one more BM25 ranking.

Only for what was heard (a typed question means its words; measured: adding them to typed
questions lost one of 23), only words of 2 to 4 characters that are not common Chinese (jieba's
dictionary counts them at most ``COMMON`` times: 不是, 可以, 实现 sound like too much to mean
anything), at most ``MOST``. Needs ``pypinyin``
(the speech extra); without it nothing is added."""

from __future__ import annotations

import logging
import re
from collections import Counter
from functools import lru_cache
from typing import Iterable

from rag.index.lexical import frequency, jieba

log = logging.getLogger(__name__)

MOST = 8
COMMON = 3000
_CJK = re.compile(r"[\u4e00-\u9fff]+")


@lru_cache(maxsize=1)
def _pinyin():
    try:
        from pypinyin import lazy_pinyin
    except ImportError:
        log.info("pypinyin is not installed: voice questions are searched as heard")
        return None
    return lazy_pinyin


@lru_cache(maxsize=65536)
def _sound(word: str) -> str:
    return " ".join(_pinyin()(word))


def sound_alikes(heard: str, texts: Iterable[str], most: int = MOST) -> list[str]:
    """The words of ``texts`` that runs of ``heard`` sound like but are not, in the order heard
    (longest run first at each place; each word once)."""
    if _pinyin() is None or not _CJK.search(heard):
        return []
    words: Counter[str] = Counter()
    cut = jieba().cut
    for text in texts:
        for run in _CJK.findall(text):
            words.update(w for w in cut(run) if 2 <= len(w) <= 4)
    by_sound: dict[str, str] = {}
    for word, _ in words.most_common():  # the commonest of the candidates' words sounding alike
        if frequency(word) <= COMMON:
            by_sound.setdefault(_sound(word), word)
    found: list[str] = []
    for run in _CJK.findall(heard):
        i = 0
        while i < len(run) and len(found) < most:
            for size in (4, 3, 2):
                piece = run[i:i + size]
                if len(piece) < size or piece in words:
                    continue
                meant = by_sound.get(_sound(piece))
                if meant is not None:
                    if meant not in found:
                        found.append(meant)
                    i += size
                    break
            else:
                i += 1
    return found
