"""aiogroupq runs on asyncio only (redis.asyncio does): under trio, entering a
Producer or Consumer says so with a ConfigurationError, before any I/O."""

from __future__ import annotations

import pytest
import redis.asyncio

import aiogroupq

pytest.importorskip("trio")

pytestmark = pytest.mark.parametrize("anyio_backend", ["trio"])


async def _noop(payload: object) -> None:
    pass


async def test_producer_under_trio_says_asyncio(redis_url: str) -> None:
    producer = aiogroupq.Producer(redis_url, queue="q")
    with pytest.raises(aiogroupq.ConfigurationError, match="runs on asyncio"):
        async with producer:
            # Without the check, entering succeeded and this raised TypeError.
            await producer.enqueue("t", 1)


async def test_consumer_under_trio_says_asyncio(redis_url: str) -> None:
    consumer = aiogroupq.Consumer(redis_url, queue="q", handlers={"t": _noop})
    with pytest.raises(aiogroupq.ConfigurationError, match="runs on asyncio"):
        async with consumer:
            pass


async def test_borrowed_client_under_trio_says_asyncio(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)  # no I/O until a command
    with pytest.raises(aiogroupq.ConfigurationError, match="runs on asyncio"):
        async with aiogroupq.Producer(client, queue="q"):
            pass


async def test_check_queue_under_trio_says_asyncio(redis_url: str) -> None:
    with pytest.raises(aiogroupq.ConfigurationError, match="runs on asyncio"):
        await aiogroupq.check_queue(redis_url, "q")
