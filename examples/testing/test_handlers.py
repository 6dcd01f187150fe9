"""Tests of handlers.py with aiogroupq.testing."""

from __future__ import annotations

import pytest
import redis.asyncio
from handlers import HANDLERS, AmountError, Charge

import aiogroupq
from aiogroupq.testing import (
    Journal,
    PayloadDecodeError,
    assert_group_order,
    drain,
    run_inline,
)


async def test_charge_runs_inline() -> None:
    result = await run_inline(
        HANDLERS["charge"], {"order_id": 1, "amount_cents": 500}, group="customer-7"
    )
    assert result == "order 1 charged for customer-7"


async def test_a_payload_a_consumer_would_refuse() -> None:
    with pytest.raises(PayloadDecodeError, match="does not decode into Charge"):
        await run_inline(HANDLERS["charge"], {"order_id": "one"})


async def test_a_refused_amount_raises() -> None:
    with pytest.raises(AmountError):
        await run_inline(HANDLERS["charge"], Charge(order_id=2, amount_cents=0))


async def test_a_customers_charges_run_in_order(
    aiogroupq_redis: redis.asyncio.Redis,
) -> None:
    async with aiogroupq.Producer(aiogroupq_redis, queue="shop") as producer:
        ids = await producer.enqueue_many(
            aiogroupq.Task(
                "charge", Charge(order_id=n, amount_cents=100), group=f"c{n % 3}"
            )
            for n in range(30)
        )

    journal = Journal()
    outcomes = await drain(
        aiogroupq_redis, queue="shop", handlers=journal.wrap_handlers(HANDLERS)
    )

    assert {o.state for o in outcomes} == {aiogroupq.TaskState.SUCCEEDED}
    assert_group_order(journal, enqueued=ids)


async def test_a_refused_amount_is_dead_lettered(
    aiogroupq_redis: redis.asyncio.Redis,
) -> None:
    async with aiogroupq.Producer(aiogroupq_redis, queue="shop") as producer:
        await producer.enqueue("charge", Charge(order_id=3, amount_cents=-5))

    (outcome,) = await drain(aiogroupq_redis, queue="shop", handlers=HANDLERS)

    assert outcome.state == aiogroupq.TaskState.DEAD
    assert outcome.attempts == 1  # no_retry: no second attempt
    assert outcome.reason == "AmountError: order 3: nothing to charge"
