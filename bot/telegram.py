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

Under each answer: 👍, 👎, "Why?" and "Save as note" (the answer is recorded in
``host.feedback``; a button carries only its id). Only the person who asked may use
them; "Why?" and the saved note's link go to the presser's private chat.

The memory of the notes: ``/about NAME`` (facts with their quotes and the notes that
mention it), ``/related NOTE_ID|question``, each fact or pair with 👍 confirm / 👎 reject
buttons (``mem:<verdict>:<id>``), and ``/reject ID`` / ``/confirm ID``. Always the
asking or pressing person's Leanote user; answered where asked, like ``/search``.

Capture (``host.capture``) writes into the person's own Leanote: ``/note``, a message
(text, photo or document) forwarded to the bot in a private chat, ``/save`` replying
to any message, ``/append``, ``/remember``, and ``/outbox`` for what is still waiting.
A file is checked against ``capture.max_file_mb`` before it is downloaded. The
person's own words keep their Markdown; someone else's text (a forward, ``/save`` on
another's message) goes in as they wrote it (``rag.capture.Quote``). "Save as note"
writes only into the presser's current Leanote user: the one the answer came from.

Long: one platform's front end, each command a handler on one Application, as python-telegram-bot's
own examples keep them; what both bots share is in ``bot.chat.common``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from contextlib import suppress
from dataclasses import fields as dataclass_fields
from datetime import datetime
from typing import Iterator

from bs4 import BeautifulSoup
from telegram import (Bot, BotCommand, InlineKeyboardButton, InlineKeyboardMarkup, LinkPreviewOptions, Message,
                      MessageEntity, MessageOriginChannel, MessageOriginChat, MessageOriginHiddenUser,
                      MessageOriginUser, ReplyParameters, Update)
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, Forbidden, InvalidToken, RetryAfter, TelegramError
from telegram.ext import (Application, ApplicationBuilder, CallbackQueryHandler, CommandHandler, ContextTypes,
                          MessageHandler, filters)

from rag.answer.types import Candidate, Trace
from rag.capture import Attachment, Origin, Quote, Receipt, md_escape, md_label, md_url
from rag.config import secret
from rag.errors import ConfigError
from rag.answer.feedback import NotYours, UnknownAnswer
from rag.redact import redact_in_logs, safe_url

from bot.chat.access import STRANGER, Access, Person
from bot.chat.common import (ABOUT_USAGE, CHECK_TIMEOUT, COMMANDS, EMPTY, HELP, NO_CAPTURE, RELATED_USAGE, SAVING, SORRY,
                     VERDICT_BUTTONS, VERDICT_USAGE, AnswerSaver, CheckResult, Host, MemoryReply, Pacer, Wait, about_reply, conversation_key,
                     count_error, cut_message, hits_text, memory_problem, nobody_mapped, outbox_text, person_key, REMAPPED_WHY,
                     related_reply, sources_first, token_or_problem, trace_text, verdict_reply, with_notice)
from bot.render import TELEGRAM_LIMIT, NoteLinks, telegram_messages, telegram_plain, telegram_sources

log = logging.getLogger(__name__)

NO_PREVIEW = LinkPreviewOptions(is_disabled=True)
TYPING_EVERY = 4.0

NOT_YOURS = "这是别人的回答 / This is someone else's answer"
EXPIRED = "这个回答已经过期了，请再问一次。 / This answer has expired: ask again."
THANKS = "谢谢 / Thanks"
SAVE_USAGE = ("用法 usage: 回复一条消息，发送 /save（可加标题或 #标签） / reply to a message with /save "
              "(a title or #tags may follow)")
MEDIA_HINT = ("要把它存成笔记吗？把 /note 写在说明里，或回复它 /save。 / To save it as a note, put /note in its "
              "caption or reply to it with /save.")
UNSUPPORTED = ("这种消息还存不了：只能存文字、图片和文件。 / This kind of message cannot be saved yet: only text, "
               "photos and documents.")
MEDIA = filters.PHOTO | filters.Document.ALL
_COMMAND = re.compile(r"^/\w+(@\w+)?(?=\s|$)")


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
            ApplicationBuilder().token(token).base_url(self.cfg.base_url).base_file_url(_file_url(self.cfg.base_url))
            .concurrent_updates(True).build()
        )
        self.pacers: list[Pacer] = []  # every answer's pacer (tests, benchmark)
        self.saver = AnswerSaver(host)  # "Save as note" under answers
        a = self.app
        private = filters.ChatType.PRIVATE
        # a forward in a private chat is a capture, never a question or a command: first
        a.add_handler(MessageHandler(filters.FORWARDED & private, self.on_forward))
        a.add_handler(CommandHandler(["start", "help"], self.on_help))
        a.add_handler(CommandHandler("ask", self.on_ask))
        a.add_handler(CommandHandler("search", self.on_search))
        a.add_handler(CommandHandler("reset", self.on_reset))
        a.add_handler(CommandHandler("status", self.on_status))
        a.add_handler(CommandHandler("sync", self.on_sync))
        a.add_handler(CommandHandler("why", self.on_why))
        a.add_handler(CommandHandler("note", self.on_note))
        a.add_handler(CommandHandler("append", self.on_append))
        a.add_handler(CommandHandler("remember", self.on_remember))
        a.add_handler(CommandHandler("save", self.on_save))
        a.add_handler(CommandHandler("outbox", self.on_outbox))
        a.add_handler(CommandHandler("about", self.on_about))
        a.add_handler(CommandHandler("related", self.on_related))
        a.add_handler(CommandHandler("reject", self.on_reject))
        a.add_handler(CommandHandler("confirm", self.on_confirm))
        # a photo or document: "/note ..." as its caption captures it, anywhere the bot listens
        a.add_handler(MessageHandler(MEDIA & filters.CaptionRegex(r"^/note(@\w+)?(\s|$)"), self.on_media_note))
        a.add_handler(MessageHandler(MEDIA & private, self.on_media_hint))
        a.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, self.on_text))
        a.add_handler(CallbackQueryHandler(self.on_button))
        a.add_error_handler(self.on_error)  # where every unexpected error of a handler ends

    async def on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        """An update's handler failed: logged here once, with its traceback, counted, and the
        person told in one line that names no detail (a button press gets it as an alert)."""
        log.error("telegram: handling an update failed", exc_info=context.error)
        count_error(self.host, "telegram")
        if not isinstance(update, Update):
            return
        with suppress(TelegramError):  # (a press may have been answered already)
            if update.callback_query is not None:
                await update.callback_query.answer(SORRY[:200], show_alert=True)
            elif update.effective_message is not None:
                await update.effective_message.reply_text(SORRY)

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
            await self.app.updater.start_polling(allowed_updates=["message", "callback_query"])
            log.info("telegram bot @%s is polling", self.app.bot.username)
            capture = getattr(self.host, "capture", None)
            if capture is not None:  # a capture whose answer a kill cut off is told when it is written
                capture.announce_with("telegram", self.announce)
            await self.host.stopping.wait()
        finally:
            capture = getattr(self.host, "capture", None)
            if capture is not None:
                capture.stop_announcing("telegram", self.announce)
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
        await self._retrying(lambda: self.app.bot.send_message(chat_id, text, reply_parameters=reply,
                                                               link_preview_options=NO_PREVIEW))

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
        if not await self._may_search(update):
            return
        query, notice = cut_message(self.host.settings, query)
        hits = await self.host.answers.search(query, person.leanote_user_id, 8)
        await update.effective_message.reply_text(with_notice(hits_text(hits), notice), link_preview_options=NO_PREVIEW)

    async def _may_search(self, update: Update) -> bool:
        """Counts a question or a search against the person's ``bots.rate_limit``; when it
        is over, says so and returns False."""
        wait = self.access.rate("telegram", update.effective_user.id)
        if wait:
            await update.effective_message.reply_text(self.access.slow_down(wait))
            return False
        return True

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
        text = await asyncio.to_thread(self.host.status_text, None if person.admin else person.leanote_user_id)
        await self._privately(update, text)

    async def on_sync(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        person = await self._who(update)
        if person is None:
            return
        if not person.admin:
            await update.effective_message.reply_text("只有管理员可以 /sync。 / Only admins may /sync.")
            return
        said = await update.effective_message.reply_text("开始同步… / Syncing…")
        done = await self.host.sync_for_chat()  # what the pass did, when it is done
        with suppress(TelegramError):
            await self._retrying(lambda: said.edit_text(done[:TELEGRAM_LIMIT], link_preview_options=NO_PREVIEW))

    async def on_why(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        person = await self._who(update)
        if person is None:
            return
        trace = self.host.answers.conversations.trace(person.leanote_user_id, self.conversation(update))
        await self._privately(update, trace_text(trace))

    # --- capture ----------------------------------------------------------------------------

    async def on_note(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        person = await self._who(update)
        if person is None:
            return
        message = update.effective_message
        await self._capture(update, person, _after_command(_markdown(message.text or "", message.entities)))

    async def on_media_note(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """A photo or document with "/note ..." as its caption."""
        person = await self._who(update)
        if person is None:
            return
        message = update.effective_message
        await self._capture(update, person, _after_command(_markdown(message.caption or "", message.caption_entities)),
                            source=message)

    async def on_forward(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """Forwarded to the bot in a private chat: a capture, with where it came from."""
        person = await self._who(update)
        if person is None:
            return
        message = update.effective_message
        if not _capturable(message):
            await message.reply_text(UNSUPPORTED)
            return
        await self._capture(update, person, "", origin=_origin(message), source=message, quote=_quote(message))

    async def on_media_hint(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """A photo or document in a private chat, neither forwarded nor with /note: how to keep it."""
        if await self._who(update) is not None:
            await update.effective_message.reply_text(MEDIA_HINT)

    async def on_save(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """``/save`` replying to a message: that message (its text, files and origin) as a note;
        words after /save go first (a title, #tags)."""
        person = await self._who(update)
        if person is None:
            return
        message = update.effective_message
        target = message.reply_to_message
        if target is None:
            await message.reply_text(SAVE_USAGE)
            return
        if not _capturable(target):
            await message.reply_text(UNSUPPORTED)
            return
        extra = _after_command(message.text)
        own = target.forward_origin is None and target.from_user is not None and \
            target.from_user.id == update.effective_user.id
        if own:  # their own message: their words, as they wrote them
            text = "\n\n".join(t for t in (extra, _message_text(target)) if t.strip())
            await self._capture(update, person, text, origin=_origin(target), source=target)
        else:  # someone else's: shown as they wrote it
            await self._capture(update, person, extra, origin=_origin(target), source=target, quote=_quote(target))

    async def on_append(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await self._add_text(update, "append")

    async def on_remember(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await self._add_text(update, "remember")

    async def _add_text(self, update: Update, how: str) -> None:
        """``/append`` or ``/remember``: the command's text, added by ``Capturer.append`` / ``remember``."""
        person = await self._who(update)
        if person is None:
            return
        capture = await self._capturer(update)
        if capture is not None:
            receipt = await getattr(capture, how)(self._key(update), person.leanote_user_id,
                                                  _after_command(update.effective_message.text),
                                                  once=_once(update))
            await self._tell(update, receipt)

    async def on_outbox(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        person = await self._who(update)
        if person is None:
            return
        capture = await self._capturer(update)
        if capture is not None:
            await self._privately(update, outbox_text(await asyncio.to_thread(capture.pending, self._key(update))))

    @staticmethod
    def _key(update: Update) -> str:
        return person_key("telegram", update.effective_user.id)

    async def _capturer(self, update: Update):
        capture = getattr(self.host, "capture", None)
        if capture is None:
            await update.effective_message.reply_text(NO_CAPTURE)
        return capture

    async def _tell(self, update: Update, receipt: Receipt) -> None:
        await update.effective_message.reply_text(receipt.message, link_preview_options=NO_PREVIEW)

    async def _capture(self, update: Update, person: Person, text: str, *, origin: Origin | None = None,
                       source: Message | None = None, quote: Quote | None = None) -> None:
        """A new note from ``text`` and the photo or document of ``source``; the receipt as the reply."""
        capture = await self._capturer(update)
        if capture is None:
            return
        key = self._key(update)
        cfg = self.host.settings.capture
        why = capture.available()
        if why:  # say so before fetching any file
            await update.effective_message.reply_text(why)
            return
        files: list[Attachment] = []
        if source is not None:
            try:
                files, problem = await self._files(source, cfg.max_file_mb)
            except TelegramError as err:
                log.warning("could not fetch a file from Telegram: %s", err)
                problem = ("没能从 Telegram 取到这个文件，请再发一次。 / Could not fetch the file from Telegram; "
                           "please send it again.")
            if problem:
                await update.effective_message.reply_text(problem)
                return
        receipt = await capture.note(key, person.leanote_user_id, text, origin=origin, files=files, quote=quote,
                                     once=_once(update))
        await self._tell(update, receipt)

    async def _files(self, message: Message, max_mb: float) -> tuple[list[Attachment], str | None]:
        """The photo (its largest size) or document of a message, fetched; or why not
        (too large: refused from the size Telegram tells, before any download)."""
        if message.photo:
            item = message.photo[-1]
            name, mime = f"photo_{item.file_unique_id}.jpg", "image/jpeg"
        elif message.document:
            item = message.document
            name = item.file_name or f"file_{item.file_unique_id}"
            mime = item.mime_type or "application/octet-stream"
        else:
            return [], None
        limit = max_mb * 1024 * 1024
        if item.file_size is not None and item.file_size > limit:
            return [], _too_large(name, max_mb)
        got = await item.get_file()
        if got.file_size is not None and got.file_size > limit:
            return [], _too_large(name, max_mb)
        data = bytes(await got.download_as_bytearray())
        if len(data) > limit:
            return [], _too_large(name, max_mb)
        return [Attachment(name, data, mime)], None

    # --- the memory of the notes ---------------------------------------------------------------

    async def on_about(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await self._memory(update, "about", " ".join(context.args or []))

    async def on_related(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await self._memory(update, "related", " ".join(context.args or []))

    async def _memory(self, update: Update, what: str, target: str) -> None:
        """``/about`` or ``/related``: answered where asked (as ``/search``), with the buttons."""
        person = await self._who(update)
        if person is None:
            return
        message = update.effective_message
        if not target.strip():
            await message.reply_text(ABOUT_USAGE if what == "about" else RELATED_USAGE)
            return
        problem = memory_problem(self.host)
        if problem:
            await message.reply_text(problem)
            return
        if not await self._may_search(update):
            return
        target, notice = cut_message(self.host.settings, target)
        if what == "about":
            reply = await about_reply(self.host, person.leanote_user_id, target)
        else:
            reply = await related_reply(self.host, person.leanote_user_id, target)
        parts = _chunks(with_notice(reply.text, notice), 4000)
        for i, part in enumerate(parts):
            keys = _memory_buttons(reply) if i == len(parts) - 1 else None
            await message.reply_text(part, link_preview_options=NO_PREVIEW, reply_markup=keys)

    async def on_reject(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await self._verdict_command(update, context, "rejected")

    async def on_confirm(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await self._verdict_command(update, context, "confirmed")

    async def _verdict_command(self, update: Update, context: ContextTypes.DEFAULT_TYPE, verdict: str) -> None:
        person = await self._who(update)
        if person is None:
            return
        args = context.args or []
        if len(args) != 1:
            await update.effective_message.reply_text(VERDICT_USAGE)
            return
        _, text = await verdict_reply(self.host, person.leanote_user_id, args[0], verdict, self._key(update))
        await update.effective_message.reply_text(text, link_preview_options=NO_PREVIEW)

    async def _memory_button(self, query, verdict: str, item_id: str) -> None:
        """👍 / 👎 under /about or /related: the presser's own memory, whoever asked. An id of
        another Leanote user's memory does not resolve in the presser's: nothing changes."""
        person = self.access.person("telegram", query.from_user.id)
        if not isinstance(person, Person):
            text = STRANGER["telegram"].format(id=query.from_user.id) if person is None else person
            await query.answer(text[:200], show_alert=True)
            return
        changed, text = await verdict_reply(self.host, person.leanote_user_id, item_id, verdict,
                                            person_key("telegram", query.from_user.id))
        await query.answer(text[:200], show_alert=not changed)
        if changed and verdict == "rejected" and query.message is not None:  # its buttons go with it
            markup = query.message.reply_markup
            rows = [[b for b in row if not (b.callback_data or "").endswith(f":{item_id}")]
                    for row in (markup.inline_keyboard if markup else ())]
            rows = [r for r in rows if r]
            with suppress(TelegramError):
                await query.edit_message_reply_markup(InlineKeyboardMarkup(rows) if rows else None)

    # --- the buttons under an answer ---------------------------------------------------------

    def _buttons(self, update: Update, person: Person, answer) -> InlineKeyboardMarkup | None:
        """Record the answer (``host.feedback``) and the buttons carrying its id; None without a store."""
        feedback = getattr(self.host, "feedback", None)
        if feedback is None:
            return None
        try:
            answer_id = feedback.record(self._key(update), person.leanote_user_id, answer, self.conversation(update))
        except Exception:
            log.exception("could not record an answer for its buttons")
            return None
        row = [InlineKeyboardButton("👍", callback_data=f"fb:up:{answer_id}"),
               InlineKeyboardButton("👎", callback_data=f"fb:down:{answer_id}"),
               InlineKeyboardButton("Why? / 依据", callback_data=f"why:{answer_id}")]
        if answer.citations:  # an answer from the notes; "nothing found" is not worth a note
            row.append(InlineKeyboardButton("Save as note / 存为笔记", callback_data=f"save:{answer_id}"))
        return InlineKeyboardMarkup([row[:3], row[3:]] if len(row) > 3 else [row])

    async def on_button(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        query = update.callback_query
        if (query.data or "").startswith("mem:"):  # under /about or /related
            _, verdict, item_id = query.data.split(":", 2) if query.data.count(":") == 2 else ("", "", "")
            if verdict in ("rejected", "confirmed"):
                await self._memory_button(query, verdict, item_id)
            else:
                await query.answer(EXPIRED, show_alert=True)
            return
        kind, _, answer_id = (query.data or "").rpartition(":")
        presser = person_key("telegram", query.from_user.id)
        feedback = getattr(self.host, "feedback", None)
        if kind not in ("fb:up", "fb:down", "why", "save") or feedback is None:
            await query.answer(EXPIRED, show_alert=True)
            return
        try:
            record = await asyncio.to_thread(feedback.get, answer_id, presser)
        except NotYours:
            await query.answer(NOT_YOURS, show_alert=True)
            return
        if record is None:
            await query.answer(EXPIRED, show_alert=True)
            return
        person = self.access.person("telegram", query.from_user.id)  # as the config says now
        if not isinstance(person, Person):
            await query.answer(STRANGER["telegram"].format(id=query.from_user.id)[:200], show_alert=True)
            return
        try:
            if kind.startswith("fb:"):
                await asyncio.to_thread(feedback.verdict, answer_id, presser, kind[3:])
                await query.answer(THANKS)
            elif kind == "why" and person.leanote_user_id != record.user_id:
                await query.answer(REMAPPED_WHY[:200], show_alert=True)  # another Leanote user's notes now
            elif kind == "why":
                trace = _trace(record.trace)
                await self._to_presser(query, trace_text(trace) if trace is not None else
                                       f"问题 question: {record.question}\n这个回答没有记录依据。 / No trace was kept "
                                       f"for this answer.")
            else:
                await self._save_answer(query, presser, person, record)
        except NotYours:
            await query.answer(NOT_YOURS, show_alert=True)
        except UnknownAnswer:
            await query.answer(EXPIRED, show_alert=True)

    async def _save_answer(self, query, presser: str, person: Person, record) -> None:
        why_not = await self.saver.not_now(presser, person, record)
        if why_not is not None:
            if why_not.how == "alert":
                await query.answer(why_not.text[:200], show_alert=True)
            elif why_not.how == "brief":
                await query.answer(why_not.text)
            else:
                await self._to_presser(query, why_not.text)
            return
        await query.answer(SAVING)
        receipt = await self.saver.save(presser, record)
        await self._to_presser(query, receipt.message, answered=True)

    async def _to_presser(self, query, text: str, answered: bool = False) -> None:
        """Send ``text`` to whoever pressed, in their private chat (a group sees nothing of it)."""
        user_id = query.from_user.id
        message = query.message
        private = message is not None and message.chat.type == ChatType.PRIVATE and message.chat.id == user_id
        try:
            for part in _chunks(text, 4000):
                await self.app.bot.send_message(user_id, part, link_preview_options=NO_PREVIEW)
        except Forbidden:  # never opened a private chat with the bot
            if not answered:
                await query.answer(f"请先私聊我（@{self.app.bot.username}）。 / Open a private chat with "
                                   f"@{self.app.bot.username} first.", show_alert=True)
            return
        if not answered:
            await query.answer(None if private else "已私信给你。 / Sent to you privately.")

    # --- answering --------------------------------------------------------------------------

    async def _answer(self, update: Update, question: str) -> None:
        person = await self._who(update)
        if person is None:
            return
        if not (question or "").strip():  # a blank message, or only the bot's @name
            await update.effective_message.reply_text(EMPTY)
            return
        if not await self._may_search(update):
            return
        question, notice = cut_message(self.host.settings, question)
        chat = update.effective_chat
        placeholder = await self._retrying(lambda: update.effective_message.reply_text("…"))

        reading = {"links": NoteLinks(), "web": set()}  # the sources' links, once they are known

        def sources(found) -> None:
            reading["links"] = NoteLinks(found)
            reading["web"] = {c.url for c in found if c.url.startswith(("http://", "https://"))}
            pacer.show_first(sources_first(found))

        async def edit(text: str) -> None:  # every link-like token inert, but the sources' own
            try:
                await placeholder.edit_text(telegram_plain(text, reading["links"], reading["web"]),
                                            parse_mode=ParseMode.HTML, link_preview_options=NO_PREVIEW)
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
                question, person.leanote_user_id, conversation=self.conversation(update), on_token=pacer.feed,
                on_sources=sources, caller=person_key("telegram", update.effective_user.id),
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
        body = answer.shown + "".join(f"\n\n*{n}*" for n in (answer.notice, notice) if n)
        if answer.citations:
            sources = telegram_sources(answer.citations, "来源 Sources")
        else:
            sources = telegram_sources(answer.closest, "最接近的笔记 Closest notes")
        markup = await asyncio.to_thread(self._buttons, update, person, answer)  # a write to the feedback store
        await self._final(placeholder, telegram_messages(body, sources, links=NoteLinks(answer.citations)), html=True,
                          markup=markup)

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

    async def _final(self, placeholder: Message, parts: list[str], html: bool,
                     markup: InlineKeyboardMarkup | None = None) -> None:
        """The answer's messages: the first replaces the placeholder; the buttons go under the last."""
        for i, part in enumerate(parts):
            mode = ParseMode.HTML if html else None
            keys = markup if i == len(parts) - 1 else None

            async def send(text=part, mode=mode, first=(i == 0), keys=keys):
                if first:
                    return await placeholder.edit_text(text, parse_mode=mode, link_preview_options=NO_PREVIEW,
                                                       reply_markup=keys)
                return await placeholder.chat.send_message(text, parse_mode=mode, link_preview_options=NO_PREVIEW,
                                                           reply_markup=keys)

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
                await self._retrying(lambda text=plain, first=(i == 0), keys=keys: (
                    placeholder.edit_text(text, link_preview_options=NO_PREVIEW, reply_markup=keys) if first
                    else placeholder.chat.send_message(text, link_preview_options=NO_PREVIEW, reply_markup=keys)))


def _memory_buttons(reply: MemoryReply) -> InlineKeyboardMarkup | None:
    """👍 n confirm / 👎 n reject for each fact or pair with an id (a row each)."""
    if not reply.items:
        return None
    return InlineKeyboardMarkup([[InlineKeyboardButton(f"{icon} {n} {word}", callback_data=f"mem:{verdict}:{item_id}")
                                  for verdict, icon, word in VERDICT_BUTTONS] for n, item_id in reply.items])


def _once(update: Update) -> str:
    """What a capture from this update comes from: its chat and message (Telegram sends an
    update again until a poll confirms it; the same message must not become two notes)."""
    message = update.effective_message
    return f"telegram:{update.effective_chat.id}:{message.message_id}"


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _file_url(base_url: str) -> str:
    """Where the Bot API serves files: ``.../bot`` -> ``.../file/bot`` (api.telegram.org,
    a self-hosted server, the tests' fake)."""
    base = base_url.rstrip("/")
    return base[: -len("/bot")] + "/file/bot" if base.endswith("/bot") else base + "/file/bot"


def _after_command(text: str | None) -> str:
    """What follows ``/command`` (or ``/command@bot``), newlines kept."""
    return _COMMAND.sub("", (text or "").lstrip(), count=1).strip()


def _too_large(name: str, max_mb: float) -> str:
    return f"文件 {name} 太大：最多 {max_mb:g} MB，没有保存。 / {name} is too large: at most {max_mb:g} MB; nothing was saved."


def _markdown(text: str, entities, literal: bool = False) -> str:
    """The text with its hidden links (``text_link``: words that link somewhere) as Markdown
    links, their words shown as written; the rest as written: the person's own Markdown, or
    with ``literal`` (someone else's text) escaped so that it shows as written. Offsets are
    in UTF-16 code units."""
    links = sorted((e for e in (entities or ()) if e.type == MessageEntity.TEXT_LINK and e.url),
                   key=lambda e: e.offset)
    plain = md_escape if literal else (lambda part: part)
    units = text.encode("utf-16-le")
    out, pos = [], 0
    for e in links:
        start, end = e.offset * 2, (e.offset + e.length) * 2
        if start < pos or end > len(units):
            continue
        out.append(plain(units[pos:start].decode("utf-16-le", "replace")))
        out.append(f"[{md_label(units[start:end].decode('utf-16-le', 'replace'))}]({md_url(e.url)})")
        pos = end
    out.append(plain(units[pos:].decode("utf-16-le", "replace")))
    return "".join(out)


def _capturable(message: Message) -> bool:
    """Text, a caption, a photo or a document: what a capture can hold (not a sticker, a poll...)."""
    return bool(_message_text(message).strip() or message.photo or message.document)


def _message_text(message: Message) -> str:
    if message.text is not None:
        return _markdown(message.text, message.entities)
    return _markdown(message.caption or "", message.caption_entities)


def _quote(message: Message) -> Quote:
    """Someone else's message (its text or caption) for a capture: as they wrote it, links kept."""
    text, entities = ((message.text, message.entities) if message.text is not None
                      else (message.caption or "", message.caption_entities))
    return Quote(text, _markdown(text, entities, literal=True))


def _name(user) -> str:
    return user.full_name + (f" (@{user.username})" if user.username else "")


def _origin(message: Message) -> Origin | None:
    """Where a forwarded message came from: who, which chat, when, and a link when the chat is public."""
    o = message.forward_origin
    if o is None:
        return None
    when = o.date.astimezone() if isinstance(o.date, datetime) else None
    if isinstance(o, MessageOriginUser):
        return Origin(who=_name(o.sender_user), when=when)
    if isinstance(o, MessageOriginHiddenUser):
        return Origin(who=o.sender_user_name, when=when)
    if isinstance(o, MessageOriginChat):
        chat = o.sender_chat
        link = f"https://t.me/{chat.username}" if chat.username else ""
        return Origin(who=o.author_signature or "", chat=chat.title or chat.username or "", when=when, link=link)
    if isinstance(o, MessageOriginChannel):
        chat = o.chat
        link = f"https://t.me/{chat.username}/{o.message_id}" if chat.username else ""
        return Origin(who=o.author_signature or "", chat=chat.title or chat.username or "", when=when, link=link)
    return Origin(when=when)


def _trace(stored: dict | None) -> Trace | None:
    """The trace of a recorded answer, rebuilt for ``trace_text`` (unknown keys ignored)."""
    if not stored:
        return None
    known = {f.name for f in dataclass_fields(Trace)}
    cand = {f.name for f in dataclass_fields(Candidate)}
    data = {k: v for k, v in stored.items() if k in known}
    data["candidates"] = [Candidate(**{k: v for k, v in c.items() if k in cand}) for c in stored.get("candidates") or []]
    return Trace(**data)


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
