"""Shared fixtures: real parts (Qdrant Edge, SQLite, the USE model) in temp folders."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rag import config as config_mod
from rag.http import tls
from rag.index import embed as embed_mod
from bot.api.client import ONE_SHOT
from bot.root import Parts

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "notes"
SHARED = Path(os.environ.get("LEANOTE_RAG_SHARED", REPO.parent / "shared"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """The order the workers take tests in (``make test`` hands them out one at a time, to whichever
    worker is free): the tests marked slow first, so the long ones start early and the many short
    ones fill in at the end, instead of a long one running alone while the other cores wait. The
    first test on the shared corpus's slice leads, since it indexes the slice; the others on it
    come after the other slow tests, when it is built (a worker that needs it while another builds
    it waits for it, doing nothing). Then which tests go to one worker together (``GroupScheduling``)."""
    on_slice = [item for item in items if "corpus_slice" in getattr(item, "fixturenames", ())]

    def rank(item) -> int:
        if on_slice and item is on_slice[0]:
            return 0
        if item.get_closest_marker("slow") is None:
            return 3
        return 2 if item in on_slice else 1

    # A group keeps its tests in the module's order, at the place of its first: its tests share a
    # fixture, and a later one may count on what an earlier one did to it, or not have done yet
    # (a fact rejected in the memory by the last test of test_discord_memory).
    group_of = {item.nodeid: _group(item) for item in items}
    first: dict[str, int] = {}
    for item in items:
        if group_of[item.nodeid]:
            first[group_of[item.nodeid]] = min(first.get(group_of[item.nodeid], 9), rank(item))
    items.sort(key=lambda item: first[group_of[item.nodeid]] if group_of[item.nodeid] else rank(item))
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and hasattr(config, "_tmp_path_factory"):
        groups = {nodeid: group for nodeid, group in group_of.items() if group}
        folder = config._tmp_path_factory.getbasetemp().parent  # the run's, where the scheduler reads
        (folder / f"groups-{worker}.json.part").write_text(json.dumps(groups), encoding="utf-8")
        (folder / f"groups-{worker}.json.part").replace(folder / f"groups-{worker}.json")


def _group(item) -> str | None:
    """The group a test goes to a worker in: its ``xdist_group`` mark's, else its module's when it
    uses a fixture of its module that lives longer than a test (an index, a daemon, a browser, a
    model), which is then built once per run, not in each worker that happens to take one of its
    tests (the e5 index of the sample notes was built twice: ~14 s of CPU)."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    module = item.nodeid.split("::")[0]
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        if defs and defs[-1].scope in ("module", "package", "session") and defs[-1].baseid == module:
            return module
    return None


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` (``make test``): xdist's own grouping reads a suffix it writes into the
    test ids, which pytest 9.2 no longer lets it write (pytest-xdist issue #1386): the groups were
    silently ignored. This scheduler takes them from what the workers wrote at collection."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Like xdist's loadgroup: a group is one unit of work, every other test a unit of its own;
        units are handed out in the collection's order (with ``--no-loadscope-reorder``)."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # an xdist that can write its suffix again
                return nodeid.split("@")[-1]
            if self.groups is None:
                self.groups = {}
                for path in config._tmp_path_factory.getbasetemp().glob("groups-*.json"):
                    self.groups.update(json.loads(path.read_text(encoding="utf-8")))
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """Any connection attempt off this machine fails the test at once."""
    real_connect = socket.socket.connect

    def guarded(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("/"):
            raise AssertionError(f"test tried to reach the network: {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture
def shared() -> Path:
    if not (SHARED / "corpus" / "notes.jsonl").exists():
        pytest.skip(f"shared material not found at {SHARED}")
    return SHARED


# The USE model's BLAS threads in a test process: one. The tests run two processes per core
# (``make test``), and a second thread on a core already busy made the model take twice the CPU
# time (OpenBLAS spins while it waits) and longer, not shorter. The vectors are the same.
THREADS = 1


def capture_alone(settings: config_mod.Settings, **options):
    """The capture writer apart from a daemon, with an outbox of its own in the settings' state
    directory (the composition root gives the daemon's its outbox)."""
    from sync.writeback.capture import Capture
    from sync.writeback.outbox import Outbox

    return Capture(settings, Outbox.open_for(settings), **options)


def make_settings(tmp_path: Path, **sections) -> config_mod.Settings:
    raw = {"source": {"kind": "files", "path": str(EXAMPLES)}, "state_dir": str(tmp_path / "data"),
           "embedder": {"threads": THREADS}}
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return config_mod.from_dict(raw, base_dir=tmp_path)


def index_samples(tmp_path: Path, embedder, **sections) -> config_mod.Settings:
    """Settings over the sample notes (``sections`` as for make_settings), the notes indexed."""
    from rag.index.note_index import NoteIndex
    from sync.indexer import Indexer
    from sync.sources import open_source
    from sync.state import State

    settings = make_settings(tmp_path, **sections)
    state = State(settings.state_dir)
    try:
        with NoteIndex.open(settings, create=True, embedder=embedder) as index:
            source = open_source(settings)
            Indexer(index, state, source.name).run(source.notes())
    finally:
        state.close()
    return settings


def run_pass(settings: config_mod.Settings, embedder, rebuild: bool = False):
    """One forced sync pass over the settings' source (the real SyncService); its result."""
    from rag.index.note_index import NoteIndex
    from sync.state import State

    state = State(settings.state_dir)
    try:
        with NoteIndex.open(settings, create=True, embedder=embedder) as index:
            service = Parts(settings, index=index, state=state).sync
            try:
                result = service.run_pass(force=True, rebuild=rebuild)
            finally:
                service.close()
    finally:
        state.close()
    assert result.ok, result.failures
    return result


@pytest.fixture
def settings_factory(tmp_path):
    return lambda **sections: make_settings(tmp_path, **sections)


@pytest.fixture(scope="session", autouse=True)
def _vectors_cached_for_the_run(tmp_path_factory):
    """One vector cache for the whole run (``embedder.cache``, through ``$LEANOTE_RAG_VECTOR_CACHE``):
    a file in the run's temp folder that the workers and every ``serve`` and CLI process the tests
    start share. Dozens of tests index the same sample notes and ask the same questions with the
    USE and e5 models; each text is now embedded once per run, and a process that finds all its
    texts there never loads the model (~1.7 s of CPU for USE). Set before any test runs, so the
    processes the tests start inherit it. A test about the model itself (its threads) takes the
    variable out of its child's environment; ``doctor`` always checks the model, not the cache."""
    path = run_root(tmp_path_factory) / "vectors.db"
    os.environ[embed_mod.VECTOR_CACHE_ENV] = str(path)
    yield path


@pytest.fixture(scope="session")
def use_embedder():
    """The real offline default embedder, loaded once for the session (on one BLAS thread: ``THREADS``),
    its model loaded now even behind the run's vector cache: a test that times an answer does not
    time the model's loading."""
    embedder = embed_mod.load(config_mod.EmbedderConfig(threads=THREADS))
    embed_mod.warm(embedder)
    return embedder


@dataclass
class CorpusSlice:
    settings: config_mod.Settings
    facts: dict  # ../shared/corpus/facts.json
    questions: list[dict]  # the dev questions about the backup (not those after the change batch)
    summary: object  # the indexing's sync.indexer.Summary


USER_ONE = "5dbed2987db161bc2a85b919"  # the corpus's first user (facts.json names the second)


def run_root(tmp_path_factory) -> Path:
    """The temp folder of the whole run: with xdist each worker has its own under it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def corpus_slice_notes(source, questions: list[dict], facts: dict) -> list:
    """The notes of the corpus slice, in the backup's order: the union of what the corpus modules
    need. Every dev question's gold notes and the first 30 other searchable notes (the gates),
    every trashed note, user two's keyword notes and the first 25 other notes of user one (privacy)."""
    from rag.model import Note

    gold = {n for q in questions for n in q["gold_note_ids"]}
    trashed = {t["NoteId"] for t in facts["trashed_in_base"]}
    keyword_notes = {k["NoteId"] for k in facts["user_two_only_keywords"] if k["where"] == "notes.jsonl"}
    kept, others, of_user_one = [], 0, 0
    for item in source.notes():
        if not isinstance(item, Note):
            continue
        keep = item.id in trashed or item.id in keyword_notes
        if item.searchable and item.id in gold:
            keep = True
        elif item.searchable and others < 30:
            keep, others = True, others + 1
        if item.user_id == USER_ONE and item.id not in trashed and item.id not in keyword_notes and of_user_one < 25:
            keep, of_user_one = True, of_user_one + 1
        if keep:
            kept.append(item)
    return kept


@pytest.fixture(scope="session")
def corpus_slice(tmp_path_factory, use_embedder) -> CorpusSlice:
    """A slice of the shared corpus's real backup (``corpus_slice_notes``) indexed with the real
    default embedder once per run, for the modules that only read it (``test_gate_corpus``,
    ``test_corpus``). The first process to need it builds it in the run's temp folder, under a
    lock: with xdist, a worker that needs it meanwhile waits (on two cores the builder then has
    both) and every worker opens its own copy (the index allows one process at a time). Read-only:
    a test that would change it copies ``settings.state_dir`` first."""
    import fcntl
    from dataclasses import asdict

    from rag.index.note_index import NoteIndex
    from sync.indexer import Indexer, Summary
    from sync.sources.mongodump import MongodumpSource
    from sync.state import State

    if not (SHARED / "corpus" / "notes.jsonl").exists() or not (SHARED / "eval" / "dev.jsonl").exists():
        pytest.skip(f"shared material not found at {SHARED}")
    facts = json.loads((SHARED / "corpus" / "facts.json").read_text(encoding="utf-8"))
    questions = [json.loads(line) for line in open(SHARED / "eval" / "dev.jsonl", encoding="utf-8")]
    questions = [q for q in questions if not q.get("after_changes")]
    archive = SHARED / "corpus" / "mongodump" / "backup_leanote_20250601.tar.gz"
    sections = {"source": {"kind": "mongodump", "path": str(archive)}, "ollama": {"enabled": False},
                "rerank": {"kind": "none"}}
    root = run_root(tmp_path_factory)
    built = root / "corpus-slice"
    with open(root / "corpus-slice.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (built / "summary.json").exists():
            shutil.rmtree(built, ignore_errors=True)  # a build that failed half-way
            settings = make_settings(built, **sections)
            state = State(settings.state_dir)
            try:
                with NoteIndex.open(settings, create=True, embedder=use_embedder) as index:
                    source = MongodumpSource(archive, settings.state_dir)
                    summary = Indexer(index, state, source.name).run(corpus_slice_notes(source, questions, facts))
            finally:
                state.close()
            (built / "summary.json").write_text(json.dumps(asdict(summary)), encoding="utf-8")
    mine = tmp_path_factory.mktemp("corpus")
    shutil.copytree(built / "data", mine / "data")
    summary = Summary(**json.loads((built / "summary.json").read_text(encoding="utf-8")))
    return CorpusSlice(make_settings(mine, **sections), facts, questions, summary)


@pytest.fixture
def notes_dir(tmp_path) -> Path:
    """A private copy of the sample notes that a test may change."""
    target = tmp_path / "notes"
    shutil.copytree(EXAMPLES, target)
    return target


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on (for now)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def unix_http(sock, base_url: str = "http://x", **options) -> httpx.Client:
    """An HTTP client to the daemon's Unix socket (``sock``), sharing the process's TLS context:
    a poll loop building one per try would spend its CPU reading the CA bundle. A connection per
    request, as the CLI's client (``bot.api.client.ONE_SHOT``): one kept idle past the daemon's
    ``api.idle_timeout`` (a slow pass on a busy box) may close under the next request."""
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(sock), verify=tls(), limits=ONE_SHOT),
                        base_url=base_url, **options)


def unix_ahttp(sock, base_url: str = "http://x", **options) -> httpx.AsyncClient:
    """``unix_http``, asynchronous."""
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sock), verify=tls(), limits=ONE_SHOT),
                             base_url=base_url, **options)


def write_config(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


async def until(check, timeout=15.0, what="the condition"):
    """``check()``'s first truthy value, polled every 50 ms on the running loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.05)
    where_things_are()
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def where_things_are() -> None:
    """Where every task of the running loop and every thread is, to stderr (shown with the
    failing test): a wait that timed out says what it waited behind."""
    import faulthandler
    import sys

    print("--- the loop's tasks ---", file=sys.stderr)
    for task in asyncio.all_tasks():
        task.print_stack(limit=8, file=sys.stderr)
    print("--- the threads ---", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


DEADLINE = 120.0  # the longest a test waits for the daemon or a bot, on a machine kept busy by other work
SCENARIO = 600.0  # the longest a whole scenario inside a running daemon may take (its steps wait less)


async def within(awaitable, what: str, timeout: float = DEADLINE):
    """``awaitable``'s result; if it takes longer than ``timeout`` seconds, it is cancelled and
    the test fails saying what it waited for (a daemon or bot that never gets there fails the
    test loudly instead of hanging the run)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        if loop.time() < deadline:  # raised by the awaitable itself, not our deadline
            raise
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}") from None


# A sentence the sample note 生活/菜谱/番茄炒蛋.md holds word for word, so the answer check shows it
TOMATO_LINE = "一定要先把鸡蛋炒好盛出[1]。加一小勺糖（大概 5 克），能压住番茄的酸味[1]。"
# Clauses of that note, word for word and without a number: sentences made of them stand on it
TOMATO_CLAUSES = ("番茄顶上划个十字", "切小块", "鸡蛋打散", "打到起泡", "锅里油稍微多放一点", "油热到微微冒烟再下蛋液",
                  "等边缘鼓起来就用铲子推几下", "七八成熟就盛出来", "一定要先把鸡蛋炒好盛出", "不要和番茄一起下锅",
                  "不然鸡蛋会碎成渣", "口感也发柴", "锅里留底油", "葱白爆香", "下番茄中火炒出汁", "能压住番茄的酸味",
                  "味道更圆润", "然后再加盐", "倒回鸡蛋", "让鸡蛋裹上汤汁", "撒葱花出锅", "喜欢拌饭就多留点汤汁")
# ... and of 运维/用restic备份家庭服务器.md
RESTIC_CLAUSES = ("移动硬盘按 UUID 挂载", "避免设备名变化", "nofail 保证没插盘也能正常开机", "并且在密码管理器里另存一份",
                  "仓库密码丢了", "备份就等于没有", "硬盘没插就直接退出", "别把备份写到系统盘上", "确认备份真的能恢复",
                  "以后考虑再加一份异地备份")


def distinct_sentences(clauses: tuple[str, ...], count: int, per: int = 3) -> list[str]:
    """``count`` sentences of ``per`` of the ``clauses`` each, citing [1], no two alike: a long
    reply every sentence of which stands on the note (a sentence said twice is shown once)."""
    from itertools import islice, permutations

    return [f"{'，'.join(c)}[1]。" for c in islice(permutations(clauses, per), count)]


def long_reply(paragraphs: int, label: str = "", repeat: int = 30) -> str:
    """A long LLM reply on the sample 番茄炒蛋 note, every sentence of it in the note and none
    twice: for the tests of how a door splits a long answer (a reply no note holds would not be
    shown). Its paragraphs begin "{label}第零段：", "第一段：" … "第二十九段：" (a label with Latin
    words or digits would be a name or a number no note holds, and left out)."""
    assert paragraphs <= 30
    sentences = distinct_sentences(TOMATO_CLAUSES, paragraphs * repeat, per=4)
    return "\n\n".join(f"{label}第{_chinese(i)}段：" + "".join(sentences[i * repeat:(i + 1) * repeat])
                       for i in range(paragraphs))


def _chinese(n: int) -> str:
    digits = "零一二三四五六七八九"
    if n < 10:
        return digits[n]
    return ("" if n < 20 else digits[n // 10]) + "十" + (digits[n % 10] if n % 10 else "")


def run_over_tcp(settings, scenario, page: bool = False) -> None:
    """A daemon with no chat door, its first pass done, and ``scenario(daemon, http)`` run with an
    HTTP client to its TCP listener (``api.listen``); ``page``: the client sends the listener's own
    ``Origin``, as the web chat's page does."""
    from bot.serve import Daemon

    async def main():
        daemon = Daemon(settings, services=[])
        task = asyncio.create_task(daemon.run())
        url = f"http://{settings.api.listen}"
        http = httpx.AsyncClient(base_url=url, timeout=60, limits=ONE_SHOT, headers={"Origin": url} if page else None)
        try:
            await within(daemon.wait_for_pass(0), "the daemon's first pass")
            await within(scenario(daemon, http), "the scenario", SCENARIO)
        finally:
            await http.aclose()
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())
