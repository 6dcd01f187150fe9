"""aiogroupq in an aiohttp application.

A ``cleanup_ctx`` opens the producer when the app starts and closes it when
it stops. Run it with ``python -m examples.aiohttp_app`` (``REDIS_URL`` names the
server), and consume with ``aiogroupq worker examples.aiohttp_app:HANDLERS --queue imports``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

import aiogroupq

QUEUE = "imports"
PRODUCER = web.AppKey("producer", aiogroupq.Producer)


async def import_rows(body: dict[str, Any]) -> None:
    """Import one tenant's rows (here: nothing)."""


#: for ``aiogroupq worker examples.aiohttp_app:HANDLERS --queue imports``
HANDLERS = {"import_rows": import_rows}


def producer_ctx(
    redis_url: str,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The ``cleanup_ctx`` entry: a producer for the app's lifetime."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async with aiogroupq.Producer(redis_url, queue=QUEUE) as producer:
            app[PRODUCER] = producer
            yield

    return ctx


async def start_import(request: web.Request) -> web.Response:
    body = await request.json()
    if not isinstance(body, dict) or not isinstance(body.get("tenant"), int):
        raise web.HTTPBadRequest(text="expected {'tenant': <int>, 'rows': [...]}")
    task_id = await request.app[PRODUCER].enqueue(
        "import_rows", body, group=f"{body['tenant']}:orders"
    )
    return web.json_response({"task_id": task_id}, status=202)


async def task_status(request: web.Request) -> web.Response:
    task_id = request.match_info["task_id"]
    state = await request.app[PRODUCER].status(task_id)
    if state is None:
        raise web.HTTPNotFound(text="no such task")
    return web.json_response({"task_id": task_id, "state": state.value})


def make_app(redis_url: str | None = None) -> web.Application:
    """The application.

    :param redis_url: the server (default: ``$REDIS_URL``, else localhost)
    """
    url = redis_url or os.environ.get("REDIS_URL", "redis://localhost:6379/0")
    app = web.Application()
    app.cleanup_ctx.append(producer_ctx(url))
    app.router.add_post("/imports", start_import)
    app.router.add_get("/tasks/{task_id}", task_status)
    return app


if __name__ == "__main__":
    web.run_app(make_app(), port=8080)
