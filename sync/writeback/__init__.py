"""Notes out: captures from chat written into the person's own Leanote, exactly once, through a
durable outbox (``outbox``) that outlives Leanote being down and the process being killed
(``capture``)."""
