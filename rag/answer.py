"""Question in, grounded answer out.

    follow-up? -> rewrite into a standalone question (LLM; skipped without history or LLM)
    -> hybrid retrieval (top ``rerank.candidates``) -> rerank (time-budgeted) -> top-k
    -> too weak to answer from? refusal phrase + closest notes, no LLM call
    -> evidence blocks -> the LLM, streamed -> citations parsed, bad markers removed
    -> Ollama down, timing out, model missing? the best passages, cited, with a notice

The core returns an ``Answer`` (text, citations with links, timings, a trace of
why); the CLI and the bots only render it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Awaitable, Callable

from . import llm as llm_mod
from . import rerank as rerank_mod
from .config import AnswerConfig, Settings
from .errors import LeanoteRagError, ModelMissing, Unavailable, UserError
from .evidence import CitationFilter, Evidence, build_evidence, cited, condense_messages, messages
from .excerpt import EXCERPT_CHARS, excerpt, _window
from .index import NoteIndex
from .lexical import search_text, tokenize
from .model import HEADING_SEP, Hit
from .retrieve import search

log = logging.getLogger(__name__)

REFUSAL = AnswerConfig().refusal
MAX_PASSAGES = 3
LLM_DOWN_ZH = "（语言模型暂时不可用，以下是笔记里最相关的段落。）"
LLM_DOWN_EN = "(The language model is unavailable right now; here are the most relevant passages of your notes.)"
# Extractive passages from notes scoring below this share of the best hit's score are
# left out: they are what the search found next, not what answers the question.
MIN_RELATIVE_SCORE = 0.7
_CJK = re.compile(r"[\u3400-\u9fff]")
# What kind of answer it was, for machines (``Trace.outcome``; metrics): a grounded LLM
# answer, the LLM refused or cited nothing, refused without asking the LLM (no evidence),
# the LLM failed so passages instead, no LLM configured so passages.
OUTCOMES = ("llm", "llm_refused", "refused", "fallback", "extractive")


@dataclass
class Citation:
    n: int
    note_id: str
    title: str
    notebook: str
    heading: str
    url: str
    excerpt: str
    score: float

    @property
    def label(self) -> str:
        return HEADING_SEP.join(p for p in (self.title, self.heading) if p)


@dataclass
class Candidate:
    """One retrieved chunk, and what each stage thought of it (for ``--trace``, ``/why``)."""

    point_id: str
    note_id: str
    title: str
    heading: str
    dense_rank: int | None
    dense_score: float | None
    sparse_rank: int | None
    sparse_score: float | None
    fused: float
    rerank: float | None = None
    evidence: int | None = None  # the evidence block it went into

    def cells(self) -> tuple[str, str, str, str, str]:
        """dense rank/score, sparse rank/score, fused, rerank, evidence block: as text, for display."""
        return (
            f"{self.dense_rank}/{self.dense_score:.3f}" if self.dense_rank else "-",
            f"{self.sparse_rank}/{self.sparse_score:.1f}" if self.sparse_rank else "-",
            f"{self.fused:.4f}",
            f"{self.rerank:.3f}" if self.rerank is not None else "-",
            f"[{self.evidence}]" if self.evidence else "",
        )


@dataclass
class Trace:
    question: str
    standalone: str
    candidates: list[Candidate] = field(default_factory=list)
    rerank: str = ""
    decision: str = ""  # why the answer is what it is
    llm_error: str | None = None
    outcome: str = ""  # one of OUTCOMES, set with the decision
    # A citation [n] is evidence block n; each candidate names the block it went into.


@dataclass
class Answer:
    question: str
    answer: str
    used_llm: bool
    grounded: bool
    citations: list[Citation] = field(default_factory=list)
    closest: list[Citation] = field(default_factory=list)  # with a refusal: the nearest notes
    notice: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    trace: Trace | None = None

    def as_json(self, with_trace: bool = False) -> dict:
        out = asdict(self)
        if not with_trace:
            out.pop("trace")
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Answer":
        """The answer as ``as_json(with_trace=True)`` wrote it (the daemon's API sends it so)."""
        trace = data.get("trace")
        if trace is not None:
            trace = Trace(**{**trace, "candidates": [Candidate(**c) for c in trace.get("candidates", [])]})
        return cls(
            **{**data, "citations": [Citation(**c) for c in data.get("citations", [])],
               "closest": [Citation(**c) for c in data.get("closest", [])], "trace": trace}
        )


def _citation(n: int, hit_or_block, question: str) -> Citation:
    text = hit_or_block.text
    return Citation(
        n=n,
        note_id=hit_or_block.note_id,
        title=hit_or_block.title,
        notebook=hit_or_block.notebook,
        heading=hit_or_block.heading,
        url=hit_or_block.url,
        excerpt=excerpt(text, question),
        score=round(hit_or_block.score, 6),
    )


def extractive(question: str, hits: list[Hit], max_passages: int = MAX_PASSAGES, refusal: str = REFUSAL) -> Answer:
    """The best passage of each of the best notes, numbered, with citations."""
    by_note: dict[str, list[Hit]] = {}
    floor = hits[0].score * MIN_RELATIVE_SCORE if hits else 0.0
    for hit in hits:
        if hit.score >= floor:
            by_note.setdefault(hit.note_id, []).append(hit)
    citations: list[Citation] = []
    for note_hits in by_note.values():
        # the note's chunk whose best window matches the question best
        hit = max(note_hits, key=lambda h: _window(h.text, question, EXCERPT_CHARS)[0])
        citations.append(_citation(len(citations) + 1, hit, question))
        if len(citations) >= max_passages:
            break
    if not citations:
        return Answer(question, refusal, used_llm=False, grounded=False)
    body = "\n\n".join(f"[{c.n}] {c.excerpt}" for c in citations)
    return Answer(question, body, used_llm=False, grounded=True, citations=citations)


class Conversations:
    """What the service remembers of each conversation: recent turns within a character
    budget and the trace of the last answer, forgotten together after an idle time.

    A conversation is keyed by the Leanote user *and* the caller's conversation id (the
    bots make that id per person: platform, chat and chat user), so one person's turns
    and traces can never reach another person's follow-up or ``/why``."""

    def __init__(self, max_chars: int, idle_reset: float, clock: Callable[[], float] = time.monotonic):
        self.max_chars = max_chars
        self.idle_reset = idle_reset
        self.clock = clock
        self._turns: dict[tuple[str, str], deque[tuple[str, str]]] = {}
        self._traces: dict[tuple[str, str], Trace] = {}
        self._seen: dict[tuple[str, str], float] = {}

    def _live(self, key: tuple[str, str]) -> bool:
        seen = self._seen.get(key)
        if seen is None:
            return False
        if self.clock() - seen > self.idle_reset:
            self._forget(key)
            return False
        return True

    def history(self, user_id: str, conversation: str | None) -> list[tuple[str, str]]:
        key = (user_id, conversation or "")
        if conversation is None or not self._live(key):
            return []
        return list(self._turns.get(key, ()))

    def trace(self, user_id: str, conversation: str) -> Trace | None:
        key = (user_id, conversation)
        return self._traces.get(key) if self._live(key) else None

    def record(self, user_id: str, conversation: str | None, trace: Trace, answer: str | None) -> None:
        """Keep the last trace, and the turn when ``answer`` is given (grounded answers)."""
        if conversation is None:
            return
        key = (user_id, conversation)
        self._live(key)  # an idle conversation starts afresh
        self._traces[key] = trace
        self._seen[key] = self.clock()
        if answer is not None and self.max_chars:
            turns = self._turns.setdefault(key, deque())
            turns.append((trace.standalone, answer))
            while turns and sum(len(q) + len(a) for q, a in turns) > self.max_chars:
                turns.popleft()
        self._prune()

    def reset(self, user_id: str, conversation: str) -> None:
        self._forget((user_id, conversation))

    def _forget(self, key: tuple[str, str]) -> None:
        self._turns.pop(key, None)
        self._traces.pop(key, None)
        self._seen.pop(key, None)

    def _prune(self) -> None:
        """Idle conversations go, so memory does not grow with every person ever seen."""
        if len(self._seen) > 256:
            for key in [k for k, seen in self._seen.items() if self.clock() - seen > self.idle_reset]:
                self._forget(key)


def relevance(question: str, hits: list[Hit]) -> tuple[float, float]:
    """Two signals that the notes may hold an answer, both comparable across corpora
    of any size: the best dense similarity among the candidates, and the largest share
    of the question's terms found in one of the top five chunks."""
    dense = max((h.dense_score for h in hits if h.dense_score is not None), default=0.0)
    terms = set(tokenize(question))
    cover = 0.0
    if terms:
        for h in hits[:5]:
            found = terms & set(tokenize(f"{h.title}\n{h.heading}\n{search_text(h.text)}"))
            cover = max(cover, len(found) / len(terms))
    return dense, cover


def _language_notice(question: str, zh: str, en: str) -> str:
    return zh if _CJK.search(question) else en


OnToken = Callable[[str], "Awaitable[None] | None"]


class AnswerService:
    """The one answer pipeline, shared by the CLI and both bots."""

    def __init__(
        self,
        settings: Settings,
        index: NoteIndex,
        chat: llm_mod.ChatModel | None = None,
        reranker: rerank_mod.Reranker | None = None,
        rerank_unavailable: str = "",
        clock: Callable[[], float] = time.monotonic,
        one_shot: bool = False,
    ):
        """``one_shot``: one command's question (the CLI shows why the LLM failed itself),
        not a service whose log is the operator's window."""
        self.one_shot = one_shot
        self.settings = settings
        self.index = index
        self.chat = chat
        self.reranker = rerank_mod.BudgetedReranker(reranker, settings.rerank.budget) if reranker else None
        self.rerank_unavailable = rerank_unavailable
        self.conversations = Conversations(settings.answer.history_chars, settings.answer.idle_reset, clock)
        self._llm_failing = False
        self._llm_slots: asyncio.Semaphore | None = None  # answers the LLM writes at once
        # Retrieval runs off the event loop, one search at a time: searches take a few ms,
        # and fewer threads fighting over the GIL keep the loop (the bots) responsive.
        self._search_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
        # Called with every finished answer (metrics); an observer that raises is logged, never felt.
        self.observers: list[Callable[[Answer], None]] = []

    @property
    def llm_slots(self) -> asyncio.Semaphore:
        if self._llm_slots is None:
            self._llm_slots = asyncio.Semaphore(self.settings.bots.max_concurrent_llm)
        return self._llm_slots

    @classmethod
    def from_settings(cls, settings: Settings, index: NoteIndex, one_shot: bool = False) -> "AnswerService":
        """Load the configured reranker and LLM. A reranker that cannot be loaded is
        reported once and answering goes on without it."""
        reranker, why = None, ""
        try:
            reranker = rerank_mod.load(settings.rerank)
        except UserError as err:
            why = str(err)
            log.warning("answering without a reranker: %s", err)
        return cls(settings, index, chat=llm_mod.load(settings.ollama), reranker=reranker, rerank_unavailable=why,
                   one_shot=one_shot)

    def close(self) -> None:
        if self.reranker:
            self.reranker.close()
        self._search_pool.shutdown(wait=False)

    # --- the pipeline ---------------------------------------------------------------------

    async def in_search_thread(self, fn, *args):
        """Run index work (a search, a count) on the one search thread, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._search_pool, partial(fn, *args))

    async def search(self, query: str, user_id: str, k: int | None = None, retriever: str = "hybrid") -> list[Hit]:
        """Hits only (``/search``), on the same thread the answers search on."""
        return await self.in_search_thread(partial(search, self.index, query, user_id, k, retriever=retriever))

    async def ask(
        self,
        question: str,
        user_id: str,
        conversation: str | None = None,
        on_token: OnToken | None = None,
    ) -> Answer:
        cfg = self.settings.answer
        started = time.perf_counter()
        timings: dict[str, float] = {}

        def mark(name: str) -> None:
            timings[name] = round((time.perf_counter() - started) * 1000, 1)

        question = " ".join((question or "").split())
        if not question:
            raise UserError("the question is empty")
        history = self.conversations.history(user_id, conversation)
        standalone = question
        if history and self.chat is not None:
            try:
                async with self.llm_slots:
                    standalone = (await self.chat.complete(condense_messages(history, question))).strip() or question
            except LeanoteRagError as err:
                log.info("could not rewrite the follow-up (%s); searching with it as asked", err)
            mark("rewrite")
        trace = Trace(question, standalone)

        k = max(self.settings.rerank.candidates, cfg.top_k)
        hits = await self.in_search_thread(search, self.index, standalone, user_id, k)
        mark("retrieve")
        trace.candidates = [
            Candidate(h.point_id, h.note_id, h.title, h.heading, h.dense_rank, h.dense_score, h.sparse_rank,
                      h.sparse_score, round(h.score, 6))
            for h in hits
        ]
        rerank_scores: dict[str, float] = {}
        if self.reranker and hits:
            outcome = await asyncio.to_thread(self.reranker.rerank, standalone, hits)
            hits, rerank_scores, trace.rerank = outcome.hits, outcome.scores, outcome.note
            for c in trace.candidates:
                c.rerank = rerank_scores.get(c.point_id)
            mark("rerank")
        else:
            trace.rerank = self.rerank_unavailable or "no reranker configured"
        top = hits[: cfg.top_k]

        weak = self._too_weak(standalone, hits, rerank_scores)
        if weak:
            trace.decision, trace.outcome = weak, "refused"
            answer = self._refusal(question, top)
            return self._finish(answer, user_id, conversation, trace, timings, started)

        blocks = build_evidence(top, cfg)
        by_point = {pid: b.n for b in blocks for pid in b.point_ids}
        for c in trace.candidates:
            c.evidence = by_point.get(c.point_id)
        if self.chat is None:
            trace.decision = "no LLM configured (ollama.enabled: false): extractive answer"
            trace.outcome = "extractive"
            answer = extractive(question, top, refusal=cfg.refusal)
            return self._finish(answer, user_id, conversation, trace, timings, started)

        valid = {b.n for b in blocks}
        filt = CitationFilter(valid)
        parts: list[str] = []
        try:
            async with self.llm_slots:
                async for piece in self.chat.stream(messages(standalone, blocks, cfg.refusal)):
                    if "first_token" not in timings:
                        mark("first_token")
                    out = filt.feed(piece)
                    if out:
                        parts.append(out)
                        await _call(on_token, out)
            tail = filt.flush()
            if tail:
                parts.append(tail)
                await _call(on_token, tail)
        except (Unavailable, ModelMissing) as err:
            # The details (host, model, what failed) are for the operator: the log, the
            # trace of `ask --trace`, doctor. Whoever asked in chat gets a plain notice.
            self._llm_failed(err)
            trace.llm_error = str(err)
            trace.decision, trace.outcome = "the LLM failed: extractive answer", "fallback"
            answer = extractive(question, top, refusal=cfg.refusal)
            answer.notice = _language_notice(question, LLM_DOWN_ZH, LLM_DOWN_EN)
            return self._finish(answer, user_id, conversation, trace, timings, started)
        self._llm_ok()
        text = "".join(parts).strip()
        answer = self._grounded(question, text, blocks)
        trace.decision = "answered by the LLM" if answer.grounded else "the LLM cited nothing or refused"
        trace.outcome = "llm" if answer.grounded else "llm_refused"
        return self._finish(answer, user_id, conversation, trace, timings, started)

    # --- pieces ---------------------------------------------------------------------------

    def _llm_failed(self, err: Exception) -> None:
        """Logged once when the LLM starts failing (and once when it recovers), not per question."""
        if not self._llm_failing:
            log.log(logging.DEBUG if self.one_shot else logging.WARNING, "answering without the LLM: %s", err)
        self._llm_failing = True

    def _llm_ok(self) -> None:
        if self._llm_failing:
            log.info("the LLM answers again")
        self._llm_failing = False

    def _too_weak(self, question: str, hits: list[Hit], rerank_scores: dict[str, float]) -> str:
        """Why the evidence is too weak to ask the LLM, or "" when it is worth a try."""
        cfg = self.settings.answer
        if not hits:
            return "nothing matched"
        if rerank_scores and cfg.min_rerank is not None:
            best = max(rerank_scores.values())
            if best < cfg.min_rerank:
                return f"best rerank score {best:.3f} < answer.min_rerank {cfg.min_rerank}"
            return ""
        dense, cover = relevance(question, hits)
        if dense < cfg.min_dense and cover < cfg.min_coverage:
            return (f"best dense score {dense:.3f} < answer.min_dense {cfg.min_dense} and best term coverage "
                    f"{cover:.2f} < answer.min_coverage {cfg.min_coverage}")
        return ""

    def _refusal(self, question: str, top: list[Hit]) -> Answer:
        closest, seen = [], set()
        for hit in top:
            if hit.note_id not in seen and len(closest) < self.settings.answer.closest_notes:
                seen.add(hit.note_id)
                closest.append(_citation(len(closest) + 1, hit, question))
        return Answer(question, self.settings.answer.refusal, used_llm=False, grounded=False, closest=closest)

    def _grounded(self, question: str, text: str, blocks: list[Evidence]) -> Answer:
        refusal = self.settings.answer.refusal
        _, order = cited(text, {b.n for b in blocks})
        if not text or text.startswith(refusal):
            closest = [_citation(b.n, b, question) for b in blocks[: self.settings.answer.closest_notes]]
            return Answer(question, refusal, used_llm=True, grounded=False, closest=closest)
        by_n = {b.n: b for b in blocks}
        citations = [_citation(n, by_n[n], question) for n in order]
        return Answer(question, text, used_llm=True, grounded=bool(citations), citations=citations)

    def _finish(self, answer: Answer, user_id: str, conversation: str | None, trace: Trace, timings: dict,
                started: float) -> Answer:
        timings["total"] = round((time.perf_counter() - started) * 1000, 1)
        answer.timings_ms = timings
        answer.trace = trace
        self.conversations.record(user_id, conversation, trace, answer.answer if answer.grounded else None)
        for observe in self.observers:
            try:
                observe(answer)
            except Exception:
                log.exception("an answer observer failed (the answer is not affected)")
        return answer


async def _call(fn: OnToken | None, text: str) -> None:
    if fn is None:
        return
    result = fn(text)
    if asyncio.iscoroutine(result):
        await result

