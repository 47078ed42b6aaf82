"""One dev question answered by a real model: Qwen2.5-Coder on this CPU, behind the
Ollama-compatible server of ``../shared/real-llm`` (its README sets it up). Skips, saying
why, when the server, the models or the dev set are not on the machine.

The install is looked for in ``$LEANOTE_RAG_REAL_LLM`` (the folder ``setup.sh`` was given),
else ``~/real-llm``. The model is the 0.5B when it is installed (``setup.sh`` installs both),
else the 1.5B; ``LEANOTE_RAG_REAL_LLM_MODEL=1.5b`` asks for the 1.5B. Either is a real model
reading real notes; the 0.5B answers this question in a third of the time (it cited its gold note
in both of its dev-set runs, ``bench/answers_eval_results.json``); how well each model
answers is ``bench/answers_eval.py``'s to measure. The answer must cite the question's gold
note, however it gets there (its own ``[n]`` or an inferred citation), and the trace must say
which. Timeouts are generous: this measures whether the answer step works with a real model,
not its speed (that too is ``bench/answers_eval.py``'s).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rag.answer.service import AnswerService
from rag.index.note_index import NoteIndex
from rag.llm import OllamaChat

from conftest import SHARED, index_samples

REAL_LLM = SHARED / "real-llm"
INSTALL = Path(os.environ.get("LEANOTE_RAG_REAL_LLM", Path.home() / "real-llm"))
MODELS = {  # size: (the weights' file, the name the server answers to)
    "0.5b": ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder:0.5b-instruct"),
    "1.5b": ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder:1.5b-instruct"),
}
_ASKED = os.environ.get("LEANOTE_RAG_REAL_LLM_MODEL", "")
_SIZE = _ASKED or ("0.5b" if (INSTALL / "models" / MODELS["0.5b"][0]).exists() else "1.5b")
MODEL_FILE, MODEL = MODELS.get(_SIZE, MODELS["1.5b"])
QUESTION_ID = "A048"  # mysqldump --single-transaction: a keyword question with one gold note
OTHERS = 4  # notes of the same user beside the gold one


def _missing() -> str | None:
    if _SIZE not in MODELS:
        return f"LEANOTE_RAG_REAL_LLM_MODEL={_ASKED}: choose one of {', '.join(MODELS)}"
    if not (REAL_LLM / "real_ollama.py").exists():
        return f"no real-LLM server at {REAL_LLM} (../shared/real-llm)"
    if not (INSTALL / "venv" / "bin" / "python").exists() or not (INSTALL / "models" / MODEL_FILE).exists():
        return (f"the real LLM is not installed at {INSTALL} (run ../shared/real-llm/setup.sh DIR and set "
                f"LEANOTE_RAG_REAL_LLM=DIR)")
    if not (SHARED / "eval" / "dev.jsonl").exists() or not (SHARED / "corpus" / "notes.jsonl").exists():
        return f"no dev set or corpus in {SHARED}"
    return None


pytestmark = [pytest.mark.slow,  # a real model
              pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def real_ollama():
    port = _free_port()
    proc = subprocess.Popen(
        [str(INSTALL / "venv" / "bin" / "python"), str(REAL_LLM / "real_ollama.py"), "--model-path",
         str(INSTALL / "models" / MODEL_FILE), "--port", str(port), "--name", MODEL,
         # one thread: the tests run two processes per core, and a second thread waiting for a core that
         # another test holds slows every step of the model down (it keeps to its slowest thread)
         "--threads", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # loading 1.1 GB of weights on a busy machine
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the real-LLM server exited: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{url}/api/tags", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the real-LLM server did not answer within 300 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _notes(folder: Path) -> tuple[dict, str]:
    """The question, and its gold note with a few other notes of its user as Markdown files."""
    question = next(q for q in map(json.loads, (SHARED / "eval" / "dev.jsonl").open(encoding="utf-8"))
                    if q["id"] == QUESTION_ID)
    notes = [json.loads(line) for line in (SHARED / "corpus" / "notes.jsonl").open(encoding="utf-8")]
    gold = next(n for n in notes if n["NoteId"] in question["gold_note_ids"])
    others = [n for n in notes if n["UserId"] == gold["UserId"] and n["IsMarkdown"] and n["NoteId"] != gold["NoteId"]
              and not n.get("IsTrash")][:OTHERS]
    folder.mkdir()
    for i, n in enumerate([gold, *others]):
        (folder / f"{i:02d}.md").write_text(f"# {n['Title']}\n\n{n['Content']}", encoding="utf-8")
    return question, gold["Title"]


def test_a_real_qwen_answers_a_dev_question_citing_its_gold_note(tmp_path, use_embedder, real_ollama):
    question, gold_title = _notes(tmp_path / "notes")
    settings = index_samples(
        tmp_path, use_embedder, source={"kind": "files", "path": str(tmp_path / "notes")},
        rerank={"kind": "none"}, retrieval={"expand": "off"},
        # temperature 0: the model's likeliest answer, the same on every run (at the product's 0.1
        # the server seeds its sampling from the clock: one busy run got an answer the check rejected)
        ollama={"host": real_ollama, "model": MODEL, "timeout": 900, "stall_timeout": 120, "temperature": 0},
        # a small prompt, and no cut to a speed: the test is about the answer, not the clock
        answer={"top_k": 3, "total_chars": 1500, "first_token_budget": 600},
    )
    index = NoteIndex.open(settings, embedder=use_embedder)
    service = AnswerService(settings, index, chat=OllamaChat(settings.ollama))
    try:
        answer = asyncio.run(service.ask(question["question"], "local"))
    finally:
        service.close()
        index.close()
    shown = f"{answer.trace.outcome} / {answer.trace.citing}: {answer.answer[:300]!r}"
    assert answer.trace.outcome == "llm" and answer.used_llm, shown
    assert answer.trace.citing in ("cited", "inferred"), shown
    assert any(c.title == gold_title for c in answer.citations), shown
    print(f"\n{MODEL}: {shown}; {answer.usage}", file=sys.stderr)
