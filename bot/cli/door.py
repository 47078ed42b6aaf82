"""How the CLI reaches the notes: by opening the index itself, or through the running
daemon that holds it. Both doors offer the same calls and return the same data, so
each command is written once and prints the same either way.

``open_door(settings)`` chooses: a daemon answering on ``api.socket`` means the
daemon (``bot.api.client.find_daemon``), else the index is opened here.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable, Protocol

from rag.answer.types import Answer, Citation
from rag.config import Settings
from rag.errors import Unavailable
from rag.model import Hit

from bot.api.client import DaemonClient, find_daemon, say_door

if TYPE_CHECKING:  # the index is imported by the door that opens it: through a daemon, never
    from rag.index.note_index import NoteIndex


class Door(Protocol):
    through_daemon: bool

    def users(self) -> dict[str, int]:
        """Indexed chunks per Leanote user."""
        ...

    def search(self, query: str, user_id: str, k: int | None, retriever: str = "hybrid") -> list[Hit]: ...

    def ask(self, question: str, user_id: str, on_token: Callable[[str], None] | None = None,
            on_sources: Callable[[list[Citation]], None] | None = None) -> Answer:
        """The answer; ``on_token`` hears its text as the LLM writes it, ``on_sources`` the
        notes its evidence comes from, once, before the LLM reads."""
        ...

    def held(self, user_id: str, note_ids: list[str]) -> set[str]:
        """Those of ``note_ids`` the index holds for the user."""
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
    """This process opens the index (and, to answer, loads the reranker and the LLM client)."""

    through_daemon = False

    def __init__(self, settings: Settings):
        from bot.root import Parts

        self.settings = settings
        self.parts = Parts(settings, one_shot=True)  # each loaded once (a reranker is slow to load) ...
        self._loop: asyncio.AbstractEventLoop | None = None  # ... and asked on one event loop

    @property
    def index(self) -> "NoteIndex":
        return self.parts.index

    def users(self) -> dict[str, int]:
        return self.index.store.count_by_user()

    def held(self, user_id: str, note_ids: list[str]) -> set[str]:
        if not note_ids:
            return set()
        store = self.parts.store()  # no model loaded for it
        if store is None:  # nothing indexed yet
            return set()
        return store.holding(user_id, note_ids)

    def search(self, query: str, user_id: str, k: int | None, retriever: str = "hybrid") -> list[Hit]:
        from rag.index.retrieve import search

        return search(self.index, query, user_id, k, retriever=retriever)

    def ask(self, question: str, user_id: str, on_token: Callable[[str], None] | None = None,
            on_sources: Callable[[list[Citation]], None] | None = None) -> Answer:
        answers = self.parts.answers
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(answers.ask(question, user_id, on_token=on_token,
                                                               on_sources=on_sources))

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())  # as asyncio.run ends
            self._loop.close()
        self.parts.close()


class DaemonDoor(_Closing):
    """The running daemon answers (``GET /users``, ``GET /search``, ``POST /ask``)."""

    through_daemon = True

    def __init__(self, client: DaemonClient):
        self.client = client

    def users(self) -> dict[str, int]:
        return self.client.get("/users")["users"]

    def held(self, user_id: str, note_ids: list[str]) -> set[str]:
        if not note_ids:
            return set()
        return set(self.client.post("/notes/held", {"user": user_id, "note_ids": sorted(set(note_ids))})["held"])

    def search(self, query: str, user_id: str, k: int | None, retriever: str = "hybrid") -> list[Hit]:
        body = self.client.get("/search", q=query, user=user_id, k=k, retriever=retriever)
        return [Hit(**h) for h in body["hits"]]

    def ask(self, question: str, user_id: str, on_token: Callable[[str], None] | None = None,
            on_sources: Callable[[list[Citation]], None] | None = None) -> Answer:
        for event in self.client.stream("/ask", {"question": question, "user": user_id}):
            if event["event"] == "token" and on_token is not None:
                on_token(event["text"])
            elif event["event"] == "sources" and on_sources is not None:
                on_sources([Citation(**c) for c in event["sources"]])
            elif event["event"] == "answer":
                return Answer.from_json(event["answer"])
        raise Unavailable("the daemon ended the answer before it was complete")

    def close(self) -> None:
        self.client.close()


def open_door(settings: Settings) -> Door:
    client = find_daemon(settings)
    say_door(settings, client)
    return DaemonDoor(client) if client is not None else LocalDoor(settings)
