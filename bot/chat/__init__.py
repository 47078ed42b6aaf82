"""What the chat doors share besides their session (``bot.session``): an answer streamed into one
message at a steady pace (``pacing``), each use case's result as chat text (``texts``, ``gaps``,
``digest``, ``unasked``), and what ``doctor`` asks of each bot (``checks``)."""
