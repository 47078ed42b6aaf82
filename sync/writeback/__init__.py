"""Notes out: captures from chat written into the person's own Leanote (``leanote``) or as Markdown
files into the notes folder (``folder``), the target the config chooses (``targets``), exactly once,
through a durable outbox (``outbox``) that outlives Leanote being down and the process being killed
(``capture``)."""
