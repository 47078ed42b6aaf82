"""Chat models behind one interface; Ollama (the ``ollama`` client, async) is the one we run.

Streamed tokens, a timeout for the whole answer, a stall watchdog (no token for
``stall_timeout``), and retries with backoff on connection errors only (a refused
connection before the first token), never on a model error or mid-answer. The
client's own default timeout is none, so ours is always set.

Errors are mapped once, here: a missing model is ``ModelMissing`` (``ollama pull``),
everything else that stops an answer is ``Unavailable``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Protocol

from .config import OllamaConfig
from .errors import ModelMissing, Unavailable
from .redact import safe_url

log = logging.getLogger(__name__)

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}


class ChatModel(Protocol):
    model_id: str

    def stream(self, messages: list[Message]) -> AsyncIterator[str]:
        """The answer's text, piece by piece."""
        ...

    async def complete(self, messages: list[Message]) -> str: ...

    async def check(self) -> str:
        """Raise (ModelMissing, Unavailable) unless the model can answer; a description."""
        ...


class OllamaChat:
    def __init__(self, cfg: OllamaConfig):
        import httpx
        import ollama

        self.cfg = cfg
        self.model_id = f"ollama:{cfg.model}"
        self.where = safe_url(cfg.host)  # for messages: never the user:password@ of the URL
        self._ollama = ollama
        self._httpx = httpx
        self._client = ollama.AsyncClient(host=cfg.host, timeout=httpx.Timeout(cfg.timeout, connect=10.0))
        self.options = {"temperature": cfg.temperature, "num_ctx": cfg.num_ctx}

    def _error(self, err: Exception) -> Exception:
        if isinstance(err, self._ollama.ResponseError):
            if err.status_code == 404 and _is_missing_model(str(err.error)):
                return ModelMissing(f"Ollama at {self.where} has no model {self.cfg.model!r}: run `ollama pull {self.cfg.model}`")
            if err.status_code == 404:
                return NotOllama(f"{self.where} answered HTTP 404 to Ollama's API: it is not an Ollama server "
                                 f"(check ollama.host)")
            return Unavailable(f"Ollama failed: {err.error}")
        if isinstance(err, (self._httpx.TimeoutException, asyncio.TimeoutError)):
            return Unavailable(f"Ollama at {self.where} did not answer in time")
        return Unavailable(safe_url(f"cannot reach Ollama at {self.where}: {err}"))

    def _refused(self, err: Exception) -> bool:
        return isinstance(err, (ConnectionError, self._httpx.ConnectError))

    async def stream(self, messages: list[Message]) -> AsyncIterator[str]:
        deadline = time.monotonic() + self.cfg.timeout
        attempt = 0
        while True:
            started = False
            try:
                response = await self._client.chat(
                    model=self.cfg.model, messages=messages, stream=True, options=self.options, keep_alive=self.cfg.keep_alive
                )
                iterator = response.__aiter__()
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise Unavailable(f"Ollama's answer took longer than {self.cfg.timeout:g} s")
                    try:
                        part = await asyncio.wait_for(iterator.__anext__(), timeout=min(self.cfg.stall_timeout, left))
                    except StopAsyncIteration:
                        return
                    except asyncio.TimeoutError:
                        raise Unavailable(f"Ollama stalled: no token for {self.cfg.stall_timeout:g} s") from None
                    text = part.message.content or "" if part.message else ""
                    if text:
                        started = True
                        yield text
                    if part.done:
                        return
            except (Unavailable, ModelMissing):
                raise
            except Exception as err:
                if self._refused(err) and not started and attempt < self.cfg.connect_retries:
                    attempt += 1
                    delay = 0.5 * 2 ** (attempt - 1)
                    log.info("Ollama refused the connection; retry %d in %.1f s", attempt, delay)
                    await asyncio.sleep(delay)
                    continue
                raise self._error(err) from None

    async def complete(self, messages: list[Message]) -> str:
        return "".join([part async for part in self.stream(messages)])

    async def check(self) -> str:
        """Is it Ollama (``GET /api/version``), and is the model there (``/api/show``)?"""
        try:
            async with self._httpx.AsyncClient(timeout=10.0) as http:
                reply = await http.get(f"{self.cfg.host.rstrip('/')}/api/version")
            version = reply.json().get("version") if reply.status_code == 200 else None
        except ValueError:
            version = None
        except Exception as err:
            raise self._error(err) from None
        if not version:
            raise NotOllama(f"{self.where} is not an Ollama server (GET /api/version gave HTTP "
                            f"{reply.status_code}): check ollama.host")
        try:
            info = await self._client.show(self.cfg.model)
        except Exception as err:
            raise self._error(err) from None
        details = getattr(info, "details", None)
        size = getattr(details, "parameter_size", None) if details else None
        return f"{self.cfg.model} is pulled" + (f" ({size})" if size else "")


class NotOllama(Unavailable):
    """Something answers at ollama.host, but not Ollama's API."""


def _is_missing_model(error: str) -> bool:
    """Ollama's own words for a model that is not pulled (not any server's 404 page)."""
    error = error.lower()
    return "model" in error and "not found" in error


def load(cfg: OllamaConfig) -> ChatModel | None:
    return OllamaChat(cfg) if cfg.enabled else None
