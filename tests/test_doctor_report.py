"""`doctor`'s report as a person reads it: one line per check, nothing from the libraries in
between (what they say while a part is checked becomes a line of the report, or goes when it
is about something this program never uses), and the LLM's speed said as what answers do here."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from bot.cli import main

from conftest import EXAMPLES, REPO, THREADS
from fakes.discord import FakeDiscord

LINE_STARTS = ("ok   ", "WARN ", "FAIL ", "     fix: ")


def config(tmp_path, text: str = ""):
    path = tmp_path / "doctor.yaml"
    path.write_text(f"source: {{kind: files, path: '{EXAMPLES}'}}\nstate_dir: '{tmp_path / 'data'}'\n"
                    f"rerank: {{kind: none}}\nembedder: {{threads: {THREADS}}}\nmedia: {{speech: off, ocr: off}}\n"
                    f"{text}")
    return path


def test_doctor_with_discord_prints_its_checks_and_no_library_warnings(tmp_path):
    """discord.py said, in the middle of the report, that PyNaCl and davey are not installed
    ("voice will NOT be supported": voice channels, which this bot never joins; its voice
    clips are heard here) and that the guilds intent seemed disabled (doctor's own login asked
    for no intents). None of it was doctor's; the report now holds only its checks."""
    with FakeDiscord(token="doctor-token") as fake:
        cfg = config(tmp_path, f"ollama: {{enabled: false}}\ndiscord: {{enabled: true, token_env: LR_DOC_DISCORD, "
                               f"api_base: '{fake.api_base}'}}\nusers: [{{leanote_user_id: local, discord_ids: [5]}}]\n")
        env = {**os.environ, "LR_DOC_DISCORD": "doctor-token", "PYTHONPATH": str(REPO)}
        env.pop("JOURNAL_STREAM", None)
        done = subprocess.run([sys.executable, "-m", "bot.cli", "--config", str(cfg), "doctor"], capture_output=True,
                              text=True, timeout=180, env=env)
    assert "ok   discord bot: logged in as notes-bot" in done.stdout, done.stdout + done.stderr
    assert done.stderr == "", done.stderr
    assert all(line.startswith(LINE_STARTS) for line in done.stdout.splitlines()), done.stdout
    assert not any(word in done.stdout for word in ("PyNaCl", "davey", "intent")), done.stdout


def test_what_a_library_logs_while_a_part_is_checked_is_a_line_of_the_report(tmp_path, capsys, caplog,
                                                                           monkeypatch):
    """A warning logged while a part is checked is held and said after that part's lines, as
    doctor's own WARN line; it is not logged into the middle of the report."""
    from bot.cli import doctor

    def chatty(settings):
        logging.getLogger("somelib.client").warning("the frobnicator is not installed")
        yield "chatty part", True, "answers", ""

    monkeypatch.setattr(doctor, "checks", lambda: [chatty])
    cfg = config(tmp_path, "ollama: {enabled: false}\n")
    with caplog.at_level(logging.WARNING):
        code = main(["--config", str(cfg), "doctor"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert lines[-2] == "ok   chatty part: answers", out
    assert lines[-1] == "WARN chatty part: somelib.client said while it was checked: the frobnicator is not installed"
    assert not [r for r in caplog.records if "frobnicator" in r.getMessage()]


def test_status_and_doctor_say_what_answers_do_at_the_speed_measured_here(tmp_path, capsys):
    """At 13 tok/s (a probe on a loaded box) doctor said "~400 s to a first token for a prompt of
    ~5,200 tokens": the largest prompt the settings allow, which no answer sends here, since the
    evidence is cut to the speed. Both now say what the answer sizing gives an answer here: the
    characters of evidence it reads and when it starts writing; at 13 tok/s that is the least
    evidence an answer reads, later than the budget, and at 60 tok/s evidence cut to the budget."""
    import re

    from fakes.ollama import FakeOllama
    from rag.speed import FILE, Speed, SpeedBook

    model = "qwen2.5-coder:1.5b-instruct"
    (tmp_path / "data").mkdir(mode=0o700)
    said = re.compile(r"answers here read ~([\d,]+) characters of evidence \((?:of 8,000: (?:cut to start within "
                      r"|the least an answer reads, which takes longer than )answer\.first_token_budget, 30 s(?:, here)?"
                      r"|all the answer settings allow)\) and start writing ~(\d+) s after the search")
    with FakeOllama(models=(model,)) as ollama:
        cfg = config(tmp_path, f"ollama: {{host: '{ollama.url}', model: '{model}'}}\n")
        for tps in (13.0, 60.0):
            book = SpeedBook(tmp_path / "data" / FILE)
            book._speeds[model] = Speed(read_tps=tps, write_tps=5.0, probe_tps=tps, samples=4, updated=1.0)
            book.save()
            book.flush()
            assert main(["--config", str(cfg), "status"]) == 0
            status = next(x for x in capsys.readouterr().out.splitlines() if model in x)
            main(["--config", str(cfg), "doctor"])
            doctor = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ok   ollama"))
            for line in (status, doctor):
                assert "to a first token for a prompt of" not in line, line
                m = said.search(line)
                assert m, line
                chars, seconds = int(m.group(1).replace(",", "")), int(m.group(2))
                assert chars < 8000, line
                if tps == 13.0:  # even the least evidence takes longer than the budget here: said so
                    assert seconds > 30 and "the least an answer reads, which takes longer" in line, line
                else:  # cut to the budget
                    assert 20 <= seconds <= 30 and "takes longer" not in line, line
        assert ollama.probes() == []  # measured before: read, not measured again
