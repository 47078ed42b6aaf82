"""Who asks: the person every use case takes, and which Leanote user an account's email is; who a
person is now (``person_now``, ``reaches``), by the config in force, for whatever is sent to
them unasked."""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from rag.config import Settings
from rag.errors import UserError
from rag.limits import echoed

if TYPE_CHECKING:
    from bot.root import Parts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Person:
    """A person as the use cases know them, whatever door they came through.

    ``key``: the person wherever they write (``telegram:111``, ``discord:222``, ``api:<token's name>``,
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
        if person in {str(i) for i in entry.ids_on(platform)}:
            return entry
    return None


def person_for(parts: "Parts", platform: str, person: int | str, place: int | str | None = None,
               user: str | None = None) -> Person | str | None:
    """The person ``person`` of door ``platform`` as the config in force maps them, with their
    conversation in ``place`` (a chat, a channel, a page) when given: a chat door's people are in
    ``users:`` (``<platform>_ids``), an API token's holder (``api``, by the token's name) in
    ``api.tokens``. None for a stranger; "unresolved" when their Leanote user is not known yet (an
    account's email that has not synced), "many_users" for a token that may ask several users'
    notes and ``user`` (an id or an account's email) does not say which of them."""
    key = person_key(platform, person)
    conversation = conversation_key(platform, place, person) if place is not None else None
    if platform == "api":
        token = next((t for t in parts.settings.api.tokens if t.name == str(person)), None)
        if token is None:
            return None
        users = sorted({leanote_user(parts, u) for u in token.users})
        chosen = leanote_user(parts, user) if user else None
        if chosen not in users and len(users) != 1:
            return "many_users"
        return Person(key, chosen if chosen in users else users[0], token.admin, conversation)
    entry = entry_of(parts.settings, key)
    if entry is None:
        return None
    user_id = entry.leanote_user_id or user_for_email(parts, entry.leanote_email or "")
    if not user_id:
        return "unresolved"
    return Person(key, user_id, entry.admin, conversation)


def person_now(parts: "Parts", key: str) -> Person | None:
    """The chat person ``key`` (``telegram:111``, ``discord:222``) as the config in force maps
    them now (a reload changes it at once): their Leanote user of now (an account's email once it
    has synced); None when ``users:`` no longer holds them, or their account has not synced yet."""
    entry = entry_of(parts.settings, key)
    if entry is None:
        return None
    user_id = entry.leanote_user_id or user_for_email(parts, entry.leanote_email or "") or ""
    return Person(key, user_id, entry.admin) if user_id else None


def reaches(parts: "Parts", key: str, user_id: str) -> bool:
    """May something of Leanote user ``user_id``'s (a digest, a gap a note answers, a capture's
    receipt) go to person ``key`` now: they are still in the config in force and still see that
    user's notes. Asked before anything is sent to a person unasked: nobody removed from
    ``users:`` hears anything more, and nothing of user A's goes to a person mapped to B now."""
    platform, _, name = key.partition(":")
    if key == "cli":
        return True
    if platform == "api":
        entry = next((t for t in parts.settings.api.tokens if t.name == name), None)
        return entry is not None and user_id in {leanote_user(parts, u) for u in entry.users}
    person = person_now(parts, key)
    return person is not None and person.user_id == user_id


_BY_PLACE = re.compile(r"^api:token(\d+)$")  # an API caller as earlier versions kept it: its place in api.tokens


def name_api_people(parts: "Parts") -> dict[str, str]:
    """What is kept of an API caller under its place in ``api.tokens`` (``api:token0``, as
    earlier versions kept it) becomes its holder's, ``api:<name>``, by the list as it is at this
    start: gaps, a note being written for one, captures and the notes ``/append`` writes to,
    answers and their conversations (``feedback``). A place the list no longer has is nobody's:
    ``api:#token3``, which no token can be named. Run by the daemon at start (in a worker
    thread); after the first, nothing is left to rename (no name can be ``token<n>``), so a
    list reordered later moves nothing. The renames made (old -> new)."""
    tokens = parts.settings.api.tokens
    stores = [s for s in (parts.gaps_if_made(), parts.feedback_if_made(), parts.outbox_if_made()) if s is not None]
    done: dict[str, str] = {}
    for store in stores:
        for old in sorted(store.persons("api:token")):
            m = _BY_PLACE.match(old)
            if m is None:
                continue
            i = int(m[1])
            new = f"api:{tokens[i].name}" if i < len(tokens) else f"api:#token{i}"
            moved = store.rename_person(old, new)
            if moved:
                log.info("%d of what was kept for %s (api.tokens[%d]) is %s's now", moved, old, i, new)
            done[old] = new
    return done


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
