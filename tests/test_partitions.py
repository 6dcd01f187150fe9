"""Partitions on one server: the layout (stored, checked, left untouched for
one partition), where groups, ungrouped tasks and ids go, operations by id,
views and settings over partitions, fair claiming, and consistency checks.

The repartition protocol has tests of its own (``test_repartition.py``), the
cluster ones need a cluster (``test_cluster.py``).
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import ConfigurationError, Producer, Task, TaskState
from aiogroupq._check import problems as problem_kinds
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.assignment import assign
from aiogroupq._store.keys import QueueKeys, id_partition
from aiogroupq._store.partition import Partitions
from aiogroupq._store.replies import StaleLayoutRefusal

#: liveness only
PATIENCE = 30.0


def home(group: str, partitions: int) -> int:
    """The documented placement: CRC-32 of the group's UTF-8, mod K."""
    return zlib.crc32(group.encode()) % partitions


def groups_in(partition: int, partitions: int, count: int, prefix: str) -> list[str]:
    """*count* group names whose home is *partition*."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        name = f"{prefix}{i}"
        if home(name, partitions) == partition:
            found.append(name)
        i += 1
    return found


async def _parts_field(client: redis.asyncio.Redis, queue: str, p: int) -> Any:
    return await client.hget(QueueKeys(queue, p).conf, "parts")


# -- the layout -----------------------------------------------------------------


async def test_one_partition_keeps_the_layout_it_always_had(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def work(n: int) -> None:
        pass

    async with Producer(redis_client, queue="plain") as producer:
        await producer.enqueue("w", 1, group="g")
        await producer.enqueue("w", 2)
        await producer.enqueue("w", 3, delay=60)
        async with aiogroupq.Admin(redis_client, queue="plain") as admin:
            await admin.configure(group_concurrency=2)
        async with aiogroupq.Consumer(
            redis_client, queue="plain", handlers={"w": work}
        ):
            await anyio.sleep(0.3)
    keys = [
        k.decode() if isinstance(k, bytes) else k for k in await redis_client.keys("*")
    ]
    assert keys
    assert all(k.startswith("{aiogroupq:plain}:") for k in keys), keys
    assert await _parts_field(redis_client, "plain", 0) is None


async def test_the_layout_is_created_stored_and_checked(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue="four", partitions=4) as producer:
        await producer.enqueue("w", 1, group="g")
    assert [await _parts_field(redis_client, "four", p) for p in range(4)] == [b"4"] * 4
    async with Producer(redis_client, queue="four") as producer:  # learns it
        task_id = await producer.enqueue("w", 2, group="g")
        assert id_partition(task_id) == home("g", 4)
    for wrong in (1, 3):
        with pytest.raises(ConfigurationError, match="has 4 partitions"):
            async with Producer(redis_client, queue="four", partitions=wrong):
                pass
    with pytest.raises(ConfigurationError, match="has 4 partitions"):
        async with aiogroupq.Admin(redis_client, queue="four", partitions=2):
            pass

    async def work() -> None:
        pass

    with pytest.raises(ConfigurationError, match="has 4 partitions"):
        async with aiogroupq.Consumer(
            redis_client, queue="four", handlers={"w": work}, partitions=8
        ):
            pass
    with pytest.raises(ConfigurationError, match=r"partitions must be an int"):
        Producer(redis_client, queue="four", partitions=0)


async def test_a_queue_holding_tasks_is_not_partitioned_behind_its_back(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue="old") as producer:
        await producer.enqueue("w", 1, group="g")
    with pytest.raises(ConfigurationError, match="repartition"):
        async with Producer(redis_client, queue="old", partitions=4):
            pass
    assert await _parts_field(redis_client, "old", 0) is None


# -- placement --------------------------------------------------------------------


async def test_groups_live_in_their_crc32_partition_and_ids_name_it(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue="place", partitions=5) as producer:
        names = [f"tenant:{i}" for i in range(40)]
        ids = await producer.enqueue_many([Task("w", n, group=n) for n in names])
        ids.append(await producer.enqueue("w", "é", group="é"))
        names.append("é")
    for name, task_id in zip(names, ids, strict=True):
        partition = home(name, 5)
        assert id_partition(task_id) == partition
        keys = QueueKeys("place", partition)
        assert await redis_client.hget(keys.task(task_id), "g") == name.encode()
    assert len({id_partition(i) for i in ids}) == 5


async def test_ungrouped_tasks_spread_evenly_and_dedup_keys_meet(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue="spread", partitions=4) as producer:
        ids = [await producer.enqueue("w", i) for i in range(200)]
        ids += await producer.enqueue_many([Task("w", i) for i in range(200)])
        first = await producer.enqueue("w", 0, dedup_key="once")
    counts = Counter(id_partition(i) for i in ids)
    print(f"[spread] ungrouped tasks per partition: {sorted(counts.items())}")  # noqa: T201
    assert counts == {0: 100, 1: 100, 2: 100, 3: 100}
    # Another producer (another round-robin turn) finds the same dedup key.
    async with Producer(redis_client, queue="spread") as other:
        assert await other.enqueue("w", 1, dedup_key="once") == first
    assert id_partition(first) == zlib.crc32(b"once") % 4


async def test_operations_by_id_reach_the_tasks_partition(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def fail(n: int) -> None:
        raise RuntimeError(f"no {n}")

    async def echo(n: int) -> int:
        return n * 2

    handlers = {
        "fail": aiogroupq.Handler(fail, no_retry=(RuntimeError,)),
        "echo": aiogroupq.Handler(echo, store_result=True),
    }
    groups = [groups_in(p, 3, 1, "ops")[0] for p in range(3)]
    async with (
        Producer(redis_client, queue="ops", partitions=3) as producer,
        aiogroupq.Admin(redis_client, queue="ops") as admin,
    ):
        doomed = [
            await producer.enqueue("fail", i, group=g) for i, g in enumerate(groups)
        ]
        echoed = [
            await producer.enqueue("echo", i, group=g) for i, g in enumerate(groups)
        ]
        later = await producer.enqueue("echo", 9, group=groups[2], delay=3600)
        assert sorted(id_partition(i) for i in doomed) == [0, 1, 2]
        async with aiogroupq.Consumer(redis_client, queue="ops", handlers=handlers):
            with anyio.fail_after(PATIENCE):
                results = [await producer.result(i, timeout=PATIENCE) for i in echoed]
        assert results == [0, 2, 4]
        states = await producer.status_many([echoed[2], doomed[1], "0" * 28, later])
        assert states == [TaskState.SUCCEEDED, TaskState.DEAD, None, TaskState.DELAYED]
        letters = await admin.dead_letters()
        assert sorted(letter.id for letter in letters) == sorted(doomed)
        assert await producer.cancel(later) is True
        assert await producer.status(later) == TaskState.CANCELLED
        assert await admin.requeue_dead(doomed[0], doomed[1]) == 2
        assert await producer.status(doomed[1]) == TaskState.QUEUED
        assert await admin.purge_dead(all=True) == 1
        assert await admin.dead_letters() == []
        details = await admin.task(doomed[2 - 2])
        assert details.state == TaskState.QUEUED
        assert details.group == groups[0]
    assert await aiogroupq.check_queue(redis_client, "ops") == []


# -- claiming -------------------------------------------------------------------------


async def test_a_deep_partition_does_not_starve_another(
    redis_client: redis.asyncio.Redis,
) -> None:
    """One consumer slot; partition 0 holds 150 runnable tasks (of distinct
    groups), partition 1 five: the fetchers take turns for the slot, so the
    five start among the first ones instead of after the backlog."""
    order: list[str] = []

    async def work(name: str) -> None:
        order.append(name)

    deep = groups_in(0, 2, 150, "deep")
    shallow = groups_in(1, 2, 5, "shallow")
    async with Producer(redis_client, queue="fair", partitions=2) as producer:
        await producer.enqueue_many([Task("w", g, group=g) for g in deep])
        await producer.enqueue_many([Task("w", g, group=g) for g in shallow])
    async with aiogroupq.Consumer(
        redis_client, queue="fair", handlers={"w": work}, concurrency=1
    ):
        with anyio.fail_after(PATIENCE):
            while len(order) < len(deep) + len(shallow):
                await anyio.sleep(0.02)
    positions = [order.index(g) for g in shallow]
    print(f"[fair] the shallow partition's tasks started at {positions}")  # noqa: T201
    assert max(positions) < 20


async def test_a_grouped_order_holds_over_partitions_and_batches(
    redis_client: redis.asyncio.Redis,
) -> None:
    seen: dict[str, list[int]] = {}

    async def work(job: list[Any]) -> None:
        seen.setdefault(job[0], []).append(job[1])
        await anyio.sleep(0.001)

    tasks = [Task("w", [f"g{i % 23}", i], group=f"g{i % 23}") for i in range(600)]
    async with Producer(redis_client, queue="order", partitions=6) as producer:
        for start in range(0, len(tasks), 97):  # batches spanning partitions
            await producer.enqueue_many(tasks[start : start + 97])
    async with aiogroupq.Consumer(
        redis_client, queue="order", handlers={"w": work}, concurrency=16
    ):
        with anyio.fail_after(PATIENCE):
            while sum(map(len, seen.values())) < len(tasks):
                await anyio.sleep(0.02)
    assert all(runs == sorted(runs) for runs in seen.values())
    assert await aiogroupq.check_queue(redis_client, "order") == []


# -- views and settings -----------------------------------------------------------------


async def test_views_sum_and_merge_the_partitions(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "views"
    lines = {
        g: n for n, g in enumerate(groups_in(1, 3, 3, "v") + groups_in(2, 3, 3, "w"), 2)
    }
    async with (
        Producer(redis_client, queue=queue, partitions=3) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        await admin.pause()  # nothing starts: every task stays queued
        for group, n in lines.items():
            await producer.enqueue_many([Task("w", i, group=group) for i in range(n)])
        await producer.enqueue_many([Task("w", i) for i in range(9)])
        stats = await admin.stats()
        assert stats.partitions == 3
        assert stats.partitions_target is None
        assert stats.totals["enqueued"] == sum(lines.values()) + 9
        assert stats.ready == len(lines) + 9
        assert stats.parked == sum(n - 1 for n in lines.values())
        assert stats.groups == len(lines)
        assert stats.paused
        pages, cursor = [], 0
        while True:
            page = await admin.groups(sort="busiest", limit=4, cursor=cursor)
            pages += [info.group for info in page.groups]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert pages == sorted(lines, key=lambda g: -lines[g])
        far = groups_in(2, 3, 1, "w")[0]
        info = await admin.group_info(far)
        assert info.backlog == lines[far] - 1
        assert "no consumer is alive" not in info.reason  # paused explains it
        await admin.configure(group_concurrency=2)
        conf = [
            await redis_client.hget(QueueKeys(queue, p).conf, "c") for p in range(3)
        ]
        assert conf == [b"2"] * 3
        await admin.set_group(far, concurrency=3)
        assert await redis_client.hget(QueueKeys(queue, 2).group_conf(far), "c") == b"3"
        assert (await admin.group_settings(far)).concurrency == 3
        await admin.resume()
        assert not (await admin.stats()).paused


async def test_the_check_finds_a_group_in_the_wrong_partition(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue="misplaced", partitions=4) as producer:
        await producer.enqueue("w", 1, group="g")
    wrong = (home("g", 4) + 1) % 4
    # A producer that lies about the group's hash (a bug, or a hand-made
    # call) is the only way in; the check must say so.
    liar = next(h for h in range(100) if h % 4 == wrong)
    task = _scripts.NewTask(
        id="f" * 28 + f"-{wrong}" if wrong else "f" * 28,
        group="g",
        envelope=b"\x90",
        delay_ms=0,
        max_attempts=1,
        dedup_key=None,
    )
    await _scripts.enqueue(
        redis_client,
        QueueKeys("misplaced", wrong),
        [task],
        dedup_window_ms=1000,
        routing=_scripts.Routing(wrong, [liar]),
    )
    problems = await aiogroupq.check_queue(redis_client, "misplaced")
    kinds = {p.kind for p in problems}
    assert problem_kinds.WRONG_PARTITION in kinds, problems


async def test_an_unrouted_call_is_refused_by_a_partitioned_queue(
    redis_client: redis.asyncio.Redis,
) -> None:
    """A client that believes in one partition (it entered before the queue
    was partitioned) gets "stale" and nothing is written."""
    async with Producer(redis_client, queue="stale", partitions=2):
        pass
    task = _scripts.NewTask(
        id="e" * 28,
        group="g",
        envelope=b"\x90",
        delay_ms=0,
        max_attempts=1,
        dedup_key=None,
    )
    with pytest.raises(StaleLayoutRefusal):
        await _scripts.enqueue(
            redis_client, QueueKeys("stale"), [task], dedup_window_ms=1000
        )
    assert not await redis_client.exists(QueueKeys("stale").task("e" * 28))
    # Through the public API, a producer with the stale view follows it.
    parts = Partitions("stale")
    assert parts.layout.parts == 1


async def test_a_damaged_layout_leaves_a_running_consumer_going(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # It used to end the consumer: the layout's ConfigurationError escaped
    # the loop that re-reads it every second.
    queue = "damaged-layout"
    conf = QueueKeys(queue).conf
    ran = anyio.Event()

    async def job() -> None:
        ran.set()

    async with (
        Producer(redis_client, queue=queue, partitions=2) as producer,
        aiogroupq.Consumer(redis_client, queue=queue, handlers={"job": job}),
    ):
        await producer.enqueue("job", delay=2.5)
        await redis_client.hset(conf, "parts", "not a layout")
        with anyio.fail_after(30):
            await ran.wait()
    assert any("going on with the layout 2" in r.getMessage() for r in caplog.records)


# -- consumer-side assignment -------------------------------------------------------


async def _connections_named(client: redis.asyncio.Redis, name: str) -> int:
    listed = await client.client_list()
    return sum(1 for c in listed if c.get("name") == name)


async def test_consumers_share_the_partitions_and_take_over_a_leavers(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    """8 partitions, 3 consumers in one process (r = 2): each serves the
    share the assignment gives it, every partition by two, the views say
    which; all tasks run in group order; when one stops, the other two
    serve everything within a few leases; connections follow the share."""
    queue, names = "shared", ["share-a", "share-b", "share-c"]
    seen: dict[str, list[int]] = {}

    async def work(job: list[Any]) -> None:
        seen.setdefault(job[0], []).append(job[1])

    tasks = [Task("w", [f"g{i % 31}", i], group=f"g{i % 31}") for i in range(300)]
    async with (
        Producer(redis_client, queue=queue, partitions=8) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):

        def consumer(name: str) -> aiogroupq.Consumer:
            # Its own client, named, so that its connections can be counted.
            sep = "&" if "?" in redis_url else "?"
            return aiogroupq.Consumer(
                f"{redis_url}{sep}client_name={name}",
                queue=queue,
                handlers={"w": work},
                concurrency=4,
                lease_ttl=1.5,
                name=name,
            )

        async def settled(fleet: list[str]) -> dict[str, tuple[int, ...]]:
            want = assign(8, fleet, 2)
            with anyio.fail_after(PATIENCE):
                while True:
                    shown = {c.name: c.partitions for c in await admin.consumers()}
                    if shown == {n: tuple(sorted(s)) for n, s in want.items()}:
                        return {n: tuple(sorted(s)) for n, s in want.items()}
                    await anyio.sleep(0.05)

        first, second, third = (consumer(n) for n in names)
        async with first, second:
            async with third:
                shares = await settled(names)
                served = Counter(p for share in shares.values() for p in share)
                assert served == dict.fromkeys(range(8), 2)
                await producer.enqueue_many(tasks)
                with anyio.fail_after(PATIENCE):
                    while sum(map(len, seen.values())) < len(tasks):
                        await anyio.sleep(0.02)
                # Each blocks on its share's wake lists, one connection each,
                # plus what its claims, outcomes and heartbeats (sent to
                # each partition at once) had in flight together.
                with anyio.fail_after(PATIENCE):
                    while True:
                        held = {
                            n: await _connections_named(redis_client, n) for n in names
                        }
                        if all(held[n] <= 2 * len(s) + 4 for n, s in shares.items()):
                            break
                        await anyio.sleep(0.1)
                print(f"[share] shares={shares} connections={held}")  # noqa: T201
            # The third stopped (a clean exit leaves the registry): two
            # consumers, r = 2: both serve everything.
            assert await settled(names[:2]) == dict.fromkeys(names[:2], tuple(range(8)))
    assert all(runs == sorted(runs) for runs in seen.values())
    assert await aiogroupq.check_queue(redis_client, queue) == []


async def test_a_queue_of_one_partition_is_served_by_every_consumer(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def work(n: int) -> None:
        pass

    async with Producer(redis_client, queue="single") as producer:
        await producer.enqueue("w", 1)
    consumers = [
        aiogroupq.Consumer(
            redis_client, queue="single", handlers={"w": work}, lease_ttl=1.5
        )
        for _ in range(3)
    ]
    async with (
        aiogroupq.Admin(redis_client, queue="single") as admin,
        consumers[0],
        consumers[1],
        consumers[2],
    ):
        with anyio.fail_after(PATIENCE):
            while [c.partitions for c in await admin.consumers()] != [(0,)] * 3:
                await anyio.sleep(0.05)


async def test_partition_replicas_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="partition_replicas"):
        aiogroupq.Consumer(
            "redis://localhost", queue="q", handlers={}, partition_replicas=0
        )
