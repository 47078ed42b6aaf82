"""What the use cases return: plain data, each with its JSON form (``as_json``; ``from_json``
where a client of the API reads it back). Light on purpose: the command line's door to a
running daemon reads these without loading the search stack.

- ``Asked``: an answer (``rag.answer.types.Answer``) and the id it was kept under for buttons;
- ``Found``: what a search found (``rag.model.Hit``);
- ``Why``: why an answer is what it is (the trace's rows and candidates);
- ``About``, ``RelatedNotes``, ``Verdict``: the memory's replies;
- ``NotSaved``: why "Save as note" writes nothing now;
- ``Synced``, ``SyncRequest``: what a sync asked for came to.

The status is the report dict of ``bot.usecases.status``; a capture's answer is a
``rag.capture.Receipt``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rag.answer.types import Answer, Trace
from rag.model import Hit


@dataclass
class Asked:
    """An answer, and the id it was kept under for the buttons under it (None: not kept).

    JSON: ``{"answer": Answer.as_json(), "answer_id": str | null}``."""

    answer: Answer
    answer_id: str | None = None

    def as_json(self, with_trace: bool = False) -> dict:
        return {"answer": self.answer.as_json(with_trace=with_trace), "answer_id": self.answer_id}


@dataclass
class Found:
    """What a search found. JSON: ``{"query", "user_id", "hits": [every field of a rag.model.Hit]}``."""

    query: str
    user_id: str
    hits: list[Hit]

    def as_json(self) -> dict:
        return {"query": self.query, "user_id": self.user_id, "hits": [asdict(h) for h in self.hits]}

    @classmethod
    def from_json(cls, data: dict) -> "Found":
        return cls(data["query"], data["user_id"], [Hit(**h) for h in data["hits"]])


@dataclass
class Why:
    """Why an answer is what it is, as every door shows it: the trace's rows in order (what,
    text), each candidate retrieval weighed (its title and heading and, as text, its dense and
    sparse rank and score, fused score, rerank score and evidence block), and the timings.

    JSON: ``{"question", "rows": [[what, text]], "candidates": [{"title", "heading", "dense",
    "sparse", "fused", "rerank", "evidence"}], "timings_ms"}``."""

    question: str
    rows: list[tuple[str, str]]
    candidates: list[dict] = field(default_factory=list)
    timings_ms: dict = field(default_factory=dict)

    @classmethod
    def of(cls, trace: Trace, operator: bool = False, timings_ms: dict | None = None) -> "Why":
        """``operator``: the reader runs the service (the command line) and is told why the
        LLM failed in full; a chat reader only that it failed (``Trace.rows``)."""
        candidates = []
        for c in trace.candidates:
            dense, sparse, fused, rerank, evidence = c.cells()
            candidates.append({"title": c.title, "heading": c.heading, "dense": dense, "sparse": sparse,
                               "fused": fused, "rerank": rerank, "evidence": evidence})
        return cls(trace.question, trace.rows(operator=operator), candidates, dict(timings_ms or {}))

    def as_json(self) -> dict:
        return asdict(self)


@dataclass
class About:
    """What the memory knows about a name: the facts about it (as subject or object, each with
    its quote, source note, status and id) and the notes that mention it (each with where).

    JSON: ``{"entity", "user_id", "facts": [{"fact_id", "subject", "predicate", "object",
    "quote", "note_id", "title", "url", "time", "status", "confirmed", "superseded_by_note"}],
    "notes": [{"note_id", "title", "notebook", "url", "updated_at", "kinds", "mentions":
    [{"kind", "snippet", ...}]}]}``."""

    entity: str
    user_id: str
    facts: list[dict] = field(default_factory=list)
    notes: list[dict] = field(default_factory=list)

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "About":
        return cls(data["entity"], data["user_id"], data["facts"], data["notes"])


@dataclass
class RelatedNotes:
    """The notes related to a note (``note_id`` set, ``title`` its title) or to a question
    (``query`` set), best first, each with its score, reasons (``shared`` entities, the best
    ``passages``, its place in the search) and, for a note's pairs, the ``pair_id`` a verdict
    takes. ``gone``: the note named has left the index (no notes).

    JSON: ``{"note_id" | "query", "title", "user_id", "notes": [...], "gone"}``."""

    user_id: str
    notes: list[dict]
    note_id: str = ""
    query: str = ""
    title: str = ""
    gone: bool = False

    def as_json(self) -> dict:
        about = {"note_id": self.note_id} if self.note_id else {"query": self.query}
        return {**about, "title": self.title, "user_id": self.user_id, "notes": self.notes, "gone": self.gone}

    @classmethod
    def from_json(cls, data: dict) -> "RelatedNotes":
        return cls(data["user_id"], data["notes"], data.get("note_id", ""), data.get("query", ""), data["title"],
                   data.get("gone", False))


@dataclass
class Verdict:
    """A fact or pair rejected or confirmed: what it is (``kind``, ``id``; a fact's
    ``subject``, ``predicate``, ``object``; a pair's ``notes`` and their ``titles``), whether
    anything ``changed`` (False: it had that verdict already) and the rows a rejection
    ``removed``. JSON: those fields, as ``MemoryStore.correct`` reports them, with ``titles``."""

    done: dict
    titles: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.done["changed"])

    @property
    def kind(self) -> str:
        return self.done["kind"]

    def as_json(self) -> dict:
        return {**self.done, "titles": self.titles}

    @classmethod
    def from_json(cls, data: dict) -> "Verdict":
        done = dict(data)
        return cls(done, done.pop("titles", []))


@dataclass
class NotSaved:
    """Why "Save as note" writes nothing now: ``no_capture`` (this host cannot write to
    Leanote), ``remapped`` (the answer is another Leanote user's), ``saving`` (a double tap
    while the first is being written), ``queued`` (waiting for Leanote already), ``saved``
    (written already: ``url`` is its note's link, "" while it is not known); ``reason``: why
    there is no capture, when it has one to say (nowhere to write, capture turned off)."""

    why: str
    url: str = ""
    reason: str = ""


@dataclass
class Synced:
    """What a pass did: ``summary`` (``sync.indexer.Summary.as_json``), the ``failures`` by
    account, and whether it was ``stopped`` before its end (the daemon stopping: the next
    start carries on). JSON: those three fields."""

    summary: dict
    failures: dict[str, str] = field(default_factory=dict)
    stopped: bool = False

    def as_json(self) -> dict:
        return asdict(self)


@dataclass
class SyncRequest:
    """What a chat's ``/sync`` came to. ``outcome``: ``paused`` (a fault of every account's
    holds: ``problems`` says which, nothing started), ``just_ran`` (one was asked for a moment
    ago), ``running`` (still going after ``waited`` seconds), ``stopping`` (the daemon stops:
    the pass did not finish), ``fault`` (the pass met one: ``problems``), ``done`` (``line``
    says what it did; ``failures`` by account, when some failed).
    JSON: those fields."""

    outcome: str
    line: str = ""
    failures: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    waited: float = 0.0

    def as_json(self) -> dict:
        return asdict(self)
