"""What a digest looks like in chat (``rag.digest.Digest``): plain text, bilingual headings,
each section cut to what fits and the rest counted; each door's one path cuts it into messages
(``bot.plain.messages``)."""

from __future__ import annotations

from datetime import datetime
from itertools import groupby
from typing import Callable

from rag.digest import Digest
from rag.digest_plan import Plan, plan_text, zone

from bot.render import shown_link


NOTHING = "这段时间没有可说的：没有新笔记，也没有新问题。 / Nothing to say for this period: no changes, no open gaps."


def _day(ts: float, tz: str) -> str:
    return datetime.fromtimestamp(ts, zone(tz)).strftime("%Y-%m-%d")


def digest_text(d: Digest, note_url: Callable[[str], str] = str, root=None) -> str:
    """The digest as one text (each door's one path makes messages of it); a note file by its path in
    the notes folder ``root``."""
    if d.empty:
        return NOTHING
    link = lambda n: shown_link(n.get("url") or note_url(n["note_id"]), root)  # noqa: E731
    out = [f"📬 笔记摘要 Digest {_day(d.since, d.tz)} → {_day(d.until, d.tz)}"]
    if d.changed:
        added = sum(c["kind"] == "added" for c in d.changed)
        out += ["", f"📝 新增和修改的笔记 Notes added and edited ({added} added, {len(d.changed) - added} edited"
                    + (f", +{d.changed_more} more" if d.changed_more else "") + "):"]
        for notebook, items in groupby(sorted(d.changed, key=lambda c: (c["notebook"], -c["updated"])),
                                       key=lambda c: c["notebook"]):
            out.append(f"📁 {notebook or '-'}")
            for c in items:
                mark = "🆕" if c["kind"] == "added" else "✏️"
                out.append(f"  {mark} {c['title']} — {link(c)}")
    if d.gaps:
        out += ["", "❓ 笔记还回答不了的问题 Open questions your notes could not answer (/gaps):"]
        for g in d.gaps:
            out.append(f"  • «{g.question}» — 问过 {g.count} 次 asked {g.count}×")
        if d.gaps_more:
            out.append(f"  …+{d.gaps_more} (/gaps)")
    if d.this_day:
        out += ["", "📅 往年今日 On this day in earlier years:"]
        out += [f"  {e['year']}: {e['title']} — {link(e)}" for e in d.this_day]
    if d.pairs:
        out += ["", "🔗 相关但还没互相链接的笔记 Related notes that do not link each other yet:"]
        for p in d.pairs:
            out.append(f"  {p['a']['title']} ↔ {p['b']['title']}")
            out.append(f"    {link(p['a'])}\n    {link(p['b'])}")
    return "\n".join(out)


def plan_reply(plan: Plan | None, private: bool = True) -> str:
    if plan is None:
        return "好的，不再发摘要。 / OK: no more digests."
    where = "" if private else "\n摘要会私信给你。 / The digest comes to your private chat."
    return f"好的，摘要：{plan_text(plan)} / OK, your digest: {plan_text(plan)}{where}"
