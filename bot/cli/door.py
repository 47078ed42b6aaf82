"""How the command line reaches the notes: by opening them here, or through the running daemon
that holds the index. Both doors offer the same use cases (``bot.usecases``) and return the
same data, so each command is written once and prints the same either way.

``open_door(settings)`` chooses: a daemon answering on ``api.socket`` means the daemon
(``bot.api.client.find_daemon``), else the parts are built here (``bot.root.Parts``).
"""

from __future__ import annotations

import asyncio
from typing import Callable, Protocol

from rag.answer.types import Answer, Citation
from rag.capture import Receipt
from rag.config import Settings
from rag.errors import Unavailable

from bot.api.client import DaemonClient, find_daemon, say_door
from bot.usecases.people import Person
from bot.usecases.results import About, Found, RelatedNotes, Synced, Verdict


class Progress(Protocol):
    """Where a pass's progress is shown: a step of this process's pass (``sync.progress.Step``)
    or an event of the daemon's (``POST /sync``'s ``progress``)."""

    def __call__(self, step) -> None: ...

    def event(self, event: dict) -> None: ...


class Door(Protocol):
    through_daemon: bool

    def users(self) -> dict[str, int]:
        """Indexed chunks per Leanote user."""
        ...

    def accounts(self) -> dict[str, str]:
        """The Leanote user of each API account that has synced, by its email."""
        ...

    def search(self, person: Person, query: str, k: int | None, retriever: str = "hybrid") -> Found: ...

    def ask(self, person: Person, question: str, on_token: Callable[[str], None] | None = None,
            on_sources: Callable[[list[Citation]], None] | None = None) -> Answer:
        """The answer; ``on_token`` hears its text as the LLM writes it, ``on_sources`` the
        notes its evidence comes from, once, before the LLM reads."""
        ...

    def about(self, person: Person, name: str) -> About: ...

    def related(self, person: Person, target: str, k: int) -> RelatedNotes: ...

    def verdict(self, person: Person, item_id: str, verdict: str) -> Verdict: ...

    def status(self, person: Person) -> dict: ...

    def note(self, person: Person, text: str, title: str = "", once: str = "") -> Receipt:
        """A note captured into the person's notes (Leanote, or the notes folder), written once."""
        ...

    def sync(self, person: Person, reconcile: bool, rebuild: bool, shown: Progress) -> Synced: ...

    def fill_second(self, person: Person, seconds: float, shown: Callable[[dict], None]) -> dict:
        """The second dense index filled for at most ``seconds``; its progress at the end."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> "Door": ...

    def __exit__(self, *exc) -> None: ...


class _Closing:
    def close(self) -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalDoor(_Closing):
    """This process builds the parts it needs (the index, and to answer the reranker and the
    LLM client), each once, and runs the use cases on one event loop of its own.
    ``create``/``rebuild``: the index may be made, or built anew (``index``)."""

    through_daemon = False

    def __init__(self, settings: Settings, create: bool = False, rebuild: bool = False):
        from bot.root import Parts  # (here: through a daemon the command line loads none of the parts)

        self.settings = settings
        self.parts = Parts(settings, one_shot=True, create=create, rebuild=rebuild)
        self._loop: asyncio.AbstractEventLoop | None = None

    def _run(self, work):
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(work)

    def users(self) -> dict[str, int]:
        from bot.usecases.people import users

        return self._run(users(self.parts))

    def accounts(self) -> dict[str, str]:
        from bot.usecases.people import accounts

        return accounts(self.parts)

    def search(self, person: Person, query: str, k: int | None, retriever: str = "hybrid") -> Found:
        from bot.usecases import asking

        return self._run(asking.search(self.parts, person, query, k, retriever))

    def ask(self, person: Person, question: str, on_token: Callable[[str], None] | None = None,
            on_sources: Callable[[list[Citation]], None] | None = None) -> Answer:
        from bot.usecases import asking

        return self._run(asking.ask(self.parts, person, question, on_token=on_token, on_sources=on_sources)).answer

    def about(self, person: Person, name: str) -> About:
        from bot.usecases import memory

        return self._run(memory.about(self.parts, person, name))

    def related(self, person: Person, target: str, k: int) -> RelatedNotes:
        from bot.usecases import memory

        return self._run(memory.related(self.parts, person, target, k))

    def verdict(self, person: Person, item_id: str, verdict: str) -> Verdict:
        from bot.usecases import memory

        return self._run(memory.verdict(self.parts, person, item_id, verdict))

    def status(self, person: Person) -> dict:
        from bot.usecases import status

        return self._run(status.status(self.parts, person))

    def note(self, person: Person, text: str, title: str = "", once: str = "") -> Receipt:
        from bot.usecases import capture

        return self._run(capture.note_here(self.parts, person, text, title, capture.note_once(once)))

    def sync(self, person: Person, reconcile: bool, rebuild: bool, shown: Progress) -> Synced:
        from bot.usecases import syncing

        return self._run(syncing.sync_now(self.parts, person, reconcile, rebuild, progress=shown))

    def fill_second(self, person: Person, seconds: float, shown: Callable[[dict], None]) -> dict:
        from bot.usecases import syncing

        return self._run(syncing.fill_second(self.parts, person, seconds, shown))

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())  # as asyncio.run ends
            self._loop.close()
        self.parts.close()


class DaemonDoor(_Closing):
    """The running daemon runs the use cases, reached through its API (``bot.api.app``)."""

    through_daemon = True

    def __init__(self, client: DaemonClient):
        self.client = client

    def users(self) -> dict[str, int]:
        return self.client.get("/users")["users"]

    def accounts(self) -> dict[str, str]:
        return self.client.get("/users").get("accounts") or {}

    def search(self, person: Person, query: str, k: int | None, retriever: str = "hybrid") -> Found:
        return Found.from_json(self.client.get("/search", q=query, user=person.user_id, k=k, retriever=retriever))

    def ask(self, person: Person, question: str, on_token: Callable[[str], None] | None = None,
            on_sources: Callable[[list[Citation]], None] | None = None) -> Answer:
        for event in self.client.stream("/ask", {"question": question, "user": person.user_id}):
            if event["event"] == "token" and on_token is not None:
                on_token(event["text"])
            elif event["event"] == "sources" and on_sources is not None:
                on_sources([Citation(**c) for c in event["sources"]])
            elif event["event"] == "answer":
                return Answer.from_json(event["answer"])
        raise Unavailable("the daemon ended the answer before it was complete")

    def about(self, person: Person, name: str) -> About:
        return About.from_json(self.client.get("/memory/about", name=name, user=person.user_id))

    def related(self, person: Person, target: str, k: int) -> RelatedNotes:
        return RelatedNotes.from_json(self.client.get("/memory/related", target=target, user=person.user_id, k=k))

    def verdict(self, person: Person, item_id: str, verdict: str) -> Verdict:
        return Verdict.from_json(self.client.post("/memory/verdict", {"id": item_id, "verdict": verdict,
                                                                      "user": person.user_id}))

    def status(self, person: Person) -> dict:
        return self.client.get("/status")

    def note(self, person: Person, text: str, title: str = "", once: str = "") -> Receipt:
        return Receipt(**self.client.post("/note", {"text": text, "title": title, "once": once or None,
                                                    "user": person.user_id}))

    def fill_second(self, person: Person, seconds: float, shown: Callable[[dict], None]) -> dict:
        """The daemon fills it between questions: its status says how far it is."""
        return dict(self.status(person).get("second_index") or {}, through_daemon=True)

    def sync(self, person: Person, reconcile: bool, rebuild: bool, shown: Progress) -> Synced:
        """The daemon makes the pass; its progress and summary come back here."""
        for event in self.client.stream("/sync", {"reconcile": reconcile, "rebuild": rebuild, "wait": True}):
            if event["event"] == "progress":
                shown.event(event)
            elif event["event"] == "result":
                return Synced(event["summary"], event["failures"])
        raise Unavailable("the daemon ended the sync before it reported its result")

    def close(self) -> None:
        self.client.close()


def open_door(settings: Settings, create: bool = False, rebuild: bool = False) -> Door:
    """The daemon's door when one runs for these settings, else one opened here (``create``,
    ``rebuild``: for ``index``, which may make the index or build it anew)."""
    client = find_daemon(settings)
    say_door(settings, client)
    return DaemonDoor(client) if client is not None else LocalDoor(settings, create=create, rebuild=rebuild)
