"""Who may see and act: the token login's session cookie, the host
application's own check, and CSRF protection of every form.

- Without a token and without an ``auth`` check the pages are readable by
  anyone who reaches them and nothing can be changed: the actions answer
  403 and their buttons are not shown.
- With a token, every page needs a session: the login form takes the token
  and sets a cookie signed with a key derived from it (so changing the token
  ends every session), valid for :data:`SESSION_TTL`. The process also
  keeps the sessions it issued: logging out ends the session itself, not
  only the browser's copy of the cookie (and a restart ends them all).
  Failed logins are throttled (``_throttle.py``).
- With ``auth``, the host application decides per request (its session, its
  users, HTTP Basic...): the check returns a true value to let the request
  through, a false one for 403, or raises an ``HTTPException`` of its own (a 401 with a
  ``WWW-Authenticate`` challenge, a redirect to its login page).
- Every POST carries the per-browser CSRF token of the ``aiogroupq_csrf``
  cookie in a hidden field (double submit), and its ``Origin`` (else
  ``Referer``) must name an allowed host (``_hosts.py``) on the port the
  request was sent to.
"""

from __future__ import annotations

__all__ = ("AuthCheck", "Guard")

import base64
import hashlib
import hmac
import inspect
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from ..errors import ConfigurationError
from ._throttle import LoginThrottle

if TYPE_CHECKING:
    from ._hosts import AllowedHosts

AuthCheck = Callable[[Request], bool | Awaitable[bool]]
"""The host application's check: a true value lets the request through."""

SESSION_COOKIE: Final = "aiogroupq_session"
CSRF_COOKIE: Final = "aiogroupq_csrf"
CSRF_FIELD: Final = "csrf"
#: seconds a login lasts
SESSION_TTL: Final = 12 * 3600
#: the shortest token accepted: guessing stays hopeless
MIN_TOKEN: Final = 16
#: live sessions kept at most (the oldest ends first): only an operator who
#: knows the token makes one, so this bounds memory, never a real team
MAX_SESSIONS: Final = 1000


@dataclass(frozen=True, slots=True)
class Access:
    """What this request may do.

    :ivar allowed: it may see the pages
    :ivar can_act: it may change the queue (the buttons are shown)
    :ivar logged_in: it holds a token session (a logout button is shown)
    :ivar why_read_only: why the buttons are missing, for the banner
    """

    allowed: bool
    can_act: bool
    logged_in: bool
    why_read_only: str | None


class Guard:
    """Decides :class:`Access`, signs sessions and checks CSRF.

    :param token: the operators' token, or None
    :param auth: the host application's check, or None
    :param read_only: refuse every action whatever the authentication
    :raises ConfigurationError: for both a token and a check, a short token,
        or a check that is not callable
    """

    def __init__(
        self, *, token: str | None, auth: AuthCheck | None, read_only: bool
    ) -> None:
        if token is not None and auth is not None:
            raise ConfigurationError(
                "give the dashboard a token or an auth check, not both"
            )
        if token is not None and (not isinstance(token, str) or len(token) < MIN_TOKEN):
            shown = (
                f"{len(token)} characters" if isinstance(token, str) else repr(token)
            )
            raise ConfigurationError(
                f"the dashboard token must be a str of at least {MIN_TOKEN} "
                f'characters, got {shown} (make one with: python -c "import '
                'secrets; print(secrets.token_urlsafe())")'
            )
        if auth is not None and not callable(auth):
            raise ConfigurationError(f"auth must be a callable, got {auth!r}")
        if not isinstance(read_only, bool):
            raise ConfigurationError(
                f"read_only must be True or False, got {read_only!r}"
            )
        self.token = token
        self.auth = auth
        self.read_only = read_only
        self._key = (
            None
            if token is None
            else hmac.new(
                token.encode(), b"aiogroupq dashboard session", "sha256"
            ).digest()
        )
        #: the live sessions' nonces, oldest first, with their issue times
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self.throttle = LoginThrottle()

    @property
    def uses_login(self) -> bool:
        """The token login form is in use."""
        return self.token is not None

    async def access(self, request: Request) -> Access:
        """What *request* may do (the ``auth`` check may raise)."""
        if self.auth is not None:
            verdict = self.auth(request)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            return self._decide(bool(verdict), logged_in=False)
        if self.token is not None:
            logged_in = self.session_valid(request.cookies.get(SESSION_COOKIE))
            return self._decide(logged_in, logged_in=logged_in)
        return Access(
            allowed=True,
            can_act=False,
            logged_in=False,
            why_read_only="read-only: no token or auth check is configured, so "
            "nothing can be changed from here",
        )

    def _decide(self, allowed: bool, *, logged_in: bool) -> Access:
        if self.read_only:
            why = "read-only: this dashboard was started read-only"
            return Access(allowed, False, logged_in, why if allowed else None)
        return Access(allowed, allowed, logged_in, None)

    # -- the token session ------------------------------------------------------

    def check_token(self, given: str) -> bool:
        """Whether *given* is the token (in constant time)."""
        if self.token is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def new_session(self, now: float | None = None) -> str:
        """A session cookie value: issue time, nonce, signature; the session
        is live until :meth:`end_session` or :data:`SESSION_TTL`."""
        assert self._key is not None, "no token: no sessions"
        issued = int(time.time() if now is None else now)
        nonce = secrets.token_urlsafe(12)
        self._forget_expired(issued)
        self._sessions[nonce] = issued
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        body = f"{issued}.{nonce}"
        return f"{body}.{self._sign(body)}"

    def session_valid(self, value: str | None, now: float | None = None) -> bool:
        """Whether *value* is a live session we signed that has not expired."""
        nonce = self._nonce(value)
        if nonce is None or nonce not in self._sessions:
            return False
        age = (time.time() if now is None else now) - self._sessions[nonce]
        return 0 <= age < SESSION_TTL

    def end_session(self, value: str | None) -> None:
        """End the session of cookie *value* (logout): the cookie is refused
        from now on, even if a copy of it is sent again."""
        nonce = self._nonce(value)
        if nonce is not None:
            self._sessions.pop(nonce, None)

    def _nonce(self, value: str | None) -> str | None:
        """The nonce of a cookie we signed, None for anything else."""
        if self._key is None or not value or value.count(".") != 2:
            return None
        body, _, signature = value.rpartition(".")
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        issued, _, nonce = body.partition(".")
        return nonce if issued.isdigit() else None

    def _forget_expired(self, now: int) -> None:
        while self._sessions:
            nonce, issued = next(iter(self._sessions.items()))
            if now - issued < SESSION_TTL:
                break
            del self._sessions[nonce]

    def _sign(self, body: str) -> str:
        assert self._key is not None
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


# -- CSRF ------------------------------------------------------------------------


def csrf_token(request: Request) -> str:
    """This browser's CSRF token: the cookie's, or a new one that
    :func:`set_cookies` sends with the response."""
    token = getattr(request.state, "csrf", None)
    if isinstance(token, str):
        return token
    cookie = request.cookies.get(CSRF_COOKIE, "")
    token = cookie if _plausible(cookie) else secrets.token_urlsafe(32)
    request.state.csrf = token
    request.state.csrf_new = token != cookie
    return token


def _plausible(token: str) -> bool:
    return 32 <= len(token) <= 128 and token.replace("-", "").replace("_", "").isalnum()


def set_cookies(request: Request, response: Response) -> None:
    """Send the CSRF cookie if this request made a new token."""
    if getattr(request.state, "csrf_new", False):
        set_cookie(request, response, CSRF_COOKIE, request.state.csrf, max_age=None)


def set_cookie(
    request: Request,
    response: Response,
    name: str,
    value: str,
    *,
    max_age: int | None,
) -> None:
    """A cookie of ours: only for this app's path, never sent cross-site,
    unreadable by scripts, HTTPS-only when served over HTTPS."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=root_path(request) + "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def forget_cookie(request: Request, response: Response, name: str) -> None:
    response.delete_cookie(
        name, path=root_path(request) + "/", httponly=True, samesite="strict"
    )


def root_path(request: Request) -> str:
    """Where the app is mounted ('' at the root): every URL we make starts
    with it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def csrf_problem(
    request: Request, form: dict[str, list[str]], allowed: AllowedHosts
) -> str | None:
    """Why this POST is refused as a possible cross-site request, or None.

    Two checks, each enough against a plain cross-site form: the request
    comes from a page of an allowed host (``Origin``, else ``Referer``),
    and it carries the token of our cookie, which another site cannot read.
    """
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return "the request names no Origin (or Referer): refused"
    host = request.headers.get("host", "")
    parts = urlsplit(source)
    if not allowed.allows_origin(f"{parts.scheme}://{parts.netloc}", host):
        return f"the request comes from {source!r}, not from this dashboard ({host!r})"
    cookie = request.cookies.get(CSRF_COOKIE, "")
    field = form.get(CSRF_FIELD, [""])[0]
    if not cookie or not hmac.compare_digest(cookie.encode(), field.encode()):
        return (
            "the form's CSRF token does not match this browser's (a stale page, "
            "or cookies are blocked): reload the page and try again"
        )
    return None
