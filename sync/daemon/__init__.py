"""The daemon: ``leanote-rag serve``, one process that hosts the sync, the bots and the API.

``main`` is the composition root (the ``leanote-rag`` command: the CLI's commands, and the
parts ``serve`` runs). ``host.Daemon`` opens the index, the answer service and the sync,
schedules the passes, reloads on SIGHUP and stops on SIGTERM; ``api`` is its HTTP API and
the explorer page (``explorer/``); ``capture`` writes notes from chat into Leanote
through a durable outbox; ``notify`` speaks systemd's notify protocol; ``metrics_wiring``
feeds the Prometheus metrics; ``report`` builds what ``status`` prints; ``doctor`` checks
every part.

The only place that imports ``bot/``; ``sync/`` outside this folder never imports it.
"""
