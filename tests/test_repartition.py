"""Changing a live queue's partition count: each group's tasks in its old
partition end before its new partition starts any, so group order and
exclusion hold across the move, and no group is ever live in two partitions.

The main test repartitions a queue that consumers drain while producers keep
enqueueing, judges order and exclusion from the journal (``_journal.py``),
and samples every partition's live groups all along (see ``_Sampler``).
"""

from __future__ import annotations

import functools
import random
import zlib
from collections import defaultdict
from dataclasses import dataclass, field

import anyio
import pytest
import redis.asyncio
from anyio.abc import TaskStatus

import aiogroupq
from aiogroupq import Producer, Task
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys, id_partition
from aiogroupq._store.replies import StaleLayoutRefusal

from ._journal import Job, Journal, check, make_handlers

#: liveness only
PATIENCE = 60.0


def home(group: str, partitions: int) -> int:
    return zlib.crc32(group.encode()) % partitions


@dataclass
class _Sampler:
    """Reads which groups are live in which partition, over and over.

    One pass reads the partitions one after another, so a group that moves
    from its old partition to its new one between two reads may be seen in
    both; it is a violation only if it is seen in its NEW partition first
    and in its OLD one after (a group never goes back), or in a partition
    that is neither.
    """

    client: redis.asyncio.Redis
    queue: str
    old: int
    new: int
    passes: int = 0
    violations: list[str] = field(default_factory=list)

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        task_status.started()
        count = max(self.old, self.new)
        while True:
            seen: dict[str, list[int]] = defaultdict(list)
            for partition in range(count):
                keys = QueueKeys(self.queue, partition)
                async for raw in self.client.scan_iter(
                    match=keys.pattern("grp:"), count=1000
                ):
                    name = bytes(raw)[len(keys.prefix) + 4 :].decode()
                    seen[name].append(partition)
            for name, where in seen.items():
                allowed = [home(name, self.old), home(name, self.new)]
                if any(p not in allowed for p in where):
                    self.violations.append(f"{name} live in {where}")
                elif len(where) > 1 and where[0] == allowed[1] != allowed[0]:
                    self.violations.append(f"{name} back in its old partition")
            self.passes += 1
            await anyio.sleep(0.005)


async def _feed(
    producer: Producer,
    jobs: list[Job],
    ids: dict[int, str],
    rng: random.Random,
    pace: float = 0.03,
    *,
    drain: bool = False,
) -> None:
    """Enqueue one group's jobs in order, a pause of up to *pace* seconds
    between two: a slow group (*drain*) waits for each task to end before
    the next, so that it drains between its tasks (and moves while tasks
    keep coming) however slow the consumer is; a fast one stays live (so it
    stays put)."""
    for job in jobs:
        ids[job.n] = await producer.enqueue("work", job, group=job.group)
        await anyio.sleep(rng.uniform(pace / 15, pace))
        if drain:
            with anyio.fail_after(PATIENCE):
                while (
                    await producer.status(ids[job.n]) != aiogroupq.TaskState.SUCCEEDED
                ):
                    await anyio.sleep(0.01)


async def _wait_layout(admin: aiogroupq.Admin) -> list[str]:
    """Finish the repartition, retrying while groups drain; the last reasons
    it gave before it finished."""
    last: list[str] = []
    with anyio.fail_after(PATIENCE):
        while reasons := await admin.finish_repartition():
            last = reasons
            await anyio.sleep(0.02)
    return last


@pytest.mark.parametrize(("old", "new"), [(2, 5), (4, 1)])
async def test_a_live_repartition_keeps_every_groups_order(
    redis_client: redis.asyncio.Redis, old: int, new: int
) -> None:
    queue = f"rep-{old}-{new}"
    rng = random.Random(old * 100 + new)
    groups = [f"g{i}" for i in range(30)]
    per_group = 24
    jobs: dict[str, list[Job]] = {g: [] for g in groups}
    n = 0
    for seq in range(per_group):
        for g in groups:
            sleep = rng.uniform(0, 4) if rng.random() < 0.5 else 0.0
            jobs[g].append(Job(n=n, group=g, seq=seq, sleep_ms=sleep))
            n += 1
    ungrouped = [Job(n=n + i, group=None, seq=0) for i in range(60)]
    expected = {j.n: j for js in jobs.values() for j in js} | {
        j.n: j for j in ungrouped
    }
    journal = Journal(redis_client, key=f"test:journal:{queue}")
    ids: dict[int, str] = {}
    sampler = _Sampler(redis_client, queue, old, new)
    async with (
        Producer(redis_client, queue=queue, partitions=old) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
        aiogroupq.Consumer(
            redis_client,
            queue=queue,
            handlers=make_handlers(journal),
            concurrency=8,
        ),
        anyio.create_task_group() as tg,
    ):
        await tg.start(sampler.run)
        async with anyio.create_task_group() as feeders:
            for g in groups:
                half = jobs[g][: per_group // 2]
                feeders.start_soon(_feed, producer, half, ids, rng)
        # Halfway: the move begins while every group still has work coming.
        await admin.start_repartition(new)
        assert await admin.partitions() == (old, new)
        async with anyio.create_task_group() as feeders:
            for i, g in enumerate(groups):
                rest = jobs[g][per_group // 2 :]
                slow = not i % 2
                feeders.start_soon(
                    functools.partial(
                        _feed,
                        producer,
                        rest,
                        ids,
                        rng,
                        0.3 if slow else 0.03,
                        drain=slow,
                    )
                )
            for job in ungrouped:
                ids[job.n] = await producer.enqueue("work", job)
        last = await _wait_layout(admin)
        assert await admin.partitions() == (new, None)
        after = [
            await producer.enqueue(
                "work", Job(n=-1 - i, group=g, seq=per_group), group=g
            )
            for i, g in enumerate(groups)
        ]
        with anyio.fail_after(PATIENCE):
            await journal.wait_done(len(expected) + len(after))
        tg.cancel_scope.cancel()
    figures = check([e for e in await journal.entries() if e.n >= 0], expected)
    moved = {g for g in groups if len({id_partition(ids[j.n]) for j in jobs[g]}) > 1}
    print(  # noqa: T201
        f"[repartition {old}->{new}] {figures} sampler passes={sampler.passes} "
        f"groups moved={len(moved)} last blockers={len(last)}"
    )
    assert sampler.violations == []
    assert sampler.passes > 10
    assert figures.never_run == 0
    assert figures.started_more_than_once == 0
    assert figures.order_violations == 0
    assert figures.overlaps == 0
    assert figures.max_group_concurrency == 1
    assert moved  # the move really moved groups mid-stream
    for group, task_id in zip(groups, after, strict=True):
        assert id_partition(task_id) == home(group, new)
    assert await aiogroupq.check_queue(redis_client, queue) == []
    stats = await admin_stats(redis_client, queue)
    assert stats.partitions == new
    assert stats.totals["succeeded"] == len(expected) + len(after)


async def admin_stats(client: redis.asyncio.Redis, queue: str) -> aiogroupq.QueueStats:
    async with aiogroupq.Admin(client, queue=queue) as admin:
        return await admin.stats()


async def test_a_group_that_does_not_drain_keeps_the_move_open(
    redis_client: redis.asyncio.Redis,
) -> None:
    """Shrinking 4 -> 2: a group halted behind a dead task in a partition
    that goes away keeps its new tasks there (it is live there) and keeps
    the move from finishing, as do dead letters left in that partition;
    once released and purged, the move finishes."""
    queue = "shrink"
    halted = next(f"h{i}" for i in range(100) if home(f"h{i}", 4) == 3)
    ran: list[int] = []

    async def boom(n: int) -> None:
        ran.append(n)
        if n == 0:
            raise RuntimeError("first one dies")

    handlers = {
        "boom": aiogroupq.Handler(boom, no_retry=(RuntimeError,), on_dead="halt")
    }
    async with (
        Producer(redis_client, queue=queue, partitions=4) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        first = await producer.enqueue("boom", 0, group=halted)
        async with aiogroupq.Consumer(redis_client, queue=queue, handlers=handlers):
            with anyio.fail_after(PATIENCE):
                while not await admin.dead_letters():
                    await anyio.sleep(0.02)
            await admin.start_repartition(2)
            # Live (halted) in partition 3: its next task stays there.
            second = await producer.enqueue("boom", 1, group=halted)
            assert id_partition(second) == 3
            reasons = await admin.finish_repartition()
            assert any(halted in r for r in reasons), reasons
            assert any("partition 3" in r for r in reasons), reasons
            # Requeueing the dead task is refused neither way: its group is
            # still live in partition 3.
            assert await admin.release_group(halted)
            with anyio.fail_after(PATIENCE):
                while 1 not in ran:
                    await anyio.sleep(0.02)
            # Dead letters of the retiring partition block until purged;
            # the group no longer lives there, so a requeue is refused.
            assert await admin.requeue_dead(first) == 0
            assert any("partition 3" in r for r in await admin.finish_repartition())
            assert await admin.purge_dead(first) == 1
            assert await _wait_layout(admin) is not None
            assert await admin.partitions() == (2, None)
            third = await producer.enqueue("boom", 2, group=halted)
            assert id_partition(third) == home(halted, 2)
            with anyio.fail_after(PATIENCE):
                while 2 not in ran:
                    await anyio.sleep(0.02)
    assert ran == [0, 1, 2]
    # The retired partitions refuse a producer that lags behind.
    task = _scripts.NewTask(
        id="d" * 28 + "-3", group=None, envelope=b"\x90", delay_ms=0,
        max_attempts=1, dedup_key=None,
    )  # fmt: skip
    with pytest.raises(StaleLayoutRefusal):
        await _scripts.enqueue(
            redis_client,
            QueueKeys(queue, 3),
            [task],
            dedup_window_ms=1000,
            routing=_scripts.Routing(3, [None]),
        )
    assert await aiogroupq.check_queue(redis_client, queue) == []


async def test_an_interrupted_step_is_completed_by_the_next_client(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "heal"
    async with Producer(redis_client, queue=queue, partitions=2):
        pass
    # The operator died after changing partition 0 only.
    await _scripts.meta(redis_client, QueueKeys(queue), "cas", "2", "2>3")
    assert await redis_client.hget(QueueKeys(queue, 1).conf, "parts") == b"2"
    async with Producer(redis_client, queue=queue) as producer:
        copies = [
            await redis_client.hget(QueueKeys(queue, p).conf, "parts") for p in range(3)
        ]
        assert copies == [b"2>3"] * 3
        ids = await producer.enqueue_many(
            [Task("w", i, group=f"x{i}") for i in range(30)]
        )
    assert all(id_partition(i) == home(f"x{n}", 3) for n, i in enumerate(ids))
    async with aiogroupq.Admin(redis_client, queue=queue) as admin:
        with pytest.raises(aiogroupq.ConfigurationError, match="being repartitioned"):
            await admin.start_repartition(4)
        await admin.start_repartition(3)  # resumes: same target


async def test_a_finish_interrupted_after_partition_0_is_completed(
    redis_client: redis.asyncio.Redis,
) -> None:
    # A finish that died after switching partition 0 used to leave the
    # retired partitions' layout and totals behind for good: finishing
    # again said "not being repartitioned".
    queue = "half-finished"
    async with Producer(redis_client, queue=queue, partitions=3) as producer:
        await producer.enqueue_many([Task("w", i) for i in range(9)])
    async with aiogroupq.Consumer(
        redis_client, queue=queue, handlers={"w": _noop}
    ) as consumer:
        with anyio.fail_after(30):
            while consumer.stats.succeeded < 9:
                await anyio.sleep(0.05)
    async with aiogroupq.Admin(redis_client, queue=queue) as admin:
        await admin.start_repartition(1)
        # The operator dies right after partition 0's switch.
        await _scripts.meta(redis_client, QueueKeys(queue), "cas", "3>1", "1")
        assert (await admin.stats()).totals["succeeded"] < 9
        assert await admin.finish_repartition() == []
        copies = [
            await redis_client.hget(QueueKeys(queue, p).conf, "parts") for p in range(3)
        ]
        assert copies == [None] * 3  # one partition: nothing stored
        assert (await admin.stats()).totals["succeeded"] == 9
        with pytest.raises(aiogroupq.ConfigurationError, match="not being"):
            await admin.finish_repartition()


async def _noop(_: object = None) -> None:
    pass
