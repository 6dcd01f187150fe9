"""What the server can do to us: run out of memory, vanish, flush its scripts."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import TaskState
from aiogroupq.testing._server import free_port

if TYPE_CHECKING:
    from ._scripts_helpers import Flush

QUEUE = "robust"


async def test_out_of_memory_refuses_new_work_but_lets_running_work_finish(
    redis_client: redis.asyncio.Redis,
) -> None:
    started = anyio.Event()
    release = anyio.Event()

    async def h(n: int) -> None:
        started.set()
        await release.wait()

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        running = await producer.enqueue("h", 1, group="g")
        parked = await producer.enqueue("h", 2, group="g")
        async with aiogroupq.Consumer(redis_client, queue=QUEUE, handlers={"h": h}):
            with anyio.fail_after(30):
                await started.wait()
            used = int((await redis_client.info("memory"))["used_memory"])
            await redis_client.config_set("maxmemory-policy", "noeviction")
            await redis_client.config_set("maxmemory", str(used - 1024 * 1024))
            try:
                keys_before = await redis_client.dbsize()
                with pytest.raises(aiogroupq.QueueFullError, match="out of memory"):
                    await producer.enqueue("h", 3, group="g")
                with pytest.raises(aiogroupq.QueueFullError):
                    await producer.enqueue_many(
                        [aiogroupq.Task("h", n) for n in range(10)]
                    )
                assert await redis_client.dbsize() == keys_before
                # Acknowledging still works: the group passes on, in order.
                release.set()
                with anyio.fail_after(30):
                    while await producer.status(running) is not TaskState.SUCCEEDED:
                        await anyio.sleep(0.01)
                assert await producer.status(parked) in (
                    TaskState.QUEUED,
                    TaskState.RUNNING,
                    TaskState.SUCCEEDED,
                )
            finally:
                await redis_client.config_set("maxmemory", "0")
            with anyio.fail_after(30):
                while await producer.status(parked) is not TaskState.SUCCEEDED:
                    await anyio.sleep(0.01)


async def test_a_full_redis_keeps_draining_while_enqueues_are_refused(
    redis_client: redis.asyncio.Redis,
) -> None:
    """Over maxmemory (noeviction), enqueues are refused with a typed error
    and write nothing, while every task already queued still completes:
    claims carry allow-oom (each adds a little that its finish frees)."""
    n = 2000
    done = 0

    async def h(i: int) -> None:
        nonlocal done
        done += 1

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        tasks = [aiogroupq.Task("h", i, group=f"g{i % 50}") for i in range(n // 2)]
        tasks += [aiogroupq.Task("h", i) for i in range(n // 2)]
        for start in range(0, n, 500):
            await producer.enqueue_many(tasks[start : start + 500])
        used = int((await redis_client.info("memory"))["used_memory"])
        await redis_client.config_set("maxmemory-policy", "noeviction")
        await redis_client.config_set("maxmemory", str(used - 256 * 1024))
        try:
            keys_before = await redis_client.dbsize()
            with pytest.raises(aiogroupq.QueueFullError):
                await producer.enqueue("h", -1, group="g0")
            with pytest.raises(aiogroupq.QueueFullError):
                await producer.enqueue_many([aiogroupq.Task("h", -2)] * 10)
            assert await redis_client.dbsize() == keys_before
            async with aiogroupq.Consumer(
                redis_client, queue=QUEUE, handlers={"h": h}, concurrency=32
            ):
                with anyio.fail_after(30):
                    while done < n:
                        await anyio.sleep(0.01)
            over = int((await redis_client.info("memory"))["used_memory"]) > used
        finally:
            await redis_client.config_set("maxmemory", "0")
    print(f"[full-redis] drained {done} of {n} over maxmemory")  # noqa: T201
    assert done == n
    assert not over  # finishing freed more than claiming took


async def test_unreachable_server_is_a_typed_error_not_a_hang() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    # Entering already talks to the server (it checks its eviction policy).
    with anyio.fail_after(30), pytest.raises(aiogroupq.RedisUnavailableError):
        async with aiogroupq.Producer(url, queue=QUEUE) as producer:
            await producer.enqueue("h", 1)


async def test_a_flush_while_consuming(
    redis_client: redis.asyncio.Redis, flush: Flush
) -> None:
    seen: list[int] = []

    async def h(n: int) -> None:
        seen.append(n)

    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Consumer(redis_client, queue=QUEUE, handlers={"h": h}),
    ):
        for n in range(50):
            await producer.enqueue("h", n, group=f"g{n % 5}")
            if n % 10 == 0:
                await flush(redis_client)
        with anyio.fail_after(30):
            while len(seen) < 50:
                await anyio.sleep(0.01)
    assert sorted(seen) == list(range(50))
