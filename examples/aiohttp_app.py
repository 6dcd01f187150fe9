"""aiogroupq in an aiohttp application.

Needs ``pip install "aiogroupq[examples]"`` (FastAPI, uvicorn and aiohttp).

A ``cleanup_ctx`` opens the producer when the app starts and closes it when
it stops. ``POST /imports`` with a JSON object ``{"tenant": <int>, "rows":
[...]}`` enqueues an ``import_rows`` task in the tenant's group: 202 and its
id (400 for a body that is not such an object, or not JSON at all);
``GET /tasks/{task_id}`` answers its state (404 for an unknown id).

Serve it with ``python -m examples.aiohttp_app [--host HOST] [--port PORT]
[--redis-url URL]`` (defaults: ``$HOST``, ``$PORT``, ``$REDIS_URL``, else
127.0.0.1, 8080 and a local Redis), and consume with ``aiogroupq worker
examples.aiohttp_app:HANDLERS --queue aiohttp-imports``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

from aiohttp import web

import aiogroupq

#: this example's own queue: no other example's consumer runs its tasks
QUEUE: Final = "aiohttp-imports"
DEFAULT_REDIS_URL: Final = "redis://localhost:6379/0"
PRODUCER = web.AppKey("producer", aiogroupq.Producer)


async def import_rows(body: dict[str, Any]) -> None:
    """Import one tenant's rows (here: nothing)."""


#: for ``aiogroupq worker examples.aiohttp_app:HANDLERS --queue aiohttp-imports``
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
    try:
        body = await request.json()
    except ValueError:  # not JSON: the client's mistake, not a server error
        raise web.HTTPBadRequest(text="the body is not JSON") from None
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
    url = redis_url or os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    app = web.Application()
    app.cleanup_ctx.append(producer_ctx(url))
    app.router.add_post("/imports", start_import)
    app.router.add_get("/tasks/{task_id}", task_status)
    return app


def options(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``python -m examples.aiohttp_app``'s options: ``--host``, ``--port``
    and ``--redis-url``, by default ``$HOST``, ``$PORT`` and ``$REDIS_URL``."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.aiohttp_app",
        description="Serve the aiohttp example.",
    )
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=os.environ.get("PORT", "8080"))
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = options()
    web.run_app(make_app(args.redis_url), host=args.host, port=args.port)
