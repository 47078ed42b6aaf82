"""A bot's ``/web``: the reply holds a one-time link to the web chat that signs its person in
once, shown as a link by the platforms' renderers when the door's ``own`` rule takes it (every
other address stays inert); without ``api.listen`` it says the web chat is off. Real SQLite."""

from __future__ import annotations

import asyncio
import re

import pytest

from bot.chat.web import WEB_OFF, web_link, web_reply
from bot.plain import discord_text, telegram_text
from bot.root import Parts
from bot.usecases import signin
from bot.usecases.people import Person

from conftest import make_settings

FRIEND = Person("telegram:111", "local")


def test_web_gives_a_link_that_signs_its_person_in_once(tmp_path):
    settings = make_settings(tmp_path, users=[{"leanote_user_id": "local", "telegram_ids": [111]}],
                             api={"listen": "127.0.0.1:8765", "tokens": [{"token_env": "X", "users": ["local"]}],
                                  "web_url": "https://notes.example.com/"})
    with Parts(settings) as parts:
        text = asyncio.run(web_reply(parts, FRIEND))
        url = re.search(r"https://\S+", text)[0]
        assert url.startswith("https://notes.example.com/chat#code=") and "10 minutes" in text
        code = url.partition("#code=")[2]
        assert signin.redeem(parts, code).person == "telegram:111"
        with pytest.raises(signin.SigninRefused, match="used already"):
            signin.redeem(parts, code)
        own = web_link(parts)
        assert f'<a href="{url}">' in telegram_text(text, own) and f"<{url}>" in discord_text(text, own)
        assert "<a " not in telegram_text(text) and "<https" not in discord_text(text)  # inert without the rule
        assert not own("https://notes.example.com/chat#code=short") and not own("https://evil.example/chat#code="
                                                                                 + code)


def test_web_says_the_web_chat_is_off_without_a_listener(tmp_path):
    with Parts(make_settings(tmp_path)) as parts:
        assert asyncio.run(web_reply(parts, FRIEND)) == WEB_OFF
        assert not web_link(parts)("http://127.0.0.1:8765/chat#code=" + "a" * 43)
