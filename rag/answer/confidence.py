"""Before the LLM is asked: names in the question that none of the person's notes mention.

A small model given passages about something else answers anyway, from what it knows:
asked how Flink's watermarks work with notes that never mention Flink, a 1.5B Qwen
explains watermarks fluently and cites whichever passage came first. What it was asked
about is a *name*: a tool, a library, a command, a dish. When the question names one
that no note of this person contains, their notes cannot answer it, whatever the
search found nearest; the answer says so, and which name it was.

A name is a Latin-script word the person wrote on purpose:

- in a question with Chinese (or other CJK) text, every Latin word of two letters or
  more (``Ansible``, ``firewall-cmd``, ``gradle-wrapper.properties``);
- in an English question, a word capitalised where a sentence does not begin
  (``Flink``), with capitals inside (``NSProxy``, ``HPACK``), with digits (``log4j``) or
  joined by ``.`` or ``_`` (``retry_count``): ordinary words (``watermarks``,
  ``out-of-order``) are not names; notes say them differently.

A possessive or an acronym's plural is no part of a name (``Sentinel's`` is ``Sentinel``,
``JDKs`` is ``JDK``).

A name counts as mentioned when any chunk of the person's notes holds it as a term of
the search index (the same tokenizer: ``rag.index.lexical``) or, spelled inside a longer word,
in the text of a chunk the search found (``postgres`` in ``PostgreSQL``), or when the search
found it written in Chinese: one of its Chinese forms (``rag.index.translate.renderings``:
CC-CEDICT's words and proper names) is a term of the title, heading or text of one of the
best chunks found (those the LLM would read).
``Atomic Habits`` asked of 《原子习惯》 (原子, 习惯), ``Hunan`` of a note on 湖南 dishes, ``North
Indian`` of one on 北印度 curry: Chinese notes write those in characters, so their absence in
Latin script says nothing, while a tool's name (``Flink``, ``Ansible``) has no Chinese form
and is looked up as written. CJK words are not judged: paraphrase changes them (``好几回``
for ``多次``) as often as it keeps them.

What it holds back, and what it never should, is measured on the dev set: docs/answers.md.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

from rag.index.lexical import MAX_TERM_CHARS, STOPWORDS, WORD_RUNS, SparseVector, term_id, tokenize

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_LETTERS = re.compile(r"[A-Za-z]")
_SENTENCE_START = re.compile(r"(?:^|[.!?;:]\s+|\n)\s*[\"'“‘(]*$")
_POSSESSIVE = re.compile(r"['’]s?$")
_PLURAL = re.compile(r"^([A-Z][A-Z0-9]+)s$")  # JDKs, APIs, GPUs: the name's plural
MAX_NAMES = 8  # looked up per question, at most


def names(question: str) -> list[str]:
    """The names a question uses, lowercased as the index holds them, in order."""
    cjk = bool(_CJK.search(question))
    found: list[str] = []
    for m in WORD_RUNS.finditer(question):
        if m.lastgroup != "word":
            continue
        word = _PLURAL.sub(r"\1", _POSSESSIVE.sub("", m.group()))
        if len(_LETTERS.findall(word)) < 2 or word.lower() in STOPWORDS or len(word) > MAX_TERM_CHARS:
            continue
        if not cjk and not _named_in_english(word, question[: m.start()]):
            continue
        if word.lower() not in found:
            found.append(word.lower())
    return found[:MAX_NAMES]


def _named_in_english(word: str, before: str) -> bool:
    if any(c.isdigit() for c in word) or re.search(r"[A-Za-z][._][A-Za-z0-9]", word):
        return True  # log4j, http2, retry_count, gradle-wrapper.properties
    if word[0].isupper() and not _SENTENCE_START.search(before):
        return True  # Flink, HPACK, NSProxy mid-sentence
    return any(c.isupper() for c in word[1:])  # camelCase, NSProxy, ALLCAPS even where a sentence begins


def unknown_names(question: str, holds: Callable[[str], bool], texts: Iterable[str] = (),
                  translate: Callable[[str], frozenset[str]] | None = None, best: int = 6) -> list[str]:
    """The question's names that no note mentions: ``holds(term)`` says whether any chunk
    of the person's holds the term; ``texts`` are chunks the search found, best first (a name
    inside a longer word there counts as mentioned, and so does a name whose Chinese forms,
    ``translate(name)``, hold a term of one of the ``best`` first)."""
    wanted = names(question)
    if not wanted:
        return []
    texts = list(texts)
    seen = "\n".join(texts).lower()
    unknown = [n for n in wanted if n not in seen and not holds(n)]
    if unknown and translate is not None:
        found = {t for text in texts[:best] for t in tokenize(text)}
        unknown = [n for n in unknown if not (translate(n) & found)]
    return unknown


def term_query(term: str) -> SparseVector:
    """A sparse query for one term, as the index's vectors hold it."""
    return SparseVector([term_id(term)], [1.0])


def as_written(question: str, name: str) -> str:
    """A name as the question spells it (``names`` gives it lowercased)."""
    i = question.lower().find(name)
    return question[i : i + len(name)] if i >= 0 else name
