"""The Telegram bot itself: its Application, who is asking, replies in private, and its life.

The handlers (``answering``, ``commands``, ``capturing``, ``buttons``) are registered by
``service.build``; each takes this bot as its first argument.

Every text the bot sends but an answer (``answering`` renders those with ``bot.render``) goes out
through one path, ``reply``, ``send`` or ``edit``: rendered by the door's rule (``bot.plain``:
HTML, every link-like token inert but the addresses of this install's notes), in parts within
Telegram's limit with the buttons under the last, and a ``RetryAfter`` waited out, so a reply that
meets Telegram's flood limit half-way still arrives whole, with its buttons.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from telegram import BotCommand, LinkPreviewOptions, Message, ReplyParameters, Update
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, Forbidden, RetryAfter, TelegramError
from telegram.ext import Application, ApplicationBuilder, ContextTypes

from bot.chat.access import STRANGER, Access
from bot.chat.texts import INTERRUPTED, SORRY, commands
from bot.plain import messages, own_links, telegram_text
from bot.render import TELEGRAM_LIMIT
from bot.usecases import capture as capture_case
from bot.usecases import gaps as gaps_case
from bot.usecases import media as media_case
from bot.usecases.people import Person, person_key

log = logging.getLogger(__name__)

NO_PREVIEW = LinkPreviewOptions(is_disabled=True)
TYPING_EVERY = 4.0


def seconds(err: RetryAfter) -> float:
    value = getattr(err, "_retry_after", None)
    if value is not None:
        return value.total_seconds()
    return float(err.retry_after)


def file_url(base_url: str) -> str:
    """Where the Bot API serves files: ``.../bot`` -> ``.../file/bot`` (api.telegram.org,
    a self-hosted server, the tests' fake)."""
    base = base_url.rstrip("/")
    return base[: -len("/bot")] + "/file/bot" if base.endswith("/bot") else base + "/file/bot"


class TelegramBot:
    """One bot on one Application, for the daemon ``host`` (``settings``, ``parts``, ``stopping``,
    ``metrics``)."""

    def __init__(self, host, token: str):
        self.host = host
        self.access = Access(host)
        self.app: Application = (
            ApplicationBuilder().token(token).base_url(self.cfg.base_url).base_file_url(file_url(self.cfg.base_url))
            .concurrent_updates(True).build()
        )
        self.pacers: list = []  # every answer's pacer (tests, benchmark)
        self.app.add_error_handler(self.on_error)  # where every unexpected error of a handler ends

    @property
    def cfg(self):
        """The bot's settings as they are now (a reload changes allowed_chats, edit_interval)."""
        return self.host.settings.telegram

    @property
    def parts(self):
        return self.host.parts

    def count_error(self) -> None:
        metrics = getattr(self.host, "metrics", None)
        if metrics is not None:
            metrics.bot_error("telegram")

    async def on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        """An update's handler failed: logged here once, with its traceback, counted, and the
        person told in one line that names no detail (a button press gets it as an alert)."""
        log.error("telegram: handling an update failed", exc_info=context.error)
        self.count_error()
        if not isinstance(update, Update):
            return
        with suppress(TelegramError):  # (a press may have been answered already)
            if update.callback_query is not None:
                await update.callback_query.answer(SORRY[:200], show_alert=True)
            elif update.effective_message is not None:
                await self.reply(update.effective_message, SORRY)

    async def run(self) -> None:
        """Connect and poll until the host stops. Connection errors propagate, so the
        host's supervisor retries with backoff."""
        await self.app.initialize()
        try:
            menu = commands(capture_case.offered(self.parts))  # no capture commands where nothing can be captured
            await self.app.bot.set_my_commands([BotCommand(name, text) for name, text in menu])
            await self.app.start()
            await self.app.updater.start_polling(allowed_updates=["message", "callback_query"])
            log.info("telegram bot @%s is polling", self.app.bot.username)
            # a capture whose answer a kill cut off is told when it is written
            capture_case.announce_with(self.parts, "telegram", self.announce)
            gaps_case.announce_with(self.parts, "telegram", self.tell)  # a gap a note answers now, a digest
            await self.interrupted()  # a voice message or photo a stop or a crash cut off: said so
            await self.host.stopping.wait()
        finally:
            if self.host.parts is not None:
                capture_case.stop_announcing(self.host.parts, "telegram", self.announce)
                gaps_case.stop_announcing(self.host.parts, "telegram", self.tell)
            with suppress(Exception):
                if self.app.updater.running:
                    await self.app.updater.stop()
            with suppress(Exception):
                if self.app.running:
                    await self.app.stop()
            await self.app.shutdown()

    async def announce(self, person: str, once: str, text: str) -> None:
        """Tell a person about their capture, in the chat it came from (``once``:
        ``telegram:<chat>:<message>``, as a reply to that message when it is still there),
        else in their private chat."""
        _, chat, message = (once.split(":") + ["", ""])[:3] if once.startswith("telegram:") else ("", "", "")
        chat_id = int(chat) if chat.lstrip("-").isdigit() else int(person.partition(":")[2])
        reply = ReplyParameters(int(message), allow_sending_without_reply=True) if message.isdigit() else None
        await self.send(chat_id, text, reply_to=reply)

    async def interrupted(self) -> None:
        """At the start: each media status message a stop or a crash left saying it was at work
        ("🎙 Transcribing…") now says the job was interrupted, and to send it again."""

        async def tell(shown) -> None:
            await self.retrying(lambda: self.app.bot.edit_message_text(
                INTERRUPTED, chat_id=shown.place["chat_id"], message_id=shown.place["message_id"]))

        await media_case.interrupted(self.parts, "telegram", tell)

    async def tell(self, person: str, text: str) -> None:
        """Tell a person something in their private chat (a gap a note answers now, a digest)."""
        await self.send(int(person.partition(":")[2]), text)

    # --- who is asking --------------------------------------------------------------------

    async def who(self, update: Update) -> Person | None:
        """The asking person (with their conversation in this chat), or None after telling a
        stranger (or a mapped person in a group that is not enabled) why not. Groups not listed
        get no answer at all."""
        user, chat, message = update.effective_user, update.effective_chat, update.effective_message
        if user is None:
            return None
        person = self.access.person("telegram", user.id, chat.id)
        if chat.type != ChatType.PRIVATE and chat.id not in self.cfg.allowed_chats:
            if isinstance(person, Person) and self.access.once_in_a_while(("group", chat.id)):
                await self.reply(message, f"这个群还没有开通：请把群 id {chat.id} 加到 telegram.allowed_chats。\n"
                                          f"Not enabled in this group: add its id {chat.id} to telegram.allowed_chats.")
            return None
        if person is None:
            refusal = self.access.stranger("telegram", user.id)
            if refusal:
                await self.reply(message, refusal)
            return None
        if isinstance(person, str):
            await self.reply(message, person)
            return None
        return person

    def presser(self, user_id: int) -> Person | str:
        """Who pressed a button, as the config says now: the person, else what to tell them."""
        person = self.access.person("telegram", user_id)
        if isinstance(person, Person):
            return person
        return STRANGER["telegram"].format(id=user_id) if person is None else person

    @staticmethod
    def key(update: Update) -> str:
        return person_key("telegram", update.effective_user.id)

    async def may_search(self, update: Update) -> bool:
        """Counts a question or a search against the person's ``bots.rate_limit``; when it
        is over, says so and returns False."""
        wait = self.access.rate("telegram", update.effective_user.id)
        if wait:
            await self.reply(update.effective_message, self.access.slow_down(wait))
            return False
        return True

    # --- replying ---------------------------------------------------------------------------

    def own(self, token: str) -> bool:
        """A token shown as it is: an address of this install's notes, or the bot's own @name."""
        try:
            name = (f"@{self.app.bot.username}",)
        except RuntimeError:  # (not connected yet)
            name = ()
        return own_links(self.host.settings.leanote.base_url, name)(token)

    def html(self, text: str) -> list[str]:
        """Plain text as the Telegram HTML messages it takes, by the door's rule (``bot.plain``)."""
        return messages(text, TELEGRAM_LIMIT, lambda line: telegram_text(line, self.own))

    async def reply(self, message: Message, text: str, *, markup=None, quote: bool | None = None) -> Message:
        """Reply to ``message`` with ``text`` (plain): the door's one path (module docstring).
        ``markup``: buttons under its last part. The last message sent."""
        parts = self.html(text)
        for i, part in enumerate(parts):
            keys = markup if i == len(parts) - 1 else None
            sent = await self.retrying(lambda p=part, k=keys: message.reply_text(
                p, parse_mode=ParseMode.HTML, link_preview_options=NO_PREVIEW, reply_markup=k, do_quote=quote))
        return sent

    async def send(self, chat_id: int, text: str, *, markup=None, reply_to: ReplyParameters | None = None) -> Message:
        """Send ``text`` (plain) to a chat: the door's one path (module docstring)."""
        parts = self.html(text)
        for i, part in enumerate(parts):
            keys = markup if i == len(parts) - 1 else None
            sent = await self.retrying(lambda p=part, k=keys: self.app.bot.send_message(
                chat_id, p, parse_mode=ParseMode.HTML, link_preview_options=NO_PREVIEW, reply_markup=k,
                reply_parameters=reply_to))
        return sent

    async def edit(self, message: Message, text: str, *, markup=None) -> None:
        """``message`` says ``text`` (plain) now, what fits in one message: the door's one path. An
        edit that changes nothing is no error."""
        try:
            await self.retrying(lambda: message.edit_text(self.html(text)[0], parse_mode=ParseMode.HTML,
                                                          link_preview_options=NO_PREVIEW, reply_markup=markup))
        except BadRequest as err:
            if "not modified" not in str(err).lower():
                raise

    async def privately(self, update: Update, text: str) -> None:
        """Answer in the person's private chat: a group sees nothing of it."""
        message = update.effective_message
        if update.effective_chat.type == ChatType.PRIVATE:
            await self.reply(message, text)
            return
        try:
            await self.send(update.effective_user.id, text)
        except Forbidden:  # the person never opened a private chat with the bot
            await self.reply(message, f"请先私聊我（@{self.app.bot.username}），再发这个命令。 / "
                                      f"Open a private chat with @{self.app.bot.username} and send the command there.")
            return
        await self.reply(message, "已私信给你。 / Sent to you privately.")

    async def to_presser(self, query, text: str, answered: bool = False, markup=None) -> None:
        """Send ``text`` to whoever pressed, in their private chat (a group sees nothing of it);
        ``markup``: buttons under its last part."""
        user_id = query.from_user.id
        message = query.message
        private = message is not None and message.chat.type == ChatType.PRIVATE and message.chat.id == user_id
        try:
            await self.send(user_id, text, markup=markup)
        except Forbidden:  # never opened a private chat with the bot
            if not answered:
                await query.answer(f"请先私聊我（@{self.app.bot.username}）。 / Open a private chat with "
                                   f"@{self.app.bot.username} first.", show_alert=True)
            return
        if not answered:
            await query.answer(None if private else "已私信给你。 / Sent to you privately.")

    async def retrying(self, call, attempts: int = 6):
        """Make a call, waiting out RetryAfter: the final answer is never dropped."""
        for attempt in range(attempts):
            try:
                return await call()
            except RetryAfter as err:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(seconds(err))

    async def typing(self, chat_id: int) -> None:
        with suppress(asyncio.CancelledError, TelegramError):
            while True:
                await self.app.bot.send_chat_action(chat_id, ChatAction.TYPING)
                await asyncio.sleep(TYPING_EVERY)
