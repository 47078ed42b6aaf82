"""What both bots share: the host they run in, streaming edits at a steady pace, and
the texts of their commands. The answer pipeline itself is ``rag.answer.service.AnswerService``,
one instance for both bots.

Long: what the two bots share: the host they run in, pacing, the texts of commands and of the
memory's replies, and the use cases both call.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Awaitable, Callable, Iterator, Protocol

from rag import limits
from rag.memory import explore
from rag.memory import related as related_mod
from rag.answer.service import AnswerService
from rag.answer.types import Trace
from rag.capture import Attachment, Origin, Quote, Receipt
from rag.config import Settings, secret
from rag.errors import UserError
from rag.answer.feedback import FeedbackStore
from rag.index.note_index import NoteIndex
from rag.memory.store import MemoryStore


class Capturer(Protocol):
    """Writing from chat into the person's own Leanote (``sync.writeback.capture.Capture``). Every
    call answers with a ``Receipt`` whose ``message`` is ready to show: written (with
    the note's link), queued (Leanote is down; retried), or refused (and why). ``text`` is
    the person's own (kept as their Markdown), ``quote`` someone else's (shown as written).
    ``once`` names what the capture comes from (``telegram:<chat>:<message>``, a Discord
    interaction or message, ``answer:<id>``): the same one again writes nothing new and
    answers with the first capture's receipt (``Receipt.again``)."""

    async def note(self, person: str, user_id: str, text: str, *, origin: Origin | None = None,
                   files: list[Attachment] = (), title: str = "", quote: Quote | None = None,
                   once: str = "") -> Receipt: ...
    async def append(self, person: str, user_id: str, text: str, once: str = "") -> Receipt: ...
    async def remember(self, person: str, user_id: str, text: str, once: str = "") -> Receipt: ...
    async def save_answer(self, person: str, user_id: str, question: str, answer: str,
                          citations: list[dict], once: str = "") -> Receipt: ...
    def pending(self, person: str) -> list: ...
    def note_for(self, key: str) -> str: ...
    def refusal(self, person: str, text: str, files: list[Attachment]) -> str | None: ...
    def available(self) -> str | None: ...


class ErrorCounter(Protocol):
    """Where a bot counts its unexpected errors (the daemon's metrics)."""

    def bot_error(self, platform: str) -> None: ...


class Host(Protocol):
    """What a bot needs from the process it runs in (``leanote-rag serve``)."""

    settings: Settings
    index: NoteIndex
    answers: AnswerService
    stopping: asyncio.Event
    metrics: ErrorCounter | None  # optional: a host without it (or None) counts nothing
    capture: Capturer | None  # None: this host cannot write to Leanote
    feedback: FeedbackStore | None  # the answers sent, for the buttons under them
    memory: MemoryStore | None  # the memory of the notes (None: off, or not made yet)

    def trigger(self) -> bool: ...
    async def sync_for_chat(self) -> str:
        """``/sync``: a pass now and what it did (or why none runs), in words for chat."""
        ...
    def status_text(self, user_id: str | None = None) -> str:
        """Sync status: every account for an admin (None), else only ``user_id``'s."""
        ...

    def user_for_email(self, email: str) -> str | None: ...


NO_CAPTURE = "这里不能写入 Leanote。 / Writing to Leanote is not available here."
SAVE_REMAPPED = ("这个回答来自另一个 Leanote 账号的笔记，不能保存到你现在的账号。 / This answer came from another Leanote "
                 "account's notes; it cannot be saved into yours.")
SAVED_ALREADY = "已经存为笔记了 ✅ {url} / Already saved as a note."
SAVE_QUEUED = "已在排队，Leanote 恢复后写入；/outbox 可查看。 / Queued already: it is written when Leanote is back (see /outbox)."
SAVING = "正在保存… / Saving…"


@dataclass
class NotSaved:
    """Why "Save as note" writes nothing now, and how a platform may say it: ``"alert"`` (the
    person must see it: no capture here, another account), ``"brief"`` (a passing word: a
    double tap while the first is being written) or ``"message"`` (saved already, queued)."""

    text: str
    how: str = "message"


class AnswerSaver:
    """"Save as note" under an answer, for every bot: the answer goes into the presser's
    Leanote once, however often and whenever it is pressed: while it is being written, while
    it waits in the outbox for Leanote, and after (``FeedbackStore.mark_saved``). The outbox
    makes the write itself exactly once (``once``); this keeps the person told what happened."""

    def __init__(self, host: Host):
        self.host = host
        self._saving: dict[str, str] = {}  # answer id -> "" while its save runs, or the key of a queued save

    def _url(self, note_id: str) -> str:
        return f"{self.host.settings.leanote.base_url.rstrip('/')}/note/{note_id}"

    async def not_now(self, presser: str, person, record) -> NotSaved | None:
        """Why pressing now saves nothing (said to the presser), or None: save it."""
        capture = getattr(self.host, "capture", None)
        if capture is None:
            return NotSaved(NO_CAPTURE, "alert")
        if record.saved_note_id:
            return NotSaved(SAVED_ALREADY.format(url=self._url(record.saved_note_id)))
        if person.leanote_user_id != record.user_id:  # the mapping changed since: not into another account
            return NotSaved(SAVE_REMAPPED, "alert")
        saving = self._saving.get(record.id)
        if saving is None:
            return None
        if saving == "":  # a double tap while the first is being written
            return NotSaved(SAVING, "brief")
        waiting = {i.key: i.state for i in await asyncio.to_thread(capture.pending, presser)}
        if saving in waiting:
            if waiting[saving] != "failed":
                return NotSaved(SAVE_QUEUED)
            self._saving.pop(record.id, None)  # Leanote refused it: another try is the person's to make
            return None
        self._saving.pop(record.id, None)  # queued then, written since
        note_id = await asyncio.to_thread(capture.note_for, saving)
        if note_id:
            await asyncio.to_thread(self.host.feedback.mark_saved, record.id, presser, note_id)
        return NotSaved(SAVED_ALREADY.format(url=self._url(note_id)).replace("  ", " ") if note_id
                        else SAVED_ALREADY.format(url="").replace("  ", " "))

    async def save(self, presser: str, record) -> Receipt:
        """Write the answer (after ``not_now`` said None); the receipt's message is for the presser."""
        self._saving[record.id] = ""
        try:
            receipt = await self.host.capture.save_answer(presser, record.user_id, record.question, record.answer,
                                                          [dict(c) for c in record.cited], once=f"answer:{record.id}")
        except BaseException:
            self._saving.pop(record.id, None)
            raise
        if receipt.status == "written" and receipt.note_id:
            await asyncio.to_thread(self.host.feedback.mark_saved, record.id, presser, receipt.note_id)
        if receipt.status == "queued" and receipt.key:
            self._saving[record.id] = receipt.key  # a second press while it waits says so
        else:
            self._saving.pop(record.id, None)
        return receipt


def count_error(host: Host, platform: str) -> None:
    """An unexpected error while answering or searching, for the host's metrics if it has them."""
    metrics = getattr(host, "metrics", None)
    if metrics is not None:
        metrics.bot_error(platform)


class Wait(Exception):
    """The platform asked us to slow down for this many seconds."""

    def __init__(self, seconds: float):
        super().__init__(f"retry in {seconds:g} s")
        self.seconds = seconds


class Pacer:
    """Streams an answer into one message: collects text as it arrives and edits the
    message at most once per ``interval``, honouring the platform's wait requests.

    ``show_first(head)`` puts a head above the text (the sources an answer reads, before
    the LLM's first token): shown at once when no edit went out yet, else as soon as
    the interval allows."""

    CURSOR = " ▌"

    def __init__(self, edit: Callable[[str], Awaitable[None]], interval: float,
                 clock: Callable[[], float] = time.monotonic, sleep=asyncio.sleep):
        self.edit = edit
        self.interval = interval
        self.clock = clock
        self.sleep = sleep
        self.head = ""
        self.text = ""
        self.sent = ""
        self.edits: list[float] = []  # when each edit went out (for tests and the benchmark)
        self._done = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def feed(self, piece: str) -> None:
        self.text += piece

    def show_first(self, head: str) -> None:
        self.head = head
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._pump())

    def _shown(self) -> str:
        if not self.text:
            return f"{self.head}\n\n…" if self.head else ""
        return (f"{self.head}\n\n" if self.head else "") + self.text + self.CURSOR

    async def _pause(self) -> None:
        """The interval, or less when a head came: at once if nothing was edited yet, else
        once the interval since the last edit is over."""
        sleeping = asyncio.ensure_future(self.sleep(self.interval))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeping, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            woken.cancel()
        if self._wake.is_set():
            self._wake.clear()
            if self.edits:
                left = self.interval - (self.clock() - self.edits[-1])
                if left > 0:
                    await self.sleep(left)

    async def _pump(self) -> None:
        while not self._done.is_set():
            await self._pause()
            if self._done.is_set():
                return
            shown = self._shown()
            if shown and shown != self.sent:
                try:
                    await self.edit(shown)
                    self.sent = shown
                    self.edits.append(self.clock())
                except Wait as wait:
                    await self.sleep(wait.seconds)
                except Exception:  # a failed intermediate edit is not worth an answer
                    pass

    async def stop(self) -> None:
        self._done.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


def sources_first(citations, title: str = "读的笔记 Reading") -> str:
    """The head an answer streams under: the notes its evidence comes from, as plain text
    (titles and links), before the LLM's first token."""
    lines = [f"📚 {title}:"]
    for c in citations:
        link = f" — {c.url}" if c.url.startswith(("http://", "https://")) else ""
        lines.append(f"[{c.n}] {' '.join(c.label.split())}{link}")
    return "\n".join(lines)


# --- doctor ----------------------------------------------------------------------------------
# ``leanote-rag doctor`` runs each bot's ``check(settings)`` (``bot.root.checks``),
# which yields (name, ok, detail, fix). Tokens never appear.
CheckResult = tuple[str, bool, str, str]
CHECK_TIMEOUT = 15.0


def token_or_problem(token_env: str, what: str, name: str) -> tuple[str | None, CheckResult | None]:
    try:
        return secret(token_env, what), None
    except UserError as err:
        return None, (name, False, str(err), f"put {token_env}=... in the service's environment file "
                      f"(/etc/leanote-rag/env), then restart")


def nobody_mapped(settings: Settings, platform: str) -> Iterator[CheckResult]:
    ids = [i for u in settings.users for i in (u.telegram_ids if platform == "telegram" else u.discord_ids)]
    if not ids:
        yield (f"{platform} users", False, f"nobody is mapped to a Leanote user for {platform}: the bot refuses "
               f"everyone", f"add to users: {{leanote_user_id: ..., {platform}_ids: [your id]}} (the bot tells "
               f"a stranger their id)")


def person_key(platform: str, person: int | str) -> str:
    """A person, wherever they write: captures, the outbox and feedback are theirs."""
    return f"{platform}:{person}"


def outbox_text(items: list) -> str:
    """``/outbox``: this person's captures not yet in Leanote, and those Leanote refused."""
    if not items:
        return "没有待写入的记录。 / Nothing waiting: every capture is in Leanote."
    lines = []
    for item in items:
        when = time.strftime("%m-%d %H:%M", time.localtime(item.created))
        state = "未被接受 not taken" if item.state == "failed" else "等待中 waiting"
        line = f"• {when} {item.describe()} — {state}"
        if item.error:
            line += f": {item.error[:200]}"
        lines.append(line)
    return "\n".join(lines)


def conversation_key(platform: str, place: int | str, person: int | str) -> str:
    """One person's conversation in one chat: history, the last trace and /reset are
    never shared with others in a group or channel."""
    return f"{platform}:{place}:{person}"


# --- how much of a message is read ---------------------------------------------------------
# A question, a search or a name is cut to limits.question_chars (Telegram messages reach 4,096
# characters, Discord's options 6,000) and the person is told; the answer reads only that much.
# Captures are meant to be long: they keep their own cap (capture.max_chars) and are refused
# past it with a message saying so (sync.writeback.capture).

EMPTY = "请写下问题。 / Please write a question."


def cut_message(settings: Settings, text: str) -> tuple[str, str | None]:
    """``text`` as a question or search, cut to ``limits.question_chars``; and, when it was
    cut, the notice for the person."""
    most = settings.limits.question_chars
    kept, over = limits.cut(text, most)
    if not over:
        return kept, None
    return kept, (f"（消息太长，只读了前 {most} 个字符。） / (Your message was long: only its first {most:,} "
                  f"characters were read.)")


def with_notice(text: str, notice: str | None) -> str:
    """A reply with the cut notice first, when there is one."""
    return f"{notice}\n\n{text}" if notice else text


# "Why?" under an answer given from another Leanote user's notes than the presser's now (``users`` changed).
REMAPPED_WHY = ("这个回答来自另一个 Leanote 账号的笔记，依据不再显示给你。 / This answer came from another Leanote "
                "account's notes: its trace is no longer shown to you.")

# What a person sees when something unexpected goes wrong; the details go to the log.
SORRY = "抱歉，出错了，已经记录下来了。请稍后再试。 / Sorry, something went wrong; it has been logged. Please try again."

HELP = """我会从你的 Leanote 笔记里找答案，并附上笔记链接。I answer from your Leanote notes, with links to them.

/ask 问题 — 提问（私聊里直接发问题就行）ask (in a private chat just send the question)
/search 关键词 — 只列出相关笔记 search: matching notes only
/reset — 忘掉这段对话 forget this conversation
/why — 上一个回答是怎么来的 why the last answer
/status — 同步状态 sync status
/sync — 立即同步（管理员）sync now (admins)

/note 内容 — 记一条新笔记（收件箱）capture a note into your inbox notebook
/append 内容 — 追加到上一条记录 add to your last capture
/remember 内容 — 记到“记住的事”里 a dated line in your memory note
/save — 回复一条消息，把它存成笔记 reply to a message to save it
/outbox — 还没写进 Leanote 的记录 captures waiting for Leanote

/about 名称 — 记忆里关于它的事实和笔记 what the memory knows about a name (facts, notes)
/related 笔记id、标题或问题 — 相关的笔记 notes related to a note (its id or title) or a question
/reject ID — 删掉一条错的事实或相关 reject a wrong fact or pair (ids from /about, /related)
/confirm ID — 确认一条事实或相关 confirm a fact or pair"""

COMMANDS = [
    ("ask", "提问 / ask a question"),
    ("search", "搜索笔记 / search your notes"),
    ("reset", "重新开始对话 / forget this conversation"),
    ("why", "上一个回答的依据 / why the last answer"),
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
    ("help", "帮助 / help"),
]


# How /why names each row of a trace (``Trace.rows``).
TRACE_LABELS = {
    "question": "问题 question", "rewritten": "改写为 rewritten", "follow-up": "追问 follow-up",
    "expansion": "扩展 expansion", "rerank": "重排 rerank", "budget": "篇幅 budget", "entities": "实体 entities",
    "fact": "事实 fact", "decision": "结论 decision", "llm error": "LLM 不可用，用了笔记原文",
    "not in any note": "笔记里没有 not in any note", "llm reply": "模型的回答 LLM reply", "checked": "核对 checked",
}


def trace_text(trace: Trace | None) -> str:
    if trace is None:
        return "这段对话还没有回答过问题。 / No answer in this conversation yet."
    lines = [f"{TRACE_LABELS[what]}: {text}" for what, text in trace.rows()]
    lines.append("候选 candidates (dense · sparse · fused · rerank → evidence):")
    for c in trace.candidates[:10]:
        dense, sparse, fused, rr, ev = c.cells()
        lines.append(f"• {c.title} › {c.heading}: {dense} · {sparse} · {fused} · {rr}" + (f" → {ev}" if ev else ""))
    return "\n".join(lines)


def hits_text(hits) -> str:
    if not hits:
        return "没有找到相关笔记。 / No matching notes."
    return "\n".join(f"{i}. {h.title}" + (f" › {h.heading}" if h.heading else "") + f"  {h.url}"
                     for i, h in enumerate(hits, start=1))


# --- the memory of the notes: /about, /related, /reject, /confirm -----------------------------------
# Always the asking (or pressing) person's Leanote user: ``MemoryStore`` keys every row by it,
# and a correction id is derived from the user, so another user's id never resolves. The
# store is opened per command in a worker thread (SQLite WAL: cheap, never blocks the loop).

MEMORY_OFF = ("记忆功能没有打开（memory.enabled: false）。 / The memory of the notes is off (memory.enabled: false "
              "in the config).")
MEMORY_NOT_YET = ("还没有笔记的记忆：等笔记同步完再试。 / There is no memory of the notes yet: try again after the "
                  "notes have synced.")
ABOUT_USAGE = ("用法 usage: /about 名称 — 一个项目、术语或标签，如笔记里写的 / a name: a project, a term or a tag, "
               "as your notes write it")
RELATED_USAGE = "用法 usage: /related 笔记id、标题或问题 / a note id, its title's words, or a question"
VERDICT_USAGE = ("用法 usage: /reject ID 或 /confirm ID（/about 和 /related 显示的 f… 或 p…）/ the f… or p… id that "
                 "/about and /related show")
MEMORY_ITEMS = 10  # facts or pairs with buttons under one reply (Discord: 5 rows of 2 × 2 buttons)
MEMORY_NOTES = 8  # notes listed under /about
SNIPPET = 160
VERDICT_BUTTONS = (("confirmed", "👍", "confirm"), ("rejected", "👎", "reject"))
_ID = re.compile(r"^[fp][0-9a-f]{12}$")


def memory_problem(host: Host) -> str | None:
    """Why the memory cannot be read now (off, not built yet), or None."""
    if not host.settings.memory.enabled:
        return MEMORY_OFF
    if host.memory is None:
        return MEMORY_NOT_YET
    return None


def _read_memory(host: Host, work):
    """``work(store)`` on the host's memory (in a worker thread)."""
    store = host.memory
    if store is None:
        raise UserError(MEMORY_NOT_YET if host.settings.memory.enabled else MEMORY_OFF)
    return work(store)


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


def about_text(name: str, facts: list[dict], notes: list[dict], link: Callable[[str], str] = str,
               esc: Callable[[str], str] = str) -> MemoryReply:
    """``/about``: the facts about ``name`` (each with its quote, source note and id; the
    active ones get buttons) and the notes that mention it (like ``memory show``)."""
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


def related_text(about: str, notes: list[dict], link: Callable[[str], str] = str,
                 esc: Callable[[str], str] = str) -> MemoryReply:
    """``/related``: each note with its link, score, shared entities and best passage; each
    pair (a note and the one it is related to) gets buttons."""
    if not notes:
        return MemoryReply(f"没有找到和 {esc(about)} 相关的笔记。 / No related notes for {esc(about)} (pairs below "
                           f"memory.related_min_score are not kept).")
    lines = [f"相关笔记 Related to {esc(about)}:"]
    items: list[tuple[int, str]] = []
    for i, n in enumerate(notes[:MEMORY_ITEMS], start=1):
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


async def about_reply(host: Host, user_id: str, name: str, link: Callable[[str], str] = str,
                      esc: Callable[[str], str] = str) -> MemoryReply:
    """``/about NAME`` for this Leanote user (``memory_problem`` checked first by the caller);
    nothing of a note the index no longer holds (``_indexed``)."""
    facts, notes = await asyncio.to_thread(
        _read_memory, host, lambda store: (store.facts_about(user_id, name), store.entity(user_id, name)))
    facts, notes = await _indexed(host.index, user_id, facts, notes)
    return about_text(name, facts, notes, link, esc)


async def _indexed(index: NoteIndex, user_id: str, *rows: list[dict], also: tuple[str, ...] = ()) -> list:
    """Each of ``rows`` less what names a note the index no longer holds: the sync removes a
    note from the memory in the pass it leaves the index, unless that write fails (the memory
    locked); until the next pass repairs it, no door names the note. A row list is None when a
    note of ``also`` is not held."""
    ids = sorted(explore.note_ids_in(list(rows)) | set(also))
    held = await asyncio.to_thread(index.store.holding, user_id, ids) if ids else set()
    if any(a not in held for a in also):
        return [None for _ in rows]
    return [explore.indexed_only(r, held) for r in rows]


async def related_reply(host: Host, user_id: str, target: str, link: Callable[[str], str] = str,
                        esc: Callable[[str], str] = str, k: int = 8) -> MemoryReply:
    """``/related TARGET`` for this Leanote user, as the CLI's ``related``: a note id of this
    user, else a question (the notes search finds for it, then theirs)."""
    settings = host.settings
    found = await asyncio.to_thread(_read_memory, host, lambda store: related_mod.of_note(store, user_id, target, k))
    if found is not None:
        info, notes = found
        notes, = await _indexed(host.index, user_id, notes, also=(info["note_id"],))
        if notes is not None:
            return related_text(f"“{info['title']}”", notes, link, esc)
        return related_text(f"“{target}”", [], link, esc)  # a note that left the index
    hits = await host.answers.search(target, user_id, k)

    def of_text(store: MemoryStore) -> list[dict]:
        return related_mod.for_text(store, user_id, target, hits, k, settings.memory.related_question_min_score)

    notes = await asyncio.to_thread(_read_memory, host, of_text)
    notes, = await _indexed(host.index, user_id, notes)
    return related_text(f"“{target}”", notes, link, esc)


def valid_item_id(item_id: str) -> bool:
    return bool(_ID.match((item_id or "").strip()))


async def verdict_reply(host: Host, user_id: str, item_id: str, verdict: str, by: str) -> tuple[bool, str]:
    """Reject or confirm a fact or pair of this Leanote user's memory: (changed anything,
    what to tell the person). An id of another user's memory changes nothing."""
    item_id = (item_id or "").strip()
    problem = memory_problem(host)
    if problem:
        return False, problem
    if not valid_item_id(item_id):
        return False, VERDICT_USAGE

    def work(store: MemoryStore) -> tuple[dict, list[str]]:
        done = store.correct(user_id, item_id, verdict, by=by)
        titles = [(store.note_info(user_id, n) or {}).get("title") or n for n in done.get("notes", [])]
        return done, titles

    try:
        done, titles = await asyncio.to_thread(_read_memory, host, work)
    except UserError:
        return False, (f"你的记忆里没有 {item_id}：什么也没改（它可能属于别人的笔记，或 id 写错了）。 / {item_id} is not "
                       f"in your memory: nothing was changed (it may belong to someone else's notes, or be mistyped).")
    what = (f"{done['subject']} —{done['predicate']}→ {done['object']}" if done["kind"] == "fact"
            else " ↔ ".join(titles))
    if not done["changed"]:
        word = "已经删除过了 / Already rejected" if verdict == "rejected" else "已经确认过了 / Already confirmed"
        return False, f"{word}: {what}"
    if verdict == "rejected":
        return True, f"已删除 ✗ Rejected: {what}（重新读取笔记也不会再出现 / it will not come back when the note is read again）"
    return True, f"已确认 ✓ Confirmed: {what}"
