"""Entering a Consumer: names held by one live consumer, generated ones too;
entering one Consumer twice; and the operator's dead-letter purge."""

from __future__ import annotations

import re
from collections.abc import Callable

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import TaskState

QUEUE = "entry"
#: liveness only
PATIENCE = 30.0


async def _until(check: Callable[[], object], *, limit: float = PATIENCE) -> None:
    with anyio.fail_after(limit):
        while not check():
            await anyio.sleep(0.01)


async def test_generated_names_carry_64_random_bits() -> None:
    async def h() -> None:
        pass

    names = [
        aiogroupq.Consumer("redis://x", queue=QUEUE, handlers={"h": h}).name
        for _ in range(100)
    ]
    for name in names:
        suffix = name.rsplit(":", 1)[1]
        assert re.fullmatch(r"[0-9a-f]{16,}", suffix), name
    assert len(set(names)) == len(names)


async def test_a_live_generated_name_cannot_be_taken_by_naming_a_consumer_so(
    redis_client: redis.asyncio.Redis,
) -> None:
    # A consumer named explicitly like a live consumer's generated name gave
    # back that consumer's running task as its own "previous incarnation's",
    # and the group ran twice at once.
    runs: list[int] = []
    release = anyio.Event()

    async def h(n: int) -> None:
        runs.append(n)
        await release.wait()

    options = {"queue": QUEUE, "handlers": {"h": h}, "lease_ttl": 1.0}
    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Consumer(redis_client, **options) as first,  # type: ignore[arg-type]
    ):
        task_id = await producer.enqueue("h", 1, group="g")
        await _until(lambda: runs)
        impostor = aiogroupq.Consumer(redis_client, name=first.name, **options)  # type: ignore[arg-type]
        with (
            anyio.fail_after(PATIENCE),
            pytest.raises(aiogroupq.ConfigurationError, match="another live consumer"),
        ):
            async with impostor:
                await anyio.sleep(1.0)  # (would have run the task again here)
        assert runs == [1]
        assert await producer.status(task_id) is TaskState.RUNNING
        release.set()
        await _until(lambda: first.stats.succeeded == 1)
    assert runs == [1]


async def test_a_consumer_can_be_entered_again_after_its_block(
    redis_client: redis.asyncio.Redis,
) -> None:
    # The second block used to claim nothing, silently: the first one's stop
    # flag was still set.
    seen: list[int] = []

    async def h(n: int) -> None:
        seen.append(n)

    consumer = aiogroupq.Consumer(redis_client, queue=QUEUE, handlers={"h": h})
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        for n in (1, 2, 3):
            async with consumer:
                await producer.enqueue("h", n, group="g")
                with anyio.fail_after(PATIENCE):
                    while n not in seen:
                        await anyio.sleep(0.01)
    assert seen == [1, 2, 3]
    assert consumer.stats.succeeded == 3
    assert consumer.stats.running == 0


async def test_entering_a_running_consumer_is_a_typed_error(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def h() -> None:
        pass

    consumer = aiogroupq.Consumer(redis_client, queue=QUEUE, handlers={"h": h})
    async with consumer:
        with pytest.raises(aiogroupq.ConsumerRunningError, match="already running"):
            async with consumer:
                pass
    # Also while the first entry is still starting (two tasks racing).
    errors: list[BaseException] = []

    async def enter() -> None:
        try:
            async with consumer:
                await anyio.sleep(0.2)
        except aiogroupq.ConsumerRunningError as exc:
            errors.append(exc)

    with anyio.fail_after(PATIENCE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(enter)
            tg.start_soon(enter)
    assert len(errors) == 1
    assert consumer.name in str(errors[0])
    # And after all that, it runs again.
    async with consumer:
        pass


# -- purge_dead ------------------------------------------------------------------


async def _dead_letters(redis_client: redis.asyncio.Redis, n: int) -> list[str]:
    async def h(i: int) -> None:
        raise ValueError(i)

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = [await producer.enqueue("h", i, max_attempts=1) for i in range(n)]
    async with (
        aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
        aiogroupq.Consumer(redis_client, queue=QUEUE, handlers={"h": h}),
    ):
        with anyio.fail_after(PATIENCE):
            while len(await admin.dead_letters()) < n:
                await anyio.sleep(0.01)
    return ids


async def test_purge_dead_with_no_ids_deletes_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    # purge_dead(*ids) with an id list that happened to be empty used to
    # delete every dead letter of the queue.
    ids = await _dead_letters(redis_client, 3)
    async with (
        aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
    ):
        assert await admin.purge_dead() == 0
        assert await admin.purge_dead(*[]) == 0
        assert len(await admin.dead_letters()) == 3
        assert await admin.purge_dead(ids[0]) == 1
        assert await admin.purge_dead(all=True) == 2
        assert await admin.dead_letters() == []
        assert await producer.status(ids[1]) is None


async def test_purge_dead_refuses_ids_together_with_all(
    redis_client: redis.asyncio.Redis,
) -> None:
    ids = await _dead_letters(redis_client, 1)
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
        with pytest.raises(aiogroupq.ConfigurationError, match="not both"):
            await admin.purge_dead(ids[0], all=True)
        with pytest.raises(aiogroupq.ConfigurationError, match="True or False"):
            await admin.purge_dead(all="yes")  # type: ignore[arg-type]
        assert len(await admin.dead_letters()) == 1
