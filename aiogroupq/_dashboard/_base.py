"""What every page and action of the dashboard shares: the
:class:`Dashboard` (settings, the Redis client, the samples of each queue,
rendering), a request as a handler sees it, the dashboard's URLs, and the
gates every page and action passes (authentication, read-only, CSRF).

Everything the dashboard reads or changes goes through
:class:`~aiogroupq.Admin` and :class:`~aiogroupq.Producer`, the same calls as
the operator commands. The pages (``_pages.py``) and actions
(``_actions.py``) build on this module; ``_app.py`` routes to them.
"""

from __future__ import annotations

__all__ = (
    "ActionRefused",
    "Dashboard",
    "Form",
    "Urls",
    "View",
    "action",
    "first",
    "page",
    "read_form",
    "safe_next",
)

import base64
import dataclasses
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import anyio
import jinja2
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from .._inspect import render as _render
from .._store.connection import Client, RedisLike, check_borrowed, new_client
from .._store.keys import QueueKeys
from ..admin import Admin
from ..errors import (
    AiogroupqError,
    ConfigurationError,
    CorruptQueueError,
    InvalidTaskError,
    RedisUnavailableError,
    TaskNotFoundError,
)
from ..producer import Producer
from . import _auth
from ._auth import Access, Guard
from ._history import History, window_text

if TYPE_CHECKING:
    from .._inspect.views import GroupInfo, QueueStats
    from ._hosts import AllowedHosts

logger: logging.Logger = logging.getLogger("aiogroupq.dashboard")

FLASH_COOKIE: Final = "aiogroupq_flash"
#: the largest form body accepted (a dead-letter form lists ids)
MAX_FORM: Final = 512 * 1024
#: seconds between two samples of a queue taken by pages being refreshed
MIN_SAMPLE_GAP: Final = 1.0


class Urls:
    """The dashboard's URLs under the path it is mounted at."""

    def __init__(self, root: str) -> None:
        self.root = root

    def home(self) -> str:
        return f"{self.root}/"

    def static(self, name: str) -> str:
        return f"{self.root}/static/{name}"

    def login(self, next_url: str | None = None) -> str:
        query = f"?{urlencode({'next': next_url})}" if next_url else ""
        return f"{self.root}/login{query}"

    def logout(self) -> str:
        return f"{self.root}/logout"

    def queue(self, queue: str, page: str = "", **params: object) -> str:
        path = f"{self.root}/q/{quote(queue, safe='')}"
        if page:
            path += f"/{page}"
        shown = {k: v for k, v in params.items() if v not in (None, "")}
        return f"{path}?{urlencode(shown)}" if shown else path

    def group(self, queue: str, name: str) -> str:
        return self.queue(queue, "group", name=name)

    def task(self, queue: str, task_id: str) -> str:
        return self.queue(queue, "task", id=task_id)


@dataclass(frozen=True, slots=True)
class View:
    """One request as a page handler sees it."""

    request: Request
    access: Access
    queue: str
    urls: Urls

    def param(self, name: str, default: str = "") -> str:
        return self.request.query_params.get(name, default)[:1024]


class Dashboard:
    """What the routes share: settings, the Redis client, the samples.

    :param redis: a ``redis://`` URL (a client of our own is created on first
        use and closed by the app's lifespan) or a client to borrow
    :param queues: the queues shown, in this order
    :param guard: who may see and act
    :param show_payloads: show payloads and results
    :param show_errors: show error messages and tracebacks (they may echo
        a payload)
    :param hosts: the hosts it answers to, and its forms may come from
    :param refresh: seconds between live refreshes of an open page
    :param window: seconds of throughput history kept and charted
    :raises ConfigurationError: for an unusable argument
    """

    def __init__(
        self,
        redis: RedisLike,
        *,
        queues: Sequence[str],
        guard: Guard,
        show_payloads: bool,
        show_errors: bool,
        hosts: AllowedHosts,
        refresh: float,
        window: float,
    ) -> None:
        client: Client
        if isinstance(redis, Redis | RedisCluster):
            check_borrowed(redis)
            client = redis
        else:
            # A bad URL is refused now, not on every page. The client
            # connects on its first command, in the server's event loop.
            client = new_client(redis, retry=True)
        if isinstance(queues, str) or not isinstance(queues, Sequence):
            raise ConfigurationError(
                f"queues must be a list of queue names, got {queues!r}"
            )
        if not queues:
            raise ConfigurationError("give the dashboard at least one queue")
        for queue in queues:
            QueueKeys(queue)  # a bad name raises ConfigurationError
        for name, value in (
            ("show_payloads", show_payloads),
            ("show_errors", show_errors),
        ):
            if not isinstance(value, bool):
                raise ConfigurationError(f"{name} must be True or False, got {value!r}")
        self._redis = redis
        self._client: Client | None = client
        self.queues = tuple(dict.fromkeys(queues))
        self.guard = guard
        self.show_payloads = show_payloads
        self.show_errors = show_errors
        self.hosts = hosts
        self.refresh = refresh
        self.window = window
        self.sample_every = max(MIN_SAMPLE_GAP, min(refresh, window / 100))
        self.histories = {q: History(window, MIN_SAMPLE_GAP) for q in self.queues}
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("aiogroupq._dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals.update(
            count=_render.count,
            span=_render.span,
            ago=_render.ago,
            until=_render.until,
            clock=_render.clock,
            short=_render.short,
            size=_render.size_text,
            consumer=_render.consumer_text,
            window_text=window_text,
        )

    # -- Redis ------------------------------------------------------------------

    def client(self) -> Client:
        """The client: borrowed, or ours (created on first use)."""
        if self._client is None:
            self._client = (
                self._redis
                if isinstance(self._redis, Redis | RedisCluster)
                else new_client(self._redis, retry=True)
            )
        return self._client

    async def aclose(self) -> None:
        """Close our own client (a borrowed one stays open)."""
        client, self._client = self._client, None
        if client is not None and client is not self._redis:
            with anyio.CancelScope(shield=True):
                await client.aclose()

    @asynccontextmanager
    async def admin(self, queue: str) -> AsyncIterator[Admin]:
        async with Admin(self.client(), queue=queue) as admin:
            yield admin

    @asynccontextmanager
    async def producer(self, queue: str) -> AsyncIterator[Producer]:
        async with Producer(self.client(), queue=queue) as producer:
            yield producer

    async def stats(self, admin: Admin) -> QueueStats:
        """The queue's stats, recorded in its history."""
        stats = await admin.stats()
        self.histories[admin.queue].add(stats)
        return stats

    @asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        """Sample every queue while the app runs (the charts then have
        history before anyone opens a page); close our client at the end."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._sample_forever)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            await self.aclose()

    async def _sample_forever(self) -> None:
        failing = False
        while True:
            try:
                for queue in self.queues:
                    async with self.admin(queue) as admin:
                        await self.stats(admin)
                if failing:
                    logger.info("dashboard: sampling the queues works again")
                failing = False
            except Exception as exc:  # noqa: BLE001 - keep serving pages
                if not failing:
                    logger.warning("dashboard: cannot sample the queues: %s", exc)
                failing = True
            await anyio.sleep(self.sample_every)

    # -- rendering --------------------------------------------------------------

    def render(
        self,
        request: Request,
        template: str,
        context: dict[str, Any],
        *,
        access: Access,
        queue: str | None = None,
        status: int = 200,
        live: bool = False,
    ) -> Response:
        """A page, with what every page shows (navigation, banner, flash)."""
        urls = Urls(_auth.root_path(request))
        flash = _read_flash(request)
        page = self.env.get_template(template).render(
            {
                "u": urls,
                "access": access,
                "queues": self.queues,
                "queue": queue,
                "csrf": _auth.csrf_token(request),
                "here": _here(request),
                "flash": flash,
                "live": live,
                "refresh": self.refresh,
                "login": self.guard.uses_login,
                "show_payloads": self.show_payloads,
                "show_errors": self.show_errors,
                **context,
            }
        )
        response = HTMLResponse(page, status_code=status)
        response.headers["cache-control"] = "no-store"
        _auth.set_cookies(request, response)
        if flash is not None:
            _auth.forget_cookie(request, response, FLASH_COOKIE)
        return response

    def error(
        self,
        request: Request,
        status: int,
        title: str,
        detail: str,
        *,
        access: Access | None = None,
        queue: str | None = None,
    ) -> Response:
        shown = access or Access(False, False, False, None)
        return self.render(
            request,
            "error.html",
            {"status": status, "title": title, "detail": detail},
            access=shown,
            queue=queue,
            status=status,
        )

    def shown_group(self, info: GroupInfo) -> GroupInfo:
        """*info* as a page may show it: without the dead-letter reason of
        the task a halted group waits behind, unless errors are shown."""
        hidden = info.halted_reason
        if self.show_errors or not hidden:
            return info
        reason = info.reason.replace(
            f"dead task {info.halted_by}: {hidden}", f"dead task {info.halted_by}"
        )
        if hidden in reason:  # worded otherwise: say less rather than leak
            reason = f"halted behind dead task {info.halted_by}"
        return dataclasses.replace(info, reason=reason, halted_reason=None)

    def queue_of(self, request: Request) -> str:
        queue = str(request.path_params.get("queue", ""))
        if queue not in self.queues:
            raise HTTPException(404, f"this dashboard shows no queue {queue!r}")
        return queue


class ActionRefused(AiogroupqError):
    """An action found nothing to act on; *reason* is shown on the page."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


PageHandler = Callable[[Dashboard, View], Awaitable[Response]]
ActionHandler = Callable[[Dashboard, str, "Form"], Awaitable[str]]
Form = dict[str, list[str]]


def page(handler: PageHandler) -> Callable[[Dashboard, Request], Awaitable[Response]]:
    """A GET route: signed in (or sent to the login), a known queue, and
    aiogroupq's errors as error pages."""

    @functools.wraps(handler)
    async def endpoint(dash: Dashboard, request: Request) -> Response:
        access = await dash.guard.access(request)
        urls = Urls(_auth.root_path(request))
        if not access.allowed:
            if dash.guard.uses_login:
                return RedirectResponse(urls.login(_here(request)), status_code=303)
            return dash.error(
                request, 403, "Forbidden", "You may not see this dashboard."
            )
        queue = dash.queue_of(request) if "queue" in request.path_params else ""
        view = View(request, access, queue, urls)
        try:
            return await handler(dash, view)
        except AiogroupqError as exc:
            status, title = _status_of(exc)
            return dash.error(
                request, status, title, str(exc), access=access, queue=queue
            )

    return endpoint


def action(
    handler: ActionHandler,
) -> Callable[[Dashboard, Request], Awaitable[Response]]:
    """A POST route: may act, passes the CSRF checks; then runs *handler*,
    whose return is shown as a message on the page the form came from."""

    @functools.wraps(handler)
    async def endpoint(dash: Dashboard, request: Request) -> Response:
        access = await dash.guard.access(request)
        if not access.allowed:
            return dash.error(request, 403, "Forbidden", "Sign in to act on the queue.")
        if not access.can_act:
            why = access.why_read_only or "this dashboard is read-only"
            return dash.error(request, 403, "Read-only", why, access=access)
        queue = dash.queue_of(request)
        form = await read_form(request)
        if (problem := _auth.csrf_problem(request, form, dash.hosts)) is not None:
            return dash.error(request, 403, "Refused", problem, access=access)
        urls = Urls(_auth.root_path(request))
        target = safe_next(request, form, urls.queue(queue))
        try:
            message, ok = await handler(dash, queue, form), True
        except RedisUnavailableError as exc:
            return dash.error(
                request, 503, "Redis is unreachable", str(exc), access=access
            )
        except (
            ActionRefused,
            InvalidTaskError,
            ConfigurationError,
            TaskNotFoundError,
        ) as exc:
            message, ok = str(exc), False
        response = RedirectResponse(target, status_code=303)
        set_flash(request, response, message, ok=ok)
        return response

    return endpoint


def _status_of(exc: AiogroupqError) -> tuple[int, str]:
    if isinstance(exc, RedisUnavailableError):
        return 503, "Redis is unreachable"
    if isinstance(exc, TaskNotFoundError):
        return 404, "No such task"
    if isinstance(exc, InvalidTaskError | ConfigurationError):
        return 400, "Bad request"
    if isinstance(exc, CorruptQueueError):
        return 500, "Damaged queue (run aiogroupq check)"
    return 500, type(exc).__name__


async def read_form(request: Request) -> Form:
    """An urlencoded form body (the only kind our pages send).

    :raises HTTPException: 415 for another kind, 413 for a huge one, 400 for
        one that is not UTF-8
    """
    kind = request.headers.get("content-type", "").partition(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        raise HTTPException(415, f"expected a form (urlencoded), got {kind!r}")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise HTTPException(413, f"the form is over {MAX_FORM} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, "the form is not UTF-8") from None
    return parse_qs(text, keep_blank_values=True, max_num_fields=20_000)


def first(form: Form, name: str) -> str:
    return form.get(name, [""])[0]


def safe_next(request: Request, form: Form, default: str) -> str:
    """Where to go after an action: the form's ``next`` if it is a path of
    this dashboard (never another site: an open redirect), else *default*."""
    target = first(form, "next")
    root = _auth.root_path(request) + "/"
    parts = urlsplit(target)
    if (
        target.startswith(root)
        and not target.startswith("//")
        and "\\" not in target
        and not parts.scheme
        and not parts.netloc
    ):
        return target
    return default


def _here(request: Request) -> str:
    path = request.url.path
    return f"{path}?{request.url.query}" if request.url.query else path


@dataclass(frozen=True, slots=True)
class Flash:
    ok: bool
    text: str


def set_flash(request: Request, response: Response, text: str, *, ok: bool) -> None:
    data = json.dumps({"ok": ok, "text": text[:600]}).encode()
    value = base64.urlsafe_b64encode(data).decode()
    _auth.set_cookie(request, response, FLASH_COOKIE, value, max_age=60)


def _read_flash(request: Request) -> Flash | None:
    value = request.cookies.get(FLASH_COOKIE)
    if not value:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(value.encode()))
        return Flash(bool(data["ok"]), str(data["text"]))
    except (ValueError, KeyError, TypeError):
        return None
