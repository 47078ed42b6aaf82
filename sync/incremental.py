"""Incremental sync of one Leanote account: only what changed since its USN cursor.

    getSyncState == cursor  ->  nothing to do (one call)
    notebooks after cursor  ->  notebook rows; notes whose path or privacy changed
                                get their payload updated (no re-embedding), are
                                taken out, or fetched and indexed
    notes after cursor      ->  page by page: trashed/deleted/private notes out;
                                new or re-stamped ones fetched (bounded) and
                                indexed; each page's rows and cursor committed
                                together, after its points are in the store

Cursors are the highest USN actually received (notebooks and notes apart, since
they are pulled apart); a page that may end inside a group of equal USNs covers
only the USNs below it (``Page.covered``). The server's USN read *before* a pass
is kept as ``synced_usn``: "nothing changed since" means the server's USN is still
that one (the user's USN can be above anything we can receive: tag edits bump it).

The server's history can change under the cursor: Leanote restored from a backup puts its
USN back (below ``synced_usn``: caught at once), and new writes may carry it past ours
before the next pass. So a pass with changes to read first asks for the note it saw last
(``usn_of``): gone, or back at a lower USN, means the history is not the one synced. Either
way every note is compared with the server at once and the cursors start again.

``reconcile()`` compares everything the source holds with the state and the
index and repairs what the stream of changes cannot show: notebooks hard-deleted
through the API, notes removed from MongoDB by hand, privacy rules changed in the
config, points with no note.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass

from rag.index.note_index import NoteIndex
from rag.model import Note, Notebook

from sync.derived import Derived
from sync.indexer import Indexer, Summary
from sync.progress import Progress, Step, nothing
from sync.sources import AccountSession, BookPath, Skipped, notebook_paths
from sync.state import INDEXED, NoteRecord, State

log = logging.getLogger(__name__)

# meta key prefix (then "<source>:<account>"): when the server's history last changed (its USN went back,
# or a note seen is gone), from what USN to what, and why
USN_BACK = "usn_back:"


@dataclass
class AccountResult:
    account: str
    user_id: str
    server_usn: int
    cursor: int
    summary: Summary
    idle: bool = False


def with_path(note: Note, paths: dict[str, BookPath]) -> Note:
    book = paths.get(note.notebook_id)
    if book is None:
        return dataclasses.replace(note, notebook_path="", notebook_ids=(note.notebook_id,) if note.notebook_id else (),
                                   notebook_titles=())
    return dataclasses.replace(note, notebook_path=book.path, notebook_ids=book.ids, notebook_titles=book.titles)


class AccountSync:
    def __init__(self, index: NoteIndex, state: State, source_name: str, session: AccountSession, clock=time.time,
                 should_stop=lambda: False, derived: Derived | None = None, progress: Progress = nothing):
        self.progress = progress
        self.step = Step(session.account)
        self._usn_range = (0, 0)  # the USNs this pass reads: from the cursor to the server's
        self.index = index
        self.state = state
        self.source = source_name
        self.session = session
        self.clock = clock
        self.indexer = Indexer(index, state, source_name, account=session.account, should_stop=should_stop,
                               derived=derived)
        self.summary = self.indexer.summary

    # --- the incremental pass -------------------------------------------------------------

    def run(self) -> AccountResult:
        started = time.monotonic()
        acc = self.state.account(self.source, self.session.account)
        server = self.session.server_usn()
        acc.user_id = self.session.user_id
        acc.server_usn = server
        acc.last_attempt = self.clock()
        synced = max(acc.cursor, acc.synced_usn or 0)
        if server < synced:  # a counter never goes back: the server was restored from an older backup
            return self._went_back(acc, server, synced, f"its USN went back from {synced} to {server}")
        # Idle only when a complete pass already saw this USN. Not by the cursors: notebooks
        # and notes are pulled apart, so after a pass cut short (stopped, killed) the notebook
        # cursor can be at the server's USN while notes below it are still to be read.
        idle = acc.synced_usn is not None and server <= acc.synced_usn
        changed = None if idle else self._history_changed(acc)
        if changed:  # restored, and its USN climbed back past ours before this pass
            return self._went_back(acc, server, synced, changed)
        self._memory_catch_up()
        if idle:
            acc.last_success, acc.last_error, acc.failing_since = self.clock(), None, None
            with self.state.transaction():
                self.state.put_account(acc)
            return AccountResult(acc.account, acc.user_id, server, acc.cursor, self.summary, idle=True)

        books = self.session.notebooks_since(acc.notebooks_usn)
        if books:
            self._notebooks_changed(books)
            acc.notebooks_usn = max([acc.notebooks_usn, *(usn for _, usn in books)])
            self.indexer.commit(acc)

        paths = notebook_paths(self.state.notebooks(self.source))
        self._usn_range = (acc.notes_usn, server)
        for page in self.session.notes_since(acc.notes_usn):
            self.indexer.check_stop()  # between pages: what is committed stays
            self.step.page += 1
            for bad in page.skipped:  # retried when the note changes again (or by the reconcile)
                self.indexer.skip(bad.origin, bad.reason, bad.note_id)
            fetch: list[Note] = []
            for meta in page.notes:
                meta = with_path(meta, paths)
                rec = self.indexer.record(meta.id)
                if rec is not None and rec.usn == meta.usn and rec.user_id == meta.user_id:
                    self.summary.unchanged += 1  # seen before (an overlapping page, a rerun)
                elif self.indexer.status_of(meta) != INDEXED:
                    self.indexer.apply(meta)  # out of the index; no body needed
                else:
                    fetch.append(meta)
                    continue
                self._tick(meta.usn)
            self._fetch_and_apply(fetch)
            acc.notes_usn = max(acc.notes_usn, page.covered)
            self.indexer.commit(acc)
            self._tick(page.covered, read=0)

        acc.last_success, acc.last_error, acc.failing_since = self.clock(), None, None
        acc.synced_usn = server
        self.indexer.commit(acc)
        self.indexer.finish()
        self.summary.seconds = round(time.monotonic() - started, 3)
        return AccountResult(acc.account, acc.user_id, server, acc.cursor, self.summary)

    def _history_changed(self, acc) -> str | None:
        """Whether the server's history is not the one synced, though its USN is above ours
        (Leanote restored from a backup, then written to past our cursor): the note seen last
        in the stream is gone from it, or back at a lower USN. What happened, or None. One
        metadata call per pass that has changes to read; none when the source cannot say."""
        usn_of = getattr(self.session, "usn_of", None)
        anchor = self.state.latest_note(self.source, acc.account, acc.notes_usn) if usn_of else None
        if anchor is None:
            return None
        note_id, seen = anchor
        now = usn_of(note_id)
        if now is None:
            return f"note {note_id}, seen at USN {seen}, is gone from it"
        if now < seen:
            return f"note {note_id} is back at USN {now}, below the {seen} it was seen at"
        return None

    def _went_back(self, acc, server: int, synced: int, why: str) -> AccountResult:
        """The server's history is not the one synced (its USN went back; or a note seen is
        gone, or older): changes made since the restore get USNs we would take as seen.
        Every note is compared with the server at once (the reconcile), then the cursors
        start again from the server's USN."""
        log.warning("the server's history for %s changed: %s (Leanote restored from a backup?); "
                    "comparing every note with the server now", acc.account, why)
        with self.state.transaction():
            self.state.set_meta(f"{USN_BACK}{self.source}:{acc.account}",
                                json.dumps({"from": synced, "to": server, "at": self.clock(), "why": why}))
        result = self.reconcile()
        acc = self.state.account(self.source, self.session.account)
        acc.user_id = self.session.user_id
        acc.notebooks_usn = acc.notes_usn = acc.server_usn = acc.synced_usn = server
        acc.last_attempt = acc.last_success = self.clock()
        acc.last_error = acc.failing_since = None
        self.indexer.commit(acc)
        s = result.summary
        log.info("%s compared with the server after its history changed: %d added, %d updated, %d deleted",
                 acc.account, s.added, s.updated, s.deleted)
        return AccountResult(acc.account, acc.user_id, server, acc.cursor, self.summary)

    def _memory_catch_up(self) -> None:
        """Notes the index holds at a text the memory never processed (a kill between the
        index's commit and the memory's, or the memory turned on later): the cursor is past
        them, so they are read again by id and handed to the memory; their points stay,
        nothing is embedded. No request at all when the memory is complete."""
        derived = self.indexer.derived
        if derived is None:
            return
        indexed = {r.note_id: r.content_hash for r in self.state.notes_of(self.source, self.session.account)
                   if r.status == INDEXED}
        behind = derived.behind(indexed)
        if not behind:
            return
        # in the order they were indexed: a note's distinctive terms depend on the notes before it
        missing = [n for n in indexed if n in behind]
        log.info("memory: reading %d note(s) again that it missed", len(missing))
        paths = notebook_paths(self.state.notebooks(self.source))
        for i in range(0, len(missing), 100):
            self.indexer.check_stop()
            for note in self.session.notes_by_id(missing[i:i + 100]):
                if isinstance(note, Note):
                    self.indexer.apply(with_path(note, paths))
            self.indexer.commit()

    def _tick(self, usn: int | None = None, read: int = 1) -> None:
        """Tell ``progress`` how far this account got: ``read`` more notes, the last of them
        at ``usn`` (the stream is in USN order: its share of the range the pass reads)."""
        step = self.step
        step.notes += read
        step.chunks = self.summary.chunks_embedded
        first, last = self._usn_range
        if step.total:
            step.done = min(1.0, step.notes / step.total)
        elif usn is not None and last > first:
            step.done = max(0.0, min(1.0, (usn - first) / (last - first)))
        self.progress(step)

    def _fetch_and_apply(self, metas: list[Note]) -> None:
        if not metas:
            return
        bodies = self.session.contents([m.id for m in metas])
        for meta in metas:
            body = bodies.get(meta.id)
            if isinstance(body, Exception):
                self.indexer.skip(meta.origin or meta.id, str(body), meta.id)
            elif body is None:  # gone between the listing and the fetch
                self.indexer.remove(meta.id)
            else:
                self.indexer.apply(dataclasses.replace(meta, content=body))
            self._tick(meta.usn)

    # --- notebooks ------------------------------------------------------------------------

    def _notebooks_changed(self, changed: list[tuple[Notebook, int]], replace_all: bool = False) -> None:
        """Record notebook changes; fix the notes whose path or privacy they change."""
        old = self.state.notebooks(self.source)
        new = {} if replace_all else dict(old)
        for book, _ in changed:
            new[book.id] = book
        if replace_all:  # notebooks of other accounts stay as they are
            new.update({k: b for k, b in old.items() if b.user_id != self.session.user_id})
        old_paths, new_paths = notebook_paths(old), notebook_paths(new)
        moved = [book_id for book_id in set(old_paths) | set(new_paths) if old_paths.get(book_id) != new_paths.get(book_id)]
        with self.state.transaction():
            for book, usn in changed:
                self.state.put_notebook(self.source, self.session.account, book, usn)
            for book_id in set(old) - set(new):
                self.state.delete_notebook(self.source, book_id)
        if moved:
            self._reevaluate(self.state.notes_in(moved), new_paths)

    def _reevaluate(self, rows: list[NoteRecord], paths: dict[str, BookPath]) -> None:
        """Notes whose notebook path changed: new path in the payload (no re-embedding),
        out of the index if now private, back in if no longer private."""
        fetch: list[str] = []
        for row in rows:
            if row.account != self.session.account:
                continue
            note = with_path(
                Note(id=row.note_id, user_id=row.user_id, title=row.title, content="", notebook_id=row.notebook_id,
                     tags=tuple(row.tags), usn=row.usn),
                paths,
            )
            private = note.excluded_by(self.indexer.private_books, self.indexer.private_tags)
            if row.status == INDEXED and private:
                self.index.delete(row.point_ids)
                self.summary.deleted += 1
                self.indexer._pending[row.note_id] = dataclasses.replace(row, status="excluded", point_ids=[])
            elif row.status == INDEXED and row.notebook != note.notebook_path:
                self.index.store.set_payload(row.point_ids, {"notebook": note.notebook_path})
                self.summary.moved += 1
                # meta_hash "" makes the next full apply of the note refresh every payload field
                self.indexer._pending[row.note_id] = dataclasses.replace(row, notebook=note.notebook_path, meta_hash="")
            elif row.status == "excluded" and not private:
                fetch.append(row.note_id)
        if fetch:
            for note in self.session.notes_by_id(fetch):
                if isinstance(note, Skipped):
                    self.indexer.skip(note.origin, note.reason, note.note_id)
                else:
                    self.indexer.apply(with_path(note, paths))

    # --- the daily reconcile --------------------------------------------------------------

    def reconcile(self) -> AccountResult:
        """Compare the whole source with the state and the index; repair the differences."""
        started = time.monotonic()
        acc = self.state.account(self.source, self.session.account)
        acc.user_id = self.session.user_id
        self._notebooks_changed([(b, 0) for b in self.session.all_notebooks()], replace_all=True)
        paths = notebook_paths(self.state.notebooks(self.source))
        metas, unreadable = {}, set()
        for n in self.session.all_notes():
            if isinstance(n, Skipped):  # there, but unreadable: its last good version stays
                self.indexer.skip(n.origin, n.reason, n.note_id)
                unreadable.add(n.note_id)
            else:
                metas[n.id] = with_path(n, paths)
        for row in self.state.notes_of(self.source, self.session.account):
            if row.note_id not in metas and row.note_id not in unreadable:
                self.indexer.remove(row.note_id)
        gone = [s["note_id"] for s in self.state.skipped(self.source)
                if s["account"] == self.session.account and s["note_id"] not in metas and s["note_id"] not in unreadable]
        with self.state.transaction():  # a note skipped once and deleted since: nothing left to report
            self.state.unskip(self.source, gone)
        fetch = []
        for meta in metas.values():
            rec = self.indexer.record(meta.id)
            status = self.indexer.status_of(meta)
            if status != INDEXED:
                if rec is None or rec.status != status or rec.usn != meta.usn:
                    self.indexer.apply(meta)
            elif rec is None or rec.status != INDEXED or rec.usn != meta.usn or rec.notebook != meta.notebook_path:
                fetch.append(meta)
        self.step.total = len(fetch)  # the notes to read again
        self._fetch_and_apply(fetch)
        self.indexer.commit(acc)
        indexed = {r.note_id for r in self.state.notes_of(self.source, self.session.account) if r.status == INDEXED}
        for orphan in sorted(self.index.store.note_ids(acc.user_id) - indexed):
            log.info("reconcile: removing points of note %s, which no state row knows", orphan)
            self.index.delete_note(orphan)
            self.summary.deleted += 1
        self.indexer.finish()
        self.summary.seconds = round(time.monotonic() - started, 3)
        return AccountResult(acc.account, acc.user_id, acc.server_usn or 0, acc.cursor, self.summary)
