"""What a person can do, each written once: every door (Telegram, Discord, the HTTP API and its
explorer page, the command line) parses its input, calls one of these and renders what comes back.

Each use case is a function ``(parts, person, plain values) -> plain data``: ``parts`` is the
composition root (``bot.root.Parts``), which builds every store and model; ``person`` a
``people.Person`` (who asks, their Leanote user, whether they are an admin, their conversation);
what comes back is a dataclass with a JSON form (``as_json``; ``from_json`` where a client of
the API reads it back), or a type of the core's that has one (``rag.answer.types.Answer``,
``rag.model.Hit``, ``rag.capture.Receipt``). No chat, HTTP or command-line type goes in or out.

- ``asking``: ask, search, why (the trace of the last answer), reset (forget the conversation);
- ``answers``: what the buttons under a sent answer do: rate it, why, save it as a note;
- ``memory``: about a name, related notes, confirm or reject a fact or pair, and the explorer's
  find, graph and note card;
- ``capture``: a note, an addition to the last one, a line to remember, what waits in the outbox;
- ``gaps``: the questions the person's notes could not answer: kept, listed, dismissed, written as
  a note, closed when a synced note answers them; ``digest``: the person's digest and its plan;
- ``running``: the status, a sync now, which users' notes a person may ask;
- ``people``: the person, and which Leanote user an account's email is;
- ``signin``: the web chat's sign-in: a bot's one-time link, a session opened by it or an API token.

A use case refuses bad input with a ``rag.errors.UserError`` that says what is wrong; the door
shows it in its own way.
"""
