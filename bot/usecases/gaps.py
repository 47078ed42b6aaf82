"""Knowledge gaps: the questions a person's notes could not answer, brought back to them.

- ``noted``: after an answer, a question that ended without a supported one becomes an ask
  of a gap (``rag.answer.gaps``), kept with why as the person was told (``why_gap``);
  ``rated``: a 👎 makes one, a later 👍 takes it back;
- ``listing``: the person's gaps, the most asked lately first, with the words they were asked in;
  ``shown``: what ``/gaps`` shows (the open ones, the person's time zone, what became of the others);
- ``dismiss``; ``write``: the next thing the person sends becomes a note titled by the
  question (``take_draft`` / ``write_draft``, through the capture outbox, exactly once). A draft
  ends when it is written, when its write is refused or fails, when its gap is dismissed,
  answered or forgotten, when the person cancels it (``end_draft``: ✖, ``/reset``, any
  command) and after ``capture.draft_wait``; a question typed meanwhile is asked about
  (``looks_like_question``), never silently saved;
- ``forget``: everything of the person's (their gaps, draft, plan, and the answers feedback keeps);
- ``check``: after a sync pass (the daemon's and the command line's alike: ``after_pass``), the
  notes it indexed with new text against the open gaps of their users; each gap one answers
  closes, and its person is told once (``announce_with``: a platform's bot tells its people),
  if they still see its Leanote user (``people.reaches``: in ``users:`` now, mapped to it).

Every gap is its person's and their Leanote user's: another person's id is refused as
``UnknownGap``, whatever door it comes through.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable

from rag.answer.gaps import Draft, Gap, Rarity, answering_note, why_of
from rag.capture import Receipt

from bot.render import notes_root, shown_link
from bot.usecases import capture
from bot.usecases.people import Person, entry_of, reaches

if TYPE_CHECKING:
    from rag.answer.feedback import Record
    from rag.answer.types import Answer

    from bot.root import Parts

log = logging.getLogger(__name__)

Announce = Callable[[str, str], Awaitable[None]]  # (person, text)
TRIED = 3  # a gap's newest wordings a changed note is checked against


def why_gap(answer: "Answer") -> str | None:
    """Why an answer leaves a gap ("refused": nothing found; "withdrawn": the LLM's answer was
    not backed by the notes), or None: it is one the notes back, or the LLM failed (the notes
    may hold it: not a gap)."""
    trace = answer.trace
    return why_of(trace.outcome, trace.citing) if trace is not None else None


async def noted(parts: "Parts", person: Person, answer: "Answer", answer_id: str | None = None) -> str | None:
    """Keep the question of an answer that was not a supported one as an ask of the person's
    gaps: the gap's id, or None (not a gap). A failure loses the gap only (logged)."""
    why = why_gap(answer)
    if why is None:
        return None
    trace = answer.trace
    try:
        return await parts.answers.in_search_thread(_add, parts, person, trace.question, trace.standalone, why,
                                                    answer_id)
    except Exception:
        log.exception("could not keep a knowledge gap")
        return None


def _add(parts: "Parts", person: Person, wording: str, standalone: str, why: str, answer_id: str | None) -> str:
    """The ask kept; past ``gaps.max_open`` open gaps of the person, the least recently asked
    are dismissed (a person's gaps cost every closing check). Joined on the index's embedder's
    scale (``Settings.gap_join_at``); the person's asks kept by another embedder are embedded
    again with this one first."""
    embedder = parts.index.embedder
    vector = parts.index.embed_query([standalone])[0]
    gap_id, _ = parts.gaps.add(person.key, person.user_id, wording, standalone, vector, why, answer_id,
                               join_at=parts.settings.gap_join_at, most_open=parts.settings.gaps.max_open,
                               model=embedder.model_id, embed=parts.index.embed_query)
    return gap_id


def rated(parts: "Parts", person: Person, record: "Record", verdict: str) -> None:
    """After a 👍 / 👎 (in a worker thread): 👎 keeps the question as a gap, 👍 takes a 👎's back."""
    try:
        if verdict == "down":
            _add(parts, person, record.question, record.standalone, "down", record.id)
        elif parts.gaps_if_made() is not None:
            parts.gaps.unask(record.id, person.key)
    except Exception:
        log.exception("could not keep a knowledge gap for a 👎")


def listing(parts: "Parts", person: Person, states: tuple[str, ...] = ("open",)) -> list[Gap]:
    """The person's gaps (open ones unless ``states`` says), the most asked lately first. In a
    worker thread: a read."""
    store = parts.gaps_if_made()
    return store.gaps(person.key, person.user_id, states) if store is not None else []


@dataclass
class Shown:
    """What ``/gaps`` shows a person: their open gaps, the time zone their times are in, and
    how many of their gaps a note answered since or they dismissed (none of any: none kept)."""

    open: list[Gap] = field(default_factory=list)
    tz: str = "UTC"
    answered: int = 0
    dismissed: int = 0


def shown(parts: "Parts", person: Person) -> Shown:
    """The person's gaps as ``/gaps`` shows them, times in their zone (their digest plan's,
    else ``users[].timezone``). In a worker thread: a read."""
    store = parts.gaps_if_made()
    every = store.gaps(person.key, person.user_id, ("open", "closed", "dismissed")) if store is not None else []
    return Shown([g for g in every if g.state == "open"], timezone_of(parts, person),
                 sum(g.state == "closed" for g in every), sum(g.state == "dismissed" for g in every))


def timezone_of(parts: "Parts", person: Person) -> str:
    """The person's time zone: their digest plan's (set in chat), else ``users[].timezone``
    (UTC when not set). In a worker thread: reads the plan."""
    store = parts.gaps_if_made()
    plan = store.plan(person.key) if store is not None else None
    if plan is not None and plan.every != "off":
        return plan.tz
    entry = entry_of(parts.settings, person.key)
    return entry.timezone if entry is not None else "UTC"


def dismiss(parts: "Parts", person: Person, gap_id: str) -> Gap:
    """The person no longer wants to see the gap (``UnknownGap``: not theirs; ``GapDone``:
    dismissed or answered already); a note being written for it ends. In a worker thread."""
    return parts.gaps.dismiss(gap_id, person.key)


def write(parts: "Parts", person: Person, gap_id: str, place: str) -> Gap:
    """What the person sends next in ``place`` (a chat, or a door's name) becomes a note titled
    by the gap's question, for ``capture.draft_wait``. In a worker thread."""
    return parts.gaps.start_draft(gap_id, person.key, place)


def draft_for(parts: "Parts", person: Person, gap_id: str, place: str) -> Draft:
    """A note for the gap written at once (the API: its text comes with the request)."""
    write(parts, person, gap_id, place)
    return take_draft(parts, person, place)


def take_draft(parts: "Parts", person: Person, place: str) -> Draft | None:
    """The note the person is writing for a gap in ``place``, if one waits: begun less than
    ``capture.draft_wait`` ago, for a gap still open, over the person's Leanote user of now.
    One that waited longer ends here. In a worker thread."""
    store = parts.gaps_if_made()
    if store is None:
        return None
    oldest = parts.clock() - parts.settings.capture.draft_wait
    found = store.draft(person.key, newer_than=oldest)
    if found is None:
        store.drop_draft(person.key)  # waited too long (or its gap is no longer open): it ends
        return None
    return found if found.place == place and found.user_id == person.user_id else None


def end_draft(parts: "Parts", person: Person, gap_id: str | None = None) -> Draft | None:
    """The person's draft ends unwritten (✖ cancel, ``/reset``, another command; with
    ``gap_id``, only the draft of that gap): the one that was waiting, or None. In a worker
    thread."""
    store = parts.gaps_if_made()
    if store is None:
        return None
    oldest = parts.clock() - parts.settings.capture.draft_wait
    dropped = store.drop_draft(person.key, gap_id)
    return dropped if dropped is not None and dropped.time > oldest else None


async def write_draft(parts: "Parts", person: Person, draft: Draft, text: str, once: str = "") -> Receipt:
    """``text`` as the note for the draft's gap: into the person's Leanote through the capture
    outbox (``once``: the same message again writes nothing new). The draft ends whatever
    happens: taken (written or queued), refused (too long, too often, capture unavailable) or
    failed; a refusal is the person's to try again with ✍️, never a trap on every later
    message. The gap closes when the note is synced and answers it."""
    try:
        return await capture.note(parts, person, text, title=draft.title, once=once)
    finally:
        await asyncio.to_thread(parts.gaps.drop_draft, person.key, draft.gap_id)


# A question rather than a note's text: one line, not long, and it asks (a question mark at the
# end, a question word, 吗/呢 at the end). Several lines, or a long text, are a note.
QUESTION_CHARS = 160
_ASKS_ZH = re.compile(r"怎么|怎样|怎麼|如何|为什么|為什麼|为何|什么|什麼|哪|多少|几[个分点次天年种]|是否|能否|可否|"
                      r"有没有|是不是|要不要|能不能|可不可以")
_ASKS_END = re.compile(r"[吗嗎呢么][\s。.!！]*$")
_ASKS_EN = re.compile(r"^(how|what|why|when|where|who|whom|whose|which|can|could|do|does|did|is|are|was|were|"
                      r"should|would|will|may|shall)\b", re.I)


def looks_like_question(text: str) -> bool:
    """Does a message typed while a draft waits look like a question (asked about before it is
    saved) rather than the note's text (saved)?"""
    text = text.strip()
    t = " ".join(text.split()) if "\n" not in text else ""
    if not t or len(t) > QUESTION_CHARS:
        return False
    return t[-1] in "?？" or bool(_ASKS_END.search(t) or _ASKS_ZH.search(t) or _ASKS_EN.match(t))


@dataclass
class Forgot:
    """What ``/forget`` took: the person's gaps (with their draft and digest plan) and the answers
    kept for feedback (their questions, verdicts and reasons)."""

    gaps: int = 0
    answers: int = 0


def forget(parts: "Parts", person: Person) -> Forgot:
    """Everything kept of the person's questions: their gaps, their draft, their digest plan, the
    answers sent to them as feedback keeps them (else kept 180 days), and what they said that asked
    nothing, kept for its "Save as note" button. In a worker thread."""
    store, feedback = parts.gaps_if_made(), parts.feedback_if_made()
    for key, kept in list(parts.unasked.items()):  # the words kept for "Save as note" (bot.usecases.unasked)
        if kept.person == person.key:
            parts.unasked.pop(key, None)
    return Forgot(store.forget(person.key) if store is not None else 0,
                  feedback.forget_person(person.key) if feedback is not None else 0)


# --- closing, after a pass (the daemon) -------------------------------------------------------------

def closed_line(gap: Gap, root=None) -> str:
    """What the person is told when a note answers their gap (a note file by its path in the
    notes folder ``root``)."""
    times = f"asked {gap.count} times" if gap.count != 1 else "asked once"
    return (f"你的笔记«{gap.note_title}»现在能回答«{gap.question}»了（问过 {gap.count} 次）。\n"
            f"Your note «{gap.note_title}» now answers «{gap.question}» ({times}).\n"
            f"{shown_link(gap.note_url, root) if gap.note_url else ''}").strip()


def close_answered(parts: "Parts", halt: threading.Event | None = None) -> list[Gap]:
    """The queued changed notes against the open gaps of their users: a gap closes (with the note)
    when one changed note answers at least half of its newest wordings (``TRIED``): one wording
    a note happens to share words with is not enough (bench/gaps.py: an English wording closed
    by a note on a neighbouring subject, its Chinese ones not), nor is one rare name a wording
    shares with it (``rag.answer.gaps.more_than_a_name``). In a worker thread.

    Bounded: past ``gaps.check_budget`` seconds of it (or once ``halt`` is set: the daemon stops)
    no further gap is checked; the gaps not reached keep their turn and go first after the next
    pass, and a queued note leaves the queue only once every open gap of its user was checked
    against it (``GapStore.drop_checked``): nothing is lost, to a budget or to a kill. Each pass
    begins with the gaps checked longest ago, one person's and another's in turn."""
    store = parts.gaps_if_made()
    if store is None:
        return []
    deadline = time.monotonic() + parts.settings.gaps.check_budget
    closed: list[Gap] = []
    for user_id, notes in store.pending_checks().items():
        turn, rarity, done = max(notes.values()), Rarity(parts.index, user_id), []
        for gap in _in_turn(store.open_of_user(user_id)):
            changed = {n for n, seq in notes.items() if seq > gap.checked}
            if changed and (done or closed) and (time.monotonic() > deadline or (halt and halt.is_set())):
                break  # (at least one gap a pass: a budget too small still goes forward)
            if changed and _answered(parts, store, gap, user_id, changed, rarity):
                closed.append(store.get(gap.id, gap.person))
            done.append(gap.id)
        store.checked(done, turn)
        store.drop_checked(user_id)
    return closed


def _in_turn(open_gaps: list[Gap]) -> list[Gap]:
    """The gaps checked longest ago first; among those, each person's in turn, their most
    recently asked first (one person's many gaps do not keep another's waiting)."""
    by_person: dict[str, list[Gap]] = {}
    for gap in sorted(open_gaps, key=lambda g: -g.last):
        by_person.setdefault(gap.person, []).append(gap)
    place = {gap.id: i for gaps in by_person.values() for i, gap in enumerate(gaps)}
    return sorted(open_gaps, key=lambda g: (g.checked, place[g.id], g.person))


def _answered(parts: "Parts", store, gap: Gap, user_id: str, changed: set[str], rarity: Rarity) -> bool:
    """Does one of the ``changed`` notes answer the gap (at least half of its newest wordings)?
    If so the gap is closed with it."""
    tried = gap.wordings[:TRIED]
    votes: dict[str, list] = {}
    for wording in tried:
        hit = answering_note(parts.index, parts.settings, wording, user_id, changed, rarity)
        if hit is not None:
            votes.setdefault(hit.note_id, []).append(hit)
    best = max(votes.values(), key=len, default=[])
    if not best or 2 * len(best) < len(tried):
        return False
    hit = best[0]
    return store.close_gap(gap.id, hit.note_id, hit.title, hit.url or parts.note_url(hit.note_id))


def announce_with(parts: "Parts", platform: str, announce: Announce) -> None:
    """``announce(person, text)`` tells a person of ``platform`` (``telegram:111``) something in
    their private chat (a closed gap, a digest): a bot registers it while it runs."""
    parts.announcers[platform] = announce


def stop_announcing(parts: "Parts", platform: str, announce: Announce) -> None:
    if parts.announcers.get(platform) == announce:
        del parts.announcers[platform]


def announcer(parts: "Parts", person: str) -> Announce | None:
    return parts.announcers.get(person.partition(":")[0])


async def check(parts: "Parts") -> list[Gap]:
    """After a pass: close the gaps the changed notes answer, then tell every person whose gap
    closed and who has not been told (now, or a closing a restart or a bot's absence kept
    untold), once each. The closed gaps."""
    store = parts.gaps_if_made()
    if store is None:
        return []
    closed = []
    if await asyncio.to_thread(store.pending_checks):  # (nothing changed: no search, no index opened)
        halt = threading.Event()
        try:
            closed = await parts.answers.in_search_thread(close_answered, parts, halt)
        except asyncio.CancelledError:  # the daemon stops: the thread ends after the gap it is checking
            halt.set()
            raise
    for gap in closed:  # ids only: the question is the person's, not the log's
        log.info("gap %s of %s closed: note %s now answers it", gap.id, gap.person, gap.note_id)
    for gap in await asyncio.to_thread(store.untold):
        tell = announcer(parts, gap.person)
        if tell is None:
            continue  # told when its bot runs (the CLI's and the API's see it in their list)
        if not await asyncio.to_thread(reaches, parts, gap.person, gap.user_id):
            continue  # no longer in users:, or mapped to another Leanote user now: nothing of this one's
        try:
            await tell(gap.person, closed_line(gap, notes_root(parts.settings)))
        except Exception as err:
            log.warning("could not tell %s that a gap closed: %s", gap.person, err)
            continue
        await asyncio.to_thread(store.told, gap.id)
    return closed
