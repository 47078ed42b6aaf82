"""What ``leanote-rag doctor`` asks of each chat bot: its ``check(settings)`` yields
``(name, ok, detail, fix)`` per finding (``bot.root.checks``). Tokens never appear."""

from __future__ import annotations

from typing import Iterator

from rag.config import Settings, secret
from rag.errors import UserError

CheckResult = tuple[str, bool, str, str]
CHECK_TIMEOUT = 15.0


def token_or_problem(token_env: str, what: str, name: str) -> tuple[str | None, CheckResult | None]:
    try:
        return secret(token_env, what), None
    except UserError as err:
        return None, (name, False, str(err), f"put {token_env}=... in the service's environment file "
                      f"(/etc/leanote-rag/env), then restart")


def nobody_mapped(settings: Settings, platform: str) -> Iterator[CheckResult]:
    ids = [i for u in settings.users for i in u.ids_on(platform)]
    if not ids:
        yield (f"{platform} users", False, f"nobody is mapped to a Leanote user for {platform}: the bot refuses "
               f"everyone", f"add to users: {{leanote_user_id: ..., {platform}_ids: [your id]}} (the bot tells "
               f"a stranger their id)")
