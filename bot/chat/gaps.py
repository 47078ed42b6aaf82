"""What the chat bots say about a person's knowledge gaps (``bot.usecases.gaps``): the list
``/gaps`` shows, with the buttons under it, and the replies to a press. Plain text, bilingual;
each platform escapes and splits it for itself."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rag.answer.gaps import Gap

GAPS_SHOWN = 10  # gaps with buttons under one reply (Discord: 5 rows of 2 gaps × 2 buttons)
NO_GAPS = ("你的笔记还没有答不上来的问题。 / No open knowledge gaps: every question you asked was answered "
           "from your notes (or you dismissed it).")
GAP_BUTTONS = (("w", "✍️", "write"), ("x", "✖", "dismiss"))
WHY_WORDS = {"refused": "没找到 not found", "withdrawn": "回答没有依据 answer withdrawn", "down": "👎"}
NOT_YOUR_GAP = "这不是你的问题。 / This is not one of your gaps."
DISMISSED = "好的，不再显示：«{q}» / Dismissed: «{q}»"
FORGOT = "已忘掉你的 {n} 个知识空白和摘要设置。 / Forgot your {n} knowledge gap(s) and your digest setting."


@dataclass
class GapsReply:
    text: str
    items: list[tuple[int, str]] = field(default_factory=list)  # (n, gap id): a button pair each


def _when(ts: float) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(ts))


def gaps_text(gaps: list[Gap], link=str) -> GapsReply:
    """The person's open gaps, the most asked lately first, each with the words it was asked in."""
    if not gaps:
        return GapsReply(NO_GAPS)
    lines = [f"你的笔记还回答不了的问题 / What your notes could not answer ({len(gaps)}):"]
    items = []
    for n, gap in enumerate(gaps[:GAPS_SHOWN], 1):
        why = ", ".join(WHY_WORDS.get(w, w) for w in gap.why)
        lines.append(f"{n}. «{gap.question}» — 问过 {gap.count} 次，最近 {_when(gap.last)} / asked {gap.count}×, "
                     f"last {_when(gap.last)} ({why})")
        others = gap.wordings[1:3]
        if others:
            lines.append("   也问过 also asked: " + "; ".join(f"«{w}»" for w in others))
        items.append((n, gap.id))
    if len(gaps) > GAPS_SHOWN:
        lines.append(f"…另有 {len(gaps) - GAPS_SHOWN} 个 / and {len(gaps) - GAPS_SHOWN} more (leanote-rag gaps)")
    lines.append("按 ✍️ n 写这条笔记（你发的下一条消息就是它），✖ n 不再显示。 / ✍️ n: write the note (what you send "
                 "next becomes it); ✖ n: dismiss.")
    return GapsReply("\n".join(lines), items)


def writing_text(gap: Gap, how: str = "send it") -> str:
    """After ✍️: what to do next."""
    if how == "note":
        return (f"好的：用 /note 发内容，它会存成笔记«{gap.question}»。 / OK: send the text with /note; it becomes "
                f"the note «{gap.question}».")
    return (f"好的：把内容发给我，它会存成笔记«{gap.question}»。 / OK: send me the text; it becomes the note "
            f"«{gap.question}».")
