"""A small application that the CLI tests run with ``aiogroupq worker``.

Every handler sleeps for the payload's ``sleep`` seconds. The ``journaled``
factory also appends each task id it starts to ``example:<queue>:ran``, so a
test can check that every task ran exactly once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import msgspec
import redis.asyncio

import aiogroupq


class Item(msgspec.Struct, frozen=True):
    """The payload of the example tasks.

    :ivar n: the task's number
    :ivar sleep: seconds the handler takes
    """

    n: int
    sleep: float = 0.0


async def work(item: Item) -> None:
    """Pretend to do *item*."""
    await anyio.sleep(item.sleep)


#: the mapping form: ``aiogroupq worker tests.example_app:handlers --queue q``
handlers = {"work": work}


async def fail(item: Item) -> None:
    """Always fails, so its task is retried, then dead-lettered."""
    raise ValueError(f"item {item.n} failed")


#: a type that works and one that always fails (the telemetry tests)
mixed_handlers = {"work": work, "fail": fail}


async def fail_with(message: str) -> None:
    """Fails with the payload as its error message (hostile text in logs)."""
    raise ValueError(message)


#: a type whose error says whatever its payload says
echo_failures = {"fail_with": fail_with}


def make_consumer(
    *, redis_url: str, queue: str | None, concurrency: int
) -> aiogroupq.Consumer:
    """The plain factory form; its queue is ``example`` unless ``--queue``."""
    return aiogroupq.Consumer(
        redis_url,
        queue=queue or "example",
        handlers=handlers,
        concurrency=concurrency,
        grace_period=30.0,
    )


def ran_key(queue: str) -> str:
    """The list of the task ids that ``journaled`` consumers started."""
    return f"example:{queue}:ran"


@asynccontextmanager
async def journaled(
    *, redis_url: str, queue: str | None, concurrency: int
) -> AsyncIterator[aiogroupq.Consumer]:
    """The async-context-manager factory form: owns a client for its journal."""
    queue = queue or "example"
    client = redis.asyncio.Redis.from_url(redis_url)

    async def journaled_work(item: Item) -> None:
        await client.rpush(ran_key(queue), aiogroupq.current_task().id)
        await anyio.sleep(item.sleep)

    try:
        yield aiogroupq.Consumer(
            redis_url,
            queue=queue,
            handlers={"work": journaled_work},
            concurrency=concurrency,
            grace_period=30.0,
        )
    finally:
        await client.aclose()


def sync_work(item: Item) -> None:
    """Not async: the worker refuses it."""


sync_handlers = {"work": sync_work}

#: neither a mapping nor a factory
not_a_target = 42
