"""Which Leanote login writes as whom: the accounts capture logs in with (``capture.accounts``,
then the ``leanote_api`` source's), logged in side by side to learn whose each is (kept in the
outbox, so a login that fails later is known to be its own user's), each login's failure kept
for ``status`` and logged once when it starts and once when it ends. A mixin of
``sync.writeback.leanote.LeanoteTarget``."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures import as_completed

from rag.config import Settings, secret
from rag.errors import LeanoteRagError, Unavailable
from rag.sections import Account

from sync.sources.leanote_api import LeanoteApi, LeanoteWriter
from sync.writeback.targets import Failures, LoginFailed

log = logging.getLogger(__name__)


def accounts_of(settings: Settings) -> list[Account]:
    """The accounts capture logs in with: ``capture.accounts``, then the ``leanote_api``
    source's accounts it does not name."""
    accounts = list(settings.capture.accounts)
    if settings.source.kind == "leanote_api":
        accounts += [a for a in settings.source.accounts if a.email.lower() not in {b.email.lower() for b in accounts}]
    return accounts


def account_emails(settings: Settings) -> list[str]:
    return [a.email.strip().lower() for a in accounts_of(settings)]


NOT_IDENTIFIED = ("还没能确认哪个 Leanote 登录是你的：有一个登录失败了（主人可在日志里看到原因），稍后自动重试。 / Could not "
                  "tell yet which Leanote login is yours: a login failed (the owner sees why in the log); "
                  "retried later.")


class Logins(Failures):
    """The logins of a ``LeanoteTarget`` (its ``settings``, ``outbox``, ``clock``, ``_apis``,
    ``_users``, ``_account_locks``, ``_failing``, ``_lock``, ``_logins`` pool, ``_closing``)."""

    def _accounts(self) -> list[Account]:
        return accounts_of(self.settings)

    def _base_url(self) -> str:
        s = self.settings
        return (s.capture.api_url or s.source.api_url or s.leanote.base_url).rstrip("/")

    def how_to_enable(self) -> str:
        return ("记录需要你的 Leanote 账号通过 API 登录：请主人在配置里 capture.accounts 加上你的 email 和 password_env。 / "
                "Capture writes through Leanote's API with your account: ask the owner to add your email and "
                "password_env under capture.accounts in the config.")

    def _user_of(self, email: str) -> str | None:
        """The Leanote user an account logs in as, once known (learnt this run, or kept from before)."""
        user_id = self._users.get(email)
        if user_id is None:
            user_id = self.outbox.login_user(email)
            if user_id is not None:
                self._users[email] = user_id
        return user_id

    def _learn(self, email: str, user_id: str) -> None:
        if user_id and self._users.get(email) != user_id:
            self._users[email] = user_id
            self.outbox.set_login_user(email, user_id)

    def _account_lock(self, email: str) -> threading.Lock:
        with self._lock:
            return self._account_locks.setdefault(email, threading.Lock())

    def _writer(self, user_id: str) -> LeanoteWriter | None:
        """The login writing as this Leanote user; None when no configured account is
        theirs. Its own login's failure is raised (it is this user's); other accounts are
        only logged in to learn whose they are, side by side, and their errors go to the log."""
        accounts = {a.email.strip().lower(): a for a in self._accounts()}
        email = next((e for e in accounts if self._user_of(e) == user_id), None)
        if email is None:
            email = self._identify(user_id, accounts)
            if email is None:
                return None
        try:
            api = self._sign_in(accounts[email])
        except (LeanoteRagError, OSError) as err:
            raise LoginFailed(str(err)) from err
        if api.user_id != user_id:  # the account logs in as someone else now: never write as them
            self._learn(email, api.user_id)
            if self._starts_failing(f"user:{user_id}", "another user"):
                log.warning("captures for Leanote user %s: %s logs in as Leanote user %s now; they wait for a "
                            "login of theirs (capture.accounts)", user_id, email, api.user_id)
            raise LoginFailed(NOT_IDENTIFIED)
        self._learn(email, api.user_id)
        return LeanoteWriter(api)

    def _sign_in(self, account: Account) -> LeanoteApi:
        """The account's connection, logged in: a failure (its password not set, Leanote
        refusing it or not answering) is kept for ``status`` and logged once when this
        account's login starts failing (or fails in another way), and once when it works again."""
        email = account.email.strip().lower()
        api = None
        with self._account_lock(email):
            try:
                api = self._api(account)
                if api.user_id:
                    return api
                api.login()
            except (LeanoteRagError, OSError) as err:
                if not (self._closing or (api is not None and api.stopping)):  # not cut off by a stop
                    self._login_failed(email, err)
                raise
        self._login_worked(email)
        return api

    def _login_failed(self, email: str, err: BaseException) -> None:
        self.outbox.login_failed(email, self._user_of(email) or "", str(err), self.clock())
        if self._starts_failing(f"login:{email}", err):
            log.warning("captures: cannot log in to Leanote as %s: %s. Its captures wait, tried again with backoff",
                        email, err)
        else:
            log.debug("captures: cannot log in to Leanote as %s: %s", email, err)

    def _login_worked(self, email: str) -> None:
        was = self.outbox.login_worked(email)
        if self._works_again(f"login:{email}") or was:
            log.info("captures: logged in to Leanote as %s again", email)

    def _who(self, user_id: str) -> str:
        """A Leanote user as the log names it: its account's email too, when known."""
        email = next((e for e, u in list(self._users.items()) if u == user_id), None)
        return f"Leanote user {user_id} ({email})" if email else f"Leanote user {user_id}"

    def _identify(self, user_id: str, accounts: dict[str, Account]) -> str | None:
        """Log in every account not known yet, all at once, until one turns out to be this
        user's: its email; None when none is (every login worked). ``Unavailable`` (saying no
        other account's name or error) when some login failed, so it may have been theirs."""
        unknown = [e for e in accounts if self._user_of(e) is None]
        if not unknown:
            return None
        try:
            futures = {self._logins.submit(self._login, accounts[e]): e for e in unknown}
        except RuntimeError:  # closing
            raise LoginFailed("capture is stopping") from None
        failed = False
        try:
            for future in as_completed(futures, timeout=2 * self.settings.sync.http_timeout + 5):
                got = None if future.cancelled() else future.result()
                if got == user_id:
                    return futures[future]
                failed = failed or got is None
        except FuturesTimeout:
            failed = True
        if failed:
            raise LoginFailed(NOT_IDENTIFIED)
        return None

    def _login(self, account: Account) -> str | None:
        """Log in to learn whose account this is: the Leanote user, or None (logged)."""
        email = account.email.strip().lower()
        try:
            api = self._sign_in(account)
            self._learn(email, api.user_id)
            return api.user_id or None
        except (LeanoteRagError, OSError):  # logged by _sign_in
            return None

    def _api(self, account: Account) -> LeanoteApi:
        key = account.email.strip().lower()
        with self._lock:
            api = self._apis.get(key)
            if api is None:
                if self._closing:
                    raise Unavailable("capture is stopping")
                where = self._config_key(key)
                password = secret(account.password_env, where)
                api = LeanoteApi(self._base_url(), key, password, timeout=self.settings.sync.http_timeout,
                                 password_from=f"{where} ({account.password_env})")
                self._apis[key] = api
        return api

    def _config_key(self, email: str) -> str:
        """Where the config names this account's password: ``capture.accounts[i].password_env``,
        or the source's for an account capture borrows from ``source.accounts``."""
        s = self.settings
        for section, accounts in (("capture", s.capture.accounts), ("source", s.source.accounts)):
            for i, a in enumerate(accounts):
                if a.email.strip().lower() == email:
                    return f"{section}.accounts[{i}].password_env"
        return "capture.accounts"
