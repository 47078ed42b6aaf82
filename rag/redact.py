"""Secrets stay out of what we print and log.

- ``safe_url`` drops the ``user:password@`` part of every URL in a text (a Qdrant,
  MongoDB, Leanote or Ollama address may carry one);
- ``Redact`` is a logging filter doing the same to every log line, and replacing
  known secrets (bot tokens, which Telegram puts in its request URLs) by ``***``.
"""

from __future__ import annotations

import logging
import re

_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)[^/\s@]*@", re.I)


def safe_url(text: str) -> str:
    """The text with the credentials of every URL in it removed."""
    return _USERINFO.sub(r"\1", text) if "@" in text else text


class Redact(logging.Filter):
    def __init__(self, *secrets: str):
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = safe_url(message)
        for secret in self.secrets:
            clean = clean.replace(secret, "***")
        if clean != message:
            record.msg, record.args = clean, ()
        return True


def redact_in_logs(*secrets: str) -> None:
    """Install the filter on the root logger and every handler it has: once each, however often
    it is called (a bot restarted by its supervisor calls it again), with every secret named."""
    root = logging.getLogger()
    for target in [root, *root.handlers]:
        mine = next((f for f in target.filters if isinstance(f, Redact)), None)
        if mine is None:
            target.addFilter(Redact(*secrets))
        else:
            mine.secrets.extend(s for s in secrets if s and s not in mine.secrets)
