"""After the LLM has answered: does it refuse? And the words a text is compared by.

Real small models (Qwen2.5-Coder 1.5B and 0.5B, docs/answers.md) refuse in their own words
("我们笔记里没有相关内容。", "The notes do not mention …"), not with the exact phrase asked for:
``refuses`` recognises a refusal by meaning, in the answer's opening. Which sentences of an
answer stand on the evidence is ``rag.answer.support``.

``words``: CJK character bigrams, Latin words of three letters or more (lowercased) and numbers.
"""

from __future__ import annotations

import re

_MARKER = re.compile(r"[\[【]\s*(\d{1,3}(?:\s*[,，、]\s*\d{1,3})*)\s*[\]】]")
_CJK_RUN = re.compile(r"[\u3400-\u9fff]+")
_LATIN = re.compile(r"[a-z0-9_][a-z0-9_.\-]{2,}|\d+")

_SORRY = r"(?:(?:抱歉|对不起|很抱歉|sorry|i'?m sorry|unfortunately)[，,。.!！\s]*)?"
_REFUSALS = re.compile(
    # the notes / excerpts do not hold it (anywhere in the opening)
    r"(?:笔记|片段|资料|材料|上下文|提供的信息)\S{0,12}?(?:里|中|内)?\S{0,4}?(?:没有|没|并没有|并未|未|无|不)"
    r"(?:找到|提到|提及|涉及|包含|记录|相关|关于|说明|写|给出|信息|答案)"
    r"|(?:没有|未|无法|不能)(?:在)?\S{0,6}?(?:笔记|片段|资料)\S{0,6}?(?:找到|看到|获得)"
    r"|(?:根据|从)\S{0,12}?(?:笔记|片段|资料|内容)\S{0,4}?[，,]?\s*(?:我)?(?:无法|不能|没法)"
    r"|(?:无法|无从|不能)回答"
    r"|\b(?:not|nothing) (?:in|about|mentioned in|covered (?:by|in)|found in) (?:my|your|the|these|this) "
    r"(?:notes?|excerpts?|evidence|context)"
    r"|\b(?:notes?|excerpts?|evidence|context) (?:do(?:es)?n'?t|do(?:es)? not|did not|didn'?t) "
    r"(?:contain|mention|say|cover|include|provide|have)"
    # a reply that opens by declining ("无法回答", "I cannot answer"), not one that says
    # something cannot be done ("加了它也不能确定完全不锁表")
    rf"|^{_SORRY}(?:我)?(?:无法|不能|没法)(?:根据|从|回答|确定|给出|得知|判断)"
    rf"|^{_SORRY}(?:i )?(?:cannot|can't|can not|am unable to|couldn't|could not) (?:answer|find|determine|tell)"
    rf"|^{_SORRY}(?:there is )?no (?:relevant |such )?(?:information|mention|answer)\b"
    r"|^(?:抱歉|对不起|很抱歉|sorry|i'?m sorry)",
    re.I,
)
OPENING = 80  # characters of the answer a refusal is looked for in


def words(text: str) -> set[str]:
    """CJK bigrams, Latin words of three letters or more, numbers."""
    text = text.lower()
    out = set(_LATIN.findall(text))
    for run in _CJK_RUN.findall(text):
        out.update(run[i : i + 2] for i in range(len(run) - 1))
    return out


def refuses(text: str, refusal: str = "") -> bool:
    """The answer says the notes do not answer: the configured phrase, or the same in
    other words at its opening. A reply of markers only ("[1]", "[1] [2][3]": the model
    pointing at blocks) or of nothing is no refusal: it says nothing (``Reading.says_something``)."""
    opening = _MARKER.sub("", text).strip()[:OPENING]
    if not opening:
        return False
    if refusal and refusal in opening:
        return True
    return bool(_REFUSALS.search(opening))
