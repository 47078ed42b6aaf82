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

from telegram import BotCommand, InlineKeyboardButton, InlineKeyboardMarkup, LinkPreviewOptions, Message, \
    ReplyParameters, Update
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, Forbidden, RetryAfter, TelegramError
from telegram.ext import Application, ApplicationBuilder, ContextTypes

from bot.chat.texts import INTERRUPTED, SORRY, commands
from bot.chat.web import web_link
from bot.plain import messages, own_links, telegram_text
from bot.render import TELEGRAM_LIMIT
from bot.session import Button, Reply, Session
from bot.session import doors

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
            menu = commands(doors.capture_offered(self.parts))  # no capture commands where nothing can be captured
            await self.app.bot.set_my_commands([BotCommand(name, text) for name, text in menu])
            await self.app.start()
            await self.app.updater.start_polling(allowed_updates=["message", "callback_query"])
            log.info("telegram bot @%s is polling", self.app.bot.username)
            # a capture whose answer a kill cut off, a gap a note answers now, a digest: told through here
            doors.tell_with(self.parts, "telegram", self.tell)
            await self.interrupted()  # a voice message or photo a stop or a crash cut off: said so
            await self.host.stopping.wait()
        finally:
            doors.stop_telling(self.host.parts, "telegram", self.tell)
            with suppress(Exception):
                if self.app.updater.running:
                    await self.app.updater.stop()
            with suppress(Exception):
                if self.app.running:
                    await self.app.stop()
            await self.app.shutdown()

    async def tell(self, person: str, text: str, once: str = "") -> None:
        """Tell a person something unasked (``bot.session.doors``): about a capture, in the chat it
        came from (``once``: ``telegram:<chat>:<message>``, as a reply to that message when it is
        still there); else in their private chat."""
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

        await doors.interrupted(self.parts, "telegram", tell)

    # --- who is asking --------------------------------------------------------------------

    async def session(self, update: Update) -> Session | None:
        """The asking person's session in this chat, or None after telling a stranger (or a mapped
        person in a group that is not enabled) why not. Groups not listed get no answer at all."""
        user, chat, message = update.effective_user, update.effective_chat, update.effective_message
        if user is None:
            return None
        session = Session(self.parts, "telegram", user.id, chat.id)
        if chat.type != ChatType.PRIVATE and chat.id not in self.cfg.allowed_chats:
            if session.mapped() and session.notice_once(("group", chat.id)):
                await self.reply(message, f"这个群还没有开通：请把群 id {chat.id} 加到 telegram.allowed_chats。\n"
                                          f"Not enabled in this group: add its id {chat.id} to telegram.allowed_chats.")
            return None
        refused = session.who()
        if isinstance(refused, Reply):
            if not refused.quiet:
                await self.reply(message, refused.text)
            return None
        return session

    async def show(self, update: Update, said: Reply) -> None:
        """A session's reply where the person wrote (in their private chat when it is ``private``),
        with its buttons; its ``then`` (what a /sync did) replaces it once done."""
        if said.quiet:
            return
        if said.private:
            await self.privately(update, said.text, markup=self.markup(said.buttons))
            return
        sent = await self.reply(update.effective_message, said.text, markup=self.markup(said.buttons),
                                quote=True if said.quote else None)
        if said.then is not None:
            done = await said.then()
            with suppress(TelegramError):
                await self.edit(sent, done.text)

    @staticmethod
    def markup(rows: list[list[Button]]) -> InlineKeyboardMarkup | None:
        """A session's buttons, at most three a row: ``✍️ 1`` under a gap, ``👍 1 confirm`` under a
        fact, ``👍``, ``Why? / 依据`` under an answer."""
        keys = []
        for row in rows:
            shown = [InlineKeyboardButton(f"{b.icon} {b.n}" if b.kind in ("w", "x") else
                                          " ".join(str(p) for p in (b.icon, b.n, b.words) if p not in ("", None)),
                                          callback_data=b.data) for b in row]
            keys += [shown[i:i + 3] for i in range(0, len(shown), 3)]
        return InlineKeyboardMarkup(keys) if keys else None

    # --- replying ---------------------------------------------------------------------------

    def own(self, token: str) -> bool:
        """A token shown as it is: an address of this install's notes, the bot's own @name, or
        the person's web chat link (``/web``)."""
        try:
            name = (f"@{self.app.bot.username}",)
        except RuntimeError:  # (not connected yet)
            name = ()
        return own_links(self.host.settings.leanote.base_url, name)(token) or web_link(self.parts)(token)

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

    async def privately(self, update: Update, text: str, markup=None) -> None:
        """Answer in the person's private chat (``markup``: buttons under it): a group sees nothing of it."""
        message = update.effective_message
        if update.effective_chat.type == ChatType.PRIVATE:
            await self.reply(message, text, markup=markup)
            return
        try:  # (a flood limit met half-way is waited out: it arrives whole, its buttons under it)
            await self.send(update.effective_user.id, text, markup=markup)
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
