"""How an answer ends when it is not the LLM's reply as it stands: the refusal and the closest
notes, the best passages when the LLM is down, too slow or said nothing of the evidence, and the
LLM's reply as the answer when it stands on the evidence (``rag.answer.support``), with the
note's own words it stands on quoted under it. Every notice is said in the question's language.
"""

from __future__ import annotations

import re

from rag import language
from rag.answer import support
from rag.language import say
from rag.answer.copies import COPY_CHARS
from rag.answer.evidence import Evidence
from rag.answer.gate import closest, plausible
from rag.answer.types import MAX_PASSAGES, Answer, Citation, Trace, citation, extractive, quoted
from rag.config import Settings
from rag.index.excerpt import excerpt
from rag.model import Hit

LLM_DOWN_ZH = "（语言模型暂时不可用，以下是笔记里最相关的段落。）"
LLM_DOWN_EN = "(The language model is unavailable right now; here are the most relevant passages of your notes.)"
# The LLM refused or said nothing of its own, and the best passages are about the question
# (``plausible``): they are shown, under a line saying the notes hold no direct answer.
LLM_NO_ANSWER_ZH = "（模型没能从这些段落里找到直接的回答。以下是笔记里最相关的段落。）"
LLM_NO_ANSWER_EN = "(The model found no direct answer in these passages. Here are the most relevant ones.)"
# The LLM's answer does not stand on the evidence (``rag.answer.support``): never shown. The
# passages when they are about the question, else the refusal and the closest notes' titles.
LLM_UNSUPPORTED_ZH = "（模型写的回答在你的笔记里找不到依据，没有显示。以下是笔记里最相关的段落。）"
LLM_UNSUPPORTED_EN = "(The model's answer is not backed by your notes, so it is not shown. Here are the most relevant passages.)"
LLM_UNSUPPORTED_REFUSED_ZH = "（模型写了一段你的笔记里没有依据的回答，没有显示。）"
LLM_UNSUPPORTED_REFUSED_EN = "(The model wrote an answer your notes do not back; it is not shown.)"
# Units of an answer that stand on no block were left out of it (``rag.answer.support``).
LEFT_OUT_ZH = "（另有 {n} 句在你的笔记里找不到依据，已略去。）"
LEFT_OUT_EN = "({n} sentence(s) the model wrote are not backed by your notes and were left out.)"
# An answer to a question in another language copied more of the note than ``rag.answer.copies`` shows.
COPY_CUT_ZH = "（模型抄录的笔记原文较长，其余部分已略去，全文见来源里的笔记。）"
COPY_CUT_EN = "(The model copied more of the note's own text than is shown here; the whole note is under Sources.)"
# Under an LLM's answer, the note's own words it stands on (``answer.quote_chars``).
QUOTE_LEAD_ZH = "笔记原文 "
QUOTE_LEAD_EN = "In your note: "
TOO_SLOW_ZH = "（这台机器上的语言模型太慢，在时限内读不完最相关的一段笔记，以下是笔记里最相关的段落。）"
TOO_SLOW_EN = ("(The language model is too slow here to read the most relevant passage within its time limit; "
               "here are the most relevant passages of your notes.)")
SOURCES_FIRST = 3  # notes shown before the LLM reads, the best first, one per note
REPLY_KEPT = 4000  # characters of the LLM's reply kept in the trace

_QUOTE_SENTENCE = re.compile(r"[。！？!?；;\n]")
_SPACE = re.compile(r"\s+")
_CITE = re.compile(r"\[\d{1,3}\]|[*`_#>]")  # markers, and Markdown's marks around the words


def copied(words: str, answer: str) -> bool:
    """Does ``answer`` hold most of ``words`` (the note's words a quote would show) as they are:
    sentences of 8 characters or more, by length, markers, Markdown's marks and spacing aside?"""
    shown = _SPACE.sub("", _CITE.sub("", answer))
    parts = [p for p in (_SPACE.sub("", _CITE.sub("", x)).strip("…-") for x in _QUOTE_SENTENCE.split(words))
             if len(p) >= 8]
    total = sum(map(len, parts))
    return bool(total) and 2 * sum(len(p) for p in parts if p in shown) >= total


def language_notice(question: str, zh: str, en: str) -> str:
    return say(question, zh, en)


def refusal(settings: Settings, question: str, top: list[Hit], standalone: str | None = None,
            rarity: dict[str, float] | None = None) -> Answer:
    """The refusal phrase, and the titles of the closest notes that are about the question
    (``standalone``, as searched; ``gate.closest`` with ``rarity``), one per note, at most
    ``answer.closest_notes``: a note about something else is not named."""
    near = closest(standalone or question, top, rarity, settings.answer.closest_notes)
    cited = [citation(n, hit, question) for n, hit in enumerate(near, 1)]
    return Answer(question, language.refusal(settings, question), used_llm=False, grounded=False, closest=cited)

def llm_down(settings: Settings, question: str, top: list[Hit], trace: Trace, err: Exception) -> Answer:
    """The LLM failed (down, timing out, model missing): the best passages, with a plain
    notice. The details (host, model, what failed) are for the operator: the log, the trace
    of ``ask --trace``, doctor. Whoever asked in chat gets the notice."""
    trace.llm_error = str(err)
    trace.decision, trace.outcome = "the LLM failed: extractive answer", "fallback"
    answer = extractive(question, top, refusal=language.refusal(settings, question))
    answer.notice = language_notice(question, LLM_DOWN_ZH, LLM_DOWN_EN)
    return answer

def grounded(settings: Settings, question: str, standalone: str, text: str, check: support.Check, blocks: list[Evidence],
              top: list[Hit], trace: Trace, rarity: dict[str, float] | None = None) -> Answer:
    """The LLM's reply as the answer when it stands on the evidence (``rag.answer.support``):
    the units that do, each citing its block, and a line saying how many were left out.
    Otherwise (a refusal, nothing of its own, or too little of it from the evidence) never
    the reply: the best passages when they are about the question (``plausible``), else the
    refusal and the closest notes' titles (``rarity``: how rare the question's words are, by
    which both are judged about the question: ``rag.answer.gate``)."""
    phrase = settings.answer.refusal
    trace.reply = text[:REPLY_KEPT]
    trace.support = check.summary()
    trace.units = [{"text": v.text[:400], "kind": v.kind, "blocks": v.blocks, "share": v.share,
                    "invented": v.invented, **({"cut": True} if v.cut else {})}
                   for v in check.verdicts if v.kind != "blank"]
    trace.citing = support.verdict(text, check, phrase)
    by_n = {b.n: b for b in blocks}
    if trace.citing in ("cited", "inferred"):
        citations = [citation(n, by_n[n], question) for n in check.cited]
        marks = " ".join(f"[{n}]" for n in check.cited)
        trace.decision = (f"answered by the LLM, citing {marks}" if trace.citing == "cited" else
                          f"answered by the LLM without markers; cited by what its sentences follow: {marks}")
        if check.dropped:
            trace.decision += f"; {len(check.dropped)} of {len(check.saying)} sentences left out (no block holds them)"
        cut = sum(v.cut for v in check.verdicts)
        if cut:
            trace.decision += f"; {cut} more copied from the note left out (past {COPY_CHARS} characters copied)"
        trace.outcome = "llm"
        answer = Answer(question, check.text.strip(), used_llm=True, grounded=True, citations=citations)
        answer.quote = quote(settings, question, check, by_n, citations)
        notices = [language_notice(question, LEFT_OUT_ZH, LEFT_OUT_EN).format(n=len(check.dropped))] if check.dropped else []
        if cut:
            notices.append(language_notice(question, COPY_CUT_ZH, COPY_CUT_EN))
        if notices:
            answer.notice = " ".join(notices)
        return answer
    why = {"refused": "the LLM found no answer", "nothing": "the LLM said nothing of its own (the question or the "
           "headers back)", "uncited": "no sentence of the LLM's answer stands on the evidence",
           "partly": f"too little of the LLM's answer stands on the evidence ({check.summary().split(';')[0]}; "
                     f"at least {support.MIN_SHARE:.0%} must)"}[trace.citing]
    about, how = plausible(standalone, top, rarity)
    unsupported = trace.citing in ("uncited", "partly")
    if about:
        trace.decision = f"{why}: its best passages instead ({how})"
        trace.outcome = "llm_passages"
        # only the notes whose passage is about the question: the best is; the next may not be
        near = {h.note_id for h in closest(standalone, top, rarity, MAX_PASSAGES)} or {h.note_id for h in top}
        answer = extractive(question, [h for h in top if h.note_id in near], refusal=language.refusal(settings, question))
        answer.used_llm = True
        if answer.citations:
            answer.notice = (language_notice(question, LLM_UNSUPPORTED_ZH, LLM_UNSUPPORTED_EN) if unsupported
                             else language_notice(question, LLM_NO_ANSWER_ZH, LLM_NO_ANSWER_EN))
        return answer
    trace.decision = f"{why}: the refusal and the closest notes ({how})"
    trace.outcome = "llm_refused"
    answer = refusal(settings, question, top, standalone, rarity)
    answer.used_llm = True
    if unsupported:
        answer.notice = language_notice(question, LLM_UNSUPPORTED_REFUSED_ZH, LLM_UNSUPPORTED_REFUSED_EN)
    return answer

def quote(settings: Settings, question: str, check: support.Check, by_n: dict[int, Evidence], citations: list[Citation]) -> str:
    """The note's own words the answer stands on, to show under it: the sentences of the block
    most of its sentences stand on that match what they say, about ``answer.quote_chars``
    characters of them ("" when that is 0), so what the answer says can be read beside what
    the note says without opening it."""
    width = settings.answer.quote_chars
    where = support.behind(check)
    if not width or where is None:
        return ""
    n, said = where
    words = excerpt(by_n[n].text, said, width)
    if copied(words, check.text):  # the answer is the note's words already (copied, as asked in English)
        return ""
    cited = next(c for c in citations if c.n == n)
    return quoted(cited, words, language_notice(question, QUOTE_LEAD_ZH, QUOTE_LEAD_EN))

def sources(question: str, blocks: list[Evidence]) -> list[Citation]:
    """The notes the evidence comes from, best first, one citation per note (its first block)."""
    out, seen = [], set()
    for b in blocks:
        if b.note_id not in seen and len(out) < SOURCES_FIRST:
            seen.add(b.note_id)
            out.append(citation(b.n, b, question))
    return out
