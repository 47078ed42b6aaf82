"""Telegram front end (python-telegram-bot v22, long polling).

In a private chat any text is a question. Groups are shared rooms and opt-in: the
bot answers only in groups listed in ``telegram.allowed_chats``, to ``/ask``, a
mention or a reply to the bot, and everyone there sees the question and the answer
with its sources. Each person's conversation (follow-ups, ``/why``, ``/reset``) is
their own, also in a group; ``/why`` and ``/status`` asked in a group are answered in
the person's private chat with the bot. Answers stream into a placeholder message
(edits at most every ``telegram.edit_interval``, ``RetryAfter`` honoured, "message is
not modified" ignored, ``typing`` kept alive), then the final text in HTML parse mode with
everything from the notes escaped, split past 4,096 characters, sources as a
numbered list of links, previews off; plain text if Telegram rejects the HTML.
Updates are handled concurrently, so one person's question never waits for another's.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Iterator

from bs4 import BeautifulSoup
from telegram import Bot, BotCommand, LinkPreviewOptions, Message, Update
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, Forbidden, InvalidToken, RetryAfter, TelegramError
from telegram.ext import Application, ApplicationBuilder, CommandHandler, ContextTypes, MessageHandler, filters

from rag.config import secret
from rag.errors import ConfigError
from rag.redact import redact_in_logs, safe_url

from .access import STRANGER, Access, Person
from .common import (CHECK_TIMEOUT, COMMANDS, HELP, SORRY, CheckResult, Host, Pacer, Wait, conversation_key,
                     count_error, hits_text, nobody_mapped, token_or_problem, trace_text)
from .render import telegram_messages, telegram_sources

log = logging.getLogger(__name__)

NO_PREVIEW = LinkPreviewOptions(is_disabled=True)
TYPING_EVERY = 4.0


def _seconds(err: RetryAfter) -> float:
    value = getattr(err, "_retry_after", None)
    if value is not None:
        return value.total_seconds()
    return float(err.retry_after)


class TelegramBot:
    def __init__(self, host: Host, token: str):
        self.host = host
        self.access = Access(host)
        self.app: Application = (
            ApplicationBuilder().token(token).base_url(self.cfg.base_url).concurrent_updates(True).build()
        )
        self.pacers: list[Pacer] = []  # every answer's pacer (tests, benchmark)
        a = self.app
        a.add_handler(CommandHandler(["start", "help"], self.on_help))
        a.add_handler(CommandHandler("ask", self.on_ask))
        a.add_handler(CommandHandler("search", self.on_search))
        a.add_handler(CommandHandler("reset", self.on_reset))
        a.add_handler(CommandHandler("status", self.on_status))
        a.add_handler(CommandHandler("sync", self.on_sync))
        a.add_handler(CommandHandler("why", self.on_why))
        a.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, self.on_text))

    @property
    def cfg(self):
        """The bot's settings as they are now (a reload changes allowed_chats, edit_interval)."""
        return self.host.settings.telegram

    async def run(self) -> None:
        """Connect and poll until the host stops. Connection errors propagate, so the
        host's supervisor retries with backoff."""
        await self.app.initialize()
        try:
            await self.app.bot.set_my_commands([BotCommand(name, text) for name, text in COMMANDS])
            await self.app.start()
            await self.app.updater.start_polling(allowed_updates=["message"])
            log.info("telegram bot @%s is polling", self.app.bot.username)
            await self.host.stopping.wait()
        finally:
            with suppress(Exception):
                if self.app.updater.running:
                    await self.app.updater.stop()
            with suppress(Exception):
                if self.app.running:
                    await self.app.stop()
            await self.app.shutdown()

    # --- who is asking --------------------------------------------------------------------

    async def _who(self, update: Update) -> Person | None:
        """The asking person, or None after telling a stranger (or a mapped person in a
        group that is not enabled) why not. Groups not listed get no answer at all."""
        user, chat, message = update.effective_user, update.effective_chat, update.effective_message
        if user is None:
            return None
        person = self.access.person("telegram", user.id)
        if chat.type != ChatType.PRIVATE and chat.id not in self.cfg.allowed_chats:
            if isinstance(person, Person) and self.access.once_in_a_while(("group", chat.id)):
                await message.reply_text(
                    f"这个群还没有开通：请把群 id {chat.id} 加到 telegram.allowed_chats。\n"
                    f"Not enabled in this group: add its id {chat.id} to telegram.allowed_chats."
                )
            return None
        if person is None:
            refusal = self.access.stranger("telegram", user.id)
            if refusal:
                await message.reply_text(refusal)
            return None
        if isinstance(person, str):
            await message.reply_text(person)
            return None
        return person

    @staticmethod
    def conversation(update: Update) -> str:
        return conversation_key("telegram", update.effective_chat.id, update.effective_user.id)

    async def _privately(self, update: Update, text: str) -> None:
        """Answer in the person's private chat: a group sees nothing of it."""
        message = update.effective_message
        if update.effective_chat.type == ChatType.PRIVATE:
            for part in _chunks(text, 4000):
                await message.reply_text(part, link_preview_options=NO_PREVIEW)
            return
        try:
            for part in _chunks(text, 4000):
                await self.app.bot.send_message(update.effective_user.id, part, link_preview_options=NO_PREVIEW)
        except Forbidden:  # the person never opened a private chat with the bot
            await message.reply_text(f"请先私聊我（@{self.app.bot.username}），再发这个命令。 / "
                                     f"Open a private chat with @{self.app.bot.username} and send the command there.")
            return
        await message.reply_text("已私信给你。 / Sent to you privately.")

    # --- commands ---------------------------------------------------------------------------

    async def on_help(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        text = HELP
        user = update.effective_user
        if user is not None and update.effective_chat.type == ChatType.PRIVATE \
                and self.access.person("telegram", user.id) is None:
            text += "\n\n" + STRANGER["telegram"].format(id=user.id)  # /start: a newcomer learns their id
        await update.effective_message.reply_text(text, link_preview_options=NO_PREVIEW)

    async def on_ask(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        question = " ".join(context.args or [])
        if not question.strip():
            await update.effective_message.reply_text("用法 usage: /ask 你的问题")
            return
        await self._answer(update, question)

    async def on_text(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.effective_message
        if update.effective_chat.type != ChatType.PRIVATE:
            me = context.bot.username or ""
            mentioned = f"@{me}".lower() in (message.text or "").lower()
            replied = message.reply_to_message is not None and message.reply_to_message.from_user is not None \
                and message.reply_to_message.from_user.id == context.bot.id
            if not (mentioned or replied):
                return
            question = message.text.replace(f"@{me}", "").strip()
        else:
            question = message.text or ""
        await self._answer(update, question)

    async def on_search(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        person = await self._who(update)
        query = " ".join(context.args or [])
        if person is None:
            return
        if not query.strip():
            await update.effective_message.reply_text("用法 usage: /search 关键词")
            return
        try:
            hits = await self.host.answers.search(query, person.leanote_user_id, 8)
        except Exception:
            log.exception("telegram /search failed")
            count_error(self.host, "telegram")
            await update.effective_message.reply_text(SORRY)
            return
        await update.effective_message.reply_text(hits_text(hits), link_preview_options=NO_PREVIEW)

    async def on_reset(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        person = await self._who(update)
        if person is None:
            return
        self.host.answers.conversations.reset(person.leanote_user_id, self.conversation(update))
        await update.effective_message.reply_text("好的，重新开始。 / Fresh start.")

    async def on_status(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        person = await self._who(update)
        if person is None:
            return
        text = self.host.status_text(None if person.admin else person.leanote_user_id)
        await self._privately(update, text)

    async def on_sync(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        person = await self._who(update)
        if person is None:
            return
        if not person.admin:
            await update.effective_message.reply_text("只有管理员可以 /sync。 / Only admins may /sync.")
            return
        started = self.host.trigger()
        await update.effective_message.reply_text(
            "开始同步。 / Syncing now." if started else "刚刚同步过，稍等再试。 / A sync just ran; try again shortly."
        )

    async def on_why(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        person = await self._who(update)
        if person is None:
            return
        trace = self.host.answers.conversations.trace(person.leanote_user_id, self.conversation(update))
        await self._privately(update, trace_text(trace))

    # --- answering --------------------------------------------------------------------------

    async def _answer(self, update: Update, question: str) -> None:
        person = await self._who(update)
        if person is None:
            return
        user = update.effective_user
        wait = self.access.rate("telegram", user.id)
        if wait:
            await update.effective_message.reply_text(self.access.slow_down(wait))
            return
        chat = update.effective_chat
        placeholder = await self._retrying(lambda: update.effective_message.reply_text("…"))

        async def edit(text: str) -> None:
            try:
                await placeholder.edit_text(text, link_preview_options=NO_PREVIEW)
            except RetryAfter as err:
                raise Wait(_seconds(err)) from None
            except BadRequest as err:
                if "not modified" not in str(err).lower():
                    raise

        pacer = Pacer(edit, self.cfg.edit_interval)
        self.pacers.append(pacer)
        typing = asyncio.create_task(self._typing(chat.id))
        pacer.start()
        try:
            answer = await self.host.answers.ask(
                question, person.leanote_user_id, conversation=self.conversation(update), on_token=pacer.feed
            )
        except Exception:
            log.exception("answering a Telegram question failed")
            count_error(self.host, "telegram")
            answer = None
        finally:  # whatever happened, the "typing…" and the streaming edits end here
            await pacer.stop()
            typing.cancel()
        if answer is None:
            await self._final(placeholder, [SORRY], html=False)
            return
        body = answer.answer + (f"\n\n*{answer.notice}*" if answer.notice else "")
        if answer.citations:
            sources = telegram_sources(answer.citations, "来源 Sources")
        else:
            sources = telegram_sources(answer.closest, "最接近的笔记 Closest notes")
        await self._final(placeholder, telegram_messages(body, sources), html=True)

    async def _typing(self, chat_id: int) -> None:
        with suppress(asyncio.CancelledError, TelegramError):
            while True:
                await self.app.bot.send_chat_action(chat_id, ChatAction.TYPING)
                await asyncio.sleep(TYPING_EVERY)

    async def _retrying(self, call, attempts: int = 6):
        """Make a call, waiting out RetryAfter: the final answer is never dropped."""
        for attempt in range(attempts):
            try:
                return await call()
            except RetryAfter as err:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(_seconds(err))

    async def _final(self, placeholder: Message, parts: list[str], html: bool) -> None:
        for i, part in enumerate(parts):
            mode = ParseMode.HTML if html else None

            async def send(text=part, mode=mode, first=(i == 0)):
                if first:
                    return await placeholder.edit_text(text, parse_mode=mode, link_preview_options=NO_PREVIEW)
                return await placeholder.chat.send_message(text, parse_mode=mode, link_preview_options=NO_PREVIEW)

            try:
                await self._retrying(send)
            except BadRequest as err:
                message = str(err).lower()
                if "not modified" in message:
                    continue
                if not html:
                    raise
                log.info("Telegram rejected the HTML (%s); sending plain text", err)
                plain = BeautifulSoup(part, "html.parser").get_text()
                await self._retrying(lambda text=plain, first=(i == 0): (
                    placeholder.edit_text(text, link_preview_options=NO_PREVIEW) if first
                    else placeholder.chat.send_message(text, link_preview_options=NO_PREVIEW)))


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


async def service(host: Host) -> None:
    """``leanote-rag serve`` runs this when ``telegram.enabled``."""
    if not host.settings.telegram.enabled:
        return
    token_env = host.settings.telegram.token_env
    token = secret(token_env, "telegram.token_env")
    redact_in_logs(token)
    try:
        await TelegramBot(host, token).run()
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
