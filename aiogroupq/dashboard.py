"""The web dashboard: ``pip install 'aiogroupq[dashboard]'``.

:func:`create_app` returns an ASGI application (Starlette) that shows a
queue's counts with its throughput and failure rate over the last minutes,
its groups with the reason each one waits, tasks, dead letters and
consumers, refreshed live; and, for an authenticated operator, acts on it
(pause and resume a queue or a group, release a halted group, requeue or
purge dead letters, cancel a task) through the same calls as the
``aiogroupq`` operator commands. Serve it alone with ``aiogroupq dashboard``,
or mount it in a FastAPI (or any ASGI) application::

    dashboard = aiogroupq.dashboard.create_app(
        client, queues=["imports"], auth=is_admin, allowed_hosts=["ops.example.com"]
    )
    app.mount("/dashboard", dashboard)

It answers only to the host names it is given (the loopback's by default:
a ``Host`` check against DNS rebinding), and shows neither payloads nor
error messages unless told to.

Pages render without JavaScript; one small script (shipped in the package,
like the templates and the stylesheet: nothing comes from a CDN) refreshes
them in place.
"""

from __future__ import annotations

__all__ = ("AuthCheck", "create_app")

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from ._store import validate as _validate
from .errors import ConfigurationError, MissingExtraError

try:
    import jinja2  # noqa: F401 - checked here for a clear error
    import starlette  # noqa: F401
except ImportError as _missing:
    raise MissingExtraError(
        __name__, "dashboard", getattr(_missing, "name", None) or "starlette"
    ) from _missing

from ._dashboard._app import build_app
from ._dashboard._auth import AuthCheck, Guard
from ._dashboard._base import Dashboard
from ._dashboard._hosts import LOOPBACK, AllowedHosts

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from ._store.connection import RedisLike


def create_app(
    redis: RedisLike,
    *,
    queues: Sequence[str],
    token: str | None = None,
    auth: AuthCheck | None = None,
    read_only: bool = False,
    show_payloads: bool = False,
    show_errors: bool | None = None,
    allowed_hosts: Sequence[str] | None = None,
    refresh: float | timedelta = 2.0,
    history: float | timedelta = 600.0,
) -> Starlette:
    """The dashboard of *queues* as an ASGI application.

    Without *token* and without *auth* the pages are open to whoever
    reaches them and nothing can be changed (the actions answer 403 and
    their buttons are not shown). Every form is protected against cross-site
    requests (a per-browser token in a cookie and in the form, and an
    ``Origin`` check). It answers only to *allowed_hosts*: a request with
    another ``Host`` gets a 400 (a page of another site that a DNS
    rebinding points at this address reads nothing).

    The app's lifespan samples the queues every few seconds for the charts
    and closes the client it created. Mounted in another application, whose
    lifespan does not run a mounted app's, enter it from the host's lifespan
    (``async with dashboard.router.lifespan_context(dashboard)``); without
    that the charts fill only while a page is open.

    :param redis: a ``redis://`` URL, or a ``redis.asyncio.Redis`` client to
        borrow (never closed by us; must have ``decode_responses=False``)
    :param queues: the queues it shows (at least one)
    :param token: a secret of at least 16 characters: every page then needs a
        login with it, and a logged-in operator may act
    :param auth: instead of a token, the host application's check, called
        with each Starlette ``Request``: a true value (or an awaitable of one)
        lets the request see and act, a false one answers 403; it may raise
        an ``HTTPException`` of its own (a 401 with a ``WWW-Authenticate``
        challenge, a redirect to its login)
    :param read_only: refuse every action, whoever asks
    :param show_payloads: show task payloads and results (hidden by default:
        they may hold personal data or secrets)
    :param show_errors: show error messages, dead-letter reasons and
        tracebacks, which may quote a payload; ``None`` (the default): when
        *show_payloads* is true
    :param allowed_hosts: the ``Host`` names (``name``, ``name:port``,
        ``*.domain``) browsers reach the dashboard by; forms must come from
        a page of one of them. ``None`` (the default): the loopback only
        (``localhost``, ``127.0.0.1``, ``::1``), so a dashboard served or
        mounted on a real name needs that name here; ``["*"]`` turns the
        check off, for a host application that checks ``Host`` itself
        (Starlette's ``TrustedHostMiddleware``)
    :param refresh: seconds between live refreshes of an open page
    :param history: seconds of throughput history kept and charted
    :raises ConfigurationError: for an unusable argument
    """
    refresh_s = _validate.setting_seconds("refresh", refresh, minimum=0.5)
    history_s = _validate.setting_seconds("history", history, minimum=10.0)
    if history_s > 86_400:
        raise ConfigurationError(f"history must be at most a day, got {history!r}")
    guard = Guard(token=token, auth=auth, read_only=read_only)
    if show_errors is None:
        show_errors = show_payloads
    dash = Dashboard(
        redis,
        queues=queues,
        guard=guard,
        show_payloads=show_payloads,
        show_errors=show_errors,
        hosts=AllowedHosts(LOOPBACK if allowed_hosts is None else allowed_hosts),
        refresh=refresh_s,
        window=history_s,
    )
    return build_app(dash)
