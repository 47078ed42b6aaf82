"""The Discord bot (discord.py 2, application commands).

Slash commands ``/ask question [private]``, ``/search``, ``/reset``, ``/status``, ``/sync``
(admins), ``/why``, the memory's ``/about``, ``/related``, ``/reject``, ``/confirm``, and,
where captures have somewhere to write (Leanote, or the notes folder), ``/note``, ``/append``,
``/remember``, ``/outbox`` and the message menu "Save to Leanote" ("Save to my notes" for a folder). A channel is a shared room: answers are private unless
``discord.public_answers`` is on or the asker passes ``private:false``; everything else is
always ephemeral, each person's conversation is their own, and no message may mention anyone.
Access: guild, channel, user and role ids.

- ``bot``: the client and its command tree, who may use it where (its own rules, then the
  person's session), how a session's reply and buttons are shown, its life;
- ``service``: the commands, menu and buttons put on it (``build``), what ``serve`` runs and
  ``doctor`` checks;
- ``answering``: a question's flow: deferred, streamed into the original response, then embeds
  within Discord's limits and the buttons under the last;
- ``commands``: the commands that are not questions or captures, and what runs before each (a
  note begun with ✍️ ends);
- ``capturing``: writing into the person's Leanote or the notes folder;
- ``buttons``: every button, and what a press does;
- ``media``: a voice clip or an image given to ``/ask``.

Every handler parses the interaction, asks the person's session (``bot.session``) and formats
what comes back.
"""

from bot.discord.answering import embeds_for
from bot.discord.service import FOLDER_SAVE_MENU, SAVE_MENU, build, check, service

__all__ = ["FOLDER_SAVE_MENU", "SAVE_MENU", "build", "check", "embeds_for", "service"]
