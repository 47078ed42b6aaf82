"""What the chat bots say about a person's knowledge gaps (``bot.usecases.gaps``): the list
``/gaps`` shows, with the buttons under it, and the replies to a press; the note begun with ✍️
(what happens next, how it ends). Plain text, bilingual; each platform escapes and splits it
for itself. ``how``: where the note's text comes from, "message" (Telegram: the next message in
the private chat) or "note" (Discord: the next ``/note``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from rag.answer.gaps import Draft, Gap
from rag.digest_plan import zone

from bot.usecases.gaps import Forgot, Shown

GAPS_SHOWN = 10  # gaps with buttons under one reply (Discord: 5 rows of 2 gaps × 2 buttons)
NO_GAPS = ("还没有记下答不上来的问题（还没有过，或你用 /forget 清空了）。 / No knowledge gaps kept (none yet, or you "
           "cleared them with /forget): a question your notes cannot answer is listed here.")
NONE_OPEN = ("你的笔记没有待回答的问题：{answered} 个已由笔记回答，{dismissed} 个已不再显示。 / No open knowledge gaps: "
             "{answered} answered by a note since, {dismissed} dismissed.")
WHY_WORDS = {"refused": "没找到 not found", "withdrawn": "回答没有依据 answer withdrawn", "down": "👎"}
DISMISSED = "好的，不再显示：«{q}» / Dismissed: «{q}»"
FORGOT = ("已忘掉你的 {n} 个知识空白、摘要设置，以及为改进回答而保存的 {m} 条问答。 / Forgot your {n} knowledge gap(s), "
          "your digest setting and the {m} answer(s) kept for feedback (your questions and 👍/👎).")
FOOTER = {"message": "按 ✍️ n 写这条笔记（你发的下一条消息就是它），✖ n 不再显示。 / ✍️ n: write the note (your next "
                     "message becomes it); ✖ n: dismiss.",
          "note": "按 ✍️ n 写这条笔记（你的下一个 /note 就是它），✖ n 不再显示。 / ✍️ n: write the note (your next /note "
                  "becomes it); ✖ n: dismiss."}


@dataclass
class GapsReply:
    text: str
    items: list[tuple[int, str]] = field(default_factory=list)  # (n, gap id): a button pair each


def _when(ts: float, tz: str) -> str:
    """A time of the person's, in their zone; UTC says so (no zone was given)."""
    shown = datetime.fromtimestamp(ts, zone(tz)).strftime("%m-%d %H:%M")
    return f"{shown} UTC" if tz == "UTC" else shown


def gaps_text(shown: Shown, how: str = "message") -> GapsReply:
    """The person's open gaps, the most asked lately first, each with the words it was asked in;
    with none open, what became of the others (or that none are kept)."""
    gaps = shown.open
    if not gaps:
        if shown.answered or shown.dismissed:
            return GapsReply(NONE_OPEN.format(answered=shown.answered, dismissed=shown.dismissed))
        return GapsReply(NO_GAPS)
    lines = [f"你的笔记还回答不了的问题 / What your notes could not answer ({len(gaps)}):"]
    items = []
    for n, gap in enumerate(gaps[:GAPS_SHOWN], 1):
        why = ", ".join(WHY_WORDS.get(w, w) for w in gap.why)
        when = _when(gap.last, shown.tz)
        lines.append(f"{n}. «{gap.question}» — 问过 {gap.count} 次，最近 {when} / asked {gap.count}×, last {when} ({why})")
        others = gap.wordings[1:3]
        if others:
            lines.append("   也问过 also asked: " + "; ".join(f"«{w}»" for w in others))
        items.append((n, gap.id))
    if len(gaps) > GAPS_SHOWN:
        lines.append(f"…另有 {len(gaps) - GAPS_SHOWN} 个 / and {len(gaps) - GAPS_SHOWN} more (leanote-rag gaps)")
    lines.append(FOOTER[how])
    return GapsReply("\n".join(lines), items)


def forgot_text(gone: Forgot) -> str:
    """The reply to ``/forget``: what went."""
    return FORGOT.format(n=gone.gaps, m=gone.answers)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} 分钟 / {seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} 秒 / {seconds:g} s"


def writing_text(gap: Gap, wait: float, how: str = "message") -> str:
    """After ✍️: what happens next, for how long, and how it ends unwritten."""
    zh, en = _minutes(wait).split(" / ")
    if how == "note":
        return (f"✍️ 你的下一个 /note 会存成笔记«{gap.question}»（{zh}内；其他命令或 ✖ 取消）。 / ✍️ Your next /note "
                f"becomes the note «{gap.question}» (within {en}; any other command or ✖ cancels it).")
    return (f"✍️ 你发的下一条消息会存成笔记«{gap.question}»（{zh}内；问题会先问你；命令或 ✖ 取消）。 / ✍️ Your next "
            f"message becomes the note «{gap.question}» (within {en}; a question is asked about first; a command "
            f"or ✖ cancels it).")


def ended_text(draft: Draft) -> str:
    """The note begun with ✍️ ends unwritten (✖ cancel, /reset, another command)."""
    return (f"✍️ 已取消：笔记«{draft.title}»没有写。 / ✍️ Cancelled: the note «{draft.title}» was not written "
            f"(✍️ under /gaps to begin again).")


def not_written_text(draft: Draft, why: str) -> str:
    """The note's write was refused: why, and that nothing waits any more."""
    return (f"{why}\n笔记«{draft.title}»没有写成；要再试，在 /gaps 里按 ✍️。 / The note «{draft.title}» was not written; "
            f"to try again, press ✍️ under /gaps.")


def confirm_text(draft: Draft) -> str:
    """A question typed while a draft waits: asked about, never silently saved."""
    return (f"这像是一个问题。要把它存成笔记«{draft.title}»，还是回答它？ / This looks like a question. Save it as the "
            f"note «{draft.title}», or answer it?")
