"""The searchable index: a store, an embedder and the settings that shaped it.

``NoteIndex`` is the one place that turns a note into points (clean -> chunk ->
sparse vector -> dense vector -> payload) and that checks the index on disk was
built the way the config says. It knows nothing of where notes come from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from rag.index import embed as embed_mod
from rag.index.chunk import chunk_text
from rag.index.clean import clean
from rag.config import Settings
from rag.errors import IndexMismatch, NoteError
from rag.index.lexical import SparseVector, document_vector, search_text
from rag.model import HEADING_SEP, Chunk, Note
from rag.index.points import MANIFEST, SCHEMA_VERSION, PointData, point_id
from rag.index.store import Store, open_store

log = logging.getLogger(__name__)

MAX_NOTE_CHARS = 2_000_000


@dataclass
class PreparedChunk:
    chunk: Chunk
    point_id: str
    embed_text: str
    text_hash: str
    sparse: SparseVector
    payload: dict[str, Any]


@dataclass
class PreparedNote:
    note: Note
    content_hash: str
    chunks: list[PreparedChunk]
    truncated: bool = False


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def embed_text(chunk: Chunk) -> str:
    """What the dense model sees: the chunk's own words. (Prefixing the note title and
    heading path made every chunk of a note look alike to the model and lowered dense
    recall and MRR on the dev set; see docs/performance.md, "Retrieval quality".)"""
    return search_text(chunk.text)


def sparse_text(title: str, chunk: Chunk) -> str:
    """What BM25 sees: title and heading path add the words a chunk is about."""
    return f"{title}\n{HEADING_SEP.join(chunk.heading_path)}\n{search_text(chunk.text)}"


def note_meta(note: Note, base_url: str) -> dict[str, Any]:
    """Payload fields that can change without touching the text (moves, renames, tags)."""
    return {
        "user_id": note.user_id,
        "notebook_id": note.notebook_id,
        "notebook": note.notebook_path,
        "tags": [t for t in note.tags if t],
        "updated_at": note.updated_at.isoformat() if isinstance(note.updated_at, datetime) else "",
        "url": note.url or f"{base_url}/note/{note.id}",
    }


class NoteIndex:
    def __init__(self, settings: Settings, store: Store, embedder: embed_mod.Embedder, index_id: str):
        self.settings = settings
        self.store = store
        self.embedder = embedder
        self.index_id = index_id  # changes when the index is created anew
        # the second dense index searched with it (``rag.index.second``; the root sets it), or None
        self.second = None

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        create: bool = False,
        rebuild: bool = False,
        embedder: embed_mod.Embedder | None = None,
    ) -> "NoteIndex":
        """Open (or with ``create``, make) the index; fail if it was built differently."""
        if not create and not rebuild:
            _fail_fast_on_mismatch(settings)
        embedder = embedder or embed_mod.load(settings.embedder)
        store = open_store(settings.qdrant, settings.state_dir, embedder.dim, create=create or rebuild, fresh=rebuild)
        try:
            if rebuild:
                store.drop(embedder.dim)
            manifest = store.manifest()
            if manifest is None:
                manifest = _new_manifest(embedder)
                store.write_manifest(manifest)
            _check(manifest, embedder.model_id, embedder.dim, store.location)
        except BaseException:
            store.close()
            raise
        return cls(settings, store, embedder, manifest["index_id"])

    def reset(self) -> None:
        """Empty the index in place and give it a new id (a rebuild while it stays open):
        the sync state that described the old one is dropped by the next pass."""
        self.store.drop(self.embedder.dim)
        manifest = _new_manifest(self.embedder)
        self.store.write_manifest(manifest)
        self.index_id = manifest["index_id"]

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "NoteIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- writing ------------------------------------------------------------------------

    def prepare(self, note: Note) -> PreparedNote:
        """Clean and chunk a note and build everything but the dense vectors."""
        content, truncated = note.content, False
        if len(content) > MAX_NOTE_CHARS:
            content, truncated = content[:MAX_NOTE_CHARS], True
        try:
            text = clean(content, note.is_markdown)
            chunks = chunk_text(text, self.settings.chunking)
        except RecursionError as err:
            raise NoteError(f"cannot parse note {note.title!r}: {err}") from None
        meta = note_meta(note, self.settings.leanote.base_url)
        content_hash = note.content_hash()
        prepared = []
        for chunk in chunks:
            etext = embed_text(chunk)
            payload = {
                **meta,
                "note_id": note.id,
                "title": note.title,
                "heading_path": list(chunk.heading_path),
                "chunk_index": chunk.index,
                "char_start": chunk.char_start,
                "char_end": chunk.char_end,
                "text": chunk.text,
                "content_hash": content_hash,
            }
            prepared.append(
                PreparedChunk(
                    chunk=chunk,
                    point_id=point_id(note.id, chunk.index),
                    embed_text=etext,
                    text_hash=text_hash(f"{self.embedder.model_id}\n{etext}"),
                    sparse=document_vector(sparse_text(note.title, chunk), self.settings.bm25),
                    payload=payload,
                )
            )
        return PreparedNote(note, content_hash, prepared, truncated)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Passages (chunks, and texts written like them)."""
        return self.embedder.embed(texts)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Questions: for E5 the "query: " side of the model."""
        return self.embedder.embed_query(texts)

    def dense_side(self, user_id: str) -> str:
        """Which embedder ranks ``user_id``'s notes on the dense side, when a second index shares
        it (``rag.index.second``), for the trace; "" without one."""
        if self.second is None:
            return ""
        return self.second.describe(user_id, self.embedder.model_id, self.settings.retrieval.dense_weight)

    def write(self, prepared: PreparedNote, vectors: np.ndarray, stale_ids: list[str] = ()) -> None:
        """Upsert a note's chunks and delete its points that no longer exist."""
        points = [
            PointData(pc.point_id, vectors[i], pc.sparse, pc.payload) for i, pc in enumerate(prepared.chunks)
        ]
        self.store.upsert(points)
        keep = {pc.point_id for pc in prepared.chunks}
        self.store.delete([pid for pid in stale_ids if pid not in keep])

    def update_meta(self, note: Note, ids: list[str]) -> None:
        """Move/rename/retag without re-embedding."""
        self.store.set_payload(ids, note_meta(note, self.settings.leanote.base_url))

    def delete(self, ids: list[str]) -> None:
        self.store.delete(ids)

    def delete_note(self, note_id: str) -> None:
        self.store.delete_note(note_id)


def _check(manifest: dict, model_id: str, dim: int, location: str) -> None:
    if manifest.get("schema") != SCHEMA_VERSION:
        raise IndexMismatch(
            f"the index in {location} has schema {manifest.get('schema')}, this version uses "
            f"{SCHEMA_VERSION}: run `leanote-rag index --rebuild`"
        )
    if manifest.get("embedder") != model_id or manifest.get("dim") != dim:
        raise IndexMismatch(
            f"the index in {location} was built with embedder {manifest.get('embedder')} "
            f"(dim {manifest.get('dim')}), but the config asks for {model_id} (dim {dim}): "
            f"run `leanote-rag index --rebuild` to embed every note again with it, or set the config's "
            f"embedder back to the one that built the index"
        )


def _new_manifest(embedder: embed_mod.Embedder) -> dict:
    return {"schema": SCHEMA_VERSION, "embedder": embedder.model_id, "dim": embedder.dim, "index_id": uuid.uuid4().hex}


def _fail_fast_on_mismatch(settings: Settings) -> None:
    """Before loading a model: an edge index whose manifest names another embedder fails now."""
    expected = embed_mod.expected_model_id(settings.embedder)
    if settings.qdrant.kind != "edge" or expected is None:
        return
    path = Path(settings.state_dir) / "qdrant" / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return
    if manifest.get("embedder") != expected:
        _check(manifest, expected, manifest.get("dim"), str(path.parent))

