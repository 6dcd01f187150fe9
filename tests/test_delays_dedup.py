"""Delays judged on the server's clock, and deduplication under racing producers."""

from __future__ import annotations

import multiprocessing
import random
from typing import Any

import anyio
import redis.asyncio

import aiogroupq

QUEUE = "delays"


async def _server_ms(client: redis.asyncio.Redis) -> float:
    seconds, micros = await client.time()
    return seconds * 1000 + micros / 1000


async def test_no_delayed_task_starts_before_its_due_time(
    redis_client: redis.asyncio.Redis,
) -> None:
    """Due >= (server time before the enqueue) + delay; every start is checked
    against that bound on the server's own clock."""
    rng = random.Random(7)
    earliest: dict[str, float] = {}
    started: dict[str, float] = {}
    done = anyio.Event()
    count = 200

    async def h() -> None:
        started[aiogroupq.current_task().id] = await _server_ms(redis_client)
        if len(started) == count:
            done.set()

    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Consumer(redis_client, queue=QUEUE, handlers={"h": h}),
    ):
        for i in range(count):
            delay = rng.uniform(0, 0.5)
            before = await _server_ms(redis_client)
            group = f"g{i % 7}" if i % 2 else None
            task_id = await producer.enqueue("h", group=group, delay=delay)
            earliest[task_id] = before + delay * 1000
        with anyio.fail_after(30):
            await done.wait()
    early = {t: earliest[t] - started[t] for t in started if started[t] < earliest[t]}
    lateness = sorted(started[t] - earliest[t] for t in started)
    print(  # noqa: T201 - the figure this test reports
        f"delayed starts: {len(started)}, early: {len(early)}, lateness upper "
        f"bound p50 {lateness[len(lateness) // 2]:.1f} ms, "
        f"p99 {lateness[int(len(lateness) * 0.99)]:.1f} ms"
    )
    assert early == {}


def _race(url: str, key: str, start: Any, out: Any) -> None:
    async def main() -> None:
        async with aiogroupq.Producer(url, queue=QUEUE) as producer:
            start.wait()
            ids = await _many(producer, key)
        out.put(sorted(ids))

    anyio.run(main)


async def _many(producer: aiogroupq.Producer, key: str) -> set[str]:
    ids: set[str] = set()

    async def one() -> None:
        ids.add(await producer.enqueue("h", {"k": key}, dedup_key=key))

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(one)
    ids.update(await producer.enqueue_many([aiogroupq.Task("h", 1, dedup_key=key)] * 5))
    return ids


async def test_dedup_is_atomic_across_racing_processes(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    processes = [
        context.Process(target=_race, args=(redis_url, "order-7", start, out))
        for _ in range(2)
    ]
    for process in processes:
        process.start()
    start.set()
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        here = await _many(producer, "order-7")
    seen = set(here)
    for _ in processes:
        seen.update(await anyio.to_thread.run_sync(out.get, True, 60))
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    # 3 x (50 coroutines + a batch of 5) enqueues: one task.
    assert len(seen) == 1
    assert await redis_client.llen(f"{{aiogroupq:{QUEUE}}}:ready") == 1
