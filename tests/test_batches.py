"""Ordered group batches (``Handler(batch_size=N)``, issue 19).

A batch is consecutive tasks of one group, in enqueue order, run by one
handler call; it holds its group for its whole run. The multi-process tests
journal each task of a batch (its start, then its end, one task after the
other) on the Redis server's timeline (``tests/_journal.py``), and list
every batch a handler got, so that order, exclusion and the batches' makeup
are judged from what ran. Outcomes, recovery, ``batch_wait`` and the claim's
cost without batch handlers are checked on real consumers and a real
server, never mocked. Every test that uses the queue takes ``redis_client``
for its freshly flushed database.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.process
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.replies import FinishCode

from ._journal import Client, Flag, Job, Journal, check, client_for, spawned
from ._scripts_helpers import (
    KEYS,
    assert_consistent,
    control,
    enqueue,
    expire_lease,
    finish,
    lrange,
    new,
    ok,
    set_group,
    stats,
)
from .test_script_commands import _commands

QUEUE = "batches"
BATCHES_KEY = "test:batches"
HANG_KEY = "test:hang"
#: liveness bound for anything that should take seconds
LIVENESS = 60.0
#: a job's sleep_ms asking its handler to hang, once per test (the run a
#: test kills)
HANG = -1.0


class Batch(msgspec.Struct, frozen=True):
    """One call of a batch handler, as listed in the batches list."""

    pid: int
    ns: list[int]
    groups: list[str | None]
    seqs: list[int]
    attempts: list[int]


def batch_handler(
    journal: Journal, client: Client
) -> Callable[[list[Job]], Awaitable[None]]:
    """A batch handler journaling each task's start and end, in order."""

    async def work(jobs: list[Job]) -> None:
        infos = aiogroupq.current_batch()
        assert aiogroupq.current_task() == infos[0]
        listed = Batch(
            os.getpid(),
            [j.n for j in jobs],
            [i.group for i in infos],
            [j.seq for j in jobs],
            [i.attempt for i in infos],
        )
        await client.rpush(BATCHES_KEY, msgspec.json.encode(listed))
        for job, info in zip(jobs, infos, strict=True):
            with anyio.CancelScope(shield=True):
                await journal.record("start", job, info=info)
            if job.sleep_ms == HANG and await client.set(HANG_KEY, 1, nx=True):
                await anyio.sleep(3600)  # killed here
            elif job.sleep_ms > 0:
                await anyio.sleep(job.sleep_ms / 1000)
            with anyio.CancelScope(shield=True):
                await journal.record("end", job, info=info)

    return work


def consume_batches(
    url: str,
    concurrency: int,
    ready: Flag,
    stop: Flag,
    lease_ttl: float,
) -> None:
    """Target of a ``spawn`` child: a batch consumer until *stop* is set."""
    anyio.run(_consume, url, concurrency, ready, stop, lease_ttl, backend="asyncio")


async def _consume(
    url: str, concurrency: int, ready: Flag, stop: Flag, lease_ttl: float
) -> None:
    client = client_for(url)
    try:
        handler = aiogroupq.Handler(
            batch_handler(Journal(client), client), batch_size=5, retry_backoff=0.01
        )
        async with aiogroupq.Consumer(
            url,
            queue=QUEUE,
            handlers={"work": handler},
            concurrency=concurrency,
            lease_ttl=lease_ttl,
            grace_period=10.0,
        ):
            ready.set()
            while not stop.is_set():
                await anyio.sleep(0.05)
    finally:
        await client.aclose()


@asynccontextmanager
async def batch_processes(
    url: str, *, processes: int, concurrency: int = 4, lease_ttl: float = 30.0
) -> AsyncIterator[list[multiprocessing.process.BaseProcess]]:
    """*processes* spawned batch consumers, all claiming when the block
    begins; stopped after (a process the test killed is left as it is)."""

    def args(ready: Flag, stop: Flag) -> tuple[object, ...]:
        return (url, concurrency, ready, stop, lease_ttl)

    async with spawned(consume_batches, args, processes) as procs:
        yield procs


async def _enqueue_jobs(
    url: str,
    groups: int,
    per_group: int,
    *,
    ungrouped: int = 0,
    hang: int = -1,
    sleep_ms: float = 0.0,
) -> dict[int, Job]:
    """Enqueue interleaved groups' jobs (and ungrouped ones) in one call;
    the job numbered *hang* hangs its first run."""
    jobs: dict[int, Job] = {}
    n = 0
    for seq in range(per_group):
        for g in range(groups):
            jobs[n] = Job(n, f"g{g}", seq, HANG if n == hang else sleep_ms)
            n += 1
    for i in range(ungrouped):
        jobs[n] = Job(n, None, i)
        n += 1
    async with aiogroupq.Producer(url, queue=QUEUE) as producer:
        await producer.enqueue_many(
            aiogroupq.Task("work", job, group=job.group) for job in jobs.values()
        )
    return jobs


async def _batches(client: redis.asyncio.Redis) -> list[Batch]:
    return [
        msgspec.json.decode(line, type=Batch)
        for line in await client.lrange(BATCHES_KEY, 0, -1)
    ]


def _assert_batches_are_consecutive(batches: Sequence[Batch], size: int) -> None:
    """Each batch: one group's consecutive tasks, at most *size*."""
    for batch in batches:
        assert 1 <= len(batch.ns) <= size, batch
        assert len(set(batch.groups)) == 1, batch
        if batch.groups[0] is None:
            assert len(batch.ns) == 1, batch  # ungrouped: batches of one
        else:
            first = batch.seqs[0]
            assert batch.seqs == list(range(first, first + len(batch.seqs))), batch


async def _assert_clean(url: str) -> None:
    assert await aiogroupq.check_queue(url, QUEUE) == []


# -- several consumer processes ---------------------------------------------------


async def test_batches_of_several_processes_keep_each_group_in_order(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    journal = Journal(redis_client)
    async with batch_processes(redis_url, processes=3):
        # At once (one atomic call), so that batches can fill; the
        # processes race for them.
        jobs = await _enqueue_jobs(
            redis_url, groups=6, per_group=30, ungrouped=6, sleep_ms=2.0
        )
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(len(jobs))
    figures = check(await journal.entries(), jobs)
    print(figures)  # noqa: T201 - shown on failure
    assert figures.never_run == 0
    assert figures.started_more_than_once == 0
    assert figures.order_violations == 0
    assert figures.overlaps == 0  # no two batches of a group at once
    assert figures.unfinished == 0
    assert figures.max_group_concurrency == 1
    assert figures.meta_mismatches == 0
    batches = await _batches(redis_client)
    _assert_batches_are_consecutive(batches, 5)
    assert sum(len(b.ns) for b in batches) == len(jobs)
    # The feature at work: tasks queued behind a group's head came with it.
    assert max(len(b.ns) for b in batches) == 5
    assert len({b.pid for b in batches}) > 1
    await _assert_clean(redis_url)


async def test_killed_consumer_mid_batch_runs_the_batch_again_in_order(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    journal = Journal(redis_client)
    # One group; the third task hangs in the first run (a batch of five).
    jobs = await _enqueue_jobs(redis_url, groups=1, per_group=12, hang=2)
    async with batch_processes(redis_url, processes=1, lease_ttl=1.0) as (victim,):
        with anyio.fail_after(LIVENESS):
            while not any(
                e.n == 2 and e.event == "start" for e in await journal.entries()
            ):
                await anyio.sleep(0.02)
        assert victim.pid is not None
        os.kill(victim.pid, 9)  # mid-batch: its tasks are still leased
        await anyio.to_thread.run_sync(victim.join, 10)
    killed = victim.pid
    async with batch_processes(redis_url, processes=2):
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(len(jobs))
    entries = [e for e in await journal.entries() if e.pid != killed]
    figures = check(entries, jobs)
    print(figures)  # noqa: T201
    assert figures.never_run == 0
    assert figures.started_more_than_once == 0  # among the survivors
    assert figures.order_violations == 0
    assert figures.overlaps == 0
    assert figures.unfinished == 0
    survivors = [b for b in await _batches(redis_client) if b.pid != killed]
    _assert_batches_are_consecutive(survivors, 5)
    # The killed batch came back whole, from its head: the head's attempt
    # counted, and it runs alone first (the killer may be any task of the
    # batch); its members' attempts not counted (they were not judged).
    rerun = sorted(survivors, key=lambda b: b.seqs[0])
    assert (rerun[0].seqs, rerun[0].attempts) == ([0], [2])
    assert (rerun[1].seqs, rerun[1].attempts) == ([1, 2, 3, 4, 5], [1] * 5)
    await _assert_clean(redis_url)


# -- outcomes ----------------------------------------------------------------------


Calls = list[tuple[list[int], list[int]]]


@asynccontextmanager
async def _consumer(
    url: str,
    func: Callable[[list[int]], Awaitable[Any]],
    **options: Any,
) -> AsyncIterator[None]:
    on_dead = options.pop("on_dead", None)
    handler = aiogroupq.Handler(func, retry_backoff=0.01, **options)
    async with aiogroupq.Consumer(
        url, queue=QUEUE, handlers={"h": handler}, concurrency=4, on_dead=on_dead
    ):
        yield


def _calling(
    calls: Calls, fail: Callable[[list[int], list[int]], None] | None = None
) -> Callable[[list[int]], Awaitable[None]]:
    async def h(items: list[int]) -> None:
        attempts = [i.attempt for i in aiogroupq.current_batch()]
        calls.append((list(items), attempts))
        if fail is not None:
            fail(items, attempts)

    return h


async def _enqueue(url: str, n: int, *, group: str = "g", **options: Any) -> list[str]:
    async with aiogroupq.Producer(url, queue=QUEUE) as producer:
        return [
            await producer.enqueue("h", i, group=group, **options) for i in range(n)
        ]


async def _until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(LIVENESS):
        while not condition():
            await anyio.sleep(0.01)


async def _until_ended(url: str, ids: list[str]) -> list[str]:
    """Wait until each of *ids* ended, whatever its end; their states."""
    ends = {"succeeded", "dead", "cancelled", "expired"}
    with anyio.fail_after(LIVENESS):
        while True:
            states = [state for state, _ in await _states(url, ids)]
            if ends.issuperset(states):
                return states
            await anyio.sleep(0.02)


async def _states(url: str, ids: list[str]) -> list[tuple[str, int]]:
    """Each task's state and attempts started."""
    async with aiogroupq.Admin(url, queue=QUEUE) as admin:
        out = []
        for task_id in ids:
            task = await admin.task(task_id)
            out.append((str(task.state), task.attempt))
        return out


async def test_batch_failed_splits_the_batch(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    ids = await _enqueue(redis_url, 5)
    calls: Calls = []
    read = anyio.Event()

    async def h(items: list[int]) -> None:
        calls.append((list(items), [i.attempt for i in aiogroupq.current_batch()]))
        if len(calls) == 1:
            raise aiogroupq.BatchFailed(done=2, error=ValueError("third failed"))
        if len(calls) == 2:
            await read.wait()

    async with _consumer(redis_url, h, batch_size=5):
        try:
            # The second call runs once the first one's outcomes are
            # written: held there, the states are what BatchFailed left.
            await _until(lambda: len(calls) >= 2)
            settled = await _states(redis_url, ids)
        finally:
            read.set()
        succeeded = [n for n, (state, _) in enumerate(settled) if state == "succeeded"]
        assert succeeded == [0, 1], (
            f"BatchFailed(done=2) settled tasks {succeeded} as succeeded, not "
            f"the first 2: {settled}"
        )
        assert calls[1] == ([2, 3, 4], [2, 1, 1]), (
            "after BatchFailed(done=2) the failed third task and the two after "
            f"it go back to the line, the third's attempt counted: {calls}"
        )
        await _until(lambda: sum(len(c[0]) for c in calls) >= 8)
        await anyio.sleep(0.2)
    # The first two succeeded; the third ran again (its attempt counted),
    # before the two after it, whose failed batch did not count.
    assert calls == [([0, 1, 2, 3, 4], [1] * 5), ([2, 3, 4], [2, 1, 1])]
    assert await _states(redis_url, ids) == [
        ("succeeded", 1),
        ("succeeded", 1),
        ("succeeded", 2),
        ("succeeded", 1),
        ("succeeded", 1),
    ]
    await _assert_clean(redis_url)


async def test_any_other_error_retries_the_whole_batch_in_order(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    ids = await _enqueue(redis_url, 5)
    calls: Calls = []

    def fail(items: list[int], attempts: list[int]) -> None:
        if len(calls) == 1:
            raise RuntimeError("the batch failed")

    async with _consumer(redis_url, _calling(calls, fail), batch_size=5):
        await _until(lambda: len(calls) >= 2)
        await anyio.sleep(0.2)
    assert calls == [([0, 1, 2, 3, 4], [1] * 5), ([0, 1, 2, 3, 4], [2, 1, 1, 1, 1])]
    assert [s for s, _ in await _states(redis_url, ids)] == ["succeeded"] * 5
    await _assert_clean(redis_url)


async def test_dead_letters_and_on_dead_are_per_task(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    ids = await _enqueue(redis_url, 6, max_attempts=1)
    calls: Calls = []
    dead: list[str] = []

    def fail(items: list[int], attempts: list[int]) -> None:
        if items[0] == 0:
            raise aiogroupq.BatchFailed(done=1, error=ValueError("second is bad"))
        if items[0] == 2:
            raise RuntimeError("the whole batch failed")

    async def on_dead(letter: aiogroupq.DeadLetter) -> None:
        dead.append(letter.id)

    async with _consumer(
        redis_url, _calling(calls, fail), batch_size=3, on_dead=on_dead
    ):
        # Until every task ended and each dead one's on_dead ran, whatever
        # the outcomes: a wrong split ends the queue otherwise, and the
        # assertions below name it.
        ended = await _until_ended(redis_url, ids)
        await _until(lambda: len(dead) >= ended.count("dead"))
        await anyio.sleep(0.2)
    # [0 1 2]: 0 ok, 1 dead, 2 back in line; [2 3 4]: 2 dead (the head, on
    # its last attempt), 3 and 4 back in line; [3 4 5] succeed.
    assert [c[0] for c in calls] == [[0, 1, 2], [2, 3, 4], [3, 4, 5]], (
        f"BatchFailed(done=1) settles the first task only, the second dead, "
        f"the rest back in line: calls {calls}, states {ended}"
    )
    assert sorted(dead) == sorted([ids[1], ids[2]])
    assert [s for s, _ in await _states(redis_url, ids)] == [
        "succeeded",
        "dead",
        "dead",
        "succeeded",
        "succeeded",
        "succeeded",
    ]
    await _assert_clean(redis_url)


async def test_a_member_that_does_not_decode_ends_the_batch_before_it(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with aiogroupq.Producer(redis_url, queue=QUEUE) as producer:
        ids = [
            await producer.enqueue("h", payload, group="g")
            for payload in (0, 1, "not an int", 3, 4)
        ]
    calls: Calls = []
    async with _consumer(redis_url, _calling(calls), batch_size=5):
        await _until(lambda: sum(len(c[0]) for c in calls) >= 4)
        await anyio.sleep(0.2)
    # It is dead-lettered as a single task would be; the batch runs the tasks
    # before it, and those after it wait their turn in line, uncounted.
    assert calls == [([0, 1], [1, 1]), ([3, 4], [1, 1])]
    assert [s for s, _ in await _states(redis_url, ids)] == [
        "succeeded",
        "succeeded",
        "dead",
        "succeeded",
        "succeeded",
    ]
    await _assert_clean(redis_url)


async def test_shutdown_mid_batch_hands_the_batch_back_in_order(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    ids = await _enqueue(redis_url, 5)
    started = anyio.Event()

    async def stuck(items: list[int]) -> None:
        started.set()
        await anyio.sleep(3600)

    handler = aiogroupq.Handler(stuck, batch_size=5)
    async with aiogroupq.Consumer(
        redis_url, queue=QUEUE, handlers={"h": handler}, grace_period=0.1
    ):
        with anyio.fail_after(LIVENESS):
            await started.wait()
    # Handed back unfinished: the head to the front, the others in line
    # behind it, no attempt counted.
    assert await _states(redis_url, ids) == [("queued", 0)] * 5
    await _assert_clean(redis_url)
    calls: Calls = []
    async with _consumer(redis_url, _calling(calls), batch_size=5):
        await _until(lambda: len(calls) >= 1)
    assert calls == [([0, 1, 2, 3, 4], [1] * 5)]


@pytest.mark.parametrize("how", ["expired", "taken"])
async def test_a_members_lost_lease_stops_the_whole_batch(
    redis_url: str, redis_client: redis.asyncio.Redis, how: str
) -> None:
    ids = await _enqueue(redis_url, 5)
    keys = QueueKeys(QUEUE)
    calls: Calls = []
    stopped = anyio.Event()
    tokens: list[int] = []

    async def h(items: list[int]) -> None:
        calls.append((list(items), [i.attempt for i in aiogroupq.current_batch()]))
        if len(calls) == 1:
            tokens.append(aiogroupq.current_task().fencing_token)
            try:
                await anyio.sleep(3600)
            finally:
                stopped.set()

    handler = aiogroupq.Handler(h, batch_size=5)
    async with aiogroupq.Consumer(
        redis_url, queue=QUEUE, handlers={"h": handler}, lease_ttl=1.0
    ):
        await _until(lambda: len(calls) >= 1)
        with anyio.fail_after(LIVENESS):
            while not stopped.is_set():
                if how == "expired":
                    # The third task's lease runs out (its heartbeat failed):
                    # the next claim recovers its batch, whole.
                    await redis_client.zadd(keys.leases, {ids[2]: 0}, xx=True)
                    await redis_client.rpush(keys.wake, "1")
                else:
                    # The third task's token no longer owns it (the heartbeat
                    # answers "lost" for it alone): the batch stops all the
                    # same, and comes back once its leases run out.
                    await redis_client.hset(keys.task(ids[2]), "k", "0")
                await anyio.sleep(0.05)
        if how == "taken":
            # Stopped by that alone: the head still holds its lease.
            head = await redis_client.hmget(keys.task(ids[0]), "s", "k")
            assert head == [b"running", str(tokens[0]).encode()]
        await _until(lambda: sum(len(c[0]) for c in calls) >= 10)
        await anyio.sleep(0.2)
    assert calls == [([0, 1, 2, 3, 4], [1] * 5), ([0], [2]), ([1, 2, 3, 4], [1] * 4)]
    await _assert_clean(redis_url)


async def test_store_result_takes_one_result_per_task(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    ids = await _enqueue(redis_url, 3)
    calls: Calls = []

    async def h(items: list[int]) -> list[int] | int:
        calls.append((list(items), []))
        if len(calls) == 1:
            return 7  # not a list of results: the whole batch is retried
        return [i * 10 for i in items]

    async with (
        _consumer(redis_url, h, batch_size=3, store_result=True),
        aiogroupq.Producer(redis_url, queue=QUEUE) as producer,
    ):
        with anyio.fail_after(LIVENESS):
            results = [await producer.result(i) for i in ids]
    assert results == [0, 10, 20]
    assert [c[0] for c in calls] == [[0, 1, 2], [0, 1, 2]]
    assert await _states(redis_url, ids) == [
        ("succeeded", 2),
        ("succeeded", 1),
        ("succeeded", 1),
    ]
    await _assert_clean(redis_url)


async def test_batch_wait_tops_up_a_partial_batch(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    await _enqueue(redis_url, 2)
    calls: Calls = []
    async with _consumer(redis_url, _calling(calls), batch_size=5, batch_wait=1.5):
        await anyio.sleep(0.3)  # claimed, waiting to fill
        async with aiogroupq.Producer(redis_url, queue=QUEUE) as producer:
            for i in range(2, 7):
                await producer.enqueue("h", i, group="g")
        await _until(lambda: sum(len(c[0]) for c in calls) >= 7)
    assert [c[0] for c in calls] == [[0, 1, 2, 3, 4], [5, 6]]
    await _assert_clean(redis_url)


async def test_check_and_repair_leave_a_running_batch_alone(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    await _enqueue(redis_url, 4)
    running, release = anyio.Event(), anyio.Event()
    calls: Calls = []

    async def h(items: list[int]) -> None:
        calls.append((list(items), []))
        running.set()
        await release.wait()

    async with _consumer(redis_url, h, batch_size=4):
        with anyio.fail_after(LIVENESS):
            await running.wait()
        # The group holds four slots over its limit of one: no problem.
        assert await aiogroupq.check_queue(redis_url, QUEUE) == []
        assert await aiogroupq.repair_queue(redis_url, QUEUE) == []
        release.set()
        await _until(lambda: len(calls) >= 1)
        await anyio.sleep(0.3)
    assert calls == [([0, 1, 2, 3], [])]
    await _assert_clean(redis_url)


# -- the claim's cost --------------------------------------------------------------


async def _drain_grouped(
    client: redis.asyncio.Redis, batches: tuple[tuple[str, int], ...]
) -> int:
    await client.flushdb()
    await enqueue(client, *(new(f"t{i:03d}", f"g{i}") for i in range(64)))
    before = await _commands(client)
    done = 0
    while done < 64:
        reply = await _scripts.claim(
            client,
            KEYS,
            "c1",
            k=32,
            lease_ms=600_000,
            scan_limit=1000,
            retention_ms=600_000,
            batches=batches,
        )
        assert reply.tasks
        codes = await finish(client, *(ok(t) for t in reply.tasks))
        assert set(codes) == {FinishCode.APPLIED}
        done += len(reply.tasks)
    return await _commands(client) - before


async def test_a_queue_without_batch_handlers_pays_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    without = await _drain_grouped(redis_client, ())
    # A batch type the queue has no task of: the claim's one read of each
    # task brings its type too, so not even a command more.
    unused = await _drain_grouped(redis_client, (("other", 5),))
    print(f"grouped drain: {without} commands, {unused} with a batch handler")  # noqa: T201
    # As test_script_commands' figure for tasks in groups of their own
    # (13.2 per task before batches existed): nothing added without them.
    assert without / 64 <= 14
    assert unused == without


async def test_claim_reply_lists_members_after_their_head(
    redis_client: redis.asyncio.Redis,
) -> None:
    # Typed "t" (the i field the producer writes: "<ms> <size> <type>").
    await enqueue(
        redis_client,
        *(dataclasses.replace(new(f"t{i}", "g"), identity="0 0 t") for i in range(4)),
    )
    reply = await _scripts.claim(
        redis_client,
        KEYS,
        "c1",
        k=4,
        lease_ms=600_000,
        scan_limit=10,
        batches=(("t", 3),),
    )
    assert [(t.id, t.member) for t in reply.tasks] == [
        ("t0", False),
        ("t1", True),
        ("t2", True),
    ]
    assert len({t.token for t in reply.tasks}) == 3
    # Each task of the batch started (its attempt runs), not the claim once.
    started = (await stats(redis_client)).get("started")
    assert started == 3, f"the stats count {started} started for a batch of 3"
    # A group holds a slot per task of the batch: its fourth task waits.
    assert await redis_client.hget(KEYS.group("g"), "k") == b"3"
    # A member's outcome "line": back to the front of the line, uncounted,
    # nothing passed on while the batch's others hold their slots.
    head, m1, m2 = reply.tasks
    line = [_scripts.Outcome(t.id, t.token, "line") for t in (m2, m1)]
    assert await finish(redis_client, *line) == [FinishCode.APPLIED] * 2
    assert await redis_client.lrange(KEYS.parked("g"), 0, -1) == [b"t1", b"t2", b"t3"]
    assert await redis_client.hget(KEYS.task("t1"), "a") == b"0"
    assert await finish(redis_client, ok(head)) == [FinishCode.APPLIED]
    nxt = await _scripts.claim(
        redis_client, KEYS, "c1", k=4, lease_ms=600_000, scan_limit=10
    )
    assert [t.id for t in nxt.tasks] == ["t1"]


# -- bad settings ------------------------------------------------------------------


async def _h(items: list[int]) -> None:
    del items


@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 0},
        {"batch_size": 1001},
        {"batch_size": True},
        {"batch_size": "5"},
        {"batch_size": 5, "batch_wait": -1},
        {"batch_size": 5, "batch_wait": 2.5},
        {"batch_size": 5, "batch_wait": "1"},
        {"batch_wait": 0.5},
    ],
)
def test_bad_batch_settings_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(aiogroupq.ConfigurationError):
        aiogroupq.Handler(_h, **options)


def test_a_batch_handler_takes_a_list() -> None:
    async def one(item: int) -> None:
        del item

    async def none() -> None:
        pass

    for func in (one, none):
        with pytest.raises(aiogroupq.ConfigurationError):
            aiogroupq.Consumer(
                "redis://localhost",
                queue=QUEUE,
                handlers={"h": aiogroupq.Handler(func, batch_size=2)},
            )


def test_batch_failed_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="done"):
        aiogroupq.BatchFailed(done=-1, error=ValueError())
    with pytest.raises(TypeError, match="error"):
        aiogroupq.BatchFailed(done=1, error="nope")  # type: ignore[arg-type]


def test_current_batch_outside_a_batch_handler() -> None:
    with pytest.raises(RuntimeError, match="outside a batch handler"):
        aiogroupq.current_batch()


# -- lost replies, shutdowns and the testing helpers (fix B) -----------------------


async def test_a_top_up_whose_reply_is_lost_abandons_the_batch(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """batch_extend ran (it took members) but its reply was lost: the batch
    is abandoned unstarted, and comes back whole, in order, on lease expiry."""
    ids = await _enqueue(redis_url, 1)
    extend = _scripts.batch_extend
    lost: list[int] = []

    extended: list[str] = []  # the heads topped up after the loss

    async def lossy(*args: Any, **kwargs: Any) -> _scripts.ClaimReply:
        if lost:
            extended.append(args[3].id)
        reply = await extend(*args, **kwargs)
        if reply.tasks and not lost:
            lost.append(len(reply.tasks))
            raise redis.ConnectionError("reply lost")
        return reply

    monkeypatch.setattr(_scripts, "batch_extend", lossy)
    calls: Calls = []
    running: list[int] = []

    async def h(items: list[int]) -> None:
        running.append(1)
        assert len(running) == 1, "overlapping batches"
        calls.append((list(items), [i.attempt for i in aiogroupq.current_batch()]))
        await anyio.sleep(0.05)
        running.pop()

    handler = aiogroupq.Handler(h, batch_size=5, batch_wait=1.5, retry_backoff=0.01)
    async with aiogroupq.Consumer(
        redis_url, queue=QUEUE, handlers={"h": handler}, lease_ttl=1.0
    ):
        await anyio.sleep(0.3)  # the head claimed alone, waiting to fill
        async with aiogroupq.Producer(redis_url, queue=QUEUE) as producer:
            ids += await producer.enqueue_many(
                aiogroupq.Task("h", i, group="g") for i in range(1, 5)
            )
        await _until(lambda: sum(len(c[0]) for c in calls) >= 5)
        await anyio.sleep(0.3)
    assert lost == [4]
    # Each once, in order. The handler did not start before the recovery:
    # the head's attempt was counted by it, as a lost consumer's is.
    assert calls == [([0], [2]), ([1, 2, 3, 4], [1] * 4)]
    assert "abandoned" in caplog.text
    # Recovered, the head runs alone (bx) without waiting to fill.
    assert ids[0] not in extended
    assert [s for s, _ in await _states(redis_url, ids)] == ["succeeded"] * 5
    await _assert_clean(redis_url)


async def test_a_failed_finish_call_keeps_the_line_order(
    redis_url: str, redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's outcomes split over small finish calls, the first failing:
    re-sent ahead of the rest, the members line up in their order."""
    from aiogroupq._work import finisher as _finisher

    monkeypatch.setattr(_finisher, "MAX_OUTCOMES_PER_CALL", 2)
    finish_ = _scripts.finish
    failed: list[list[str]] = []

    async def blip(client: Any, keys: Any, outcomes: Any, **kwargs: Any) -> Any:
        if not failed and any(o.kind == "line" for o in outcomes):
            failed.append([o.kind for o in outcomes])
            raise redis.ConnectionError("blip")
        return await finish_(client, keys, outcomes, **kwargs)

    monkeypatch.setattr(_scripts, "finish", blip)
    await _enqueue(redis_url, 5)
    calls: Calls = []

    def fail(items: list[int], attempts: list[int]) -> None:
        if len(calls) == 1:
            raise aiogroupq.BatchFailed(done=0, error=ValueError("first"))

    async with _consumer(redis_url, _calling(calls, fail), batch_size=5):
        await _until(lambda: len(calls) >= 2)
    assert failed == [["line", "line"]]
    assert calls == [([0, 1, 2, 3, 4], [1] * 5), ([0, 1, 2, 3, 4], [2, 1, 1, 1, 1])]
    await _assert_clean(redis_url)


async def test_shutdown_while_a_batch_fills_hands_it_back_in_order(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    ids = await _enqueue(redis_url, 3)
    calls: Calls = []
    handler = aiogroupq.Handler(_calling(calls), batch_size=5, batch_wait=2.0)
    async with aiogroupq.Consumer(
        redis_url, queue=QUEUE, handlers={"h": handler}, grace_period=0.1
    ):
        await anyio.sleep(0.5)  # claimed with two members, waiting to fill
    assert calls == []
    # Not started: the head back to the front uncounted, its members behind.
    assert await _states(redis_url, ids) == [("queued", 0)] * 3
    await _assert_clean(redis_url)
    async with _consumer(redis_url, _calling(calls), batch_size=5):
        await _until(lambda: len(calls) >= 1)
        await anyio.sleep(0.2)
    assert calls == [([0, 1, 2], [1] * 3)]


async def test_drain_and_journal_see_each_task_of_a_batch(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    import aiogroupq.testing

    ids = await _enqueue(redis_url, 5)
    calls: Calls = []

    async def h(items: list[int]) -> list[int]:
        calls.append((list(items), []))
        return [i * 10 for i in items]

    journal = aiogroupq.testing.Journal()
    handler = aiogroupq.Handler(h, batch_size=5, batch_wait=0.2, store_result=True)
    outcomes = await aiogroupq.testing.drain(
        redis_url, queue=QUEUE, handlers={"h": journal.wrap(handler)}
    )
    assert [c[0] for c in calls] == [[0, 1, 2, 3, 4]]
    assert [(o.id, str(o.state), o.attempts, o.result) for o in outcomes] == [
        (task_id, "succeeded", 1, i * 10) for i, task_id in enumerate(ids)
    ]
    assert journal.started("g") == ids
    aiogroupq.testing.assert_group_order(journal, enqueued=ids)


# -- the scripts' batch rules (lib/batch.lua) ---------------------------------------


async def _typed(client: redis.asyncio.Redis, *ids: str, group: str = "g") -> None:
    """Enqueue *ids* in *group*, typed "t" (the i field a producer writes)."""
    await enqueue(
        client, *(dataclasses.replace(new(i, group), identity="0 0 t") for i in ids)
    )


async def _claim_batch(
    client: redis.asyncio.Redis, size: int, *, consumer: str = "c1", k: int = 1
) -> list[_scripts.Claimed]:
    reply = await _scripts.claim(
        client,
        KEYS,
        consumer,
        k=k,
        lease_ms=600_000,
        scan_limit=10,
        batches=(("t", size),),
    )
    return reply.tasks


async def _state(client: redis.asyncio.Redis, task_id: str) -> str:
    value = await client.hget(KEYS.task(task_id), "s")
    return value.decode() if isinstance(value, bytes) else str(value)


async def test_a_members_lost_lease_leaves_its_running_batch_alone(
    redis_client: redis.asyncio.Redis,
) -> None:
    await _typed(redis_client, "t0", "t1", "t2", "t3")
    head, m1, m2 = await _claim_batch(redis_client, 3)
    await expire_lease(redis_client, m2.id)
    # The head's lease holds: another consumer's claim leaves the batch as
    # it is (recovering t2 would take the head from its live consumer, or
    # put t2 where it could start before t1).
    assert await _claim_batch(redis_client, 3, consumer="c2") == []
    assert [await _state(redis_client, t.id) for t in (head, m1, m2)] == ["running"] * 3
    assert await lrange(redis_client, KEYS.parked("g")) == ["t3"]
    assert await redis_client.zscore(KEYS.leases, m2.id) == 0  # retried later
    await assert_consistent(redis_client)
    # Once the head's lease runs out too, the batch comes back whole, the
    # head first (alone), its members in order before the rest of the line.
    await expire_lease(redis_client, head.id)
    again = await _claim_batch(redis_client, 3, consumer="c2")
    assert [(t.id, t.attempt) for t in again] == [("t0", 2)]
    assert await lrange(redis_client, KEYS.parked("g")) == ["t1", "t2", "t3"]
    await assert_consistent(redis_client)


async def test_recover_keeps_a_member_whose_head_is_kept(
    redis_client: redis.asyncio.Redis,
) -> None:
    await _typed(redis_client, "t0", "t1", "t2", "t3")
    head, m1, m2 = await _claim_batch(redis_client, 3)
    # A lost top-up reply: the consumer knows the head and t1, not t2.
    given, _ = await _scripts.recover(
        redis_client, KEYS, "c1", counted=False, keep=(head.id, m1.id)
    )
    assert given == 0
    assert [await _state(redis_client, t.id) for t in (head, m1, m2)] == ["running"] * 3
    assert m2.id.encode() in await redis_client.smembers(KEYS.inflight("c1"))
    outcomes = (ok(m2), ok(m1), ok(head))
    assert await finish(redis_client, *outcomes) == [FinishCode.APPLIED] * 3
    await assert_consistent(redis_client)


async def test_a_heads_finish_lines_its_members_left_running_in_order(
    redis_client: redis.asyncio.Redis,
) -> None:
    # Ids whose sorted order is not the line's: the batch's order must win.
    await _typed(redis_client, "h", "c", "b", "a", "z")
    head, *members = await _claim_batch(redis_client, 4)
    assert [t.id for t in members] == ["c", "b", "a"]
    # The head's outcome (sent last) finds its members without one.
    assert await finish(redis_client, ok(head)) == [FinishCode.APPLIED]
    # Back in the batch's order: the first runnable, the rest before z.
    assert await lrange(redis_client, KEYS.ready) == ["c"]
    assert await lrange(redis_client, KEYS.parked("g")) == ["b", "a", "z"]
    attempts = [await redis_client.hget(KEYS.task(t.id), "a") for t in members]
    assert attempts == [b"0"] * 3
    assert await redis_client.zcard(KEYS.leases) == 0
    # Their late outcomes are refused: they run again, in order.
    assert await finish(redis_client, ok(members[0])) == [FinishCode.LEASE_LOST]
    await assert_consistent(redis_client)
    nxt = await _scripts.claim(
        redis_client, KEYS, "c1", k=4, lease_ms=600_000, scan_limit=10
    )
    assert [t.id for t in nxt.tasks] == ["c"]


async def test_with_concurrency_above_one_each_task_is_a_batch_of_one(
    redis_client: redis.asyncio.Redis,
) -> None:
    await set_group(redis_client, "g", c=2)
    await _typed(redis_client, "t0", "t1", "t2", "t3")
    tasks = await _claim_batch(redis_client, 3, k=4)
    assert [(t.id, t.member) for t in tasks] == [("t0", False), ("t1", False)]
    extended = await _scripts.batch_extend(
        redis_client, KEYS, "c1", tasks[0], "t", most=2, lease_ms=600_000
    )
    assert extended.tasks == []
    assert await lrange(redis_client, KEYS.parked("g")) == ["t2", "t3"]
    await assert_consistent(redis_client)


@pytest.mark.parametrize("why", ["queue paused", "head cancelled"])
async def test_batch_extend_starts_nothing_when_told_to_stop(
    redis_client: redis.asyncio.Redis, why: str
) -> None:
    await _typed(redis_client, "t0", "t1", "t2")
    (head,) = await _claim_batch(redis_client, 1)
    if why == "queue paused":
        await control(redis_client, "qpause")
    else:
        await _scripts.cancel(redis_client, KEYS, head.id, retention_ms=600_000)
    extended = await _scripts.batch_extend(
        redis_client, KEYS, "c1", head, "t", most=2, lease_ms=600_000
    )
    assert extended.tasks == []
    assert await lrange(redis_client, KEYS.parked("g")) == ["t1", "t2"]


async def test_batch_extend_refuses_more_than_1000(
    redis_client: redis.asyncio.Redis,
) -> None:
    await _typed(redis_client, "t0", "t1")
    (head,) = await _claim_batch(redis_client, 1)
    with pytest.raises(redis.ResponseError, match="malformed arguments"):
        await _scripts.batch_extend(
            redis_client, KEYS, "c1", head, "t", most=1001, lease_ms=600_000
        )


async def test_a_claims_recovery_of_batches_is_bounded(
    redis_client: redis.asyncio.Redis,
) -> None:
    heads: list[_scripts.Claimed] = []
    members: list[str] = []
    for g in ("g0", "g1", "g2"):
        await _typed(redis_client, *(f"{g}-{i:03d}" for i in range(502)), group=g)
        head, *rest = await _claim_batch(redis_client, 501)
        assert len(rest) == 500
        heads.append(head)
        members += [t.id for t in rest]
    # Every lease ran out; the heads' first, so that each id the claim
    # looks at brings a whole batch of 501 back.
    await redis_client.zadd(KEYS.leases, dict.fromkeys(members, 1))
    await redis_client.zadd(KEYS.leases, {h.id: 0 for h in heads})
    await _claim_batch(redis_client, 1, consumer="c2", k=0)
    # Two batches (1,002 tasks) spend the budget of 1,000: the third waits.
    states = [await _state(redis_client, h.id) for h in heads]
    assert states == ["queued", "queued", "running"]
    assert await redis_client.zcard(KEYS.leases) == 501
    await _claim_batch(redis_client, 1, consumer="c2", k=0)
    assert await redis_client.zcard(KEYS.leases) == 0
    await assert_consistent(redis_client)


async def test_an_unreplicated_top_up_ends_the_filling(
    redis_url: str, redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members of a top-up no replica acknowledged go back to the line; the
    batch takes no more (a next top-up could take tasks behind them before
    their hand-back is recorded: slowed down here)."""
    extend, finish_ = _scripts.batch_extend, _scripts.finish
    unacked: list[int] = []

    async def unreplicated(*args: Any, **kwargs: Any) -> _scripts.ClaimReply:
        if unacked:
            return await extend(*args, **kwargs)
        reply = await extend(*args, **{**kwargs, "most": 2})
        if reply.tasks:
            unacked.append(len(reply.tasks))
            reply = dataclasses.replace(reply, replicated=False)
        return reply

    async def slow_lines(client: Any, keys: Any, outcomes: Any, **kwargs: Any) -> Any:
        if any(o.kind == "line" for o in outcomes):
            await anyio.sleep(0.5)
        return await finish_(client, keys, outcomes, **kwargs)

    monkeypatch.setattr(_scripts, "batch_extend", unreplicated)
    monkeypatch.setattr(_scripts, "finish", slow_lines)
    await _enqueue(redis_url, 1)
    calls: Calls = []
    async with _consumer(redis_url, _calling(calls), batch_size=5, batch_wait=1.5):
        await anyio.sleep(0.3)  # the head claimed alone, waiting to fill
        async with aiogroupq.Producer(redis_url, queue=QUEUE) as producer:
            await producer.enqueue_many(
                aiogroupq.Task("h", i, group="g") for i in range(1, 5)
            )
        await _until(lambda: sum(len(c[0]) for c in calls) >= 5)
        await anyio.sleep(0.2)
    assert unacked == [2]
    assert [c[0] for c in calls] == [[0], [1, 2, 3, 4]]
    await _assert_clean(redis_url)
