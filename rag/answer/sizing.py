"""How much evidence the LLM reads here, and how long its answer may be.

The LLM's measured speed (``rag.speed``) decides: as much evidence as it reads within what is
left of ``answer.first_token_budget``, never less than a plain answer needs (the best passage
whole, and at least ``answer.min_evidence_chars``: a model given a scrap guesses, refuses or
pastes the note), and an answer length that fits ``ollama.timeout`` after the reading. The
budget is a target: when the floor takes longer to read, the first token comes later. Before
any speed is known, ``measure_speed`` learns it from one short reply.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from rag import llm as llm_mod
from rag.answer.evidence import Evidence, add_facts, build_evidence, messages, prompt_style
from rag.config import Settings
from rag.errors import Unavailable
from rag.model import Hit
from rag.speed import Speed, SpeedBook, Usage

SPEED_MARGIN = 0.9  # aim under the budget: the speed and the token estimate are averages
MIN_ANSWER_TOKENS, MAX_ANSWER_TOKENS = 64, 1024
SAFE_ANSWER_TOKENS = 256  # the answer's length when the LLM's speed could not be measured
PROBE_TOKENS = 12  # the measuring reply: enough tokens written to time the writing
# When the measuring reply was too short to time the writing (a model that refuses at once:
# "我笔记里没有相关内容" is 6 tokens of the 1.5B), one reply that cannot be short times it.
WRITE_PROBE = "Count from 1 to 60, the numbers separated by spaces. Write nothing else."


@dataclass
class Plan:
    """The evidence and answer sizes for one question, fitted to the LLM's speed here."""

    evidence_chars: int
    speed: Speed
    options: dict | None = None
    note: str = ""
    max_prompt_tokens: int | None = None  # what the LLM reads here within the budget; None: unknown
    floor_chars: int = 0  # what a plain answer needs: the evidence is never cut below it
    passage_chars: int = 0  # the best passage whole: the floor when even the floor would not fit ollama.timeout
    too_slow: str = ""  # why the LLM cannot answer within ollama.timeout here (then it is not asked)

    def prompt_tokens(self, prompt: list[dict]) -> int:
        """The prompt's size in tokens, by the calibrated estimate."""
        return self.speed.tokens(prompt_text(prompt))


def prompt_text(prompt: list[dict]) -> str:
    """The prompt's messages as one text (what the token estimate reads)."""
    return "\n".join(m["content"] for m in prompt)


def plan_for(settings: Settings, model: str | None, speed: Speed, question: str, top: list[Hit],
             elapsed: float) -> Plan:
    """How much evidence the LLM reads, and how long its answer may be.

    Never less than a plain answer needs (``Plan.floor_chars``): the best passage whole (the
    first evidence block, up to ``answer.block_chars``) and at least
    ``answer.min_evidence_chars`` in all. Above that, as much as it reads here before
    ``answer.first_token_budget`` runs out (what is left of it after the steps so far). When
    the floor takes longer, the first token comes later (the sources are on screen); when
    reading it and writing a short answer would not fit ``ollama.timeout``, the best passage
    whole, and when even that would not, the LLM is not asked (``Plan.too_slow``). The answer
    gets ``num_predict`` for what is left of the timeout after the reading. Without a measured
    speed (the measuring reply failed to report one): the floor."""
    cfg = settings.answer
    plan = Plan(cfg.total_chars, speed)
    if model is None:  # no LLM: the evidence as configured, for an extractive answer
        return plan
    first = build_evidence(top, cfg)[:1]
    plan.passage_chars = len(first[0].text) if first else cfg.block_chars
    plan.floor_chars = min(cfg.total_chars, max(plan.passage_chars, cfg.min_evidence_chars))
    if not speed.read_tps:
        plan.evidence_chars = plan.floor_chars
        plan.note = (f"{model}: speed not measured: {plan.floor_chars} characters of evidence at most and "
                     f"at most {SAFE_ANSWER_TOKENS} tokens of answer")
        plan.options = {"num_predict": SAFE_ANSWER_TOKENS}
        return plan
    left = cfg.first_token_budget - elapsed
    plan.max_prompt_tokens = max(0, int(left * speed.read_tps * SPEED_MARGIN))
    fixed = speed.tokens(prompt_text(messages(question, [], cfg.refusal, prompt_style(cfg, question))))
    sample = "".join(h.text for h in top[: cfg.top_k]) or question
    per_char = speed.tokens(sample) / max(1, len(sample))
    fits = int(max(0, plan.max_prompt_tokens - fixed) / per_char)  # a first guess: _fit checks the prompt
    plan.evidence_chars = max(plan.floor_chars, min(cfg.total_chars, fits))
    plan.note = (f"{model} reads ~{speed.read_tps:.0f} tok/s here; {left:.1f} s left of "
                 f"answer.first_token_budget {cfg.first_token_budget:g} s")
    return plan


def _evidence(settings: Settings, question: str, top: list[Hit], plan: Plan, facts: list[dict] | None):
    """The evidence cut to ``plan.evidence_chars`` (with the memory's facts), its prompt and the facts used."""
    cfg = settings.answer
    cut = plan.evidence_chars < cfg.total_chars
    blocks = build_evidence(top, cfg.model_copy(update={"total_chars": plan.evidence_chars}),
                            question=question if cut else None)
    used = add_facts(blocks, facts or [])
    return blocks, messages(question, blocks, cfg.refusal, prompt_style(cfg, question)), used


def fit(settings: Settings, question: str, top: list[Hit], plan: Plan, facts: list[dict] | None = None,
        llm: bool = True) -> tuple[list[Evidence], list[dict], list[tuple[int, dict]]]:
    """The evidence (with the memory's ``facts``), the prompt, and the facts used with
    their blocks, shrunk until the prompt's estimated tokens fit what the LLM reads
    within the budget, never below what a plain answer needs (``Plan.floor_chars``); then
    the answer's length, and whether the LLM can answer at all within the timeout."""
    cfg = settings.answer
    while True:
        blocks, prompt, used = _evidence(settings, question, top, plan, facts)
        if plan.max_prompt_tokens is None or plan.evidence_chars <= plan.floor_chars:
            break
        tokens = plan.prompt_tokens(prompt)
        if tokens <= plan.max_prompt_tokens:
            break
        plan.evidence_chars = max(plan.floor_chars,
                                  int(plan.evidence_chars * plan.max_prompt_tokens / tokens * 0.97))
    if plan.max_prompt_tokens is None or not llm:
        return blocks, prompt, used
    chars = sum(len(b.text) for b in blocks)
    head = (f"evidence cut to {chars} characters ({len(blocks)} blocks) of {cfg.total_chars}"
            if plan.evidence_chars < cfg.total_chars else f"evidence as configured ({chars} characters)")
    tokens = plan.prompt_tokens(prompt)
    speed = plan.speed
    reading = tokens / speed.read_tps
    timeout = settings.ollama.timeout
    plan.too_slow, plan.options = "", None
    if speed.write_tps:
        writing = max(0.0, timeout * SPEED_MARGIN - reading)
        most = int(min(MAX_ANSWER_TOKENS, writing * speed.write_tps))
        if most < MIN_ANSWER_TOKENS:
            plan.too_slow = (f"reading the best passage (~{reading:.0f} s here) and writing {MIN_ANSWER_TOKENS} "
                             f"tokens (~{MIN_ANSWER_TOKENS / speed.write_tps:.0f} s) would not fit ollama.timeout "
                             f"{timeout:g} s")
        plan.options = {"num_predict": max(MIN_ANSWER_TOKENS, most)}
    elif reading > timeout * SPEED_MARGIN:
        plan.too_slow = f"reading the best passage would take ~{reading:.0f} s here, over ollama.timeout {timeout:g} s"
    if plan.too_slow and plan.floor_chars > plan.passage_chars:
        # the floor would not fit the timeout here: the best passage whole, if that does
        plan.floor_chars = plan.evidence_chars = plan.passage_chars
        return fit(settings, question, top, plan, facts, llm)
    plan.note = f"{head}: {plan.note}"
    if tokens > plan.max_prompt_tokens:
        floor = ("the best passage whole" if plan.floor_chars == plan.passage_chars
                 else f"answer.min_evidence_chars ({cfg.min_evidence_chars})")
        plan.note += (f"; what a plain answer needs ({floor}) is {tokens} prompt tokens, more than the budget "
                      f"holds ({plan.max_prompt_tokens}): the first token comes after ~{reading:.0f} s")
    if plan.options:
        plan.note += f"; at most {plan.options['num_predict']} tokens of answer (~{speed.write_tps:.1f} tok/s writing)"
    return blocks, prompt, used


async def measure_speed(chat: llm_mod.ChatModel, speeds: SpeedBook, settings: Settings, question: str = "你好") -> str:
    """How fast the LLM reads and writes here, learned from one short reply to the answer
    prompt's fixed instructions and ``question`` (no evidence): ``PROBE_TOKENS`` written, within
    ``ollama.timeout``. The prompt starts with a line never sent before, so no server can
    have any of it cached: its reading time is the whole prompt's (``rag.speed``). A reply cut
    short by the timeout still teaches a bound. A line saying what was learned; Unavailable
    or ModelMissing when the LLM cannot be reached."""
    prompt = messages(question, [], settings.answer.refusal, prompt_style(settings.answer, question))
    prompt[0] = {**prompt[0], "content": f"({secrets.token_hex(6)})\n{prompt[0]['content']}"}
    usage = Usage()
    started = time.perf_counter()
    try:
        async for _ in chat.stream(prompt, usage=usage, options={"num_predict": PROBE_TOKENS}):
            pass
    except Unavailable:
        waited = time.perf_counter() - started
        if not usage.reported and waited >= settings.ollama.timeout * 0.5:
            speeds.cut_short(chat.model, speeds.get(chat.model).tokens(prompt_text(prompt)), waited, None)
        raise
    speeds.observe(chat.model, usage, prompt_text(prompt), probe=True)
    speed = speeds.get(chat.model)
    if speed.read_tps and not speed.write_tps:
        await _measure_writing(chat, speeds)
    if not speed.read_tps:
        return f"{chat.model}: its speed could not be measured (Ollama reported no counts)"
    return f"{chat.model}: speed measured first ({time.perf_counter() - started:.1f} s): {speed.describe(chat.model)}"


async def _measure_writing(chat: llm_mod.ChatModel, speeds: SpeedBook) -> None:
    """The writing speed, from a reply of ``2 * PROBE_TOKENS`` tokens that no model writes
    shorter (the answer prompt's reply may be a few tokens' refusal). Without it the first
    answer's length would have no cap. The LLM gone meanwhile: left unknown."""
    usage = Usage()
    try:
        async for _ in chat.stream([{"role": "user", "content": WRITE_PROBE}], usage=usage,
                                   options={"num_predict": 2 * PROBE_TOKENS, "temperature": 0}):
            pass
    except Unavailable:
        return
    speeds.wrote(chat.model, usage)


def answer_prompt(settings: Settings, speed: Speed) -> tuple[float, str]:
    """The prompt size answers send here, in tokens, and how it is known: the answers' own
    average once there have been answers, else the largest prompt the evidence settings allow
    (``answer.top_k`` blocks of ``answer.block_chars``, at most ``answer.total_chars``, the
    notes taken as Chinese: the larger estimate)."""
    if speed.prompt_tokens:
        return speed.prompt_tokens, "the answers' prompts here, on average"
    cfg = settings.answer
    fixed = speed.tokens(prompt_text(messages("你好", [], cfg.refusal, prompt_style(cfg, "你好"))))
    chars = min(cfg.total_chars, cfg.top_k * cfg.block_chars)
    return fixed + speed.tokens("字" * chars), f"the largest the answer settings allow: {chars:,} characters of evidence"
