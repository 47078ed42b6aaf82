"""A fake Ollama server on 127.0.0.1 speaking the real HTTP API that the ``ollama``
client uses. Embeddings are deterministic bags of character bigrams, so texts that
share words are close, as with a real model.

Served: ``POST /api/embed`` (``hold_embed(marker)``: requests with that text wait until
released, as a busy model makes them), ``POST /api/chat`` (streamed NDJSON or one JSON object),
``GET /api/tags``, ``GET /api/version``, ``POST /api/show``; an unknown model gets HTTP 404
``{"error": "model ... not found, try pulling it first"}`` as Ollama does.

Chat replies are scripted with ``reply(...)``: the text in pieces, optionally a stall
after some pieces (the connection stays open, nothing more is sent), a pause (until the
test lets it go on) or an error line mid-stream. Requests with Ollama's ``format`` (a JSON schema: structured output,
e.g. query expansion) take their own scripted replies, ``reply_structured(...)``, so
an expansion never takes a reply scripted for an answer. Unscripted chats answer
"(no reply scripted)", unless:

- the request has a ``format``: the reply is a JSON object with the schema's required
  fields, made of the question itself (strings and arrays of strings: the last user
  message). For query expansion that is ``{"terms": [question], "answer": question}``:
  the stand-in that repeats the question, to check that expansion never hurts;
- ``FakeOllama(reader=True)``: a stand-in LLM for the answer eval, a diligent but simple
  reader (``read_evidence``). From the answer prompt (``rag.answer.evidence.messages``) it takes
  the evidence blocks and the question line (``问题：`` or ``Question:``), picks the block whose note text shares
  the most question terms (the first such block on a tie) and replies one or two
  sentences quoted from it with its ``[n]``; when no block shares a term, exactly the
  refusal phrase the system prompt names. A follow-up rewrite prompt gets the last
  message back unchanged.

Like Ollama, the last line of a reply reports ``prompt_eval_count`` and
``prompt_eval_duration``, ``eval_count`` and ``eval_duration`` (nanoseconds). Tokens
are counted by the fake's own rule (``fake_tokens``: a CJK character is one token,
other text one per three characters), which is not the product's estimate, so its
calibration has something to learn. ``speed=(read, write)`` in tokens per second makes
the fake as slow as a machine: it reads the prompt for ``tokens / read`` seconds
before the first piece and writes each piece at ``write`` tokens a second, and reports
those durations (the model's time), not the wall time a busy machine stretched them to.
``cache=True`` keeps the start a prompt shares with the previous chat's, as a llama.cpp
server's prompt cache does: that part is not read again, and ``prompt_eval_duration``
covers only the rest while ``prompt_eval_count`` still counts the whole prompt, and
``prompt_eval_cached_count`` says how many of them came from the cache (left out when none,
as Ollama does; ``cached_count=False``: never, as an older Ollama).

``reply(..., loop=True)``: a model gone round in circles, writing its pieces again and again
until the client hangs up (at most ``LOOP_SECONDS``; then it ends as a reply cut by its
``num_predict`` does). ``hung_up`` is set when a client went away before its reply ended
(the server noticed: its writing failed), as Ollama then stops working.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass

import numpy as np

from rag.index.lexical import tokenize

from . import LocalServer, QuietHandler

DIM = 64
_CJK = re.compile(r"[\u3400-\u9fff]")
_TAG = re.compile(r"(?:正文在|text between) <(note-[0-9a-f]+)> (?:和|and) </note-[0-9a-f]+>")
_REFUSAL = re.compile(r"(?:才只回答：|reply just: )(.+?)\s*$", re.S)
# Sentence ends: Chinese punctuation, English ones followed by a space, line breaks.
_SENTENCE_END = re.compile(r"(?<=[。！？；!?])|(?<=[.;:])\s+|\n+")
_MARKERS = re.compile(r"[\[【]\s*\d[\d\s,，、]*[\]】]")
SHORT_SENTENCE = 40  # a quoted sentence this short gets the next one too
MAX_QUOTE = 300
PIECE_CHARS = 6  # a reply streams in pieces of this many characters


def fake_tokens(text: str) -> int:
    cjk = len(_CJK.findall(text))
    return cjk + (len(text) - cjk + 2) // 3


def fake_embedding(text: str, dim: int = DIM) -> list[float]:
    """A vector of the text's character pairs, each counted in its hashed bucket: texts that share
    pairs point the same way."""
    points = np.frombuffer(text.lower().encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    pairs, where = np.unique((points[:-1] << 21) | points[1:], return_inverse=True)
    buckets = np.array([_pair_hash(int(pair)) % dim for pair in pairs], dtype=np.int64)
    v = np.bincount(buckets[where], minlength=dim).astype(np.float64)
    n = np.linalg.norm(v)
    return (v / n if n else v).tolist()


_PAIR_HASHES: dict[int, int] = {}


def _pair_hash(pair: int) -> int:
    """The hash of a pair of characters (``first << 21 | second``), the same in every process; a
    corpus repeats its pairs, so each is hashed once."""
    found = _PAIR_HASHES.get(pair)
    if found is None:
        text = chr(pair >> 21) + chr(pair & 0x1FFFFF)
        found = _PAIR_HASHES[pair] = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little")
    return found


def _content(messages: list[dict], role: str, last: bool = False) -> str:
    found = [m.get("content") or "" for m in messages if m.get("role") == role]
    return (found[-1] if last else found[0]) if found else ""


def answer_prompt(messages: list[dict]) -> tuple[str, dict[int, tuple[str, str]]] | None:
    """An answer prompt (``rag.answer.evidence.messages``) read back: its question and its
    blocks, n -> (header line as shown, text); None when the user message names no
    evidence tag. Also what ``bench/reread.py`` reads recorded prompts with."""
    user = _content(messages, "user", last=True)
    tag = _TAG.search(user)
    if not tag:
        return None
    tag = tag.group(1)
    blocks = {int(n): (f"[{n}] {head}", text) for n, head, text in
              re.findall(rf"^\[(\d+)\] ([^\n]*)\n<{tag}>\n(.*?)\n</{tag}>$", user, re.M | re.S)}
    tail = user.rsplit(f"</{tag}>", 1)[-1]  # the question comes after the last block
    asked = re.findall(r"^(?:问题：|Question: )(.*)$", tail, re.M)
    return (asked[-1] if asked else ""), blocks


def is_probe(body: dict) -> bool:
    """A chat measuring the model's speed (``rag.answer.service.measure_speed``): the answer
    prompt's instructions and a question, no evidence block."""
    if isinstance(body.get("format"), dict):
        return False
    prompt = answer_prompt(body.get("messages") or [])
    return prompt is not None and not prompt[1]


def is_write_probe(body: dict) -> bool:
    """A chat measuring the model's writing speed (``rag.answer.sizing``'s ``WRITE_PROBE``)."""
    messages = body.get("messages") or []
    return len(messages) == 1 and messages[0].get("content", "").startswith("Count from 1 to 60")


def read_evidence(messages: list[dict]) -> str | None:
    """What the reader stand-in replies to an answer prompt, or None when ``messages``
    is not one (no refusal rule in the system prompt, no evidence tag named in the user's)."""
    refusal = _REFUSAL.search(_content(messages, "system"))
    prompt = answer_prompt(messages)
    if not prompt or not refusal:
        return None
    refusal = refusal.group(1).strip()
    question, shown = prompt
    blocks = [(n, text) for n, (_, text) in shown.items()]
    terms = set(tokenize(question)) if question else set()
    best, best_shared = None, 0
    for n, text in blocks:
        shared = len(terms & set(tokenize(text)))
        if shared > best_shared:  # strictly more: the first (best ranked) block wins a tie
            best, best_shared = (int(n), text), shared
    if best is None:
        return refusal
    n, text = best
    sentences = [" ".join(s.split()) for s in _SENTENCE_END.split(text)]
    sentences = [s for s in sentences if s]
    scores = [len(terms & set(tokenize(s))) for s in sentences]
    i = scores.index(max(scores))
    quote = sentences[i]
    if len(quote) < SHORT_SENTENCE and i + 1 < len(sentences):
        quote += ("" if quote[-1] in "。！？；" else " ") + sentences[i + 1]
    quote = _MARKERS.sub("", quote).strip()[:MAX_QUOTE]
    return f"{quote}[{n}]"


def follow_up(messages: list[dict]) -> str | None:
    """The reader's rewrite of a follow-up (``rag.answer.followup.messages``): the last
    message, unchanged."""
    found = re.findall(r"^Last message: (.*)$", _content(messages, "user", last=True), re.M)
    return found[-1] if found else None


def schema_reply(schema: dict, messages: list[dict]) -> str:
    """A JSON object with the schema's required fields, made of the question itself."""
    question = _content(messages, "user", last=True).strip()
    props = schema.get("properties") or {}
    out: dict = {}
    for key in schema.get("required") or list(props):
        prop = props.get(key) or {}
        kind = prop.get("type")
        if kind == "array":
            out[key] = [question]
        elif kind in ("number", "integer"):
            out[key] = 0
        elif kind == "boolean":
            out[key] = False
        elif kind == "object":
            out[key] = {}
        else:
            out[key] = question
    return json.dumps(out, ensure_ascii=False)


def _pieces(text: str) -> list[str]:
    return [text[i : i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)] or [""]


LOOP_SECONDS = 60.0  # a looping reply ends by itself after this long, when no client hung up


class Gone(Exception):
    """The client hung up while a reply was being written."""


@dataclass
class Reply:
    pieces: list[str]
    stall_after: int | None = None  # stop sending after this many pieces (and hang)
    error_after: int | None = None  # send {"error": ...} after this many pieces
    delay: float = 0.0  # seconds before each piece
    paused_after: int | None = None  # wait for ``go_on`` after this many pieces, then go on
    go_on: threading.Event | None = None
    loop: bool = False  # the pieces again and again, until the client hangs up

    def each(self):
        """The pieces to send, in order (round and round, for a looping reply)."""
        if not self.loop:
            yield from self.pieces
            return
        until = time.monotonic() + LOOP_SECONDS
        while time.monotonic() < until:
            yield from self.pieces


class FakeOllama(LocalServer):
    def __init__(self, models=("bge-m3", "qwen2.5:7b-instruct"), speed: tuple[float, float] | None = None,
                 reader: bool = False, dim: int = DIM, cache: bool = False, cached_count: bool = True):
        self.models = set(models)
        self.cache = cache
        self.cached_count = cached_count  # report prompt_eval_cached_count, as Ollama does
        self.hung_up = threading.Event()  # a client went away while its reply was written
        self.pieces_sent = 0  # of the last streamed reply
        self._last_prompt = ""  # the previous chat's prompt text (cache=True)
        self.dim = dim  # of the embeddings (bge-m3's own is 1024)
        self.embed_calls = 0  # /api/embed requests so far
        self.on_embed = None  # callback(n) run before the n-th /api/embed request is answered
        self._embed_lock = threading.Lock()
        self.speed = speed  # (prompt tokens read, tokens written) per second, or None: at once
        self.probe_reply = "好的，我会根据笔记回答。"  # to a speed measurement (the real 1.5B: the refusal, 6 tokens)
        self.reader = reader  # unscripted answer prompts: quote the best evidence block (read_evidence)
        self.requests: list[tuple[str, dict]] = []
        self.replies: list[Reply] = []
        self.structured: list[Reply] = []  # for requests with a ``format``
        self.release = threading.Event()  # set to end every stall
        self.holds: dict[str, threading.Event] = {}  # hold_embed: marker -> its release
        self.pauses: list[threading.Event] = []  # each scripted reply's go_on (reply)
        self.held: list[str] = []  # the markers of embed requests that waited, as they began to
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
                try:
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError) as err:
                    raise Gone() from err

            def _stream(self, model: str, reply: Reply, prompt_tokens: int, cached: int = 0) -> None:
                try:
                    self._streamed(model, reply, prompt_tokens, cached)
                except Gone:
                    fake.hung_up.set()  # and stop writing, as Ollama does
                    self.close_connection = True

            def _streamed(self, model: str, reply: Reply, prompt_tokens: int, cached: int = 0) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                began = time.monotonic()
                if fake.speed:  # reading the prompt, but for what the cache holds
                    time.sleep((prompt_tokens - cached) / fake.speed[0])
                read = time.monotonic() - began
                written, delays = 0, 0.0
                fake.pieces_sent = 0
                for i, piece in enumerate(reply.each()):
                    if reply.stall_after is not None and i >= reply.stall_after:
                        fake.release.wait(timeout=60)
                        return
                    if reply.paused_after == i:
                        reply.go_on.wait(timeout=60)
                    if reply.error_after is not None and i >= reply.error_after:
                        self._line({"error": "an error was encountered while running the model"})
                        break
                    if reply.delay:
                        time.sleep(reply.delay)
                        delays += reply.delay
                    if fake.speed:
                        time.sleep(fake_tokens(piece) / fake.speed[1])
                    written += fake_tokens(piece)
                    self._line({"model": model, "created_at": "2025-01-01T00:00:00Z",
                                "message": {"role": "assistant", "content": piece}, "done": False})
                    fake.pieces_sent += 1
                else:
                    total = time.monotonic() - began
                    if fake.speed:  # the model's own time, as Ollama reports it: not this busy machine's
                        read = (prompt_tokens - cached) / fake.speed[0]  # scheduling delays around the sleeps
                        total = read + written / fake.speed[1] + delays
                    counts = {"total_duration": int(total * 1e9), "load_duration": 0,
                              "prompt_eval_count": prompt_tokens, "prompt_eval_duration": max(1, int(read * 1e9)),
                              "eval_count": written, "eval_duration": max(1, int((total - read) * 1e9))}
                    if cached and fake.cached_count:  # left out when nothing came from the cache, as Ollama does
                        counts["prompt_eval_cached_count"] = cached
                    self._line({"model": model, "created_at": "2025-01-01T00:00:00Z",
                                "message": {"role": "assistant", "content": ""}, "done": True,
                                "done_reason": "length" if reply.loop else "stop", **counts})
                try:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError) as err:
                    raise Gone() from err
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
                    with fake._embed_lock:
                        fake.embed_calls += 1
                        n, hook = fake.embed_calls, fake.on_embed
                    if hook is not None:
                        hook(n)
                    inputs = body.get("input")
                    inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
                    for marker, release in list(fake.holds.items()):
                        if any(marker in t for t in inputs):  # a model slow on this text
                            fake.held.append(marker)
                            release.wait(timeout=60)
                    self._send(200, {"model": model, "embeddings": [fake_embedding(t, fake.dim) for t in inputs]})
                elif self.path == "/api/chat":
                    if model not in fake.models:
                        return self._missing(model)
                    queue = fake.structured if isinstance(body.get("format"), dict) else fake.replies
                    if is_probe(body):  # the answer service measuring the speed: not a scripted answer
                        reply = Reply(_pieces(fake.probe_reply))
                    elif is_write_probe(body):  # ... and its writing, when that reply was too short
                        reply = Reply(_pieces(" ".join(str(n) for n in range(1, 61))))
                    else:
                        reply = queue.pop(0) if queue else fake.unscripted(body)
                    text = "\n".join(m.get("content", "") for m in body.get("messages", []))
                    prompt_tokens, cached = fake_tokens(text), 0
                    if fake.cache:
                        cached = fake_tokens(os.path.commonprefix([text, fake._last_prompt]))
                        fake._last_prompt = text
                    if body.get("stream", True):
                        self._stream(model, reply, prompt_tokens, cached)
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

    def reply(self, *pieces: str, stall_after: int | None = None, error_after: int | None = None, delay: float = 0.0,
              paused_after: int | None = None, loop: bool = False) -> threading.Event:
        """Script the next chat reply. ``paused_after``: after that many pieces it waits until
        the event returned is set (a test looks at what streamed so far), then goes on.
        ``loop``: the pieces again and again until the client hangs up."""
        go_on = threading.Event()
        self.pauses.append(go_on)
        self.replies.append(Reply(list(pieces), stall_after, error_after, delay, paused_after, go_on, loop))
        return go_on

    def hold_embed(self, marker: str) -> threading.Event:
        """Embed requests with ``marker`` in one of their texts wait until the returned event
        is set (as a busy model makes them wait); ``held`` lists them as they begin to."""
        self.holds[marker] = threading.Event()
        return self.holds[marker]

    def reply_structured(self, *pieces: str, stall_after: int | None = None, delay: float = 0.0) -> None:
        """Script the next reply to a request with a ``format`` (a JSON schema)."""
        self.structured.append(Reply(list(pieces), stall_after, None, delay))

    def unscripted(self, body: dict) -> Reply:
        """The reply to a chat nobody scripted."""
        messages = body.get("messages") or []
        if isinstance(body.get("format"), dict):
            return Reply(_pieces(schema_reply(body["format"], messages)))
        if self.reader:
            text = read_evidence(messages)
            if text is None:
                text = follow_up(messages)
            if text is not None:
                return Reply(_pieces(text))
        return Reply(["(no reply scripted)"])

    def chats(self) -> list[dict]:
        """The chat requests for answers and rewrites (not structured ones: see ``structured_chats``;
        nor the speed measurements: see ``probes`` and ``write_probes``)."""
        return [body for path, body in self.requests if path == "/api/chat" and not isinstance(body.get("format"), dict)
                and not is_probe(body) and not is_write_probe(body)]

    def probes(self) -> list[dict]:
        """The answer service's speed measurements: an answer prompt with no evidence."""
        return [body for path, body in self.requests if path == "/api/chat" and is_probe(body)]

    def write_probes(self) -> list[dict]:
        """The writing speed's measurements, after a speed measurement whose reply was too short."""
        return [body for path, body in self.requests if path == "/api/chat" and is_write_probe(body)]

    def structured_chats(self) -> list[dict]:
        """The chat requests with a ``format`` (query expansions)."""
        return [body for path, body in self.requests if path == "/api/chat" and isinstance(body.get("format"), dict)]

    def before_stop(self) -> None:
        self.release.set()  # end every stalled reply
        for go_on in self.pauses:
            go_on.set()
        for release in self.holds.values():
            release.set()
