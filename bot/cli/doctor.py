"""``leanote-rag doctor``: each part checked the way it is used, each failure with its fix.

Each part is opened or loaded through the composition root (``bot.root.Parts``), alone, apart
from a running daemon (which holds the index: its health is asked instead)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from rag.config import Settings
from rag.state_dir import make_private
from rag.errors import AuthFailed, BrokenState, LeanoteRagError, NotIndexed, StoreLocked, UserError
from rag.index import embed as embed_mod
from rag.model import NOTEBOOK_SEP, rule_key
from rag.redact import safe_url
from rag.speed import FILE as SPEED_FILE

from sync.faults import MIN_FREE, free_bytes
from sync.state import State
from sync.writeback.folder import safe_name
from sync.writeback.logins import account_emails
from sync.writeback.targets import kind_of

from bot.api.client import find_daemon
from bot.root import Parts
from bot.usecases.status import answers_here

log = logging.getLogger(__name__)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False  # ok, but worth knowing: something doctor found and put right


# A part's own check (each bot has one): settings -> (name, ok, detail, fix) per finding.
PartCheck = Callable[[Settings], Iterable[tuple[str, bool, str, str]]]


def checks() -> list[PartCheck]:
    """What ``doctor`` asks the bots to check (their tokens, chats, channels). The bots are
    imported when ``doctor`` runs, so the other commands do not load the chat libraries."""
    from bot.discord import check as discord
    from bot.telegram import check as telegram

    return [telegram, discord]


def run_checks(app, parts: Iterable[PartCheck] = ()) -> Iterator[Check]:
    """Every check, in order; ``parts``: the checks of the parts ``serve`` runs (``checks()``:
    the bots'). What a library logs while a part is checked is a line of the report after
    that part's (``_said``), not a log line in the middle of it."""
    try:
        settings: Settings = app.settings
    except LeanoteRagError as err:
        yield Check("config", False, str(err), "correct the file; every option is listed in the repository's config.yaml")
        return
    yield Check("config", True, f"{settings.config_path or 'defaults'} is valid")
    with Parts(settings) as root:
        yield from _said(_source(root))
        yield from _said(_capture(settings))
        for section in (_state, _index, _embedder, _second_index, _reranker, _ollama, _media):
            yield from _said(section(root))
    yield from _said(_api(settings))
    yield from _parts(settings, parts)


class _Hold(logging.Handler):
    """While held (``with``): the warnings logged anywhere are kept here instead of printed (the
    root's other handlers pass them by)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self._others: list[logging.Handler] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @staticmethod
    def _below(record: logging.LogRecord) -> bool:  # the other handlers' filter meanwhile
        return record.levelno < logging.WARNING

    def __enter__(self) -> "_Hold":
        root = logging.getLogger()
        self._others = list(root.handlers)
        for handler in self._others:
            handler.addFilter(self._below)
        root.addHandler(self)
        return self

    def __exit__(self, *_exc) -> None:
        root = logging.getLogger()
        root.removeHandler(self)
        for handler in self._others:
            handler.removeFilter(self._below)


def _said(section: Iterable[Check], name: str = "") -> Iterator[Check]:
    """``section``'s checks, then what was logged while they ran, each once, as a WARN line of the
    last check's name (or ``name``)."""
    hold, checks = _Hold(), iter(section)
    while True:
        with hold:
            check = next(checks, None)
        if check is None:
            break
        name = check.name
        yield check
    seen: set[str] = set()
    for record in hold.records:
        text = " ".join((record.getMessage().splitlines() or [""])[0].split())[:300]
        if text and text not in seen:
            seen.add(text)
            yield Check(name or record.name, True, f"{record.name} said while it was checked: {text}", warn=True)


def _api(settings: Settings) -> Iterator[Check]:
    """The remote listener's tokens: each variable set, long enough to be a secret."""
    cfg = settings.api
    if not cfg.listen:
        return
    held: dict[str, str] = {}  # a token's value -> the name of the first entry holding it
    for i, token in enumerate(cfg.tokens):
        value = os.environ.get(token.token_env, "")
        if value and value in held:
            yield Check(f"api token {i + 1}", False, f"{token.token_env} ({token.name}) holds the same token as "
                        f"{held[value]}: the TCP listener {cfg.listen} stays off", "give each holder a token of "
                        "their own (openssl rand -hex 32), then restart")
            continue
        held.setdefault(value, f"{token.token_env} ({token.name})")
        if not value:
            yield Check(f"api token {i + 1}", False, f"environment variable {token.token_env} is not set: the TCP "
                        f"listener {cfg.listen} stays off", f"put {token.token_env}=$(openssl rand -hex 32) in the "
                        "service's environment file, then restart")
        elif len(value) < 16:
            yield Check(f"api token {i + 1}", False, f"{token.token_env} holds only {len(value)} characters: "
                        "easy to guess", "use openssl rand -hex 32")
        else:
            yield Check(f"api token {i + 1}", True, f"{token.token_env} ({token.name}) is set; may query "
                        f"{', '.join(token.users) or 'no user'}{' (admin)' if token.admin else ''}")


def _parts(settings: Settings, parts: Iterable[PartCheck]) -> Iterator[Check]:
    """The parts' own checks (the chat bots')."""
    for check in parts:
        yield from _said(_part(settings, check), check.__module__.rsplit(".", 1)[-1])


def _part(settings: Settings, check: PartCheck) -> Iterator[Check]:
    name = check.__module__.rsplit(".", 1)[-1]
    try:
        for name, ok, detail, fix in check(settings):
            yield Check(name, ok, detail, fix)
    except Exception as err:  # a broken check must not hide the others
        log.debug("check %s failed", name, exc_info=True)
        yield Check(name, False, f"the check itself failed: {type(err).__name__}: {err}", "run with --debug")


def _state(root: Parts) -> Iterator[Check]:
    """The state directory (private? writable?), state.db (readable?), privacy rules (match?)."""
    settings = root.settings
    folder = settings.state_dir
    if folder.exists():
        mode = stat.S_IMODE(folder.stat().st_mode)
        # as every command that opens the state does: made private, when it is this user's to change
        mine = not (os.geteuid() == 0 and folder.stat().st_uid != 0)  # root leaves the service's folder alone
        was = make_private(folder, say=False) if mode & 0o077 and mine else None
        now = stat.S_IMODE(folder.stat().st_mode)
        if now & 0o077:
            yield Check("state directory", False, f"{folder} is readable by other users (mode {now:o}) and this "
                        "user cannot make it private: it holds your notes' text and the sync state",
                        f"chmod 700 {folder}, as its owner")
        elif was is not None:
            yield Check("state directory", True, f"{folder} was readable by other users (mode {was:o}): made it "
                        "private (0700), with the files in it, as every command that opens the state does",
                        warn=True)
        if not now & 0o077 and not os.access(folder, os.W_OK | os.X_OK):
            yield Check("state directory", False, f"{folder} is not writable by this user",
                        f"sudo chown -R \"$USER\" {folder}, or set state_dir")
        free = free_bytes(folder)
        if free < MIN_FREE:  # serve and index refuse to write (the index's mapped files would crash them)
            yield Check("disk space", False, f"{free // 2**20} MB free on the file system of {folder}, at least "
                        f"{MIN_FREE // 2**20} MB needed", "free some space there, or move state_dir to a larger one")
    if not (folder / "state.db").exists():
        yield Check("sync state", True, f"none yet in {folder}: the first `leanote-rag index` or `serve` makes it")
        return
    try:
        state = root.state
    except BrokenState as err:
        yield Check("sync state", False, str(err), "leanote-rag index --rebuild")
        return
    except LeanoteRagError as err:
        yield Check("sync state", False, str(err), f"make {folder} readable and writable by this user")
        return
    verdict = state.problem()  # SQLite's check, also when it cannot read a page at all
    if verdict is not None:
        yield Check("sync state", False, f"{state.path} is damaged: {verdict}", "leanote-rag index --rebuild, "
                    "or restore state.db from a backup")
        return
    skipped = state.skipped()
    detail = f"{state.path} is consistent"
    if skipped:
        latest = skipped[0]
        detail += f"; {len(skipped)} note(s) could not be indexed, e.g. {latest['origin']}: {latest['reason']}"
    yield Check("sync state", True, detail)
    yield from _privacy(settings, state)


def _privacy(settings: Settings, state: State) -> Iterator[Check]:
    """Each exclude entry should match a notebook or tag the synced notes have: a typo in a
    privacy rule silently protects nothing."""
    rules = settings.exclude
    if not (rules.notebooks or rules.tags):
        return
    books: set[str] = set()
    tags: set[str] = set()
    for source in {r.source for r in state.accounts()}:
        for book in state.notebooks(source).values():
            books.update((book.id, rule_key(book.title)))
    for notebook_id, path, row_tags in state.db.execute("SELECT notebook_id, notebook, tags FROM notes"):
        books.add(notebook_id)
        parts = path.split(NOTEBOOK_SEP) if path else []
        # a title may itself hold " / ": every run of path parts may be one title
        books.update(rule_key(NOTEBOOK_SEP.join(parts[i:j])) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1))
        tags.update(rule_key(t) for t in json_list(row_tags))
    if not books and not tags:
        return  # nothing synced yet
    unknown = [f"notebook {n!r}" for n in rules.notebooks if n.strip() not in books and rule_key(n) not in books]
    unknown += [f"tag {t!r}" for t in rules.tags if rule_key(t) not in tags]
    if unknown:
        yield Check("privacy rules", False, f"exclude names {', '.join(unknown)}, which no synced note has: "
                    "a typo protects nothing", "check the spelling against your notebooks and tags in Leanote "
                    "(titles and tags match without regard to case)")
    else:
        yield Check("privacy rules", True, f"{len(rules.notebooks)} notebook and {len(rules.tags)} tag rule(s), each "
                    "matching synced notes")


def json_list(text: str) -> list[str]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _source(root: Parts) -> Iterator[Check]:
    settings = root.settings
    kind = settings.source.kind
    try:
        source = root.open_source()
    except UserError as err:
        yield Check(f"source ({kind})", False, str(err), "fix source.* in the config")
        return
    except LeanoteRagError as err:
        yield Check(f"source ({kind})", False, str(err), "check that the source is reachable")
        return
    try:
        if not settings.source.incremental:
            yield Check(f"source ({kind})", True, f"{len(source)} notes at {settings.source.path}")
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


def _capture(settings: Settings) -> Iterator[Check]:
    """Where ``serve`` writes what people capture from chat: the folder (writable?), the Leanote
    accounts, or nowhere (and how to give it somewhere)."""
    kind = kind_of(settings)
    if not settings.capture.enabled:
        yield Check("capture", True, "turned off (capture.enabled: false): the bots offer no capture")
        return
    if kind is None:
        yield Check("capture", True, f"nowhere to write: a {settings.source.kind} source is read-only, so the bots "
                    "offer no capture and say why", "to capture into Leanote, add capture.accounts (email and "
                    "password_env)", warn=True)
        return
    if kind == "folder":
        root = settings.source.path
        inbox = safe_name(settings.capture.notebook, "Inbox")
        where = f"Markdown files into the folder {root}, sub-folder {inbox}/ (the notes of user {settings.source.user_id})"
        if not os.access(root, os.W_OK | os.X_OK) or (os.path.isdir(os.path.join(root, inbox))
                                                      and not os.access(os.path.join(root, inbox), os.W_OK | os.X_OK)):
            yield Check("capture", False, f"{where}: this user cannot write there",
                        "let the service's user write the folder (under systemd: ReadWritePaths= with the folder, "
                        "`systemctl edit leanote-rag`), or set capture.target: leanote with capture.accounts")
            return
        yield Check("capture", True, where)
        return
    emails = account_emails(settings)
    if not emails:
        yield Check("capture", False, "into Leanote (capture.target: leanote), but there is no account to write with",
                    "add capture.accounts (email and password_env)")
        return
    yield Check("capture", True, f"into Leanote, notebook {settings.capture.notebook!r}, as {', '.join(emails)}")


def _reach_fix(settings: Settings) -> str:
    if settings.source.kind == "leanote_api":
        url = safe_url(settings.source.api_url or settings.leanote.base_url)
        return f"check leanote.base_url (or source.api_url) and that Leanote is running: curl {url}/api/user/info"
    return "check the mongodb:// URL in the variable named by source.url_env and that MongoDB is running"


def _index(root: Parts) -> Iterator[Check]:
    settings = root.settings
    name = f"index ({settings.qdrant.kind})"
    try:
        client = find_daemon(settings)
    except UserError as err:
        yield Check(name, False, str(err), "run doctor as the service's user or as root")
        return
    if client is not None:
        with client:
            try:
                health = client.health()
            except LeanoteRagError as err:
                yield Check(name, False, str(err), "see journalctl -u leanote-rag")
                return
        if health["ready"]:
            yield Check(name, True, f"held by the running daemon: {health['passes']} pass(es) since it started, "
                        "the last one ok")
        elif health["index"] != "open":
            yield Check(name, False, f"the running daemon cannot open it: {health['index']}",
                        "see journalctl -u leanote-rag")
        else:
            yield Check(name, False, "the running daemon's last sync failed", "leanote-rag status shows why")
        return
    try:
        store = root.open_store()
    except StoreLocked as err:
        yield Check(name, True, f"in use by another process: {err}")
        return
    except NotIndexed:  # the README's order: doctor, then the first index
        yield Check(name, True, "not indexed yet: run `leanote-rag index`", warn=True)
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


def _embedder(root: Parts) -> Iterator[Check]:
    settings = root.settings
    name = f"embedder ({settings.embedder.kind})"
    try:
        embedder = root.load_embedder()  # the model itself, not what a cache kept
        embedder.embed(["健康检查 health check"])
        detail = f"{embedder.model_id}, {embedder.dim} dimensions"
        cache = embed_mod.cache_path(settings.embedder)
        if cache is not None and settings.embedder.kind in embed_mod.CACHED_KINDS:
            detail += f"; vector cache {cache}: {len(embed_mod.vector_cache(cache))} vectors"
        yield Check(name, True, detail)
    except UserError as err:
        yield Check(name, False, str(err), "see docs/install.md in the repository")
    except LeanoteRagError as err:
        fix = ("check embedder.host and that Ollama runs: curl {host}/api/tags".format(host=safe_url(settings.embedder.host))
               if settings.embedder.kind == "ollama" else "see docs/install.md in the repository")
        yield Check(name, False, str(err), fix)


# What doctor embeds to measure the second embedder's speed when no fill has measured it yet: chunks
# of a typical length (the notes' chunks: ~680 characters, ~345 tokens at the median).
SAMPLE_CHUNK = ("在家里的服务器上用 Docker Compose 部署服务时，先把数据目录挂载到宿主机，再用 restic 每天夜里备份到外部硬盘。"
                "恢复时先停掉容器，确认快照的时间，然后把目录还原到原来的位置，最后检查权限和属主是否和原来一致。") * 5
SAMPLE_CHUNKS = 8


def _second_index(root: Parts) -> Iterator[Check]:
    """The second dense index (``second_index``): its embedder loads, and this machine can fill
    the index within a night (the rate the fill measured here, else measured now on a few chunks)."""
    from sync.second_jobs import RATE_FILE, night_seconds, rate_record, saved_rate, too_slow, wanted
    from sync.memory_jobs import duration

    settings = root.settings
    cfg = settings.second_index
    if not wanted(settings):  # off, or auto where its model was never fetched
        return
    name = f"second index ({cfg.enabled})"
    try:
        embedder = root.load_second_embedder()
    except UserError as err:
        yield Check(name, cfg.enabled == "auto", f"{err}" + ("; the first index answers alone" if cfg.enabled == "auto"
                                                              else ""),
                    "install the [gemma] extra and run `leanote-rag models fetch gemma` (docs/install.md)",
                    warn=cfg.enabled == "auto")
        return
    chunks = None
    try:
        store = root.open_store()
        try:
            chunks = sum(n for u, n in store.count_by_user().items() if not u.endswith("#asked"))
        finally:
            store.close()
    except LeanoteRagError:  # not indexed yet, or the daemon holds it: the rate measured is told anyway
        pass
    saved = saved_rate(settings) or {}
    if saved.get("embedder") == embedder.model_id and saved.get("rate"):
        rate, basis = float(saved["rate"]), "measured by the fill here"
    else:
        began = time.monotonic()
        embedder.embed([SAMPLE_CHUNK] * SAMPLE_CHUNKS)
        rate, basis = SAMPLE_CHUNKS / max(1e-6, time.monotonic() - began), f"measured now on {SAMPLE_CHUNKS} chunks"
        with contextlib.suppress(OSError):
            (settings.state_dir / RATE_FILE).write_text(rate_record(settings, round(rate, 3), chunks,
                                                                    embedder.model_id, time.time()))
    why = too_slow(settings, rate, chunks)
    if why:
        stays = ("so it stays off: the first index answers alone (second_index.enabled: on fills it anyway)"
                 if cfg.enabled == "auto" else "it is filled anyway (on), between questions, over several nights")
        yield Check(name, True, f"{why} ({basis}): {stays}",
                    "set a longer second_index.window, or second_index.enabled: off", warn=True)
        return
    fill = f", the index's {chunks} chunks in ~{duration(chunks / rate)} (a night: {duration(night_seconds(settings))})" \
        if chunks else ""
    yield Check(name, True, f"{embedder.model_id}: {rate:.2f} chunks/s here ({basis}){fill}")


def _media(root: Parts) -> Iterator[Check]:
    """Voice messages and photos: each engine loaded and tried on a tiny sample; an extra not
    installed is worth knowing, not a failure (the bots say what to install)."""
    for name, state, detail, fix in root.media.check():
        yield Check(name, state != "broken", detail, fix, warn=state == "missing")


def _reranker(root: Parts) -> Iterator[Check]:
    from rag.answer import rerank

    settings = root.settings
    kind, why = rerank.resolve(settings.rerank)
    name = f"reranker ({settings.rerank.kind})"
    if kind == "none":
        yield Check(name, True, why or "off: answers use the fused order")
        return
    try:
        model = root.load_reranker()
        model.score("健康检查", ["health check"])
        yield Check(name, True, model.model_id)
    except LeanoteRagError as err:
        yield Check(name, False, f"{err} (answers still work, without reranking)",
                    "install the [models] extra and the weights (docs/install.md), or set rerank.kind: none")


def _ollama(root: Parts) -> Iterator[Check]:
    import asyncio

    from rag.answer.sizing import measure_speed
    from rag.errors import ModelMissing
    from rag.llm import NotOllama
    from rag.speed import SpeedBook

    settings = root.settings
    cfg = settings.ollama
    name = f"ollama ({safe_url(cfg.host)}, {cfg.model})"
    if not cfg.enabled:
        yield Check(name, True, "off (ollama.enabled: false): answers are extractive")
        return
    try:
        chat = root.load_chat()
        book = SpeedBook(settings.state_dir / SPEED_FILE if settings.state_dir.exists() else None)

        probed: list[float] = []

        async def check_and_measure() -> str:
            # one event loop for both: the chat's HTTP client belongs to the loop it first ran on
            found = await chat.check()
            if not book.get(cfg.model).read_tps:
                # measured now, so the first question's evidence is sized to this machine
                probed.append(os.getloadavg()[0])
                await measure_speed(chat, book, settings)
            return found

        detail = asyncio.run(check_and_measure())
        book.flush()
        speed = book.get(cfg.model)
        measured = speed.describe(cfg.model) if speed.samples else f"{cfg.model}: speed not measured yet (ask a question)"
        if probed and speed.read_tps:  # a busy machine reads slower: the answers' replies measure it again
            measured += f", measured now at load {probed[0]:.1f} (every answer measures it again)"
        means = answers_here(settings, cfg.model, speed)
        if means:
            measured += f": {means}"
        yield Check(name, True, f"{detail}; {measured}")
    except ModelMissing as err:
        yield Check(name, False, str(err), f"ollama pull {cfg.model}")
    except NotOllama as err:
        yield Check(name, False, str(err), "set ollama.host to your Ollama server's address (its port is 11434 by "
                    "default)")
    except LeanoteRagError as err:
        yield Check(name, False, f"{err} (answers fall back to the best passages)",
                    f"start Ollama (systemctl start ollama) or set ollama.host; check with curl {safe_url(cfg.host)}/api/tags")
