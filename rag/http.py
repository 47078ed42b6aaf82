"""What our HTTP clients share: one TLS context per process.

httpx makes a TLS context for every client it builds (it reads the whole CA bundle: ~15 ms of
CPU), even for a client that only ever speaks plain HTTP or over a Unix socket. The clients of
Ollama, of the daemon's API and of the Ollama probe are built per service, command and check;
``tls()`` gives them one context, made as httpx makes its own (``$SSL_CERT_FILE``,
``$SSL_CERT_DIR``, else certifi's bundle), so that what is trusted is the same.
"""

from __future__ import annotations

import ssl
from functools import lru_cache


@lru_cache(maxsize=1)
def tls() -> ssl.SSLContext:
    """The process's TLS context for httpx (``verify=tls()``), made on first use."""
    import httpx

    return httpx.create_ssl_context()
