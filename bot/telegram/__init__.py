"""The Telegram bot (python-telegram-bot v22, long polling).

In a private chat any text is a question. Groups are shared rooms and opt-in: the bot answers
only in groups listed in ``telegram.allowed_chats``, to ``/ask``, a mention or a reply to the
bot, and everyone there sees the question and the answer with its sources. Each person's
conversation (follow-ups, ``/why``, ``/reset``) is their own, also in a group; ``/why`` and
``/status`` asked in a group are answered in the person's private chat with the bot. Updates
are handled concurrently, so one person's question never waits for another's.

- ``bot``: the bot on its Application: who is asking, replies in private, its life;
- ``service``: the handlers put on it (``build``), what ``serve`` runs and ``doctor`` checks;
- ``answering``: a question's flow: streamed into a placeholder, then the final messages and
  the buttons under them;
- ``commands``: the commands that are not questions or captures (``/search``, ``/status``,
  ``/about``, ``/gaps`` ...), and what runs before every command (a note begun with ✍️);
- ``capturing``: ``/note``, forwards, ``/save``, ``/append``, ``/remember``, ``/outbox``, and
  a Telegram message read as Markdown;
- ``buttons``: a press on any button, shown;
- ``media``: voice messages and photos with a question.

Every handler parses the update, asks the person's session (``bot.session``) and formats what
comes back; the texts are ``bot.chat``'s (refusals and buttons: ``bot.chat.words``), the HTML
``bot.render``'s.
"""

from bot.telegram.service import check, service

__all__ = ["check", "service"]
