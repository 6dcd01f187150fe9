"""aiogroupq in a FastAPI application.

Needs ``pip install "aiogroupq[examples]"`` (FastAPI, uvicorn and aiohttp).

The lifespan opens one ``redis.asyncio.Redis`` pool for the whole app and a
``Producer`` that borrows it; endpoints get the producer by dependency
injection:

- ``POST /imports/{tenant}`` with a JSON list of rows enqueues an
  ``import_rows`` task in the tenant's group: 202 and its id (422 for a body
  that is not a JSON list of strings);
- ``GET /tasks/{task_id}``: its state (404 for an unknown id);
- ``GET /tasks/{task_id}/result``: 200 and the result once it succeeded, 202
  while it waits or runs, 404 for an unknown id, 409 when it ended without a
  result (dead-lettered, cancelled or expired).

Serve it with ``python -m examples.fastapi_app [--host HOST] [--port PORT]
[--redis-url URL]`` (defaults: ``$HOST``, ``$PORT``, ``$REDIS_URL``, else
127.0.0.1, 8000 and a local Redis), or ``uvicorn examples.fastapi_app:app
--host HOST --port PORT``; consume with ``aiogroupq worker
examples.fastapi_app:HANDLERS --queue fastapi-imports``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Final

import msgspec
import redis.asyncio
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

import aiogroupq

#: this example's own queue: no other example's consumer runs its tasks
QUEUE: Final = "fastapi-imports"
DEFAULT_REDIS_URL: Final = "redis://localhost:6379/0"


class ImportRequest(msgspec.Struct):
    """The payload of an ``import_rows`` task."""

    tenant: int
    rows: list[str]


async def import_rows(request: ImportRequest) -> int:
    """Import one tenant's rows (here: count them). Tasks of one tenant run
    one at a time, in the order they were enqueued."""
    return len(request.rows)


#: for ``aiogroupq worker examples.fastapi_app:HANDLERS --queue fastapi-imports``
HANDLERS = {"import_rows": aiogroupq.Handler(import_rows, store_result=True)}

#: what ``GET /tasks/{id}/result`` answers with 409: the task ended, and
#: there will never be a result to return
_NO_RESULT: Final[dict[type[Exception], aiogroupq.TaskState]] = {
    aiogroupq.TaskFailedError: aiogroupq.TaskState.DEAD,
    aiogroupq.TaskCancelledError: aiogroupq.TaskState.CANCELLED,
    aiogroupq.TaskExpiredError: aiogroupq.TaskState.EXPIRED,
    aiogroupq.NoResultError: aiogroupq.TaskState.SUCCEEDED,
}


def get_producer(request: Request) -> aiogroupq.Producer:
    """The app's producer, for ``Depends``."""
    producer: aiogroupq.Producer = request.app.state.producer
    return producer


ProducerDep = Annotated[aiogroupq.Producer, Depends(get_producer)]


def create_app(redis_url: str | None = None, *, consume: bool = False) -> FastAPI:
    """The application.

    :param redis_url: the server (default: ``$REDIS_URL``, else localhost)
    :param consume: also run a consumer inside the web process (usually
        consumers run in their own processes, so that deploying the web app
        does not interrupt tasks)
    """
    url = redis_url or os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = redis.asyncio.Redis.from_url(url)  # one pool for the app
        async with client, aiogroupq.Producer(client, queue=QUEUE) as producer:
            app.state.producer = producer
            if consume:
                async with aiogroupq.Consumer(
                    client, queue=QUEUE, handlers=HANDLERS, concurrency=16
                ):
                    yield
            else:
                yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/imports/{tenant}", status_code=202)
    async def start_import(
        tenant: int, rows: list[str], producer: ProducerDep
    ) -> dict[str, str]:
        task_id = await producer.enqueue(
            "import_rows", ImportRequest(tenant, rows), group=f"{tenant}:orders"
        )
        return {"task_id": task_id}

    @app.get("/tasks/{task_id}")
    async def task_status(task_id: str, producer: ProducerDep) -> dict[str, str]:
        state = await producer.status(task_id)
        if state is None:
            raise HTTPException(status_code=404, detail="no such task")
        return {"task_id": task_id, "state": state.value}

    @app.get(
        "/tasks/{task_id}/result",
        responses={
            202: {"description": "not ended yet: ask again later"},
            404: {"description": "no such task (or its retention ran out)"},
            409: {"description": "ended without a result: dead, cancelled..."},
        },
    )
    async def task_result(task_id: str, producer: ProducerDep) -> JSONResponse:
        try:
            # timeout=0: answer now, never hold the request open
            imported = await producer.result(task_id, timeout=0, result_type=int)
        except aiogroupq.TaskNotFoundError:
            raise HTTPException(status_code=404, detail="no such task") from None
        except TimeoutError:
            state = await producer.status(task_id)
            if state is None:  # its retention ran out in between
                raise HTTPException(status_code=404, detail="no such task") from None
            return JSONResponse({"task_id": task_id, "state": state}, status_code=202)
        except tuple(_NO_RESULT) as exc:
            return JSONResponse(
                {
                    "task_id": task_id,
                    "state": _NO_RESULT[type(exc)],
                    "detail": str(exc),
                },
                status_code=409,
            )
        return JSONResponse(
            {"task_id": task_id, "state": "succeeded", "result": imported}
        )

    return app


app = create_app()


def options(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``python -m examples.fastapi_app``'s options: ``--host``, ``--port``
    and ``--redis-url``, by default ``$HOST``, ``$PORT`` and ``$REDIS_URL``."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.fastapi_app",
        description="Serve the FastAPI example with uvicorn.",
    )
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=os.environ.get("PORT", "8000"))
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = options()
    uvicorn.run(create_app(args.redis_url), host=args.host, port=args.port)
