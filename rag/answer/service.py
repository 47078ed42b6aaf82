"""Question in, grounded answer out: ``AnswerService.ask``, in named stages, each timed as the
trace's timings name it.

    understand  a follow-up made standalone: rewritten by the LLM within a share of the budget,
                else joined to the last question (rag.answer.followup)
    listed      "which notes did I write about X": the memory's list, no LLM (rag.answer.remembered)
    retrieve    hybrid search with the entities the question names (and the LLM's expansion when
                it comes in time), the facts about them for the evidence
    rerank      time-budgeted (rag.answer.rerank)
    refused     a name no note mentions, or nothing plausible: the refusal and the closest notes,
                no LLM call (rag.answer.gate)
    evidence    blocks cut to what the LLM reads here within ``answer.first_token_budget``
                (rag.answer.sizing); the sources shown first
    generate    the LLM, streamed one checked sentence at a time; its reply read for what it
                stands on (rag.answer.support); the passages when it fails or says nothing of
                the evidence (rag.answer.outcomes)

Every LLM reply teaches the service how fast the model is here (``rag.speed``). The service
returns an ``Answer`` (text, citations with links, timings, a trace of why); every door only
renders it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

from rag import limits
from rag import llm as llm_mod
from rag import language
from rag.answer import copies, followup, outcomes, refusing, remembered, repeats, support
from rag.answer import rerank as rerank_mod
from rag.answer.conversation import Conversations
from rag.answer.evidence import build_evidence, header
from rag.answer.expand import OUTPUT_TOKENS as EXPAND_TOKENS
from rag.answer.expand import SYSTEM as EXPAND_SYSTEM
from rag.answer.expand import Expander
from rag.answer.fair import CALLER, FairSlots, Turns
from rag.answer.sizing import Plan, fit, measure_speed, plan_for, prompt_text
from rag.answer.alikes import sound_alikes
from rag.answer.types import Answer, Candidate, Citation, Trace, extractive
from rag.config import Settings
from rag.errors import LeanoteRagError, ModelMissing, Unavailable, UserError
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search
from rag.memory.store import MemoryStore
from rag.model import Hit
from rag.speed import FILE as SPEED_FILE
from rag.speed import SpeedBook, Usage

log = logging.getLogger(__name__)

# Threads that run searches and the memory's reads for answers: one slow search (waiting on
# an embedding model, or on SQLite) holds one of them, not everyone's answers. The index
# (Qdrant Edge), the embedders and the memory (behind its lock) were already used from two
# threads at once (the sync writes while answers search); tests/test_doors.py checks that
# concurrent answers come out as one at a time. Qdrant Edge holds the GIL while it queries, so
# its part interleaves rather than runs in parallel.
SEARCH_WORKERS = 4
EXPAND_SHARE = 0.25  # of the first-token budget, at most, for the query expansion
MIN_EXPAND_WAIT = 1.0  # seconds: however fast the model measured, it gets this long
SOURCES_WITHIN = 2.0  # seconds: retrieval.expand auto never holds the sources back longer than this


OnToken = Callable[[str], "Awaitable[None] | None"]
# Called once, before the LLM reads anything, with the notes its evidence comes from (the
# best first, one per note, at most ``outcomes.SOURCES_FIRST``): a slow CPU's wait is not silence.
OnSources = Callable[[list["Citation"]], "Awaitable[None] | None"]


@dataclass
class Turn:
    """One answer under way: who asks, in which conversation, what the stages found (the
    question as cut, the standalone question, the trace) and when each stage ended."""

    user_id: str
    conversation: str | None
    on_token: "OnToken | None"
    on_sources: "OnSources | None"
    question: str = ""
    standalone: str = ""
    heard: bool = False  # the question is a transcript (rag.answer.alikes)
    # Text read in a photo sent with the question (``seen`` of ``ask``): searched, and left out of
    # ``own``: the person's own words, the only ones whose names are judged (refuse_unknown_names).
    seen: str = ""
    own: str = ""
    trace: Trace | None = None
    shown_sources: bool = False
    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def mark(self, stage: str) -> None:
        """The stage ended now: milliseconds since the question came (``Answer.timings_ms``)."""
        self.timings[stage] = round(self.elapsed() * 1000, 1)


@dataclass
class Prepared:
    """The evidence an answer's LLM reads: the plan of its size, the blocks, the prompt."""

    plan: "Plan"
    blocks: list
    prompt: list[dict]


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
        memory: MemoryStore | None = None,
    ):
        """``one_shot``: one command's question (the CLI shows why the LLM failed itself),
        not a service whose log is the operator's window. ``memory``: the memory of the
        notes to answer with (None: answers as without one). The parts are the caller's
        (``bot.root.Parts`` builds them); ``close`` closes the reranker it wraps."""
        self.one_shot = one_shot
        self.memory = memory
        self._settings = settings
        self.index = index
        self.chat = chat
        self.reranker = rerank_mod.BudgetedReranker(reranker, settings.rerank.budget) if reranker else None
        self.rerank_unavailable = rerank_unavailable
        self.conversations = Conversations(settings.answer.history_chars, settings.answer.idle_reset, clock)
        self.speeds = SpeedBook(Path(settings.state_dir) / SPEED_FILE if chat is not None else None)
        self.expander = Expander(self._stream)
        self._llm_failing = False
        self._llm_slots: FairSlots | None = None  # answers the LLM writes at once, round the callers
        self._turns = Turns(lambda: self.settings.bots.max_concurrent_llm)  # answers under way per caller
        # Answers holding or awaiting an LLM slot: work sharing the LLM (sync.memory_jobs) runs only at 0.
        self.answers_waiting_or_writing = 0
        self.searching = 0  # index work under way on the search threads (``in_search_thread``)
        # Retrieval runs off the event loop on a few threads, so one slow search (a slow
        # embedder, a large memory) cannot hold another person's answer (SEARCH_WORKERS).
        self._search_pool = ThreadPoolExecutor(max_workers=SEARCH_WORKERS, thread_name_prefix="search")
        # Called with every finished answer (metrics); an observer that raises is logged, never felt.
        self.observers: list[Callable[[Answer], None]] = []

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        """New settings (a reload, ``bot.root.Parts.apply``): every answer from now on
        reads them, and the conversations keep their new limits."""
        self._settings = settings
        self.conversations.max_chars = settings.answer.history_chars
        self.conversations.idle_reset = settings.answer.idle_reset

    @asynccontextmanager
    async def llm_slot(self) -> AsyncIterator[None]:
        """One of the ``bots.max_concurrent_llm`` slots for an answer's LLM call, given round
        the callers waiting (``rag.answer.fair``). Counted in ``answers_waiting_or_writing``
        from before it is acquired (an answer waiting for a slot wants the LLM too) until it
        is released, however the call ends."""
        if self._llm_slots is None:
            self._llm_slots = FairSlots(self.settings.bots.max_concurrent_llm)
        self.answers_waiting_or_writing += 1
        try:
            async with self._llm_slots.slot(CALLER.get()):
                yield
        finally:
            self.answers_waiting_or_writing -= 1

    def close(self) -> None:
        self.speeds.flush()
        if self.reranker:
            self.reranker.close()
        self._search_pool.shutdown(wait=False)

    # --- the pipeline ---------------------------------------------------------------------

    async def in_search_thread(self, fn, *args):
        """Index work on a search thread, off the event loop; counted (the second index's fill waits for 0)."""
        self.searching += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._search_pool, partial(fn, *args))
        finally:
            self.searching -= 1

    async def search(self, query: str, user_id: str, k: int | None = None, retriever: str = "hybrid") -> list[Hit]:
        """Hits only (``/search``), on the threads the answers search on; the query cut to
        ``limits.question_chars``."""
        query, _ = limits.cut(query, self.settings.limits.question_chars)
        return await self.in_search_thread(partial(search, self.index, query, user_id, k, retriever=retriever))

    async def ask(
        self,
        question: str,
        user_id: str,
        conversation: str | None = None,
        on_token: OnToken | None = None,
        on_sources: OnSources | None = None,
        caller: str | None = None,
        heard: bool = False,
        seen: str = "",
    ) -> Answer:
        """The answer to ``question`` from ``user_id``'s notes. ``caller`` (an API token, a
        chat person; default: the conversation, else the user) gets its fair share: at most
        ``bots.max_concurrent_llm`` of its answers under way at once, and the LLM's slots
        in turn with other callers (``rag.answer.fair``). ``heard``: the question is what a voice
        clip was heard as (its sound-alikes of the notes' words join the search: ``rag.answer.alikes``).
        ``seen``: text read from a photo sent with the question (an error on a terminal, a page):
        searched with it, after it, as part of the question, but evidence of what the person saw,
        not words they chose: a host name, a prompt or a path in it is no name they ask about
        (``answer.refuse_unknown_names`` reads only ``question``), and a photo is what a short
        question such as "这个报错怎么办" refers to, not the conversation before it."""
        key = caller or conversation or user_id
        async with self._turns.turn(key):
            token = CALLER.set(key)
            try:
                return await self._ask(question, user_id, conversation, on_token, on_sources, heard, seen)
            finally:
                CALLER.reset(token)

    async def _ask(self, question: str, user_id: str, conversation: str | None, on_token: OnToken | None,
                   on_sources: OnSources | None, heard: bool = False, seen: str = "") -> Answer:
        """The answer in stages, each named as the trace's timings name it; a stage that ends
        the answer (a listing, a refusal, the passages) returns it."""
        turn = await self._understand(question, user_id, conversation, on_token, on_sources, seen)
        turn.heard = heard
        listed = await self._listed(turn)
        if listed is not None:
            return listed
        hits, facts = await self._retrieve(turn)
        hits, scores = await self._rerank(turn, hits)
        top = hits[: self.settings.answer.top_k]
        refused = await self._refused(turn, hits, top, scores)
        if refused is not None:
            return refused
        evidence = await self._evidence(turn, top, facts)
        if isinstance(evidence, Answer):  # the LLM failed while its speed was measured
            return evidence
        passages = self._without_llm(turn, top, evidence.plan)
        if passages is not None:
            return passages
        return await self._generate(turn, top, evidence)

    # --- the stages of an answer -----------------------------------------------------------

    async def _understand(self, question: str, user_id: str, conversation: str | None, on_token: OnToken | None,
                          on_sources: OnSources | None, seen: str = "") -> "Turn":
        """``rewrite``: the question (and the text of a photo sent with it, after it) cut to
        ``limits.question_chars`` (every stage reads at most that), and a follow-up made
        standalone from the conversation's history."""
        turn = Turn(user_id, conversation, on_token, on_sources)
        most = self.settings.limits.question_chars
        own, seen = question.strip(), seen.strip()
        question, _ = limits.cut("\n\n".join(p for p in (own, seen) if p), most)
        if not question:
            raise UserError("the question is empty")
        turn.own, turn.seen = limits.cut(own, most)[0], seen
        history = self.conversations.history(user_id, conversation)
        standalone, follow = question, ""
        if history and not seen and followup.is_follow_up(question):
            standalone, follow = await self._standalone(history, question, self.settings.limits.question_chars)
            turn.mark("rewrite")
        turn.question, turn.standalone = question, standalone
        dense = self.index.dense_side(user_id) if self.index is not None else ""  # (no index: a test's)
        turn.trace = Trace(question, standalone, followup=follow, dense=dense)
        return turn

    async def _listed(self, turn: "Turn") -> Answer | None:
        """"Which notes did I write about X": the memory's list, without the LLM."""
        about = remembered.notes_about(turn.standalone) if self.memory is not None else None
        if not about:
            return None
        listing = await self.in_search_thread(remembered.listing, self.memory, self.index, turn.question, about,
                                              turn.user_id, turn.trace)
        if listing is None:
            return None
        turn.mark("retrieve")
        return self._end(turn, listing)

    async def _retrieve(self, turn: "Turn") -> tuple[list[Hit], list[dict]]:
        """``retrieve``: the entities and facts the memory knows of the question, hybrid search
        (with the LLM's expansion fused in when it came in time); the candidates go into the
        trace. Also the facts about the entities it names, for the evidence."""
        trace, standalone = turn.trace, turn.standalone
        k = max(self.settings.rerank.candidates, self.settings.answer.top_k)
        entities, facts = await self.in_search_thread(remembered.remembered, self.memory, self.index, self.settings,
                                                      standalone, turn.user_id, k, trace)
        wait, why_not = self._expansion_wait(standalone, turn.elapsed())
        person = f"{turn.user_id}\x00{turn.conversation or ''}"
        expanding = asyncio.create_task(self._expand(standalone, wait, person)) if wait else None
        hits = await self.in_search_thread(partial(search, self.index, standalone, turn.user_id, k, entities=entities))
        terms, hypothesis = [], ""
        if turn.heard:  # the candidates' words the transcript sounds like (rag.answer.alikes)
            trace.alikes = await self.in_search_thread(sound_alikes, standalone, [h.text for h in hits])
            terms += trace.alikes
        if expanding is not None:  # it ran while the first retrieval ran; its rankings join the fusion
            expansion, trace.expansion = await self._expansion(expanding, wait - turn.elapsed())
            if expansion is not None:
                terms, hypothesis = terms + expansion.terms, expansion.answer
        else:
            trace.expansion = why_not
        if terms or hypothesis:
            hits = await self.in_search_thread(
                partial(search, self.index, standalone, turn.user_id, k, expansion=(terms, hypothesis), entities=entities))
        turn.mark("retrieve")
        trace.candidates = [
            Candidate(h.point_id, h.note_id, h.title, h.heading, h.dense_rank, h.dense_score, h.sparse_rank,
                      h.sparse_score, round(h.score, 6))
            for h in hits
        ]
        return hits, facts

    async def _rerank(self, turn: "Turn", hits: list[Hit]) -> tuple[list[Hit], dict[str, float]]:
        """``rerank``: the candidates in the reranker's order, within its time budget."""
        trace = turn.trace
        if not (self.reranker and hits):
            trace.rerank = self.rerank_unavailable or "no reranker configured"
            return hits, {}
        outcome = await asyncio.to_thread(self.reranker.rerank, turn.standalone, hits)
        hits, scores, trace.rerank = outcome.hits, outcome.scores, outcome.note
        for c in trace.candidates:
            c.rerank = scores.get(c.point_id)
        turn.mark("rerank")
        return hits, scores

    async def _refused(self, turn: "Turn", hits: list[Hit], top: list[Hit], scores: dict[str, float]) -> Answer | None:
        """The refusal without asking the LLM (``rag.answer.refusing``): a name the notes never
        mention in the person's own words, or evidence too weak to be about the question."""
        trace = turn.trace
        judged = await self.in_search_thread(refusing.judge, self.index, self.settings, turn.standalone,
                                             turn.own if turn.seen else turn.standalone, turn.user_id, hits, scores)
        trace.gate = judged.signals
        if not judged.why:
            return None
        trace.decision, trace.outcome = judged.why, "refused"
        trace.unknown_names = judged.names if judged.for_names else []
        answer = outcomes.refusal(self.settings, turn.question, top, turn.standalone, judged.rarity)
        answer.notice = judged.notice(turn.question)
        return self._end(turn, answer)

    async def _evidence(self, turn: "Turn", top: list[Hit], facts: list[dict]) -> "Prepared | Answer":
        """``sources`` (when the model's speed is not known yet: shown first, then the speed
        measured with a short reply) and the evidence cut to what the LLM reads here within the
        budget (``budget`` in the trace). An answer when the LLM failed while it was measured."""
        cfg, trace = self.settings.answer, turn.trace
        if self.chat is not None and not self.speeds.get(self.chat.model).read_tps:
            # The first answer with this model here: the sources now, then the model's speed
            # measured with a short reply (its fixed instructions, which Ollama then keeps in
            # its prompt cache for the answer), so the evidence is sized to it.
            if turn.on_sources is not None:
                await _call(turn.on_sources, outcomes.sources(turn.question, build_evidence(top, cfg)))
            turn.shown_sources = True
            turn.mark("sources")
            try:
                trace.budget = await self._measure(turn.standalone)
            except (Unavailable, ModelMissing) as err:
                return self._end(turn, self._llm_down(turn.question, top, trace, err))
        model = self.chat.model if self.chat is not None else None
        plan = plan_for(self.settings, model, self.speeds.get(model or ""), turn.standalone, top, turn.elapsed())
        blocks, prompt, used = fit(self.settings, turn.standalone, top, plan, facts, llm=self.chat is not None)
        trace.facts = [f"[{n}] {f['subject']} — {f['predicate']} — {f['object']}" for n, f in used]
        trace.budget = "; ".join(p for p in (trace.budget, plan.note) if p)
        trace.evidence = {str(b.n): f"{header(b)}\n{b.text}" for b in blocks}
        by_point = {pid: b.n for b in blocks for pid in b.point_ids}
        for c in trace.candidates:
            c.evidence = by_point.get(c.point_id)
        return Prepared(plan, blocks, prompt)

    def _without_llm(self, turn: "Turn", top: list[Hit], plan: Plan) -> Answer | None:
        """The passages as the answer: no LLM configured, or one too slow here to read even the
        best passage and answer within ``ollama.timeout``."""
        trace, question = turn.trace, turn.question
        refusal = language.refusal(self.settings, question)
        if self.chat is None:
            trace.decision = "no LLM configured (ollama.enabled: false): extractive answer"
            trace.outcome = "extractive"
            return self._end(turn, extractive(question, top, refusal=refusal))
        if plan.too_slow:
            # Not even the best passage can be read and answered within ollama.timeout here:
            # the passages, rather than a guess from a scrap or an answer cut off by the timeout.
            trace.decision, trace.outcome = f"{plan.too_slow}: extractive answer", "fallback"
            answer = extractive(question, top, refusal=refusal)
            answer.notice = outcomes.language_notice(question, outcomes.TOO_SLOW_ZH, outcomes.TOO_SLOW_EN)
            return self._end(turn, answer)
        return None

    async def _generate(self, turn: "Turn", top: list[Hit], evidence: "Prepared") -> Answer:
        """``first_token`` and the rest: the LLM's reply streamed to the person one checked
        unit at a time (``rag.answer.support``: a sentence the evidence does not hold is never
        on screen, not even for a moment), then read for what it stands on; the passages
        when the LLM fails."""
        trace, plan, blocks, prompt = turn.trace, evidence.plan, evidence.blocks, evidence.prompt
        if turn.on_sources is not None and not turn.shown_sources:
            await _call(turn.on_sources, outcomes.sources(turn.question, blocks))
        if not turn.shown_sources:
            turn.mark("sources")
        gate = copies.Bound(support.Gate(support.Checker(turn.standalone, {b.n: (header(b), b.text) for b in blocks},
                                                         translate=self._translated)), turn.standalone)
        parts: list[str] = []  # what the LLM wrote
        usage = Usage()
        asked = first_at = None
        looped = 0  # units said again in a row when the reply was stopped (rag.answer.repeats)
        options = {**repeats.options(self.settings.ollama), **(plan.options or {})}
        try:
            async with self.llm_slot():
                asked = time.perf_counter()
                async with aclosing(self._stream(prompt, usage, options, answer=True)) as stream:
                    async for piece in stream:
                        if "first_token" not in turn.timings:
                            turn.mark("first_token")
                            first_at = time.perf_counter()
                        parts.append(piece)
                        out = gate.feed(piece)
                        if out:
                            await _call(turn.on_token, out)
                        if looped := repeats.looping(gate.verdicts):
                            break  # closing the stream closes the request: the LLM stops writing
            tail = gate.cut() if looped else gate.flush()
            if tail:
                await _call(turn.on_token, tail)
        except (Unavailable, ModelMissing) as err:
            waited = time.perf_counter() - asked if asked is not None else 0.0
            if isinstance(err, Unavailable) and not usage.reported and waited >= self.settings.ollama.timeout * 0.5:
                # cut short by the timeout while the model read or wrote: what that says of its speed
                self.speeds.cut_short(self.chat.model, plan.prompt_tokens(prompt), waited,
                                      first_at - asked if first_at is not None else None)
            return self._end(turn, self._llm_down(turn.question, top, trace, err))
        self._llm_ok()
        text = "".join(parts).strip()
        rarity = None  # what the passages shown instead must be about (not needed for the model's own answer)
        if support.verdict(text, gate.result, self.settings.answer.refusal) not in ("cited", "inferred"):
            rarity = await self.in_search_thread(refusing.rarity, self.index, turn.standalone, turn.user_id, self.settings)
        answer = outcomes.grounded(self.settings, turn.question, turn.standalone, text, gate.result, blocks, top, trace,
                                   rarity)
        if looped:
            trace.decision += (f"; the LLM was stopped after {len(text)} characters: it wrote {looped} sentences in a "
                               f"row it had written before")
        answer.usage = {"prompt_tokens": usage.prompt_tokens, "prompt_seconds": round(usage.prompt_seconds, 3),
                        "output_tokens": usage.output_tokens, "output_seconds": round(usage.output_seconds, 3),
                        "prompt_tokens_estimated": plan.prompt_tokens(prompt)}
        return self._end(turn, answer)

    def _end(self, turn: "Turn", answer: Answer) -> Answer:
        return self._finish(answer, turn.user_id, turn.conversation, turn.trace, turn.timings, turn.started)

    # --- a follow-up, made standalone (rag.answer.followup) ---------------------------------------

    async def _standalone(self, history: list[tuple[str, str]], question: str, most: int) -> tuple[str, str]:
        """The follow-up as a question of its own, and a line for the trace: rewritten by the LLM
        when that fits its share of the budget here, else joined to the last question."""
        joined = limits.cut(followup.joined(history, question), most)[0]
        if self.chat is None:
            return joined, "joined to the last question (no LLM)"
        prompt = followup.messages(history, question)
        plan = followup.plan(prompt, self.speeds.get(self.chat.model), self.settings.answer.first_token_budget)
        if not plan.rewrite:
            return joined, f"joined to the last question: {plan.why}"

        async def rewrite() -> str:
            async with self.llm_slot():
                return await self._complete(prompt)

        try:  # the wait for a free LLM slot counts too: the person waits for either
            rewritten = await asyncio.wait_for(rewrite(), timeout=plan.wait)
        except asyncio.TimeoutError:
            return joined, f"joined to the last question: the rewrite was not ready within {plan.wait:.1f} s"
        except LeanoteRagError as err:
            log.info("could not rewrite the follow-up (%s); searching with it joined to the last question", err)
            return joined, f"joined to the last question: the rewrite failed ({err})"
        rewritten = limits.cut(" ".join(rewritten.split()), most)[0]
        if not rewritten:
            return joined, "joined to the last question: the rewrite came back empty"
        return rewritten, f"rewritten by the LLM ({plan.why})"

    # --- LLM-assisted retrieval (rag.answer.expand) ----------------------------------------------

    def _expansion_wait(self, question: str, elapsed: float) -> tuple[float, str]:
        """How long the answer may wait for an expansion (0: none), and why not."""
        mode = self.settings.retrieval.expand
        if mode == "off" or self.chat is None:
            return 0.0, "" if self.chat is None else "off (retrieval.expand)"
        budget = self.settings.answer.first_token_budget * EXPAND_SHARE - elapsed
        needs = self.speeds.get(self.chat.model).reply_seconds(EXPAND_SYSTEM + question, EXPAND_TOKENS)
        if needs is None:
            if mode == "auto":
                return 0.0, "auto: not until the LLM's speed here is measured"
            return max(0.0, budget), ""
        if mode == "auto":
            if needs > budget:
                return 0.0, (f"auto: skipped, it would take ~{needs:.1f} s here, over "
                             f"{EXPAND_SHARE:.0%} of answer.first_token_budget")
            # the sources wait for the expansion's search: auto never makes them wait long
            if needs > SOURCES_WITHIN:
                return 0.0, (f"auto: skipped, it would take ~{needs:.1f} s here, and the sources would wait "
                             f"for it (they are shown within {SOURCES_WITHIN:g} s)")
            budget = min(budget, SOURCES_WITHIN)
        # twice the estimate, and never less than a round trip and a warm model need
        return max(0.0, min(budget, max(MIN_EXPAND_WAIT, needs * 2))), ""

    async def _expand(self, question: str, wait: float, person: str):
        async with self.llm_slot():
            return await self.expander.expand(question, timeout=max(0.1, wait), person=person)

    async def _expansion(self, task: asyncio.Task, left: float):
        """The expansion if it is ready within ``left`` seconds, and a line for the trace."""
        try:
            expansion = await asyncio.wait_for(task, timeout=max(0.0, left))
        except asyncio.TimeoutError:
            return None, "dropped: not ready in time (the answer does not wait for it)"
        if expansion.empty:
            return None, "none: the LLM gave no usable terms"
        return expansion, expansion.describe()

    # --- the LLM, and its speed here -------------------------------------------------------

    async def _stream(self, prompt: list[dict], usage: Usage, options: dict | None = None, answer: bool = False,
                      **kwargs):
        """The LLM's reply, piece by piece; when it ends, what it cost teaches the speed book
        (``answer``: and the size of an answer's prompt)."""
        async with aclosing(self.chat.stream(prompt, usage=usage, options=options, **kwargs)) as stream:
            async for piece in stream:
                yield piece
        shared = prompt[0]["content"] if len(prompt) > 1 and prompt[0]["role"] == "system" else ""
        self.speeds.observe(self.chat.model, usage, prompt_text(prompt), answer=answer, shared_text=shared)

    async def _complete(self, prompt: list[dict], options: dict | None = None, **kwargs) -> str:
        return "".join([piece async for piece in self._stream(prompt, Usage(), options, **kwargs)])

    # --- pieces ---------------------------------------------------------------------------

    def _llm_down(self, question: str, top: list[Hit], trace: Trace, err: Exception) -> Answer:
        """The LLM failed (down, timing out, model missing): said once in the log, and the best
        passages with a plain notice (``rag.answer.outcomes.llm_down``)."""
        self._llm_failed(err)
        return outcomes.llm_down(self.settings, question, top, trace, err)

    async def _measure(self, question: str) -> str:
        """Measure the LLM's speed here (``measure_speed``) on an LLM slot; a line for the
        trace. Raises Unavailable or ModelMissing when the LLM cannot be reached."""
        async with self.llm_slot():
            line = await measure_speed(self.chat, self.speeds, self.settings, question)
        self._llm_ok()
        return line

    async def measure(self) -> str | None:
        """Measure the LLM's speed here when nothing has measured it yet (at ``serve`` start, in
        ``doctor``): a line saying what was learned, or None when it was known (the replies keep it)."""
        if self.chat is None or self.speeds.get(self.chat.model).read_tps:
            return None
        return await self._measure("你好")

    def _llm_failed(self, err: Exception) -> None:
        """Logged once when the LLM starts failing (and once when it recovers), not per question."""
        if not self._llm_failing:
            log.log(logging.DEBUG if self.one_shot else logging.WARNING, "answering without the LLM: %s", err)
        self._llm_failing = True

    def _llm_ok(self) -> None:
        if self._llm_failing:
            log.info("the LLM answers again")
        self._llm_failing = False

    def _translated(self, question: str) -> frozenset[str]:
        """An English question's Chinese words (``rag.answer.refusing.translated``); in the search thread."""
        return refusing.translated(self.settings, question)

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


async def _call(fn, value) -> None:
    if fn is None:
        return
    result = fn(value)
    if asyncio.iscoroutine(result):
        await result

