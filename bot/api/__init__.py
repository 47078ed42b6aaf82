"""The daemon's HTTP API: one door for the CLI, scripts, monitoring and the explorer page.

``app`` is the FastAPI application, ``guard`` keeps its TCP listener from being held, ``client``
is how another process (the CLI, ``doctor``, a second ``serve``) reaches it, ``metrics`` what it
counts for Prometheus, and ``explorer/`` the page it serves over the memory of the notes.
"""
