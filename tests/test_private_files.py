"""The state holds the notes' text: every file the program makes in the state directory is
0600 and every folder 0700, started from a shell with umask 022 in a state directory
made by hand (0755), which is made private with a warning. Real `index`, `ask` and
`serve` processes."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from conftest import THREADS, unix_http
from fakes.ollama import FakeOllama

pytestmark = pytest.mark.slow  # real `serve` processes

EXE = str(Path(sys.executable).with_name("leanote-rag"))


def modes(folder: Path) -> dict[str, int]:
    """Every file and folder under ``folder`` (relative path -> permission bits)."""
    return {str(p.relative_to(folder)): stat.S_IMODE(p.lstat().st_mode) for p in folder.rglob("*")}


def loose(found: dict[str, int]) -> dict[str, str]:
    return {name: oct(mode) for name, mode in found.items() if mode & 0o077}


def test_every_file_in_the_state_dir_is_private_whatever_the_umask(tmp_path, notes_dir):
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)  # made by hand, as `mkdir` does with umask 022
    (data / "notes-from-before.txt").write_text("x")
    (data / "notes-from-before.txt").chmod(0o644)
    sock = Path(f"/tmp/lr-priv-{uuid.uuid4().hex[:8]}.sock")
    with FakeOllama() as ollama:
        config = tmp_path / "config.yaml"
        config.write_text(
            f"source: {{kind: files, path: '{notes_dir}'}}\nstate_dir: data\nollama: {{host: '{ollama.url}'}}\n"
            f"rerank: {{kind: none}}\nmemory: {{llm: 'off'}}\nsync: {{interval: 1h}}\napi: {{socket: '{sock}'}}\n"
            f"embedder: {{threads: {THREADS}}}\n")

        def cli(*args):
            return subprocess.run([EXE, "--config", str(config), *args], capture_output=True, text=True, timeout=300,
                                  umask=0o022)

        index = cli("index")
        assert index.returncode == 0, index.stderr
        assert f"the state directory {data} was open to other users (mode 755): made it private (0700)" in index.stderr
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        ollama.reply("先炒蛋[1]。")
        assert cli("ask", "番茄炒蛋怎么做？").returncode == 0
        assert (data / "llm_speed.json").exists()

        serve = subprocess.Popen([EXE, "--config", str(config), "serve"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, umask=0o022)
        try:
            deadline = time.monotonic() + 120
            while True:
                assert serve.poll() is None, serve.stderr.read()
                assert time.monotonic() < deadline, "serve did not become ready"
                try:
                    with unix_http(sock) as http:
                        if http.get("/health", timeout=5).json().get("passes", 0) >= 1:
                            break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            running = modes(data)  # with the daemon's databases open: their -wal and -shm files too
        finally:
            serve.send_signal(signal.SIGTERM)
            _, log = serve.communicate(timeout=60)
        assert serve.returncode == 0, log
    sock.unlink(missing_ok=True)

    made = {"state.db", "memory.sqlite", "feedback.sqlite", "capture.sqlite", "llm_speed.json", "qdrant",
            "qdrant.lock", "state.db-wal", "state.db-shm", "capture.sqlite-wal"}
    assert made <= set(running), sorted(running)
    assert any(name.startswith("qdrant/") for name in running)
    assert loose(running) == {} and loose(modes(data)) == {}
    assert all(mode == 0o700 for name, mode in running.items() if (data / name).is_dir())
    assert os.stat(data / "notes-from-before.txt").st_mode & 0o777 == 0o600  # what was there is private too
