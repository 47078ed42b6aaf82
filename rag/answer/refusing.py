"""The refusal before the LLM, and what a refusal shows.

``judge`` reads a question's search as the gate does (``rag.answer.gate``: what it weighs goes
into the trace, every time) and says whether to refuse without asking the LLM: a name no note
mentions (``answer.refuse_unknown_names``; ``rag.answer.confidence``), or evidence too weak to
be about the question (``gate.too_weak``). The names are read in the person's own words only: a
photo's text (``seen``) is what they saw, not what they ask about.

``rarity`` weighs the question's words by how rare they are in the person's notes, so that what
a refusal shows (the passages after the model's refusal, the closest notes) is about what the
question says and not about the words every note shares (``gate.closest``).

Both run in the answer service's search threads: they read the index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from rag.answer import gate
from rag.answer.confidence import as_written, term_query, unknown_names
from rag.config import Settings
from rag.index.translate import chinese_terms, is_english, renderings
from rag.language import say
from rag.model import Hit


@dataclass
class Judged:
    """What the gate made of a question's search: ``why`` it is refused before the LLM ("" when
    it is not), the ``names`` no note mentions as the question writes them (the refusal says
    them when they are why), the ``signals`` weighed (``gate.signals``, for the trace), and the
    question's words' ``rarity`` when it is refused (for the closest notes)."""

    why: str = ""
    names: list[str] = field(default_factory=list)
    signals: dict = field(default_factory=dict)
    rarity: dict[str, float] | None = None
    for_names: bool = False

    def notice(self, question: str) -> str | None:
        """The line under a refusal for a name: ``你的笔记里没有提到 Flink。``."""
        if not self.for_names:
            return None
        return say(question, f"你的笔记里没有提到 {'、'.join(self.names)}。",
                   f"Your notes never mention {', '.join(self.names)}.")


def translated(settings: Settings, question: str) -> frozenset[str]:
    """An English question's Chinese words (``rag.index.translate``), as its search used them
    (usually made there already: looked up); the first may read the kept glossary."""
    if not settings.retrieval.translate_english:
        return frozenset()
    return chinese_terms(question, settings.state_dir)


def judge(index, settings: Settings, question: str, own: str, user_id: str, hits: list[Hit],
          scores: dict[str, float]) -> Judged:
    """Whether to refuse ``question`` (as searched) before the LLM, from its ``hits`` (and the
    reranker's ``scores``); ``own``: the person's own words of it, whose names are judged."""
    unknown = [as_written(own, n) for n in unknown_in(index, settings, own, user_id, hits)] if hits else []
    english = translated(settings, question)
    judged = Judged(names=unknown, signals=gate.signals(question, hits, english, unknown))
    if settings.answer.refuse_unknown_names and unknown:
        judged.why = (f"the notes never mention {', '.join(unknown)} (answer.refuse_unknown_names): "
                      f"refused without asking the LLM")
        judged.for_names = True
    else:
        judged.why = gate.too_weak(settings.answer, question, hits, scores, english)
    if judged.why:
        judged.rarity = rarity(index, question, user_id, settings)
    return judged


def unknown_in(index, settings: Settings, question: str, user_id: str, hits: list[Hit]) -> list[str]:
    """The names the question uses that no chunk of the user's holds, in Latin script or (the
    chunks found) in Chinese (``rag.answer.confidence``)."""
    def holds(term: str) -> bool:
        _, sparse = index.store.search(None, term_query(term), user_id, 1)
        return bool(sparse)

    return unknown_names(question, holds, [f"{h.title}\n{h.heading}\n{h.text}" for h in hits],
                         translate=partial(renderings, cache_dir=settings.state_dir), best=settings.answer.top_k)


def rarity(index, question: str, user_id: str, settings: Settings | None = None) -> gate.Rarity:
    """How rare each of the question's own words is in the user's notes (``gate.weight``: BM25's
    IDF over their chunks, each word's chunks counted up to ``gate.RARITY_CAP``); a few sparse
    lookups (6 ms p50 for the dev questions on the corpus here). With ``settings`` (and
    ``retrieval.translate_english``), an English question's words also carry how Chinese writes
    them (``Rarity.renderings``), by which ``gate.closest`` names a Chinese note."""
    words = gate.asked(question)
    if not words:
        return gate.Rarity()
    chunks = index.store.count_by_user().get(user_id, 0)
    out = gate.Rarity()
    for word in words:
        _, sparse = index.store.search(None, term_query(word), user_id, gate.RARITY_CAP)
        out[word] = gate.weight(max(chunks, len(sparse)), len(sparse))
    if settings is not None and settings.retrieval.translate_english and is_english(question):
        # the words Chinese can write, and the names it cannot (Flink: no note holding the rest is about it)
        out.renderings = {w: r for w in words if w.isascii() and (
            (r := renderings(w, settings.state_dir)) or as_written(question, w)[:1].isupper())}
        out.rendered = {}
        for word, forms in out.renderings.items():
            if not forms:
                out.rendered[word] = out[word]
                continue
            holding = 0
            for form in forms:
                _, sparse = index.store.search(None, term_query(form), user_id, gate.RARITY_CAP)
                holding = max(holding, len(sparse))
            out.rendered[word] = gate.weight(max(chunks, holding), holding)
    return out
