"""systemd's notify protocol (``sd_notify``) that never blocks the event loop.

The messages go to the datagram socket named by ``NOTIFY_SOCKET`` (an abstract one when
it starts with ``@``), sent without waiting: when systemd does not read its socket and the
queue is full, a watchdog ping is dropped (the next one follows half a period later; the
first drop is logged, once); a state change (READY, RELOADING, STOPPING, STATUS) is kept
and sent again, without waiting, at the next message or ping, the newest of each kind.
Outside systemd (no ``NOTIFY_SOCKET``) every call does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

log = logging.getLogger(__name__)

PING = "WATCHDOG=1"


class Notifier:
    def __init__(self, address: str | None = None):
        address = os.environ.get("NOTIFY_SOCKET") if address is None else address
        self.address = address or None
        self.sock: socket.socket | None = None
        self.dropped = 0  # pings dropped because the socket's queue was full
        self._waiting: dict[str, str] = {}  # state changes not sent yet: field -> "FIELD=value"
        self._said_full = self._said_failed = False
        self._retry: asyncio.TimerHandle | None = None
        if self.address is None:
            return
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            sock.setblocking(False)
            sock.connect(target)
        except OSError as err:
            log.warning("cannot reach systemd's notify socket %s (%s): systemd hears nothing from this process",
                        self.address, err)
            return
        self.sock = sock

    def notify(self, message: str) -> bool:
        """Send ``message`` ("READY=1\nSTATUS=serving", "WATCHDOG=1"); True when it went out."""
        if self.sock is None:
            return False
        if message != PING:
            for line in message.splitlines():
                field = line.partition("=")[0]
                if field == "READY" and "STOPPING" in self._waiting:
                    continue  # too late to be ready
                if field == "READY":
                    self._waiting.pop("RELOADING", None)  # reloaded already
                self._waiting[field] = line
        if self._waiting:  # state changes first, this message's own with them
            if not self._send("\n".join(self._waiting.values()), ping=message == PING):
                self._retry_later()
                return False
            self._waiting.clear()
            if message != PING:
                return True
        return self._send(message, ping=True)

    def _retry_later(self, delay: float = 0.5) -> None:
        """State changes still waiting are tried again on the event loop, with or without pings."""
        if self._retry is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a plain call): the next message takes them along
            return

        def again() -> None:
            self._retry = None
            if self._waiting and self.sock is not None:
                if self._send("\n".join(self._waiting.values()), ping=False):
                    self._waiting.clear()
                else:
                    self._retry_later(min(delay * 2, 5.0))

        self._retry = loop.call_later(delay, again)

    def _send(self, data: str, ping: bool) -> bool:
        try:
            self.sock.send(data.encode())
            return True
        except (BlockingIOError, InterruptedError):  # the queue is full: systemd does not read it
            if ping:
                self.dropped += 1
            if not self._said_full:
                self._said_full = True
                log.warning("systemd's notify socket %s is full (systemd does not read it): watchdog pings are "
                            "dropped and state changes sent again later, without waiting", self.address)
        except OSError as err:  # systemd went away (the socket file is gone): nothing to send to
            if not self._said_failed:
                self._said_failed = True
                log.warning("systemd's notify socket %s failed (%s)", self.address, err)
        return False

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
