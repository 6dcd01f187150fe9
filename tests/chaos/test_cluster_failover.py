"""Failover: kill -9 a primary of a Redis Cluster under load; its replica
takes over (docs/guarantees.md, "Redis Cluster and failover").

A cluster of 3 primaries with one replica each (``cluster-node-timeout`` 1 s)
holds a queue of 8 partitions. Two producers with ``durability="replicated"``
(each enqueue is acknowledged only once a replica holds it) feed 160 groups
and ungrouped tasks, re-sending an enqueue that failed (its dedup key makes
the re-send find the task if the first try did land); 3 consumer processes,
also ``durability="replicated"``, journal their runs. A third of the way in,
the primary serving the most partitions (never the journal's) is killed.

Asserted: no acknowledged enqueue is lost, each group's order and exclusion
hold, every task runs (a task whose completion the failover took back runs
again: at-least-once, counted and printed, never a violation).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import anyio
import pytest
from redis.asyncio.cluster import RedisCluster

import aiogroupq
from aiogroupq import AiogroupqError, Producer
from aiogroupq._store.keys import QueueKeys
from aiogroupq.testing._cluster_server import ClusterProcess

from .._journal import Job, Journal, Options, check, consumer_processes

if TYPE_CHECKING:
    from aiogroupq.testing._server import ServerProcess

pytestmark = pytest.mark.chaos

PARTITIONS = 8
GROUPS = 160
UNGROUPED = 600
#: liveness only
PATIENCE = 120.0


@pytest.fixture
def cluster() -> Iterator[ClusterProcess]:
    with ClusterProcess(masters=3, replicas=1, node_timeout_ms=1000) as running:
        yield running


def _plan(rng: random.Random) -> list[list[Job]]:
    """Two producers' jobs: each group belongs to one producer, in order."""
    plans: list[list[Job]] = [[], []]
    tokens: list[list[str | None]] = [[], []]
    for g in range(GROUPS):
        tokens[g % 2] += [f"g{g}"] * rng.randint(3, 10)
    for u in range(UNGROUPED):
        tokens[u % 2].append(None)
    n = 0
    for mine, plan in zip(tokens, plans, strict=True):
        rng.shuffle(mine)
        seqs: dict[str, int] = {}
        for group in mine:
            seq = 0
            if group is not None:
                seq = seqs.get(group, 0)
                seqs[group] = seq + 1
            sleep_ms = rng.uniform(0, 5) if rng.random() < 0.3 else 0.0
            plan.append(Job(n=n, group=group, seq=seq, sleep_ms=sleep_ms))
            n += 1
    return plans


def _victim(cluster: ClusterProcess, journal_key: str) -> ServerProcess:
    """The primary serving the most partitions, other than the journal's."""
    spared = cluster.primary_of(journal_key).port
    owners = Counter(
        cluster.primary_of(QueueKeys("failover", p).prefix).port
        for p in range(PARTITIONS)
    )
    for port, _ in owners.most_common():
        if port != spared:
            return next(n for n in cluster.primaries() if n.port == port)
    raise AssertionError("every partition lives with the journal")


async def test_a_primary_killed_under_load_loses_no_acknowledged_task(
    cluster: ClusterProcess,
) -> None:
    queue = "failover"
    seed = random.randrange(2**32)
    plans = _plan(random.Random(seed))
    expected = {job.n: job for plan in plans for job in plan}
    journal_key = "{chaos:journal}"
    victim = _victim(cluster, journal_key)
    acked: dict[int, str] = {}
    resends = Counter[str]()
    sent = 0
    killed = anyio.Event()
    kill_at = len(expected) // 3

    async def produce(plan: list[Job]) -> None:
        nonlocal sent
        async with Producer(
            cluster.url, queue=queue, durability="replicated"
        ) as producer:
            for job in plan:
                while True:
                    try:
                        acked[job.n] = await producer.enqueue(
                            "work", job, group=job.group, dedup_key=f"j{job.n}"
                        )
                        break
                    except AiogroupqError as exc:
                        # Not acknowledged: it may or may not be there; the
                        # dedup key makes the re-send find it if it is.
                        resends[type(exc).__name__] += 1
                        await anyio.sleep(0.1)
                sent += 1
                if sent == kill_at:
                    killed.set()

    async def chaos() -> float:
        await killed.wait()
        cluster.kill(victim)
        began = time.monotonic()
        await anyio.to_thread.run_sync(cluster.wait_ok, 60.0)
        took = time.monotonic() - began
        # The promoted replica has no replica of its own: replicated writes
        # to its partitions are refused until the old primary is back (as
        # its replica), as an operator would bring it back.
        await anyio.to_thread.run_sync(cluster.restart, victim)
        await anyio.to_thread.run_sync(cluster.wait_ok, 60.0)
        return took

    failover_s: list[float] = []

    async def run_chaos() -> None:
        failover_s.append(await chaos())

    async with Producer(cluster.url, queue=queue, partitions=PARTITIONS):
        pass
    first = cluster.primary_of(journal_key)
    client = RedisCluster(host="127.0.0.1", port=first.port)
    try:
        journal = Journal(client, key=journal_key)
        options = Options(
            partitions=PARTITIONS,
            durability="replicated",
            journal_key=journal_key,
            lease_ttl=5.0,
        )
        started = time.monotonic()
        async with consumer_processes(
            cluster.url,
            queue,
            processes=3,
            concurrency=8,
            retry_backoff=0.2,
            options=options,
        ) as procs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_chaos)
                for plan in plans:
                    tg.start_soon(produce, plan)
            with anyio.fail_after(PATIENCE):
                while await journal.done_count() < len(expected):
                    if any(p.exitcode is not None for p in procs):
                        pytest.fail("a consumer process died")
                    await anyio.sleep(0.1)
        elapsed = time.monotonic() - started
        figures = check(await journal.entries(), expected)
        problems = await aiogroupq.check_queue(cluster.url, queue)
    finally:
        await client.aclose()
    report = {
        "fault": "cluster primary kill -9 (replicated)",
        "seed": seed,
        "enqueued": len(expected),
        "acknowledged": len(acked),
        "acknowledged_lost": figures.never_run,
        "resends": dict(resends),
        "failover_s": round(failover_s[0], 2),
        "order_violations": figures.order_violations,
        "overlaps": figures.overlaps,
        "re_runs": figures.starts - figures.started,
        "started_more_than_once": figures.started_more_than_once,
        "elapsed_s": round(elapsed, 1),
    }
    print(json.dumps(report, sort_keys=True))  # noqa: T201 - the figures are the point
    assert len(acked) == len(expected)
    assert figures.never_run == 0
    assert figures.unexpected == 0
    assert figures.order_violations == 0
    assert figures.overlaps == 0
    assert figures.max_group_concurrency == 1
    assert problems == []
