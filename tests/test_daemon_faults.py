"""``serve`` when what it stands on fails: systemd's notify socket not read, a disk that
fills up, a sync state file that is damaged, a Leanote restored from a backup (its USN
goes back), two daemons started at once on one state directory. Each case is a real
``serve`` process; the tests wait for conditions with generous deadlines."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

EXE = str(Path(sys.executable).with_name("leanote-rag"))
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "notes"


def until(check, timeout=90.0, what="it", proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"serve exited ({proc.returncode}) while waiting for {what}"
                                 + (f"\n{log.read_text()[-3000:]}" if log else ""))
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{log.read_text()[-3000:]}" if log else ""))


class Serve:
    """A config over the sample notes (or a Leanote) and a ``serve`` process on it."""

    def __init__(self, tmp_path: Path, state_dir: Path | None = None, extra: str = "", env: dict | None = None):
        self.sock = Path(f"/tmp/lr-f-{uuid.uuid4().hex[:8]}.sock")
        self.config = tmp_path / "config.yaml"
        self.state_dir = state_dir or tmp_path / "data"
        self.log = tmp_path / f"serve-{uuid.uuid4().hex[:4]}.log"
        if "source:" not in extra:
            extra = f"source: {{kind: files, path: '{EXAMPLES}'}}\n" + extra
        self.config.write_text(
            f"state_dir: '{self.state_dir}'\nollama: {{enabled: false}}\nrerank: {{kind: none}}\n"
            f"api: {{socket: '{self.sock}'}}\n{extra}")
        self.env = {**os.environ, **(env or {})}
        self.env.pop("NOTIFY_SOCKET", None)
        self.env.pop("WATCHDOG_USEC", None)
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None

    def start(self, log: Path | None = None) -> subprocess.Popen:
        out = (log or self.log).open("w")
        self.proc = subprocess.Popen([EXE, "--config", str(self.config), "serve"], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=out, text=True)
        return self.proc

    def cli(self, *args: str, timeout=120) -> subprocess.CompletedProcess:
        return subprocess.run([EXE, "--config", str(self.config), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def health(self, timeout=5.0) -> httpx.Response | None:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.sock)), base_url="http://x") as http:
                return http.get("/health", timeout=timeout)
        except httpx.HTTPError:
            return None

    def ready(self) -> bool:
        reply = self.health()
        return reply is not None and reply.status_code == 200 and reply.json()["passes"] >= 1

    def text(self) -> str:
        return self.log.read_text()

    def stop(self, timeout=30.0) -> float:
        """SIGTERM; seconds until it exited (it is killed, and the test fails, past ``timeout``)."""
        assert self.proc is not None
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"serve did not stop within {timeout:g} s of SIGTERM\n{self.text()[-3000:]}") from None
        return time.monotonic() - start

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def serves():
    started: list[Serve] = []

    def make(*args, **kwargs) -> Serve:
        s = Serve(*args, **kwargs)
        started.append(s)
        return s

    yield make
    for s in started:
        s.kill()


# --- systemd's notify socket ------------------------------------------------------------------


def test_an_unread_notify_socket_never_blocks_the_api_or_sigterm(tmp_path, serves):
    """systemd stuck (its notify socket not read): the watchdog pings fill the socket's
    queue and are dropped, said once; the API answers and SIGTERM stops the daemon."""
    path = f"/tmp/lr-notify-{uuid.uuid4().hex[:8]}"
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # full after a few messages
    sink.bind(path)
    try:
        s = serves(tmp_path, extra="sync: {interval: 1h}\n",
                   env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000"})  # a ping every 10 ms
        proc = s.start()
        until(lambda: "is full (systemd does not read it)" in s.text(), what="the dropped pings to be logged", proc=proc,
              log=s.log)
        until(s.ready, what="/health to answer ready", proc=proc, log=s.log)
        time.sleep(0.5)  # the queue stays full meanwhile: many more pings dropped
        assert s.ready()
        assert s.cli("search", "番茄炒蛋").returncode == 0  # through the API
        s.stop(timeout=30)
        log = s.text()
        assert s.proc.returncode == 0, log[-3000:]
        assert log.count("is full (systemd does not read it)") == 1 and "Traceback" not in log
    finally:
        sink.close()
        os.unlink(path)
