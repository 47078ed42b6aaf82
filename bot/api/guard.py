"""The API's TCP door, kept from anyone who would hold it open: deadlines, a cap, and
a log that says so once.

A stranger needs no token to open connections. Each one held open costs the process a
file descriptor, and the process shares one limit (``RLIMIT_NOFILE``) between the API,
its Unix socket (the CLI's door), the sync's calls to Leanote, the index's files and the
models' weights. So the TCP listener:

- gives each request ``api.request_timeout`` for its line, headers and body from the
  moment the connection is ready for it (opened, or its previous answer sent): a client
  that trickles a header a minute is closed when that time is up, whatever it sends;
- closes a kept-alive connection idle for ``api.idle_timeout`` (uvicorn's keep-alive);
- holds at most ``api.max_connections`` connections (fewer when the process's file limit
  is low: a quarter of it). A connection past that takes the place of the one that has
  waited longest for a request head still coming; a client that sends its request at once
  (its whole head is there when the connection is accepted) may also take the place of a
  kept-alive connection waiting for its next request, and is never put out for a newer
  one. When no connection may be put out, the new one is answered 503 and closed at once.
  A request without a valid token is answered 401 before its body is read, so a
  stranger holds no connection longer than an answer takes (``api.TokenFirst``);
- says each of these episodes once in the log when it starts and once when it has been
  quiet for ``QUIET`` seconds (with how many connections were refused or closed), never
  per connection; likewise an ``accept()`` that fails (the file limit reached anyway),
  which asyncio would log with a traceback on every try.

The Unix socket is not capped: only this user can open it (0600).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from collections import Counter
from typing import Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

HEAD_PEEK = 16 * 1024  # bytes looked at for a whole head when a connection is accepted
QUIET = 30.0  # seconds without a new event before an episode is said to be over
FD_SHARE = 4  # at most this share (1/n) of the process's file limit goes to TCP connections
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 5\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s")
_REFUSAL_BODY = b'{"error":"too many connections to this API at once: try again in a few seconds","kind":"unavailable"}'


def connection_cap(configured: int) -> int:
    """``api.max_connections``, or a quarter of the process's open-file limit when that is
    less (the rest is the sync's, the index's and the Unix socket's)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, soft // FD_SHARE))


class Episode:
    """A condition said once when it starts and once when it has been quiet for ``QUIET``
    seconds, with what was counted meanwhile; never once per event."""

    def __init__(self, start: Callable[[Counter], str], end: Callable[[Counter], str],
                 level: int = logging.WARNING, quiet: float = QUIET, clock=time.monotonic):
        self.start, self.end, self.level, self.quiet, self.clock = start, end, level, quiet, clock
        self.counts: Counter = Counter()
        self.active = False
        self.last = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def hit(self, what: str, n: int = 1) -> None:
        self.counts[what] += n
        self.last = self.clock()
        if not self.active:
            self.active = True
            log.log(self.level, "%s", self.start(self.counts))
            self._arm()

    def _arm(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(self.quiet, self._check)

    def _check(self) -> None:
        self._timer = None
        left = self.last + self.quiet - self.clock()
        if left > 0:
            self._timer = asyncio.get_running_loop().call_later(left, self._check)
            return
        self.over()

    def over(self) -> None:
        """Said to be over now (the timer found it quiet, or the listener stops)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.active:
            log.info("%s", self.end(self.counts))
        self.active = False
        self.counts = Counter()


class Guard:
    """What one TCP listener's connections share: who is open, the cap, the deadlines."""

    def __init__(self, listen: str, most: int, request_timeout: float, clock=time.monotonic):
        self.listen = listen
        self.most = most
        self.request_timeout = request_timeout
        self.clock = clock
        self.open: set[GuardedH11] = set()
        self.crowded = Episode(
            lambda c: (f"the API on {listen} has more connections than it holds ({most}, api.max_connections): "
                       f"those that send no whole request are closed first, others refused; said again when it "
                       f"has been quiet for {QUIET:g} s"),
            lambda c: (f"the API on {listen} is no longer crowded: {c['refused']} connection(s) refused, "
                       f"{c['put_out']} closed for a newer one, {c['timed_out']} closed for not sending a whole "
                       f"request within {request_timeout:g} s (api.request_timeout)"))
        self.slow = Episode(
            lambda c: (f"the API on {listen}: a connection did not send a whole request within "
                       f"{request_timeout:g} s (api.request_timeout) and was closed; more are counted, not logged"),
            lambda c: f"the API on {listen}: {c['timed_out']} connection(s) closed for sending too slowly",
            level=logging.INFO)

    def admit(self, conn: "GuardedH11") -> bool:
        """Room for ``conn``: made, when the listener is full, by closing the connection that
        has waited longest for a head still coming (never one whose whole head is here and
        not read yet). A newcomer whose whole head is here (``conn.ready``) may also put out a
        kept-alive connection waiting for its next request. False: refuse ``conn``."""
        if len(self.open) >= self.most:
            waiting = [c for c in self.open if c.waiting_since is not None and not c.ready
                       and not c.transport.is_closing()]
            # a head still coming first; a kept-alive connection (a client that sent whole
            # requests before) only for a newcomer whose request is here
            waiting.sort(key=lambda c: (c.served > 0, c.waiting_since))
            if not waiting or (waiting[0].served and not conn.ready):
                self.crowded.hit("refused")
                return False
            self.crowded.hit("put_out")
            waiting[0].put_out()
        self.open.add(conn)
        return True

    def gone(self, conn: "GuardedH11") -> None:
        self.open.discard(conn)

    def timed_out(self) -> None:
        (self.crowded if self.crowded.active else self.slow).hit("timed_out")

    def close(self) -> None:
        self.crowded.over()
        self.slow.over()


class GuardedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the guard's deadlines and cap (see the module)."""

    def __init__(self, config, server_state, app_state, _loop=None, *, guard: Guard):
        super().__init__(config, server_state, app_state, _loop)
        self.guard = guard
        self.refused = False
        self.ready = False  # its whole first head had come when it was accepted (and is not read yet)
        self.waiting_since: float | None = None  # waiting for a request's head since (monotonic)
        self.served = 0  # answers sent on it
        self._deadline: asyncio.TimerHandle | None = None
        self._cycle = None  # the request whose head came last

    # --- the asyncio protocol ----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.ready = _whole_head_waiting(transport)
        if not self.guard.admit(self):
            self.refused = True
            transport.write(_REFUSAL % (len(_REFUSAL_BODY), _REFUSAL_BODY))
            transport.close()
            return
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc) -> None:
        self.guard.gone(self)
        self._cancel()
        if not self.refused:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        self.ready = False
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        cycle = self.cycle
        super().on_response_complete()
        self.served += 1
        if self.cycle is cycle and not self.transport.is_closing():
            self._await_head()
        else:  # a pipelined request's head was waiting
            self._follow()

    # --- the deadlines -----------------------------------------------------------------------

    def put_out(self) -> None:
        self._cancel()
        self.waiting_since = None
        self.transport.close()

    def _await_head(self) -> None:
        self.waiting_since = self.guard.clock()
        self._arm()

    def _follow(self) -> None:
        """After data or an answer: a new request's head came, or its body is complete."""
        cycle = self.cycle
        if cycle is not None and cycle is not self._cycle:
            self._cycle = cycle
            self.waiting_since = None
            self._cancel()
            if cycle.more_body:
                self._arm()  # its body within the same time from now
        elif cycle is not None and self.waiting_since is None and not cycle.more_body:
            self._cancel()

    def _arm(self) -> None:
        self._cancel()
        self._deadline = self.loop.call_later(self.guard.request_timeout, self._too_slow)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        waiting_head = self.waiting_since is not None
        waiting_body = self.cycle is not None and self.cycle.more_body and not self.cycle.response_started
        if (waiting_head or waiting_body) and not self.transport.is_closing():
            self.guard.timed_out()
            self.transport.close()


def _whole_head_waiting(transport) -> bool:
    """Whether a whole request head is already in the connection's receive buffer (read
    without taking it: MSG_PEEK). Under a flood of connections the kernel's queue is long,
    and a client that sends its request at once has it there by the time it is accepted."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    peek = socket.socket(fileno=sock.fileno())
    try:
        data = peek.recv(HEAD_PEEK, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return False
    finally:
        peek.detach()  # the fd stays the transport's
    return b"\r\n\r\n" in data


class AcceptErrors:
    """The event loop's handler for errors no task catches: an ``accept()`` that fails
    (``EMFILE``: the file limit reached) is said once per episode, without a traceback;
    anything else goes to the handler that was there before."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.before = loop.get_exception_handler()
        self.episode = Episode(
            lambda c: ("the API cannot accept connections: the process has as many files open as it may "
                       "(raise LimitNOFILE in the service, or lower api.max_connections); retrying, said "
                       "again when it has been quiet"),
            lambda c: f"the API accepts connections again ({c['failed']} accept(s) failed meanwhile)")

    def __call__(self, loop, context: dict) -> None:
        if str(context.get("message", "")).startswith(self.MESSAGE):
            self.episode.hit("failed")
            return
        if self.before is not None:
            self.before(loop, context)
        else:
            loop.default_exception_handler(context)

    def install(self) -> None:
        self.loop.set_exception_handler(self)

    def remove(self) -> None:
        self.episode.over()
        if self.loop.get_exception_handler() is self:
            self.loop.set_exception_handler(self.before)
