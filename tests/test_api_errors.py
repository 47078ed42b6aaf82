"""Every error the API answers has the documented shape ``{"error", "kind"}``: bad bodies and
parameters made from the API's own OpenAPI description (as schemathesis would: malformed JSON,
a body that is not an object, fields of the wrong type, a number that is not one, a path or a
method that does not exist), on the socket's app and the TCP app with a token. The real app
(FastAPI, the middleware), in process through httpx's ASGI transport, over a daemon whose index
is not open: nothing sent here can start real work."""

from __future__ import annotations

import asyncio

import httpx

from bot.api.access import TokenAuth
from bot.api.app import create_app
from bot.serve import Daemon

from conftest import make_settings

TOKEN = "errors-" + "e" * 32
KINDS = {"user", "auth", "unavailable", "internal"}
WRONG = {"string": 5, "integer": "many", "number": "much", "boolean": {"no": 1}, "array": 7, "object": [1]}


def bad_requests(schema: dict):
    """(method, path, request keywords, what) for each operation: its bodies and parameters spoiled."""
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            url = path
            for p in op.get("parameters", []):
                if p["in"] == "path":
                    url = url.replace("{" + p["name"] + "}", "x")
            yield method, url + "/nothing-here", {}, "a path that does not exist"
            yield "patch", url, {}, "a method it is not called with"
            for p in op.get("parameters", []):
                kind = p.get("schema", {}).get("type") or (p.get("schema", {}).get("anyOf") or [{}])[0].get("type")
                if p["in"] == "query" and kind in ("integer", "number"):
                    yield method, url, {"params": {p["name"]: "twelve"}}, f"{p['name']} not a number"
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body is None:
                continue
            json_type = {"headers": {"content-type": "application/json"}}
            yield method, url, {"content": b'{"question": "x",', **json_type}, "malformed JSON"
            yield method, url, {"content": b"\xff\xfe\x00", **json_type}, "bytes that are not UTF-8"
            yield method, url, {"content": b"", **json_type}, "an empty body"
            yield method, url, {"json": ["a", "list"]}, "a list, not an object"
            yield method, url, {"json": "a string"}, "a string, not an object"
            yield method, url, {"content": b"question=x", "headers": {"content-type": "text/plain"}}, "not JSON at all"
            model = schema["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]
            for name, prop in model.get("properties", {}).items():
                kind = prop.get("type") or (prop.get("anyOf") or [{}])[0].get("type")
                if kind in WRONG:
                    yield method, url, {"json": {"question": "x", "text": "x", "id": "x", "verdict": "rejected",
                                                 name: WRONG[kind]}}, f"{name} of the wrong type"


def test_every_error_is_error_and_kind_whatever_the_request(tmp_path, monkeypatch):
    monkeypatch.setenv("LR_ERR_TOKEN", TOKEN)
    settings = make_settings(tmp_path, ollama={"enabled": False}, api={
        "socket": str(tmp_path / "api.sock"), "listen": "127.0.0.1:1",
        "tokens": [{"token_env": "LR_ERR_TOKEN", "name": "tester", "users": ["local"], "admin": True}]})
    daemon = Daemon(settings, services=[])

    async def scenario():
        seen = 0
        for app, headers in ((create_app(daemon), {}),
                             (create_app(daemon, TokenAuth(daemon)), {"Authorization": f"Bearer {TOKEN}"})):
            schema = app.openapi()
            assert "HTTPValidationError" not in str(schema) and "Error" in schema["components"]["schemas"]
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
                for method, url, kw, what in bad_requests(schema):
                    kw = {**kw, "headers": {**kw.get("headers", {}), **headers}}
                    reply = await client.request(method.upper(), url, **kw)
                    said = f"{method.upper()} {url} with {what}: {reply.status_code} {reply.text[:300]}"
                    assert reply.status_code >= 400 and reply.status_code not in (422, 500), said
                    body = reply.json()
                    assert set(body) == {"error", "kind"} and body["kind"] in KINDS and body["error"], said
                    if what in ("malformed JSON", "a list, not an object") or "wrong type" in what \
                            or "not a number" in what:
                        assert reply.status_code == 400 and body["kind"] == "user", said
                    seen += 1
        return seen

    assert asyncio.run(scenario()) > 100
