"""``Session``: one person talking to the notes through one door, in one place.

A door (Telegram, Discord, the browser's chat) makes a ``Session(parts, platform, user_id,
place)`` for each message, command or press: ``parts`` is the composition root
(``bot.root.Parts``), ``platform`` the door's name (``telegram``, ``discord``, ``api`` for an API
token's holder), ``user_id`` the person's id there, ``place`` where they write (a chat, a channel,
a page: their conversation there is their own; None for a press). The session

- finds the person by their id on that door (``who``: ``users:`` for the chat doors, ``api.tokens``
  for a token's holder), and refuses a stranger with their id (at most once in ten minutes);
- counts each question, search, ``/about`` and ``/related`` against ``bots.rate_limit`` (a
  minute's count per person, wherever they ask), and cuts an overlong message to
  ``limits.question_chars``, telling them so;
- returns what to show as plain data (``bot.session.views``): a ``Reply`` (a refusal is one, with
  its reason code), or an ``AnswerView``; the door only formats it;
- makes the capture idempotency keys (``once``) and knows what the note begun with ✍️ under
  ``/gaps`` takes next: the next message in the person's private chat (``drafts_by`` "message"),
  or their next ``/note`` (Discord: "note").

Every method that does work is ``async`` and returns a dataclass; none raises for a refusal.
``ready``: awaited once a request is let through, before its work (a door shows it is working:
a placeholder, a deferred response). The methods: ``ask``, ``message`` (a text sent where every
message is for the bot), ``search``, ``about``, ``related``, ``why``, ``reset``, ``status``,
``sync``, ``verdict``, ``gaps``, ``forget``, ``digest``, ``command`` (before any command: a waiting
draft), ``gap_note`` and ``dismiss`` (a gap's note given with it, ✖: the web chat), ``press``
(``bot.session.presses``), and the capture and media ones (``bot.session.capturing``).

The web chat (``bot.api.chatdoor``) is a door too: a browser signed in as ``telegram:111`` gets
``Session(parts, "telegram", 111, "web-<tab>", admin=False)``: that person, their limits and
answers, never an admin through a cookie; ``user`` says whose notes for a token's holder who may
ask several users'.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Awaitable, Callable

from rag.answer.gaps import GapDone, UnknownGap
from rag.answer.intent import not_a_question
from rag.digest_plan import USAGE, plan_text
from rag.errors import UserError
from rag.language import label

from bot.chat.digest import plan_reply
from bot.chat.gaps import DISMISSED, GapsReply, confirm_text, ended_text, forgot_text, gaps_text, not_written_text
from bot.chat.texts import (ABOUT_USAGE, FRESH_START, RELATED_USAGE, SYNCING, about_text, cut_message,
                            memory_unavailable_text, notes_root, related_text, sources_first, status_reply,
                            sync_text, trace_text, verdict_reply, hits_text, with_notice)
from bot.chat.unasked import ASK_ANYWAY_DISCORD, ASK_ANYWAY_TELEGRAM
from bot.chat.web import web_reply
from bot.chat.unasked import not_a_question as not_a_question_text
from bot.session.capturing import Capturing
from bot.session.presses import Pressing
from bot.session.views import AnswerView, Button, Reply, refusal
from bot.chat.words import REFUSALS, slow_down, stranger
from bot.usecases import asking, capture, digest, gaps, memory, syncing
from bot.usecases import unasked as unasked_case
from bot.usecases.people import Person, person_for, person_key

if TYPE_CHECKING:
    from bot.root import Parts

Ready = Callable[[], Awaitable[None]] | None
DRAFTS_BY = {"discord": "note"}  # how the note begun with ✍️ takes its text on a door: else "message"
ASK_ANYWAY = {"discord": ASK_ANYWAY_DISCORD}  # how a message that asks nothing is asked all the same


class Session(Capturing, Pressing):
    def __init__(self, parts: "Parts", platform: str, user_id: int | str, place: int | str | None = None, *,
                 user: str | None = None, admin: bool = True):
        self.parts = parts
        self.platform = platform
        self.user_id = user_id
        self.place = place
        self.user = user  # whose notes, for a token's holder who may ask several users' (the web chat's choice)
        self.admin = admin  # False: never an admin through this door (a browser's cookie), whatever the config says
        self.key = person_key(platform, user_id)
        self.drafts_by = DRAFTS_BY.get(platform, "message")
        self._who: Person | Reply | None = None

    @property
    def settings(self):
        return self.parts.settings

    # --- who, and how often ------------------------------------------------------------------

    def who(self) -> Person | Reply:
        """The person, with their conversation in this place; else the refusal to say (a stranger's
        is ``quiet`` when they were refused a short while ago). Asked once per session."""
        if self._who is None:
            found = person_for(self.parts, self.platform, self.user_id, self.place, self.user)
            if isinstance(found, Person):
                self._who = found if self.admin else replace(found, admin=False)
            elif found is None:
                quiet = not self.notice_once(("stranger", self.platform, self.user_id))
                self._who = refusal("stranger", stranger(self.platform, self.user_id), "message", quiet=quiet)
            else:
                self._who = refusal(found, REFUSALS[found], "message")
        return self._who

    def mapped(self) -> bool:
        """Whether ``users:`` (or ``api.tokens``) holds the person, refusing nothing."""
        return isinstance(person_for(self.parts, self.platform, self.user_id), Person)

    def presser(self) -> Person | Reply:
        """Who pressed a button, as the config says now (a stranger is always told their id)."""
        found = person_for(self.parts, self.platform, self.user_id, user=self.user)
        if isinstance(found, Person):
            return found if self.admin else replace(found, admin=False)
        return refusal(found or "stranger", REFUSALS[found] if found else stranger(self.platform, self.user_id))

    def notice_once(self, key: tuple) -> bool:
        """True at most once every ten minutes per ``key``: a refusal or a hint said again only then."""
        return self.parts.rates.once_in_a_while(key)

    def may_ask(self) -> Reply | None:
        """Counts a question against the person's ``bots.rate_limit``: None, or the refusal."""
        wait = self.parts.rates.wait(self.key)
        return refusal("slow_down", slow_down(self.settings.bots.rate_limit, wait), "message", wait=wait) if wait \
            else None

    def once(self, message: int | str, where: int | str | None = None) -> str:
        """What a capture comes from (``<platform>:<place>:<message>``): the same message again makes
        no second note (a platform sends an update again until it is confirmed; a menu pressed twice)."""
        return f"{self.platform}:{self.place if where is None else where}:{message}"

    @property
    def draft_place(self) -> str:
        """Where the person's note for a gap is written: their private chat, or their next /note."""
        return self.key if self.drafts_by == "message" else self.platform

    # --- asking ---------------------------------------------------------------------------------

    async def ask(self, question: str, *, on_token: Callable[[str], None] | None = None,
                  on_sources: Callable[[list, str], None] | None = None, heard: bool = False, seen: str = "",
                  counted: bool = False, ready: Ready = None) -> AnswerView | Reply:
        """The answer to ``question`` from the person's notes, in their conversation here, kept for
        the buttons under it. ``on_token`` hears the text as it is written; ``on_sources(found,
        head)`` the notes it reads and the head to show above the text meanwhile. ``heard``: the
        question is a voice clip's words; ``seen``: the text read from a photo sent with it;
        ``counted``: counted against the rate limit already (before a clip or photo was fetched)."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        if not (question or "").strip() and not seen.strip():
            return refusal("empty", REFUSALS["empty"], "message")
        slow = None if counted else self.may_ask()
        if slow:
            return slow
        question, notice = cut_message(self.settings, question)
        root = notes_root(self.settings)
        head = label(question or seen, "reading")

        def sources(found) -> None:
            if on_sources is not None:
                on_sources(found, sources_first(found, head, root))

        if ready is not None:
            await ready()
        asked = await asking.ask(self.parts, person, question, on_token=on_token, on_sources=sources, keep=True,
                                 heard=heard, seen=seen)
        return self.view(asked, question, notice)

    def view(self, asked, question: str = "", notice: str | None = None) -> AnswerView:
        """An answer as every door shows it (``asked``: ``bot.usecases.results.Asked``)."""
        got = asked.answer
        asking_ = got.question or question
        cited = bool(got.citations)
        buttons = []
        if asked.answer_id is not None:
            i = asked.answer_id
            row = [Button(f"fb:up:{i}", "up"), Button(f"fb:down:{i}", "down"), Button(f"why:{i}", "why")]
            if cited and capture.offered(self.parts):  # an answer from the notes; "nothing found" is not worth a note
                row.append(Button(f"save:{i}", "save"))
            buttons = [row]
        trace = got.trace
        return AnswerView(asking_, got.shown, [n for n in (got.notice, notice) if n],
                          got.citations if cited else got.closest, label(asking_, "sources" if cited else "closest"),
                          got.citations, asked.answer_id, buttons,
                          withdrawn=trace is not None and gaps.why_gap(got) == "withdrawn",
                          root=notes_root(self.settings), asked=asked)

    async def undelivered(self, view: AnswerView) -> None:
        """The door could not show the answer (the platform refused it): its buttons' record goes."""
        person = self.who()
        if isinstance(person, Person) and view.asked is not None:
            await asking.undelivered(self.parts, person, view.asked)

    async def message(self, text: str, *, drafts: bool = True, clip=None, once: str = "") -> Reply | None:
        """A text sent where every message is for the bot (a private chat): the note begun with
        ✍️ when one waits (``drafts``; a question is asked about first), or the reply to a message
        that asks nothing (a reminder, a to-do: "Save as note" under it); None: ask it (``ask``).
        ``clip``: the voice message it was heard from; ``once``: the message, for its capture."""
        if drafts:
            person = self.who()
            if isinstance(person, Reply):
                return person
            written = await self._drafted(person, text, once)
            if written is not None:
                return written
        return self.unasked(text, clip)

    def unasked(self, text: str, clip=None) -> Reply | None:
        """The reply to ``text`` when it asks nothing, kept for its "Save as note"; else None."""
        if not_a_question(text) is None:  # said first: a question never waits on anything here
            return None
        person = self.who()
        if isinstance(person, Reply):
            return person
        item = unasked_case.check(self.parts, person, text, clip)
        if item is None:
            return None
        can = unasked_case.can_save(self.parts)
        words = not_a_question_text(can, ASK_ANYWAY.get(self.platform, ASK_ANYWAY_TELEGRAM))
        return Reply(words, [[Button(f"nq:{item.id}", "nq")]] if can else [])

    async def search(self, query: str, k: int = 8, ready: Ready = None) -> Reply:
        """``/search``: the notes found, where each is, and the lines that match."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        if not (query or "").strip():
            return refusal("empty_search", REFUSALS["empty_search"], "message")
        slow = self.may_ask()
        if slow:
            return slow
        query, notice = cut_message(self.settings, query)
        if ready is not None:
            await ready()
        found = await asking.search(self.parts, person, query, k)
        return Reply(with_notice(hits_text(found.hits, query, notes_root(self.settings)), notice))

    async def about(self, name: str, ready: Ready = None) -> Reply:
        """``/about``: what the memory knows about a name, each active fact with 👍 / 👎."""
        return await self._memory("about", name, ready)

    async def related(self, target: str, ready: Ready = None) -> Reply:
        """``/related``: the notes related to a note (its id or title) or a question, with 👍 / 👎."""
        return await self._memory("related", target, ready)

    async def _memory(self, what: str, target: str, ready: Ready) -> Reply:
        person = self.who()
        if isinstance(person, Reply):
            return person
        if not (target or "").strip():
            return refusal("usage", ABOUT_USAGE if what == "about" else RELATED_USAGE, "message")
        try:
            memory.memory_of(self.parts)
        except memory.MemoryUnavailable as err:
            return refusal("memory_off" if err.reason == "off" else "memory_not_yet", memory_unavailable_text(err),
                           "message")
        slow = self.may_ask()
        if slow:
            return slow
        target, notice = cut_message(self.settings, target)
        if ready is not None:
            await ready()
        if what == "about":
            reply = about_text(await memory.about(self.parts, person, target))
        else:
            reply = related_text(await memory.related(self.parts, person, target))
        rows = [[Button(f"mem:{verdict}:{item_id}", verdict, n) for verdict in ("confirmed", "rejected")]
                for n, item_id in reply.items]
        return Reply(with_notice(reply.text, notice), rows)

    async def verdict(self, item_id: str, verdict: str) -> Reply:
        """``/reject`` or ``/confirm`` a fact or pair of the person's memory."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        changed, text = await verdict_reply(self.parts, person, item_id, verdict)
        return Reply(text, refused="" if changed else "unchanged", how="brief" if changed else "alert")

    async def why(self) -> Reply:
        """``/why``: the last answer's trace, told privately."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        return Reply(trace_text(asking.why(self.parts, person)), private=True)

    async def web(self) -> Reply:
        """``/web``: a one-time link to the web chat (``bot.chat.web``), told privately: it is a key."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        return Reply(await web_reply(self.parts, person), private=True)

    async def reset(self) -> Reply:
        person = self.who()
        if isinstance(person, Reply):
            return person
        asking.reset(self.parts, person)
        return Reply(FRESH_START)

    async def status(self) -> Reply:
        """``/status``: the person's account and captures (an admin's: every account), privately."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        return Reply(await status_reply(self.parts, person), private=True)

    async def sync(self) -> Reply:
        """``/sync`` (admins): "Syncing…" now, what the pass did ``then``."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        if not person.admin:
            return refusal("admins_only", REFUSALS["admins_only"], "message")

        async def done() -> Reply:
            return Reply(sync_text(await syncing.request_sync(self.parts, person)))

        return Reply(SYNCING, then=done)

    # --- knowledge gaps ---------------------------------------------------------------------------

    async def gaps(self) -> Reply:
        """``/gaps``: the person's open gaps, ✍️ write (where capture works) and ✖ dismiss under
        each; privately."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        reply: GapsReply = gaps_text(await asyncio.to_thread(gaps.shown, self.parts, person), how=self.drafts_by)
        can_write = capture.offered(self.parts)
        rows = [[Button(f"gap:{act}:{gap_id}", act, n) for act in ("w", "x") if can_write or act != "w"]
                for n, gap_id in reply.items]
        return Reply(reply.text, rows, private=True)

    async def gap_note(self, gap_id: str, text: str, once: str = "") -> Reply:
        """The note for one of the person's gaps, its text given with it (a door where ✍️ comes with
        the words: the web chat); its ``receipt``. Another's gap, or one done: refused, nothing written."""
        why = self.may_capture()
        if why:
            return why
        person = self.who()
        try:
            draft = await asyncio.to_thread(gaps.draft_for, self.parts, person, gap_id, self.draft_place)
        except (UnknownGap, GapDone) as err:
            return refusal("unknown_gap" if isinstance(err, UnknownGap) else "gap_done", str(err), "message")
        receipt = await gaps.write_draft(self.parts, person, draft, text, once=once)
        return Reply(receipt.message, receipt=receipt)

    async def dismiss(self, gap_id: str) -> Reply:
        """✖ one of the person's gaps (``press("gap:x:<id>")`` with the use case's words on a refusal)."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        try:
            gap = await asyncio.to_thread(gaps.dismiss, self.parts, person, gap_id)
        except (UnknownGap, GapDone) as err:
            return refusal("unknown_gap" if isinstance(err, UnknownGap) else "gap_done", str(err), "message")
        return Reply(DISMISSED.format(q=gap.question), how="brief")

    async def forget(self) -> Reply:
        person = self.who()
        if isinstance(person, Reply):
            return person
        return Reply(forgot_text(await asyncio.to_thread(gaps.forget, self.parts, person)))

    async def digest(self, words: str = "", private: bool = True) -> Reply:
        """``/digest weekly mon 09:00 [TZ]``, ``daily 08:30``, ``off``; alone: the plan now.
        ``private``: asked in the person's private chat (else the reply says where it will come)."""
        person = self.who()
        if isinstance(person, Reply):
            return person
        if not (words or "").strip():
            plan = await asyncio.to_thread(digest.plan_of, self.parts, person)
            return Reply(f"摘要 digest: {plan_text(plan)}\n" + USAGE.format(tz=plan.tz if plan else "UTC"))
        try:
            plan = await asyncio.to_thread(digest.set_plan, self.parts, person, words)
        except UserError as err:
            return refusal("bad_plan", str(err), "message")
        return Reply(plan_reply(plan, private=private))

    async def command(self, name: str, text: str = "", once: str = "", file: bool = False) -> tuple[Reply | None, bool]:
        """Before any command: while a note begun with ✍️ waits, ``/note text`` (without a file)
        is that note where drafts take the next message (the command is then done: True), any
        other command ends it (said; the command runs). ``/note`` alone leaves it waiting; where
        drafts take the next /note, ``note`` writes it."""
        if self.parts.gaps_if_made() is None:
            return None, False
        person = self.presser()
        if isinstance(person, Reply):
            return None, False
        if name == "note" and not file:
            if self.drafts_by == "note" or not text or not self.parts.can_capture:
                return None, False
            draft = await asyncio.to_thread(gaps.take_draft, self.parts, person, self.draft_place)
            if draft is None:
                return None, False
            return Reply(await self._write(person, draft, text, once)), True
        ended = await asyncio.to_thread(gaps.end_draft, self.parts, person)
        return (Reply(ended_text(ended)) if ended is not None else None), False

    async def _drafted(self, person: Person, text: str, once: str) -> Reply | None:
        """A message after ✍️: the note for the gap; one that looks like a question is asked about
        first (💾 save it as the note, ❓ answer it, ✖ cancel). None: no draft waits."""
        if self.drafts_by != "message" or not capture.offered(self.parts):
            return None
        draft = await asyncio.to_thread(gaps.take_draft, self.parts, person, self.draft_place)
        if draft is None:
            return None
        if gaps.looks_like_question(text):
            row = [Button(f"gap:{act}:{draft.gap_id}", act) for act in ("s", "a", "c")]
            return Reply(confirm_text(draft), [row], quote=True)
        return Reply(await self._write(person, draft, text, once))

    async def _write(self, person: Person, draft, text: str, once: str) -> str:
        """The note for the draft's gap; what to tell the person (refused: why, and that it ended)."""
        receipt = await gaps.write_draft(self.parts, person, draft, text, once=once)
        return not_written_text(draft, receipt.message) if receipt.status == "refused" else receipt.message
