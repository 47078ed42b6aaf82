"""A fake Telegram Bot API server on 127.0.0.1: python-telegram-bot talks to it through
``base_url`` exactly as to api.telegram.org (``POST /bot<token>/<method>``, form or JSON
bodies, ``{"ok": true, "result": ...}`` answers).

Methods: getMe, deleteWebhook, getUpdates (long polling by offset; as in Telegram, an
offset confirms every update below it, which is never sent again, also to a bot that
restarts and asks without one; ``limit``; a negative offset), sendMessage,
editMessageText, editMessageReplyMarkup, deleteMessage (the message kept, marked ``deleted``),
answerCallbackQuery, getFile, sendChatAction,
setMyCommands, and file downloads (``GET /file/bot<token>/<file_path>``). Like Telegram
it refuses an edit that changes nothing (400 "message is not modified"), HTML that does
not parse (400 "can't parse entities"), ``getFile`` past 20 MB (400 "file is too big"),
drops the inline keyboard of a message edited without one, and, on request, answers
429 with ``retry_after`` or (``bad_gateway_on_confirm``) 502 Bad Gateway to every poll that
would confirm an update: Telegram's front answers so at times, and what such a poll would
have confirmed is sent again to the next poll, also to a bot started anew.

Updates: ``say`` (text or a command), ``forward`` (with a ``forward_origin``: see
``origin_user``, ``origin_hidden``, ``origin_chat``, ``origin_channel``), ``reply``,
``send_photo``, ``send_document``, ``send_voice`` (register the bytes first with ``add_file``) and
``press`` (a button under one of the bot's messages: a ``callback_query``; a message of the bot's
sent as a reply, ``reply_parameters``, carries the message it answers as ``reply_to_message``).
"""

from __future__ import annotations

import json
import re
import threading
import time
from html.parser import HTMLParser
from urllib.parse import parse_qs, unquote, urlparse

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


def visible(text: str) -> str:
    """A message's text as Telegram shows it: without the tags of its HTML, entities as their characters."""
    import html as _html

    return _html.unescape(re.sub(r"<[^>]*>", "", text))


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
        self.files: dict[str, dict] = {}  # file_id -> {data, file_size, file_path}
        self.downloads: list[str] = []  # file_ids whose bytes were fetched
        self.user_messages: dict[int, dict] = {}  # message_id -> what a user sent (for replies)
        self.chat_types: dict[int, str] = {}  # chat id -> its type, as seen in updates
        self._next_update = 1
        self.confirmed = 0  # updates below this id were confirmed by an offset: gone for good
        self.bad_gateway_on_confirm = False  # a poll confirming an update: 502, nothing confirmed
        self.holds: dict[str, threading.Event] = {}  # method -> its next call waits for this event
        self._next_query = 1
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
                self._send(status, body, content_type="text/html" if isinstance(body, bytes) else "application/json")

            def do_GET(self):
                path = unquote(urlparse(self.path).path)  # the client sends the token's ':' as %3A
                m = re.match(r"^/file/bot([^/]+)/(.+)$", path)
                if not m:
                    return self.do_POST()
                if m.group(1) != fake.token:
                    fake.unauthorized += 1
                    return self._send(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
                found = next(((fid, f) for fid, f in fake.files.items() if f["file_path"] == m.group(2)), None)
                if found is None:
                    return self._send(404, {"ok": False, "error_code": 404, "description": "Not Found"})
                with fake.cond:
                    fake.downloads.append(found[0])
                self._send(200, found[1]["data"], content_type="application/octet-stream")

            def _send(self, status, body, content_type="application/json"):
                data = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.base_url = self._listen(Handler) + "/bot"

    # --- controls ----------------------------------------------------------------------------

    def hold(self, method: str) -> threading.Event:
        """The next ``method`` call is received and then waits (up to a minute) until the
        returned event is set."""
        event = threading.Event()
        with self.cond:
            self.holds[method] = event
        return event

    def throttle_next(self, method: str, times: int = 1, retry_after: int = 1) -> None:
        self.throttle[method] = [times, retry_after]

    def say(self, user_id: int, text: str, chat_id: int | None = None, chat_type: str = "private",
            reply_to_bot: bool = False) -> dict:
        """A user writes to the bot (a command if it starts with /); the message sent."""
        message = self._user_message(user_id, chat_id, chat_type, text=text)
        if reply_to_bot:
            message["reply_to_message"] = {"message_id": 1, "date": int(time.time()), "chat": message["chat"],
                                           "from": BOT, "text": "earlier"}
        return self._push(message)

    def forward(self, user_id: int, text: str = "", *, origin: dict, chat_id: int | None = None,
                chat_type: str = "private", photo: str | None = None, document: str | None = None,
                file_name: str = "file.bin", mime_type: str = "application/octet-stream",
                extra: dict | None = None) -> dict:
        """A user forwards a message (``origin``: where it came from) to the bot: text, or a
        photo or document (a registered file id) with ``text`` as its caption, or with
        ``extra`` any other fields (a sticker...) and no text."""
        message = self._user_message(user_id, chat_id, chat_type, text=text, photo=photo, document=document,
                                     file_name=file_name, mime_type=mime_type, command=False)
        if extra:
            if not text:
                message.pop("text", None)
            message.update(extra)
        message["forward_origin"] = origin
        return self._push(message)

    def reply(self, user_id: int, text: str, to: int, chat_id: int | None = None, chat_type: str = "private") -> dict:
        """A user answers message ``to`` (one of theirs, or the bot's) with ``text``."""
        message = self._user_message(user_id, chat_id, chat_type, text=text)
        if to in self.user_messages:
            message["reply_to_message"] = self.user_messages[to]
        else:
            bot_message = self.messages[to]
            message["reply_to_message"] = self._message(to, bot_message["chat_id"], bot_message["text"])
        return self._push(message)

    def send_photo(self, user_id: int, file_id: str, caption: str = "", chat_id: int | None = None,
                   chat_type: str = "private") -> dict:
        """A user sends a photo (a registered file id), with a caption."""
        return self._push(self._user_message(user_id, chat_id, chat_type, text=caption, photo=file_id))

    def send_document(self, user_id: int, file_id: str, file_name: str, mime_type: str = "application/octet-stream",
                      caption: str = "", chat_id: int | None = None, chat_type: str = "private") -> dict:
        """A user sends a file (a registered file id), with a caption."""
        return self._push(self._user_message(user_id, chat_id, chat_type, text=caption, document=file_id,
                                             file_name=file_name, mime_type=mime_type))

    def send_voice(self, user_id: int, file_id: str, duration: int, caption: str = "", chat_id: int | None = None,
                   chat_type: str = "private", audio: bool = False, file_name: str = "clip.ogg",
                   mime_type: str = "audio/ogg") -> dict:
        """A user sends a voice message (or, with ``audio``, an audio file) of ``duration``
        seconds (a registered file id), with a caption."""
        message = self._user_message(user_id, chat_id, chat_type, text=caption, voice=file_id)
        if audio:
            message["audio"] = {**message.pop("voice"), "file_name": file_name, "mime_type": mime_type}
        message["audio" if audio else "voice"]["duration"] = duration
        return self._push(message)

    def send_again(self, message: dict) -> dict:
        """A message a user sent, delivered again in a new update (as Telegram does when a
        poll's confirmation was lost)."""
        return self._push(dict(message))

    def add_file(self, file_id: str, data: bytes, file_size: int | None = None) -> None:
        """A file Telegram holds; ``file_size``: what Telegram says its size is (default: the real one)."""
        self.files[file_id] = {"data": data, "file_size": len(data) if file_size is None else file_size,
                               "file_path": f"documents/{file_id}.bin"}

    def press(self, user_id: int, chat_id: int, message_id: int, data: str) -> str:
        """A user presses the button carrying ``data`` under the bot's message; the query id."""
        bot_message = self.messages[message_id]
        assert int(bot_message["chat_id"]) == int(chat_id), "that message is in another chat"
        with self.cond:
            query_id = f"q{self._next_query}"
            self._next_query += 1
            message = self._message(message_id, chat_id, bot_message["text"])
            if bot_message.get("reply_markup"):
                message["reply_markup"] = bot_message["reply_markup"]
            replied = self.user_messages.get(bot_message.get("reply_to") or 0)
            if replied is not None:  # as Telegram: the message it answers, without that one's own reply
                message["reply_to_message"] = {k: v for k, v in replied.items() if k != "reply_to_message"}
            self.updates.append({"update_id": self._next_update, "callback_query": {
                "id": query_id, "from": _user(user_id), "message": message, "chat_instance": f"ci{chat_id}",
                "data": data}})
            self._next_update += 1
            self.cond.notify_all()
        return query_id

    def answered(self, query_id: str | None = None) -> list[dict]:
        """The bot's answers to button presses (``text``, ``show_alert``), of one query or all."""
        return [{"query_id": p.get("callback_query_id"), "text": p.get("text") or "",
                 "show_alert": p.get("show_alert") in (True, "true", "True")}
                for p in self.method_calls("answerCallbackQuery")
                if query_id is None or p.get("callback_query_id") == query_id]

    def buttons(self, message_id: int) -> list[tuple[str, str]]:
        """The inline buttons under a message of the bot: (text, callback_data)."""
        markup = self.messages[message_id].get("reply_markup") or {}
        return [(b.get("text"), b.get("callback_data")) for row in markup.get("inline_keyboard", []) for b in row]

    def _user_message(self, user_id: int, chat_id: int | None, chat_type: str, text: str = "",
                      photo: str | None = None, document: str | None = None, file_name: str = "file.bin",
                      mime_type: str = "application/octet-stream", command: bool = True,
                      voice: str | None = None) -> dict:
        chat_id = chat_id if chat_id is not None else user_id
        with self.cond:
            message = {"message_id": self._next_message, "date": int(time.time()),
                       "chat": {"id": chat_id, "type": chat_type}, "from": _user(user_id)}
            self._next_message += 1
            self.chat_types[chat_id] = chat_type
        media = photo or document or voice
        if voice:
            message["voice"] = {"file_id": voice, "file_unique_id": f"u-{voice}", "duration": 1,
                                "mime_type": "audio/ogg", "file_size": self.files[voice]["file_size"]}
        if photo:
            size = self.files[photo]["file_size"]
            message["photo"] = [  # Telegram sends several sizes, the largest last
                {"file_id": f"{photo}-thumb", "file_unique_id": f"u-{photo}-thumb", "width": 90, "height": 60,
                 "file_size": 1000},
                {"file_id": photo, "file_unique_id": f"u-{photo}", "width": 1280, "height": 853, "file_size": size}]
        if document:
            message["document"] = {"file_id": document, "file_unique_id": f"u-{document}", "file_name": file_name,
                                   "mime_type": mime_type, "file_size": self.files[document]["file_size"]}
        key = "caption" if media else "text"
        if text or not media:
            message[key] = text
        if command and text.startswith("/"):
            message[f"{key}_entities" if media else "entities"] = [
                {"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
        return message

    def _push(self, message: dict) -> dict:
        with self.cond:
            self.user_messages[message["message_id"]] = message
            self.updates.append({"update_id": self._next_update, "message": message})
            self._next_update += 1
            self.cond.notify_all()
        return message

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
        chat_type = self.chat_types.get(int(chat_id), "private")
        return {"message_id": message_id, "date": int(time.time()), "chat": {"id": int(chat_id), "type": chat_type},
                "from": BOT, "text": text}

    def handle(self, method: str, p: dict):
        with self.cond:
            held = self.holds.pop(method, None)
        if held is not None:
            held.wait(60)
        with self.cond:
            self.calls.append((method, p, time.monotonic()))
            throttle = self.throttle.get(method)
            if throttle and throttle[0] > 0:
                throttle[0] -= 1
                return 429, {"ok": False, "error_code": 429, "description": f"Too Many Requests: retry after {throttle[1]}",
                             "parameters": {"retry_after": throttle[1]}}
        if method == "getMe":
            return 200, {"ok": True, "result": BOT}
        if method == "deleteWebhook" and p.get("drop_pending_updates") in (True, "true", "True"):
            with self.cond:
                self.confirmed = self._next_update  # what waited is dropped, as Telegram does
        if method in ("deleteWebhook", "sendChatAction", "answerCallbackQuery"):
            return 200, {"ok": True, "result": True}
        if method == "getFile":
            f = self.files.get(str(p.get("file_id")))
            if f is None:
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: invalid file_id"}
            if f["file_size"] > 20 * 1024 * 1024:
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: file is too big"}
            return 200, {"ok": True, "result": {"file_id": p["file_id"], "file_unique_id": f"u-{p['file_id']}",
                                                "file_size": f["file_size"], "file_path": f["file_path"]}}
        if method == "editMessageReplyMarkup":
            with self.cond:
                msg = self.messages.get(int(p["message_id"]))
                if msg is None:
                    return 400, {"ok": False, "error_code": 400, "description": "Bad Request: message to edit not found"}
                if msg.get("reply_markup") == (p.get("reply_markup") or None):
                    return 400, {"ok": False, "error_code": 400,
                                 "description": "Bad Request: message is not modified: specified new message content "
                                                "and reply markup are exactly the same"}
                msg["reply_markup"] = p.get("reply_markup") or None
                return 200, {"ok": True, "result": self._message(int(p["message_id"]), msg["chat_id"], msg["text"])}
        if method == "setMyCommands":
            self.commands = p.get("commands")
            return 200, {"ok": True, "result": True}
        if method == "getUpdates":
            offset = int(p.get("offset") or 0)
            limit = min(max(int(p.get("limit") or 100), 1), 100)
            deadline = time.monotonic() + min(float(p.get("timeout") or 0), 0.5)
            with self.cond:
                if offset < 0:  # the last -offset updates; every one before them is confirmed
                    waiting = [u["update_id"] for u in self.updates if u["update_id"] >= self.confirmed]
                    offset = waiting[offset] if len(waiting) >= -offset else self.confirmed
                if self.bad_gateway_on_confirm and any(self.confirmed <= u["update_id"] < offset for u in self.updates):
                    return 502, b"<html><head><title>502 Bad Gateway</title></head></html>"
                self.confirmed = max(self.confirmed, offset)
                while True:
                    ready = [u for u in self.updates if u["update_id"] >= self.confirmed][:limit]
                    left = deadline - time.monotonic()
                    if ready or left <= 0:
                        return 200, {"ok": True, "result": ready}
                    self.cond.wait(left)
        if method == "deleteMessage":  # kept, marked: tests count messages by their place
            with self.cond:
                msg = self.messages.get(int(p.get("message_id", 0)))
                if msg is None or msg.get("deleted"):
                    return 400, {"ok": False, "error_code": 400, "description": "Bad Request: message to delete not found"}
                msg["deleted"] = True
            return 200, {"ok": True, "result": True}
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
                    reply = p.get("reply_parameters") or {}
                    self.messages[mid] = {"chat_id": int(p["chat_id"]), "text": text, "parse_mode": p.get("parse_mode"),
                                          "edits": [], "preview_off": _no_preview(p),
                                          "reply_markup": p.get("reply_markup") or None,
                                          "reply_to": int(reply.get("message_id") or p.get("reply_to_message_id") or 0)
                                          if isinstance(reply, dict) else 0}
                    return 200, {"ok": True, "result": self._message(mid, p["chat_id"], text)}
                mid = int(p["message_id"])
                msg = self.messages.get(mid)
                if msg is None:
                    return 400, {"ok": False, "error_code": 400, "description": "Bad Request: message to edit not found"}
                markup = p.get("reply_markup") or None  # an edit without a keyboard removes it
                if msg["text"] == text and msg["parse_mode"] == p.get("parse_mode") and msg.get("reply_markup") == markup:
                    return 400, {"ok": False, "error_code": 400,
                                 "description": "Bad Request: message is not modified: specified new message content "
                                                "and reply markup are exactly the same"}
                msg["edits"].append((time.monotonic(), text))
                msg.update(text=text, parse_mode=p.get("parse_mode"), preview_off=_no_preview(p), reply_markup=markup)
                return 200, {"ok": True, "result": self._message(mid, msg["chat_id"], text)}
        return 404, {"ok": False, "error_code": 404, "description": "Not Found"}


def _user(user_id: int) -> dict:
    return {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"}


def origin_user(user_id: int, first_name: str, last_name: str = "", date: int | None = None) -> dict:
    """``forward_origin`` of a message first sent by a user who allows linking to them."""
    user = {"id": user_id, "is_bot": False, "first_name": first_name}
    if last_name:
        user["last_name"] = last_name
    return {"type": "user", "date": date or int(time.time()), "sender_user": user}


def origin_hidden(name: str, date: int | None = None) -> dict:
    """``forward_origin`` of a message by a user who hides their account in forwards."""
    return {"type": "hidden_user", "date": date or int(time.time()), "sender_user_name": name}


def origin_chat(chat_id: int, title: str, username: str = "", date: int | None = None) -> dict:
    """``forward_origin`` of a message sent on behalf of a group."""
    chat = {"id": chat_id, "type": "supergroup", "title": title}
    if username:
        chat["username"] = username
    return {"type": "chat", "date": date or int(time.time()), "sender_chat": chat}


def origin_channel(chat_id: int, title: str, message_id: int, username: str = "", signature: str = "",
                   date: int | None = None) -> dict:
    """``forward_origin`` of a channel post (public when it has a ``username``)."""
    chat = {"id": chat_id, "type": "channel", "title": title}
    if username:
        chat["username"] = username
    origin = {"type": "channel", "date": date or int(time.time()), "chat": chat, "message_id": message_id}
    if signature:
        origin["author_signature"] = signature
    return origin


def _no_preview(p: dict) -> bool:
    options = p.get("link_preview_options")
    return bool(isinstance(options, dict) and options.get("is_disabled")) or p.get("disable_web_page_preview") in (True, "true")
