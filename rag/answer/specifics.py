"""The specifics a sentence states, which a note must hold in the same place for the sentence to
stand on it: numbers with their unit (``2 颗``, ``150ml``, ``03:17``, ``两种``), dates and ranges,
versions, identifiers, flags, paths, Latin names; and where a note's text holds each (``Held``),
with the words around it. Read by ``rag.answer.support``.
"""

from __future__ import annotations

import html
import re

from rag.index.lexical import STOPWORDS, tokenize

_CJK = re.compile(r"[\u3400-\u9fff]")
_WS = re.compile(r"\s+")
_LINE_WS = re.compile(r"\s*\n\s*|[^\S\n]+")  # spaces as one, a line break as one (a list line is a clause)


def terms(text: str) -> set[str]:
    """The words of a text as compared here: index terms, less single CJK characters."""
    return {t for t in tokenize(text) if not (len(t) == 1 and _CJK.match(t))}


class Body:
    """A text's words, for looking a unit's words up."""

    def __init__(self, text: str):
        self.terms = terms(text)
        self.text = _WS.sub("", text.lower())
        self.spaced = _WS.sub(" ", text.lower())

    def has(self, word: str) -> bool:
        if word in self.terms:
            return True
        if _CJK.match(word):
            return word in self.text
        return re.search(rf"(?<![a-z0-9_]){re.escape(word)}(?![a-z0-9_])", self.spaced) is not None

    def share(self, own: set[str]) -> float:
        return sum(1 for w in own if self.has(w)) / len(own) if own else 0.0


# A unit after a number, longest first; the same unit in other words normalised to one name.
_UNITS = {
    "毫升": "ml", "ml": "ml", "升": "l", "l": "l", "毫克": "mg", "mg": "mg", "千克": "kg", "公斤": "kg", "kg": "kg",
    "克": "g", "g": "g", "斤": "斤", "毫秒": "ms", "ms": "ms", "秒钟": "s", "秒": "s", "s": "s", "sec": "s",
    "分钟": "min", "min": "min", "mins": "min", "minutes": "min", "minute": "min", "小时": "h", "个小时": "h", "h": "h",
    "hours": "h", "hour": "h", "hrs": "h", "天": "d", "days": "d", "day": "d", "日": "日", "周": "周", "星期": "周",
    "个月": "月", "月": "月", "年": "年", "点": "点", "分": "min", "度": "度", "℃": "度", "°c": "度", "°": "度",
    "kb": "kb", "mb": "mb", "gb": "gb", "tb": "tb", "k": "k", "m": "m", "w": "w", "%": "%", "倍": "倍", "x": "倍",
    "次": "次", "遍": "次", "times": "次", "颗": "颗", "个": "个", "碗": "碗", "勺": "勺", "汤匙": "勺", "茶匙": "茶匙",
    "杯": "杯", "片": "片", "块": "块", "根": "根", "条": "条", "张": "张", "份": "份", "层": "层", "位": "位",
    "台": "台", "行": "行", "列": "列", "字节": "字节", "bytes": "字节", "byte": "字节", "页": "页", "步": "步",
    "种": "种", "项": "项", "核": "核", "线程": "线程", "threads": "线程", "人": "人", "只": "只", "瓣": "瓣",
    "厘米": "cm", "cm": "cm", "毫米": "mm", "mm": "mm", "米": "m", "公里": "km", "km": "km", "px": "px",
    "元": "元", "块钱": "元", "yuan": "元", "rmb": "元", "晚": "晚", "nights": "晚", "night": "晚",
}
_UNIT_ALT = "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True))
_NUMBER = re.compile(
    r"(?<![A-Za-z0-9_.:\-/])(\d+(?:[.:]\d+)*)(?:\s*(" + _UNIT_ALT + r")(?![A-Za-z]))?", re.I)
_ZH_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
# Chinese numerals count before a quantity's unit; 个, 种, 点, 次, 分 and the like are idiom as often
# as count ("两个原因", "以下三点", "十分重要").
_ZH_UNITS = [u for u in _UNITS if _CJK.match(u) and u not in ("个", "种", "点", "次", "遍", "分", "位", "项", "步", "行",
                                                               "列", "层", "条", "人", "只", "台", "份")]
# A Chinese numeral counts only before a unit, and 一 not at all (一下, 一次, 第一: idiom more often than count).
_ZH_NUMBER = re.compile(r"(?<![一二两三四五六七八九十百千第])([二两三四五六七八九十百千][零〇一二两三四五六七八九十百千]*)("
                        + "|".join(sorted(_ZH_UNITS, key=len, reverse=True)) + ")")
_LIST_ORDINAL = re.compile(r"(?m)^\s*(?:>\s*)*(?:#{1,6}\s*|[-*+]\s+)?\d{1,3}[.、)）]\s")  # "1. ", "> 2) ", "### 4. "
_LATIN_WORD = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z][A-Za-z0-9_]*(?:[.\-+:/][A-Za-z0-9_]+)*")
_FLAG_OR_PATH = re.compile(r"(?<![A-Za-z0-9_/])(?:--?[A-Za-z][\w\-:+=]*|(?:~|\.{1,2})?/[\w.\-]+(?:/[\w.\-*]+)+)")
_SENTENCE_START = re.compile(r"(?:^|[.!?;:]\s+|\n)[\s\"'“‘(*_`#>\-]*$")  # "- Two threads": a list line's first word


def _zh_value(numeral: str) -> int | None:
    """二 -> 2, 十二 -> 12, 二十 -> 20, 一百二十 -> 120; None for what is not a plain numeral."""
    total, current = 0, 0
    for ch in numeral:
        if ch in _ZH_DIGITS:
            current = _ZH_DIGITS[ch]
        elif ch in "十百千":
            mult = {"十": 10, "百": 100, "千": 1000}[ch]
            total += (current or 1) * mult
            current = 0
        else:
            return None
    return total + current


def _number_value(text: str) -> str:
    """A number as compared: ``03:17`` -> ``3:17``, ``1.50`` stays (a version), ``007`` -> ``7``."""
    parts = text.split(":")
    if len(parts) > 1:
        return ":".join(str(int(p)) if p.isdigit() else p for p in parts)
    return str(int(text)) if text.isdigit() else text


_DATE = re.compile(r"(?<!\d)(\d{4})\s*(?:[-/.]|年)\s*(\d{1,2})\s*(?:[-/.]|月)\s*(\d{1,2})(?:\s*日)?(?!\d)"
                   r"|(?<!\d)(\d{4})\s*年\s*(\d{1,2})\s*月(?!\s*\d)")


_RANGE = re.compile(r"(?<![A-Za-z0-9_.:\-/])(\d+(?:\.\d+)?)\s*[-~～到至]\s*(\d+(?:\.\d+)?)\s*(" + _UNIT_ALT
                    + r")(?![A-Za-z])", re.I)
_HALF = re.compile(r"半(?:个)?(小时|分钟|天|年|月|杯|碗|勺|斤)")


def spans(text: str) -> list[tuple[str, str | None, str, int, int]]:
    """The numbers a text states, where: (value, unit or None, as written, start, end). A
    date is one number however written (``2038-01-19``, ``2038年1月19日``); a range gives both
    ends their unit (``25-30 分钟``); list ordinals (``1. `` at a line's start) are no numbers;
    Chinese numerals count before a unit (``两颗``, ``半小时``)."""
    text = _LIST_ORDINAL.sub(lambda m: " " * len(m.group()), text)
    out = []
    for m in _DATE.finditer(text):
        parts = [p for p in m.groups() if p is not None]
        out.append(("-".join(str(int(p)) for p in parts), "date", m.group(), m.start(), m.end()))
        out.append((str(int(parts[0])), "年", m.group(), m.start(), m.end()))  # the year alone, as "2038 年" says it
    text = _DATE.sub(lambda m: " " * len(m.group()), text)
    for m in _RANGE.finditer(text):
        unit = _UNITS[m.group(3).lower()]
        out += [(_number_value(m.group(1)), unit, m.group(), m.start(), m.end()),
                (_number_value(m.group(2)), unit, m.group(), m.start(), m.end())]
    text = _RANGE.sub(lambda m: " " * len(m.group()), text)
    for m in _NUMBER.finditer(text):
        unit = m.group(2)
        out.append((_number_value(m.group(1)), _UNITS[unit.lower()] if unit else None, m.group().strip(), m.start(),
                    m.end()))
    for m in _ZH_NUMBER.finditer(text):
        value = _zh_value(m.group(1))
        if value is not None:
            out.append((str(value), _UNITS[m.group(2)], m.group(), m.start(), m.end()))
    for m in _HALF.finditer(text):
        out.append(("0.5", _UNITS[m.group(1)], m.group(), m.start(), m.end()))
    return out


def numbers(text: str) -> list[tuple[str, str | None, str]]:
    """The numbers a text states: (value, unit or None, as written); see ``spans``."""
    return [(v, u, w) for v, u, w, _, _ in spans(text)]


def names(text: str) -> list[str]:
    """The Latin names a text states, lowercased: in Chinese text every Latin word of two
    letters or more; in English text the words that are names (capitalised mid-sentence,
    capitals inside, digits, ``.``/``_`` inside); flags and paths whole."""
    cjk = bool(_CJK.search(text))
    out: list[str] = []
    for m in _FLAG_OR_PATH.finditer(text):
        out.append(m.group().lower())
    for m in _LATIN_WORD.finditer(text):
        word = m.group().rstrip(".:-/+")
        if len(re.findall(r"[A-Za-z]", word)) < 2 or word.lower() in STOPWORDS:
            continue
        if not cjk:
            inner = any(c.isupper() for c in word[1:]) or re.search(r"[\d_]|[A-Za-z][.][A-Za-z]", word)
            if not inner and not (word[0].isupper() and not _SENTENCE_START.search(text[: m.start()])):
                continue
        out.append(word.lower())
    return list(dict.fromkeys(out))


# A period a sentence states ("每天", "every year"): "每天 6 月到 10 月开放" where the note says 每年 is
# another claim, whatever its numbers. Each named by its unit.
_PERIOD = re.compile(
    r"每(?:一)?(?:个)?(天|日|晚|周|星期|礼拜|月|季度|季|年|小时|钟头)|(天天|日日|年年|月月)"
    r"|\b(daily|nightly|weekly|monthly|quarterly|yearly|annually|hourly)\b"
    r"|\b(?:every|per|each|a|an|once a|twice a)\s+(day|night|week|month|quarter|year|hour)\b", re.I)
_PERIODS = {"天": "d", "日": "d", "晚": "d", "天天": "d", "日日": "d", "daily": "d", "nightly": "d", "day": "d",
            "night": "d", "周": "w", "星期": "w", "礼拜": "w", "weekly": "w", "week": "w", "月": "mo", "月月": "mo",
            "monthly": "mo", "month": "mo", "季度": "q", "季": "q", "quarterly": "q", "quarter": "q", "年": "y",
            "年年": "y", "yearly": "y", "annually": "y", "year": "y", "小时": "h", "钟头": "h", "hourly": "h", "hour": "h"}


def periods(text: str) -> list[tuple[str, str, int, int]]:
    """The periods a text states: (the period's unit: d, w, mo, q, y, h; as written; start; end).
    ``每 2 天`` is a number (``spans``), not a period."""
    return [(_PERIODS[next(g for g in m.groups() if g).lower()], m.group(), m.start(), m.end())
            for m in _PERIOD.finditer(text)]


PLACE_WINDOW = 40  # characters either side of a specific in a block where the unit's other words must be
_CLAUSE_END = re.compile(r"[。！？!?；;\n（）()]")  # a sentence's end, an aside's start or end
_ROLE_END = re.compile(r"[。！？!?；;，,、\n]")  # a clause's end: what a bare number is said of stands in it
# A line of its own: a list item, a table row, a heading (each says its own thing: "- 冷水 120 毫升"
# is not placed by the "- 开水 500 毫升" under it, nor a flight's row by the car hire's)
_ITEM_LINE = re.compile(r"^\s*(?:>\s*)*(?:[-*+•|#]|\d{1,3}[.、)）]|[（(]\d{1,3}[)）])")


def _flat(text: str) -> str:
    """The lines run together (a paragraph wrapped by hand, a config's keys under their section),
    but where a list item, a table row or a heading begins or ends: those stay lines."""
    lines = text.split("\n")
    out = [lines[0]]
    for before, line in zip(lines, lines[1:]):
        joined = not _ITEM_LINE.match(before) and not _ITEM_LINE.match(line)
        out.append((" " if joined else "\n") + line)
    return "".join(out)


_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")


def decoded(text: str) -> str:
    """HTML entities a note's Markdown writes (``-&gt;``) as their characters, as it reads: their
    ``;`` ends no clause, their letters are no name."""
    return _ENTITY.sub(lambda m: html.unescape(m.group()), text) if "&" in text else text


class Held:
    """What a body of evidence holds, for looking specifics up, and where."""

    def __init__(self, text: str):
        text = decoded(text)
        self.text = _LINE_WS.sub(lambda m: "\n" if "\n" in m.group() else " ", text.lower())
        self.flat = _flat(self.text)  # the same places, a paragraph wrapped by hand as one line
        self.found = spans(self.text)
        self.with_unit = {(v, u) for v, u, *_ in self.found if u}
        self.values = {v for v, *_ in self.found}

    @classmethod
    def of(cls, text: str) -> "Held":
        return cls(text)

    def holds_number(self, value: str, unit: str | None) -> bool:
        return bool(self._number_at(value, unit))

    def _number_at(self, value: str, unit: str | None) -> list[tuple[int, int]]:
        at = [(s, e) for v, u, _, s, e in self.found if v == value and (unit is None or u == unit)]
        if unit is None:
            at += [m.span() for m in re.finditer(rf"(?<![\d.]){re.escape(value)}(?![\d])", self.text)]
        return at

    def holds_period(self, period: str) -> bool:
        return bool(self._period_at(period))

    def _period_at(self, period: str) -> list[tuple[int, int]]:
        return [(s, e) for p, _, s, e in periods(self.text) if p == period]

    def holds_name(self, name: str) -> bool:
        return bool(self._name_at(name))

    def _name_at(self, name: str) -> list[tuple[int, int]]:
        return [m.span() for form in dict.fromkeys((name, name.replace("-", " "), name.replace("_", " ")))
                for m in re.finditer(re.escape(form), self.text)]

    def _around(self, start: int, end: int, clause: bool = False) -> str:
        """The text next to a specific: up to ``PLACE_WINDOW`` characters either side, within its
        sentence and its line (a list item: ``_flat``) and outside any aside it is not in
        (``浸泡至少 8 小时（来不及可用高压锅压 20 分钟）``: the 20 minutes are the pressure cooker's,
        not the soaking's). ``clause``: within its line and its clause (``牛奶 50 克，低筋面粉 100 克``:
        the 100 g are the flour's). In a table, its row, whole: a row is one record (``| 租车 | 取车 7
        天，丰田 | 2100 元 |``), and the rows above and below it are others."""
        row_start = self.text.rfind("\n", 0, start) + 1
        if self.text.startswith("|", row_start):
            row_end = self.text.find("\n", end)
            return self.text[row_start:row_end if row_end >= 0 else len(self.text)]
        lo, hi = max(0, start - PLACE_WINDOW), min(len(self.text), end + PLACE_WINDOW)
        text, ends = (self.text, _ROLE_END) if clause else (self.flat, _CLAUSE_END)
        before = ends.split(text[lo:start])
        after = ends.split(text[end:hi])
        return before[-1] + text[start:end] + after[0]

    def places(self, at: list[tuple[int, int]], context: set[str], across: bool = True) -> bool:
        """Does one of the places ``at`` have one of the ``context`` words near it? (True
        when there is no context to look for.) A place whose words are in the other script than
        most of ``context`` is not judged (True). ``across`` False: judged whenever ``context``
        has a word in the place's script (it holds both: an English question's words and their
        Chinese), and a place with no word at all (``A. ￥600``, an exam's option) places nothing."""
        if not context:
            return bool(at)
        cjk = sum(1 for w in context if _CJK.match(w))
        for start, end in at:
            text = self._around(start, end, clause=not across)
            # an answer in Chinese of a note in English ("16 字节" of "at least 16 bytes"): most of its
            # words cannot be in that window, and it is not judged by them
            zh, latin = _CJK.search(text), re.search(r"[a-z]{2}", text)
            if across and not (zh if cjk * 2 >= len(context) else latin):
                return True
            if not across and (zh or latin) and not ((zh and cjk) or (latin and cjk < len(context))):
                return True
            body = Body(text)
            if any(body.has(w) or (_CJK.match(w) and len(w) > 2 and any(w[i:i + 2] in body.text for i in range(len(w) - 1)))
                   for w in context):  # a longer Chinese word by its parts ("高火转" of "微波炉高火 4 分钟")
                return True
        return False


