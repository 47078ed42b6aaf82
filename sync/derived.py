"""What is derived from the indexed notes, kept in line with the index in one place.

Beside the index, three stores hold things made from notes: the memory's entities, facts
and LLM jobs (``rag.memory.store``), its related-note pairs (``rag.memory.related``), and
the feedback store's copies of the notes an answer cited (``rag.answer.feedback``); and the
gaps store queues the notes indexed with new text, to be checked against the questions the
notes could not answer (``rag.answer.gaps``; the daemon checks them after the pass).
``Derived`` is the one stage that keeps them in line; the sync calls it at four points:

- ``follow``, right after each commit of the index (``sync.indexer``; a snapshot pass's commits
  together once every note is searchable, at the pass's end), for exactly the notes of those
  transactions: a note (re)indexed with new text gets its entities extracted anew
  (and its LLM job queued), a note moved or retagged gets its tags and notebook updated, a
  note that left the index (gone, trashed, deleted, made private) loses everything derived
  from it, and the notes whose related pairs must be recomputed are queued;
- ``behind``, before reading: the notes indexed at a text the memory lacks (a kill between
  the index's commit and the memory's, the memory turned on later) are read again;
- ``align``, at a process's first pass, after every pass that changed notes, failed or
  stopped, and until an alignment succeeds: the memory loses every note it holds that the
  index does not (or holds for another user) and shows the others with the title,
  notebook and tags the index has; after a complete pass the feedback store stops showing
  notes the index no longer holds. Each compares note ids read in one query per table;
- ``refresh_related``, after the pass: the queued notes' related pairs.

**One error policy.** Nothing here fails the sync: the notes are searchable whatever
happens to what is derived from them. Every failure is logged, naming the notes left out
(an unexpected kind of error with its traceback, once per pass); once a store cannot be
written (``sqlite3.OperationalError``: locked by another process, a full disk) the rest of
the pass leaves it alone instead of waiting on every note. The next pass repairs it both
ways (``align`` and ``behind``), also after the process died in between.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Callable, Iterable

from rag.answer.feedback import FeedbackStore
from rag.answer.gaps import GapStore
from rag.config import Settings
from rag.errors import LeanoteRagError
from rag.index.note_index import PreparedNote
from rag.index.store import Store
from rag.memory import related
from rag.memory.entities import norm
from rag.memory.store import MemoryStore
from rag.model import Note

from rag.index import asked
from sync.memory_jobs import questions_wanted, wanted as llm_wanted
from sync.state import INDEXED, NoteRecord, State

log = logging.getLogger(__name__)

_FAILED = object()  # what a failed step returns
_EXPECTED = (OSError, LeanoteRagError, sqlite3.Error)  # logged without a traceback


def chunk_vectors(state: State):
    """A note's (point id, dense vector) pairs as indexed, from the embedding cache (keyed
    by the chunks' text hashes, kept while a chunk uses them): None when it is not indexed."""

    def read(note_id: str):
        rec = state.note(note_id)
        if rec is None or rec.status != INDEXED or not rec.point_ids:
            return None
        cached = state.cached_vectors(rec.chunk_keys)
        return [(pid, cached[key]) for pid, key in zip(rec.point_ids, rec.chunk_keys) if key in cached]

    return read


class Derived:
    """The memory (None: ``memory.enabled`` off, or it could not be opened), the related
    notes and the feedback store (``feedback()``: None until an answer was recorded), kept
    in line with ``state``'s notes and ``store()``'s points. ``settings`` is the running
    settings (the composition root sets it on a reload)."""

    def __init__(self, settings: Settings, state: State, store: Callable[[], Store], memory: MemoryStore | None,
                 feedback: Callable[[], FeedbackStore | None] = lambda: None,
                 gaps: Callable[[], GapStore | None] = lambda: None):
        self.settings = settings
        self.gaps = gaps
        self.state = state
        self.store = store
        self.memory = memory
        self.feedback = feedback
        # align is due: at the first pass (what a crash left), after a pass that changed notes,
        # failed or stopped, and after an alignment that failed; an idle pass skips it
        self.memory_due = self.feedback_due = True
        self._down: str | None = None  # why the memory cannot be written in this pass
        self._traced: set[str] = set()  # kinds of error whose traceback was logged

    def begin_pass(self) -> None:
        """A new pass: the stores are tried again, unexpected errors traced again, and what a
        crash or a failed write left behind is aligned before anything is read."""
        self._down, self._traced = None, set()
        if self.memory_due:
            self.align(memory=True)

    def end_pass(self, unsettled: bool, complete: bool) -> None:
        """After the pass: ``unsettled`` (it changed notes, failed or stopped) aligns the
        memory with what it did; the feedback store only after a ``complete`` pass (a rebuild
        cut short holds fewer notes than there are)."""
        self.feedback_due |= unsettled
        self.align(memory=self.memory_due or unsettled, feedback=self.feedback_due and complete)
        if complete and self.memory is not None and self._down is None:  # a user's first: what their notes were
            self._call(self.memory.first_indexed, "memory: noting the first complete pass")

    # --- the policy -----------------------------------------------------------------------

    def _call(self, fn: Callable[[], object], what: str, note: str = "", default=None, memory: bool = True):
        """One call into a derived store that must not fail the sync: a failure is logged
        (with the note it was for; an unexpected kind's traceback once per pass) and
        ``default`` returned. In a call into the memory (``memory``), a
        ``sqlite3.OperationalError`` marks it as not writable for the rest of the pass
        (``_steps``)."""
        try:
            return fn()
        except Exception as err:
            key = f"{type(err).__name__}: {err}"
            trace = not isinstance(err, _EXPECTED) and key not in self._traced
            self._traced.add(key)
            if memory and isinstance(err, sqlite3.OperationalError) and self.memory is not None:
                self._down = f"{err} ({self.memory.path})"
            log.warning("%s%s failed: %s; the next pass tries again", what, f" (note {note})" if note else "", key,
                        exc_info=trace)
            return default

    def _steps(self, steps: list[tuple[str, str, Callable[[], object]]]) -> bool:
        """Run the steps, (note id or "", what, call), each failure logged with its note and
        the others going on; once the memory cannot be written the rest wait for the next
        pass, and the log says which notes. True when every step succeeded."""
        ok = True
        for i, (note_id, what, call) in enumerate(steps):
            if self._down is None:
                if self._call(call, what, note_id, default=_FAILED) is not _FAILED:
                    continue
                ok = False
                if self._down is None:
                    continue  # this note's own problem: the others go on
                left = steps[i + 1:]
            else:
                left = steps[i:]
            notes = list(dict.fromkeys(n for n, _, _ in left if n))
            if notes:
                log.warning("memory: not brought in line with %d more note(s) (%s): %s; the next pass does it",
                            len(notes), some(notes), self._down)
            return False
        return ok

    # --- after each commit ----------------------------------------------------------------

    def behind(self, indexed: dict[str, str]) -> set[str]:
        """Among notes indexed at a content hash (note id -> hash), those the memory lacks
        or holds at another text (or extraction version): to be read again. Empty without
        a memory or when it cannot be read now (the next pass asks again)."""
        if self.memory is None or self._down is not None:
            return set()
        hashes = self._call(self.memory.hashes, "memory: reading what it holds", default=None)
        if hashes is None:
            return set()
        return {n for n, h in indexed.items() if hashes.get(n) != h}

    def lacks(self, note_id: str, content_hash: str) -> bool:
        """Is a note indexed at ``content_hash`` missing from the memory at that text (indexed
        before the memory was on)? False without a memory or when it cannot be read."""
        if self.memory is None or self._down is not None:
            return False
        held = self._call(lambda: self.memory.known(note_id), "memory: looking up", note_id, default=content_hash)
        return held != content_hash

    def follow(self, pending: dict[str, NoteRecord | None], remember: dict[str, PreparedNote],
               retagged: dict[str, Note], should_stop: Callable[[], bool] = lambda: False) -> None:
        """The memory follows the index's transaction just committed: ``pending`` its rows
        (None: the note's row went), ``remember`` the notes prepared with new text (or never
        processed), ``retagged`` those whose metadata alone changed. A stop leaves the rest
        of the notes to the next pass (``behind``). The notes with new text are queued to be
        checked against the open knowledge gaps of their users (``rag.answer.gaps``)."""
        if remember:
            self._call(lambda: self._queue_gap_checks(remember), "gaps: queueing the changed notes", memory=False)
        memory = self.memory
        if memory is None:
            return
        base_url = self.settings.leanote.base_url
        llm_jobs = llm_wanted(self.settings)
        asked_jobs = questions_wanted(self.settings)
        steps: list[tuple[str, str, Callable[[], object]]] = []
        # related notes: queue the changed notes and those whose pairs point at a changed or
        # removed one, before the memory drops those pairs; recomputed after the pass
        removed = [n for n, rec in pending.items() if rec is None or rec.status != INDEXED]
        changed = {n: p.note.user_id for n, p in remember.items()}
        steps.append(("", "memory: queueing related notes", lambda: memory.related_mark(changed, removed)))
        store = self.store()
        if removed and store is not None:  # their written questions' points (a kill before this: the worker's alignment)
            steps.append(("", "index: removing written questions", lambda: asked.unindex_questions(store, removed)))
        for note_id, rec in pending.items():
            if rec is None or rec.status != INDEXED:
                steps.append((note_id, "memory: removing", lambda n=note_id: memory.remove_note(n)))
            elif note_id in retagged and note_id not in remember:
                steps.append((note_id, "memory: updating", lambda n=note_id: memory.remember_meta(retagged[n], base_url)))
        for note_id, prepared in remember.items():
            if _asked(should_stop):  # the rest on the next pass: ``behind`` finds them
                break
            rec = pending[note_id] if note_id in pending else self.state.note(note_id)
            if rec is not None and rec.status == INDEXED and rec.content_hash == prepared.content_hash:
                # with the LLM tier on, its job is queued with the entities (sync.memory_jobs)
                steps.append((note_id, "memory: processing", lambda p=prepared: memory.remember(
                    p, base_url, queue_llm=llm_jobs, queue_asked=asked_jobs,
                    asked_scope=self.settings.memory.questions_scope)))
        if pending or remember:  # facts whose newest statement went: the one before is active again
            steps.append(("", "memory: settling facts", memory.settle_facts))
        self._steps(steps)

    def _queue_gap_checks(self, remember: dict[str, PreparedNote]) -> None:
        store = self.gaps()
        if store is not None:  # (none: no gap was ever kept)
            store.changed({n: p.note.user_id for n, p in remember.items()})

    # --- around the pass ------------------------------------------------------------------

    def reset(self) -> None:
        """The index is built anew: so is the memory."""
        if self.memory is not None:
            self.memory.reset()

    def align(self, memory: bool = True, feedback: bool = False) -> None:
        """Bring the derived stores in line with the notes the index holds: with ``memory``,
        the memory loses every note it holds that the index does not (or holds for another
        user) and shows the others as indexed; with ``feedback``, the feedback store's
        answers stop naming notes the index does not hold. What fails stays due."""
        memory = memory and self.memory is not None
        if not memory and not feedback:
            return
        indexed = self.state.indexed_notes()
        if memory:
            self.memory_due = not self._align_memory(indexed)
        if feedback:
            self.feedback_due = not self._align_feedback(indexed)

    def _align_memory(self, indexed) -> bool:
        memory = self.memory
        held = self._call(memory.holdings, "memory: comparing it with the index", default=None)
        if held is None:
            return False
        stale = sorted(n for n, user in held.items() if n not in indexed or indexed[n].user_id != user)
        if stale:
            if self._call(lambda: memory.remove_notes(stale), f"memory: removing {len(stale)} note(s) the index no "
                          f"longer holds ({some(stale)})", default=_FAILED) is _FAILED:
                return False
            log.info("memory: removed %d note(s) the index no longer holds (%s)", len(stale), some(stale))

        def relabel() -> list[str]:  # shown under another title, notebook or tags than indexed
            done = []
            for note_id, (user, title, notebook, tags) in memory.labels().items():
                row = indexed.get(note_id)
                if row is not None and row.user_id == user and (row.title, row.notebook, frozenset(
                        norm(t) for t in row.tags if norm(t))) != (title, notebook, tags):
                    memory.relabel(user, note_id, row.title, row.notebook, row.tags)
                    done.append(note_id)
            return done

        relabelled = self._call(relabel, "memory: updating how notes are shown", default=None)
        if relabelled is None:
            return False
        if relabelled:
            log.info("memory: %d note(s) now shown with their title, notebook and tags as indexed (%s)",
                     len(relabelled), some(relabelled))
        return True

    def _align_feedback(self, indexed) -> bool:
        def forget() -> None:
            store = self.feedback()
            if store is not None:  # (None: no answer was ever recorded)
                gone = sorted(store.named_notes() - indexed.keys())
                if gone:
                    answers = store.forget_notes(gone)
                    log.info("feedback: %d answer(s) no longer show %d note(s) the index no longer holds (%s)",
                             answers, len(gone), some(gone))
            gaps = self.gaps()
            if gaps is not None:  # a closed gap names the note that answered it: not once it has gone
                gaps.forget_notes(sorted(gaps.named_notes() - indexed.keys()))

        return self._call(forget, "feedback: comparing it with the index", default=_FAILED, memory=False) is not _FAILED

    def refresh_related(self, should_stop: Callable[[], bool] = lambda: False) -> int:
        """After a pass: the related notes of the notes it changed and of those whose pairs
        pointed at them (queued by ``follow``). How many notes were recomputed."""
        memory = self.memory
        if memory is None or self._down is not None:
            return 0
        done = self._call(lambda: related.refresh(self.store(), memory, chunk_vectors(self.state),
                                                  min_score=self.settings.related_min_score,
                                                  should_stop=should_stop),
                          "related notes: updating", default=None)
        if done is None:
            return 0
        if done.recomputed or done.failed:
            log.info(done.line())
        return len(done.recomputed)


def _asked(should_stop: Callable[[], bool]) -> bool:
    try:
        return bool(should_stop())
    except Exception:  # a full disk: stop writing as well
        return True


def some(note_ids: Iterable[str], shown: int = 10) -> str:
    """Note ids for a log line: the first few, and how many more."""
    note_ids = list(note_ids)
    more = len(note_ids) - shown
    return ", ".join(note_ids[:shown]) + (f" and {more} more" if more > 0 else "")
