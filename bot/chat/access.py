"""Who may ask, whose notes they see, and how often.

People are mapped in ``users``: chat ids -> the Leanote user whose notes they may
query (by id, or by the email of an API account), and whether they are admins
(``/sync``). Strangers get one short refusal that shows their numeric id, so the
owner can add them, and no note content; a stranger who keeps writing is refused
at most once every ``NOTICE_EVERY`` seconds. Each person may ask ``bots.rate_limit``
questions a minute, wherever they ask.
"""

from __future__ import annotations

import time
from collections import deque

from rag.config import Settings

from bot.usecases.people import Person, conversation_key, person_key, user_for_email


STRANGER = {
    "telegram": "抱歉，你还没有权限使用这个机器人。你的 Telegram id 是 {id}，请把它发给机器人的主人。\n"
    "Sorry, you may not use this bot yet. Your Telegram id is {id}: send it to the bot's owner.",
    "discord": "抱歉，你还没有权限使用这个机器人。你的 Discord id 是 {id}，请把它发给机器人的主人。\n"
    "Sorry, you may not use this bot yet. Your Discord id is {id}: send it to the bot's owner.",
}
NOTICE_EVERY = 600.0  # seconds between two refusals (or hints) to the same person
UNRESOLVED = "你的账号对应的 Leanote 用户还没同步过，请稍后再试。 / Your Leanote account has not been synced yet; try again later."


class Access:
    def __init__(self, host, clock=time.monotonic):
        """``host``: the daemon (its ``settings`` are read at each question, so a reload
        of ``users`` or ``bots.rate_limit`` applies at once; its ``parts`` know which Leanote
        user an account's email is)."""
        self.host = host
        self.clock = clock
        self._asked: dict[tuple[str, int], deque[float]] = {}
        self._noticed: dict[tuple, float] = {}

    @property
    def settings(self) -> Settings:
        return self.host.settings

    def person(self, platform: str, chat_user_id: int, place: int | str | None = None) -> Person | None | str:
        """The mapped person (their conversation in ``place``, a chat or channel, when given),
        None for a stranger, or a message when the mapping cannot be resolved yet (an email
        whose account has not synced)."""
        for entry in self.settings.users:
            ids = entry.telegram_ids if platform == "telegram" else entry.discord_ids
            if chat_user_id in ids:
                user_id = entry.leanote_user_id or self._user_for_email(entry.leanote_email)
                if not user_id:
                    return UNRESOLVED
                conversation = conversation_key(platform, place, chat_user_id) if place is not None else None
                return Person(person_key(platform, chat_user_id), user_id, entry.admin, conversation)
        return None

    def _user_for_email(self, email: str) -> str | None:
        parts = getattr(self.host, "parts", None)
        return user_for_email(parts, email) if parts is not None else None

    def stranger(self, platform: str, chat_user_id: int) -> str | None:
        """The refusal for a stranger, or None when they were refused a short while ago."""
        if not self.once_in_a_while(("stranger", platform, chat_user_id)):
            return None
        return STRANGER[platform].format(id=chat_user_id)

    def once_in_a_while(self, key: tuple) -> bool:
        """True at most once every NOTICE_EVERY seconds per key (for refusals and hints)."""
        now = self.clock()
        last = self._noticed.get(key)
        if last is not None and now - last < NOTICE_EVERY:
            return False
        self._noticed[key] = now
        if len(self._noticed) > 10_000:  # many strangers: forget the old ones
            self._noticed = {k: t for k, t in self._noticed.items() if now - t < NOTICE_EVERY}
        return True

    def rate(self, platform: str, chat_user_id: int) -> float:
        """0 when this person may ask now (and counts the question), else seconds to wait."""
        now = self.clock()
        window = self._asked.setdefault((platform, chat_user_id), deque())
        while window and now - window[0] >= 60:
            window.popleft()
        if len(window) >= self.settings.bots.rate_limit:
            return 60 - (now - window[0])
        window.append(now)
        if len(self._asked) > 10_000:
            self._asked = {k: w for k, w in self._asked.items() if w and now - w[-1] < 60}
        return 0.0

    def slow_down(self, wait: float) -> str:
        n = self.settings.bots.rate_limit
        return f"慢一点 🙂 每分钟最多 {n} 个问题，{wait:.0f} 秒后再问吧。 / Easy there: {n} questions a minute; try again in {wait:.0f} s."
