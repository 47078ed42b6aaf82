"""A person's digest plan: when their digest comes (``weekly mon 09:00``, ``daily 08:30``, in
their IANA time zone), as typed in chat or written in the config, checked with clear errors."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rag.errors import UserError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_NAMES = {**{d: d for d in DAYS}, **{n: d for d, n in zip(DAYS, (
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"))},
    **{n: d for d, n in zip(DAYS, ("周一", "周二", "周三", "周四", "周五", "周六", "周日"))}}
_TIME = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")
USAGE = ("用法 usage: /digest weekly mon 09:00 | /digest daily 08:30 | /digest off — 可加时区 a time zone may follow "
         "(Asia/Shanghai, Europe/Berlin; default {tz})")


@dataclass
class Plan:
    """A person's digest: ``every`` "daily" or "weekly" (``day``: mon..sun), at ``at`` (HH:MM)
    in the time zone ``tz``. Whose notes it tells of is not the plan's: it is the person's
    Leanote user at the time it is sent (``users:`` as in force then)."""

    person: str
    every: str
    day: str
    at: str
    tz: str
    last_sent: float | None = None

    def as_json(self) -> dict:
        return asdict(self)


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; a ``UserError`` naming the fix for one that does not exist."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise UserError(f"unknown time zone {name[:64]!r}: give an IANA name such as Asia/Shanghai, Europe/Berlin "
                        f"or UTC") from None


def parse_plan(text: str, default_tz: str = "UTC") -> tuple[str, str, str, str] | None:
    """``weekly mon 09:00 [TZ]``, ``daily 08:30 [TZ]`` -> (every, day, at, tz); ``off`` -> None.
    Anything else is a ``UserError`` saying what is wrong and what is meant."""
    words = text.split()
    usage = USAGE.format(tz=default_tz)
    if not words:
        raise UserError(usage)
    every = words[0].lower()
    if every == "off" and len(words) == 1:
        return None
    if every not in ("daily", "weekly"):
        raise UserError(f"{words[0][:32]!r} is not daily, weekly or off. {usage}")
    rest = words[1:]
    day = "*"
    if every == "weekly":
        if not rest:
            raise UserError(f"which day? {usage}")
        day = _DAY_NAMES.get(rest[0].lower())
        if day is None:
            raise UserError(f"unknown day {rest[0][:32]!r}: one of {', '.join(DAYS)}. {usage}")
        rest = rest[1:]
    if not rest:
        raise UserError(f"at what time? {usage}")
    m = _TIME.match(rest[0])
    if not m:
        raise UserError(f"unknown time {rest[0][:32]!r}: write it as HH:MM, 00:00 to 23:59. {usage}")
    at = f"{int(m[1]):02d}:{m[2]}"
    if len(rest) > 2:
        raise UserError(f"too many words after the time. {usage}")
    tz = rest[1] if len(rest) == 2 else default_tz
    zone(tz)
    return every, day, at, tz


def plan_text(plan: Plan | None) -> str:
    if plan is None or plan.every == "off":
        return "off"
    when = f"{plan.day} {plan.at}" if plan.every == "weekly" else plan.at
    return f"{plan.every} {when} {plan.tz}"


