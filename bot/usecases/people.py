"""Who asks: the person every use case takes, and which Leanote user an account's email is."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from rag.config import Settings
from rag.errors import UserError
from rag.limits import echoed

if TYPE_CHECKING:
    from bot.root import Parts


@dataclass(frozen=True)
class Person:
    """A person as the use cases know them, whatever door they came through.

    ``key``: the person wherever they write (``telegram:111``, ``discord:222``, ``api:token0``,
    ``cli``): their captures, the answers they may press buttons under, their fair share of the
    LLM. ``user_id``: the Leanote user whose notes they see. ``conversation``: their own
    conversation in one place (``telegram:<chat>:<person>``): follow-ups, ``/why``, ``/reset``;
    None for a question that stands alone. A group or channel is a shared room: each person
    in it has a conversation of their own."""

    key: str
    user_id: str
    admin: bool = False
    conversation: str | None = None

    def as_json(self) -> dict:
        return asdict(self)


def person_key(platform: str, person: int | str) -> str:
    """A person, wherever they write: captures, the outbox and feedback are theirs."""
    return f"{platform}:{person}"


def entry_of(settings: Settings, key: str):
    """The ``users:`` entry a chat person (``telegram:111``, ``discord:222``) is mapped by, or None."""
    platform, _, person = key.partition(":")
    for entry in settings.users:
        ids = {"telegram": entry.telegram_ids, "discord": entry.discord_ids}.get(platform, ())
        if person in {str(i) for i in ids}:
            return entry
    return None


def conversation_key(platform: str, place: int | str, person: int | str) -> str:
    """One person's conversation in one chat: history, the last trace and /reset are
    never shared with others in a group or channel."""
    return f"{platform}:{place}:{person}"


def resolve_user(users: dict[str, int], user_id: str | None) -> str:
    """Whose notes a person asks of: ``user_id`` when the index holds notes of it, else the only
    user it holds notes of (``users``: chunks per user, as ``users()`` counts them)."""
    if user_id:
        if user_id not in users:
            known = ", ".join(sorted(users)) or "none"
            raise UserError(f"the index holds no notes of user {echoed(user_id)!r} (users in the index: {known})")
        return user_id
    if not users:
        raise UserError("the index is empty: run `leanote-rag index` first")
    if len(users) > 1:
        raise UserError(f"the index holds notes of {len(users)} users: pass --user ID (one of {', '.join(sorted(users))})")
    return next(iter(users))


def accounts(parts: "Parts") -> dict[str, str]:
    """The Leanote user id of each ``source.accounts`` account that has synced, by its email: as
    of the last pass while the daemon runs (asked on every message and request, it reads no
    file; none while it opens the index), else read from the state."""
    if parts.scheduled:
        return parts.schedule.user_ids if parts.built("schedule") else {}
    return parts.account_users()


def user_for_email(parts: "Parts", email: str) -> str | None:
    """The Leanote user id of an account (by its email, as ``users:`` names it), once it has synced."""
    return accounts(parts).get(email.strip().lower())


def named_user(settings: Settings, synced: dict[str, str], name: str) -> str:
    """A Leanote user id, given an id or the email (login name) of a ``source.accounts``
    account, as ``--user`` takes them; ``synced``: the accounts' user ids (``accounts``). An
    account that has not synced yet is an error saying what to do."""
    key = name.strip().lower()
    if settings.source.kind != "leanote_api" or key not in {a.email.strip().lower() for a in settings.source.accounts}:
        return name
    if key in synced:
        return synced[key]
    raise UserError(f"account {name} has not synced yet, so its Leanote user is not known: run `leanote-rag index` "
                    f"(`leanote-rag status` says why it failed, if it did), or pass its Leanote user id")


def leanote_user(parts: "Parts", name: str) -> str:
    """A Leanote user id, given an id or an account's email, as asked (an API request's
    ``user``): an email not known yet stays as it is, and finds no notes."""
    return user_for_email(parts, name) or name


async def users(parts: "Parts") -> dict[str, int]:
    """Indexed chunks per Leanote user (whose notes there are to ask)."""
    if parts.scheduled:
        return await parts.answers.in_search_thread(parts.index.store.count_by_user)
    store = parts.store()  # no model loaded for it
    if store is None:
        store = parts.index.store  # nothing indexed yet: says so, with the fix
    return store.count_by_user()
