"""The shape of the house, checked: rag/ is the core and imports neither sync/ nor
bot/; sync/ and bot/ do not import each other; protocol libraries stay at the edges."""

import ast
from pathlib import Path

import pytest

from conftest import REPO

PROTOCOL_LIBS = {
    # library: the modules allowed to import it
    "requests": {"sync/sources/leanote_api.py"},
    "pymongo": {"sync/sources/mongodb.py", "sync/sources/mongodump.py"},
    "bson": {"sync/sources/mongodb.py", "sync/sources/mongodump.py"},
    "ollama": {"rag/index/embed.py", "rag/llm.py"},
    "httpx": {"rag/index/embed.py", "rag/llm.py", "rag/client.py"},
    "fastapi": {"sync/api.py"},
    "uvicorn": {"sync/api.py"},
    "watchfiles": {"sync/watch.py"},
    "telegram": {"bot/telegram.py"},
    "discord": {"bot/discord.py"},
    "qdrant_client": {"rag/index/store.py"},
    "qdrant_edge": {"rag/index/store.py"},
    "sentence_transformers": {"rag/index/embed.py", "rag/answer/rerank.py"},
    "FlagEmbedding": {"rag/answer/rerank.py"},
    "prometheus_client": {"rag/metrics.py"},
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def sources(package: str):
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package, forbidden", [("rag", {"sync", "bot"}), ("sync", {"bot"}), ("bot", {"sync"})])
def test_imports_flow_one_way(package, forbidden):
    offenders = [(p.relative_to(REPO).as_posix(), sorted(imports(p) & forbidden)) for p in sources(package)]
    assert [o for o in offenders if o[1]] == []


def test_protocol_libraries_stay_at_the_edges():
    offenders = []
    for package in ("rag", "sync", "bot"):
        for path in sources(package):
            rel = path.relative_to(REPO).as_posix()
            for lib in imports(path) & set(PROTOCOL_LIBS):
                if rel not in PROTOCOL_LIBS[lib]:
                    offenders.append((rel, lib))
    assert offenders == []


def test_the_scan_sees_imports():
    # guard against a scan that silently finds nothing
    assert {"click", "rag"} <= imports(REPO / "sync" / "cli.py")
