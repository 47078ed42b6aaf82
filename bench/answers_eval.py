"""The answer eval on the dev set, with the reader stand-in or a real Ollama.

    .venv/bin/python bench/answers_eval.py                        # the reader stand-in, at once
    .venv/bin/python bench/answers_eval.py --speed 60,6           # ... as slow as a small CPU (tokens/s read, write)
    .venv/bin/python bench/answers_eval.py --speed 600,60 --budget 3   # the same proportions, ten times sooner
    .venv/bin/python bench/answers_eval.py --ollama-host http://gpu-box:11434 [--model qwen2.5:7b-instruct]
    .venv/bin/python bench/answers_eval.py --extractive           # no LLM (ollama.enabled: false): cited passages
    ... --ollama-host URL --record bench/replies.jsonl [--questions A008,B015]   # keep what the model read and wrote
    ... --ollama-host URL --file tests/data/dev_en.jsonl          # other questions in the dev set's form (English ones)
    .venv/bin/python bench/answers_eval.py --tiny                 # seconds, on the sample notes (a smoke run)

1. The shared corpus through the mongodump source, as ``bench/corpus.yaml`` has it, in
   ``bench/data/`` (the same index: a sync that finds the backup already read does nothing).
2. Without ``--ollama-host``: the reader stand-in (``tests/fakes/ollama.py``,
   ``FakeOllama(reader=True)``): an HTTP server speaking Ollama's API whose "model"
   quotes the evidence block sharing the most words with the question, with its ``[n]``,
   or says the refusal phrase when no block shares one. It measures the pipeline around
   the LLM (retrieval, refusals, citations, prompt sizes), not an LLM's judgement.
   Its learned speed is forgotten at each start, so runs with different ``--speed`` do
   not inherit each other's.
3. ``leanote-rag --config ... eval --answers ../shared/eval/dev.jsonl --json``: the command a
   user runs, through the same door as ``ask``.

Writes the report into ``bench/answers_eval_results.json`` (one entry per setup: the
stand-in, the stand-in at a given speed, each real model) and prints a summary.

``--tiny``: the same steps on the sample notes and their questions (``bench/common.py``'s
``tiny_world``), indexed into a temporary folder instead of ``bench/data``, with the stand-in
(or ``--extractive``), never a real Ollama; the report goes apart from the recorded one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BACKUP_NAME, REPO, results_file, shared, tiny_world  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
DATA = REPO / "bench" / "data"  # the index of a real run (a tiny one's is in a temporary folder)
STAND_IN = "stand-in-reader"  # the model name the stand-in answers to


def backup() -> Path:
    """The corpus as a Leanote backup, in the shared folder as it is now (``--tiny`` moves it)."""
    return shared() / "corpus" / "mongodump" / BACKUP_NAME


def dev_set() -> Path:
    """The dev set's questions, in the shared folder as it is now (``--tiny`` moves it)."""
    return shared() / "eval" / "dev.jsonl"


def leanote_rag(*args: str, capture: bool = False) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("leanote-rag")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "bot.cli"]
    return subprocess.run(cmd + list(args), check=True, text=True, stdout=subprocess.PIPE if capture else None)


def write_config(folder: Path, host: str, model: str, enabled: bool = True, budget: float | None = None,
                 timeout: float | None = None, settings: list[str] = (), data: Path = DATA) -> Path:
    """bench/corpus.yaml (the same source, embedder and index) with the LLM given here
    (and ``answer.first_token_budget`` and ``ollama.timeout``, when given; ``settings``:
    ``section.key=value`` more, the value read as YAML), the index in ``data``."""
    raw = yaml.safe_load((REPO / "bench" / "corpus.yaml").read_text(encoding="utf-8"))
    for item in settings:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        raw.setdefault(section, {})[name] = yaml.safe_load(value)
    raw["source"]["path"] = str(backup())
    raw["state_dir"] = str(data)
    raw["ollama"] = {**(raw.get("ollama") or {}), "host": host, "model": model, "enabled": enabled}
    if timeout is not None:
        raw["ollama"]["timeout"] = timeout
    if budget is not None:
        raw["answer"] = {**(raw.get("answer") or {}), "first_token_budget": budget}
    path = folder / "answers_eval.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


def index_corpus(folder: Path, data: Path) -> Path:
    """The corpus indexed into ``data`` by ``leanote-rag index`` (its memory too), with a config
    written in ``folder`` that names no reachable LLM: that config."""
    config = write_config(folder, "http://127.0.0.1:9", STAND_IN, data=data)
    leanote_rag("--config", str(config), "index")
    return config


def forget_speed(model: str, data: Path) -> None:
    """The stand-in's learned speed, from an earlier run, is dropped (only its entry)."""
    path = data / "llm_speed.json"
    try:
        speeds = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if speeds.pop(model, None) is not None:
        path.write_text(json.dumps(speeds, indent=1))


def run_eval(config: Path, with_changes: bool, questions: Path) -> dict:
    args = ["--config", str(config), "eval", "--answers", str(questions), "--json"]
    if with_changes:
        args.append("--with-changes")
    return json.loads(leanote_rag(*args, capture=True).stdout)


class Recorder:
    """A pass-through HTTP server in front of the real Ollama that keeps every chat it
    relays (the messages the model read, the text it wrote) as JSON lines in ``path``,
    so ``bench/reread.py`` can read the replies again with a changed ``rag.answer.grounding``."""

    def __init__(self, upstream: str, path: Path):
        import http.server
        import threading

        import requests

        self.path, lock = path, threading.Lock()
        path.write_text("", encoding="utf-8")
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _relay(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
                try:
                    up = requests.request(method, upstream + self.path, data=body, stream=True, timeout=(5, 600),
                                          headers={"Content-Type": "application/json"})
                except requests.RequestException as err:
                    self.send_error(502, str(err))
                    return
                self.send_response(up.status_code)
                self.send_header("Content-Type", up.headers.get("Content-Type", "application/json"))
                self.send_header("Connection", "close")
                self.end_headers()
                reply = []
                try:
                    for line in up.iter_lines():
                        self.wfile.write(line + b"\n")
                        self.wfile.flush()
                        try:
                            reply.append(json.loads(line).get("message", {}).get("content") or "")
                        except ValueError:
                            pass
                except (BrokenPipeError, ConnectionResetError):
                    up.close()  # the client hung up (its deadline): the server stops too
                if method == "POST" and self.path == "/api/chat":
                    with lock, recorder.path.open("a", encoding="utf-8") as f:
                        f.write(json.dumps({"messages": json.loads(body).get("messages"), "reply": "".join(reply)},
                                           ensure_ascii=False) + "\n")

            def do_GET(self):
                self._relay("GET")

            def do_POST(self):
                self._relay("POST")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def subset(ids: str, folder: Path) -> Path:
    """The dev set's questions with these ids, as a file (for a shorter run)."""
    wanted = {x.strip() for x in ids.split(",") if x.strip()}
    lines = [line for line in dev_set().read_text(encoding="utf-8").splitlines()
             if line.strip() and json.loads(line)["id"] in wanted]
    missing = wanted - {json.loads(line)["id"] for line in lines}
    if missing:
        raise SystemExit(f"no such dev question: {', '.join(sorted(missing))}")
    path = folder / "questions.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def host_url(host: str) -> str:
    """OLLAMA_HOST's forms (``0.0.0.0``, ``host:port``, a URL) as a URL."""
    host = host.strip()
    if "://" not in host:
        host = "http://" + host
    scheme, rest = host.split("://", 1)
    hostpart = rest.split("/", 1)[0]
    if ":" not in hostpart.rsplit("]", 1)[-1]:
        rest = rest.replace(hostpart, hostpart + ":11434", 1)
    return f"{scheme}://{rest}".replace("://0.0.0.0", "://127.0.0.1")


def main() -> int:
    from rag.config import AnswerConfig, OllamaConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--speed", metavar="READ,WRITE", help="the stand-in's speed in tokens/s (prompt read, answer written)")
    ap.add_argument("--ollama-host", metavar="URL", help="a real Ollama instead of the stand-in")
    ap.add_argument("--model", default=None, help="with --ollama-host: the model (default: the config's)")
    ap.add_argument("--budget", type=float, metavar="SECONDS",
                    help="answer.first_token_budget for this run (default: the config's, 30 s)")
    ap.add_argument("--timeout", type=float, metavar="SECONDS",
                    help="ollama.timeout for this run (default: the config's, 120 s; it must exceed --budget)")
    ap.add_argument("--extractive", action="store_true", help="no LLM: extractive answers (ollama.enabled: false)")
    ap.add_argument("--record", type=Path, metavar="JSONL",
                    help="with --ollama-host: keep every chat the model read and wrote (for bench/reread.py)")
    ap.add_argument("--questions", metavar="ID,ID", help="only these dev questions (the run is filed under its own key)")
    ap.add_argument("--file", type=Path, metavar="JSONL",
                    help="questions of another file in the dev set's form instead of the dev set, e.g. "
                         "tests/data/dev_en.jsonl (the run is filed under its own key)")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a config setting for this run, e.g. answer.prompt=quote (the run is filed under its own key)")
    ap.add_argument("--fresh-speed", action="store_true",
                    help="forget the model's learned speed first (a first run after install: measured at the first question)")
    ap.add_argument("--tiny", action="store_true",
                    help="a smoke run on the sample notes and their questions, the index in a temporary folder")
    args = ap.parse_args()
    if args.tiny and (args.ollama_host or args.record):
        ap.error("--tiny runs the stand-in (or --extractive), never a real Ollama")
    if args.tiny:
        tiny_world()
    if not dev_set().exists() or not backup().exists():
        print(f"the answer eval needs the shared corpus and dev set: {backup()} and {dev_set()} (LEANOTE_RAG_SHARED), "
              "or --tiny", file=sys.stderr)
        return 2
    if args.ollama_host and args.speed:
        ap.error("--speed is for the stand-in, not a real Ollama")
    if args.extractive and (args.ollama_host or args.speed or args.budget):
        ap.error("--extractive uses no LLM: no --ollama-host, --speed or --budget")
    if args.record and not args.ollama_host:
        ap.error("--record is for a real Ollama (--ollama-host)")
    if args.file and args.questions:
        ap.error("--questions picks dev questions; --file gives other questions: not both")
    if args.file and not args.file.is_file():
        ap.error(f"--file: no such file: {args.file}")
    if args.budget is not None and args.budget <= 0:
        ap.error("--budget takes a positive number of seconds")
    if (args.timeout or OllamaConfig().timeout) <= (args.budget or AnswerConfig().first_token_budget):
        ap.error("the timeout (--timeout, default 120 s) must be longer than the first-token budget (--budget): "
                 "the answer is written after its first token")
    speed = None
    if args.speed:
        try:
            speed = tuple(float(x) for x in args.speed.split(","))
            assert len(speed) == 2 and min(speed) > 0
        except (ValueError, AssertionError):
            ap.error("--speed takes two positive numbers: READ,WRITE tokens per second (e.g. 60,6)")

    from fakes.ollama import FakeOllama

    from bot.cli.notes import answer_table

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "data" if args.tiny else DATA
        index_corpus(tmp, data)
        questions = subset(args.questions, tmp) if args.questions else (args.file or dev_set())
        started = time.monotonic()
        if args.extractive:
            key = "extractive (no LLM)"
            print("answer eval without an LLM: extractive answers", file=sys.stderr)
            report = run_eval(write_config(tmp, "http://127.0.0.1:9", STAND_IN, enabled=False, data=data), False,
                              questions)
        elif args.ollama_host:
            model = args.model or OllamaConfig().model
            key = f"ollama {model}"
            print(f"answer eval: {model} at {host_url(args.ollama_host)}", file=sys.stderr)
            recorder = Recorder(host_url(args.ollama_host), args.record) if args.record else None
            try:
                url = recorder.url if recorder else host_url(args.ollama_host)
                if args.fresh_speed:
                    forget_speed(model, data)
                report = run_eval(write_config(tmp, url, model, budget=args.budget, timeout=args.timeout,
                                               settings=args.settings, data=data), False, questions)
            finally:
                if recorder:
                    recorder.close()
        else:
            forget_speed(STAND_IN, data)
            key = "reader stand-in" + (f", speed read {speed[0]:g} / write {speed[1]:g} tok/s" if speed else "")
            print("answer eval with the reader stand-in (tests/fakes/ollama.py), not a real LLM"
                  + (f"; as slow as {speed[0]:g} tok/s reading, {speed[1]:g} writing" if speed else ""), file=sys.stderr)
            with FakeOllama(models=(STAND_IN,), speed=speed, reader=True) as fake:
                report = run_eval(write_config(tmp, fake.url, STAND_IN, budget=args.budget, timeout=args.timeout,
                                               settings=args.settings, data=data), False, questions)
        seconds = round(time.monotonic() - started, 1)
    if args.budget is not None:
        key += f", first-token budget {args.budget:g} s"
    if args.timeout is not None:
        key += f", timeout {args.timeout:g} s"
    if args.settings:
        key += ", " + ", ".join(args.settings)
    if args.questions:
        key += f", questions {args.questions}"
    if args.file:
        key += f", file {args.file.name}"

    out = results_file("answers_eval_results.json", args.tiny)
    try:
        results = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        results = {}
    runs = results.get("runs") or {}
    runs[key] = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(), "seconds": seconds,
                 "stand_in": not args.ollama_host and not args.extractive, "speed": list(speed) if speed else None,
                 "first_token_budget": args.budget or AnswerConfig().first_token_budget,
                 "timeout": args.timeout or OllamaConfig().timeout, "report": report}
    out.write_text(json.dumps({"runs": runs}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"\n{key} ({seconds} s for the eval; {out.relative_to(REPO) if out.is_relative_to(REPO) else out})")
    for line in answer_table(report):
        print(line)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as err:  # leanote-rag said why on stderr
        sys.exit(err.returncode)
