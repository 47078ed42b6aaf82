"""The second dense index's fill in the daemon (``sync.second_jobs``), through the composition
root: it loads its model only when it runs, fills between questions (never while a search or an
answer is under way), only in its window, shows how far it is and the time left, and with
``auto`` leaves a machine too slow to fill it in a night on the first index; ``doctor`` says so.
The second embedder is the tiny EmbeddingGemma stand-in (``gemma_world``)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import pytest

from bot.cli import main
from bot.root import Parts
from bot.usecases.status import second_index, second_line
from rag.index.retrieve import search
from sync.second_jobs import RATE_FILE, SecondFill

from conftest import THREADS, make_settings, run_pass
from gemma_world import tiny_gemma

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torch")]


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    pytest.importorskip("sentence_transformers", reason="needs the [gemma] extra")
    return tiny_gemma(tmp_path_factory.mktemp("gemma") / "embeddinggemma-300m")


def settings_with(tmp_path, gemma_folder, **second):
    return make_settings(tmp_path, second_index={"enabled": "on", "batch": 8, "embedder": {
        "kind": "gemma", "model": str(gemma_folder), "threads": THREADS}, **second})


async def filled(fill: SecondFill, most: int = 200) -> int:
    steps = 0
    while await fill.step():
        steps += 1
        assert steps < most
    return steps


def test_it_fills_between_questions_and_the_search_uses_it(tmp_path, gemma_folder, use_embedder):
    async def go():
        settings = settings_with(tmp_path, gemma_folder)
        run_pass(settings, use_embedder)
        with Parts(settings) as parts:
            assert not parts.built("second")  # nothing loaded before the worker runs
            fill = parts.second_fill
            parts.answers.searching = 1  # a question is being searched: the fill waits
            assert await fill.step() is False and not parts.built("second")
            parts.answers.searching = 0
            fill._busy_until = 0.0  # (its quiet time after a question, passed)
            assert await filled(fill) > 1
            state = fill.state()
            chunks = sum(parts.index.store.count_by_user().values())
            assert state["chunks"] == chunks and state["current"] == chunks and state["left"] == 0
            assert state["notes_covered"] == len(parts.index.store.note_ids("local"))
            assert parts.index.second is parts._parts["second"]
            assert search(parts.index, "付款失败后第一次重试要等多久", "local", 3)
            assert "second index (on): gemma:local/embeddinggemma-300m/768d/256t" in second_line(state)
            assert f"{chunks} of {chunks} chunks embedded" in second_line(state)

    asyncio.run(go())


def test_the_status_shows_the_time_left_while_it_fills(tmp_path, gemma_folder, use_embedder):
    async def go():
        settings = settings_with(tmp_path, gemma_folder)  # a cache of its own: the run's holds these chunks
        embedder = settings.second_index.embedder.model_copy(update={"cache": tmp_path / "own-vectors.db"})
        settings = settings.model_copy(update={"second_index": settings.second_index.model_copy(
            update={"embedder": embedder})})
        run_pass(settings, use_embedder)
        with Parts(settings) as parts:
            fill = parts.second_fill
            assert await fill.step()
            state = fill.state()
            assert state["current"] == 8 and state["left"] == state["chunks"] - 8 and state["rate"] > 0
            assert state["seconds_left"] == round(state["left"] / state["rate"])
            assert "chunks/s" in second_line(state) and "left at" in second_line(state)

    asyncio.run(go())


def test_outside_its_window_it_waits(tmp_path, gemma_folder, use_embedder):
    async def go():
        settings = settings_with(tmp_path, gemma_folder, window="01:00-02:00")
        run_pass(settings, use_embedder)
        noon = time.mktime(time.strptime("2026-12-06 12:00", "%Y-%m-%d %H:%M"))
        with Parts(settings) as parts:
            fill = SecondFill(settings, parts._open_second, lambda: parts.index.store, parts.answers, clock=lambda: noon)
            assert await fill.step() is False and not parts.built("second")
            assert fill.state()["text"] == "filled only 01:00-02:00 (second_index.window)"
            fill.clock = lambda: noon - 11 * 3600  # 01:00
            assert await fill.step() is True

    asyncio.run(go())


def test_auto_leaves_a_machine_too_slow_for_a_night_on_the_first_index(tmp_path, gemma_folder, use_embedder):
    async def go():
        settings = settings_with(tmp_path, gemma_folder, enabled="auto")
        run_pass(settings, use_embedder)
        with Parts(settings) as parts:
            model_id = parts.load_second_embedder().model_id
        (settings.state_dir / RATE_FILE).write_text(json.dumps({"rate": 0.0001, "chunks": 20, "embedder": model_id,
                                                                "backend": "onnx", "at": time.time()}))
        with Parts(settings) as parts:
            fill = parts.second_fill
            assert await fill.step() is False
            assert "longer than a night (8.0 h): not filled (second_index.enabled: auto" in fill.state()["text"]
            assert fill.state()["current"] == 0
            assert await fill.step() is False  # and it stays so
        assert "longer than a night" in second_index(settings)["text"]  # the status without the daemon too

    asyncio.run(go())


def test_auto_never_loads_the_model_where_the_services_memory_limit_cannot_hold_it(tmp_path, gemma_folder,
                                                                                  use_embedder):
    """Under systemd's MemoryMax=2G the daemon would be killed loading EmbeddingGemma (and again at
    each restart): auto leaves it unloaded and says why; a limit that holds the model does once its
    ONNX export (5.7 GB at its peak) is made outside the service."""
    model = tmp_path / "models" / "embeddinggemma-300m"
    shutil.copytree(gemma_folder, model)  # no export beside this copy yet

    async def go():
        settings = settings_with(tmp_path, model, enabled="auto")
        run_pass(settings, use_embedder)
        with Parts(settings) as parts:
            fill = SecondFill(settings, parts._open_second, lambda: parts.index.store, parts.answers,
                              limit=lambda: 5 << 30)
            assert await fill.step() is False and not parts.built("second")
            assert ("5.0 GB (its memory limit), less than the 7 GB the second embedder needs beside the rest while "
                    "its ONNX export is made: make its ONNX export once outside the service") in fill.state()["text"]
        cfg = tmp_path / "config.yaml"  # doctor, run from a shell (outside the service), makes the export
        cfg.write_text(f"source: {{kind: files, path: {settings.source.path}}}\nstate_dir: {settings.state_dir}\n"
                       f"embedder: {{threads: {THREADS}}}\nrerank: {{kind: none}}\nollama: {{enabled: false}}\n"
                       f"second_index: {{enabled: auto, embedder: {{kind: gemma, model: {model}, threads: 1}}}}\n")
        main(["--config", str(cfg), "doctor"])
        assert (tmp_path / "models" / "embeddinggemma-300m-onnx").is_dir()
        with Parts(settings) as parts:
            fill = SecondFill(settings, parts._open_second, lambda: parts.index.store, parts.answers,
                              limit=lambda: 2 << 30)  # systemd's MemoryMax=2G, the unit's default
            assert await fill.step() is False and not parts.built("second")
            assert "2.0 GB (its memory limit), less than the 4 GB" in fill.state()["text"]
            assert "raise MemoryMax" in fill.state()["text"]
            fill = SecondFill(settings, parts._open_second, lambda: parts.index.store, parts.answers,
                              limit=lambda: 5 << 30)
            assert await fill.step() is True and parts.built("second")
            on = settings.model_copy(update={"second_index": settings.second_index.model_copy(update={"enabled": "on"})})
            fill = SecondFill(on, parts._open_second, lambda: parts.index.store, parts.answers, limit=lambda: 1 << 30)
            assert fill.why == "" and await fill.step() is True  # on: the operator's choice, whatever the limit

    asyncio.run(go())


def test_a_rate_measured_with_another_backend_does_not_keep_it_off(tmp_path, gemma_folder, use_embedder):
    """A slow rate kept by torch (or by a version that did not say its backend) is not onnx's: the
    fill goes on and measures its own."""
    async def go():
        settings = settings_with(tmp_path, gemma_folder, enabled="auto")
        run_pass(settings, use_embedder)
        with Parts(settings) as parts:
            model_id = parts.load_second_embedder().model_id
        for kept in ({"backend": "torch"}, {}):
            (settings.state_dir / RATE_FILE).write_text(json.dumps({"rate": 0.0001, "chunks": 20, "embedder": model_id,
                                                                    "at": time.time(), **kept}))
            with Parts(settings) as parts:
                fill = parts.second_fill
                assert await fill.step() is True
                assert "longer than a night" not in fill.state()["text"]

    asyncio.run(go())


def test_doctor_measures_the_speed_and_says_whether_a_night_is_enough(tmp_path, gemma_folder, use_embedder, capsys):
    cfg = tmp_path / "config.yaml"
    settings = settings_with(tmp_path, gemma_folder, enabled="auto")
    run_pass(settings, use_embedder)
    cfg.write_text(f"source: {{kind: files, path: {settings.source.path}}}\nstate_dir: {settings.state_dir}\n"
                   f"embedder: {{threads: {THREADS}}}\nrerank: {{kind: none}}\nollama: {{enabled: false}}\n"
                   f"second_index: {{enabled: auto, embedder: {{kind: gemma, model: {gemma_folder}, threads: 1}}}}\n")
    main(["--config", str(cfg), "doctor"])
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if "second index (auto)" in l)
    assert line.startswith("ok") and "chunks/s here (measured now on 8 chunks)" in line and "a night: 8.0 h" in line
    saved = json.loads((settings.state_dir / RATE_FILE).read_text())
    saved["rate"] = 0.0001
    (settings.state_dir / RATE_FILE).write_text(json.dumps(saved))
    main(["--config", str(cfg), "doctor"])
    line = next(l for l in capsys.readouterr().out.splitlines() if "second index (auto)" in l)
    assert "WARN" in line and "longer than a night" in line and "so it stays off" in line


def test_index_fills_it_where_no_service_runs_for_as_long_as_it_is_given(tmp_path, gemma_folder, capsys):
    """A timer's `leanote-rag index --second 5h`: after the pass, the second index filled until it
    is whole or the time is up; what was written stays for the next run."""
    cfg = tmp_path / "config.yaml"
    head = (f"source: {{kind: files, path: {tmp_path / 'notes'}}}\nstate_dir: {tmp_path / 'data'}\n"
            f"embedder: {{threads: {THREADS}}}\n")
    import shutil

    from conftest import EXAMPLES

    shutil.copytree(EXAMPLES, tmp_path / "notes")
    cfg.write_text(head + "second_index: {enabled: off}\n")
    assert main(["--config", str(cfg), "index", "--second", "1h"]) == 2
    assert "second_index.enabled is off" in capsys.readouterr().err
    cfg.write_text(head + f"second_index: {{enabled: on, embedder: {{kind: gemma, model: {gemma_folder}, threads: 1}}}}\n")
    assert main(["--config", str(cfg), "index", "--second", "1h"]) == 0
    last = capsys.readouterr().err.splitlines()[-1]
    chunks = int(last.split(" of ")[1].split()[0])
    assert f"; {chunks} of {chunks} chunks embedded" in last and "left" not in last
    assert main(["--config", str(cfg), "index", "--second", "soon"]) == 2
    assert "is not a duration" in capsys.readouterr().err


def test_a_fill_here_stops_when_its_time_is_up_and_the_next_goes_on(tmp_path, gemma_folder, use_embedder):
    from bot.usecases.people import Person
    from bot.usecases.syncing import fill_second

    settings = settings_with(tmp_path, gemma_folder)
    run_pass(settings, use_embedder)
    ticks = iter(range(1000))  # a clock that moves one second each time it is read
    admin = Person("cli", "", admin=True)
    with Parts(settings, one_shot=True) as parts:
        seen = []
        left = asyncio.run(fill_second(parts, admin, 3.0, seen.append, clock=lambda: next(ticks)))
        # read at 0 (until 3), 1 (a batch starts), 2 (after its first chunk: go on), 3 (time is up)
        assert left["current"] == 2 and left["left"] == left["chunks"] - 2 and seen[0]["current"] == 0
    with Parts(settings, one_shot=True) as parts:
        left = asyncio.run(fill_second(parts, admin, 3600.0))
        assert left["current"] == left["chunks"] and left["left"] == 0
        with pytest.raises(Exception, match="only an admin"):
            asyncio.run(fill_second(parts, Person("telegram:1", "local"), 60.0))


def test_the_service_fills_it_and_a_synced_note_is_added_to_it(tmp_path, gemma_folder, monkeypatch):
    """``serve``: the first pass answers at once; the worker then fills the second index, and a
    note the next pass brings is compared again and embedded."""
    from bot.serve import Daemon, services
    from conftest import SCENARIO, until, within
    from fakes.leanote import FakeLeanote

    alice, book = "5dbed2987db161bc2a85b919", "5e16ca22f6ffdbad5b4ba501"
    monkeypatch.setenv("LR_PW_ALICE", "alice-pw")
    with FakeLeanote() as leanote:
        leanote.add_user(alice, "alice@example.com", "alice-pw")
        leanote.put_notebook({"NotebookId": book, "UserId": alice, "Title": "工作"})
        leanote.put_note({"NoteId": "6" + "0" * 22 + "1", "UserId": alice, "NotebookId": book, "Title": "第一条",
                          "Content": "守护进程第一次同步 FIRST-SYNC-1"})
        settings = settings_with(tmp_path, gemma_folder).model_copy(update={
            "leanote": make_settings(tmp_path, leanote={"base_url": leanote.url}).leanote,
            "source": make_settings(tmp_path, source={
                "kind": "leanote_api", "path": None,
                "accounts": [{"email": "alice@example.com", "password_env": "LR_PW_ALICE"}]}).source,
            "sync": make_settings(tmp_path, sync={"interval": "1h", "http_timeout": 2}).sync})

        async def scenario():
            daemon = Daemon(settings, services())
            task = asyncio.create_task(daemon.run())
            await asyncio.wait_for(daemon.wait_for_pass(0), timeout=60)
            assert search(daemon.index, "FIRST-SYNC-1", alice)[0].title == "第一条"  # before any fill
            fill = daemon.parts.second_fill
            await until(lambda: fill.state().get("left") == 0 and fill.state().get("chunks") == 1, 60,
                        "the second index filled")
            leanote.put_note({"NoteId": "6" + "0" * 22 + "2", "UserId": alice, "NotebookId": book, "Title": "第二条",
                              "Content": "手动触发的同步 TRIGGERED-2"})
            passes = daemon.passes
            assert daemon.schedule.trigger() is True
            await asyncio.wait_for(daemon.wait_for_pass(passes), timeout=60)
            await until(lambda: fill.state().get("chunks") == 2 and fill.state().get("left") == 0, 60,
                        "the new note's chunk embedded")
            assert daemon.index.second.covered(alice) == {"6" + "0" * 22 + "1", "6" + "0" * 22 + "2"}
            daemon.stop()
            await asyncio.wait_for(task, timeout=30)

        asyncio.run(within(scenario(), "the scenario", SCENARIO))
