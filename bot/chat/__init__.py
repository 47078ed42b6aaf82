"""What the two chat bots share: who may ask and how often (``access``), an answer streamed into
one message at a steady pace (``pacing``), what they say that is not an answer, each use case's
result as chat text (``texts``), and what ``doctor`` asks of each (``checks``)."""
