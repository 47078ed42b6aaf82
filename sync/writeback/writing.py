"""Writing captures through the capture target (``sync.writeback.targets``: Leanote or a folder),
each Leanote user's in order by a worker of its own, exactly once: the target looks for an
earlier write by the marker every capture carries before it writes again. A capture the
target refuses is parked with why; one it cannot write now is tried again with backoff. A
mixin of ``sync.writeback.capture.Capture``."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from rag.errors import LeanoteRagError, Refused

from sync.writeback.outbox import KEEP_DAYS, Item
from sync.writeback.targets import LoginFailed, NotYet, why_none

log = logging.getLogger(__name__)


REMAPPED = ("你现在对应的是另一个 Leanote 用户：这条是给之前那个用户记的，没有写入。 / You are mapped to another Leanote "
            "user now: this capture was for the previous one, and was not written.")


class Writing:
    """The writing of a ``Capture`` (its ``settings``, ``outbox``, ``clock``, ``target``, the
    workers ``_pool``, ``_wake`` and ``_finished`` events)."""

    async def run(self, stopping: asyncio.Event) -> None:
        """Write what is due, each Leanote user's captures by a worker of its own, and sleep
        until the next is due or a capture arrives. At a stop, calls still in flight after a
        moment are cut (what they carried stays in the outbox, looked for at the next start)."""
        self._wake = asyncio.Event()
        if self.target is not None:
            self.target.resume()  # this Capture ran before (and was stopped): its calls go out again
        workers: dict[str, asyncio.Task] = {}
        try:
            while not stopping.is_set():
                self.outbox.prune(self.clock() - KEEP_DAYS * 86400)
                self._wake.clear()
                for user_id in self.outbox.users_due(self.clock()):
                    if user_id not in workers or workers[user_id].done():
                        workers[user_id] = asyncio.create_task(self._work(user_id, stopping))
                busy = [u for u, t in workers.items() if not t.done()]
                nxt = self.outbox.next_due(busy)
                wait = 30.0 if nxt is None else min(30.0, max(0.05, nxt - self.clock()))
                waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stopping.wait())]
                await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
        finally:
            running = [t for t in workers.values() if not t.done()]
            if running:
                _, late = await asyncio.wait(running, timeout=1.0)
                if late:
                    if self.target is not None:
                        self.target.stop()
                    await asyncio.wait(late, timeout=1.5)

    async def _work(self, user_id: str, stopping: asyncio.Event) -> None:
        try:
            await self._drain_user(user_id, stopping)
        except Exception:
            log.exception("capture: writing the captures of Leanote user %s failed", user_id)
        finally:
            self._wake.set()

    async def drain(self, stopping: asyncio.Event | None = None) -> int:
        """Write every capture that is due, each user's in order and the users side by side
        (one slow account holds nobody else); how many were written. A stop is heard between
        captures (what is not written stays in the outbox)."""
        users = self.outbox.users_due(self.clock())
        return sum(await asyncio.gather(*(self._drain_user(u, stopping) for u in users)))

    async def _drain_user(self, user_id: str, stopping: asyncio.Event | None) -> int:
        loop = asyncio.get_running_loop()
        written = 0
        while stopping is None or not stopping.is_set():
            for item in self.outbox.checks_due(self.clock(), user_id):
                await loop.run_in_executor(self._pool, self._check, item)
            item = self.outbox.head(user_id, self.clock())
            if item is None:
                return written
            state = await loop.run_in_executor(self._pool, self._deliver, item)
            event = self._finished.get(item.id)
            if event is not None:  # the person hears now: written, refused, or queued
                event.set()
            elif state in ("done", "failed") and not item.told:  # nobody heard of it (the process ended first)
                self._tell(item)
            if state == "done":
                written += 1
                self.on_written()
            elif state == "retry":
                return written
        return written

    def _check(self, item: Item) -> None:
        if self.target is None:
            self.outbox.checked(item)
        else:
            self.target.check(item)

    def _deliver(self, item: Item) -> str:
        """Write one capture: "done", "failed" (parked) or "retry" (later). The log says once
        when a user's captures start failing and once when they are written again; each
        try is a DEBUG line, a parked capture a WARNING of its own."""
        now = self.clock
        target = self.target
        user = f"user:{item.user_id}"
        where = target.where[1] if target is not None else "capture"
        try:
            if self._mapped_elsewhere(item):
                self.outbox.park(item, REMAPPED, now())
                log.warning("capture %s not written: %s is mapped to another Leanote user now", item.key, item.person)
                return "failed"
            why = why_none(self.settings) if target is None else target.refusal(item.user_id)
            if why:
                self.outbox.park(item, why, now())
                log.warning("capture %s not written: %s", item.key, why)
                return "failed"
            note_id = target.write(item)
            self.outbox.done(item, note_id, now(), now() + target.grace() if item.unanswered else 0.0)
            log.debug("capture %s (%s) written to note %s", item.key, item.kind, note_id)
            if self._works_again(user):
                log.info("captures for %s: %s takes them again", target.who(item.user_id), where)
            return "done"
        except NotYet as wait:
            self.outbox.wait_until(item, wait.when)
            log.debug("capture %s: not in %s yet; sent again at %s unless it lands by then", item.key, where,
                      datetime.fromtimestamp(wait.when).strftime("%H:%M:%S"))
            return "retry"
        except Refused as err:
            if err.reason in ("conflict",):  # kept conflicting: try again later
                self._retry(item, str(err), sure=True)
                return "retry"
            self.outbox.park(item, str(err), now())
            log.warning("capture %s refused by %s: %s", item.key, where, err)
            return "failed"
        except LoginFailed as err:  # the login's trouble, logged as such
            self._retry(item, str(err), sure=item.state != "sending")
            return "retry"
        except (LeanoteRagError, OSError) as err:
            if self._starts_failing(user, err):
                log.warning("captures for %s: %s; tried again with backoff", target.who(item.user_id), err)
            self._retry(item, str(err), sure=item.state != "sending")
            return "retry"
        except Exception as err:  # a bug: this capture backs off, the others go on
            who = target.who(item.user_id) if target is not None else item.user_id
            if self._starts_failing(user, err):
                log.exception("captures for %s: capture %s failed unexpectedly; tried again with backoff",
                              who, item.key)
            else:
                log.debug("capture %s failed unexpectedly", item.key, exc_info=True)
            self._retry(item, f"unexpected error ({type(err).__name__}); the owner can see it in the log",
                        sure=item.state != "sending")
            return "retry"

    def _mapped_elsewhere(self, item: Item) -> bool:
        """The person who captured this is mapped (``users:``) to another Leanote user now."""
        platform, _, who = item.person.partition(":")
        if not who.lstrip("-").isdigit():
            return False
        for entry in self.settings.users:
            if int(who) in entry.ids_on(platform):
                now = entry.leanote_user_id or (self.target.user_of(entry.leanote_email.strip().lower())
                                                if self.target is not None else None)
                return bool(now) and now != item.user_id
        return False

    def _retry(self, item: Item, error: str, sure: bool) -> None:
        """Tried again after ``retry_min``, doubling with each failed try up to ``retry_max``
        (the first capture of a Leanote user holds the ones behind it: the user's backoff)."""
        cfg = self.settings.capture
        delay = min(cfg.retry_max, cfg.retry_min * 2 ** item.failures)
        when = self.clock() + delay
        (self.outbox.later if sure else self.outbox.unsure)(item, error, when)
        log.debug("capture %s not written (%s); next try in %.0f s", item.key, error, delay)
