"""Start estimates (``Admin.estimate``): their accuracy on a steady drain by
consumer processes, when there is none, delayed and rate-limited tasks, bad
input, partitions, and that a queue that never asks pays nothing (no counter
key, no counting).

Actual start times come from the journal: the claim's server time
(``current_task().started_at``) of each task's run, the moment the estimate
is of.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys

from ._journal import Job, Journal, Options, consumer_processes
from ._settle import assert_all_done, producer_states, until_idle

#: liveness only: a drain of these backlogs takes a few seconds
PATIENCE = 60.0
#: how far off an estimate may be and still be of the right model: a factor
#: on the actual wait, either way. A sanity bound, not a timing target: the
#: accuracy is a figure (printed here; docs/operating.md has it, a few per cent
#: on a quiet machine), and a shared test machine's load changes a drain's
#: pace between an estimate and the start it foresees. A model that leaves
#: out a group's pace or the rate is off by far more.
FACTOR = 4.0
#: each handler's run in the steady drains
SLEEP_MS = 25


async def _enqueue(
    producer: aiogroupq.Producer, jobs: Sequence[Job], **kwargs: object
) -> list[str]:
    tasks = [
        aiogroupq.Task("work", job, group=job.group, **kwargs)  # type: ignore[arg-type]
        for job in jobs
    ]
    ids: list[str] = []
    for start in range(0, len(tasks), 500):
        ids += await producer.enqueue_many(tasks[start : start + 500])
    return ids


async def _first_estimate(
    admin: aiogroupq.Admin, task_id: str, *, span: float = 0.0
) -> aiogroupq.StartEstimate:
    """Poll until the counter has samples over *span* s at least (liveness:
    PATIENCE)."""
    with anyio.fail_after(PATIENCE):
        while True:
            found = await admin.estimate(task_id)
            if found is not None and found.span >= span:
                return found
            await anyio.sleep(0.05)


async def _started(journal: Journal) -> dict[str, float]:
    """Task id -> the claim time of its first run (server seconds)."""
    out: dict[str, float] = {}
    for entry in await journal.entries():
        if entry.event == "start" and entry.task_id not in out:
            out[entry.task_id] = entry.started_ms / 1000
    return out


def _assert_within(
    estimates: Sequence[aiogroupq.StartEstimate], started: dict[str, float]
) -> None:
    """Each estimate's time-to-start within FACTOR of the actual wait."""
    for e in estimates:
        ratio = (e.starts_at - e.now) / (started[e.task_id] - e.now)
        assert 1 / FACTOR <= ratio <= FACTOR, (ratio, e)


def _errors(
    estimates: Sequence[aiogroupq.StartEstimate], started: dict[str, float]
) -> list[float]:
    """Each estimate's relative error on the time it waited."""
    out = []
    for e in estimates:
        actual = started[e.task_id] - e.now
        out.append(abs((e.starts_at - e.now) - actual) / actual)
    return out


def _report(
    label: str,
    estimates: Sequence[aiogroupq.StartEstimate],
    errors: Sequence[float],
    started: dict[str, float],
) -> None:
    worst = max(range(len(errors)), key=lambda i: errors[i])
    w = estimates[worst]
    print(  # noqa: T201 - the figures this test measured
        f"{label}: {len(errors)} estimates, median error "
        f"{statistics.median(errors):.1%}, worst {errors[worst]:.1%} "
        f"(estimated {w.starts_at - w.now:.2f}s, took "
        f"{started[w.task_id] - w.now:.2f}s; {w.basis})"
    )


@pytest.mark.slow
async def test_estimates_of_a_steady_drain_are_within_a_quarter(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "est-drain"
    journal = Journal(redis_client)
    # A long group (concurrency 1) among many ungrouped tasks. The handlers'
    # sleep sets the pace, not the CPU (which a loaded test machine shares).
    ungrouped = [Job(n=i, group=None, seq=0, sleep_ms=SLEEP_MS) for i in range(1600)]
    grouped = [
        Job(n=10_000 + s, group="long", seq=s, sleep_ms=SLEEP_MS) for s in range(160)
    ]
    jobs = [*grouped[:1], *ungrouped, *grouped[1:]]
    async with (
        aiogroupq.Producer(redis_url, queue=queue) as producer,
        aiogroupq.Admin(redis_url, queue=queue) as admin,
    ):
        ids = await _enqueue(producer, jobs)
        by_n = dict(zip((j.n for j in jobs), ids, strict=True))
        assert await admin.estimate(by_n[0]) is None  # switched on: no samples yet
        async with consumer_processes(redis_url, queue, processes=2, concurrency=4):
            await _first_estimate(admin, by_n[1599])
            estimates = []
            for n in [*range(1599, 800, -50), *range(10_159, 10_100, -5)]:
                found = await admin.estimate(by_n[n])
                assert found is not None, n
                assert found.position >= 100, found
                estimates.append(found)
            await assert_all_done(redis_url, queue, journal, (j.n for j in jobs))
    started = await _started(journal)
    for kind, chosen in (
        ("ready line", [e for e in estimates if not e.group_limited]),
        ("group line", [e for e in estimates if e.group_limited]),
    ):
        if chosen:
            _report(kind, chosen, _errors(chosen, started), started)
    errors = _errors(estimates, started)
    _report("all", estimates, errors, started)
    _assert_within(estimates, started)


# -- when there is none ------------------------------------------------------------


@asynccontextmanager
async def _consuming(
    redis_url: str,
    queue: str,
    *,
    sleep: float,
    concurrency: int = 2,
    more: Mapping[str, Callable[[Any], Awaitable[None]]] | None = None,
    **kwargs: Any,
) -> AsyncIterator[aiogroupq.Consumer]:
    """An in-process consumer whose handler sleeps *sleep* s (a steady pace),
    with *more* handlers beside it."""

    async def work(payload: object) -> None:
        await anyio.sleep(sleep)

    async with aiogroupq.Consumer(
        redis_url,
        queue=queue,
        handlers={"work": work, **(more or {})},
        concurrency=concurrency,
        grace_period=0.5,
        **kwargs,
    ) as consumer:
        yield consumer


async def test_none_before_samples_and_for_tasks_that_do_not_wait(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "est-none"
    keys = QueueKeys(queue)
    release = anyio.Event()

    async def hold(payload: object) -> None:
        await release.wait()

    async with (
        aiogroupq.Producer(redis_url, queue=queue) as producer,
        aiogroupq.Admin(redis_url, queue=queue) as admin,
    ):
        waiting = await producer.enqueue_many(
            [aiogroupq.Task("work", i) for i in range(400)]
        )
        # The first estimate asked switches the counter on: none yet.
        assert await redis_client.hget(keys.conf, "est") is None
        assert await admin.estimate(waiting[-1]) is None
        assert await redis_client.hget(keys.conf, "est") == b"1"
        assert await admin.estimate("0" * 28) is None  # unknown
        # One consumer for both types: a consumer without the "hold" handler
        # would dead-letter the held task if it claimed it.
        more = {"hold": hold}
        async with _consuming(redis_url, queue, sleep=0.02, concurrency=2, more=more):
            found = await _first_estimate(admin, waiting[-1])
            assert found.samples > 0
            assert found.span >= 0.5
            assert found.rate_per_s == found.queue_rate_per_s > 0
            assert not found.group_limited
            held = await producer.enqueue("hold", None)
            with anyio.fail_after(PATIENCE):
                while await producer.status(held) != "running":
                    await anyio.sleep(0.02)
            assert await admin.estimate(held) is None  # running
            release.set()
            with anyio.fail_after(PATIENCE):
                while await producer.status(held) != "succeeded":
                    await anyio.sleep(0.02)
            assert await admin.estimate(held) is None  # ended
    problems = await aiogroupq.check_queue(redis_url, queue)
    assert problems == [], problems


async def test_bad_input_is_a_typed_error_and_writes_nothing(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "est-bad"
    async with (
        aiogroupq.Producer(redis_url, queue=queue) as producer,
        aiogroupq.Admin(redis_url, queue=queue) as admin,
    ):
        await producer.enqueue("work", 1)
        for bad in (None, 123, b"abc", ""):
            with pytest.raises(aiogroupq.InvalidTaskError):
                await admin.estimate(bad)  # type: ignore[arg-type]
    assert await redis_client.hget(QueueKeys(queue).conf, "est") is None


async def test_a_queue_that_never_asks_keeps_no_counter(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "est-never"
    keys = QueueKeys(queue)
    async with aiogroupq.Producer(redis_url, queue=queue) as producer:
        ids = await producer.enqueue_many(
            [
                aiogroupq.Task("work", i, group=f"g{i % 3}" if i % 2 else None)
                for i in range(300)
            ]
        )
        async with _consuming(redis_url, queue, sleep=0.0, concurrency=8):
            await until_idle(redis_url, queue)
    states = await producer_states(redis_url, queue, ids)
    assert states == {"succeeded": len(ids)}, states
    assert await redis_client.exists(keys.starts) == 0
    assert await redis_client.hget(keys.conf, "est") is None


# -- delays, rates, partitions -----------------------------------------------------


async def test_a_delayed_task_is_not_estimated_before_its_due_time(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "est-delay"
    async with (
        aiogroupq.Producer(redis_url, queue=queue) as producer,
        aiogroupq.Admin(redis_url, queue=queue) as admin,
    ):
        # About 3 s of work at this pace: drained before the delayed tasks
        # are due, so that only their due time holds them back.
        backlog = await producer.enqueue_many(
            [aiogroupq.Task("work", i) for i in range(1000)]
        )
        await admin.estimate(backlog[-1])  # switched on
        async with _consuming(redis_url, queue, sleep=0.01, concurrency=4):
            await _first_estimate(admin, backlog[-1])
            late = await producer.enqueue("work", "late", delay=6.0)
            grouped = await producer.enqueue("work", "g", group="g", delay=6.0)
            for task_id in (late, grouped):
                due = (await admin.task(task_id)).due_at
                found = await admin.estimate(task_id)
                assert due is not None
                assert found is not None
                assert found.starts_at >= due, (found, due)
                # Once due, each joins the tail: behind what is left of the
                # ready line then (the group's is free: it goes there too).
                assert found.position < len(backlog)
            with anyio.fail_after(PATIENCE):
                while await producer.status(grouped) != "succeeded":
                    await anyio.sleep(0.05)


@pytest.mark.slow
async def test_a_rate_limited_group_is_estimated_at_its_rate(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "est-rate"
    journal = Journal(redis_client)
    limit = 25  # starts per second: well below what its slot would do
    slow = [Job(n=10_000 + s, group="slow", seq=s, sleep_ms=5) for s in range(160)]
    others = [Job(n=i, group=None, seq=0, sleep_ms=10) for i in range(800)]
    async with (
        aiogroupq.Producer(redis_url, queue=queue) as producer,
        aiogroupq.Admin(redis_url, queue=queue) as admin,
    ):
        await admin.set_group("slow", concurrency=1, rate=aiogroupq.Rate(limit, 1.0))
        ids = await _enqueue(producer, [*slow, *others])
        by_n = dict(zip((j.n for j in [*slow, *others]), ids, strict=True))
        assert await admin.estimate(by_n[10_159]) is None
        async with consumer_processes(redis_url, queue, processes=2, concurrency=4):
            await _first_estimate(admin, by_n[10_159])
            estimates = []
            for seq in range(159, 100, -10):
                found = await admin.estimate(by_n[10_000 + seq])
                assert found is not None
                assert found.group_limited, found
                # Bounded by the rate: at most *limit* of its group start per
                # second, so the tasks before it take that long at least.
                assert found.wait >= (found.position - limit) / limit, found
                estimates.append(found)
            await assert_all_done(
                redis_url, queue, journal, (j.n for j in [*slow, *others])
            )
    started = await _started(journal)
    errors = _errors(estimates, started)
    _report("rate-limited group", estimates, errors, started)
    _assert_within(estimates, started)


@pytest.mark.slow
async def test_a_partitioned_queue_is_estimated_per_partition(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "est-parts"
    journal = Journal(redis_client)
    ungrouped = [Job(n=i, group=None, seq=0, sleep_ms=SLEEP_MS) for i in range(2000)]
    grouped = [
        Job(n=10_000 + s, group="long", seq=s, sleep_ms=SLEEP_MS) for s in range(160)
    ]
    jobs = [*grouped[:1], *ungrouped, *grouped[1:]]
    async with (
        aiogroupq.Producer(redis_url, queue=queue, partitions=4) as producer,
        aiogroupq.Admin(redis_url, queue=queue) as admin,
    ):
        ids = await _enqueue(producer, jobs)
        by_n = dict(zip((j.n for j in jobs), ids, strict=True))
        assert await admin.estimate(by_n[0]) is None
        for p in range(4):  # switched on everywhere
            assert await redis_client.hget(QueueKeys(queue, p).conf, "est") == b"1"
        async with consumer_processes(
            redis_url, queue, processes=2, concurrency=4, options=Options(partitions=4)
        ):
            await _first_estimate(admin, by_n[1999], span=2.0)
            estimates = []
            for n in [*range(1999, 1200, -100), *range(10_159, 10_100, -10)]:
                found = await admin.estimate(by_n[n])
                assert found is not None, n
                assert found.position >= 100, found
                # Its own partition's rate, beside the queue's (the sum).
                assert found.queue_rate_per_s > found.rate_per_s > 0
                estimates.append(found)
            await assert_all_done(redis_url, queue, journal, (j.n for j in jobs))
    for p in range(4):  # each partition counted its own starts
        assert await redis_client.exists(QueueKeys(queue, p).starts) == 1
    started = await _started(journal)
    errors = _errors(estimates, started)
    _report("4 partitions", estimates, errors, started)
    _assert_within(estimates, started)
    problems = await aiogroupq.check_queue(redis_url, queue)
    assert problems == [], problems


# -- the check, the repair, the pages -------------------------------------------


async def test_the_check_knows_the_counter_and_the_repair_drops_a_damaged_one(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "est-check"
    keys = QueueKeys(queue)
    async with (
        aiogroupq.Producer(redis_url, queue=queue) as producer,
        aiogroupq.Admin(redis_url, queue=queue) as admin,
    ):
        ids = await producer.enqueue_many(
            [
                aiogroupq.Task("work", i, group="g" if i % 2 else None)
                for i in range(600)
            ]
        )
        await admin.estimate(ids[-1])
        async with _consuming(redis_url, queue, sleep=0.005, concurrency=4):
            await _first_estimate(admin, ids[-1])
            assert await redis_client.type(keys.starts) == b"hash"
            # A claim never fails on a damaged counter: a field that is not
            # a number, then a key of another type.
            (now_s, _) = await redis_client.time()
            await redis_client.hset(keys.starts, str(now_s + 1), "junk")
            await anyio.sleep(1.2)
            await redis_client.delete(keys.starts)
            await redis_client.set(keys.starts, "damage")
            assert await admin.estimate(ids[-1]) is None  # damaged: none
            with anyio.fail_after(PATIENCE):
                while await producer.status(ids[-1]) != "succeeded":
                    await anyio.sleep(0.05)
    problems = await aiogroupq.check_queue(redis_url, queue)
    assert [(p.kind, p.key) for p in problems] == [("wrong-type", keys.starts)]
    repairs = await aiogroupq.repair_queue(redis_url, queue)
    assert [r.step for r in repairs] == ["drop"], repairs
    assert await redis_client.exists(keys.starts) == 0
    assert await aiogroupq.check_queue(redis_url, queue) == []


async def test_the_task_command_and_page_show_the_estimate(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    from aiogroupq.dashboard import create_app

    from ._web import serving
    from .test_cli_ops import cli, value
    from .test_dashboard import browser, text

    queue = "est-pages"
    async with (
        aiogroupq.Producer(redis_url, queue=queue) as producer,
        aiogroupq.Admin(redis_url, queue=queue) as admin,
    ):
        ids = []
        for start in range(0, 3000, 1000):
            ids += await producer.enqueue_many(
                [aiogroupq.Task("work", i) for i in range(start, start + 1000)]
            )
        last = ids[-1]
        run = await cli("task", last, url=redis_url, queue=queue)
        assert run.code == 0
        # The page only reads: the counter stays off until asked for.
        assert "expected start:  estimates are off for this queue" in run.out
        assert await redis_client.hget(f"{{aiogroupq:{queue}}}:conf", "est") is None
        async with _consuming(redis_url, queue, sleep=0.02, concurrency=4):
            await _first_estimate(admin, last)
            run = await cli("task", last, url=redis_url, queue=queue)
            assert run.code == 0
            assert value(run.out, "expected start") == "in"
            assert "ahead in the ready line at" in run.out
            run = await cli("task", last, "--json", url=redis_url, queue=queue)
            data = run.json()
            assert data["state"] == "queued"
            assert data["estimate"]["task_id"] == last
            assert data["estimate"]["position"] > 0
            assert data["estimate"]["starts_at"] > data["now"]
            with serving(create_app(redis_url, queues=[queue])) as url:
                async with browser(url) as client:
                    page = await client.get(f"/q/{queue}/task", params={"id": last})
                    assert page.status_code == 200
                    shown = text(page.text)
                    assert "expected start" in shown
                    assert "ahead in the ready line" in shown
        # An ended task has none, and none is asked.
        run = await cli("task", ids[0], "--json", url=redis_url, queue=queue)
        assert "estimate" not in run.json()


async def test_the_estimate_runs_under_the_documented_view_rule(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    from .test_acl import QUEUE, _rule, documented_view_rule

    user = f"aiogroupq-estimate-{os.getpid()}"
    extra = sorted(f"+{c}" for c in documented_view_rule())
    execute: Any = redis_client.execute_command
    await execute("ACL", "SETUSER", user, *_rule(QUEUE), *extra)
    viewer = redis_url.replace("redis://", f"redis://{user}:worker-pw@")
    try:
        async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
            first = await producer.enqueue("work", 1, group="g")
            second = await producer.enqueue("work", 2, group="g")
        async with aiogroupq.Admin(viewer, queue=QUEUE) as admin:
            assert await admin.estimate(second) is None  # switched on, no samples
            assert await admin.estimate(first) is None
        assert await redis_client.hget(QueueKeys(QUEUE).conf, "est") == b"1"
    finally:
        await redis_client.acl_deluser(user)


async def test_the_ready_place_counts_higher_priorities_first(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "est-prio"
    keys = QueueKeys(queue)
    async with aiogroupq.Producer(redis_url, queue=queue) as producer:
        plain = [await producer.enqueue("work", i) for i in range(3)]
        # From the first priority on, every runnable task goes to pready.
        high = [await producer.enqueue("work", i, priority=5) for i in range(2)]
        low = [await producer.enqueue("work", i) for i in range(3)]
    assert await redis_client.zcard(keys.pready) == 5

    async def place(task_id: str) -> int:
        reply = await _scripts.estimate_facts(
            redis_client, keys, task_id, bound=100, window=30
        )
        return int(reply[7][4])

    # The list from before priorities came into use goes after the higher
    # levels and before pready's level 0 (lib/ready.lua's pop_ready).
    assert [await place(i) for i in high] == [0, 1]
    assert [await place(i) for i in plain] == [2, 3, 4]
    assert [await place(i) for i in low] == [5, 6, 7]


async def test_an_estimate_asked_without_counting_leaves_the_counter_off(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "est-read-only"
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        task_id = await producer.enqueue("work", 1)
        assert await admin.estimate(task_id, start_counting=False) is None
        assert await redis_client.hget(f"{{aiogroupq:{queue}}}:conf", "est") is None
        with pytest.raises(aiogroupq.ConfigurationError, match="start_counting"):
            await admin.estimate(task_id, start_counting="yes")  # type: ignore[arg-type]
        assert await admin.estimate(task_id) is None  # switched on: no samples yet
        assert await redis_client.hget(f"{{aiogroupq:{queue}}}:conf", "est") is not None


async def test_leftovers_of_an_old_busy_spell_go_and_the_windows_samples_stay(
    redis_client: redis.asyncio.Redis,
) -> None:
    """A counter holding more than its window (seconds of a busy spell
    before an idle gap, beyond what a new second's cleanup drops): a claim
    drops those only, never the samples of the window estimates read."""
    queue = "est-leftovers"
    keys = QueueKeys(queue)
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        task_id = await producer.enqueue("work", 1)
        assert await admin.estimate(task_id) is None  # switches the counter on
        (now_s, _) = await redis_client.time()
        window = {str(now_s - i): str(i) for i in range(2, 11)}
        old = {str(now_s - i): "7" for i in range(100, 131)}
        planted: dict[Any, Any] = {**window, **old, "junk": "1"}
        await redis_client.hset(keys.starts, mapping=planted)

        reply = await _scripts.claim(
            redis_client, keys, "c1", k=1, lease_ms=60_000, scan_limit=50
        )
        assert [t.id for t in reply.tasks] == [task_id]

        raw: Any = await redis_client.hgetall(keys.starts)
        left = {k.decode(): v.decode() for k, v in raw.items()}
        assert {k: left[k] for k in window} == window
        [(second, count)] = [(k, v) for k, v in left.items() if k not in window]
        assert int(second) >= now_s
        assert count == "1"


# -- the counter counts tasks, not claims -------------------------------------------


async def _counted(client: redis.asyncio.Redis, keys: QueueKeys) -> int:
    """The starts the counter holds, over all its seconds."""
    raw: Any = await client.hgetall(keys.starts)
    return sum(int(v) for v in raw.values())


async def test_the_counter_counts_each_task_a_claim_starts(
    redis_client: redis.asyncio.Redis,
) -> None:
    """Claims of many tasks at once (a consumer with free slots and fast
    handlers claims up to its free slots in one call): the counter adds the
    tasks each claim started, not one per claim. A claim of one task at a
    time, which slow handlers on few slots make, cannot tell the two apart."""
    queue = "est-per-task"
    keys = QueueKeys(queue)
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        ids = await producer.enqueue_many(
            [aiogroupq.Task("work", i) for i in range(60)]
        )
        assert await admin.estimate(ids[-1]) is None  # switches the counter on
        started = 0
        for k in (1, 7, 16, 36):
            reply = await _scripts.claim(
                redis_client, keys, "c1", k=k, lease_ms=60_000, scan_limit=100
            )
            assert len(reply.tasks) == k, reply  # the precondition: k claimed
            started += k
            counted = await _counted(redis_client, keys)
            assert counted == started, (
                f"starts counted {counted} for {started} tasks started "
                f"(claims of {k} at once)"
            )


async def test_a_batch_claim_counts_its_members_as_starts(
    redis_client: redis.asyncio.Redis,
) -> None:
    """A batch handler's claim starts its head and the members that join it
    (their attempts run): the counter counts each of them, as ``started``
    does, or a batched queue's estimates come out batch-size times late."""
    queue = "est-batch"
    keys = QueueKeys(queue)
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        ids = await producer.enqueue_many(
            [aiogroupq.Task("work", i, group="g") for i in range(8)]
        )
        assert await admin.estimate(ids[-1]) is None  # switches the counter on
        reply = await _scripts.claim(
            redis_client,
            keys,
            "c1",
            k=1,
            lease_ms=60_000,
            scan_limit=100,
            batches=[("work", 5)],
        )
        assert [t.member for t in reply.tasks] == [False] + [True] * 4, reply
        stats: Any = await redis_client.hgetall(keys.stats)
        assert int(stats[b"started"]) == 5
        counted = await _counted(redis_client, keys)
        assert counted == 5, f"starts counted {counted} for 5 tasks started (a batch)"


async def test_a_busy_drain_counts_every_start(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    """End to end: no-op handlers on 32 slots claim many tasks per call; the
    counter's total is the number of tasks run."""
    queue = "est-busy"
    keys = QueueKeys(queue)
    n = 1500
    ran = 0
    claims = 0

    async def work(payload: object) -> None:
        nonlocal ran
        ran += 1

    claim = _scripts.claim

    async def counting_claim(*args: Any, **kwargs: Any) -> _scripts.ClaimReply:
        nonlocal claims
        reply = await claim(*args, **kwargs)
        claims += bool(reply.tasks)
        return reply

    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        ids: list[str] = []
        for start in range(0, n, 500):
            ids += await producer.enqueue_many(
                [aiogroupq.Task("work", i) for i in range(start, start + 500)]
            )
        assert await admin.estimate(ids[-1]) is None  # switches the counter on
        (first_s, _) = await redis_client.time()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_scripts, "claim", counting_claim)
            async with aiogroupq.Consumer(
                redis_client, queue=queue, handlers={"work": work}, concurrency=32
            ):
                await until_idle(redis_url, queue)
        (last_s, _) = await redis_client.time()
    assert ran == n, f"{ran} of {n} tasks ran though the queue is idle"
    # Preconditions: claims took many tasks at once, and the whole drain
    # lies in the counter's 30 s window (a liveness bound: seconds here).
    assert claims < n / 2, f"{claims} claims for {n} tasks: mostly one at a time"
    assert last_s - first_s < 30, f"the drain took {last_s - first_s} s"
    counted = await _counted(redis_client, keys)
    assert counted == n, f"starts counted {counted} for {n} tasks started"
