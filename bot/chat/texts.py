"""What the chat bots say that is not an answer: help, command lists, refusals, and each use
case's result as chat text (``bot.usecases``: the status, a sync, the trace, the memory's
replies, the outbox, what "Save as note" did). Plain text, bilingual where a person reads it;
each platform escapes and splits it for itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

from rag import limits
from rag.capture import MARKER_RE
from rag.index.excerpt import excerpt
from rag.language import say
from rag.config import Settings
from rag.errors import Unavailable

from bot.usecases import capture, memory, status
from bot.usecases.memory import MemoryUnavailable, NotAnItemId, UnknownItem
from bot.usecases.people import Person
from bot.usecases.results import About, NotSaved, RelatedNotes, SyncRequest, Verdict, Why
from bot.chat.words import PRESSED, REFUSALS
from bot.render import file_place, notes_root  # noqa: F401 (notes_root: the doors take it from here)

# What a person sees when something unexpected goes wrong; the details go to the log.
SORRY = "抱歉，出错了，已经记录下来了。请稍后再试。 / Sorry, something went wrong; it has been logged. Please try again."
# An answer the platform would not take (after it had streamed): it replaces the half-shown text.
UNDELIVERED = "抱歉，回答没能发出来，请再问一次。 / Sorry, the answer could not be delivered; please ask again."
FRESH_START = "好的，重新开始。 / Fresh start."
SYNCING = "开始同步… / Syncing…"
NO_CAPTURE = REFUSALS["no_capture"]
TRANSCRIBING = "🎙 正在转写… / Transcribing…"
READING_IMAGE = "🔎 正在识别图中文字… / Reading the text in the image…"
# a voice message's or a photo's status message whose work a stop or a crash of the server cut off (said at its next start)
INTERRUPTED = "⚠️ 服务重启，这条没处理完，请再发一次。 / Interrupted: the server restarted before this was done; please send it again."


def waiting_text(ahead: int) -> str:
    """Media work waiting in the machine's one line."""
    return f"⏳ 排队中，前面还有 {ahead} 个 / In line: {ahead} ahead of you"


def heard_line(line: str) -> str:
    """A voice message's words, shown first on one line (a mishearing is seen; reply to correct it)."""
    return f"🎙 「{line}」"


def seen_line(line: str) -> str:
    """A photo's text as read, shown first on one line."""
    return f"🔎 「{line}」"

_INTRO = {
    "leanote": "我会从你的 Leanote 笔记里找答案，并附上笔记链接。I answer from your Leanote notes, with links to them.",
    "folder": "我会从你的笔记文件夹里找答案，并注明出自哪个文件。I answer from your folder of notes, naming the file each "
              "answer comes from.",
}
_ASK = """/ask 问题 — 提问（私聊里直接发问题就行）ask (in a private chat just send the question)
/search 关键词 — 只列出相关笔记 search: matching notes only
/reset — 忘掉这段对话 forget this conversation
/why — 上一个回答是怎么来的 why the last answer
/web — 在浏览器里聊天的一次性链接（私发给你）a one-time link to chat in a browser (sent to you alone)
/status — 同步状态 sync status
/sync — 立即同步（管理员）sync now (admins)"""
_INTO = {
    "leanote": ("收件箱笔记本", "into your inbox notebook", " Leanote ", "Leanote"),
    "folder": ("文件夹里的 {inbox}/，一个 Markdown 文件", "as a Markdown file in the folder's {inbox}/", "笔记文件夹",
               "the folder"),
}
_CAPTURE = """/note 内容 — 记一条新笔记（{into_zh}）capture a note {into_en}
/append 内容 — 追加到上一条记录 add to your last capture
/remember 内容 — 记到“记住的事”里 a dated line in your memory note
/save — 回复一条消息，把它存成笔记 reply to a message to save it
/outbox — 还没写进{where_zh}的记录 captures waiting for {where_en}
🎙 语音消息 — 像打字一样提问；开头说“记一下…”或“记住…”就记下来 a voice message: asked as if typed; starting
   "note …" or "remember …" it is captured (with /note as its caption too)"""
_NO_CAPTURE = """🎙 语音消息 — 像打字一样提问 a voice message: asked as if typed
记笔记在这里用不了 Capture is not available here: {why}"""
_PHOTO = "🖼 图片加上问题作说明 — 按图里的文字回答 a photo with a question as its caption: answered from its text"
_MEMORY = """/about 名称 — 记忆里关于它的事实和笔记 what the memory knows about a name (facts, notes)
/related 笔记id、标题或问题 — 相关的笔记 notes related to a note (its id or title) or a question
/reject ID — 删掉一条错的事实或相关 reject a wrong fact or pair (ids from /about, /related)
/confirm ID — 确认一条事实或相关 confirm a fact or pair"""
_GAPS = """/gaps — 笔记还回答不了的问题 what your notes could not answer ({gaps_buttons})
/digest weekly mon 09:00 | daily 08:30 | off — 笔记摘要 a digest of your notes (private chat)
/forget — 忘掉你的知识空白、摘要设置和保存的问答 forget your gaps, digest setting and kept questions"""
CAPTURE_COMMANDS = ("note", "append", "remember", "save", "outbox")


def help_text(source: str = "leanote", target: str = "leanote", why: str | None = None, inbox: str = "Inbox") -> str:
    """``/help`` as this install is: ``source`` "folder" (a folder of notes) or "leanote" (any other
    source: the notes are Leanote's); ``target``: where captures go ("leanote", "folder"), or
    "" with ``why`` there is none."""
    intro = _INTRO["folder" if source == "folder" else "leanote"]
    if target in _INTO and not why:
        into_zh, into_en, where_zh, where_en = (t.format(inbox=inbox) for t in _INTO[target])
        capture = _CAPTURE.format(into_zh=into_zh, into_en=into_en, where_zh=where_zh, where_en=where_en)
        buttons = "write the note, or dismiss"
    else:
        capture = _NO_CAPTURE.format(why=why or "")
        buttons = "dismiss"
    return "\n\n".join([intro, _ASK, capture + "\n" + _PHOTO, _MEMORY, _GAPS.format(gaps_buttons=buttons)])


HELP = help_text()  # a Leanote install's


def help_for(parts) -> str:
    """``/help`` for the install ``parts`` runs (its source, and where its captures go)."""
    settings = parts.settings
    source = "folder" if settings.source.kind == "files" else "leanote"
    why = None
    if not parts.can_capture:
        why = NO_CAPTURE
    elif not capture.offered(parts):
        why = capture.unavailable(parts)
    return help_text(source, capture.target(parts), why, settings.capture.notebook)


COMMANDS = [
    ("ask", "提问 / ask a question"),
    ("search", "搜索笔记 / search your notes"),
    ("reset", "重新开始对话 / forget this conversation"),
    ("why", "上一个回答的依据 / why the last answer"),
    ("web", "在浏览器里聊天 / chat in a browser"),
    ("status", "同步状态 / sync status"),
    ("sync", "立即同步（管理员）/ sync now (admins)"),
    ("note", "记一条笔记 / capture a note"),
    ("append", "追加到上一条 / add to your last capture"),
    ("remember", "记住一件事 / remember something"),
    ("save", "回复一条消息来保存 / reply to a message to save it"),
    ("outbox", "待写入的记录 / captures waiting"),
    ("about", "记忆里关于它的事 / what the memory knows about a name"),
    ("related", "相关笔记 / related notes (note id or question)"),
    ("reject", "删掉一条错的事实或相关 / reject a fact or pair"),
    ("confirm", "确认一条事实或相关 / confirm a fact or pair"),
    ("gaps", "笔记还答不上来的问题 / what your notes could not answer"),
    ("digest", "笔记摘要 / a digest: weekly mon 09:00, daily 08:30, off"),
    ("forget", "忘掉你的知识空白和问答 / forget your gaps and questions"),
    ("help", "帮助 / help"),
]


def commands(can_capture: bool) -> list[tuple[str, str]]:
    """The command menu: without the capture commands where nothing can be captured."""
    return [c for c in COMMANDS if can_capture or c[0] not in CAPTURE_COMMANDS]


# --- how much of a message is read ---------------------------------------------------------
# A question, a search or a name is cut to limits.question_chars (Telegram messages reach 4,096
# characters, Discord's options 6,000) and the person is told; the answer reads only that much.
# Captures are meant to be long: they keep their own cap (capture.max_chars) and are refused
# past it with a message saying so (sync.writeback.capture).

def cut_message(settings: Settings, text: str) -> tuple[str, str | None]:
    """``text`` as a question or search, cut to ``limits.question_chars``; and, when it was
    cut, the notice for the person."""
    most = settings.limits.question_chars
    kept, over = limits.cut(text, most)
    if not over:
        return kept, None
    return kept, say(kept, f"（消息太长，只读了前 {most} 个字符。）",
                     f"(Your message was long: only its first {most:,} characters were read.)")


def with_notice(text: str, notice: str | None) -> str:
    """A reply with the cut notice first, when there is one."""
    return f"{notice}\n\n{text}" if notice else text


# --- answers and searches --------------------------------------------------------------------

def sources_first(citations, title: str, root=None) -> str:
    """The head an answer streams under: the notes its evidence comes from, as plain text
    (titles and links; a note file by its path in the folder ``root``), before the LLM's first token."""
    lines = [f"📚 {title}:"]
    for c in citations:
        place = file_place(c.url, root)
        link = f" — {c.url}" if c.url.startswith(("http://", "https://")) else (f" — {place}" if place else "")
        lines.append(f"[{c.n}] {' '.join(c.label.split())}{link}")
    return "\n".join(lines)


SNIPPET_CHARS = 120


def hits_text(hits, query: str = "", root=None) -> str:
    """``/search``: each note found with where it is (a web link, or a note file's path in the
    folder ``root``) and the lines of it that match ``query``. Plain text (each door's one path
    shows it: ``bot.plain``)."""
    if not hits:
        return "没有找到相关笔记。 / No matching notes."
    lines = []
    for i, h in enumerate(hits, start=1):
        where = file_place(h.url, root) or h.url
        lines.append(f"{i}. {h.title}" + (f" › {h.heading}" if h.heading else "") + f"  {where}")
        snippet = " ".join(excerpt(MARKER_RE.sub("", h.text), query, SNIPPET_CHARS).split())
        if snippet:
            lines.append("   " + snippet)
    return "\n".join(lines)


# How /why names each row of a trace (``Why.rows``).
TRACE_LABELS = {
    "question": "问题 question", "rewritten": "改写为 rewritten", "follow-up": "追问 follow-up",
    "sounds like": "听起来像 sounds like", "expansion": "扩展 expansion", "dense": "向量 dense", "rerank": "重排 rerank", "budget": "篇幅 budget", "entities": "实体 entities",
    "fact": "事实 fact", "decision": "结论 decision", "llm error": "LLM 不可用，用了笔记原文",
    "not in any note": "笔记里没有 not in any note", "llm reply": "模型的回答 LLM reply", "checked": "核对 checked",
}
NO_ANSWER_YET = "这段对话还没有回答过问题。 / No answer in this conversation yet."
NO_TRACE_KEPT = "这个回答没有记录依据。 / No trace was kept for this answer."


def trace_text(why: Why | None) -> str:
    """``/why`` and "Why?": the trace's rows, then the best candidates with their scores."""
    if why is None:
        return NO_ANSWER_YET
    lines = [f"{TRACE_LABELS[what]}: {text}" for what, text in why.rows]
    lines.append("候选 candidates (dense · sparse · fused · rerank → evidence):")
    for c in why.candidates[:10]:
        lines.append(f"• {c['title']} › {c['heading']}: {c['dense']} · {c['sparse']} · {c['fused']} · {c['rerank']}"
                     + (f" → {c['evidence']}" if c["evidence"] else ""))
    return "\n".join(lines)


# --- "Save as note" under an answer ------------------------------------------------------------

SAVING = PRESSED["saving"]
NOT_SAVED = {
    "no_capture": NO_CAPTURE,
    "remapped": ("这个回答来自另一个 Leanote 账号的笔记，不能保存到你现在的账号。 / This answer came from another "
                 "Leanote account's notes; it cannot be saved into yours."),
    "saving": SAVING,
    "queued": "已在排队，Leanote 恢复后写入；/outbox 可查看。 / Queued already: it is written when Leanote is back "
              "(see /outbox).",
}


def not_saved_text(why: NotSaved) -> tuple[str, str]:
    """What to tell the presser, and how: ``alert`` (they must see it), ``brief`` (a passing
    word) or ``message``."""
    if why.why == "saved":
        return f"已经存为笔记了 ✅ {why.url} / Already saved as a note.".replace("  ", " "), "message"
    how = {"no_capture": "alert", "remapped": "alert", "saving": "brief"}.get(why.why, "message")
    return why.reason or NOT_SAVED[why.why], how


# --- the status and /sync ----------------------------------------------------------------------

def _minute(when: str | float | None) -> str:
    """A time of the report (ISO text, or seconds) as a chat line shows it."""
    if not when:
        return "never"
    moment = datetime.fromisoformat(when) if isinstance(when, str) else datetime.fromtimestamp(when)
    return moment.strftime("%m-%d %H:%M")


def status_text(report: dict, person: Person) -> str:
    """``/status``: an admin sees every account with its last error, the notes per user, the
    notes that could not be read, every capture waiting and what keeps the sync from working;
    anyone else only their own account and captures, without error details."""
    admin = person.admin
    lines = []
    for a in report["accounts"]:
        if admin:
            line = f"{a['account']}: {status.sync_line(a)}; last sync {_minute(a['last_success'])}"
            if a["last_error"]:
                line += f"; failing: {a['last_error'][:200]}"
        else:
            line = f"last sync {_minute(a['last_success'])}"
            if a["last_error"]:
                line += "; the last sync failed (the admin can see why)"
        lines.append(line)
    last = report.get("last_sync")
    if not admin and not report["accounts"] and last:  # a folder or a backup: one pass for everyone
        lines.append(f"last sync {_minute(last['finished'])}"
                     + ("" if last["ok"] else "; the last sync failed (the admin can see why)"))
    notes = {u["user_id"]: u["notes"] for u in report["users"] if u["notes"]}
    if admin:
        lines.append("notes indexed: " + (", ".join(f"{u}: {n}" for u, n in notes.items()) or "0"))
        skipped = report["skipped"]
        if skipped:
            lines.append(f"not indexed: {len(skipped)} unreadable note(s), e.g. {skipped[0]['origin']}: "
                         f"{skipped[0]['reason'][:150]}")
    else:
        lines.append(f"your notes indexed: {notes.get(person.user_id, 0)}")
    capture = report.get("capture") or {}
    if capture.get("waiting") or capture.get("failed"):
        lines.append(f"{'' if admin else 'your '}captures waiting for Leanote: {capture['waiting']}, "
                     f"not taken: {capture['failed']} (/outbox)")
    for f in capture.get("logins_failing") or []:
        since = time.strftime("%m-%d %H:%M", time.localtime(f["since"]))
        if admin:
            lines.append(f"capture login of {f['account']} failing since {since}, {f['waiting']} capture(s) "
                         f"waiting for it: {f['error'][:300]}")
        else:
            lines.append(f"the Leanote login of your account fails since {since}, so your captures wait "
                         "(the admin can see why)")
    llm = (report.get("memory") or {}).get("llm") or {}
    if admin and (llm.get("jobs_pending") or llm.get("done_last_day")):
        worker = llm.get("worker") or {}
        lines.append(f"summaries and facts by the LLM: {llm['done_last_hour']} notes in the last hour, "
                     f"{llm['jobs_pending']} waiting" + (f"; {worker['text']}" if worker.get("text") else ""))
    line = status.questions_line((report.get("memory") or {}).get("questions")) if admin else ""
    if line:
        lines.append(line)
    if admin:
        lines += [f"problem: {p['problem']}" for p in report.get("problems", [])]
    return "\n".join(lines)


async def status_reply(parts, person: Person) -> str:
    """``/status`` as chat says it (``bot.usecases.status``): the person's report, or why it
    cannot be read now (the daemon starting or stopping)."""
    try:
        return status_text(await status.status(parts, person), person)
    except Unavailable as err:
        return str(err)


def sync_text(done: SyncRequest) -> str:
    """What a chat's ``/sync`` came to."""
    if done.outcome == "paused":
        return f"同步暂停中，没有开始。 / The sync is paused, nothing started: {'; '.join(done.problems)}"
    if done.outcome == "just_ran":
        return "刚刚同步过，稍等再试。 / A sync just ran; try again shortly."
    if done.outcome == "running":
        minutes = f"{done.waited / 60:.0f}"
        return (f"还在同步（已超过 {minutes} 分钟）；/status 会显示结果。 / Still syncing after {minutes} min; /status "
                f"shows how it ends.")
    if done.outcome == "stopping":
        return "服务正在停止，同步没做完。 / The service is stopping: the sync did not finish."
    if done.outcome == "fault":
        return f"同步暂停 / The sync is paused: {'; '.join(done.problems)}"
    if not done.failures:
        return f"同步完成 ✅ / Synced: {done.line}"
    failures = "; ".join(f"{account}: {error}" for account, error in done.failures.items())
    return f"同步有失败 / The sync failed for some: {failures}. ({done.line})"


def outbox_text(items: list) -> str:
    """``/outbox``: this person's captures not yet written (into Leanote or the notes folder), and
    those refused."""
    if not items:
        return "没有待写入的记录。 / Nothing waiting: every capture is written."
    lines = []
    for item in items:
        when = time.strftime("%m-%d %H:%M", time.localtime(item.created))
        state = "未被接受 not taken" if item.state == "failed" else "等待中 waiting"
        line = f"• {when} {item.describe()} — {state}"
        if item.error:
            line += f": {item.error[:200]}"
        lines.append(line)
    return "\n".join(lines)


# --- the memory of the notes: /about, /related, /reject, /confirm -----------------------------------

MEMORY_OFF = REFUSALS["memory_off"]
MEMORY_NOT_YET = REFUSALS["memory_not_yet"]
ABOUT_USAGE = ("用法 usage: /about 名称 — 一个项目、术语或标签，如笔记里写的 / a name: a project, a term or a tag, "
               "as your notes write it")
RELATED_USAGE = "用法 usage: /related 笔记id、标题或问题 / a note id, its title's words, or a question"
VERDICT_USAGE = ("用法 usage: /reject ID 或 /confirm ID（/about 和 /related 显示的 f… 或 p…）/ the f… or p… id that "
                 "/about and /related show")
MEMORY_ITEMS = 10  # facts or pairs with buttons under one reply (Discord: 5 rows of 2 × 2 buttons)
MEMORY_NOTES = 8  # notes listed under /about
SNIPPET = 160


def memory_unavailable_text(err: MemoryUnavailable) -> str:
    return MEMORY_OFF if err.reason == "off" else MEMORY_NOT_YET


@dataclass
class MemoryReply:
    """What /about or /related shows: plain text (links made by the platform's ``link``) and
    the items with buttons, as (the number shown, the correction id)."""

    text: str
    items: list[tuple[int, str]] = field(default_factory=list)


def _one_line(text: str, size: int = SNIPPET) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= size else text[: size - 1] + "…"


def _day(when) -> str:
    try:
        return datetime.fromtimestamp(float(when)).strftime("%Y-%m-%d") if when else ""
    except (TypeError, ValueError, OverflowError, OSError):
        return ""


def about_text(about: About, link: Callable[[str], str] = str, esc: Callable[[str], str] = str) -> MemoryReply:
    """``/about``: the facts about the name (each with its quote, source note and id; the
    active ones get buttons) and the notes that mention it."""
    name, facts, notes = about.entity, about.facts, about.notes
    if not facts and not notes:
        return MemoryReply(f"记忆里没有“{esc(name)}”。 / The memory knows nothing about {esc(name)!s}: no note "
                           f"mentions it.")
    lines = [f"关于 About “{esc(name)}”"]
    items: list[tuple[int, str]] = []
    if facts:
        lines += ["", "事实 Facts:"]
        for i, f in enumerate(facts[:MEMORY_ITEMS], start=1):
            status = {"active": "当前 current", "superseded": "已过时 superseded"}.get(f["status"], f["status"])
            if f.get("confirmed"):
                status += ", 已确认 confirmed"
            lines.append(f"{i}. {esc(f['subject'])} —{esc(f['predicate'])}→ {esc(f['object'])}  [{status}]  "
                         f"id {f['fact_id']}")
            source = " ".join(x for x in (esc(f.get("title") or ""), _day(f.get("time"))) if x)
            lines.append(f"   “{esc(_one_line(f.get('quote') or ''))}” — {source}  {link(f.get('url') or '')}".rstrip())
            if f["status"] == "active":
                items.append((i, f["fact_id"]))
        if len(facts) > MEMORY_ITEMS:
            lines.append(f"… 还有 {len(facts) - MEMORY_ITEMS} 条 / {len(facts) - MEMORY_ITEMS} more")
    if notes:
        lines += ["", f"提到它的笔记 Notes that mention it ({len(notes)}):"]
        for n in notes[:MEMORY_NOTES]:
            where = f" ({esc(n['notebook'])})" if n.get("notebook") else ""
            lines.append(f"• {esc(n['title'])}{where}  {link(n.get('url') or '')}".rstrip())
            snippet = next((m["snippet"] for m in n.get("mentions", []) if m.get("snippet")), "")
            if snippet:
                lines.append(f"   {esc(_one_line(snippet))}")
        if len(notes) > MEMORY_NOTES:
            lines.append(f"… 还有 {len(notes) - MEMORY_NOTES} 篇 / {len(notes) - MEMORY_NOTES} more")
    if items:
        lines += ["", "按钮 👍 确认 / 👎 删除（编号同上）Buttons: 👍 confirm, 👎 reject the fact with that number."]
    return MemoryReply("\n".join(lines), items)


def related_text(related: RelatedNotes, link: Callable[[str], str] = str,
                 esc: Callable[[str], str] = str) -> MemoryReply:
    """``/related``: each note with its link, score, shared entities and best passage; each
    pair (a note and the one it is related to) gets buttons."""
    about = f"“{related.title}”"
    if not related.notes:
        return MemoryReply(f"没有找到和 {esc(about)} 相关的笔记。 / No related notes for {esc(about)} (pairs below "
                           f"memory.related_min_score are not kept).")
    lines = [f"相关笔记 Related to {esc(about)}:"]
    items: list[tuple[int, str]] = []
    for i, n in enumerate(related.notes[:MEMORY_ITEMS], start=1):
        where = f" ({esc(n['notebook'])})" if n.get("notebook") else ""
        reasons = n.get("reasons") or {}
        head = f"{i}. {esc(n['title'])}{where}  score {n['score']:.3f}"
        if "search" in reasons:
            head += f"  (搜索第 {reasons['search']} / search hit {reasons['search']})"
        if n.get("pair_id"):
            head += f"  id {n['pair_id']}"
        lines.append(head)
        if n.get("url"):
            lines.append(f"   {link(n['url'])}")
        if reasons.get("entities"):
            lines.append("   共同 shared: " + ", ".join(esc(e["name"]) for e in reasons["entities"]))
        passage = (reasons.get("passages") or {}).get("other_snippet")
        if passage:
            lines.append(f"   段落 passage: {esc(_one_line(passage))}")
        if n.get("pair_id"):
            items.append((i, n["pair_id"]))
    if items:
        lines += ["", "按钮 👍 确认 / 👎 删除这对相关（编号同上）Buttons: 👍 confirm, 👎 reject the pair with that number."]
    return MemoryReply("\n".join(lines), items)


def verdict_text(done: Verdict, verdict: str) -> str:
    """What a ``/reject`` or ``/confirm`` (or its button) did."""
    what = (f"{done.done['subject']} —{done.done['predicate']}→ {done.done['object']}" if done.kind == "fact"
            else " ↔ ".join(done.titles))
    if not done.changed:
        word = "已经删除过了 / Already rejected" if verdict == "rejected" else "已经确认过了 / Already confirmed"
        return f"{word}: {what}"
    if verdict == "rejected":
        return f"已删除 ✗ Rejected: {what}（重新读取笔记也不会再出现 / it will not come back when the note is read again）"
    return f"已确认 ✓ Confirmed: {what}"


def verdict_refused_text(err: Exception, item_id: str) -> str:
    """Why a verdict changed nothing: the memory cannot be read, the id is no id, or it is
    not in the person's memory."""
    if isinstance(err, MemoryUnavailable):
        return memory_unavailable_text(err)
    if isinstance(err, NotAnItemId):
        return VERDICT_USAGE
    item_id = (item_id or "").strip()
    assert isinstance(err, UnknownItem)
    return (f"你的记忆里没有 {item_id}：什么也没改（它可能属于别人的笔记，或 id 写错了）。 / {item_id} is not "
            f"in your memory: nothing was changed (it may belong to someone else's notes, or be mistyped).")


async def verdict_reply(parts, person: Person, item_id: str, verdict: str) -> tuple[bool, str]:
    """A verdict on a fact or pair of the person's memory (``bot.usecases.memory.verdict``),
    as chat says it: (changed anything, what to tell the person)."""
    try:
        done = await memory.verdict(parts, person, item_id, verdict)
    except (MemoryUnavailable, NotAnItemId, UnknownItem) as err:
        return False, verdict_refused_text(err, item_id)
    return done.changed, verdict_text(done, verdict)
