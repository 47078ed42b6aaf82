"""How fast the LLM is on this machine, learned from its own replies, and what that
means for a prompt.

Ollama reports with every reply how many prompt tokens it read and in how long
(``prompt_eval_count``, ``prompt_eval_duration``), how many it wrote and in how long
(``eval_count``, ``eval_duration``). ``SpeedBook`` keeps a running estimate per model
(an exponentially weighted average, so it follows the machine: a GPU added, another
load) in ``<state_dir>/llm_speed.json``, where ``status`` and ``doctor`` read it.

A server may keep the start of a prompt from the last request (Ollama's prompt cache) and then
time only the rest while still counting the whole prompt. Ollama says how much it took from its
cache (``prompt_eval_cached_count``, left out when nothing was), so the reading speed of a reply
is (``prompt_eval_count`` - cached) / ``prompt_eval_duration``: every reply measures it, and the
estimate follows the machine both ways, down when it is busy, up when it is quiet again. A
server that never says what it had cached (an older Ollama) may have kept the part of a prompt
that other prompts share (its fixed instructions): that part is taken as cached, which can only
make the speed read lower, never higher. The **probe** (``rag.answer.sizing.measure_speed``: a
prompt that starts with something new, nothing of it cached) measures the speed before any
reply has; after that it is one measurement among the others, not a ceiling: a probe made while
the machine was busy once kept every later answer on one passage.

Tokens are counted by a **calibrated estimate**, not the model's tokenizer (Qwen's is
not available offline): a base estimate from the text's scripts (a CJK character is
about 0.7 Qwen tokens, other text about 0.28 per character), multiplied by the ratio
Ollama's own prompt counts have shown for this model (``calibration``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

log = logging.getLogger(__name__)

FILE = "llm_speed.json"
ALPHA = 0.3  # weight of a new observation in the running estimate
CJK_TOKENS = 0.7  # per CJK character (Qwen2.5's tokenizer, typical Chinese prose)
OTHER_TOKENS = 0.28  # per other character (English prose, code)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")
MIN_TOKENS = 8  # observations from fewer tokens say little about speed


def base_tokens(text: str) -> float:
    """Tokens a Qwen-family tokenizer makes of ``text``, by script, before calibration."""
    cjk = len(_CJK.findall(text))
    return cjk * CJK_TOKENS + (len(text) - cjk) * OTHER_TOKENS


@dataclass
class Usage:
    """What one reply cost, as the LLM server reported it."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    output_tokens: int = 0
    output_seconds: float = 0.0
    load_seconds: float = 0.0
    cached_tokens: int | None = None  # of prompt_tokens, read from the server's cache; None: it did not say

    @property
    def reported(self) -> bool:
        return self.prompt_tokens > 0 or self.output_tokens > 0


@dataclass
class Speed:
    """A model's measured speed here."""

    read_tps: float | None = None  # prompt tokens read per second: the figure answers are sized by
    write_tps: float | None = None  # tokens written per second
    calibration: float = 1.0  # observed prompt tokens / base estimate
    samples: int = 0
    updated: float = 0.0
    # read_tps is only an upper bound: a reply was cut short before its first token, so the
    # model reads slower than this; the next reply that measures it replaces the bound
    bound: bool = False
    probe_tps: float | None = None  # the last probe's reading (nothing of its prompt cached)
    cache_counts: bool = False  # the server says how much of a prompt it had cached (Ollama's prompt_eval_cached_count)
    prompt_tokens: float | None = None  # the answers' prompts here, running average (estimated tokens)

    def tokens(self, text: str) -> int:
        return max(1, round(base_tokens(text) * self.calibration))

    def read(self, tps: float, probe: bool = False) -> None:
        """A reading speed measured, by the probe or a reply alike: blended into the running
        average, or put in place of a bound (a bound blended with a measurement would stay
        optimistic for several replies)."""
        if probe:
            self.probe_tps = tps
        self.read_tps = tps if self.bound else _ewma(self.read_tps, tps)
        self.bound = False

    def read_seconds(self, tokens: float) -> float | None:
        return tokens / self.read_tps if self.read_tps else None

    def write_seconds(self, tokens: float) -> float | None:
        return tokens / self.write_tps if self.write_tps else None

    def reply_seconds(self, prompt: str, output_tokens: float) -> float | None:
        """How long a reply of ``output_tokens`` to ``prompt`` takes here (None: not measured)."""
        if not (self.read_tps and self.write_tps):
            return None
        return self.tokens(prompt) / self.read_tps + output_tokens / self.write_tps

    def describe(self, model: str) -> str:
        if not self.samples:
            return f"{model}: speed not measured yet"
        read = ((f"under {self.read_tps:.0f} tok/s reading (a reply was cut short)" if self.bound
                 else f"{self.read_tps:.0f} tok/s reading") if self.read_tps else "reading speed unknown")
        write = f"{self.write_tps:.1f} tok/s writing" if self.write_tps else "writing speed unknown"
        return f"{model} here: {read}, {write} ({self.samples} replies)"


_SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*b\b", re.I)
SIZES = (0.5, 1.5, 3.0, 7.0, 14.0, 32.0)  # the sizes models come in (billions of parameters)


def model_size(model: str) -> float | None:
    """Billions of parameters, from a name like ``qwen2.5-coder:1.5b-instruct``."""
    m = _SIZE.search(model.split("/")[-1].split(":")[-1]) or _SIZE.search(model)
    return float(m.group(1)) if m else None


def meaning(model: str, speed: "Speed", budget: float, prompt_tokens: float, prompt_is: str) -> str | None:
    """What a measured reading speed means here, in seconds a person waits: the first token
    for a prompt of ``prompt_tokens`` (the size answers send here: ``prompt_is`` says how it
    is known), what a larger model would take (reading time grows about with the parameters),
    and the size that fits ``answer.first_token_budget``."""
    if not speed.read_tps:
        return None
    first = prompt_tokens / speed.read_tps
    line = (f"{'over ' if speed.bound else ''}~{first:.0f} s to a first token for a prompt of ~{prompt_tokens:,.0f} "
            f"tokens ({prompt_is})")
    size = model_size(model)
    if size is None:
        return line
    fits = [s for s in SIZES if first * s / size <= budget]
    bigger = next((s for s in SIZES if s > size), None)
    if bigger is not None:
        line += f"; a {bigger:g}B would take ~{first * bigger / size:.0f} s"
    if fits and fits[-1] != size:
        line += f"; the largest that reads it within answer.first_token_budget ({budget:g} s) is ~{fits[-1]:g}B"
    elif not fits:
        line += (f"; over answer.first_token_budget ({budget:g} s) even for a 0.5B: answers then read less "
                 "evidence, never under answer.min_evidence_chars, and start later")
    return line


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new


class SpeedBook:
    """Measured speeds per model, persisted (``path`` None: kept in memory only)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._speeds: dict[str, Speed] = {}
        self._lock = threading.Lock()
        self._dirty = False
        self._writer: threading.Thread | None = None
        if path is not None:
            self._speeds = load(path)

    def get(self, model: str) -> Speed:
        return self._speeds.get(model) or Speed()

    def observe(self, model: str, usage: Usage, prompt_text: str, probe: bool = False,
                answer: bool = False, shared_text: str = "") -> None:
        """Learn from one reply: speeds, and how many tokens the prompt really was. ``probe``:
        the reply to ``rag.answer.sizing.measure_speed``'s prompt, nothing of it cached;
        ``answer``: an answer's prompt, whose size is what ``meaning`` speaks of;
        ``shared_text``: the start of the prompt other prompts share (its fixed instructions),
        which a server that does not say what it had cached is taken to have had cached."""
        if not usage.reported:
            return
        speed = self._speeds.setdefault(model, Speed())
        estimate = base_tokens(prompt_text)
        if usage.prompt_tokens >= MIN_TOKENS and estimate > 0:
            ratio = min(4.0, max(0.25, usage.prompt_tokens / estimate))
            speed.calibration = ratio if speed.samples == 0 else (1 - ALPHA) * speed.calibration + ALPHA * ratio
        if usage.cached_tokens is not None:
            speed.cache_counts = True
        read = usage.prompt_tokens - self._cached(speed, usage, probe, shared_text)
        if read >= MIN_TOKENS and usage.prompt_seconds > 0:
            speed.read(read / usage.prompt_seconds, probe=probe)
        if usage.output_tokens >= MIN_TOKENS and usage.output_seconds > 0:
            speed.write_tps = _ewma(speed.write_tps, usage.output_tokens / usage.output_seconds)
        if answer:
            speed.prompt_tokens = _ewma(speed.prompt_tokens, speed.tokens(prompt_text))
        speed.samples += 1
        speed.updated = time.time()
        self.save()

    @staticmethod
    def _cached(speed: Speed, usage: Usage, probe: bool, shared_text: str) -> int:
        """How many of a reply's prompt tokens the server read from its cache: as it says;
        none when it says so by leaving the count out (a server that has given one before) or
        for the probe; else, at most, the part other prompts share."""
        if usage.cached_tokens is not None:
            return usage.cached_tokens
        if speed.cache_counts or probe or not shared_text:
            return 0
        return min(usage.prompt_tokens, speed.tokens(shared_text))

    def wrote(self, model: str, usage: Usage) -> None:
        """Learn the writing speed alone, from a reply whose prompt says nothing of the
        answers' (``rag.answer.sizing``'s writing probe)."""
        if usage.output_tokens < MIN_TOKENS or usage.output_seconds <= 0:
            return
        speed = self._speeds.setdefault(model, Speed())
        speed.write_tps = _ewma(speed.write_tps, usage.output_tokens / usage.output_seconds)
        speed.updated = time.time()
        self.save()

    def cut_short(self, model: str, prompt_tokens: int, seconds: float, first_token: float | None) -> None:
        """Learn from a reply cut short (``ollama.timeout``) before Ollama reported its
        counters: with its first token after ``first_token`` seconds, the model read the
        prompt that fast; with none within ``seconds``, it reads at most
        ``prompt_tokens / seconds``. So the first answer of a model too slow for the
        evidence it was given teaches the next one to give it less: the sizing cannot
        lock itself out (an answer always sent full-size, never measured).

        ``prompt_tokens / seconds`` is not a speed but a bound: the model reads slower than
        that. It is kept as one (``Speed.bound``), lowered by every further cut-short reply
        and replaced, not blended, by the first reply that measures the speed."""
        if prompt_tokens < MIN_TOKENS or seconds <= 0:
            return
        speed = self._speeds.setdefault(model, Speed())
        if first_token is not None and first_token > 0:
            speed.read(prompt_tokens / first_token)
        else:
            most = prompt_tokens / seconds
            if speed.read_tps is None or most < speed.read_tps:
                speed.read_tps, speed.bound = most, True
        speed.samples += 1
        speed.updated = time.time()
        self.save()

    def save(self) -> None:
        """Write the speeds to ``path``, on a thread of its own: the answer that learned them (on
        the event loop) never waits on the disk. Saves made while one is being written are
        written once after it, with the latest figures; ``flush`` waits for them."""
        if self.path is None:
            return
        with self._lock:
            self._dirty = True
            if self._writer is not None:
                return
            self._writer = threading.Thread(target=self._write_pending, name="speed-save")
        self._writer.start()

    def flush(self) -> None:
        """Wait until what was saved is on disk."""
        while (writer := self._writer) is not None:
            writer.join()

    def _write_pending(self) -> None:
        while True:
            with self._lock:
                if not self._dirty:
                    self._writer = None
                    return
                self._dirty = False
                data = json.dumps({m: asdict(s) for m, s in self._speeds.items()}, indent=1)
            tmp = self.path.with_name(self.path.name + ".tmp")
            try:
                tmp.write_text(data)
                os.replace(tmp, self.path)
            except OSError as err:  # a read-only state dir must not break answering
                log.debug("cannot save the LLM speed to %s: %s", self.path, err)


def load(path: Path) -> dict[str, Speed]:
    """The speeds saved in ``path`` (none when missing or unreadable)."""
    try:
        data = json.loads(Path(path).read_text())
        known = {f.name for f in fields(Speed)}
        # a figure an earlier version kept (the replies' own average, beside the probe's) is left out
        return {model: Speed(**{k: v for k, v in values.items() if k in known}) for model, values in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
