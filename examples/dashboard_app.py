"""The aiogroupq dashboard mounted in a FastAPI application, behind the
application's own authentication (HTTP Basic here; any check of the request
works: a session cookie, a header set by an authenticating proxy...).

Needs ``pip install "aiogroupq[dashboard,examples]"`` (the dashboard's
Starlette, Jinja2 and uvicorn; FastAPI).

Run it with ``uvicorn examples.dashboard_app:app [--host HOST] [--port PORT]``
(``REDIS_URL`` names the server, ``OPERATOR_PASSWORD`` the password of the
user ``operator``, ``DASHBOARD_HOSTS`` the comma-separated host names it is
reached by when that is not this machine's loopback) and open http://127.0.0.1:8000/dashboard/. It shows the
queue of the getting-started page, ``imports``: a dashboard consumes nothing,
so watching another example's queue cannot take that example's tasks.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager

import redis.asyncio
from fastapi import FastAPI, HTTPException, Request
from fastapi.security import HTTPBasic

from aiogroupq.dashboard import create_app as create_dashboard

QUEUE = "imports"
REALM = "aiogroupq dashboard"


def operators_check(
    operators: Mapping[str, str],
) -> Callable[[Request], Awaitable[bool]]:
    """The dashboard's ``auth``: HTTP Basic against *operators* (user name ->
    password), with FastAPI's own ``HTTPBasic``."""
    basic = HTTPBasic(realm=REALM)

    async def is_operator(request: Request) -> bool:
        credentials = await basic(request)  # no credentials: 401 and a challenge
        assert credentials is not None
        expected = operators.get(credentials.username, "")
        given = credentials.password
        if not expected or not secrets.compare_digest(
            given.encode(), expected.encode()
        ):
            raise HTTPException(
                status_code=401,
                detail="wrong user name or password",
                headers={"WWW-Authenticate": f'Basic realm="{REALM}"'},
            )
        return True

    return is_operator


def create_app(
    redis_url: str | None = None, *, operators: Mapping[str, str] | None = None
) -> FastAPI:
    """The application.

    :param redis_url: the server (default: ``$REDIS_URL``, else localhost)
    :param operators: user name -> password of those who may use the
        dashboard (default: ``operator`` with ``$OPERATOR_PASSWORD``)
    """
    url = redis_url or os.environ.get("REDIS_URL", "redis://localhost:6379/0")
    if operators is None:
        operators = {"operator": os.environ.get("OPERATOR_PASSWORD", "")}
    # One pool for the app; it connects on its first command.
    client = redis.asyncio.Redis.from_url(url)
    # The dashboard answers only to the names it is reached by (a page on
    # another name could read it by DNS rebinding): loopback unless told.
    hosts = os.environ.get("DASHBOARD_HOSTS")
    dashboard = create_dashboard(
        client,
        queues=[QUEUE],
        auth=operators_check(operators),
        allowed_hosts=hosts.split(",") if hosts else None,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A mounted app's lifespan does not run by itself: enter the
        # dashboard's, which samples the queue for its charts.
        async with client, dashboard.router.lifespan_context(dashboard):
            yield

    app = FastAPI(lifespan=lifespan)
    app.mount("/dashboard", dashboard)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


app = create_app()
