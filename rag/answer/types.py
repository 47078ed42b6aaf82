"""What an answer is: the types every door reads (``Answer``, its ``Citation``s, the ``Trace``
of why, each ``Candidate`` retrieval weighed), and the extractive answer built from passages.

The answer service (``rag.answer.service``) makes them; the CLI, the API and the bots only
render them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields, replace

from rag.answer import links
from rag.config import AnswerConfig
from rag.index.excerpt import EXCERPT_CHARS, _window, closed, excerpt
from rag.model import HEADING_SEP, Hit

REFUSAL = AnswerConfig().refusal
MAX_PASSAGES = 3
# Extractive passages from notes scoring below this share of the best hit's score are
# left out: they are what the search found next, not what answers the question.
MIN_RELATIVE_SCORE = 0.7
# What kind of answer it was, for machines (``Trace.outcome``; metrics): a grounded LLM
# answer (cited by the model or by inference: ``Trace.citing``), the LLM refused or said
# nothing of the evidence so its best passages instead, refused without asking the LLM (no
# evidence, or a name the notes never mention), the LLM failed so passages instead, no LLM
# configured so passages, the notes about an entity listed from the memory. ``llm_refused``
# is kept for answers recorded before ``llm_passages`` (the feedback store, metrics).
OUTCOMES = ("llm", "llm_passages", "llm_refused", "refused", "fallback", "extractive", "listing")
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
    # the links the cited passage holds ({"text", "url"}): the only ones the answer may show as
    # links (rag.answer.links)
    links: list[dict] = field(default_factory=list)

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
    followup: str = ""  # a follow-up: how it was made standalone (rag.answer.followup), and why so
    expansion: str = ""  # the LLM's terms and hypothetical answer fused in, or why there were none
    alikes: list[str] = field(default_factory=list)  # a heard question: the notes' words it sounds like
    dense: str = ""  # with a second dense index: which embedder ranked which notes (NoteIndex.dense_side)
    budget: str = ""  # how the evidence was sized to the LLM's speed here, and what was cut
    decision: str = ""  # why the answer is what it is
    llm_error: str | None = None
    outcome: str = ""  # one of OUTCOMES, set with the decision
    # What the LLM's reply was (rag.answer.support): "cited" (enough of it stands on the
    # evidence, and the model marked the blocks), "inferred" (the same, citations from the
    # blocks its sentences follow), "refused", "uncited" (no sentence stands on the evidence),
    # "partly" (some do, under support.MIN_SHARE), "nothing" (no words of its own: the
    # question or the headers back); "" when no LLM answered.
    citing: str = ""
    reply: str = ""  # what the LLM wrote, as it wrote it (the answer may show passages instead)
    # What of the reply stands on the evidence (rag.answer.support): a line, and each unit of
    # the reply (its text, "supported" / "unsupported" / "filler", its block, its share of own
    # words in that block, the specifics no evidence holds).
    support: str = ""
    units: list[dict] = field(default_factory=list)
    # The evidence the LLM read: block number (as text) -> its header line and text, so an
    # answer can be read against it again (``leanote-rag eval --answers``, ``bench/reread.py``).
    evidence: dict[str, str] = field(default_factory=dict)
    unknown_names: list[str] = field(default_factory=list)  # named in the question, in no note
    gate: dict = field(default_factory=dict)  # what the gate before the LLM weighed (rag.answer.gate.signals)
    # The memory's part: entities the question named ("name (kind; notes)") and the facts
    # that went into the evidence ("[n] subject — predicate — object").
    entities: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    # A citation [n] is evidence block n; each candidate names the block it went into.

    def rows(self, operator: bool = False) -> list[tuple[str, str]]:
        """What the trace says, in order, as (what, text) pairs: every door shows these (``ask
        --trace``, the bots' ``/why``), each naming the whats in its own words. ``operator``:
        the reader runs the service (the CLI), so why the LLM failed is told in full; a chat
        reader is told only that it failed (the details are in the service's log)."""
        rows = [("question", self.question)]
        if self.standalone != self.question:
            rows.append(("rewritten", self.standalone))
        if self.followup:
            rows.append(("follow-up", self.followup))
        if self.alikes:
            rows.append(("sounds like", ", ".join(self.alikes)))
        if self.expansion:
            rows.append(("expansion", self.expansion))
        if self.dense:
            rows.append(("dense", self.dense))
        rows.append(("rerank", self.rerank))
        if self.budget:
            rows.append(("budget", self.budget))
        if self.entities:
            rows.append(("entities", "; ".join(self.entities)))
        rows += [("fact", line) for line in self.facts]
        rows.append(("decision", self.decision))
        if self.llm_error:
            rows.append(("llm error", self.llm_error if operator else "unavailable: answered with passages"))
        if self.unknown_names:
            rows.append(("not in any note", ", ".join(self.unknown_names)))
        if self.citing:
            shown = self.outcome == "llm"  # else the reply was not shown: what it was, in short
            rows.append(("llm reply", self.citing + ("" if shown else f": {' '.join(self.reply.split())[:300]}")))
        if self.support:  # which sentences of the model's answer stand on the notes, and what was left out
            rows.append(("checked", self.support))
        return rows

    @classmethod
    def from_json(cls, data: dict) -> "Trace":
        """A trace as ``asdict`` wrote it (the API's answers, the feedback store's records);
        keys this version does not know (a record kept by another version) are left out."""
        known = {f.name for f in fields(cls)} - {"candidates"}
        cells = {f.name for f in fields(Candidate)}
        return cls(**{k: v for k, v in data.items() if k in known},
                   candidates=[Candidate(**{k: v for k, v in c.items() if k in cells})
                               for c in data.get("candidates") or []])


@dataclass
class Answer:
    question: str
    answer: str
    used_llm: bool
    grounded: bool
    citations: list[Citation] = field(default_factory=list)
    closest: list[Citation] = field(default_factory=list)  # with a refusal: the nearest notes
    notice: str | None = None
    # Under an LLM's answer: the note's own words it stands on, a Markdown quote (``quoted``).
    quote: str = ""
    timings_ms: dict[str, float] = field(default_factory=dict)
    # What the LLM reported for the answer: prompt and output tokens and seconds; and the
    # prompt's size as estimated beforehand (for the answer eval and the trace).
    usage: dict[str, float] = field(default_factory=dict)
    trace: Trace | None = None

    @property
    def shown(self) -> str:
        """The answer as every door shows it: the text, then the quote of the note under it (a
        code block either leaves open closed: the quote, a notice, the sources are no code)."""
        return f"{closed(self.answer)}\n\n{closed(self.quote)}" if self.quote else closed(self.answer)

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
            trace = Trace.from_json(trace)
        return cls(
            **{**data, "citations": [Citation(**c) for c in data.get("citations", [])],
               "closest": [Citation(**c) for c in data.get("closest", [])], "trace": trace}
        )


def citation(n: int, hit_or_block, question: str) -> Citation:
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
        links=links.held(text),
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
        citations.append(citation(len(citations) + 1, hit, question))
        if len(citations) >= max_passages:
            break
    if not citations:
        return Answer(question, refusal, used_llm=False, grounded=False)
    body = "\n\n".join(passage_text(c) for c in citations)
    return Answer(question, body, used_llm=False, grounded=True, citations=citations)


def quoted(c: Citation, words: str, lead: str) -> str:
    """The note's own words (``words``, from the passage ``c`` cites) as a Markdown quote: a
    line with ``lead``, ``[n]`` and where they are from, then the words as in the note (blank
    lines in a row as one)."""
    text = re.sub(r"\n[ \t]*(?:\n[ \t]*)+\n", "\n\n", lead + passage_text(replace(c, excerpt=words)))
    return "\n".join(f"> {line}" if line.strip() else ">" for line in text.split("\n"))


_HEADING_LINE = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def passage_text(c: Citation) -> str:
    """A passage as an extractive answer shows it: ``[n]`` and where it is from (the note's
    title › heading) on a line of its own, then the passage, Markdown as in the note (each
    door renders it), the web addresses it writes out as links (``links.linked``). A heading
    the passage begins with that the first line already names is left out, so no passage
    starts with the note's own ``# title``."""
    lines = c.excerpt.split("\n")
    first = _HEADING_LINE.match(lines[0].lstrip("…"))
    if first and first.group(1).strip() in {c.title.strip(), *c.heading.split(HEADING_SEP)} - {""}:
        lines = lines[1:]
    text = links.linked("\n".join(lines).strip("\n"))
    return f"[{c.n}] {c.label}\n{text}" if text else f"[{c.n}] {c.label}"

