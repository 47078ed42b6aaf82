"""A fake Telegram Bot API server on 127.0.0.1: python-telegram-bot talks to it through
``base_url`` exactly as to api.telegram.org (``POST /bot<token>/<method>``, form or JSON
bodies, ``{"ok": true, "result": ...}`` answers).

Methods: getMe, deleteWebhook, getUpdates (long polling by offset), sendMessage,
editMessageText, sendChatAction, setMyCommands. Like Telegram it refuses an edit that
changes nothing (400 "message is not modified"), HTML that does not parse (400
"can't parse entities"), and, on request, answers 429 with ``retry_after``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlparse

from . import LocalServer, QuietHandler

BOT = {"id": 7000001, "is_bot": True, "first_name": "Notes", "username": "notes_bot", "can_join_groups": True,
       "can_read_all_group_messages": False, "supports_inline_queries": False}
ALLOWED_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a", "code", "pre", "blockquote",
                "tg-spoiler", "span", "tg-emoji"}


class _Checker(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.error: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag not in ALLOWED_TAGS:
            self.error = self.error or f"unsupported start tag \"{tag}\""
        self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.error = self.error or f"can't find end tag corresponding to start tag \"{tag}\""
        else:
            self.stack.pop()


def html_error(text: str) -> str | None:
    if re.search(r"&(?!(amp|lt|gt|quot|#\d+);)", text):
        return "unsupported entity"
    checker = _Checker()
    checker.feed(text)
    checker.close()
    if checker.stack and not checker.error:
        return f"can't find end tag for \"{checker.stack[-1]}\""
    return checker.error


class FakeTelegram(LocalServer):
    def __init__(self, token: str = "123:TEST"):
        self.token = token
        self.updates: list[dict] = []
        self.messages: dict[int, dict] = {}  # message_id -> {chat_id, text, parse_mode, edits}
        self.calls: list[tuple[str, dict, float]] = []
        self.commands: list = []
        self.throttle: dict[str, list[int]] = {}  # method -> [times, retry_after]
        self.unauthorized = 0  # calls with a wrong token
        self.no_private_chat: set[int] = set()  # users who never opened a private chat with the bot
        self._next_update = 1
        self._next_message = 100
        self.cond = threading.Condition()
        fake = self

        class Handler(QuietHandler):
            def do_POST(self):
                path = urlparse(self.path).path
                m = re.match(r"^/bot([^/]+)/(\w+)$", path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode() if length else ""
                if not m or m.group(1) != fake.token:
                    fake.unauthorized += 1
                    return self._send(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
                params = fake._params(raw, self.headers.get("Content-Type", ""))
                status, body = fake.handle(m.group(2), params)
                self._send(status, body)

            do_GET = do_POST

            def _send(self, status, body):
                data = json.dumps(body, ensure_ascii=False).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.base_url = self._listen(Handler) + "/bot"

    # --- controls ----------------------------------------------------------------------------

    def throttle_next(self, method: str, times: int = 1, retry_after: int = 1) -> None:
        self.throttle[method] = [times, retry_after]

    def say(self, user_id: int, text: str, chat_id: int | None = None, chat_type: str = "private",
            reply_to_bot: bool = False) -> None:
        """A user writes to the bot (a command if it starts with /)."""
        chat_id = chat_id if chat_id is not None else user_id
        message = {"message_id": self._next_message, "date": int(time.time()),
                   "chat": {"id": chat_id, "type": chat_type},
                   "from": {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"}, "text": text}
        self._next_message += 1
        if text.startswith("/"):
            message["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
        if reply_to_bot:
            message["reply_to_message"] = {"message_id": 1, "date": int(time.time()), "chat": message["chat"],
                                           "from": BOT, "text": "earlier"}
        with self.cond:
            self.updates.append({"update_id": self._next_update, "message": message})
            self._next_update += 1
            self.cond.notify_all()

    def sent_to(self, chat_id: int) -> list[dict]:
        return [m for m in self.messages.values() if m["chat_id"] == chat_id]

    def method_calls(self, method: str) -> list[dict]:
        return [p for name, p, _ in self.calls if name == method]

    # --- the API ---------------------------------------------------------------------------

    @staticmethod
    def _params(raw: str, content_type: str) -> dict:
        if "json" in content_type:
            return json.loads(raw or "{}")
        params = {k: v[-1] for k, v in parse_qs(raw).items()}
        for key, value in params.items():
            if value[:1] in "[{":
                try:
                    params[key] = json.loads(value)
                except ValueError:
                    pass
        return params

    def _message(self, message_id: int, chat_id: int, text: str) -> dict:
        return {"message_id": message_id, "date": int(time.time()), "chat": {"id": int(chat_id), "type": "private"},
                "from": BOT, "text": text}

    def handle(self, method: str, p: dict):
        with self.cond:
            self.calls.append((method, p, time.monotonic()))
            throttle = self.throttle.get(method)
            if throttle and throttle[0] > 0:
                throttle[0] -= 1
                return 429, {"ok": False, "error_code": 429, "description": f"Too Many Requests: retry after {throttle[1]}",
                             "parameters": {"retry_after": throttle[1]}}
        if method == "getMe":
            return 200, {"ok": True, "result": BOT}
        if method in ("deleteWebhook", "sendChatAction"):
            return 200, {"ok": True, "result": True}
        if method == "setMyCommands":
            self.commands = p.get("commands")
            return 200, {"ok": True, "result": True}
        if method == "getUpdates":
            offset = int(p.get("offset") or 0)
            deadline = time.monotonic() + min(float(p.get("timeout") or 0), 0.5)
            with self.cond:
                while True:
                    ready = [u for u in self.updates if u["update_id"] >= offset]
                    left = deadline - time.monotonic()
                    if ready or left <= 0:
                        return 200, {"ok": True, "result": ready}
                    self.cond.wait(left)
        if method in ("sendMessage", "editMessageText"):
            text = str(p.get("text", ""))
            if p.get("parse_mode") == "HTML":
                problem = html_error(text)
                if problem:
                    return 400, {"ok": False, "error_code": 400, "description": f"Bad Request: can't parse entities: {problem}"}
            if len(text) > 4096:
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: message is too long"}
            with self.cond:
                if method == "sendMessage" and int(p["chat_id"]) in self.no_private_chat:
                    return 403, {"ok": False, "error_code": 403,
                                 "description": "Forbidden: bot can't initiate conversation with a user"}
                if method == "sendMessage":
                    mid = self._next_message
                    self._next_message += 1
                    self.messages[mid] = {"chat_id": int(p["chat_id"]), "text": text, "parse_mode": p.get("parse_mode"),
                                          "edits": [], "preview_off": _no_preview(p)}
                    return 200, {"ok": True, "result": self._message(mid, p["chat_id"], text)}
                mid = int(p["message_id"])
                msg = self.messages.get(mid)
                if msg is None:
                    return 400, {"ok": False, "error_code": 400, "description": "Bad Request: message to edit not found"}
                if msg["text"] == text and msg["parse_mode"] == p.get("parse_mode"):
                    return 400, {"ok": False, "error_code": 400,
                                 "description": "Bad Request: message is not modified: specified new message content "
                                                "and reply markup are exactly the same"}
                msg["edits"].append((time.monotonic(), text))
                msg.update(text=text, parse_mode=p.get("parse_mode"), preview_off=_no_preview(p))
                return 200, {"ok": True, "result": self._message(mid, msg["chat_id"], text)}
        return 404, {"ok": False, "error_code": 404, "description": "Not Found"}


def _no_preview(p: dict) -> bool:
    options = p.get("link_preview_options")
    return bool(isinstance(options, dict) and options.get("is_disabled")) or p.get("disable_web_page_preview") in (True, "true")
