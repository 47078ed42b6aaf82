"""The shape of the house, checked.

- ``rag/`` is the core and imports neither ``sync/`` nor ``bot/``. Inside it, the index
  imports neither the answer nor the memory, the memory not the answer, and the shared
  plumbing none of the three rooms.
- ``sync/`` (notes in and out) never imports ``bot/`` (the doors, the use cases they call, the
  composition root): the doors stand on the sync and the core, never the other way round.
- No import cycles anywhere, lazy imports inside functions included.
- One command: ``leanote-rag`` runs ``bot.cli``, and no entry points
  stand in for an import of our own code.
- Protocol libraries stay at the edges.
- Only the composition root opens stores and loads models; only the derived stage keeps the
  memory and the feedback store in line with the notes; no module is over ``MAX_LINES``.
- The doors (the chat bots, the API, the command line) only parse, call a use case
  (``bot/usecases``) and render: none opens a store, works the memory's related notes or
  corrections, keeps a conversation or builds the trace of an answer itself.
"""

import ast
import tomllib
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import REPO

PACKAGES = ("rag", "sync", "bot")
PROTOCOL_LIBS = {
    # library: the modules allowed to import it (a path ending in "/": the modules of that folder)
    "requests": {"sync/sources/leanote_api.py"},
    "pymongo": {"sync/sources/mongodb.py", "sync/sources/mongodump.py"},
    "bson": {"sync/sources/mongodb.py", "sync/sources/mongodump.py"},
    "ollama": {"rag/index/embed.py", "rag/llm.py"},
    "httpx": {"rag/index/embed.py", "rag/index/gemma_fetch.py", "rag/llm.py", "rag/http.py", "bot/api/client.py"},
    "fastapi": {"bot/api/app.py", "bot/api/access.py", "bot/api/server.py", "bot/api/web.py"},
    "uvicorn": {"bot/api/server.py", "bot/api/guard.py"},
    "watchfiles": {"sync/watch.py"},
    "apscheduler": {"sync/schedule.py"},
    "telegram": {"bot/telegram/"},
    "discord": {"bot/discord/"},
    "qdrant_client": {"rag/index/store_server.py"},
    "qdrant_edge": {"rag/index/store_edge.py"},
    "sentence_transformers": {"rag/index/embed.py", "rag/index/gemma.py", "rag/index/gemma_onnx.py", "rag/answer/rerank.py"},
    "optimum": {"rag/index/gemma_onnx.py"},
    "onnxruntime": {"rag/index/gemma_onnx.py"},
    "FlagEmbedding": {"rag/answer/rerank.py"},
    "prometheus_client": {"bot/api/metrics.py"},
    # voice and images, read on this machine (the speech and ocr extras)
    "faster_whisper": {"rag/media/speech.py"},
    "opencc": {"rag/media/speech.py"},
    "av": {"rag/media/audio.py"},
    "rapidocr_onnxruntime": {"rag/media/ocr.py"},
    "PIL": {"rag/media/ocr.py"},
    # the command line is a door: the core holds none
    "click": {"bot/cli/"},
}
# rag/'s plumbing that every room may use: it imports none of them
PLUMBING = {"rag.config", "rag.sections", "rag.sections_chat", "rag.state_dir", "rag.errors", "rag.model", "rag.redact", "rag.sqlite", "rag.limits", "rag.llm",
            "rag.speed", "rag.capture", "rag.http", "rag.language"}


@lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    """A source file's syntax tree, parsed once per test process (the checks below read every
    module of ours, each of them several times: 5 s of CPU a run, parsing the same files again)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def imports(path: Path) -> set[str]:
    """The top-level names of what ``path`` imports (absolute imports)."""
    tree = parsed(path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def sources(package: str):
    return sorted((REPO / package).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def our_imports(path: Path) -> set[str]:
    """The modules of ours that ``path`` imports, anywhere in it (relative ones resolved;
    ``from pkg import mod`` is ``pkg.mod``)."""
    return set(_our_imports(path))


@lru_cache(maxsize=None)
def _our_imports(path: Path) -> frozenset[str]:
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] in PACKAGES)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module.split(".")[0] not in PACKAGES:
                continue
            for a in node.names:  # a module imported from a package, or a name from a module
                out.add(f"{module}.{a.name}" if is_module(f"{module}.{a.name}") else module)
    out.discard(module_name(path))
    return frozenset(out)


def graph() -> dict[str, set[str]]:
    return {module_name(p): our_imports(p) for package in PACKAGES for p in sources(package)}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and modules importing themselves."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1 or v in edges.get(v, ()):
                found.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("package, forbidden", [("rag", {"sync", "bot"}), ("sync", {"bot"})])
def test_imports_flow_one_way(package, forbidden):
    offenders = [(p.relative_to(REPO).as_posix(), sorted(imports(p) & forbidden)) for p in sources(package)]
    assert [o for o in offenders if o[1]] == []


@pytest.mark.parametrize("room, forbidden", [
    ("rag.index", ("rag.answer", "rag.memory")),
    ("rag.memory", ("rag.answer",)),
])
def test_rooms_inside_rag_import_downwards(room, forbidden):
    offenders = [(m, d) for m, deps in graph().items() if within(m, room) for d in sorted(deps) if within(d, *forbidden)]
    assert offenders == []


def test_the_plumbing_imports_no_room():
    offenders = [(m, d) for m, deps in graph().items() if m in PLUMBING
                 for d in sorted(deps) if within(d, "rag.index", "rag.answer", "rag.memory")]
    assert offenders == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_cycle_check_finds_a_cycle():
    # guard against a check that cannot fail
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_one_composition_root_and_no_entry_points_of_our_own():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"] == {"leanote-rag": "bot.cli:main"}
    ours = [(group, name, target) for group, points in project.get("entry-points", {}).items()
            for name, target in points.items() if target.split(".")[0].split(":")[0] in PACKAGES]
    assert ours == []
    # and no module of ours looks for entry points (a plugin mechanism standing in for an import)
    looks = [p.relative_to(REPO).as_posix() for package in PACKAGES for p in sources(package)
             if "entry_points" in p.read_text(encoding="utf-8")]
    assert looks == []


def test_every_package_says_what_it_holds():
    missing = [p.relative_to(REPO).as_posix() for package in PACKAGES for p in (REPO / package).rglob("__init__.py")
               if not ast.get_docstring(parsed(p))]
    assert missing == []


def test_protocol_libraries_stay_at_the_edges():
    offenders = []
    for package in PACKAGES:
        for path in sources(package):
            rel = path.relative_to(REPO).as_posix()
            for lib in imports(path) & set(PROTOCOL_LIBS):
                if not any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in PROTOCOL_LIBS[lib]):
                    offenders.append((rel, lib))
    assert offenders == []


def test_the_scan_sees_imports():
    # guard against a scan that silently finds nothing
    assert {"click", "rag"} <= imports(REPO / "bot" / "cli" / "app.py")
    deps = graph()
    assert {"sync.schedule", "bot.root", "bot.api.server"} <= deps["bot.serve"]
    assert "bot.telegram.service" in deps["bot.serve"]  # a lazy import inside a function counts
    assert "bot.usecases.status" in deps["bot.api.app"]


# What opens a store or loads a model: only the composition root does, and these, each for
# the reason given.
STORE_OPENERS = {"State", "MemoryStore", "FeedbackStore", "Outbox", "open_store"}
STORE_OPENED_ELSEWHERE = {
    "bot/root.py": "the composition root",
    "rag/index/note_index.py": "the index opens its own store (NoteIndex.open, called by the root)",
    "rag/index/second.py": "the second dense index opens its own store (SecondIndex.open, called by the root)",
}


def store_openings(path: Path) -> list[str]:
    """Calls in ``path`` that open a store or load a model: ``State(...)``,
    ``MemoryStore.open_for(...)``, ``NoteIndex.open(...)``, ``open_store(...)``,
    ``Outbox.counts_at(...)``, ``rerank.load(...)`` and the like."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in STORE_OPENERS:
            found.append(f.id)
        elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
              and f.value.id in STORE_OPENERS | {"NoteIndex"} and f.attr in {"open", "open_for", "counts_at"}):
            found.append(f"{f.value.id}.{f.attr}")
        elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.attr == "load"
              and f.value.id in {"rerank", "rerank_mod", "llm", "llm_mod"}):  # a model loaded
            found.append(f"{f.value.id}.load")
    return found


def test_only_the_root_opens_stores_and_loads_models():
    offenders = {}
    for package in PACKAGES:
        for path in sources(package):
            rel = path.relative_to(REPO).as_posix()
            if rel in STORE_OPENED_ELSEWHERE or rel in {"sync/state.py", "rag/memory/store.py", "rag/answer/feedback.py", "sync/writeback/outbox.py",
                                                         "rag/index/store.py"}:  # a store's own module
                continue
            found = store_openings(path)
            if found:
                offenders[rel] = found
    assert offenders == {}
    # the scan sees an opening (a check that cannot fail is no check)
    assert "State" in store_openings(REPO / "bot" / "root.py")
    assert {"NoteIndex.open", "rerank_mod.load"} <= set(store_openings(REPO / "bot" / "root.py"))


MAX_LINES = 600


def test_no_module_over_the_limit():
    """A module holds one concern: past ``MAX_LINES`` it is split by concern."""
    over = [f"{p.relative_to(REPO).as_posix()} ({n} lines)" for package in PACKAGES for p in sources(package)
            if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_LINES]
    assert over == []


# What is derived from notes (the memory, related notes, the feedback store's copies) is kept
# in line by one stage after indexing (sync.derived); the memory's LLM tier is its worker.
DERIVED_KEEPERS = {"sync/derived.py", "sync/memory_jobs.py"}


def dotted_imports(path: Path) -> set[str]:
    """The full module names ``path`` imports (``from a.b import c`` gives ``a.b``)."""
    names = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def derived_imports(path: Path) -> set[str]:
    return {n for n in dotted_imports(path) if n.startswith(("rag.memory", "rag.answer.feedback"))}


def test_the_sync_keeps_what_is_derived_from_notes_in_one_place():
    """No module of ``sync/`` but the derived stage touches the memory or the feedback store."""
    offenders = {}
    for path in sources("sync"):
        rel = path.relative_to(REPO).as_posix()
        if rel in DERIVED_KEEPERS:
            continue
        found = derived_imports(path)
        if found:
            offenders[rel] = sorted(found)
    assert offenders == {}
    # the scan sees such an import (a check that cannot fail is no check)
    assert "rag.memory.store" in derived_imports(REPO / "sync" / "derived.py")


def test_the_command_line_starts_without_the_search_stack():
    """``leanote-rag --help`` and the commands that go through a running daemon load no model,
    index or store: each process the bots' owner (or a test) starts costs a fraction of a
    second, not the whole stack's imports. The heavy parts are imported by the commands that
    use them."""
    import subprocess
    import sys

    heavy = ["numpy", "rjieba", "qdrant_edge", "qdrant_client", "bs4", "rag.index.note_index", "rag.memory.store",
             "bot.root", "sync.state", "rag.answer.service"]
    code = ("import sys\nfrom bot.cli import cli\n"
            "cli.main(['--help'], standalone_mode=False)\n"
            "from bot.cli.door import DaemonDoor\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


# The doors a person talks through only parse input, call a use case (bot/usecases) and render
# what comes back: none of them opens a store, works the memory's related notes or corrections
# itself, keeps or reads a conversation, or builds the trace of an answer.
DOORS = ("bot/telegram/", "bot/discord/", "bot/api/", "bot/cli/", "bot/chat/", "bot/render.py")
DOOR_FORBIDDEN_CALLS = {
    "correct", "related_of", "of_note", "for_text", "facts_about", "correction_history", "export_corrections",
    "import_corrections", "mark_saved", "conversations", "Trace", "Candidate", "from_json",
}
DOOR_FORBIDDEN_IMPORTS = {"rag.memory.related", "rag.memory.store", "rag.answer.feedback.FeedbackStore",
                          "rag.answer.conversation"}


def door_offences(source: str) -> list[str]:
    """What a door's source does that a use case should: a forbidden call or attribute
    (``store.correct(...)``, ``answers.conversations``, ``Trace(...)``, ``Trace.from_json``),
    or an import of the memory's or the feedback's own modules. ``Answer.from_json`` and
    ``Found.from_json`` and the like read a use case's result back (the CLI's door to a daemon):
    allowed."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in DOOR_FORBIDDEN_CALLS:
            found.append(f"{node.func.id}(...)")
        elif isinstance(node, ast.Attribute) and node.attr in DOOR_FORBIDDEN_CALLS:
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            if node.attr == "from_json" and owner not in {"Trace", "Candidate"}:
                continue  # a result read back
            found.append(f".{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            found += sorted(names & DOOR_FORBIDDEN_IMPORTS)
        elif isinstance(node, ast.Import):
            found += sorted({a.name for a in node.names} & DOOR_FORBIDDEN_IMPORTS)
    return found


def door_modules() -> list[Path]:
    return [p for p in sources("bot") if any(
        p.relative_to(REPO).as_posix() == d or (d.endswith("/") and p.relative_to(REPO).as_posix().startswith(d))
        for d in DOORS)]


def test_the_doors_only_parse_call_a_use_case_and_render():
    offenders = {}
    for path in door_modules():
        found = door_offences(path.read_text(encoding="utf-8")) + store_openings(path)
        if found:
            offenders[path.relative_to(REPO).as_posix()] = found
    assert offenders == {}
    # the walk sees every door, and the scan sees what it looks for (a check that cannot fail is no check)
    walked = {p.relative_to(REPO).as_posix() for p in door_modules()}
    assert {"bot/telegram/commands.py", "bot/discord/buttons.py", "bot/api/app.py", "bot/cli/memory.py",
            "bot/chat/texts.py", "bot/render.py"} <= walked
    assert "bot/usecases/memory.py" not in walked and "bot/root.py" not in walked
    assert door_offences("done = store.correct(user, item, 'rejected')") == [".correct"]
    assert door_offences("from rag.memory import related as related_mod\nrelated_mod.of_note(s, u, t, 8)") == [
        "rag.memory.related", ".of_note"]
    assert door_offences("t = Trace(**data)") == ["Trace(...)"]
    assert door_offences("t = Trace.from_json(data)") == [".from_json"]
    assert door_offences("a = Answer.from_json(data)") == []
    assert door_offences("host.answers.conversations.reset(u, c)") == [".conversations"]
    assert door_offences("from rag.memory.store import MemoryStore") == ["rag.memory.store"]


# A door talks to the house through the chat session and shows what it gives back: past these,
# it imports nothing of the core.
SESSION_AND_VIEWS = (
    "bot.session",  # the session (Session, its presses, captures and media, the door-wide port) and its plain data
    "bot.chat",  # the words of the use cases' results (texts, gaps, digest, unasked), streaming at a pace, doctor's checks
    "bot.render", "bot.plain", "bot.splitting",  # an answer and any other text as each platform shows it
)
DOOR_PLUMBING = (
    "rag.capture",  # Attachment, Origin, Quote: what a door makes of a platform's message for a capture
    "rag.config", "rag.errors", "rag.redact",  # a door's token read, refused, kept out of the logs
)
CHAT_DOORS = ("bot/telegram", "bot/discord", "bot/web", "bot/api/chatdoor.py")  # (the web chat's calls: a module)


def door_reaches(path: Path) -> list[str]:
    """What a chat door's module imports of ours past the session and the views, its own package
    and the plumbing it needs to make a message a capture and read its token."""
    own = module_name(path).split(".")[:2]
    return sorted(m for m in our_imports(path)
                  if not within(m, ".".join(own), *SESSION_AND_VIEWS, *DOOR_PLUMBING))


def test_a_chat_door_imports_nothing_of_the_core_past_the_session_and_the_views():
    """A chat door (``bot/telegram``, ``bot/discord``, the web chat's ``bot/api/chatdoor.py``) imports of
    ours only: the session and the views (``SESSION_AND_VIEWS``: ``bot.session``, ``bot.chat``,
    ``bot.render``, ``bot.plain``, ``bot.splitting``), its own package, and the plumbing a door needs
    (``DOOR_PLUMBING``: ``rag.capture`` to make a platform's message a capture, ``rag.config``,
    ``rag.errors``, ``rag.redact`` for its token). Nothing of ``rag``'s rooms, ``sync``, the use
    cases (``bot.usecases``), the composition root or another door: a new door is written on the
    session alone."""
    doors = [p for d in CHAT_DOORS if (REPO / d).exists()
             for p in (sorted((REPO / d).rglob("*.py")) if (REPO / d).is_dir() else [REPO / d])]
    offenders = {p.relative_to(REPO).as_posix(): found for p in doors if (found := door_reaches(p))}
    assert offenders == {}
    # the walk sees the doors, and the check sees an import past the session (a check that cannot fail is no check)
    assert {"bot/telegram/answering.py", "bot/discord/buttons.py", "bot/api/chatdoor.py"} <= {
        p.relative_to(REPO).as_posix() for p in doors}
    assert "bot.session" in our_imports(REPO / "bot" / "telegram" / "answering.py")
    reached = door_reaches(REPO / "bot" / "chat" / "texts.py")  # (a view: it reads the use cases' results)
    assert {"bot.usecases.memory", "rag.index.excerpt"} <= set(reached) and "bot.render" not in reached
