"""The dashboard's ASGI application: the routes to its pages and actions,
the error pages of HTTP errors, and the headers every response carries.
What the routes share is in ``_base.py``."""

from __future__ import annotations

__all__ = ("build_app",)

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from . import _actions, _pages
from ._auth import Access
from ._hosts import HostCheck

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from ._base import Dashboard

#: what every response says about itself: no framing (clickjacking), no
#: script or style from anywhere else, no inline script
_SECURITY_HEADERS: Final = (
    (
        b"content-security-policy",
        (
            b"default-src 'self'; img-src 'self' data:; style-src 'self'; "
            b"script-src 'self'; form-action 'self'; frame-ancestors 'none'; "
            b"base-uri 'none'"
        ),
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
)


class SecurityHeaders:
    """Adds :data:`_SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(n, v) for n, v in _SECURITY_HEADERS if n not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def build_app(dash: Dashboard) -> Starlette:
    """The Starlette application of *dash*."""

    def route(
        path: str,
        handler: Callable[[Dashboard, Request], Awaitable[Response]],
        methods: list[str],
    ) -> Route:
        return Route(
            path,
            functools.partial(handler, dash),
            methods=methods,
            name=handler.__name__,
        )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        access = Access(False, False, False, None)
        response = dash.error(
            request,
            exc.status_code,
            _TITLES.get(exc.status_code, "Error"),
            str(exc.detail),
            access=access,
        )
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response

    app = Starlette(
        routes=[
            route("/", _pages.overview, ["GET"]),
            route("/login", _pages.login_page, ["GET"]),
            route("/login", _pages.login, ["POST"]),
            route("/logout", _pages.logout, ["POST"]),
            route("/q/{queue}", _pages.queue_page, ["GET"]),
            route("/q/{queue}/groups", _pages.groups_page, ["GET"]),
            route("/q/{queue}/group", _pages.group_page, ["GET"]),
            route("/q/{queue}/task", _pages.task_page, ["GET"]),
            route("/q/{queue}/dead", _pages.dead_page, ["GET"]),
            route("/q/{queue}/consumers", _pages.consumers_page, ["GET"]),
            route("/q/{queue}/pause", _actions.pause_queue, ["POST"]),
            route("/q/{queue}/resume", _actions.resume_queue, ["POST"]),
            route("/q/{queue}/group/pause", _actions.pause_group, ["POST"]),
            route("/q/{queue}/group/resume", _actions.resume_group, ["POST"]),
            route("/q/{queue}/group/release", _actions.release_group, ["POST"]),
            route("/q/{queue}/dead/requeue", _actions.requeue_dead, ["POST"]),
            route("/q/{queue}/dead/purge", _actions.purge_dead, ["POST"]),
            route("/q/{queue}/task/cancel", _actions.cancel_task, ["POST"]),
            Mount(
                "/static",
                app=StaticFiles(packages=[("aiogroupq._dashboard", "static")]),
                name="static",
            ),
        ],
        # The host check first: a request to a name not ours meets nothing else.
        middleware=[
            Middleware(HostCheck, allowed=dash.hosts),
            Middleware(SecurityHeaders),
        ],
        exception_handlers={HTTPException: http_error},
        lifespan=dash.lifespan,
    )
    app.state.aiogroupq_dashboard = dash
    return app


_TITLES: Final = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    413: "Too large",
    415: "Unsupported form",
    429: "Too many attempts",
}
