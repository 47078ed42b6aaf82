"""The composition root: the one place where leanote-rag's parts are put together.

``Parts`` builds each part of the program once, from the settings, when it is first asked
for, and closes what it built, in the reverse order: the state, the index, the memory, the
feedback store, the outbox, the answer service (with its reranker and LLM client), what is
derived from the notes (``sync.derived``), the sync service (with its source), the daemon's
schedule, the capture writer, the memory's LLM tier and the media readers (voice, images). ``apply`` hands every part that holds
settings the new ones on a reload. ``serve`` (``bot.serve.Daemon``), the command line (its
door without a daemon, ``doctor``) and the tests build through it; no other module opens a
store by its path or loads a model: ``doctor`` and the metrics read through it too. The use
cases (``bot.usecases``) take it and ask it for what they need.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from rag import llm as llm_mod
from rag.answer import rerank as rerank_mod
from rag.answer.feedback import KEEP_DAYS, FeedbackStore
from rag.answer.feedback import path_for as feedback_path
from rag.answer.gaps import GapStore
from rag.answer.gaps import path_for as gaps_path
from rag.answer.service import AnswerService
from rag.config import Settings
from rag.errors import LeanoteRagError, UserError
from rag.index import embed as embed_mod
from rag.index.note_index import NoteIndex
from rag.index.second import SecondIndex
from rag.index.store import Store, open_store
from rag.media.media import Media
from rag.memory.store import MemoryStore
from rag.memory.store import path_for as memory_path
from rag.signin import SigninStore

from sync.derived import Derived
from sync.memory_jobs import MemoryJobs
from sync.second_jobs import SecondFill
from sync.schedule import Schedule
from sync.service import SyncService
from sync.sources import open_source
from sync.state import State
from sync.writeback.capture import Capture
from sync.writeback.outbox import FILE as OUTBOX_FILE
from sync.writeback.outbox import Outbox

if TYPE_CHECKING:
    from bot.session.limits import Rates

log = logging.getLogger(__name__)


class Parts:
    """The program's parts for one settings, each built once on first use.

    ``create``/``rebuild``: the index may be made (``serve``, ``index``) or built anew
    (``index --rebuild``: the state's broken file is replaced, the index emptied).
    ``one_shot``: a command's answers (the CLI says why the LLM failed itself).
    ``scheduled``: the daemon: passes repeat on its schedule (a failure says when it is
    retried), and it writes captures into Leanote.
    ``given``: parts built elsewhere (a test's index or state), used as they are and left to
    their owner to close."""

    def __init__(self, settings: Settings, *, create: bool = False, rebuild: bool = False, one_shot: bool = False,
                 scheduled: bool = False, clock: Callable[[], float] = time.time,
                 rng: Callable[[], float] = random.random, **given: Any):
        self.settings = settings
        self.create = create or rebuild
        self.rebuild = rebuild
        self.one_shot = one_shot
        self.scheduled = scheduled
        self.clock = clock
        self.rng = rng
        unknown = set(given) - {"state", "reader", "index", "memory", "feedback", "source"}
        if unknown:
            raise TypeError(f"Parts: no part named {', '.join(sorted(unknown))}")
        self._parts: dict[str, Any] = dict(given)
        self._order: list[str] = []  # as built: closed the other way round
        self._lock = threading.RLock()  # parts are asked for from worker threads too
        self._closed = False  # close() ran: a worker still running opens nothing again
        # the daemon's digest schedule follows a person's new plan (``bot.digests``); None elsewhere
        self.replan: Callable[[str], None] | None = None
        self._second_said = ""  # why the second index could not be opened, as last logged

    def _once(self, name: str, build: Callable[[], Any]) -> Any:
        with self._lock:
            if name not in self._parts:
                part = build()
                if part is None:
                    return None  # not there yet (a memory the first pass makes): asked again next time
                self._parts[name] = part
                self._order.append(name)
            return self._parts[name]

    def built(self, name: str) -> bool:
        return name in self._parts

    # --- the stores -----------------------------------------------------------------------

    @property
    def state(self) -> State:
        """The sync's state (``state.db``), written by the passes."""
        return self._once("state", lambda: State(self.settings.state_dir, replace_broken=self.rebuild))

    @property
    def reader(self) -> State:
        """A second connection to the state, for reads in worker threads (status, metrics)."""
        return self._once("reader", lambda: State(self.settings.state_dir))

    @property
    def index(self) -> NoteIndex:
        """The index, with its embedder loaded. A store opened alone before (``store()``) is
        closed first: the embedded index has one opener."""

        def build() -> NoteIndex:
            alone = self._parts.pop("store", None)
            if alone is not None:
                self._order.remove("store")
                alone.close()
            return NoteIndex.open(self.settings, create=self.create, rebuild=self.rebuild)

        return self._once("index", build)

    def store(self) -> Store | None:
        """The index's store without loading the embedder (counts, which notes it holds): the
        open index's when there is one, else opened here; None when nothing is indexed yet."""
        if self.built("index"):
            return self.index.store

        def build() -> Store | None:
            try:
                return open_store(self.settings.qdrant, self.settings.state_dir, dim=0, create=False)
            except UserError:  # nothing indexed yet
                return None

        return self._once("store", build)

    @property
    def memory(self) -> MemoryStore | None:
        """The memory the passes keep in line with the index (``memory.enabled``). One that
        cannot be opened is said once and left out: the index comes first."""
        return self._once("memory", lambda: self._open_memory(made_only=False, why="memory off for now"))

    @property
    def memory_to_read(self) -> MemoryStore | None:
        """The memory as the doors read it (answers, bots, the CLI, the status), on a
        connection of its own, so a pass writing never holds a question. None while it is off
        or not made yet (the first pass makes it; asked again next time)."""
        return self._once("memory_to_read",
                          lambda: self._open_memory(made_only=True, why="the memory cannot be read now"))

    def _open_memory(self, made_only: bool, why: str) -> MemoryStore | None:
        """A connection to the memory (``memory.enabled``), or None: off, not made yet when
        ``made_only``, or not openable (said in the log, with ``why``)."""
        if not self.settings.memory.enabled or (made_only and not memory_path(self.settings).exists()):
            return None
        try:
            return MemoryStore.open_for(self.settings)
        except LeanoteRagError as err:
            log.warning("%s: %s", why, err)
            return None

    @property
    def feedback(self) -> FeedbackStore:
        """The answers the bots sent and each asker's verdict (made when first asked for)."""
        return self._once("feedback", lambda: FeedbackStore.open_for(self.settings))

    def feedback_if_made(self) -> FeedbackStore | None:
        """The feedback store when a daemon has made it, else None (nothing was ever sent)."""
        if self.built("feedback") or feedback_path(self.settings).exists():
            return self.feedback
        return None

    @property
    def gaps(self) -> GapStore:
        """The questions each person's notes could not answer, and their digest plans
        (``rag.answer.gaps``; made when first asked for)."""
        return self._once("gaps", lambda: GapStore.open_for(self.settings, clock=self.clock))

    def gaps_if_made(self) -> GapStore | None:
        """The gaps store when a gap or a digest plan was ever kept, else None."""
        if self.built("gaps") or gaps_path(self.settings).exists():
            return self.gaps
        return None

    @property
    def outbox(self) -> Outbox:
        """The captures from chat waiting to be written into Leanote (``sync.writeback.outbox``)."""
        return self._once("outbox", lambda: Outbox.open_for(self.settings))

    def outbox_if_made(self) -> Outbox | None:
        """The outbox when anything was ever captured, else None (for the status)."""
        if self.built("outbox") or (self.settings.state_dir / OUTBOX_FILE).exists():
            return self.outbox
        return None

    @property
    def signins(self) -> SigninStore:
        """The web chat's one-time sign-in codes and sessions, hashed (``rag.signin``)."""
        return self._once("signins", lambda: SigninStore.open_for(self.settings, clock=self.clock))

    def account_users(self) -> dict[str, str]:
        """The Leanote user id of each ``leanote_api`` account that has synced, by its email
        (read from the state; {} before the first pass)."""
        if not self.built("state") and not (self.settings.state_dir / "state.db").exists():
            return {}
        state = self._parts.get("reader") or self.state
        return {a.account: a.user_id for a in state.accounts() if a.user_id}

    def read_state(self, work: Callable[[State], Any]) -> Any:
        """``work(state)`` on a connection of its own, opened for it and closed after (a
        metrics scrape, in the HTTP server's thread, while a pass writes and the loop reads)."""
        state = State(self.settings.state_dir)
        try:
            return work(state)
        finally:
            state.close()

    # --- the services ---------------------------------------------------------------------

    @property
    def schedule(self) -> Schedule:
        """When the passes run (``sync.schedule``): the daemon's (``scheduled``) only."""
        if not self.scheduled:
            raise RuntimeError("only the daemon (Parts(scheduled=True)) has a schedule")
        return self._once("schedule", lambda: Schedule(self.settings, self.sync, self.state, self.reader,
                                                      chores=[self.forget_old_answers], clock=self.clock))

    def forget_old_answers(self) -> None:
        """The answers sent longer than ``KEEP_DAYS`` ago go from the feedback store (daily)."""
        store = self.feedback_if_made()
        if store is not None:
            gone = store.forget(time.time() - KEEP_DAYS * 86400)
            if gone:
                log.info("forgot %d answers older than %d days (feedback)", gone, KEEP_DAYS)

    @property
    def can_capture(self) -> bool:
        """Whether this process writes the captures from chat: the daemon does (the command
        line's ``note`` without one writes its own, ``bot.usecases.capture.note_here``)."""
        return self.scheduled

    def capture(self) -> Capture:
        """Writing from chat into Leanote or the notes folder (the target ``capture.target``
        chooses) through the outbox (``sync.writeback.capture``); each write asks the schedule
        for a pass soon, so the note is searchable within seconds."""
        def written() -> None:
            if self.built("schedule"):
                self.schedule.soon()

        return self._once("capture", lambda: Capture(self.settings, self.outbox, on_written=written))

    @property
    def saving(self) -> dict[str, str]:
        """The answers "Save as note" is saving (``bot.usecases.answers``): answer id -> "" while
        its write runs, or the key of the capture that waits for Leanote."""
        return self._once("saving", dict)

    @property
    def announcers(self) -> dict[str, Callable]:
        """How each running bot tells one of its people something privately (a gap a note
        answers now, a digest): platform -> ``announce(person, text)`` (``bot.usecases.gaps``)."""
        return self._once("announcers", dict)

    @property
    def rates(self) -> "Rates":
        """How often each person asks and is refused in chat (``bot.session.limits``): one count
        for every door and chat they write from."""
        from bot.session.limits import Rates

        return self._once("rates", lambda: Rates(lambda: self.settings.bots.rate_limit))

    @property
    def unasked(self) -> dict:
        """Messages that asked nothing, kept a while for the "Save as note" under the reply
        (``bot.usecases.unasked``): id -> ``Unasked``."""
        return self._once("unasked", dict)

    def note_url(self, note_id: str) -> str:
        """Where a note opens in Leanote."""
        return f"{self.settings.leanote.base_url.rstrip('/')}/note/{note_id}"

    @property
    def media(self) -> Media:
        """Voice messages and images read on this machine (``rag.media``): the configured
        engines, each loaded on first use, and the one line their work waits in."""
        return self._once("media", lambda: Media(self.settings.media, self.settings.state_dir))

    @property
    def memory_jobs(self) -> MemoryJobs:
        """The memory's LLM tier (``sync.memory_jobs``): the answer service's LLM, when no
        answer wants it."""
        return self._once("memory_jobs", lambda: MemoryJobs(
            self.settings, lambda: None if self._closed else self.memory, self.answers,
            index=lambda: None if self._closed else self.index))

    @property
    def second_fill(self) -> SecondFill:
        """The second dense index's fill (``sync.second_jobs``): between questions, its index
        opened and its model loaded by the worker, never before the daemon is ready."""
        return self._once("second_fill", lambda: SecondFill(
            self.settings, self._open_second, lambda: None if self._closed else self.index.store, self.answers))

    def open_second(self) -> SecondIndex:
        """The second index, searched with the first from now on (``UserError``: its embedder
        cannot be loaded here, and why)."""
        second = self._once("second", lambda: None if self._closed else SecondIndex.open(self.settings))
        if second is not None:
            self.index.second = second
        return second

    def _open_second(self) -> SecondIndex | None:
        """``open_second`` for the daemon's worker: None (said) when it cannot be opened here,
        and the first index answers alone."""
        try:
            second = self.open_second()
        except LeanoteRagError as err:
            if str(err) != self._second_said:  # said once, not at every try
                self._second_said = str(err)
                level = logging.INFO if self.settings.second_index.enabled == "auto" else logging.WARNING
                log.log(level, "second index: not filled here: %s", err)
            return None
        return second

    @property
    def answers(self) -> AnswerService:
        """The answer service, with the configured reranker (one that cannot be loaded is said
        once, and answering goes on without it), the LLM client and the memory."""

        def build() -> AnswerService:
            reranker, why = None, ""
            try:
                reranker = rerank_mod.load(self.settings.rerank)
            except UserError as err:
                why = str(err)
                log.warning("answering without a reranker: %s", err)
            return AnswerService(self.settings, self.index, chat=llm_mod.load(self.settings.ollama), reranker=reranker,
                                 rerank_unavailable=why, one_shot=self.one_shot, memory=self.memory_to_read)

        return self._once("answers", build)

    @property
    def derived(self) -> Derived:
        """What the passes keep in line with the index beside it: the memory, the related
        notes, the feedback store and the notes to check the gaps against (``sync.derived``)."""
        return self._once("derived", lambda: Derived(self.settings, self.state, lambda: self.index.store, self.memory,
                                                     self.feedback_if_made, self.gaps_if_made))

    @property
    def sync(self) -> SyncService:
        """The sync service: the configured source, the index, the state and what is derived
        from the notes (``derived``)."""
        return self._once("sync", lambda: SyncService(
            self.settings, self.index, self.state, source=self._parts.get("source") or open_source(self.settings),
            derived=self.derived, clock=self.clock, rng=self.rng, scheduled=self.scheduled))

    # --- each part alone, for ``doctor`` to check it: opened or loaded, and closed by the caller ---

    def open_store(self) -> Store:
        """The index's store as it is on disk (``StoreLocked``, ``NotIndexed`` ... say why not)."""
        return open_store(self.settings.qdrant, self.settings.state_dir, dim=0, create=False)

    def load_embedder(self):
        """The configured embedder's model itself, not what a vector cache kept."""
        return embed_mod.load(self.settings.embedder, cache=False)

    def load_second_embedder(self):
        """The second dense index's embedder (``second_index.embedder``), its model itself."""
        return embed_mod.load(self.settings.second_index.embedder, cache=False)

    def load_reranker(self) -> rerank_mod.Reranker:
        return rerank_mod.load(self.settings.rerank)

    def load_chat(self) -> llm_mod.ChatModel | None:
        return llm_mod.load(self.settings.ollama)

    def open_source(self):
        return open_source(self.settings)

    def apply(self, settings: Settings) -> None:
        """New settings for every part built (a reload): the one way a running part learns
        them. The parts read them at each use; what cannot change while running stays as it
        was built (``rag.config.Settings.reloaded`` says which keys need a restart)."""
        with self._lock:
            self.settings = settings
            for name in ("index", "answers", "derived", "sync", "capture", "memory_jobs", "second_fill"):
                # (the stores hold none)
                if self._parts.get(name) is not None:
                    self._parts[name].settings = settings

    def close(self) -> None:
        """Close what was built, the last built first; each part closed once, and a part that
        fails to close does not keep the others open."""
        with self._lock:
            self._closed = True
            while self._order:
                name = self._order.pop()
                part = self._parts.pop(name)
                try:
                    if hasattr(part, "close"):
                        part.close()
                except Exception:
                    log.exception("closing the %s failed", name)

    def __enter__(self) -> "Parts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
