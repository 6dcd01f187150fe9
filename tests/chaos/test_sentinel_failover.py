"""Failover under Redis Sentinel: kill -9 the primary under load; the
sentinels promote its replica, and every role follows by itself through its
``redis+sentinel://`` URL (docs/high-availability.md).

A primary, one replica and three sentinels (``down-after-milliseconds`` 1 s)
hold the queue. Two producers feed grouped and ungrouped tasks, re-sending
an enqueue that failed (its dedup key makes the re-send find the task if
the first try landed); 3 consumer processes journal their runs on a server
of their own, outside the deployment, so that the journal's timeline
survives the failover. A third of the way in, the primary is killed; once
the replica is promoted the old primary is started again (empty: no AOF),
and the sentinels turn it into the new primary's replica.

``durability="replicated"`` (every role): asserted no acknowledged task
lost, group order and exclusion kept. ``durability="primary"``: what the
failover lost is printed, not asserted (replication is asynchronous there).
Re-runs of a task whose completion the failover took back are counted and
printed: at-least-once, never a violation.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import AiogroupqError, Producer
from aiogroupq.testing._sentinel_server import SentinelSet
from aiogroupq.testing._server import ServerProcess, ServerStartError

from .._journal import Flag, Job, Journal, check, make_handlers, spawned

pytestmark = pytest.mark.chaos

QUEUE = "sentinel-failover"
GROUPS = 80
UNGROUPED = 300
#: liveness only
PATIENCE = 120.0
#: with durability="primary", the queue counts as drained once nothing is
#: waiting or running and no task completed for this long
QUIET_S = 5.0

Durability = Literal["primary", "replicated"]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[SentinelSet]:
    try:
        running = SentinelSet(replicas=1, sentinels=3, workdir=tmp_path / "ha")
        running.start()
    except ServerStartError as exc:
        running.close()
        pytest.skip(f"no server binary here runs as a Redis Sentinel: {exc}")
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def journal_server(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(workdir=tmp_path / "journal") as server:
        yield server


def consume(
    url: str,
    journal_url: str,
    durability: Durability,
    ready: Flag,
    stop: Flag,
) -> None:
    """Target of a ``spawn`` child: consume the queue, journaling on
    *journal_url*, until *stop* is set."""
    anyio.run(_consume, url, journal_url, durability, ready, stop, backend="asyncio")


async def _consume(
    url: str, journal_url: str, durability: Durability, ready: Flag, stop: Flag
) -> None:
    client = redis.asyncio.Redis.from_url(journal_url)
    try:
        async with aiogroupq.Consumer(
            url,
            queue=QUEUE,
            handlers=make_handlers(Journal(client)),
            concurrency=8,
            grace_period=10.0,
            retry_backoff=0.2,
            durability=durability,
            lease_ttl=5.0,
        ):
            ready.set()
            while not stop.is_set():
                await anyio.sleep(0.05)
    finally:
        await client.aclose()


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


async def _drained(admin: aiogroupq.Admin) -> bool:
    stats = await admin.stats()
    waiting = stats.ready + stats.parked + stats.held + stats.delayed
    return waiting + stats.running == 0


@pytest.mark.parametrize("durability", ["replicated", "primary"])
async def test_a_primary_killed_under_load(
    deployment: SentinelSet, journal_server: ServerProcess, durability: Durability
) -> None:
    seed = random.randrange(2**32)
    plans = _plan(random.Random(seed))
    expected = {job.n: job for plan in plans for job in plan}
    acked: dict[int, str] = {}
    resends = Counter[str]()
    sent = 0
    killed = anyio.Event()
    kill_at = len(expected) // 3
    failover_s: list[float] = []
    url = deployment.url

    async def produce(plan: list[Job]) -> None:
        nonlocal sent
        async with Producer(url, queue=QUEUE, durability=durability) as producer:
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

    async def chaos() -> None:
        await killed.wait()
        old = deployment.primary()
        deployment.kill(old)
        began = time.monotonic()
        await anyio.to_thread.run_sync(deployment.wait_promoted, old)
        failover_s.append(time.monotonic() - began)
        # The promoted replica has none of its own: replicated writes wait
        # until the old primary is back, as the new one's replica, as an
        # operator's supervisor would bring it back (after the promotion).
        await anyio.to_thread.run_sync(deployment.restart, old)
        await anyio.to_thread.run_sync(deployment.wait_settled, PATIENCE)

    journal_client = redis.asyncio.Redis.from_url(journal_server.url)
    journal = Journal(journal_client)

    def args(ready: Flag, stop: Flag) -> tuple[object, ...]:
        return (url, journal_server.url, durability, ready, stop)

    started = time.monotonic()
    try:
        async with (
            aiogroupq.Admin(url, queue=QUEUE) as admin,
            spawned(consume, args, 3) as procs,
        ):
            async with anyio.create_task_group() as tg:
                tg.start_soon(chaos)
                for plan in plans:
                    tg.start_soon(produce, plan)
            with anyio.fail_after(PATIENCE):
                quiet_since, last = time.monotonic(), -1
                while (done := await journal.done_count()) < len(expected):
                    if any(p.exitcode is not None for p in procs):
                        pytest.fail("a consumer process died")
                    if done != last:
                        quiet_since, last = time.monotonic(), done
                    elif (
                        durability == "primary"
                        and time.monotonic() - quiet_since > QUIET_S
                        and await _drained(admin)
                    ):
                        break  # what is left was lost
                    await anyio.sleep(0.1)
            elapsed = time.monotonic() - started
            figures = check(await journal.entries(), expected)
            problems = await aiogroupq.check_queue(url, QUEUE)
    finally:
        await journal_client.aclose()
    report = {
        "fault": f"sentinel primary kill -9 ({durability})",
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
        "problems": len(problems),
        "elapsed_s": round(elapsed, 1),
    }
    print(json.dumps(report, sort_keys=True))  # noqa: T201 - the figures are the point
    assert len(acked) == len(expected)
    assert figures.unexpected == 0
    if durability == "replicated":
        assert figures.never_run == 0
        assert figures.order_violations == 0
        assert figures.overlaps == 0
        assert figures.max_group_concurrency == 1
        assert problems == []
