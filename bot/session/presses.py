"""A press on a button, whatever door it came through (``Session.press``): the buttons every door
shows, by the ``data`` they carry back (``views.Button``).

- under an answer: 👍 ``fb:up:<id>``, 👎 ``fb:down:<id>``, "Why?" ``why:<id>`` and "Save as note"
  ``save:<id>`` (also ``fb:why:<id>``, ``fb:save:<id>``): only the person who asked may use them,
  checked before anything else (nothing changes, nothing is shown of another's answer); then the
  presser as the config maps them now; the save goes only into their Leanote user of now;
- under ``/about`` and ``/related``: ``mem:<verdict>:<id>``: the presser's own memory, whoever asked;
- under ``/gaps``: ✍️ ``gap:w:<id>``, ✖ ``gap:x:<id>``; under a note begun with ✍️: ✖ ``gap:c:<id>``;
  under a question typed while it waits: 💾 ``gap:s:<id>``, ❓ ``gap:a:<id>``: the presser's own gap
  and draft only (another's id, forged or forwarded, is refused and changes nothing);
- under the reply to a message that asked nothing: "Save as note" ``nq:<id>``.

What a press comes to is a ``views.Reply``: its ``how`` says whether the presser must see it
(``alert``), it passes (``brief``), or it is a message to them (privately); ``then`` the work that
follows ("Saving…", then the receipt); ``ask`` a question to answer now; ``unbutton`` the buttons
that go."""

from __future__ import annotations

import asyncio

from rag.answer.feedback import NotYours, UnknownAnswer
from rag.answer.gaps import GapDone, UnknownGap

from bot.chat.gaps import DISMISSED, ended_text, writing_text
from bot.chat.texts import NO_TRACE_KEPT, not_saved_text, trace_text, verdict_reply
from bot.session.views import Button, Reply, refusal
from bot.chat.words import PRESSED, REFUSALS
from bot.usecases import answers, capture, gaps
from bot.usecases import unasked as unasked_case
from bot.usecases.people import Person

ANSWER_ACTS = {"fb:up": "up", "fb:down": "down", "why": "why", "fb:why": "why", "save": "save", "fb:save": "save"}


def parse(data: str) -> tuple[str, str, str]:
    """(kind, act, id) of a button's data; ("", "", "") for none of ours."""
    data = data or ""
    if data.startswith(("mem:", "gap:")):
        kind, act, ref = (data.split(":", 2) + ["", ""])[:3]
        return (kind, act, ref) if data.count(":") == 2 else ("", "", "")
    if data.startswith("nq:"):
        return "nq", "", data[3:]
    head, _, ref = data.rpartition(":")
    return ("fb", ANSWER_ACTS[head], ref) if head in ANSWER_ACTS else ("", "", "")


class Pressing:
    """(A part of ``bot.session.Session``: it has ``parts``, ``key``, ``presser``, ``draft_place``.)"""

    async def press(self, data: str, *, text: str = "", once: str = "", denied: str | None = None) -> Reply:
        """What the press of the button carrying ``data`` does. ``text``: the message the pressed
        one replies to (💾 / ❓ under a question typed while a draft waited: that question), and
        ``once`` that message, for its capture; ``denied``: the door's own refusal of the presser
        here (a channel it does not answer in), said once an answer's button is known theirs."""
        kind, act, ref = parse(data)
        if kind == "fb":
            return await self._answer_button(act, ref, denied)
        if denied:
            return refusal("not_here", denied)
        if kind == "mem" and act in ("rejected", "confirmed") and ref:
            return await self._memory_button(act, ref)
        if kind == "gap" and act in ("w", "x", "c", "s", "a") and ref:
            return await self._gap_button(act, ref, text, once)
        if kind == "nq" and ref:
            return await self._unasked_button(ref)
        return refusal("unknown_button", REFUSALS["unknown_button"])

    async def _answer_button(self, act: str, answer_id: str, denied: str | None) -> Reply:
        try:  # checked before anything else: nothing changes, nothing is shown
            record = await asyncio.to_thread(answers.pressed, self.parts, self.key, answer_id)
        except NotYours:
            return refusal("not_yours", REFUSALS["not_yours"])
        except UnknownAnswer:
            return refusal("unknown_answer", REFUSALS["unknown_answer"])
        if denied:
            return refusal("not_here", denied)
        person = self.presser()  # as the config says now
        if isinstance(person, Reply):
            return person
        try:
            if act in ("up", "down"):
                await asyncio.to_thread(answers.rate, self.parts, person, record, act)
                return Reply(PRESSED["rated"], how="brief")
            if act == "why":
                try:
                    why = answers.why(person, record)
                except answers.Remapped:  # another Leanote user's notes now
                    return refusal("remapped", REFUSALS["remapped"])
                return Reply(trace_text(why) if why is not None else f"问题 question: {record.question}\n{NO_TRACE_KEPT}",
                             private=True)
            return await self._save_answer(person, record)
        except NotYours:
            return refusal("not_yours", REFUSALS["not_yours"])
        except UnknownAnswer:
            return refusal("unknown_answer", REFUSALS["unknown_answer"])

    async def _save_answer(self, person: Person, record) -> Reply:
        why_not = await answers.save_blocked(self.parts, person, record)
        if why_not is not None:
            text, how = not_saved_text(why_not)
            return Reply(text, refused="" if why_not.why == "saved" else why_not.why, how=how, private=True)

        async def save() -> Reply:
            receipt = await answers.save_answer(self.parts, person, record)
            return Reply(receipt.message, private=True, receipt=receipt)

        return Reply(PRESSED["saving"], how="brief", then=save)

    async def _memory_button(self, verdict: str, item_id: str) -> Reply:
        person = self.presser()
        if isinstance(person, Reply):
            return person
        changed, text = await verdict_reply(self.parts, person, item_id, verdict)
        return Reply(text, refused="" if changed else "unchanged", how="brief" if changed else "alert",
                     unbutton=item_id if changed and verdict == "rejected" else "")

    async def _unasked_button(self, item_id: str) -> Reply:
        person = self.presser()
        if isinstance(person, Reply):
            return person
        try:
            item = unasked_case.kept(self.parts, person, item_id)
        except unasked_case.Gone as err:
            return refusal("gone", str(err))

        async def save() -> Reply:
            return Reply((await unasked_case.save(self.parts, person, item)).message, private=True)

        return Reply(PRESSED["saving"], how="brief", then=save, unbutton="*")

    async def _gap_button(self, act: str, gap_id: str, text: str, once: str) -> Reply:
        person = self.presser()
        if isinstance(person, Reply):
            return person
        if act == "c":
            ended = await asyncio.to_thread(gaps.end_draft, self.parts, person, gap_id)
            if ended is None:
                return refusal("nothing_waits", REFUSALS["nothing_waits"], unbutton="*")
            return Reply(ended_text(ended), how="brief", unbutton="*")
        if act == "a":  # answer it: the draft ends (said), the question is answered
            ended = await asyncio.to_thread(gaps.end_draft, self.parts, person, gap_id)
            said = ended_text(ended) if ended is not None else ""
            if not text.strip():
                async def again() -> Reply:
                    return Reply(REFUSALS["ask_again"], private=True)

                return Reply(said, how="brief", unbutton="*", then=again)
            return Reply(said, how="brief", unbutton="*", ask=text)
        if act == "s":
            draft = await asyncio.to_thread(gaps.take_draft, self.parts, person, self.draft_place)
            if draft is None or draft.gap_id != gap_id:
                return refusal("nothing_waits", REFUSALS["nothing_waits"], unbutton="*")
            if not text.strip():
                return refusal("message_gone", REFUSALS["message_gone"])

            async def write() -> Reply:
                return Reply(await self._write(person, draft, text, once), private=True)

            return Reply("", how="brief", unbutton="*", then=write)
        try:
            if act == "x":
                gap = await asyncio.to_thread(gaps.dismiss, self.parts, person, gap_id)
                return Reply(DISMISSED.format(q=gap.question), how="brief")
            if not self.parts.can_capture:
                return refusal("no_capture", REFUSALS["no_capture"])
            why = capture.unavailable(self.parts, person)
            if why:  # said now: a note that cannot be written is never begun
                return refusal("capture_unavailable", why)
            gap = await asyncio.to_thread(gaps.write, self.parts, person, gap_id, self.draft_place)
        except UnknownGap:
            return refusal("unknown_gap", REFUSALS["unknown_gap"])
        except GapDone as err:
            return refusal("gap_done", str(err))
        return Reply(writing_text(gap, self.settings.capture.draft_wait, self.drafts_by),
                     [[Button(f"gap:c:{gap_id}", "c")]], private=True)
