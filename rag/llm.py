"""Chat models behind one interface; Ollama is the one we run.

Streamed tokens, a timeout for the whole answer, a stall watchdog (no token for
``stall_timeout`` once the answer has started; before its first token the model may
still be reading a long prompt, so only the whole answer's timeout applies), and
retries with backoff on connection errors only (a refused connection before the first
token), never on a model error or mid-answer. The client's own default timeout is
none, so ours is always set. Each reply's token counts and durations, as Ollama
reports them, are handed back in a ``Usage`` (the machine's speed, ``rag.speed``).

The chat itself is read here, line by line from ``/api/chat`` (NDJSON) with httpx: the
``ollama`` client (0.6.3) drops the counts it does not know from the final line, and
``prompt_eval_cached_count`` (the prompt tokens Ollama read from its cache) is what makes a
reply's reading speed true. Closing the stream (a caller that stops reading: an answer that
repeats itself, a cancelled question) closes the HTTP response, and Ollama stops writing.
The ``ollama`` client still answers ``check`` (``/api/show``).

Errors are mapped once, here: a missing model is ``ModelMissing`` (``ollama pull``),
everything else that stops an answer is ``Unavailable``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import AsyncIterator, Protocol

from rag.config import OllamaConfig
from rag.errors import ModelMissing, Unavailable
from rag.http import tls
from rag.redact import safe_url
from rag.speed import Usage

log = logging.getLogger(__name__)

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}


class ChatModel(Protocol):
    model_id: str
    model: str  # the model's own name (speeds are kept per model)

    def stream(self, messages: list[Message], *, usage: Usage | None = None, options: dict | None = None,
               format: dict | None = None, timeout: float | None = None) -> AsyncIterator[str]:
        """The answer's text, piece by piece. ``usage`` is filled in when the reply ends;
        ``options`` add to the model's options (e.g. ``num_predict``); ``format`` is a JSON
        schema the reply must follow; ``timeout`` replaces ``ollama.timeout`` for this call."""
        ...

    async def complete(self, messages: list[Message], **kwargs) -> str: ...

    async def check(self) -> str:
        """Raise (ModelMissing, Unavailable) unless the model can answer; a description."""
        ...


class OllamaChat:
    def __init__(self, cfg: OllamaConfig):
        import httpx
        import ollama

        self.cfg = cfg
        self.model = cfg.model
        self.model_id = f"ollama:{cfg.model}"
        self.where = safe_url(cfg.host)  # for messages: never the user:password@ of the URL
        self._ollama = ollama
        self._httpx = httpx
        self._client = ollama.AsyncClient(host=cfg.host, timeout=httpx.Timeout(cfg.timeout, connect=10.0),
                                          verify=tls())
        self._http = httpx.AsyncClient(base_url=cfg.host, timeout=httpx.Timeout(cfg.timeout, connect=10.0),
                                       verify=tls(), follow_redirects=True,
                                       headers={"Content-Type": "application/json", "Accept": "application/json"})
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
        if isinstance(err, ConnectionRefusedError) or (
                isinstance(err, self._httpx.ConnectError) and ("All connection attempts failed" in str(err)
                                                              or "refused" in str(err).lower())):
            return Unavailable(f"cannot reach Ollama at {self.where}: nothing answers there; start Ollama, "
                               f"or set ollama.enabled: false")
        return Unavailable(safe_url(f"cannot reach Ollama at {self.where}: {err}"))

    def _refused(self, err: Exception) -> bool:
        return isinstance(err, (ConnectionError, self._httpx.ConnectError))

    async def stream(self, messages: list[Message], *, usage: Usage | None = None, options: dict | None = None,
                     format: dict | None = None, timeout: float | None = None) -> AsyncIterator[str]:
        timeout = timeout or self.cfg.timeout
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            started = False
            try:
                body = {"model": self.cfg.model, "messages": messages, "stream": True,
                        "options": {**self.options, **(options or {})}, "keep_alive": self.cfg.keep_alive}
                if format is not None:
                    body["format"] = format
                iterator = self._lines(body)
                try:
                    while True:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise Unavailable(f"Ollama's answer took longer than {timeout:g} s")
                        wait = min(self.cfg.stall_timeout, left) if started else left
                        try:
                            # in this task (not a task of its own, as wait_for makes): a
                            # cancelled answer closes the reply's stream behind it
                            async with asyncio.timeout(wait):
                                part = await iterator.__anext__()
                        except StopAsyncIteration:
                            return
                        except TimeoutError:
                            if not started:
                                raise Unavailable(f"Ollama's answer took longer than {timeout:g} s") from None
                            raise Unavailable(f"Ollama stalled: no token for {self.cfg.stall_timeout:g} s") from None
                        text = (part.get("message") or {}).get("content") or ""
                        if text:
                            started = True
                            yield text
                        if part.get("done"):
                            if usage is not None:
                                _fill(usage, part)
                            return
                finally:
                    await iterator.aclose()  # the HTTP response goes back at once, read or not
            except (Unavailable, ModelMissing):
                raise
            except Exception as err:
                if self._refused(err) and not started and attempt < self.cfg.connect_retries:
                    attempt += 1
                    delay = 0.5 * 2 ** (attempt - 1)
                    log.debug("Ollama refused the connection; retry %d in %.1f s", attempt, delay)
                    await asyncio.sleep(delay)
                    continue
                raise self._error(err) from None

    async def _lines(self, body: dict) -> AsyncIterator[dict]:
        """``/api/chat``'s reply, one parsed line at a time; closed, the response is closed.
        Errors as the ``ollama`` client raises them (``_error`` maps them)."""
        async with self._http.stream("POST", "/api/chat", json=body) as response:
            if response.status_code >= 400:
                await response.aread()
                raise self._ollama.ResponseError(response.text, response.status_code)
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                part = json.loads(line)
                if part.get("error"):
                    raise self._ollama.ResponseError(part["error"])
                yield part

    async def complete(self, messages: list[Message], **kwargs) -> str:
        return "".join([part async for part in self.stream(messages, **kwargs)])

    async def check(self) -> str:
        """Is it Ollama (``GET /api/version``), and is the model there (``/api/show``)?"""
        try:
            async with self._httpx.AsyncClient(timeout=10.0, verify=tls()) as http:
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


def _fill(usage: Usage, part: dict) -> None:
    """Ollama's counts (durations in nanoseconds) from a reply's last line."""
    usage.prompt_tokens = part.get("prompt_eval_count") or 0
    usage.prompt_seconds = (part.get("prompt_eval_duration") or 0) / 1e9
    usage.output_tokens = part.get("eval_count") or 0
    usage.output_seconds = (part.get("eval_duration") or 0) / 1e9
    usage.load_seconds = (part.get("load_duration") or 0) / 1e9
    cached = part.get("prompt_eval_cached_count")
    usage.cached_tokens = cached if isinstance(cached, int) and cached >= 0 else None


class NotOllama(Unavailable):
    """Something answers at ollama.host, but not Ollama's API."""


def _is_missing_model(error: str) -> bool:
    """Ollama's own words for a model that is not pulled (not any server's 404 page)."""
    error = error.lower()
    return "model" in error and "not found" in error


def load(cfg: OllamaConfig) -> ChatModel | None:
    return OllamaChat(cfg) if cfg.enabled else None
