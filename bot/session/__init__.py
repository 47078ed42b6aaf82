"""The chat session every door talks to: one person, through one door, in one place.

- ``session``: ``Session(parts, platform, user_id, place)``: who the person is, their limits,
  and each thing they can do (ask, search, a press on a button, a capture, their gaps …), each
  returning plain data (the module's docstring lists them);
- ``views``: that plain data: ``Reply`` (a refusal is one, with its reason code), ``Button``,
  ``AnswerView``, ``Heard`` (their words, and every refusal's: ``bot.chat.words``);
- ``presses``, ``capturing``: the session's presses, and its captures and media;
- ``limits``: how often a person may ask, and how often a refusal is said again;
- ``doors``: what a door does that is no one person's: the "tell this person" port, the messages
  a restart interrupted, what the door offers here.

A door (``bot.telegram``, ``bot.discord``, the web chat's ``bot.api.chatdoor``) parses what it is
sent, makes a ``Session`` and formats what comes back; it imports nothing of the core past this
package and the views (``bot.chat``, ``bot.render``, ``bot.plain``): ``tests/test_architecture.py``
checks it.
"""

from bot.session.session import Session
from bot.session.views import AnswerView, Button, Heard, Reply

__all__ = ["AnswerView", "Button", "Heard", "Reply", "Session"]
