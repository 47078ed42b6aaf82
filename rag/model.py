"""Plain data passed between the stages. No I/O here."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime

# The rankings a search can use (``rag.index.retrieve``).
RETRIEVERS = ("hybrid", "dense", "sparse")
# What the memory's entities are (``rag.memory.entities``): found without an LLM, and the LLM
# tier's typed ones, stored with their type as kind.
NO_LLM_KINDS = ("term", "code", "tag", "heading", "link")
LLM_KINDS = ("person", "project", "tool", "place", "organization", "concept", "other")
ENTITY_KINDS = NO_LLM_KINDS + LLM_KINDS

HEADING_SEP = " › "
NOTEBOOK_SEP = " / "


def rule_key(name: str) -> str:
    """How privacy rules compare notebook titles and tags: case and outer spaces ignored."""
    return name.strip().casefold()


@dataclass(frozen=True)
class Notebook:
    id: str
    user_id: str
    title: str
    parent_id: str = ""  # "" for a root notebook
    is_deleted: bool = False


@dataclass(frozen=True)
class Note:
    """A note as a source delivers it: raw body, Leanote's flags, ids as 24-hex strings."""

    id: str
    user_id: str
    title: str
    content: str
    is_markdown: bool = True
    notebook_id: str = ""
    notebook_path: str = ""  # "父 / 子", resolved by the source from its notebooks, for display
    notebook_ids: tuple[str, ...] = ()  # the notebook and its ancestors, root first
    notebook_titles: tuple[str, ...] = ()  # their titles, in the same order (a title may hold " / ")
    tags: tuple[str, ...] = ()
    is_trash: bool = False
    is_deleted: bool = False
    usn: int = 0
    updated_at: datetime | None = None
    url: str = ""  # where a citation links to; sources with real Leanote ids leave it to the index
    origin: str = ""  # where the note came from (file path, source name), for messages
    fingerprint: str = ""  # snapshot sources: what it was read from (size, mtime); unchanged, not read again

    @property
    def searchable(self) -> bool:
        """Trashed and deleted notes are never answered from."""
        return not (self.is_trash or self.is_deleted)

    def excluded_by(self, notebooks: frozenset[str], tags: frozenset[str]) -> bool:
        """Whether a privacy rule keeps this note out: its notebook or an ancestor is named
        by id or by title in ``notebooks``, or it carries one of ``tags``. Titles and tags
        are compared without regard to case or surrounding spaces; the rules must be given
        in that form (``rule_key``)."""
        if notebooks:
            if notebooks.intersection(self.notebook_ids):
                return True
            if notebooks.intersection(rule_key(t) for t in self.notebook_titles):
                return True
        return bool(tags and tags.intersection(rule_key(t) for t in self.tags))

    def content_hash(self) -> str:
        """Changes when anything that shapes the chunks or their embeddings changes."""
        h = hashlib.sha256()
        for part in (self.title, "1" if self.is_markdown else "0", self.content):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        return h.hexdigest()[:32]


@dataclass(frozen=True)
class Chunk:
    """A piece of one cleaned note. ``text == cleaned[char_start:char_end]``."""

    index: int
    text: str
    heading_path: tuple[str, ...]
    char_start: int
    char_end: int

    @property
    def heading(self) -> str:
        return HEADING_SEP.join(self.heading_path)


@dataclass
class Hit:
    """One retrieved chunk, with the scores that ranked it."""

    point_id: str
    note_id: str
    user_id: str
    title: str
    notebook: str
    heading: str
    url: str
    text: str
    chunk_index: int
    char_start: int
    char_end: int
    score: float  # fused score (see retrieval.fusion)
    dense_rank: int | None = None
    dense_score: float | None = None
    sparse_rank: int | None = None
    sparse_score: float | None = None
    tags: list[str] = field(default_factory=list)
    updated_at: str = ""

    def as_json(self) -> dict:
        return {
            "note_id": self.note_id,
            "title": self.title,
            "notebook": self.notebook,
            "heading": self.heading,
            "url": self.url,
            "score": round(self.score, 6),
            "text": self.text,
        }
