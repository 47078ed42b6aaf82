"""The command line's way into a running daemon: its API on the Unix socket.

The embedded index allows one process. While ``leanote-rag serve`` holds it, the
CLI's commands go through the daemon's API instead of opening the index, and print
exactly what they print without it. ``find_daemon`` is the one place that decides.

Errors come back as JSON ``{"error": ..., "kind": "user" | "unavailable" | "internal"}``
and are raised as the same exception classes a local run raises, so exit codes match.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, Iterator

import httpx

from rag.config import Settings
from rag.errors import LeanoteRagError, Unavailable, UserError
from rag.http import tls

BASE = "http://leanote-rag"  # the host part is ignored on a Unix socket
SOCKET_PATH_MAX = 107  # sockaddr_un.sun_path, minus the terminating NUL
log = logging.getLogger(__name__)


def check_socket_path(path: Path) -> None:
    if len(os.fsencode(str(path))) > SOCKET_PATH_MAX:
        raise UserError(
            f"api.socket {path} is {len(os.fsencode(str(path)))} bytes long; a Unix socket path may be at most "
            f"{SOCKET_PATH_MAX}: set api.socket to a shorter path (e.g. /run/leanote-rag/api.sock)"
        )


def _raise(status: int, body: Any) -> None:
    message = body.get("error") if isinstance(body, dict) else None
    kind = body.get("kind") if isinstance(body, dict) else None
    message = message or f"the daemon answered HTTP {status}"
    if kind == "user":
        raise UserError(message)
    if kind == "unavailable" or status == 503:
        raise Unavailable(message)
    raise LeanoteRagError(message)


ONE_SHOT = httpx.Limits(max_keepalive_connections=0)


class DaemonClient:
    """Calls to the daemon's API over its Unix socket."""

    def __init__(self, path: Path, timeout: float = 600.0):
        self.path = Path(path)
        # a connection per call: the daemon closes one idle for api.idle_timeout, and a call sent on it
        # as it closes would fail with "Server disconnected" (a new one costs little on a Unix socket)
        self._http = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.path), verify=tls(), limits=ONE_SHOT),
                                  base_url=BASE, timeout=httpx.Timeout(timeout, connect=5.0))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "DaemonClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs) -> Any:
        try:
            reply = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise Unavailable(f"the daemon's API at {self.path} failed: {err}") from None
        try:
            body = reply.json()
        except ValueError:
            body = None
        if reply.status_code >= 400:
            _raise(reply.status_code, body)
        return body

    def health(self) -> dict:
        """``GET /health``'s body, ready or not."""
        try:
            return self._http.get("/health").json()
        except (httpx.HTTPError, ValueError) as err:
            raise Unavailable(f"the daemon's API at {self.path} failed: {err}") from None

    def get(self, path: str, **params) -> Any:
        return self._call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, payload: dict | None = None) -> Any:
        return self._call("POST", path, json=payload or {})

    def stream(self, path: str, payload: dict) -> Iterator[dict]:
        """The events of a streamed call (NDJSON), one dict each; an ``error`` event raises."""
        try:  # no read deadline: a long pass or a slow LLM may be quiet for minutes (Ctrl-C stops it)
            with self._http.stream("POST", path, json=payload, timeout=httpx.Timeout(None, connect=5.0)) as reply:
                if reply.status_code >= 400:
                    reply.read()
                    try:
                        body = json.loads(reply.text)
                    except ValueError:
                        body = None
                    _raise(reply.status_code, body)
                for line in reply.iter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("event") == "error":
                        _raise(500, event)
                    yield event
        except httpx.HTTPError as err:
            raise Unavailable(f"the daemon's API at {self.path} failed: {err}") from None


def find_daemon(settings: Settings) -> DaemonClient | None:
    """A client for the daemon serving this config's state, or None when none runs.

    A socket file with nobody listening (a daemon that was killed) is no daemon. A
    socket this user may not open (the service runs as another user) is an error that
    says so, rather than a confusing "the index is in use"."""
    cfg = settings.api
    path = cfg.socket
    if not cfg.enabled or path is None or not path.exists() or len(os.fsencode(str(path))) > SOCKET_PATH_MAX:
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except PermissionError:
        raise UserError(
            f"leanote-rag serve is running, but its socket {path} is not open to this user: run the command as "
            f"the service's user or as root (sudo leanote-rag …)"
        ) from None
    except OSError:
        log.debug("no daemon answers on %s: a stale socket", path)
        return None  # stale: nobody listens
    finally:
        probe.close()
    return DaemonClient(path)


def say_door(settings: Settings, client: "DaemonClient | None") -> None:
    """For ``-v``: whether a command goes through the running daemon or works here."""
    if client is not None:
        log.info("through the running daemon's API on %s", client.path)
    else:
        log.info("no daemon runs for %s: working on it here", settings.state_dir)
