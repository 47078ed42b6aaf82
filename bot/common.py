"""What both bots share: the host they run in, streaming edits at a steady pace, and
the texts of their commands. The answer pipeline itself is ``rag.answer.AnswerService``,
one instance for both bots."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Iterator, Protocol

from rag.answer import AnswerService, Trace
from rag.capture import Attachment, Origin, Receipt
from rag.config import Settings, secret
from rag.errors import UserError
from rag.feedback import FeedbackStore
from rag.index import NoteIndex
from rag.metrics import Metrics


class Capturer(Protocol):
    """Writing from chat into the person's own Leanote (``sync.capture.Capture``). Every
    call answers with a ``Receipt`` whose ``message`` is ready to show: written (with
    the note's link), queued (Leanote is down; retried), or refused (and why)."""

    async def note(self, person: str, user_id: str, text: str, *, origin: Origin | None = None,
                   files: list[Attachment] = (), title: str = "") -> Receipt: ...
    async def append(self, person: str, user_id: str, text: str) -> Receipt: ...
    async def remember(self, person: str, user_id: str, text: str) -> Receipt: ...
    async def save_answer(self, person: str, user_id: str, question: str, answer: str,
                          citations: list[dict]) -> Receipt: ...
    def pending(self, person: str) -> list: ...
    def note_for(self, key: str) -> str: ...
    def refusal(self, person: str, text: str, files: list[Attachment]) -> str | None: ...
    def available(self) -> str | None: ...


class Host(Protocol):
    """What a bot needs from the process it runs in (``leanote-rag serve``)."""

    settings: Settings
    index: NoteIndex
    answers: AnswerService
    stopping: asyncio.Event
    metrics: Metrics | None  # optional: a host without it (or None) counts nothing
    capture: Capturer | None  # None: this host cannot write to Leanote
    feedback: FeedbackStore | None  # the answers sent, for the buttons under them

    def trigger(self) -> bool: ...
    def status_text(self, user_id: str | None = None) -> str:
        """Sync status: every account for an admin (None), else only ``user_id``'s."""
        ...

    def user_for_email(self, email: str) -> str | None: ...


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
    message at most once per ``interval``, honouring the platform's wait requests."""

    CURSOR = " ▌"

    def __init__(self, edit: Callable[[str], Awaitable[None]], interval: float,
                 clock: Callable[[], float] = time.monotonic, sleep=asyncio.sleep):
        self.edit = edit
        self.interval = interval
        self.clock = clock
        self.sleep = sleep
        self.text = ""
        self.sent = ""
        self.edits: list[float] = []  # when each edit went out (for tests and the benchmark)
        self._done = asyncio.Event()
        self._task: asyncio.Task | None = None

    def feed(self, piece: str) -> None:
        self.text += piece

    def start(self) -> None:
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        while not self._done.is_set():
            await self.sleep(self.interval)
            if self._done.is_set():
                return
            if self.text and self.text != self.sent:
                snapshot = self.text
                try:
                    await self.edit(snapshot + self.CURSOR)
                    self.sent = snapshot
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


# --- doctor ----------------------------------------------------------------------------------
# ``leanote-rag doctor`` runs each bot's ``check(settings)`` (entry points
# ``leanote_rag.checks``), which yields (name, ok, detail, fix). Tokens never appear.
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
/outbox — 还没写进 Leanote 的记录 captures waiting for Leanote"""

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
    ("help", "帮助 / help"),
]


def trace_text(trace: Trace | None) -> str:
    if trace is None:
        return "这段对话还没有回答过问题。 / No answer in this conversation yet."
    lines = [f"问题 question: {trace.question}"]
    if trace.standalone != trace.question:
        lines.append(f"改写为 rewritten: {trace.standalone}")
    if trace.expansion:
        lines.append(f"扩展 expansion: {trace.expansion}")
    lines.append(f"重排 rerank: {trace.rerank}")
    if trace.budget:
        lines.append(f"篇幅 budget: {trace.budget}")
    if trace.entities:
        lines.append(f"实体 entities: {'; '.join(trace.entities)}")
    if trace.facts:
        lines.append("事实 facts: " + "; ".join(trace.facts))
    lines.append(f"结论 decision: {trace.decision}")
    if trace.llm_error:  # the details (host, model) are in the service's log
        lines.append("LLM: 不可用，用了笔记原文 unavailable: answered with passages")
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
