"""A fake Discord on 127.0.0.1: the real discord.py client logs in over its REST API
and connects to its WebSocket gateway exactly as to discord.com (aiohttp's web server,
in a thread of its own with its own event loop).

REST, under ``api_base`` (``http://127.0.0.1:PORT/api/v10``; discord.py reads it from
``discord.http.Route.BASE``): ``GET /users/@me``, ``GET /oauth2/applications/@me``,
``GET /gateway`` and ``/gateway/bot``, ``PUT``/``GET`` application commands (global and
per guild), ``POST /interactions/{id}/{token}/callback`` (``?with_response=1``: the
answer is an interaction callback response, ``{"interaction": {...}, "resource": {...}}``,
which discord.py 2.5+ reads), ``GET``/``PATCH``/``DELETE
/webhooks/{app}/{token}/messages/@original`` (and ``/{message_id}`` for follow-ups),
``POST /webhooks/{app}/{token}`` (follow-ups). Bodies are JSON or multipart with
``payload_json``. Bot routes need ``Authorization: Bot <token>`` (401 otherwise); an
unknown route gets Discord's 404 JSON and is recorded in ``unknown``.

Like Discord it enforces: one callback per interaction (400, code 40060), within
``callback_deadline`` seconds (404 "Unknown interaction", code 10062); no edit or
follow-up before the callback; message limits (content 2,000, 10 embeds, description
4,096, 6,000 characters of embed text per message: 400 "Invalid Form Body", 50035);
no empty messages (50006). Ephemerality is decided by the callback (``flags & 64``):
edits cannot change it, and the first follow-up to a deferred response that was never
edited *becomes* that response, with its ephemerality. On request it answers 429 with
``retry_after`` (and the ``Via`` header that makes discord.py wait and retry), or refuses
chosen edits and follow-ups (``refuse``).

Gateway (``ws://127.0.0.1:PORT/gateway``): HELLO, IDENTIFY (a wrong token closes with
4004) → READY (``user``, unavailable guild stubs, ``session_id``,
``resume_gateway_url``, ``application``) then a GUILD_CREATE per guild (its roles and
channels, which discord.py needs to resolve a member's roles), heartbeat ACKs, RESUME
(missed dispatches replayed, then RESUMED; an unknown session gets INVALID_SESSION),
RECONNECT on request. Transport compression as asked in the query string:
``compress=zlib-stream`` (one shared zlib stream per connection, each payload ending
in a Z_SYNC_FLUSH) or ``zstd-stream`` (when ``zstandard`` is installed); otherwise text
frames.

Tests drive it with ``slash(user_id, name, options, guild_id=..., channel_id=...,
roles=...)``, which sends an ``INTERACTION_CREATE`` shaped like Discord's and returns
the ``Interaction`` record, and read what each person saw: ``seen_by(user_id)``,
``public_texts()``, each interaction's ``events``, ``original`` and ``followups``.

Files, messages and buttons: ``upload(filename, data, content_type)`` is a file a
person attached (an attachment object whose ``url`` is served by this fake's CDN,
``GET /attachments/{channel}/{id}/{filename}``, each download recorded in
``downloads``); pass it as the value of an attachment option (type 11) and it goes
into ``resolved.attachments``. ``user_message(author, content, ...)`` is a message a
person wrote in a channel, and ``message_command(user, name, message, ...)`` runs a
message context-menu command on it (type 3 command, ``target_id``,
``resolved.messages``). Components a bot sends on a message are kept
(``Message.components``, ``Message.buttons()``); ``press(user, message, custom_id)``
clicks one (a ``MESSAGE_COMPONENT`` interaction carrying the message), and only a
person who can see the message can. Context-menu commands are named like Discord's
(up to 32 characters, spaces and capitals allowed, no description).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import secrets
import socket
import threading
import time
import zlib
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from aiohttp import WSMsgType, web

try:  # discord.py asks for zstd-stream when zstandard is importable
    import zstandard
except ImportError:  # pragma: no cover - depends on the environment
    zstandard = None

DISCORD_EPOCH = 1420070400000
EPHEMERAL, LOADING = 1 << 6, 1 << 7
CONTENT_LIMIT, EMBEDS_LIMIT, DESCRIPTION_LIMIT, EMBED_TOTAL_LIMIT = 2000, 10, 4096, 6000
ALL_PERMISSIONS = str((1 << 50) - 1)
OPTION_TYPES = {3: str, 4: int, 5: bool, 10: (int, float)}  # string, integer, boolean, number
ATTACHMENT_OPTION = 11
CHAT_INPUT, USER_COMMAND, MESSAGE_COMMAND = 1, 2, 3  # application command types
APPLICATION_COMMAND, MESSAGE_COMPONENT = 2, 3  # interaction types
ROWS_LIMIT, ROW_ITEMS_LIMIT, CUSTOM_ID_LIMIT, LABEL_LIMIT = 5, 5, 100, 80
_ids = itertools.count(1)


def snowflake() -> int:
    """A fresh id shaped like Discord's (creation time in the top bits)."""
    return ((int(time.time() * 1000) - DISCORD_EPOCH) << 22) | (next(_ids) % (1 << 22))


def _iso(t: float | None = None) -> str:
    return datetime.fromtimestamp(t or time.time(), tz=timezone.utc).isoformat()


def _user(user_id: int, name: str | None = None, bot: bool = False) -> dict:
    name = name or f"user{user_id}"
    return {"id": str(user_id), "username": name, "global_name": None if bot else name.title(), "discriminator": "0",
            "avatar": None, "bot": bot, "system": False, "public_flags": 0, "flags": 0,
            "avatar_decoration_data": None, "primary_guild": None}


def embed_text(embed: dict) -> str:
    parts = [embed.get("title") or "", embed.get("description") or ""]
    for field in embed.get("fields") or []:
        parts += [field.get("name") or "", field.get("value") or ""]
    parts.append((embed.get("footer") or {}).get("text") or "")
    parts.append((embed.get("author") or {}).get("name") or "")
    return "\n".join(p for p in parts if p)


def message_problem(payload: dict) -> dict | None:
    """Discord's 400 body for a message that breaks its limits, or None."""
    errors: dict[str, Any] = {}
    content = payload.get("content")
    if content is not None and len(str(content)) > CONTENT_LIMIT:
        errors["content"] = {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                                          "message": f"Must be {CONTENT_LIMIT} or fewer in length."}]}
    embeds = payload.get("embeds") or []
    if len(embeds) > EMBEDS_LIMIT:
        errors["embeds"] = {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                                         "message": f"Must be {EMBEDS_LIMIT} or fewer in length."}]}
    total = 0
    for i, embed in enumerate(embeds):
        checks = [("title", embed.get("title"), 256), ("description", embed.get("description"), DESCRIPTION_LIMIT),
                  ("footer.text", (embed.get("footer") or {}).get("text"), 2048),
                  ("author.name", (embed.get("author") or {}).get("name"), 256)]
        checks += [(f"fields.{j}.name", f.get("name"), 256) for j, f in enumerate(embed.get("fields") or [])]
        checks += [(f"fields.{j}.value", f.get("value"), 1024) for j, f in enumerate(embed.get("fields") or [])]
        for where, value, limit in checks:
            total += len(value or "")
            if value is not None and len(value) > limit:
                errors.setdefault("embeds", {})[f"{i}.{where}"] = {"_errors": [
                    {"code": "BASE_TYPE_MAX_LENGTH", "message": f"Must be {limit} or fewer in length."}]}
    if total > EMBED_TOTAL_LIMIT:
        errors.setdefault("embeds", {})["_errors"] = [
            {"code": "MAX_EMBED_SIZE_EXCEEDED", "message": "Embed size exceeds maximum size of 6000"}]
    rows = payload.get("components") or []
    if len(rows) > ROWS_LIMIT:
        errors["components"] = {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                                             "message": f"Must be {ROWS_LIMIT} or fewer in length."}]}
    custom_ids: set[str] = set()
    for i, row in enumerate(rows):
        items = row.get("components") or []
        if row.get("type") != 1 or not 1 <= len(items) <= ROW_ITEMS_LIMIT:
            errors.setdefault("components", {})[str(i)] = {"_errors": [
                {"code": "COMPONENT_LAYOUT_WIDTH_EXCEEDED", "message": "An action row holds 1 to 5 items."}]}
        for j, item in enumerate(items):
            where, problem = f"{i}.components.{j}", None
            if item.get("type") == 2:
                custom_id = item.get("custom_id")
                if item.get("style") == 5:
                    problem = None if item.get("url") and not custom_id else "A link button has a url, no custom_id."
                elif not custom_id or len(custom_id) > CUSTOM_ID_LIMIT:
                    problem = f"custom_id must be 1 to {CUSTOM_ID_LIMIT} characters."
                elif custom_id in custom_ids:
                    problem = "Component custom id cannot be duplicated"
                if not (item.get("label") or item.get("emoji")):
                    problem = "A button needs a label or an emoji."
                elif len(item.get("label") or "") > LABEL_LIMIT:
                    problem = f"label must be {LABEL_LIMIT} or fewer in length."
                custom_ids.add(custom_id)
            if problem:
                errors.setdefault("components", {})[where] = {"_errors": [{"code": "COMPONENT_INVALID",
                                                                            "message": problem}]}
    if errors:
        return {"code": 50035, "errors": errors, "message": "Invalid Form Body"}
    return None


def _error(status: int, code: int, message: str) -> tuple[int, dict]:
    return status, {"message": message, "code": code}


NOT_FOUND = _error(404, 0, "404: Not Found")
UNKNOWN_WEBHOOK = _error(404, 10015, "Unknown Webhook")
UNKNOWN_MESSAGE = _error(404, 10008, "Unknown Message")
UNKNOWN_INTERACTION = _error(404, 10062, "Unknown interaction")
ALREADY_ACKNOWLEDGED = _error(400, 40060, "Interaction has already been acknowledged.")
EMPTY_MESSAGE = _error(400, 50006, "Cannot send an empty message")
UNAUTHORIZED = _error(401, 0, "401: Unauthorized")


class Message:
    """One message an interaction produced: its original response or a follow-up."""

    def __init__(self, interaction: "Interaction", kind: str, ephemeral: bool, loading: bool = False):
        self.id = interaction.id if kind == "original" else snowflake()
        self.interaction = interaction
        self.kind = kind
        self.ephemeral = ephemeral
        self.loading = loading  # a deferred response: "Bot is thinking…"
        self.deleted = False
        self.content = ""
        self.embeds: list[dict] = []
        self.components: list[dict] = []  # action rows, as the bot sent them
        self.versions: list[tuple[float, str, list[dict]]] = []  # every state it was shown in

    def apply(self, payload: dict) -> None:
        if "content" in payload:
            self.content = payload["content"] or ""
        if "embeds" in payload:
            self.embeds = payload["embeds"] or []
        if "components" in payload:
            self.components = payload["components"] or []
        self.loading = False
        self.versions.append((time.monotonic(), self.content, list(self.embeds)))

    def text(self) -> str:
        """What it shows now: content and embed text."""
        return "\n".join([self.content, *map(embed_text, self.embeds)]).strip()

    def all_texts(self) -> list[str]:
        """Every state it was ever shown in (a streamed message shows each edit)."""
        return ["\n".join([c, *map(embed_text, e)]).strip() for _, c, e in self.versions]

    @property
    def public(self) -> bool:
        """Everyone in the guild channel sees it (a DM is between the bot and the asker)."""
        return not self.ephemeral and self.interaction.guild_id is not None

    def visible_to(self, user_id: int) -> bool:
        return self.public or user_id == self.interaction.user_id

    def buttons(self) -> list[dict]:
        """The buttons under it, in order."""
        return [c for row in self.components for c in row.get("components") or [] if c.get("type") == 2]

    def __repr__(self) -> str:
        state = "deleted" if self.deleted else "thinking" if self.loading else f"{len(self.versions)} versions"
        return f"<Message {self.kind} {'ephemeral' if self.ephemeral else 'public'} {state}: {self.text()[:40]!r}>"

    def payload(self, app_id: int, bot: dict) -> dict:
        it = self.interaction
        flags = (EPHEMERAL if self.ephemeral else 0) | (LOADING if self.loading else 0)
        return {
            "id": str(self.id), "type": 20, "channel_id": str(it.channel_id), "content": self.content,
            "author": bot, "attachments": [], "embeds": self.embeds, "mentions": [], "mention_roles": [],
            "mention_everyone": False, "pinned": False, "tts": False, "timestamp": _iso(),
            "edited_timestamp": _iso() if len(self.versions) > 1 else None, "flags": flags,
            "components": self.components, "webhook_id": str(app_id), "application_id": str(app_id),
            **({"guild_id": str(it.guild_id)} if it.guild_id is not None else {}),
            "interaction_metadata": {"id": str(it.id), "type": it.type, "name": it.command,
                                     "user": _user(it.user_id),
                                     "authorizing_integration_owners": {"0": str(it.guild_id or 0)}},
        }


class Interaction:
    """One slash command a person ran (or a message command, or a button pressed), and
    everything the bot did with it."""

    def __init__(self, user_id: int, command: str, options: dict, guild_id: int | None, channel_id: int,
                 type: int = APPLICATION_COMMAND):
        self.id = snowflake()
        self.type = type
        self.token = "aW50ZXJhY3Rpb246" + secrets.token_urlsafe(48)
        self.user_id, self.command, self.options = user_id, command, options
        self.guild_id, self.channel_id = guild_id, channel_id
        self.created = time.monotonic()
        self.callback: dict | None = None  # {"type", "data", "t"}
        self.original: Message | None = None
        self.followups: list[Message] = []
        self.events: list[tuple[float, str, dict]] = []  # (time, kind, request body) in order

    # what a test asks about it
    def kinds(self) -> list[str]:
        return [kind for _, kind, _ in self.events]

    def bodies(self, kind: str) -> list[dict]:
        return [body for _, k, body in self.events if k == kind]

    @property
    def deferred(self) -> bool:
        return bool(self.callback and self.callback["type"] == 5)

    @property
    def ephemeral(self) -> bool | None:
        """Whether the response is only for the asker (None before the callback)."""
        return None if self.original is None else self.original.ephemeral

    def messages(self) -> list[Message]:
        return ([self.original] if self.original else []) + [m for m in self.followups if m is not self.original]

    def answered(self) -> bool:
        """The person sees a message (not only "thinking…")."""
        return any(m.versions for m in self.messages())

    def thinking(self) -> bool:
        """The deferred "thinking…" still shows."""
        return bool(self.original and self.original.loading and not self.original.deleted)

    def texts(self) -> list[str]:
        return [t for m in self.messages() for t in m.all_texts()]

    def final_embeds(self) -> list[dict]:
        return [e for m in self.messages() if not m.deleted for e in m.embeds]

    def last_message(self) -> Message | None:
        """The last message it shows (the one an answer's buttons are under)."""
        shown = [m for m in self.messages() if m.versions and not m.deleted]
        return shown[-1] if shown else None

    def buttons(self) -> list[dict]:
        return [b for m in self.messages() if not m.deleted for b in m.buttons()]

    def __repr__(self) -> str:
        return f"<Interaction /{self.command} by {self.user_id}: {self.kinds()}>"


class _Connection:
    """One gateway WebSocket, with its transport compression."""

    def __init__(self, ws: web.WebSocketResponse, compress: str | None):
        self.ws = ws
        self.compress = compress
        self.lock = asyncio.Lock()  # compressed frames must go out in the order they were compressed
        if compress == "zlib-stream":
            self._z = zlib.compressobj()
        elif compress == "zstd-stream" and zstandard is not None:
            self._z = zstandard.ZstdCompressor().compressobj()
        else:
            self.compress, self._z = None, None
        self.frames = 0  # sent with this transport (compressed when ``compress`` is set)

    async def send(self, payload: dict) -> None:
        data = json.dumps(payload, ensure_ascii=False)
        async with self.lock:
            if self.ws.closed:
                return
            if self.compress == "zlib-stream":
                await self.ws.send_bytes(self._z.compress(data.encode()) + self._z.flush(zlib.Z_SYNC_FLUSH))
            elif self.compress == "zstd-stream":
                await self.ws.send_bytes(self._z.compress(data.encode()) + self._z.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
            else:
                await self.ws.send_str(data)
            self.frames += 1


class _Session:
    """A gateway session: survives a reconnect (RESUME) and replays what was missed."""

    def __init__(self, session_id: str):
        self.id = session_id
        self.seq = 0
        self.sent: list[dict] = []  # dispatches, for RESUME
        self.conn: _Connection | None = None

    async def dispatch(self, event: str, data: dict) -> None:
        self.seq += 1
        frame = {"op": 0, "t": event, "s": self.seq, "d": data}
        self.sent.append(frame)
        if self.conn is not None:
            await self.conn.send(frame)


class FakeDiscord:
    def __init__(self, token: str = "fake-discord-token", guilds: dict[int, dict] | None = None,
                 callback_deadline: float = 3.0, heartbeat_interval: int = 41250):
        """``guilds``: ``{guild_id: {"channels": [ids], "roles": [ids]}}``, what the bot's
        GUILD_CREATEs describe."""
        self.token = token
        self.app_id = snowflake()
        self.bot = _user(self.app_id, "notes-bot", bot=True)
        self.guilds = {int(g): {"channels": list(v.get("channels", [])), "roles": list(v.get("roles", []))}
                       for g, v in (guilds or {}).items()}
        self.callback_deadline = callback_deadline
        self.heartbeat_interval = heartbeat_interval

        self.lock = threading.RLock()
        self.calls: list[tuple[str, str, dict, float]] = []  # (method, path after the base, body, time)
        self.unknown: list[tuple[str, str]] = []  # routes the fake does not serve
        self.unauthorized = 0
        self.commands: dict[int | None, list[dict]] = {}  # None: global; else the guild id
        self.interactions: list[Interaction] = []
        self.identifies: list[dict] = []
        self.resumes: list[dict] = []
        self.connections: list[dict] = []  # query string of each gateway connection
        self.links: list[_Connection] = []  # each gateway connection: its transport and frames sent
        self.heartbeats = 0
        self.throttle: dict[str, list[float]] = {}  # kind -> [times, retry_after]
        self.refusing: list[list] = []  # [kind, times, status, when]: requests refused (refuse)
        self.sessions: dict[str, _Session] = {}
        self.session: _Session | None = None  # the one ready for dispatches
        self.files: dict[int, dict] = {}  # attachment id -> its object, with "_data"
        self.downloads: list[str] = []  # file names fetched from the CDN, in order
        self.user_messages: dict[int, dict] = {}  # messages people wrote, by id
        self.dm_channels: dict[int, int] = {}  # direct-message channel id -> the person's user id
        self.dms: dict[int, list[str]] = {}  # what the bot sent each person in a direct message

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.api_base = f"{self.url}/api/v10"
        self.gateway_url = f"ws://127.0.0.1:{port}/gateway"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._sockets: set[web.WebSocketResponse] = set()

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self):
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def start():
            app = web.Application(client_max_size=32 << 20)
            app.router.add_get("/gateway", self._gateway)
            app.router.add_get("/attachments/{channel}/{id}/{filename}", self._cdn)
            app.router.add_route("*", "/api/v10/{tail:.*}", self._rest)
            app.router.add_route("*", "/{tail:.*}", self._rest)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            await self._runner.setup()
            await web.SockSite(self._runner, self._sock).start()

        def serve():
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(start())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="fake-discord", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the fake Discord did not start")
        return self

    def __exit__(self, *exc) -> None:
        async def stop():
            for ws in list(self._sockets):
                await ws.close(code=1001, message=b"going away")
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _run(self, coro, timeout: float = 5.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # --- controls for tests ----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """A gateway session got READY and its GUILD_CREATEs."""
        return self.session is not None and self.session.conn is not None

    def commands_for(self, guild_id: int | None = None) -> dict[str, dict]:
        with self.lock:
            return {c["name"]: c for c in self.commands.get(guild_id, [])}

    def throttle_next(self, kind: str, times: int = 1, retry_after: float = 0.5) -> None:
        """The next ``times`` requests of a kind ("callback", "edit", "delete", "followup",
        "commands") get 429 with ``retry_after``."""
        with self.lock:
            self.throttle[kind] = [times, retry_after]

    def refuse(self, kind: str, times: int = 1, when=lambda body: True, status: int = 400) -> None:
        """The next ``times`` requests of a kind ("edit": a PATCH of a response or follow-up;
        "followup") whose body ``when`` accepts are refused, nothing changed: 400 "Invalid Form
        Body" (50035), as Discord answers a message it will not take, or ``status`` (a 5xx,
        which discord.py's webhooks retry for 25 s before giving up)."""
        with self.lock:
            self.refusing.append([kind, times, status, when])

    def _refused(self, kind: str, body: dict) -> tuple[int, dict] | None:
        with self.lock:
            for rule in self.refusing:
                if rule[0] == kind and rule[1] > 0 and rule[3](body):
                    rule[1] -= 1
                    if rule[2] == 400:
                        return 400, {"code": 50035, "errors": {}, "message": "Invalid Form Body"}
                    return rule[2], {"code": 0, "message": f"{rule[2]}: Server Error"}
        return None

    def _command(self, name: str, guild_id: int | None, type: int = CHAT_INPUT) -> tuple[dict, int | None]:
        """The registered command a person runs, and the guild it is registered in (None:
        global). Only a command the bot registered where it is run can be run."""
        with self.lock:
            found = [c for c in self.commands.get(guild_id, []) if c["name"] == name and c["type"] == type] \
                if guild_id is not None else []
            scope = guild_id if found else None
            found = found or [c for c in self.commands.get(None, []) if c["name"] == name and c["type"] == type]
        if not found:
            where = f"guild {guild_id}" if guild_id is not None else "DMs"
            raise LookupError(f"{name!r} (command type {type}) is not registered for {where}: "
                              f"a person could not run it")
        return found[0], scope

    def slash(self, user_id: int, name: str, options: dict | None = None, *, guild_id: int | None = None,
              channel_id: int | None = None, roles: list[int] | tuple = (), locale: str = "en-US") -> Interaction:
        """A person runs ``/name`` with these options: in a guild channel (``guild_id``,
        ``channel_id``, the member's ``roles``) or, without ``guild_id``, in a DM with the
        bot. An attachment option (type 11) takes what ``upload`` returned."""
        options = dict(options or {})
        command, scope = self._command(name, guild_id)
        declared = {o["name"]: o for o in command.get("options", [])}
        data_options, attachments = [], {}
        for key, value in options.items():
            if key not in declared:
                raise ValueError(f"/{name} has no option {key!r} (it has {sorted(declared)})")
            kind = declared[key]["type"]
            if kind == ATTACHMENT_OPTION:
                if not (isinstance(value, dict) and int(value.get("id", 0)) in self.files):
                    raise TypeError(f"option {key!r} of /{name} takes a file from upload(), not {value!r}")
                attachments[value["id"]] = {k: v for k, v in value.items() if not k.startswith("_")}
                value = value["id"]
            elif kind in OPTION_TYPES and (not isinstance(value, OPTION_TYPES[kind]) or
                                           (kind != 5 and isinstance(value, bool))):
                raise TypeError(f"option {key!r} of /{name} takes type {kind}, not {value!r}")
            data_options.append({"name": key, "type": kind, "value": value})
        missing = [o for o, d in declared.items() if d.get("required") and o not in options]
        if missing:
            raise ValueError(f"/{name} needs {missing}")

        data = {"id": command["id"], "name": name, "type": CHAT_INPUT}
        if data_options:
            data["options"] = data_options
        if attachments:
            data["resolved"] = {"attachments": attachments}
        if scope is not None:
            data["guild_id"] = str(scope)
        return self._interact(user_id, name, options, data, guild_id, channel_id, roles, locale)

    def message_command(self, user_id: int, name: str, message: dict, *, guild_id: int | None = None,
                        channel_id: int | None = None, roles: list[int] | tuple = (),
                        locale: str = "en-US") -> Interaction:
        """A person picks ``name`` in a message's Apps menu (a message context-menu
        command) on ``message`` (from ``user_message``)."""
        command, scope = self._command(name, guild_id, MESSAGE_COMMAND)
        if channel_id is None:
            channel_id = int(message["channel_id"])
        data = {"id": command["id"], "name": name, "type": MESSAGE_COMMAND, "target_id": message["id"],
                "resolved": {"messages": {message["id"]: message}}}
        if scope is not None:
            data["guild_id"] = str(scope)
        return self._interact(user_id, name, {"message": message["id"]}, data, guild_id, channel_id, roles, locale)

    def press(self, user_id: int, message: Message, custom_id: str, *, roles: list[int] | tuple = (),
              locale: str = "en-US", forged: bool = False) -> Interaction:
        """A person clicks the button ``custom_id`` under a message of the bot's (where
        that message is: its interaction's guild and channel). ``forged``: a custom id that is
        not under it (a modified client's), sent all the same."""
        with self.lock:
            if message.deleted or not message.visible_to(user_id):
                raise AssertionError(f"user {user_id} cannot see {message!r}, so cannot press its buttons")
            if not forged and custom_id not in [b.get("custom_id") for b in message.buttons()]:
                raise LookupError(f"no button {custom_id!r} under {message!r}: it has "
                                  f"{[b.get('custom_id') for b in message.buttons()]}")
            payload = message.payload(self.app_id, self.bot)
        where = message.interaction
        data = {"custom_id": custom_id, "component_type": 2}
        return self._interact(user_id, f"press {custom_id}", {"custom_id": custom_id}, data, where.guild_id,
                              where.channel_id, roles, locale, type=MESSAGE_COMPONENT, message=payload)

    def _interact(self, user_id: int, name: str, options: dict, data: dict, guild_id: int | None,
                  channel_id: int | None, roles, locale: str, type: int = APPLICATION_COMMAND,
                  message: dict | None = None) -> Interaction:
        if self.session is None or self.session.conn is None:
            raise AssertionError("no bot is connected to the gateway")
        if guild_id is None:
            channel_id = channel_id or (user_id ^ 0x5A5A)
        elif channel_id is None:
            raise ValueError("a guild interaction needs a channel_id")
        it = Interaction(user_id, name, options, guild_id, channel_id, type=type)
        payload: dict[str, Any] = {
            "id": str(it.id), "application_id": str(self.app_id), "type": type, "data": data, "token": it.token,
            "version": 1, "locale": locale, "app_permissions": ALL_PERMISSIONS, "entitlements": [],
            "attachment_size_limit": 10 << 20, "channel_id": str(channel_id),
        }
        if message is not None:
            payload["message"] = message
        user = _user(user_id)
        if guild_id is not None:
            payload.update(
                guild_id=str(guild_id), guild_locale="en-US", context=0,
                guild={"id": str(guild_id), "locale": "en-US", "features": []},
                authorizing_integration_owners={"0": str(guild_id)},
                member={"user": user, "roles": [str(r) for r in roles], "permissions": "2248473465835073",
                        "joined_at": _iso(time.time() - 86400), "premium_since": None, "nick": None, "avatar": None,
                        "banner": None, "pending": False, "mute": False, "deaf": False, "flags": 0,
                        "communication_disabled_until": None, "unusual_dm_activity_until": None},
                channel={**self._channel(guild_id, channel_id), "guild_id": str(guild_id),
                         "permissions": "2248473465835073"},
            )
        else:
            payload.update(
                user=user, context=1, authorizing_integration_owners={"0": "0"},
                channel={"id": str(channel_id), "type": 1, "flags": 0, "last_message_id": None, "recipients": [user]},
            )
        with self.lock:
            self.interactions.append(it)
            session = self.session
        self._run(session.dispatch("INTERACTION_CREATE", payload))
        return it

    def upload(self, filename: str, data: bytes, content_type: str = "application/octet-stream", *,
               channel_id: int = 0) -> dict:
        """A file a person attaches: Discord's attachment object (its ``size`` the real
        one), downloadable from this fake's CDN at its ``url``."""
        file_id = snowflake()
        url = f"{self.url}/attachments/{channel_id}/{file_id}/{quote(filename)}"
        attachment = {"id": str(file_id), "filename": filename, "size": len(data), "url": url, "proxy_url": url,
                      "content_type": content_type, "_data": data}
        with self.lock:
            self.files[file_id] = attachment
        return attachment

    def user_message(self, author_id: int, content: str, *, channel_id: int, guild_id: int | None = None,
                     author_name: str | None = None, attachments: list[dict] = (), ago: float = 60.0) -> dict:
        """A message a person wrote ``ago`` seconds ago, as Discord describes it (files
        from ``upload``)."""
        when = time.time() - ago
        message_id = ((int(when * 1000) - DISCORD_EPOCH) << 22) | (next(_ids) % (1 << 22))
        message = {
            "id": str(message_id), "type": 0, "channel_id": str(channel_id), "content": content,
            "author": _user(author_id, author_name), "attachments": [
                {k: v for k, v in a.items() if not k.startswith("_")} for a in attachments],
            "embeds": [], "mentions": [], "mention_roles": [], "mention_everyone": False, "pinned": False,
            "tts": False, "timestamp": _iso(when), "edited_timestamp": None, "flags": 0, "components": [],
        }
        with self.lock:
            self.user_messages[message_id] = message
        return message

    def reconnect(self) -> None:
        """Ask the bot to reconnect (op 7), as Discord does now and then; it should RESUME."""
        self._run(self.session.conn.send({"op": 7, "d": None}))

    def seen_by(self, user_id: int) -> str:
        """Everything this person could ever have read of the bot's responses: every state
        of every public response and of their own ephemeral ones."""
        with self.lock:
            return "\n".join(t for it in self.interactions for m in it.messages() if m.visible_to(user_id)
                             for t in m.all_texts())

    def public_texts(self) -> str:
        with self.lock:
            return "\n".join(t for it in self.interactions for m in it.messages() if m.public
                             for t in m.all_texts())

    def requests(self, *kinds: str) -> list[dict]:
        """The bodies of message-carrying requests of these kinds ("callback", "edit",
        "followup", ...), across all interactions, in order."""
        with self.lock:
            events = sorted((e for it in self.interactions for e in it.events), key=lambda e: e[0])
        return [body for _, kind, body in events if kind in kinds]

    # --- REST ------------------------------------------------------------------------------

    def _channel(self, guild_id: int, channel_id: int) -> dict:
        return {"id": str(channel_id), "type": 0, "name": f"channel-{channel_id}", "position": 0,
                "permission_overwrites": [], "parent_id": None, "nsfw": False, "topic": None,
                "last_message_id": None, "rate_limit_per_user": 0, "flags": 0}

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bot {self.token}"

    @staticmethod
    async def _body(request: web.Request) -> dict:
        if request.method in ("GET", "DELETE") or not request.can_read_body:
            return {}
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            body = json.loads(form.get("payload_json") or "{}")
            files = [k for k, v in form.items() if isinstance(v, web.FileField)]
            if files:
                body["_files"] = files
            return body
        raw = await request.read()
        return json.loads(raw) if raw else {}

    async def _rest(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["tail"]
        body = await self._body(request)
        with self.lock:
            self.calls.append((request.method, path, body, time.monotonic()))
        status, answer, headers = self._route(request, path, body)
        if status == 204:
            return web.Response(status=204, headers=headers)
        # exactly "application/json", as Discord sends it: discord.py compares the whole
        # header and takes anything else (even "; charset=utf-8") for plain text
        return web.Response(body=json.dumps(answer, ensure_ascii=False).encode(), status=status,
                            headers={**headers, "Content-Type": "application/json"})

    def _throttled(self, kind: str) -> tuple | None:
        with self.lock:
            rule = self.throttle.get(kind)
            if not rule or rule[0] <= 0:
                return None
            rule[0] -= 1
            after = rule[1]
        headers = {"Via": "1.1 google", "Retry-After": str(max(1, round(after))), "X-RateLimit-Scope": "user"}
        return 429, {"message": "You are being rate limited.", "retry_after": after, "global": False}, headers

    def _route(self, request: web.Request, path: str, body: dict):
        method, app = request.method, str(self.app_id)
        bot_routes = [
            ("GET", r"/users/@me", lambda m: (200, self.bot)),
            ("GET", r"/oauth2/applications/@me", lambda m: (200, self._app_info())),
            ("GET", r"/gateway/bot", lambda m: (200, {"url": self.gateway_url, "shards": 1, "session_start_limit": {
                "total": 1000, "remaining": 999, "reset_after": 86_400_000, "max_concurrency": 1}})),
            ("PUT", rf"/applications/{app}/commands", lambda m: self._put_commands(None, body)),
            ("PUT", rf"/applications/{app}/guilds/(\d+)/commands", lambda m: self._put_commands(int(m[1]), body)),
            ("GET", rf"/applications/{app}/commands", lambda m: (200, self.commands.get(None, []))),
            ("GET", rf"/applications/{app}/guilds/(\d+)/commands", lambda m: (200, self.commands.get(int(m[1]), []))),
            ("POST", r"/users/@me/channels", lambda m: self._open_dm(body)),
            ("POST", r"/channels/(\d+)/messages", lambda m: self._channel_message(int(m[1]), body)),
        ]
        open_routes = [
            ("GET", r"/gateway", lambda m: (200, {"url": self.gateway_url})),
            ("POST", r"/interactions/(\d+)/([^/]+)/callback", lambda m: self._callback(int(m[1]), m[2], body)),
            ("GET", rf"/webhooks/{app}/([^/]+)/messages/@original", lambda m: self._get_message(m[1], "@original")),
            ("PATCH", rf"/webhooks/{app}/([^/]+)/messages/@original", lambda m: self._edit(m[1], "@original", body)),
            ("DELETE", rf"/webhooks/{app}/([^/]+)/messages/@original", lambda m: self._delete(m[1], "@original")),
            ("GET", rf"/webhooks/{app}/([^/]+)/messages/(\d+)", lambda m: self._get_message(m[1], m[2])),
            ("PATCH", rf"/webhooks/{app}/([^/]+)/messages/(\d+)", lambda m: self._edit(m[1], m[2], body)),
            ("DELETE", rf"/webhooks/{app}/([^/]+)/messages/(\d+)", lambda m: self._delete(m[1], m[2])),
            ("POST", rf"/webhooks/{app}/([^/]+)", lambda m: self._followup(m[1], body)),
        ]
        for needs_auth, routes in ((True, bot_routes), (False, open_routes)):
            for verb, pattern, handler in routes:
                m = re.fullmatch(pattern, path)
                if m and verb == method:
                    if needs_auth and not self._authorized(request):
                        with self.lock:
                            self.unauthorized += 1
                        return (*UNAUTHORIZED, {})
                    kind = {"PUT": "commands", "PATCH": "edit", "DELETE": "delete"}.get(method)
                    kind = "callback" if path.endswith("/callback") else "followup" if (
                        method == "POST" and path.startswith("/webhooks/")) else kind
                    throttled = kind and self._throttled(kind)
                    if throttled:
                        return throttled
                    status, answer = handler(m)
                    return status, answer, {}
        with self.lock:
            self.unknown.append((method, path))
        return (*NOT_FOUND, {})

    def _open_dm(self, body: dict) -> tuple[int, Any]:
        """``POST /users/@me/channels`` (``recipient_id``): the person's DM channel, as Discord's."""
        user_id = int(body.get("recipient_id") or 0)
        if not user_id:
            return 400, {"code": 50035, "message": "Invalid Form Body", "errors": {}}
        with self.lock:
            channel_id = next((c for c, u in self.dm_channels.items() if u == user_id), None) or snowflake()
            self.dm_channels[channel_id] = user_id
        return 200, {"id": str(channel_id), "type": 1, "last_message_id": None, "recipients": [_user(user_id)]}

    def _channel_message(self, channel_id: int, body: dict) -> tuple[int, Any]:
        """``POST /channels/{id}/messages``: only DM channels here (what the bot tells a person)."""
        with self.lock:
            user_id = self.dm_channels.get(channel_id)
            if user_id is None:
                return NOT_FOUND
            problem = message_problem(body)
            if problem:
                return 400, problem
            if not body.get("content"):
                return EMPTY_MESSAGE
            self.dms.setdefault(user_id, []).append(body["content"])
        return 200, {"id": str(snowflake()), "channel_id": str(channel_id), "type": 0, "content": body["content"],
                     "author": self.bot, "timestamp": _iso(), "edited_timestamp": None, "tts": False,
                     "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [],
                     "embeds": [], "pinned": False}

    def _app_info(self) -> dict:
        return {"id": str(self.app_id), "name": "notes-bot", "icon": None, "description": "", "summary": "",
                "type": None, "bot_public": False, "bot_require_code_grant": False, "verify_key": "0" * 64,
                "flags": 0, "owner": _user(900000000000000001, "owner"), "team": None, "guild_id": None,
                "interactions_endpoint_url": None, "redirect_uris": [], "tags": [], "approximate_guild_count": 1,
                "bot": self.bot, "integration_types_config": {"0": {}}}

    def _put_commands(self, guild_id: int | None, body) -> tuple[int, Any]:
        if not isinstance(body, list):
            return 400, {"code": 50035, "message": "Invalid Form Body", "errors": {}}
        if guild_id is not None and guild_id not in self.guilds:
            return 403, {"message": "Missing Access", "code": 50001}
        stored = []
        for command in body:
            name, kind = command.get("name", ""), command.get("type", CHAT_INPUT)
            if kind == CHAT_INPUT:
                if not re.fullmatch(r"[-_\w]{1,32}", name) or name != name.lower():
                    return 400, {"code": 50035, "message": "Invalid Form Body",
                                 "errors": {"name": {"_errors": [{"code": "APPLICATION_COMMAND_INVALID_NAME"}]}}}
                if not 1 <= len(command.get("description", "")) <= 100:
                    return 400, {"code": 50035, "message": "Invalid Form Body",
                                 "errors": {"description": {"_errors": [{"code": "BASE_TYPE_BAD_LENGTH"}]}}}
                for i, option in enumerate(command.get("options", [])):  # each option: a name and a description
                    if not 1 <= len(option.get("description", "")) <= 100 or not 1 <= len(option.get("name", "")) <= 32:
                        return 400, {"code": 50035, "message": "Invalid Form Body", "errors": {"options": {str(i): {
                            "description": {"_errors": [{"code": "BASE_TYPE_BAD_LENGTH"}]}}}}}
            elif kind in (USER_COMMAND, MESSAGE_COMMAND):  # a context menu: a display name, no description
                if not 1 <= len(name) <= 32 or name != name.strip() or command.get("description") or \
                        command.get("options"):
                    return 400, {"code": 50035, "message": "Invalid Form Body",
                                 "errors": {"name": {"_errors": [{"code": "APPLICATION_COMMAND_INVALID_NAME"}]}}}
            else:
                return 400, {"code": 50035, "message": "Invalid Form Body",
                             "errors": {"type": {"_errors": [{"code": "BASE_TYPE_CHOICES"}]}}}
            stored.append({**command, "description": command.get("description", ""), "id": str(snowflake()),
                           "application_id": str(self.app_id),
                           "version": str(snowflake()), "type": command.get("type", 1),
                           "default_member_permissions": command.get("default_member_permissions"),
                           "nsfw": command.get("nsfw", False), "options": command.get("options", []),
                           **({"guild_id": str(guild_id)} if guild_id is not None else {})})
        with self.lock:
            self.commands[guild_id] = stored
        return 200, stored

    # --- interactions ---------------------------------------------------------------------------

    def _find(self, token: str) -> Interaction | None:
        with self.lock:
            return next((it for it in self.interactions if it.token == token), None)

    def _callback(self, interaction_id: int, token: str, body: dict) -> tuple[int, Any]:
        it = self._find(token)
        if it is None or it.id != interaction_id:
            return UNKNOWN_INTERACTION
        now = time.monotonic()
        with self.lock:
            it.events.append((now, "callback", body))
            if it.callback is not None:
                return ALREADY_ACKNOWLEDGED
            if now - it.created > self.callback_deadline:
                return UNKNOWN_INTERACTION  # Discord's 3-second rule
            kind, data = body.get("type"), body.get("data") or {}
            if kind not in (4, 5, 9):
                return 400, {"code": 50035, "message": "Invalid Form Body",
                             "errors": {"type": {"_errors": [{"code": "INTERACTION_RESPONSE_TYPE_INVALID"}]}}}
            if kind == 4:
                problem = message_problem(data)
                if problem:
                    return 400, problem
                if not (data.get("content") or data.get("embeds")):
                    return EMPTY_MESSAGE
            it.callback = {"type": kind, "data": data, "t": now}
            if kind in (4, 5):
                it.original = Message(it, "original", bool(int(data.get("flags") or 0) & EPHEMERAL), loading=kind == 5)
                if kind == 4:
                    it.original.apply(data)
            answer: dict[str, Any] = {"interaction": {
                "id": str(it.id), "type": it.type, "activity_instance_id": None,
                "response_message_id": str(it.original.id) if it.original else None,
                "response_message_loading": kind == 5, "response_message_ephemeral": bool(it.ephemeral)}}
            if kind in (4, 5):
                answer["resource"] = {"type": kind, "message": it.original.payload(self.app_id, self.bot)}
            return 200, answer

    def _message(self, it: Interaction, message_id: str) -> Message | None:
        if message_id == "@original":
            return it.original
        return next((m for m in it.followups if str(m.id) == message_id), None)

    def _get_message(self, token: str, message_id: str) -> tuple[int, Any]:
        it = self._find(token)
        if it is None or it.callback is None:
            return UNKNOWN_WEBHOOK
        with self.lock:
            message = self._message(it, message_id)
            if message is None or message.deleted:
                return UNKNOWN_MESSAGE
            return 200, message.payload(self.app_id, self.bot)

    def _edit(self, token: str, message_id: str, body: dict) -> tuple[int, Any]:
        it = self._find(token)
        if it is None:
            return UNKNOWN_WEBHOOK
        with self.lock:
            it.events.append((time.monotonic(), "edit" if message_id == "@original" else "followup_edit", body))
            if it.callback is None:
                return UNKNOWN_WEBHOOK
            message = self._message(it, message_id)
            if message is None or message.deleted:
                return UNKNOWN_MESSAGE
            problem = message_problem(body)
            if problem:
                return 400, problem
            refused = self._refused("edit", body)
            if refused:
                return refused
            content = body["content"] if "content" in body else message.content
            embeds = body["embeds"] if "embeds" in body else message.embeds
            if not (content or embeds):
                return EMPTY_MESSAGE
            message.apply(body)  # flags cannot make it public or private any more
            return 200, message.payload(self.app_id, self.bot)

    def _delete(self, token: str, message_id: str) -> tuple[int, Any]:
        it = self._find(token)
        if it is None:
            return UNKNOWN_WEBHOOK
        with self.lock:
            it.events.append((time.monotonic(), "delete" if message_id == "@original" else "followup_delete", {}))
            if it.callback is None:
                return UNKNOWN_WEBHOOK
            message = self._message(it, message_id)
            if message is None or message.deleted:
                return UNKNOWN_MESSAGE
            message.deleted = True
            message.loading = False
            return 204, None

    def _followup(self, token: str, body: dict) -> tuple[int, Any]:
        it = self._find(token)
        if it is None:
            return UNKNOWN_WEBHOOK
        with self.lock:
            it.events.append((time.monotonic(), "followup", body))
            if it.callback is None:
                return UNKNOWN_WEBHOOK
            problem = message_problem(body)
            if problem:
                return 400, problem
            if not (body.get("content") or body.get("embeds") or body.get("_files")):
                return EMPTY_MESSAGE
            refused = self._refused("followup", body)
            if refused:
                return refused
            if it.thinking():
                # the first follow-up to a deferred response fills it, and keeps its ephemerality
                message = it.original
            else:
                message = Message(it, "followup", bool(int(body.get("flags") or 0) & EPHEMERAL))
            message.apply(body)
            it.followups.append(message)
            return 200, message.payload(self.app_id, self.bot)

    async def _cdn(self, request: web.Request) -> web.Response:
        """A file people attached, as Discord's CDN serves it (no authorization)."""
        try:
            file_id = int(request.match_info["id"])
        except ValueError:
            file_id = 0
        with self.lock:
            attachment = self.files.get(file_id)
            if attachment is not None:
                self.downloads.append(attachment["filename"])
        if attachment is None:
            return web.Response(status=404, text="Not Found")
        return web.Response(body=attachment["_data"], headers={"Content-Type": attachment["content_type"]})

    # --- the gateway ---------------------------------------------------------------------------

    def _ready(self, session: _Session) -> dict:
        return {
            "v": 10, "user": {**self.bot, "verified": True, "mfa_enabled": False, "email": None},
            "guilds": [{"id": str(g), "unavailable": True} for g in self.guilds],
            "session_id": session.id, "resume_gateway_url": self.gateway_url, "session_type": "normal",
            "application": {"id": str(self.app_id), "flags": 0}, "private_channels": [], "relationships": [],
            "presences": [], "guild_join_requests": [], "geo_ordered_rtc_regions": ["local"], "auth": {},
            "user_settings": {}, "_trace": ["[\"fake-gateway\",{\"micros\":1}]"],
        }

    def _guild_create(self, guild_id: int) -> dict:
        spec = self.guilds[guild_id]
        everyone = {"id": str(guild_id), "name": "@everyone", "permissions": "2248473465835073", "position": 0,
                    "color": 0, "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
                    "hoist": False, "managed": False, "mentionable": False, "icon": None, "unicode_emoji": None,
                    "flags": 0}
        roles = [everyone] + [{**everyone, "id": str(r), "name": f"role-{r}", "position": i + 1, "permissions": "0"}
                              for i, r in enumerate(spec["roles"])]
        channels = [{**self._channel(guild_id, c), "position": i} for i, c in enumerate(spec["channels"])]
        return {
            "id": str(guild_id), "name": f"guild-{guild_id}", "icon": None, "splash": None, "discovery_splash": None,
            "banner": None, "description": None, "owner_id": "900000000000000001", "region": "local",
            "afk_channel_id": None, "afk_timeout": 300, "verification_level": 0, "default_message_notifications": 0,
            "explicit_content_filter": 0, "roles": roles, "emojis": [], "stickers": [], "features": [],
            "mfa_level": 0, "application_id": None, "system_channel_id": None, "system_channel_flags": 0,
            "rules_channel_id": None, "public_updates_channel_id": None, "safety_alerts_channel_id": None,
            "vanity_url_code": None, "premium_tier": 0, "premium_subscription_count": 0, "preferred_locale": "en-US",
            "nsfw_level": 0, "premium_progress_bar_enabled": False, "max_members": 500000,
            "max_video_channel_users": 25, "joined_at": _iso(time.time() - 86400), "large": False,
            "unavailable": False, "member_count": 4, "voice_states": [], "presences": [], "threads": [],
            "stage_instances": [], "guild_scheduled_events": [], "soundboard_sounds": [], "embedded_activities": [],
            "lazy": True, "channels": channels,
            "members": [{"user": self.bot, "roles": [], "joined_at": _iso(time.time() - 86400), "deaf": False,
                         "mute": False, "flags": 0, "pending": False, "nick": None, "avatar": None, "banner": None,
                         "premium_since": None, "communication_disabled_until": None}],
        }

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        self._sockets.add(ws)
        query = dict(request.query)
        with self.lock:
            self.connections.append(query)
        conn = _Connection(ws, query.get("compress"))
        with self.lock:
            self.links.append(conn)
        session: _Session | None = None
        try:
            await conn.send({"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval,
                                             "_trace": ["[\"fake-gateway\",{\"micros\":1}]"]}})
            async for msg in ws:
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    break
                frame = json.loads(msg.data)
                op, data = frame.get("op"), frame.get("d")
                if op == 1:  # heartbeat
                    with self.lock:
                        self.heartbeats += 1
                    await conn.send({"op": 11})
                elif op == 2:  # identify
                    with self.lock:
                        self.identifies.append(data)
                    if data.get("token") != self.token:
                        await ws.close(code=4004, message=b"Authentication failed.")
                        break
                    session = _Session(secrets.token_hex(16))
                    self.sessions[session.id] = session
                    await self._attach(session, conn)
                    await session.dispatch("READY", self._ready(session))
                    for guild_id in self.guilds:
                        await session.dispatch("GUILD_CREATE", self._guild_create(guild_id))
                    self.session = session
                elif op == 6:  # resume
                    with self.lock:
                        self.resumes.append(data)
                    known = self.sessions.get(data.get("session_id"))
                    if known is None or data.get("token") != self.token:
                        await conn.send({"op": 9, "d": False})
                        continue
                    session = known
                    await self._attach(session, conn)
                    for sent in [f for f in session.sent if f["s"] > (data.get("seq") or 0)]:
                        await conn.send(sent)
                    await session.dispatch("RESUMED", {"_trace": []})
                    self.session = session
                elif op in (3, 4, 8, 31):  # presence, voice state, request members, soundboard: ignored
                    continue
                else:
                    await ws.close(code=4001, message=b"Unknown opcode.")
                    break
        finally:
            self._sockets.discard(ws)
            if session is not None and session.conn is conn:
                session.conn = None
        return ws

    async def _attach(self, session: _Session, conn: _Connection) -> None:
        old = session.conn
        session.conn = conn
        if old is not None and old is not conn and not old.ws.closed:
            await old.ws.close(code=4000, message=b"Session resumed elsewhere.")
