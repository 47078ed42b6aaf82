"""A fake Ollama server on 127.0.0.1 speaking the real HTTP API that the ``ollama``
client uses. Embeddings are deterministic bags of character bigrams, so texts that
share words are close, as with a real model.

Served: ``POST /api/embed``, ``POST /api/chat`` (streamed NDJSON or one JSON object),
``GET /api/tags``, ``GET /api/version``, ``POST /api/show``; an unknown model gets HTTP 404
``{"error": "model ... not found, try pulling it first"}`` as Ollama does.

Chat replies are scripted with ``reply(...)``: the text in pieces, optionally a stall
after some pieces (the connection stays open, nothing more is sent) or an error
line mid-stream. Unscripted chats answer "(no reply scripted)".
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass

import numpy as np

from . import LocalServer, QuietHandler

DIM = 64


def fake_embedding(text: str, dim: int = DIM) -> list[float]:
    v = np.zeros(dim, dtype=np.float64)
    text = text.lower()
    for i in range(len(text) - 1):
        h = int.from_bytes(hashlib.blake2b(text[i : i + 2].encode(), digest_size=4).digest(), "little")
        v[h % dim] += 1.0
    n = np.linalg.norm(v)
    return (v / n if n else v).tolist()


@dataclass
class Reply:
    pieces: list[str]
    stall_after: int | None = None  # stop sending after this many pieces (and hang)
    error_after: int | None = None  # send {"error": ...} after this many pieces
    delay: float = 0.0  # seconds before each piece


class FakeOllama(LocalServer):
    def __init__(self, models=("bge-m3", "qwen2.5:7b-instruct")):
        self.models = set(models)
        self.requests: list[tuple[str, dict]] = []
        self.replies: list[Reply] = []
        self.release = threading.Event()  # set to end every stall
        fake = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.0"

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

            def _line(self, obj: dict) -> None:
                data = (json.dumps(obj, ensure_ascii=False) + "\n").encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _stream(self, model: str, reply: Reply) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                for i, piece in enumerate(reply.pieces):
                    if reply.stall_after is not None and i >= reply.stall_after:
                        fake.release.wait(timeout=60)
                        return
                    if reply.error_after is not None and i >= reply.error_after:
                        self._line({"error": "an error was encountered while running the model"})
                        break
                    if reply.delay:
                        time.sleep(reply.delay)
                    self._line({"model": model, "created_at": "2025-01-01T00:00:00Z",
                                "message": {"role": "assistant", "content": piece}, "done": False})
                else:
                    self._line({"model": model, "created_at": "2025-01-01T00:00:00Z",
                                "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop",
                                "total_duration": 1, "eval_count": len(reply.pieces)})
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                self.close_connection = True

            def _missing(self, model: str) -> None:
                self._send(404, {"error": f"model \"{model}\" not found, try pulling it first"})

            def do_GET(self):
                fake.requests.append((self.path, {}))
                if self.path == "/api/tags":
                    self._send(200, {"models": [{"name": m, "model": m} for m in sorted(fake.models)]})
                elif self.path == "/api/version":
                    self._send(200, {"version": "0.12.0"})
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
                elif self.path == "/api/chat":
                    if model not in fake.models:
                        return self._missing(model)
                    reply = fake.replies.pop(0) if fake.replies else Reply(["(no reply scripted)"])
                    if body.get("stream", True):
                        self._stream(model, reply)
                    else:
                        text = "".join(reply.pieces)
                        self._send(200, {"model": model, "message": {"role": "assistant", "content": text}, "done": True})
                elif self.path == "/api/show":
                    if model not in fake.models:
                        return self._missing(model)
                    self._send(200, {"modelfile": "", "details": {"family": "fake"}, "model_info": {}})
                else:
                    self._send(404, {"error": "not found"})

        self.url = self._listen(Handler)

    def reply(self, *pieces: str, stall_after: int | None = None, error_after: int | None = None, delay: float = 0.0) -> None:
        """Script the next chat reply."""
        self.replies.append(Reply(list(pieces), stall_after, error_after, delay))

    def chats(self) -> list[dict]:
        return [body for path, body in self.requests if path == "/api/chat"]

    def before_stop(self) -> None:
        self.release.set()  # end every stalled reply
