"""The API's listeners, served by uvicorn inside the daemon's event loop:

- a Unix socket (``api.socket``, default ``<state_dir>/api.sock``, mode 0600): the CLI of the
  same user (or root) uses it with full access, no token;
- optionally TCP (``api.listen``, ``host:port``) for remote use: every request needs
  ``Authorization: Bearer <token>``, one of ``api.tokens``. It is kept by ``bot.api.guard`` (a
  deadline on each request's head and body, a cap on connections, the excess put out or refused
  at once); a problem with it leaves the local socket working, and says what is wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from functools import partial

import uvicorn
from fastapi import FastAPI

from rag.config import Settings
from rag.errors import UserError

from bot.api.access import TokenAuth
from bot.api.app import create_app
from bot.api.client import check_socket_path
from bot.api.guard import AcceptErrors, Episode, Guard, GuardedH11, connection_cap

log = logging.getLogger(__name__)
BACKLOG = 4096  # connections the kernel queues until they are accepted (capped by net.core.somaxconn)
ACCEPT_BATCH = 16  # connections accepted in one go before the next are looked at (``_Server``)


class _Server(uvicorn.Server):
    """uvicorn inside our event loop: the daemon handles the signals, not uvicorn.

    asyncio accepts as many connections in one go as the listen backlog it is given, before
    any of them is looked at: a long queue of a stranger's connections would take every file
    the process may open at once. So uvicorn's backlog (``Config.backlog``) is the small
    batch ``ACCEPT_BATCH``, and once it listens the kernel's queue is made ``BACKLOG`` long
    again (``listen()`` on a listening socket only changes its queue): a client's
    connection waits in the queue, never for a SYN to be sent again."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        for sock in sockets or ():
            sock.listen(BACKLOG)


def _config(app: FastAPI, settings: Settings, guard: Guard | None = None) -> uvicorn.Config:
    # h11 holds a request's line and headers whole up to this: room for a query of
    # question_chars (CJK percent-encoded: 9 bytes a character) and the headers, no more.
    head = max(16 * 1024, settings.limits.question_chars * 9 + 8 * 1024)
    protocol = partial(GuardedH11, guard=guard) if guard is not None else "h11"
    return uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=2,
                          server_header=False, h11_max_incomplete_event_size=head, http=protocol,
                          timeout_keep_alive=settings.api.idle_timeout, backlog=ACCEPT_BATCH)


def unix_listener(path) -> socket.socket:
    """The API's Unix socket, private to this user (0600); a stale file is replaced (we
    hold the index lock, so no other daemon of this state directory is alive)."""
    check_socket_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


def tcp_listener(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as err:
        sock.close()
        raise UserError(f"cannot listen on api.listen {listen}: {err.strerror or err}") from None
    sock.listen(BACKLOG)
    return sock


async def service(daemon) -> None:
    """Serve the API until the daemon stops (run by the daemon like the bots)."""
    cfg = daemon.settings.api
    if not cfg.enabled:
        return
    servers: list[tuple[_Server, socket.socket]] = []
    remote = ""
    guard = None
    if cfg.listen:  # a problem here leaves the local socket working, and says what is wrong
        try:
            guard = Guard(cfg.listen, connection_cap(cfg.max_connections), cfg.request_timeout)
            app = create_app(daemon, TokenAuth(daemon))
            servers.append((_Server(_config(app, daemon.settings, guard)), tcp_listener(cfg.listen)))
            remote = f" and http://{cfg.listen} (tokens; at most {guard.most} connections)"
        except UserError as err:
            log.error("the API's TCP listener is off: %s", err)
    servers.append((_Server(_config(create_app(daemon), daemon.settings)), unix_listener(cfg.socket)))
    log.info("API on %s%s", cfg.socket, remote)
    accept_errors = AcceptErrors(asyncio.get_running_loop())
    accept_errors.install()
    bad_heads = _QuietBadRequests()
    logging.getLogger("uvicorn.error").addFilter(bad_heads)
    tasks = [asyncio.create_task(server.serve(sockets=[sock])) for server, sock in servers]
    try:
        await daemon.stopping.wait()
    finally:
        for server, _ in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, sock in servers:
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            cfg.socket.unlink()
        accept_errors.remove()
        logging.getLogger("uvicorn.error").removeFilter(bad_heads)
        bad_heads.episode.over()
        if guard is not None:
            guard.close()


class _QuietBadRequests(logging.Filter):
    """uvicorn logs every malformed request head; a stranger can send thousands: the first
    one of an episode is said, the rest counted (``guard.Episode``)."""

    def __init__(self):
        super().__init__()
        self.episode = Episode(
            lambda c: "the API received a malformed HTTP request (answered 400); more are counted, not logged",
            lambda c: f"the API answered {c['bad']} malformed HTTP request(s) with 400", level=logging.INFO)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Invalid HTTP request received"):
            self.episode.hit("bad")
            return False
        return True


service.label = "API"
