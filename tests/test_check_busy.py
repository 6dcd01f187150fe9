"""The consistency check on a busy, healthy queue: the reads race with the
scripts, and a problem seen in one reading is confirmed by reading the keys
involved again, together, before it is reported. A busy queue checks clean;
a damaged one is still reported (``test_fsck.py``, ``test_repair.py``)."""

from __future__ import annotations

import contextlib
import os
import random
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._check import check as _fsck, problems as problem_kinds
from aiogroupq._check.repair import repair_partitions
from aiogroupq._store.keys import QueueKeys

QUEUE = "busy"
GROUPS = 40


@asynccontextmanager
async def busy_queue(
    client: redis.asyncio.Redis, ran: Callable[[str, int], None]
) -> AsyncIterator[None]:
    """A consumer running many short tasks over many groups while a producer
    enqueues continuously (ungrouped tasks and retries among them)."""
    rng = random.Random(7)

    async def handler(seq: int) -> None:
        task = aiogroupq.current_task()
        ran(task.id, seq)
        await anyio.sleep(rng.choice((0, 0, 0.001, 0.003)))
        if seq % 17 == 0 and task.attempt == 1:
            raise RuntimeError("once more")

    async def produce(producer: aiogroupq.Producer) -> None:
        seq = 0
        while True:
            batch = []
            for _ in range(8):
                seq += 1
                group = None if seq % 9 == 0 else f"g{rng.randrange(GROUPS)}"
                batch.append(aiogroupq.Task("t", seq, group=group, max_attempts=2))
            with contextlib.suppress(aiogroupq.CorruptQueueError):
                await producer.enqueue_many(batch)  # refused until repaired
            await anyio.sleep(0.002)

    async with (
        aiogroupq.Producer(client, queue=QUEUE) as producer,
        aiogroupq.Consumer(
            client,
            queue=QUEUE,
            handlers={"t": handler},
            concurrency=8,
            retry_backoff=0.01,
        ),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(produce, producer)
        yield
        tg.cancel_scope.cancel()


@pytest.mark.timeout(120)
async def test_a_busy_healthy_queue_checks_clean(
    redis_client: redis.asyncio.Redis,
) -> None:
    started: dict[str, int] = defaultdict(int)

    def ran(task_id: str, seq: int) -> None:
        started[task_id] += 1

    found: list[list[aiogroupq.Problem]] = []
    async with busy_queue(redis_client, ran):
        with anyio.fail_after(60):
            while len(started) < 50:  # the queue is under way
                await anyio.sleep(0.01)
        found += [
            (await _fsck.examine(redis_client, QUEUE)).problems for _ in range(20)
        ]
    assert len(started) > 100  # it kept working meanwhile
    assert [[str(p) for p in problems] for problems in found] == [[]] * 20


@pytest.mark.timeout(120)
async def test_a_repair_while_a_consumer_runs_leaves_no_problem(
    redis_client: redis.asyncio.Redis,
) -> None:
    # The ready list damaged (a string) under a running consumer: the
    # repair rebuilds it, and what it reads back at the end is clean.
    started: dict[str, int] = defaultdict(int)

    def ran(task_id: str, seq: int) -> None:
        started[task_id] += 1

    keys = QueueKeys(QUEUE)
    async with busy_queue(redis_client, ran):
        with anyio.fail_after(60):
            while len(started) < 50:
                await anyio.sleep(0.01)
        await redis_client.delete(keys.ready)
        await redis_client.set(keys.ready, "junk")
        done, left = await repair_partitions(redis_client, QUEUE)
    assert done
    assert [str(p) for p in left] == []


async def test_damage_on_a_busy_queue_is_still_reported(
    redis_client: redis.asyncio.Redis,
) -> None:
    # Damage the queue works around stays reported while it works: the
    # second reading sees it too.
    def ran(task_id: str, seq: int) -> None:
        pass

    keys = QueueKeys(QUEUE)
    await redis_client.sadd(keys.inflight("ghost"), "no-such-task")
    # A queued task of a group in no list (and without its envelope).
    await redis_client.hset(
        keys.task("lost1"), mapping={"s": "queued", "g": "lost", "a": 0, "m": 3}
    )
    async with busy_queue(redis_client, ran):
        problems = (await _fsck.examine(redis_client, QUEUE)).problems
    assert sorted((p.kind, p.task_id) for p in problems) == [
        (problem_kinds.BAD_TASK, "lost1"),
        (problem_kinds.LOST_TASK, "lost1"),
        (problem_kinds.ORPHAN_ENTRY, "no-such-task"),
    ]


async def test_a_read_only_user_refused_multi_still_gets_a_second_reading(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    # The documented read-only rule has no MULTI: the second reading is
    # then a plain pipeline, and damage is still reported.
    keys = QueueKeys(QUEUE)
    await redis_client.sadd(keys.inflight("ghost"), "no-such-task")
    user = f"aiogroupq-check-busy-{os.getpid()}"
    execute: Any = redis_client.execute_command
    await execute(
        "ACL", "SETUSER", user, "on", ">check-pw", "resetkeys",
        f"~{{aiogroupq:{QUEUE}}}:*", "resetchannels", "-@all",
        "+@read", "+ping", "+hello",
    )  # fmt: skip
    try:
        url = redis_url.replace("redis://", f"redis://{user}:check-pw@")
        problems = await aiogroupq.check_queue(url, QUEUE)
    finally:
        await redis_client.acl_deluser(user)
    assert [(p.kind, p.task_id) for p in problems] == [
        (problem_kinds.ORPHAN_ENTRY, "no-such-task")
    ]
