from __future__ import annotations

import anyio
import redis.asyncio

import aiogroupq


async def test_enqueue_and_consume_one(redis_client: redis.asyncio.Redis) -> None:
    seen: list[object] = []
    done = anyio.Event()

    async def handler(payload: dict[str, int]) -> None:
        seen.append(payload)
        done.set()

    async with (
        aiogroupq.Producer(redis_client, queue="smoke") as producer,
        aiogroupq.Consumer(
            redis_client, queue="smoke", handlers={"h": handler}, concurrency=2
        ),
    ):
        task_id = await producer.enqueue("h", {"n": 1}, group="g")
        with anyio.fail_after(30):
            await done.wait()
    assert seen == [{"n": 1}]
    assert await _status(redis_client, task_id) == aiogroupq.TaskState.SUCCEEDED


async def _status(
    client: redis.asyncio.Redis, task_id: str
) -> aiogroupq.TaskState | None:
    async with aiogroupq.Producer(client, queue="smoke") as producer:
        return await producer.status(task_id)
