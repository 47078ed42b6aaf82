"""A fake Ollama server on 127.0.0.1 speaking the real HTTP API that the ``ollama``
client uses. Embeddings are deterministic bags of character bigrams, so texts that
share words are close, as with a real model.

Served: ``POST /api/embed``, ``GET /api/tags``, ``POST /api/show``; an unknown model
gets HTTP 404 ``{"error": "model ... not found, try pulling it first"}`` as Ollama does.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

DIM = 64


def fake_embedding(text: str, dim: int = DIM) -> list[float]:
    v = np.zeros(dim, dtype=np.float64)
    text = text.lower()
    for i in range(len(text) - 1):
        h = int.from_bytes(hashlib.blake2b(text[i : i + 2].encode(), digest_size=4).digest(), "little")
        v[h % dim] += 1.0
    n = np.linalg.norm(v)
    return (v / n if n else v).tolist()


class FakeOllama:
    def __init__(self, models=("bge-m3",)):
        self.models = set(models)
        self.requests: list[tuple[str, dict]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            # one buffered write per response (flushed after each request), no Nagle delay:
            # as a Go server answers, without a 40 ms delayed-ACK stall per call
            wbufsize = 1 << 16
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def _missing(self, model: str) -> None:
                self._send(404, {"error": f"model \"{model}\" not found, try pulling it first"})

            def do_GET(self):
                fake.requests.append((self.path, {}))
                if self.path == "/api/tags":
                    self._send(200, {"models": [{"name": m, "model": m} for m in sorted(fake.models)]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self):
                body = self._body()
                fake.requests.append((self.path, body))
                model = body.get("model", "")
                if self.path == "/api/embed":
                    if model not in fake.models:
                        return self._missing(model)
                    inputs = body.get("input")
                    inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
                    self._send(200, {"model": model, "embeddings": [fake_embedding(t) for t in inputs]})
                elif self.path == "/api/show":
                    if model not in fake.models:
                        return self._missing(model)
                    self._send(200, {"modelfile": "", "details": {"family": "fake"}, "model_info": {}})
                else:
                    self._send(404, {"error": "not found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOllama":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
