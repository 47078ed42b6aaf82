"""``leanote-rag serve``: the scheduler, the manual trigger, backoff, supervised
services, answering while Leanote is down, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from rag.index.retrieve import search
from rag.index.store_edge import EdgeStore
from bot.serve import Daemon
from bot.serve import services

from conftest import SCENARIO, THREADS, make_settings, until, within
from fakes.leanote import FakeLeanote

ALICE = "5dbed2987db161bc2a85b919"
BOOK = "5e16ca22f6ffdbad5b4ba501"


@pytest.fixture
def leanote(monkeypatch):
    monkeypatch.setenv("LR_PW_ALICE", "alice-pw")
    with FakeLeanote() as fake:
        fake.add_user(ALICE, "alice@example.com", "alice-pw")
        fake.put_notebook({"NotebookId": BOOK, "UserId": ALICE, "Title": "工作"})
        fake.put_note({"NoteId": "6" + "0" * 22 + "1", "UserId": ALICE, "NotebookId": BOOK, "Title": "第一条",
                       "Content": "守护进程第一次同步 FIRST-SYNC-1"})
        yield fake


def settings_for(tmp_path, leanote, **sync):
    return make_settings(
        tmp_path,
        leanote={"base_url": leanote.url},
        source={"kind": "leanote_api", "path": None,
                "accounts": [{"email": "alice@example.com", "password_env": "LR_PW_ALICE"}]},
        sync={"interval": "1h", "backoff_min": "30s", "http_timeout": 2, "trigger_debounce": "10s", **sync},
    )


async def started(daemon: Daemon) -> asyncio.Task:
    task = asyncio.create_task(daemon.run())
    await asyncio.wait_for(daemon.wait_for_pass(0), timeout=60)  # the first pass runs at start
    return task


def test_schedule_trigger_and_stop(leanote, tmp_path):
    settings = settings_for(tmp_path, leanote)

    async def scenario():
        daemon = Daemon(settings, services())
        task = await started(daemon)
        sync_job = daemon.schedule.scheduler.get_job("sync")
        assert sync_job.trigger.interval.total_seconds() == 3600
        assert sync_job.max_instances == 1 and sync_job.coalesce is True
        reconcile = daemon.schedule.scheduler.get_job("reconcile")
        assert str(reconcile.trigger.fields[5]) == "3" and str(reconcile.trigger.fields[6]) == "30"  # hour, minute
        assert search(daemon.index, "FIRST-SYNC-1", ALICE)[0].title == "第一条"

        leanote.put_note({"NoteId": "6" + "0" * 22 + "2", "UserId": ALICE, "NotebookId": BOOK, "Title": "第二条",
                          "Content": "手动触发的同步 TRIGGERED-2"})
        passes = daemon.passes
        assert daemon.schedule.trigger() is True
        assert daemon.schedule.trigger() is False  # debounced
        await asyncio.wait_for(daemon.wait_for_pass(passes), timeout=60)
        assert search(daemon.index, "TRIGGERED-2", ALICE)[0].title == "第二条"
        daemon.stop()
        await asyncio.wait_for(task, timeout=30)

    asyncio.run(within(scenario(), "the scenario", SCENARIO))
    # stopped cleanly: the index lock is free and the state has the run
    EdgeStore(settings.state_dir / "qdrant", 512).close()
    runs = sqlite3.connect(settings.state_dir / "state.db").execute("SELECT COUNT(*) FROM runs WHERE error IS NULL")
    assert runs.fetchone()[0] >= 2


def test_questions_are_answered_while_leanote_is_down_and_retries_come_sooner(leanote, tmp_path):
    settings = settings_for(tmp_path, leanote)

    async def scenario():
        daemon = Daemon(settings, services())
        task = await started(daemon)
        leanote.put_note({"NoteId": "6" + "0" * 22 + "3", "UserId": ALICE, "NotebookId": BOOK, "Title": "x", "Content": "y"})
        leanote.fail("user/getSyncState", times=1000)
        passes = daemon.passes
        daemon.schedule.trigger()
        result = await asyncio.wait_for(daemon.wait_for_pass(passes), timeout=60)
        assert "alice@example.com" in result.failures
        # the index still answers
        assert search(daemon.index, "FIRST-SYNC-1", ALICE)[0].title == "第一条"
        # the failing account is retried on its backoff (24..36 s), not after the 1 h interval
        wait = (daemon.schedule.scheduler.get_job("sync").next_run_time - datetime.now().astimezone()).total_seconds()
        assert 20 < wait < 40
        daemon.stop()
        await asyncio.wait_for(task, timeout=30)

    asyncio.run(within(scenario(), "the scenario", SCENARIO))


def test_a_failing_service_is_restarted_without_stopping_sync(leanote, tmp_path):
    settings = settings_for(tmp_path, leanote, backoff_min="0.05s", backoff_max="0.2s")
    runs = []

    async def flaky(daemon):
        runs.append(time.monotonic())
        if len(runs) < 3:
            raise ConnectionError("bad token or network down")
        await daemon.stopping.wait()

    async def scenario():
        daemon = Daemon(settings, services=[flaky])
        task = await started(daemon)
        await until(lambda: len(runs) >= 3, what="the service to be started a third time")
        assert len(runs) == 3
        assert search(daemon.index, "FIRST-SYNC-1", ALICE)[0].title == "第一条"
        daemon.stop()
        await asyncio.wait_for(task, timeout=30)

    asyncio.run(within(scenario(), "the scenario", SCENARIO))


@pytest.mark.slow
def test_serve_stops_cleanly_on_sigterm(leanote, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        f"leanote: {{base_url: '{leanote.url}'}}\nstate_dir: data\n"
        f"source:\n  kind: leanote_api\n  accounts:\n    - {{email: alice@example.com, password_env: LR_PW_ALICE}}\n"
        f"sync: {{interval: 1h}}\nembedder: {{threads: {THREADS}}}\n"
    )
    exe = str(Path(sys.executable).with_name("leanote-rag"))
    env = {**os.environ, "LR_PW_ALICE": "alice-pw"}
    proc = subprocess.Popen([exe, "--config", str(config), "serve"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        db = tmp_path / "data" / "state.db"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if sqlite3.connect(db, timeout=1).execute("SELECT COUNT(*) FROM runs WHERE finished IS NOT NULL").fetchone()[0]:
                    break
            except sqlite3.Error:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("serve did not finish a sync")
        # while serve runs, the CLI goes through it
        out = subprocess.run([exe, "--config", str(config), "search", "FIRST-SYNC-1"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and "第一条" in out.stdout, out.stderr
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "stopped" in err and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
    out = subprocess.run([exe, "--config", str(config), "search", "FIRST-SYNC-1", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "第一条" in out.stdout


def test_a_pass_outrunning_the_interval_is_said_once_not_warned_every_interval(leanote, tmp_path, caplog):
    """Also after another daemon came and went in this process (as `serve` after a test's, or
    the tests' daemons one after another): its filter on APScheduler's logger, one per process,
    once said the next daemon's long pass with its own interval (1 h) and held the rest back."""
    caplog.set_level("INFO")

    async def before():
        daemon = Daemon(settings_for(tmp_path / "before", leanote), services())
        task = await started(daemon)
        daemon.stop()
        await asyncio.wait_for(task, timeout=30)

    asyncio.run(within(before(), "the daemon before"))
    settings = settings_for(tmp_path, leanote, interval="0.2s", http_timeout=60)

    async def scenario():
        daemon = Daemon(settings, services())
        task = await started(daemon)
        caplog.clear()
        held = leanote.hold("user/getSyncState")  # the next pass waits for Leanote
        passes = daemon.passes
        daemon.schedule.trigger(debounce=False)
        await until(lambda: any("taking longer than sync.interval" in r.getMessage() for r in caplog.records),
                    what="the long pass to be said", timeout=60)
        await asyncio.sleep(1.0)  # five more intervals the pass outruns
        held.set()
        await asyncio.wait_for(daemon.wait_for_pass(passes), timeout=60)
        daemon.stop()
        await asyncio.wait_for(task, timeout=30)

    asyncio.run(within(scenario(), "the scenario", SCENARIO))
    said = [r for r in caplog.records if "taking longer than sync.interval" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "INFO"
    assert "(0.2 s)" in said[0].getMessage()  # this daemon's interval
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("apscheduler")]
