"""Tests that pytest-asyncio runs in strict mode: each one is marked."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio

import aiogroupq
from aiogroupq.testing import drain


async def ship(order_id: int) -> str:
    return f"order {order_id} shipped"


HANDLERS = {"ship": aiogroupq.Handler(ship, store_result=True)}


@pytest.mark.asyncio
async def test_an_order_ships(aiogroupq_redis: redis.asyncio.Redis) -> None:
    async with aiogroupq.Producer(aiogroupq_redis, queue="warehouse") as producer:
        await producer.enqueue("ship", 1, group="customer-1")

    (outcome,) = await drain(aiogroupq_redis, queue="warehouse", handlers=HANDLERS)

    assert outcome.result == "order 1 shipped"


# One producer for the module, opened on the module's event loop: the tests
# that use it run on that loop too (a test on another loop would get
# NotOpenError: "this Producer was opened on another event loop").
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def producer(aiogroupq_redis_url: str) -> AsyncIterator[aiogroupq.Producer]:
    async with aiogroupq.Producer(aiogroupq_redis_url, queue="warehouse") as producer:
        yield producer


@pytest.mark.asyncio(loop_scope="module")
async def test_a_customers_orders_ship_in_turn(
    producer: aiogroupq.Producer, aiogroupq_redis: redis.asyncio.Redis
) -> None:
    ids = [await producer.enqueue("ship", n, group="customer-2") for n in (1, 2, 3)]

    outcomes = await drain(aiogroupq_redis, queue="warehouse", handlers=HANDLERS)

    assert [o.id for o in outcomes] == ids
    assert [o.result for o in outcomes] == [f"order {n} shipped" for n in (1, 2, 3)]


@pytest.mark.asyncio(loop_scope="module")
async def test_the_producer_serves_the_next_test(
    producer: aiogroupq.Producer, aiogroupq_redis: redis.asyncio.Redis
) -> None:
    task_id = await producer.enqueue("ship", 4)

    (outcome,) = await drain(aiogroupq_redis, queue="warehouse", handlers=HANDLERS)

    assert (outcome.id, outcome.result) == (task_id, "order 4 shipped")
