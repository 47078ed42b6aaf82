"""Local stand-ins for services that cannot run here, speaking their real wire protocols."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    """Request handler settings every fake shares: keep-alive, and one buffered write per
    response with no Nagle delay (as real servers answer: no 40 ms delayed-ACK stall per
    call), and no access log on stderr."""

    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client that hangs up mid-answer (a deadline, a stop) is normal here, not news."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LocalServer:
    """A threaded HTTP server on 127.0.0.1: started on ``with``, stopped after it."""

    def _listen(self, handler) -> str:
        self.server = _Server(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.before_stop()
        self.server.shutdown()
        self.server.server_close()

    def before_stop(self) -> None:
        """Release anything that would keep a request open."""
