"""Which parts of an LLM's answer stand on the evidence: checked unit by unit, before it is shown.

A citation is a promise: what is shown as from the notes is in the notes. A small model on a
CPU cites the right note and still writes what the note does not say (a number, a reason, a
whole recipe from its own knowledge). So every unit of the reply (a sentence, a list line's
sentence, a fenced code block) is read against the evidence blocks the model was given:

- **filler**: nothing of its own once the talk about the excerpts (``根据 [1] 段落``,
  ``以下是步骤：``, a pasted block header, bare markers) is set aside, or a line introducing what
  follows (``配方如下：``). Shown beside supported units, never counted as an answer.
- **echo**: the question's own words back ("根据 [1] 段落，溏心蛋关火后要静置几分钟。", or "先切再焯。"
  picking one of the question's "先切再焯，还是先焯再切？"): nothing the evidence could bear out. Not
  shown, not counted; a reply of filler and echoes only is no answer.
- **supported** by block n: at least ``OWN_SHARE`` of its own words (the words the question
  lacks) are block n's, or, for a short unit, one block holds all of them; a code block's words
  ``CODE_SHARE``; and every **specific** it states is in the evidence: numbers with their unit
  (``2 颗``, ``150ml``, ``03:17``, ``两种``), versions, identifiers, flags, paths, Latin names.
  ``1碗大米和2碗水 [1]`` against a block saying ``大米 150ml，饮用水 1 升`` is not supported,
  whatever its marker says.
- **unsupported**: anything else. It is never shown as the notes' word: it is dropped from the
  answer (the trace keeps it, the answer says how many were left out).
- **repeat**: a unit that says again what an earlier one of the reply said (the same words,
  markers, list numbers, Markdown and punctuation aside): never shown twice, not counted. A
  small model in a loop writes the same block over and over (``rag.answer.service`` stops it).

The citation of a supported unit is the block the model marked when that block supports it,
else the block it follows (the marker is put in, before the unit's end). An answer whose
*supported share* (supported units among those that say something) is below ``MIN_SHARE`` is
not the notes' answer: the service shows the passages or the refusal instead
(``rag.answer.service``). ``Gate`` does the same while the reply streams: a unit is passed on
only once it is complete and checked, so nothing unsupported is ever on screen.

Words are the search index's terms (``rag.index.lexical.tokenize``: jieba's words, Latin words
and their parts, numbers) less single CJK characters; a block holds a word when its terms or its
text do (so a word cut differently in the note still counts). What a specific is, and where a
block holds one: ``rag.answer.specifics``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable

from rag.answer.grounding import refuses, words
from rag.answer.specifics import Body, Held, decoded, names, numbers, periods, terms  # noqa: F401 (numbers, names: what a unit states)
from rag.answer.units import _FENCE, _LIST_PREFIX, _PARTIAL, _TABLE_RULE, Unit, split  # noqa: F401 (split: tests, bench)
from rag.index.lexical import tokenize

OWN_SHARE = 0.5  # of a unit's own words found in one block: it stands on that block
SHORT = 3  # a unit with fewer own words stands on a block only when that block holds them all
CODE_SHARE = 0.6  # of a code block's words found in one block
MIN_SHARE = 0.5  # of the units that say something, supported ones: below, the answer is not shown

_MARKER = re.compile(r"[\[【]\s*(\d{1,3}(?:\s*[,，、]\s*\d{1,3})*)\s*[\]】]")
_MARKER_SPACED = re.compile(r"\s*[\[【]\s*\d{1,3}(?:\s*[,，、]\s*\d{1,3})*\s*[\]】]")
_CJK = re.compile(r"[\u3400-\u9fff]")
# Talk about the excerpts, not about the question's subject: set aside before a unit's own
# words are counted (a sentence made only of it, and the question, says nothing).
_META = re.compile(
    r"(?:依据|引用)的?(?:片段|段落)?编号|根据|依据|按照|参考|结合|段落|片段|笔记|资料|原文|上述|以上|以下|如下|下面|上面|提到的?|提及|所述|记载|描述|"
    r"中的?内容|内容(?:中|里)?|可以看到|可以看出|可知|得知|总结(?:一下)?|总之|综上所述?|具体(?:来说|如下|步骤)?|"
    r"步骤|方法如下|答案|回答|信息|"
    r"\b(?:according to|based on|as (?:mentioned|stated|described) in|the (?:notes?|excerpts?|passages?|evidence)|"
    r"(?:note|excerpt|passage)s?|mention(?:s|ed)?|state[sd]?|says?|provided|following|here (?:is|are)|"
    r"steps?|answer|information)\b",
    re.I,
)
_WS = re.compile(r"\s+")
_TAG = re.compile(r"</?note-[0-9a-f]{6,}>")  # the prompt's markers around an excerpt, pasted back
_EMPHASIS = re.compile(r"[*_`~《》「」“”\"]+")
# A question whose answer is a note or a title ("哪篇笔记讲了…", "which note has…"): a title is an answer
_ASKS_FOR_A_NOTE = re.compile(r"哪(?:一)?(?:篇|本|份)|哪(?:个|些|条)(?:笔记|文章|文档|页面)|什么(?:笔记|文章|书)|标题|书名|"
                              r"\b(?:which|what)\s+(?:of my\s+)?(?:notes?|articles?|books?|pages?|documents?)\b|\btitles?\b",
                              re.I)
# A unit that only introduces what follows ("蒲烧汁的配方如下：", "**原因：**", "The reasons are:").
_INTRO = re.compile(r"[：:]\s*(?:\*\*|__)?\s*$")


def invented(unit_text: str, evidence: list[Held], question: Held,
             context: Callable[[str], set[str]] | None = None, roles: list[set[str]] | None = None,
             named: list[Held] | None = None) -> list[str]:
    """The specifics of a unit that neither the question holds nor a block holds in its place,
    as written: with one of the unit's other words (``context`` of its text; no number places
    another) near it in a block, in the same line when the block's lines are list items or table
    rows (``Held``): ``2 颗`` where the note says ``皮蛋 2 颗``, not ``泡 25-30 分钟`` where it says
    ``煮 25-30 分钟``, nor ``开水 120 毫升`` where the line says ``- 冷水 120 毫升`` and the next one
    ``- 开水 500 毫升``. A number stated bare (``120 毫升[1]``: no other word of the unit) answers
    what the question asks, so its place is judged by ``roles``, the question's words for each
    block (``Checker.roles``): ``120 毫升`` for "how much boiling water" stands where the note says
    ``开水 500 毫升``, not by ``冷水 120 毫升``. A period (``每天``, ``every year``) must be the one a
    block says near the unit's other words (``每天 6 月到 10 月开放`` where the note says ``每年`` is
    not). ``context`` None: the specifics need only be in a block (code). ``named``: the blocks a name
    is looked for in, when not ``evidence`` (a name is no quantity: any block of the evidence may hold
    it where the unit's numbers must be its own note's)."""
    text = _MARKER.sub(" ", unit_text)
    whole = set(context(text)) if context else set()
    wordy = {w for w in whole if not _NUMERIC.fullmatch(w)}  # "100 克 120 毫升": no number places another
    out: list[str] = []
    for value, unit, written in numbers(text):
        if question.holds_number(value, unit):
            continue
        near = wordy - terms(written)
        if not near and roles is not None:  # "葱 1 根": its one-character word places it
            near = _asked(text) - _asked(written)
        if near or roles is None:
            placed = any(h.places(h._number_at(value, unit), near) for h in evidence)
        else:
            placed = any(h.places(h._number_at(value, unit), role - terms(written), across=False)
                         for h, role in zip(evidence, roles))
        if not placed:
            out.append(written)
    for period, written, _, _ in periods(text):
        if question.holds_period(period):
            continue
        near = whole - terms(written)  # the number it is said with too: "每天 03:17"
        if not any(h.places(h._period_at(period), near) for h in evidence):
            out.append(written)
    for name in names(text):
        if question.holds_name(name):
            continue
        near = whole - terms(name) - {name}
        if not any(h.places(h._name_at(name), near) for h in (evidence if named is None else named)):
            out.append(name)
    return list(dict.fromkeys(out))


_NUMERIC = re.compile(r"[\d.:\-/]+")


# --- checking ---------------------------------------------------------------------------------


_NOT_SAID = re.compile(r"[\W_]+")


def said(text: str) -> str:
    """What a unit says, to know it again: its words without markers, list numbers, Markdown,
    punctuation and spacing, in lower case ("" when that leaves under two characters)."""
    key = _NOT_SAID.sub("", _LIST_PREFIX.sub("", _MARKER.sub("", text))).lower()
    return key if len(key) >= 2 else ""


@dataclass
class Verdict:
    """What one unit of the reply stands on."""

    text: str
    kind: str  # "filler", "echo" (the question back: not shown), "supported", "unsupported", "blank",
    # "repeat" (what an earlier unit said: not shown again)
    # ("intro", a line ending in a colon that stands on nothing, only until what it introduces is read;
    # "fragment", table rows without their table: "| 1:15 |" answers nothing, and is not shown)
    blocks: list[int] = field(default_factory=list)  # the blocks it stands on (its citations)
    share: float = 0.0  # of its own words in that block (or the best block, when unsupported)
    marked: list[int] = field(default_factory=list)  # the blocks the model's markers name
    invented: list[str] = field(default_factory=list)  # specifics no evidence holds
    code: bool = False
    display: str | None = None  # a table as shown: each row that stands citing its blocks in its last cell
    cut: bool = False  # it stands, and is left out all the same (``rag.answer.copies``: enough of the note copied)

    @property
    def block(self) -> int | None:
        return self.blocks[0] if self.blocks else None

    @property
    def says_something(self) -> bool:
        return self.kind in ("supported", "unsupported")


@dataclass
class Check:
    """A reply read against its evidence, unit by unit."""

    verdicts: list[Verdict]

    @property
    def saying(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.says_something]

    @property
    def supported(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.kind == "supported"]

    @property
    def dropped(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.kind == "unsupported"]

    @property
    def share(self) -> float:
        """Supported units among those that say something (1.0 when none says anything)."""
        saying = self.saying
        return len(self.supported) / len(saying) if saying else 1.0

    @property
    def cited(self) -> list[int]:
        """The blocks the supported units stand on, in order of first use."""
        return list(dict.fromkeys(n for v in self.supported for n in v.blocks))

    @property
    def repeated(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.kind == "repeat"]

    @property
    def invented_specifics(self) -> list[str]:
        return list(dict.fromkeys(s for v in self.verdicts for s in v.invented))

    @property
    def text(self) -> str:
        """What is shown: the supported and filler units, each supported one citing its block."""
        return "".join(shown(v) for v in self.verdicts)

    def summary(self) -> str:
        """One line for the trace."""
        saying = self.saying
        line = f"{len(self.supported)} of {len(saying)} sentences stand on the evidence"
        if self.repeated:
            line += f"; {len(self.repeated)} said again (shown once)"
        if self.dropped:
            line += "; left out: " + " | ".join(" ".join(v.text.split())[:120] + (
                f" (not in the notes: {', '.join(v.invented)})" if v.invented else "") for v in self.dropped)
        return line


def shown(v: Verdict) -> str:
    """A unit as shown: unsupported ones are left out (their line end kept); supported ones cite
    their blocks (the model's markers when they name exactly those blocks, else markers put in
    before the unit's end); filler carries no marker."""
    if v.kind in ("unsupported", "echo", "fragment", "repeat") or v.cut:
        return "\n" if v.text.endswith("\n") else ""
    if v.display is not None and v.kind == "supported":
        return v.display
    if v.kind == "filler":
        return _MARKER_SPACED.sub("", v.text)
    if v.kind != "supported" or not v.blocks or v.code:
        return v.text
    if sorted(set(v.marked)) == sorted(v.blocks) and all(
            int(x) in v.blocks for m in _MARKER.finditer(v.text) for x in re.findall(r"\d+", m.group(1))):
        return v.text
    text = _MARKER.sub("", v.text)
    body = text.rstrip()
    tail = text[len(body):]
    stem = body.rstrip("。！？!?；;.：:，,")
    return f"{stem}{''.join(f'[{n}]' for n in v.blocks)}{body[len(stem):]}{tail}"


def _context(text: str) -> set[str]:
    """A unit's words that place its specifics: all its words but the talk about the excerpts."""
    return terms(_META.sub("，", _LIST_PREFIX.sub("", _MARKER.sub("，", text))))


def _asked(text: str) -> set[str]:
    """A text's words: ``terms`` and its one-character Chinese words too (糖, 盐; the index's
    tokens, grammar left out), the talk about the excerpts aside."""
    return set(tokenize(_META.sub("，", text)))


def _title(header: str) -> str:
    """A block's title, from its header line ``[n] title (notebook › heading)``."""
    title = _MARKER.sub(" ", header, count=1).strip()
    cut = title.rfind(" (")
    return title[:cut] if cut > 0 and title.endswith(")") else title


def _own(text: str, asked: set[str]) -> set[str]:
    """A unit's own words: without markers, list prefixes, talk about the excerpts and the question's words."""
    text = _MARKER.sub("，", text)
    text = _LIST_PREFIX.sub("", text)
    text = _META.sub("，", text)
    return terms(text) - asked


class Checker:
    """Reads units of a reply against the evidence ``blocks`` (number -> (header, text)) for
    ``question``; the same for the whole reply (``check``) and for a stream (``Gate``)."""

    def __init__(self, question: str, blocks: dict[int, tuple[str, str]],
                 translate: Callable[[str], frozenset[str]] | None = None):
        self.asked = terms(_META.sub("，", question))
        self.translate = translate  # English words -> the notes' Chinese words (rag.index.translate)
        self.asked_pairs = words(question)
        self.question = Held.of(question)
        self.blocks = blocks
        self.bodies = {n: Body(h + "\n" + t) for n, (h, t) in blocks.items()}
        self.headers = {n: words(_MARKER.sub(" ", h)) for n, (h, _) in blocks.items()}
        # a block's title (its header's "[n] title (notebook › heading)"): a unit of its header's words
        # holding it says which note, not what the note says, unless the question asks which note
        self.notes = {n: _title(h) for n, (h, _) in blocks.items()}  # blocks of one title: one note
        self.titles = {} if _ASKS_FOR_A_NOTE.search(question) else {n: words(t) for n, t in self.notes.items()}
        self.held = {n: Held.of(h + "\n" + t) for n, (h, t) in blocks.items()}
        # What the question asks about, by block: its words (a single Chinese character too: 糖, 盐)
        # and their Chinese for an English question, less the block's title and heading (the
        # subject every number of the block shares: 龟苓膏 of "龟苓膏的做法")
        asked = _asked(question) | (translate(question) if translate else frozenset())
        self.roles = {n: asked - _asked(h) for n, (h, _) in blocks.items()}

    def unit(self, u: Unit) -> Verdict:
        if u.blank:
            return Verdict(u.text, "blank")
        marked = [int(x) for m in _MARKER.finditer(u.text) for x in re.findall(r"\d+", m.group(1))]
        marked = [n for n in dict.fromkeys(marked) if n in self.blocks]
        if u.code:
            return self._code(u, marked)
        if u.table:
            return self._table(u, marked)
        bare = decoded(_MARKER.sub(" ", u.text))
        if self._pasted_header(u.text) or self._title_only(bare):
            return Verdict(u.text, "filler", marked=marked)
        own = _own(u.text, self.asked) or self._novel(bare)
        fake = invented(bare, list(self.held.values()), self.question, self._context, list(self.roles.values()))
        if not own and not fake and _context(bare):
            # the question's words back ("溏心蛋关火后要静置几分钟。", "先切再焯。" of "先切再焯，还是先焯再切？"):
            # it says nothing the evidence could bear out, and is not shown
            return Verdict(u.text, "echo", marked=marked)
        if not own and not fake:
            return Verdict(u.text, "filler", marked=marked)
        if not own:  # a specific the evidence lacks, in words of the question: "静置 3 分钟"
            return Verdict(u.text, "unsupported", marked=marked, invented=fake)
        shares = {n: body.share(own) for n, body in self.bodies.items()}
        blocks, share = self._blocks(own, shares, marked)
        if blocks and not fake:
            # shown citing these blocks, its specifics must be theirs (or their notes' other blocks'):
            # "15 ml 生抽" of the eel sauce's note, whose 15 ml is sugar, is not borne out by another
            # recipe's "生抽 15 ml". Another block that holds its words as well may bear it out instead.
            need = 1.0 if len(own) < SHORT else OWN_SHARE
            tries = [blocks] + [[n] for n in sorted(shares, key=lambda n: (-shares[n], n))
                                if shares[n] >= need and n not in blocks and self._holds_words(n, own)]
            first: list[str] = []
            for i, these in enumerate(tries):
                found = self._invented_in(bare, these)
                if not found:
                    blocks, share = these, share if i == 0 else shares[these[0]]
                    break
                first = first or found
            else:
                blocks, fake = [], first
        if not blocks and not fake and _INTRO.search(bare):  # "蒲烧汁的配方如下：": what follows decides
            return Verdict(u.text, "intro", marked=marked)
        if not blocks or fake:
            return Verdict(u.text, "unsupported", share=round(share, 3), marked=marked, invented=fake)
        return Verdict(u.text, "supported", blocks=blocks, share=round(share, 3), marked=marked)

    def _holds_words(self, n: int, own: set[str]) -> bool:
        """Does block n hold one of a unit's own words that is no number (any, when it has none)?"""
        wordy = [w for w in own if len(w) > 1 and not re.search(r"\d", w)]
        return not wordy or any(self.bodies[n].has(w) for w in wordy)

    def _invented_in(self, text: str, blocks: list[int]) -> list[str]:
        """``invented`` against these blocks and the other blocks of their notes only (names: all blocks)."""
        mine = [n for n in self.blocks if self.notes[n] in {self.notes[b] for b in blocks}]
        return invented(text, [self.held[n] for n in mine], self.question, self._context, [self.roles[n] for n in mine],
                        named=list(self.held.values()))

    def _context(self, text: str) -> set[str]:
        """``_context``, and for a unit in English its Chinese words too: "100 g of sugar" is
        placed by 糖 in a Chinese note."""
        words = _context(text)
        if self.translate is not None and words and not _CJK.search(text):
            words |= self.translate(text)
        return words

    def _novel(self, text: str) -> set[str]:
        """A short unit made of the question's words in another order ("先炒蛋" of "番茄炒蛋怎么做？"):
        its character pairs the question does not hold, as its own words ("先炒")."""
        return {w for w in words(_META.sub("，", _LIST_PREFIX.sub("", text))) - self.asked_pairs if _CJK.match(w)}

    def _blocks(self, own: set[str], shares: dict[int, float], marked: list[int]) -> tuple[list[int], float]:
        """The blocks a unit stands on, and the share of its own words they hold: the marked
        blocks that hold a good part of it (``OWN_SHARE`` / 2 each) when together they hold
        enough, else the one block that holds most, when it holds enough. A block that holds only
        its numbers and none of its words it does not stand on while another holds some of them
        (``_holds_words``)."""
        need = 1.0 if len(own) < SHORT else OWN_SHARE
        worded = {n: s for n, s in shares.items() if self._holds_words(n, own)}
        shares = worded if any(worded.values()) else shares
        mine = [n for n in marked if shares.get(n, 0.0) >= (need if len(own) < SHORT else OWN_SHARE / 2)]
        if mine:
            share = sum(1 for w in own if any(self.bodies[n].has(w) for n in mine)) / len(own)
            if share >= need:
                return mine, share
        good = [n for n, s in shares.items() if s >= need]
        if good:
            best = max(good, key=lambda n: (shares[n], -n))
            return [best], shares[best]
        return [], max(shares.values(), default=0.0)

    def _code(self, u: Unit, marked: list[int]) -> Verdict:
        lines = [ln for ln in u.text.split("\n") if ln.strip() and not _FENCE.match(ln)]
        mine = terms("\n".join(lines))
        if not mine:
            return Verdict(u.text, "filler", code=True)
        shares = {n: body.share(mine) for n, body in self.bodies.items()}
        best = max(shares, key=shares.get, default=None)
        share = shares.get(best, 0.0) if best is not None else 0.0
        fake = invented("\n".join(lines), list(self.held.values()), self.question)
        if best is None or share < CODE_SHARE or fake:
            return Verdict(u.text, "unsupported", share=round(share, 3), marked=marked, invented=fake, code=True)
        return Verdict(u.text, "supported", blocks=[best], share=round(share, 3), marked=marked, code=True)

    def _table(self, u: Unit, marked: list[int]) -> Verdict:
        """A table stands when each of its rows (under its header and rule) stands as a sentence
        of its cells would: its specifics placed by the words of that row, not of the rows around
        it; shown with each row citing its blocks in its last cell (a marker after a row's last
        ``|`` would break the table). Rows without their header and rule are no table and no
        sentence (``| 1:15 |``): a fragment, not shown."""
        lines = u.text.split("\n")
        rule = next((i for i, ln in enumerate(lines) if _TABLE_RULE.match(ln)), None)
        if rule is None or rule == 0:
            return Verdict(u.text, "fragment", marked=marked)
        rows, shown_rows, blocks, invented_, shares = [], [], [], [], []
        for i, line in enumerate(lines):
            if i <= rule or not line.strip():
                shown_rows.append(line)
                continue
            cells = [c.strip() for c in _MARKER.sub(" ", line).strip().strip(">").strip().strip("|").split("|")]
            v = self.unit(Unit(0, 0, " ".join(c for c in cells if c) + "。"))
            rows.append(v)
            invented_ += v.invented
            if v.kind == "supported":
                blocks += v.blocks
                shares.append(v.share)
                bare = _MARKER_SPACED.sub("", line).rstrip()
                marks = "".join(f"[{n}]" for n in v.blocks)
                shown_rows.append(f"{bare[:-1].rstrip()} {marks} |" if bare.endswith("|") else f"{bare} {marks}")
            else:
                shown_rows.append(_MARKER_SPACED.sub("", line))
        stands = [v for v in rows if v.says_something]
        if not stands or any(v.kind == "unsupported" for v in stands):
            return Verdict(u.text, "unsupported", marked=marked, invented=list(dict.fromkeys(invented_)),
                           share=round(sum(v.kind == "supported" for v in stands) / len(stands), 3) if stands else 0.0)
        return Verdict(u.text, "supported", blocks=list(dict.fromkeys(blocks)), share=round(min(shares), 3),
                       marked=marked, display="\n".join(shown_rows))

    def _pasted_header(self, text: str) -> bool:
        """``[n]`` and nothing but words of block n's header: the prompt pasted back."""
        m = _MARKER.match(text.strip())
        if not m:
            return False
        rest = words(text.strip()[m.end():])
        return any(rest <= self.headers.get(int(x), set()) for x in re.findall(r"\d+", m.group(1)))

    def _title_only(self, text: str) -> bool:
        """A unit that is a block's title, its notebook and heading at most, however marked
        (``可乐鸡翅 (菜谱 / 荤菜)[2]``, ``**可乐鸡翅**``): the note named, not an answer from it."""
        rest = words(_EMPHASIS.sub(" ", _LIST_PREFIX.sub("", _TAG.sub(" ", text))))
        return bool(rest) and any(title and title <= rest <= self.headers[n] for n, title in self.titles.items())

    def check(self, reply: str) -> Check:
        gate = Gate(self)
        gate.feed(reply)
        gate.flush()
        return gate.result


def check(reply: str, question: str, blocks: dict[int, tuple[str, str]],
          translate: Callable[[str], frozenset[str]] | None = None) -> Check:
    """The reply read against the evidence, unit by unit."""
    return Checker(question, blocks, translate).check(reply)


def behind(check: Check) -> tuple[int, str] | None:
    """Where the note's own words behind an answer are: the block most of its supported units
    stand on (the first cited, on a tie) and those units' text, to find the block's matching
    sentences with (``rag.index.excerpt``); None when nothing stands on a block."""
    counts: dict[int, int] = {}
    for v in check.supported:
        for n in v.blocks:
            counts[n] = counts.get(n, 0) + 1
    if not counts:
        return None
    n = max(check.cited, key=lambda b: counts.get(b, 0))
    return n, " ".join(v.text for v in check.supported if n in v.blocks)


class Gate:
    """A streaming reply, passed on one checked unit at a time: ``feed`` returns the text of
    the units completed by this piece that may be shown (``shown``), ``flush`` the rest.
    Together they return exactly ``Check.text`` of the whole reply."""

    def __init__(self, checker: Checker):
        self.checker = checker
        self.buffer = ""
        self.verdicts: list[Verdict] = []
        self.held: list[Verdict] = []  # an intro line and the blank lines after it, until what it introduces is read
        self.said: set[str] = set()  # what the units that say something said (``said``): never shown twice

    def feed(self, piece: str) -> str:
        self.buffer += piece
        if _PARTIAL.search(self.buffer):  # a marker being written belongs to the sentence before it
            return ""
        units = split(self.buffer)
        if len(units) <= 1:
            return ""
        done, rest = units[:-1], units[-1]
        self.buffer = self.buffer[rest.start:]
        return self._pass(done)

    def flush(self) -> str:
        units = split(self.buffer)
        self.buffer = ""
        return self._pass(units) + self._release(None)

    def cut(self) -> str:
        """The reply was stopped while a unit was being written: that unit is left out (the
        start of one more repeat), the rest ends as with ``flush``."""
        self.buffer = ""
        return self._release(None)

    def _pass(self, units: list[Unit]) -> str:
        out = []
        for u in units:
            key = said(u.text)
            if key and key in self.said:
                v = Verdict(u.text, "repeat", code=u.code)
            else:
                v = self.checker.unit(u)
                if key and (v.says_something or v.kind == "echo"):
                    self.said.add(key)
            if v.kind == "intro" or (self.held and v.kind == "blank"):
                self.held.append(v)
                continue
            out.append(self._release(v))
            self.verdicts.append(v)
            out.append(shown(v))
        return "".join(out)

    def _release(self, by: Verdict | None) -> str:
        """The held intro lines, shown when the unit they introduce (``by``) is, else left out
        with it: "先确认账号：" before a link no note holds says nothing on its own."""
        stands = by is not None and by.kind in ("supported", "filler")
        out = []
        for v in self.held:
            if v.kind == "intro":
                v = replace(v, kind="filler" if stands else "unsupported")
            self.verdicts.append(v)
            out.append(shown(v))
        self.held = []
        return "".join(out)

    @property
    def result(self) -> Check:
        return Check(list(self.verdicts))


def verdict(reply: str, check: Check, refusal: str = "") -> str:
    """What a reply is, as ``Trace.citing`` names it: "refused" (it says the notes do not
    answer), "nothing" (no unit says anything), "uncited" (none stands on the evidence),
    "partly" (some do, fewer than ``MIN_SHARE``), "cited" (enough do, the model marking their
    blocks) or "inferred" (enough do, their blocks found by the check)."""
    if refuses(reply, refusal):
        return "refused"
    if not check.saying:
        return "nothing"
    if not check.supported:
        return "uncited"
    if check.share < MIN_SHARE:
        return "partly"
    return "cited" if any(set(v.blocks) & set(v.marked) for v in check.supported) else "inferred"
