"""After the LLM has answered: does the answer stand on its evidence, and on which blocks?

What real small models do with evidence blocks, seen with Qwen2.5-Coder 1.5B and 0.5B
(docs/answers.md, "Answers from a real model"), and what this module makes of it:

- They refuse in their own words ("我们笔记里没有相关内容。", "The notes do not mention
  …"), not with the exact phrase asked for: ``refuses`` recognises a refusal by meaning,
  in the answer's opening.
- They paste the evidence headers (``[1] 提拉米苏的做法 (菜谱 / 甜品)``) or the question
  back, with markers, saying nothing: a pasted header is no sentence, a marker counts as
  a citation only in a sentence that says something of its own (``says_something``: a
  word the question does not hold), and an answer with no such sentence is
  no answer.
- They often answer from a block without typing a single ``[n]``: a sentence that
  quotes or closely follows one block (``INFER_SHARE``, 40 % of its words are that
  block's), a line of their own code that copies one (``INFER_CODE_SHARE``), or a short
  answer whose distinctive words one block alone holds gets the block's citation when
  the model gave none (``inferred``); the trace marks it so.

Words are CJK character bigrams, Latin words of three letters or more (lowercased) and numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_MARKER = re.compile(r"[\[【]\s*(\d{1,3}(?:\s*[,，、]\s*\d{1,3})*)\s*[\]】]")
_CJK_RUN = re.compile(r"[\u3400-\u9fff]+")
_LATIN = re.compile(r"[a-z0-9_][a-z0-9_.\-]{2,}|\d+")
_SENTENCE = re.compile(r"(?<=[。！？!?；;：])|(?<=[.:])\s+|\n+")
_ONLY_MARKERS = re.compile(r"^[\s\[\]【】\d,，、。.]*$")
MIN_OWN_WORDS = 1  # a sentence that says something has a word the question lacks
INFER_SHARE = 0.4  # of a sentence's words found in one block: it follows that block
INFER_CODE_SHARE = 0.8  # a line of the reply's own code follows a block only when it is nearly copied
INFER_MIN_WORDS = 4  # shorter sentences follow a block only when it alone holds their distinctive words
_FENCE = re.compile(r"^\s*(```|~~~)")

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


@dataclass
class Reading:
    """What an answer's text stands on."""

    text: str  # the answer, inferred markers appended to their sentences
    marked: list[int] = field(default_factory=list)  # blocks cited with a marker in a sentence that says something
    inferred: list[int] = field(default_factory=list)  # blocks whose text a sentence follows, the model citing none
    says_something: bool = False  # any sentence with words of its own

    @property
    def cited(self) -> list[int]:
        return self.marked or self.inferred


def sentences(text: str) -> list[str]:
    """The answer's sentences; markers standing after a sentence's end belong to it."""
    out: list[str] = []
    for piece in _SENTENCE.split(text):
        if not piece or not piece.strip():
            continue
        if out and _ONLY_MARKERS.match(piece):
            out[-1] += piece
        else:
            out.append(piece)
    return out


def _copied_header(sentence: str, headers: dict[int, set[str]]) -> bool:
    """A line that is an evidence header pasted back: ``[n]`` and words of block n's header only."""
    m = _MARKER.match(sentence.strip())
    if not m:
        return False
    rest = words(sentence[sentence.index(m.group()) + len(m.group()):])
    return any(rest <= headers.get(int(x), set()) for x in re.findall(r"\d+", m.group(1)))


def _sole_holder(own: set[str], block_words: dict[int, set[str]]) -> int | None:
    """The one block holding all of a short sentence's words the question lacks (a name,
    a number: "De Bruijn 序列" for "……这利用的是哪种序列？"), when they are distinctive: a
    Latin word or number among them, or two CJK bigrams; None when no block or several do."""
    if not own or not (any(not _CJK_RUN.fullmatch(w) for w in own) or len(own) >= 2):
        return None
    holders = [n for n, bw in block_words.items() if own <= bw]
    return holders[0] if len(holders) == 1 else None


def read(text: str, question: str, blocks: dict[int, tuple[str, str]]) -> Reading:
    """``blocks``: number -> (header as the prompt showed it, text). The markers that count,
    the citations to infer, and whether the answer says anything at all."""
    asked = words(question)
    headers = {n: words(header) for n, (header, _) in blocks.items()}
    block_words = {n: words(header + "\n" + body) for n, (header, body) in blocks.items()}
    reading = Reading(text)
    own_sentences: list[tuple[str, set[str], bool]] = []
    code = False  # inside a fenced code block of the reply
    for sentence in sentences(text):
        if _FENCE.match(sentence):
            code = not code
            continue
        if _copied_header(sentence, headers):
            continue
        mine = words(_MARKER.sub(" ", sentence))
        own = mine - asked
        if len(own) < MIN_OWN_WORDS:
            continue
        reading.says_something = True
        own_sentences.append((sentence, mine, code))
        for m in _MARKER.finditer(sentence):
            for x in re.findall(r"\d+", m.group(1)):
                n = int(x)
                if n in blocks and n not in reading.marked:
                    reading.marked.append(n)
    if reading.marked or not reading.says_something:
        return reading
    out = text
    for sentence, mine, in_code in own_sentences:
        if len(mine) < INFER_MIN_WORDS:
            n = None if in_code else _sole_holder(mine - asked, block_words)
        else:
            share, n = max(((len(mine & bw) / len(mine), n) for n, bw in block_words.items()), default=(0.0, None))
            if share < (INFER_CODE_SHARE if in_code else INFER_SHARE):
                n = None
        if n is not None:
            if n not in reading.inferred:
                reading.inferred.append(n)
            if in_code:
                continue  # a marker inside code would change the code; the citation stands below it
            stripped = sentence.rstrip()
            body = stripped.rstrip("。！？!?；;.")
            out = out.replace(stripped, f"{body}[{n}]{stripped[len(body):]}", 1)
    reading.text = out
    return reading


def citing(text: str, reading: Reading, refusal: str = "") -> str:
    """What a reply stands on, as ``Trace.citing`` names it: "refused", "nothing" (no
    words of its own), "cited" (markers), "inferred" or "uncited" (follows no block)."""
    if refuses(text, refusal):
        return "refused"
    if not reading.says_something:
        return "nothing"
    return "cited" if reading.marked else "inferred" if reading.inferred else "uncited"
