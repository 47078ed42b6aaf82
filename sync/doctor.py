"""``leanote-rag doctor``: each part checked the way it is used, each failure with its fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from rag import embed as embed_mod
from rag.config import Settings
from rag.errors import AuthFailed, LeanoteRagError, StoreLocked, UserError
from rag.store import open_store

from .sources import open_source


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def run_checks(app) -> Iterator[Check]:
    try:
        settings: Settings = app.settings
    except LeanoteRagError as err:
        yield Check("config", False, str(err), "correct the file; every option is listed in the repository's config.yaml")
        return
    yield Check("config", True, f"{settings.config_path or 'defaults'} is valid")
    yield from _source(settings)
    yield from _index(settings)
    yield from _embedder(settings)
    yield from _reranker(settings)
    yield from _ollama(settings)


def _source(settings: Settings) -> Iterator[Check]:
    kind = settings.source.kind
    try:
        source = open_source(settings)
    except UserError as err:
        yield Check(f"source ({kind})", False, str(err), "fix source.* in the config")
        return
    except LeanoteRagError as err:
        yield Check(f"source ({kind})", False, str(err), "check that the source is reachable")
        return
    try:
        if not settings.source.incremental:
            yield Check(f"source ({kind})", True, f"{len(source)} notes or files at {settings.source.path}")
            return
        try:
            accounts = source.accounts()
        except LeanoteRagError as err:
            yield Check(f"source ({kind})", False, str(err), _reach_fix(settings))
            return
        for account in accounts:
            name = f"{kind} account {account}"
            try:
                session = source.session(account)
                usn = session.server_usn()
                yield Check(name, True, f"logged in as user {session.user_id}, server USN {usn}")
            except AuthFailed as err:
                yield Check(name, False, str(err), "put the right password in the environment variable named by "
                            "source.accounts[].password_env (for systemd: /etc/leanote-rag/env), then restart")
            except UserError as err:
                yield Check(name, False, str(err), "set the variable (for systemd: in /etc/leanote-rag/env)")
            except LeanoteRagError as err:
                yield Check(name, False, str(err), _reach_fix(settings))
    finally:
        close = getattr(source, "close", None)
        if close:
            close()


def _reach_fix(settings: Settings) -> str:
    if settings.source.kind == "leanote_api":
        url = settings.source.api_url or settings.leanote.base_url
        return f"check leanote.base_url (or source.api_url) and that Leanote is running: curl {url}/api/user/info"
    return "check the mongodb:// URL in the variable named by source.url_env and that MongoDB is running"


def _index(settings: Settings) -> Iterator[Check]:
    name = f"index ({settings.qdrant.kind})"
    try:
        store = open_store(settings.qdrant, settings.state_dir, dim=0, create=False)
    except StoreLocked as err:
        yield Check(name, True, f"in use by another process: {err}")
        return
    except UserError as err:
        yield Check(name, False, str(err), "run `leanote-rag index`")
        return
    except LeanoteRagError as err:
        yield Check(name, False, str(err), "for a Qdrant server check qdrant.url and qdrant.api_key_env")
        return
    try:
        manifest = store.manifest() or {}
        chunks = sum(store.count_by_user().values())
        yield Check(name, True, f"{store.location}: {chunks} chunks, embedder {manifest.get('embedder')}")
        expected = embed_mod.expected_model_id(settings.embedder)
        if manifest and expected and manifest.get("embedder") != expected:
            yield Check("index matches config", False, f"built with {manifest.get('embedder')}, config asks for {expected}",
                        "run `leanote-rag index --rebuild`")
    except LeanoteRagError as err:
        yield Check(name, False, str(err), "run `leanote-rag index --rebuild`")
    finally:
        store.close()


def _embedder(settings: Settings) -> Iterator[Check]:
    name = f"embedder ({settings.embedder.kind})"
    try:
        embedder = embed_mod.load(settings.embedder)
        embedder.embed(["健康检查 health check"])
        yield Check(name, True, f"{embedder.model_id}, {embedder.dim} dimensions")
    except UserError as err:
        yield Check(name, False, str(err), "see the README, section Install")
    except LeanoteRagError as err:
        fix = ("check embedder.host and that Ollama runs: curl {host}/api/tags".format(host=settings.embedder.host)
               if settings.embedder.kind == "ollama" else "see the README, section Install")
        yield Check(name, False, str(err), fix)


def _reranker(settings: Settings) -> Iterator[Check]:
    from rag import rerank

    name = f"reranker ({settings.rerank.kind})"
    if settings.rerank.kind == "none":
        yield Check(name, True, "off: answers use the fused order")
        return
    try:
        model = rerank.load(settings.rerank)
        model.score("健康检查", ["health check"])
        yield Check(name, True, model.model_id)
    except LeanoteRagError as err:
        yield Check(name, False, f"{err} (answers still work, without reranking)",
                    "install the [models] extra and the weights (README, Install), or set rerank.kind: none")


def _ollama(settings: Settings) -> Iterator[Check]:
    import asyncio

    from rag.errors import ModelMissing
    from rag.llm import OllamaChat

    cfg = settings.ollama
    name = f"ollama ({cfg.host}, {cfg.model})"
    if not cfg.enabled:
        yield Check(name, True, "off (ollama.enabled: false): answers are extractive")
        return
    try:
        detail = asyncio.run(OllamaChat(cfg).check())
        yield Check(name, True, detail)
    except ModelMissing as err:
        yield Check(name, False, str(err), f"ollama pull {cfg.model}")
    except LeanoteRagError as err:
        yield Check(name, False, f"{err} (answers fall back to the best passages)",
                    f"start Ollama (systemctl start ollama) or set ollama.host; check with curl {cfg.host}/api/tags")
