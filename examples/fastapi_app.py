"""aiogroupq in a FastAPI application.

The lifespan opens one ``redis.asyncio.Redis`` pool for the whole app and a
``Producer`` that borrows it; endpoints get the producer by dependency
injection. Run it with ``uvicorn examples.fastapi_app:app`` (``REDIS_URL``
names the server), and consume with
``aiogroupq worker examples.fastapi_app:HANDLERS --queue imports``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import msgspec
import redis.asyncio
from fastapi import Depends, FastAPI, HTTPException, Request

import aiogroupq

QUEUE = "imports"


class ImportRequest(msgspec.Struct):
    """The payload of an ``import_rows`` task."""

    tenant: int
    rows: list[str]


async def import_rows(request: ImportRequest) -> int:
    """Import one tenant's rows (here: count them). Tasks of one tenant run
    one at a time, in the order they were enqueued."""
    return len(request.rows)


#: for ``aiogroupq worker examples.fastapi_app:HANDLERS --queue imports``
HANDLERS = {"import_rows": aiogroupq.Handler(import_rows, store_result=True)}


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
    url = redis_url or os.environ.get("REDIS_URL", "redis://localhost:6379/0")

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

    return app


app = create_app()
