"""Many people at once through the Telegram bot (fake Bot API, fake LLM).

    .venv/bin/python bench/bots.py
    .venv/bin/python bench/bots.py --tiny     # seconds: 4 questions from 2 people (a smoke run)

The real daemon (``leanote-rag serve``'s ``Daemon`` with the real python-telegram-bot
Application) runs in its own process over the sample notes; this process plays
Telegram (a fake Bot API) and Ollama (a fake that streams each answer in 12 pieces
over ~2.4 s), so the fakes' threads do not compete with the daemon for its GIL.
20 questions from 5 people arrive at once. Measured: whether all are answered, the
daemon's event-loop lag (a 10 ms ticker's delays, inside the daemon) while they are,
and each answer's edits against the pacing limit (telegram.edit_interval).
``--tiny``: 2 questions each from 2 people, answers streamed 4 times as fast and edits
paced at 0.4 s. Prints JSON and writes bench/bots_results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))

from conftest import make_settings  # noqa: E402
from fakes.ollama import FakeOllama  # noqa: E402
from fakes.telegram import FakeTelegram, html_error  # noqa: E402

from bot.telegram import service  # noqa: E402
from bot.serve import Daemon  # noqa: E402

PEOPLE = [501, 502, 503, 504, 505]
QUESTIONS = ["番茄炒蛋怎么做才不酸？", "红烧肉要炖多久？", "家里路由器的 DHCP 范围是多少？", "restic 备份保留几个快照？"]


INTERVAL = 1.5


def child(settings_json: str, lag_file: str) -> None:
    """The daemon, with a lag ticker beside the bots."""
    from rag.config import Settings

    settings = Settings.model_validate_json(settings_json)
    lags: list[float] = []

    async def ticker(host) -> None:
        while not host.stopping.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append((time.perf_counter() - t - 0.01) * 1000)

    async def first_pass(host) -> None:  # says when the first sync pass is done (a tiny run waits for it)
        await host.wait_for_pass(0)
        Path(lag_file).with_suffix(".ready").touch()

    async def run() -> None:
        daemon = Daemon(settings, services=[service, ticker, first_pass])
        loop = asyncio.get_running_loop()
        loop.add_reader(sys.stdin.fileno(), daemon.stop)  # the parent closes our stdin to stop us
        await daemon.run()

    asyncio.run(run())
    Path(lag_file).write_text(json.dumps(lags))


async def main(tiny: bool) -> dict:
    import subprocess

    people, questions = (PEOPLE[:2], QUESTIONS[:2]) if tiny else (PEOPLE, QUESTIONS)
    delay, interval = (0.05, 0.4) if tiny else (0.2, INTERVAL)  # between an answer's 12 pieces; edits' pacing
    work = Path(tempfile.mkdtemp())
    with FakeTelegram() as tg, FakeOllama() as ollama:
        settings = make_settings(
            work,
            telegram={"enabled": True, "token_env": "BENCH_TG", "base_url": tg.base_url, "edit_interval": interval},
            users=[{"leanote_user_id": "local", "telegram_ids": people}],
            ollama={"host": ollama.url}, rerank={"kind": "none"}, sync={"interval": "1h"},
            bots={"rate_limit": 10, "max_concurrent_llm": 4},
        )
        lag_file = work / "lags.json"
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", settings.model_dump_json(), str(lag_file)],
            stdin=subprocess.PIPE, env={**os.environ, "BENCH_TG": "123:TEST"},
        )
        while not tg.method_calls("getUpdates"):
            await asyncio.sleep(0.05)
        if tiny:  # the first sync pass, done when the daemon says so
            while not lag_file.with_suffix(".ready").exists():
                await asyncio.sleep(0.05)
        else:
            await asyncio.sleep(2.0)  # the first sync pass (lags from it are left out below)
        for _ in range(len(people) * len(questions)):
            ollama.reply(*[f"第{i}句。" for i in range(11)], "[1]", delay=delay)
        started = time.perf_counter()
        n = 0
        for person in people:
            for q in questions:
                tg.say(person, q)
                n += 1
        answered = lambda: sum(1 for p in people for m in tg.sent_to(p) if "来源" in m["text"])  # noqa: E731
        while answered() < n and time.perf_counter() - started < 120:
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
        proc.stdin.close()
        proc.wait(timeout=60)
        lags = json.loads(lag_file.read_text())
        shutil.rmtree(work)
        ticks_during = int(elapsed / 0.0101)
        lags = sorted(lags[-ticks_during - 50:])  # the questions' part of the run
        finals = [m for p in people for m in tg.sent_to(p) if "来源" in m["text"]]
        gaps, edits_per_answer = [], []
        for m in finals:
            streaming = [t for t, _ in m["edits"]][:-1]  # the last edit is the final answer
            edits_per_answer.append(len(streaming))
            gaps += [b - a for a, b in zip(streaming, streaming[1:])]
        return {
            "questions": n,
            "answered": len(finals),
            "valid_html": all(html_error(m["text"]) is None for m in finals),
            "seconds_for_all": round(elapsed, 1),
            "event_loop_lag_ms": {"p50": round(lags[len(lags) // 2], 1), "p99": round(lags[int(len(lags) * 0.99)], 1),
                                  "max": round(lags[-1], 1)},
            "streaming_edits_per_answer": {"min": min(edits_per_answer), "max": max(edits_per_answer)},
            "min_gap_between_edits_s": round(min(gaps), 2) if gaps else None,
            "edit_interval_s": interval,
        }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":  # the daemon's process, started by main()
        child(sys.argv[2], sys.argv[3])
        sys.exit(0)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a smoke run: 4 questions from 2 people, faster answers")
    tiny = ap.parse_args().tiny
    results = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(), **asyncio.run(main(tiny))}
    results_file("bots_results.json", tiny).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(results, indent=2, ensure_ascii=False))
