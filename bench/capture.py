"""Capture benchmark: how soon a captured note is searchable, and how fast the outbox drains.

    .venv/bin/python bench/capture.py [--captures 20] [--queued 100]
    .venv/bin/python bench/capture.py --folder [--captures 20]   # into a folder of notes
    .venv/bin/python bench/capture.py --tiny      # seconds: 2 captures, 10 queued (a smoke run)

1. The daemon (``leanote-rag serve``'s ``Daemon``, no bots) over a local fake Leanote
   (``tests/fakes/leanote.py``, the real write and sync API) through the ``leanote_api``
   source, default embedder, default ``capture.sync_after`` (1 s). Each of ``--captures``
   captures goes through ``Capture.note`` as the bots call it; the clock runs until the
   note is among the hits of ``search`` for its own words: capture-to-searchable, p50/max.
2. Leanote down while ``--queued`` captures arrive (each answered "queued"); then up: the
   time until the outbox is empty, as captures a second.

With ``--folder``: the daemon over a copy of the bundled sample notes (``files`` source), with
its file watcher, the defaults (``capture.sync_after`` 1 s, ``sync.watch_debounce`` 1 s): each
capture is a Markdown file in the folder's ``Inbox/``; the clock runs until the file is there
(written) and until ``search`` finds it (searchable). The machine's load average is recorded.

Prints JSON and writes bench/capture_results.json (``--folder``: capture_folder_results.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))

ME = "5dbed2987db161bc2a85b919"
WORDS = ["路由器", "备份", "端口", "证书", "密码", "数据库", "菜谱", "火车票", "发票", "快递"]


async def searchable(daemon, text: str, note_id: str, timeout: float = 60.0, user: str = ME) -> float:
    from rag.index.retrieve import search

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        hits = await daemon.answers.in_search_thread(search, daemon.index, text, user, 5)
        if any(h.note_id == note_id for h in hits):
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise TimeoutError(f"note {note_id} not searchable after {timeout} s")


async def run(captures: int, queued: int, tmp: Path) -> dict:
    from fakes.leanote import FakeLeanote

    from rag import config
    from bot.serve import Daemon

    os.environ["LR_BENCH_PW"] = "bench-secret"
    with FakeLeanote() as fake:
        fake.add_user(ME, "me@example.com", "bench-secret")
        fake.put_notebook({"NotebookId": "a" * 24, "UserId": ME, "Title": "工作"})
        settings = config.from_dict({
            "leanote": {"base_url": fake.url}, "state_dir": str(tmp / "data"),
            "source": {"kind": "leanote_api", "accounts": [{"email": "me@example.com", "password_env": "LR_BENCH_PW"}]},
            "ollama": {"enabled": False}, "rerank": {"kind": "none"}, "api": {"enabled": False},
            "sync": {"interval": "1h", "watch": False},
            "capture": {"retry_min": "0.5s", "retry_max": "1s", "rate_limit": 1000},
        }, base_dir=tmp)
        daemon = Daemon(settings, services=[])
        task = asyncio.create_task(daemon.run())
        try:
            await daemon.wait_for_pass(0)
            delays, written = [], []
            for i in range(captures):
                text = f"第 {i} 条记录：{WORDS[i % len(WORDS)]} 的事情 {i * 7919} 号"
                started = time.monotonic()
                receipt = await daemon.capture.note("telegram:1", ME, text)
                assert receipt.status == "written", receipt.message
                written.append(time.monotonic() - started)
                await searchable(daemon, text, receipt.note_id)
                delays.append(time.monotonic() - started)

            fake.down()
            for i in range(queued):
                receipt = await daemon.capture.note("telegram:1", ME, f"排队的记录 {i}")
                assert receipt.status == "queued", receipt.message
            fake.up()
            started = time.monotonic()
            while daemon.capture.outbox.counts()["waiting"]:
                await asyncio.sleep(0.02)
            drain = time.monotonic() - started
        finally:
            daemon.stop()
            await asyncio.wait_for(task, 60)
    return {
        "date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
        "capture_to_searchable_s": {"n": captures, "p50": round(statistics.median(delays), 2),
                                    "max": round(max(delays), 2)},
        "capture_written_s": {"p50": round(statistics.median(written), 3), "max": round(max(written), 3)},
        "sync_after_s": settings.capture.sync_after,
        "outbox_drain": {"captures": queued, "seconds": round(drain, 2),
                         "per_second": round(queued / drain, 1) if drain else None,
                         "note": "measured from Leanote coming back; up to capture.retry_min (0.5 s here) "
                                 "passes before the first retry"},
    }


async def run_folder(captures: int, tmp: Path) -> dict:
    """Captures into a folder of notes, found by ``search`` once the watcher's pass (or the one a
    write asks for) has indexed them."""
    import shutil

    from rag import config
    from bot.serve import Daemon
    from sync.sources.files import stable_id
    from sync.watch import watch

    notes = tmp / "notes"
    shutil.copytree(REPO / "examples" / "notes", notes)
    settings = config.from_dict({
        "source": {"kind": "files", "path": str(notes)}, "state_dir": str(tmp / "data"),
        "ollama": {"enabled": False}, "rerank": {"kind": "none"}, "api": {"enabled": False},
        "sync": {"interval": "1h"}, "capture": {"rate_limit": 1000},
    }, base_dir=tmp)
    load = os.getloadavg()
    daemon = Daemon(settings, services=[watch])
    task = asyncio.create_task(daemon.run())
    try:
        await daemon.wait_for_pass(0)
        delays, written = [], []
        for i in range(captures):
            text = f"第 {i} 条记录：{WORDS[i % len(WORDS)]} 的事情 {i * 7919} 号"
            started = time.monotonic()
            receipt = await daemon.capture.note("telegram:1", "local", text)
            assert receipt.status == "written" and (notes / receipt.note_id).is_file(), receipt.message
            written.append(time.monotonic() - started)
            await searchable(daemon, text, stable_id(f"file:{receipt.note_id}"), user="local")
            delays.append(time.monotonic() - started)
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 60)
    return {
        "date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
        "load_average_1_5_15_at_start": [round(x, 2) for x in load],
        "load_average_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()],
        "target": "folder", "notes_in_folder": 14,
        "capture_to_searchable_s": {"n": captures, "p50": round(statistics.median(delays), 2),
                                    "max": round(max(delays), 2)},
        "capture_written_s": {"p50": round(statistics.median(written), 3), "max": round(max(written), 3)},
        "sync_after_s": settings.capture.sync_after, "watch_debounce_s": settings.sync.watch_debounce,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--captures", type=int, help="captures timed until searchable (default 20)")
    ap.add_argument("--queued", type=int, help="captures queued while Leanote is down (default 100)")
    ap.add_argument("--folder", action="store_true", help="capture into a folder of notes (a files source)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run: 2 captures, 10 queued")
    args = ap.parse_args()
    args.captures = args.captures or (2 if args.tiny else 20)
    args.queued = args.queued or (10 if args.tiny else 100)
    with tempfile.TemporaryDirectory() as tmp:
        if args.folder:
            results = asyncio.run(run_folder(args.captures, Path(tmp)))
        else:
            results = asyncio.run(run(args.captures, args.queued, Path(tmp)))
    print(json.dumps(results, ensure_ascii=False, indent=1))
    name = "capture_folder_results.json" if args.folder else "capture_results.json"
    results_file(name, args.tiny).write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
