"""Lease renewal (``_work/leases.py``): each heartbeat moves the local lease
deadline of every running handler, so a handler may run through many leases;
without the renewals it would be stopped at the end of its first one."""

from __future__ import annotations

import anyio
import redis.asyncio

import aiogroupq

QUEUE = "leases"
LEASE = 2.0  # long enough that a busy machine's pauses lose none


async def test_renewals_keep_a_handler_running_past_its_first_lease(
    redis_client: redis.asyncio.Redis,
) -> None:
    finished: list[float] = []

    async def slow() -> None:
        started = anyio.current_time()
        await anyio.sleep(LEASE * 3)
        finished.append(anyio.current_time() - started)

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue("slow", None, group="g")
    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"slow": slow}, lease_ttl=LEASE
    ) as consumer:
        with anyio.fail_after(30):
            while consumer.stats.succeeded == 0:
                await anyio.sleep(0.01)
    assert len(finished) == 1
    assert finished[0] >= LEASE * 3
    stats = consumer.stats
    assert (stats.claimed, stats.retried, stats.lease_lost) == (1, 0, 0)
