"""The daemon: ``leanote-rag serve``, one process that hosts the sync, the bots and the API.

``root`` is the composition root (the parts ``serve`` runs and ``doctor`` checks); ``cli``
is the command line (``main``: the ``leanote-rag`` command), ``door`` and ``client`` how it
reaches the notes (here, or through a running daemon). ``host.Daemon`` opens the index, the answer service and the sync,
schedules the passes, reloads on SIGHUP and stops on SIGTERM; ``api`` is its HTTP API and
the explorer page (``explorer/``); ``capture`` writes notes from chat into Leanote
through a durable outbox (``outbox``); ``notify`` speaks systemd's notify protocol; ``metrics`` (Prometheus) and
``metrics_wiring`` (what feeds it) count; ``report`` builds what ``status`` prints; ``doctor`` checks
every part.

The only place that imports ``bot/``; ``sync/`` outside this folder never imports it.
"""
