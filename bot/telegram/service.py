"""The Telegram bot as ``serve`` runs it (``service``) and ``doctor`` checks it (``check``),
and ``build``, which puts every handler on the bot's Application."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Iterator

from telegram import Bot
from telegram.error import InvalidToken, TelegramError
from telegram.ext import CallbackQueryHandler, CommandHandler, MessageHandler, filters

from rag.config import secret
from rag.errors import ConfigError
from rag.redact import redact_in_logs, safe_url

from bot.chat.checks import CHECK_TIMEOUT, CheckResult, nobody_mapped, token_or_problem
from bot.telegram import answering, buttons, capturing, commands, media
from bot.telegram.bot import TelegramBot

MEDIA = filters.PHOTO | filters.Document.ALL
IMAGES = filters.PHOTO | filters.Document.IMAGE
VOICE = filters.VOICE | filters.AUDIO


def build(host, token: str) -> TelegramBot:
    """The bot for ``host``, with its handlers, in the order Telegram's updates meet them."""
    tg = TelegramBot(host, token)
    a = tg.app
    on = lambda handler: partial(handler, tg)  # noqa: E731  (each handler takes the bot first)
    private = filters.ChatType.PRIVATE
    # before any command in a private chat: a note begun with ✍️ under /gaps is written (/note) or ends
    a.add_handler(MessageHandler(filters.COMMAND & private & ~filters.FORWARDED, on(commands.on_command)), group=-1)
    # a forward in a private chat is a capture, never a question or a command: first
    a.add_handler(MessageHandler(filters.FORWARDED & private, on(capturing.on_forward)))
    a.add_handler(CommandHandler(["start", "help"], on(commands.on_help)))
    a.add_handler(CommandHandler("ask", on(answering.on_ask)))
    a.add_handler(CommandHandler("search", on(commands.on_search)))
    a.add_handler(CommandHandler("reset", on(commands.on_reset)))
    a.add_handler(CommandHandler("status", on(commands.on_status)))
    a.add_handler(CommandHandler("sync", on(commands.on_sync)))
    a.add_handler(CommandHandler("why", on(commands.on_why)))
    a.add_handler(CommandHandler("web", on(commands.on_web)))
    a.add_handler(CommandHandler("note", on(capturing.on_note)))
    a.add_handler(CommandHandler("append", on(capturing.on_append)))
    a.add_handler(CommandHandler("remember", on(capturing.on_remember)))
    a.add_handler(CommandHandler("save", on(capturing.on_save)))
    a.add_handler(CommandHandler("outbox", on(capturing.on_outbox)))
    a.add_handler(CommandHandler("about", on(commands.on_about)))
    a.add_handler(CommandHandler("related", on(commands.on_related)))
    a.add_handler(CommandHandler("reject", on(commands.on_reject)))
    a.add_handler(CommandHandler("confirm", on(commands.on_confirm)))
    a.add_handler(CommandHandler("gaps", on(commands.on_gaps)))
    a.add_handler(CommandHandler("forget", on(commands.on_forget)))
    a.add_handler(CommandHandler("digest", on(commands.on_digest)))
    # a voice message or audio file: heard, then answered, or captured ("note …", "remember …", /note caption)
    a.add_handler(MessageHandler(VOICE, on(media.on_voice)))
    # a photo or document: "/note ..." as its caption captures it, anywhere the bot listens
    a.add_handler(MessageHandler(MEDIA & filters.CaptionRegex(r"^/note(@\w+)?(\s|$)"), on(capturing.on_media_note)))
    # a photo with a question as its caption: answered from the caption and the photo's text
    a.add_handler(MessageHandler(IMAGES & filters.CAPTION, on(media.on_photo_question)))
    a.add_handler(MessageHandler(MEDIA & private, on(capturing.on_media_hint)))
    a.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, on(answering.on_text)))
    a.add_handler(CallbackQueryHandler(on(buttons.on_button)))
    return tg


async def service(host) -> None:
    """``leanote-rag serve`` runs this when ``telegram.enabled``."""
    if not host.settings.telegram.enabled:
        return
    token_env = host.settings.telegram.token_env
    token = secret(token_env, "telegram.token_env")
    redact_in_logs(token)
    try:
        await build(host, token).run()
    except InvalidToken:
        raise ConfigError(f"Telegram refused the token in {token_env}: get the token from @BotFather and put it "
                          f"there, then restart") from None


service.label = "Telegram bot"


def check(settings) -> Iterator[CheckResult]:
    """``doctor``: the token is set and Telegram accepts it (``getMe``); someone may ask."""
    cfg = settings.telegram
    if not cfg.enabled:
        return
    name = "telegram bot"
    token, problem = token_or_problem(cfg.token_env, "telegram.token_env", name)
    if problem:
        yield problem
        return

    async def get_me():
        async with Bot(token, base_url=cfg.base_url) as bot:  # initialize() calls getMe
            return bot.bot

    try:
        me = asyncio.run(asyncio.wait_for(get_me(), CHECK_TIMEOUT))
    except InvalidToken:
        yield name, False, f"Telegram refused the token in {cfg.token_env}", \
            f"get the token from @BotFather and put it in {cfg.token_env}"
        return
    except (TelegramError, OSError, asyncio.TimeoutError) as err:
        yield name, False, f"cannot reach the Bot API at {safe_url(cfg.base_url)}: {type(err).__name__}", \
            "check the network, or telegram.base_url"
        return
    groups = f"answers in {len(cfg.allowed_chats)} listed group(s)" if cfg.allowed_chats else "private chats only"
    yield name, True, f"@{me.username} accepts the token; {groups}", ""
    yield from nobody_mapped(settings, "telegram")
