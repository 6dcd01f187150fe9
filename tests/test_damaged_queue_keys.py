"""A queue-level key of the wrong type (``ready`` holding a string, say),
met by a running consumer: it stays up, logs one ERROR naming the key and
the repair, claims nothing, keeps its finished outcomes, and resumes by
itself once ``aiogroupq check --repair`` (:func:`aiogroupq.repair_queue`)
repaired the key, every task run exactly once. A consumer starting on such
a queue refuses. And the claim's own reports of damage: the tasks it
dead-letters, and a task whose group field was changed under its group."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._check import check as _fsck, problems as problem_kinds
from aiogroupq._store import scripts as _scripts

from . import _damage
from ._journal import Job, Journal, check, make_handlers

QUEUE: Final = _damage.QUEUE
KEYS: Final = _damage.KEYS
#: the queue-level keys every claim checks before it writes
FIXED: Final = (
    "fence",
    "ready",
    "delayed",
    "leases",
    "dead",
    "wake",
    "stats",
    "backlog",
    "waiting",
    "conf",
)
GROUPS: Final = 6
PER_GROUP: Final = 5
UNGROUPED: Final = 6
#: each handler's run: long enough that some finish while the key is damaged
SLEEP_MS: Final = 200
#: the key is damaged while a handler that started at most this long ago
#: runs, so some run on into the damage however loaded the machine is
FRESH_MS: Final = 60
#: how long the key stays damaged
DAMAGED_FOR: Final = 1.0
#: consumers sharing the queue (each of its own name, as separate processes)
CONSUMERS: Final = 2


class Running:
    """A consumer run in the background; ``ended`` once its block is left,
    whatever the reason."""

    def __init__(self) -> None:
        self.ended = anyio.Event()
        self.error: BaseException | None = None


@asynccontextmanager
async def consumers(
    client: redis.asyncio.Redis, journal: Journal
) -> AsyncIterator[list[Running]]:
    """:data:`CONSUMERS` consumers running in the background."""
    runs, stop = [Running() for _ in range(CONSUMERS)], anyio.Event()

    async def body(run: Running) -> None:
        try:
            async with aiogroupq.Consumer(
                client,
                queue=QUEUE,
                handlers=make_handlers(journal),
                concurrency=4,
                lease_ttl=6.0,
                grace_period=5.0,
            ):
                await stop.wait()
        except BaseException as exc:
            run.error = exc
            raise
        finally:
            run.ended.set()

    async with anyio.create_task_group() as tg:
        for run in runs:
            tg.start_soon(body, run)
        yield runs
        stop.set()


async def mid_run(client: redis.asyncio.Redis, journal: Journal, done: int) -> None:
    """Wait until *done* handlers returned and one that started less than
    :data:`FRESH_MS` ago is still running."""
    # Handlers start in waves; waiting for a count of done tasks alone can
    # land between two waves, when nothing runs (under load, the next claim
    # comes after the damage and no handler finishes while it lasts).
    while True:
        entries = await journal.entries()
        ended = {(e.task_id, e.attempt) for e in entries if e.event == "end"}
        seconds, micros = await client.time()
        now_ms = seconds * 1000 + micros // 1000
        fresh = any(
            e.event == "start"
            and (e.task_id, e.attempt) not in ended
            and now_ms - e.started_ms < FRESH_MS
            for e in entries
        )
        if fresh and len(ended) >= done:
            return
        await anyio.sleep(0.005)


def damage_lines(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR
        and key in r.getMessage()
        and "check --repair" in r.getMessage()
    ]


@pytest.mark.parametrize("name", FIXED)
async def test_a_running_consumer_outlives_a_damaged_queue_key(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    caplog.set_level(logging.WARNING, logger="aiogroupq")
    key = KEYS.prefix + name
    journal = Journal(redis_client)
    expected: dict[int, Job] = {}
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        tasks = []
        for seq in range(PER_GROUP):
            for g in range(GROUPS):
                job = Job(len(expected), f"g{g}", seq, sleep_ms=SLEEP_MS)
                expected[job.n] = job
                tasks.append(aiogroupq.Task("work", job, group=job.group))
        for _ in range(UNGROUPED):
            job = Job(len(expected), None, 0, sleep_ms=SLEEP_MS)
            expected[job.n] = job
            tasks.append(aiogroupq.Task("work", job))
        ids = await producer.enqueue_many(tasks)
        async with consumers(redis_client, journal) as runs:
            with anyio.fail_after(30):
                await mid_run(redis_client, journal, 4)
            await _damage.wrong_type(name)(_damage.Queue(redis_client))
            damaged_at = time.monotonic()
            done_before = await journal.done_count()
            # Damaged for at least DAMAGED_FOR, and until the consumers met
            # it and a running handler finished, however slow the machine.
            with anyio.fail_after(30):
                while True:
                    done_while = await journal.done_count() - done_before
                    if (
                        time.monotonic() - damaged_at >= DAMAGED_FOR
                        and done_while >= 1
                        and damage_lines(caplog, key)
                    ):
                        break
                    await anyio.sleep(0.05)
            assert [r.error for r in runs if r.ended.is_set()] == []
            # One line for the key from each consumer, though each of its
            # loops met it (then one a minute at most).
            assert 1 <= len(damage_lines(caplog, key)) <= CONSUMERS, caplog.text
            # Handlers that were running finished meanwhile; their outcomes
            # wait (fence: the finish does not read it, so they went through).
            assert done_while >= 1
            unrecorded = sum(
                1
                for status in await producer.status_many(ids)
                if status is aiogroupq.TaskState.RUNNING
            )
            repaired = await aiogroupq.repair_queue(redis_client, QUEUE)
            repaired_at = time.monotonic()
            assert repaired  # the key dropped or rebuilt
            with anyio.fail_after(30):
                await journal.wait_done(len(expected))
            drained_at = time.monotonic()
            assert [r.error for r in runs if r.ended.is_set()] == []
        assert [r.error for r in runs] == [None] * CONSUMERS
        states = await producer.status_many(ids)
    figures = check(await journal.entries(), expected)
    print(  # noqa: T201 - the figures this test reports
        f"\n{name}: damaged {repaired_at - damaged_at:.2f} s, {done_while} "
        f"handlers finished meanwhile ({unrecorded} tasks still 'running' "
        f"before the repair), drained {drained_at - repaired_at:.2f} s after "
        f"it; {figures.starts} starts of {figures.tasks} tasks"
    )
    assert figures.started_more_than_once == 0, figures
    assert figures.never_run == 0, figures
    assert figures.unfinished == figures.failed_runs == 0, figures
    assert figures.order_violations == figures.overlaps == 0, figures
    assert set(states) == {aiogroupq.TaskState.SUCCEEDED}, states
    assert (await _fsck.examine(redis_client, KEYS)).problems == []


@pytest.mark.parametrize("name", FIXED)
async def test_a_consumer_refuses_to_start_on_a_damaged_queue_key(
    redis_client: redis.asyncio.Redis, name: str
) -> None:
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue("work", Job(0, "g", 0), group="g")
    await _damage.wrong_type(name)(_damage.Queue(redis_client))
    consumer = aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers=make_handlers(Journal(redis_client))
    )
    with pytest.raises(aiogroupq.CorruptQueueError) as caught:
        async with consumer:
            pass
    assert caught.value.key == KEYS.prefix + name
    assert "check --repair" in str(caught.value)
    # It let go of its name: once repaired, the same consumer starts.
    await aiogroupq.repair_queue(redis_client, QUEUE)
    async with consumer:
        pass


async def test_each_task_a_claim_dead_letters_is_logged_with_its_reason(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="aiogroupq")
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = [await producer.enqueue("work", Job(n, None, 0)) for n in range(3)]
        # What a live task needs, gone: the claim dead-letters it.
        await redis_client.hdel(KEYS.task(ids[1]), "m")
        await redis_client.hdel(KEYS.task(ids[2]), "e")
        journal = Journal(redis_client)
        async with aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers=make_handlers(journal)
        ):
            with anyio.fail_after(30):
                await journal.wait_done(1)
                while await producer.status(ids[2]) is not aiogroupq.TaskState.DEAD:
                    await anyio.sleep(0.01)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    for task_id in ids[1:]:
        line = [m for m in lines if task_id in m and "dead-lettered" in m]
        assert line, lines
        assert "Corrupt: the task hash lacks fields" in line[0], line


async def test_a_claim_names_a_task_whose_group_field_was_changed(
    redis_client: redis.asyncio.Redis,
) -> None:
    q = _damage.Queue(redis_client)
    await q.enqueue(_damage.new("a1", "g"), _damage.new("a2", "g"))
    # a1, the head of g holding g's slot, now says it is of group h.
    await redis_client.hset(KEYS.task("a1"), "g", "h")
    reply = await _scripts.claim(
        redis_client, KEYS, "c1", k=4, lease_ms=60_000, scan_limit=10
    )
    problem = [p for p in reply.problems if "a1" in p]
    assert problem, reply
    assert "group g " in problem[0], problem
    assert "group field says h" in problem[0], problem
    # The check sees g waiting on a slot nobody holds, and the repair frees it.
    found = (await _fsck.examine(redis_client, KEYS)).problems
    assert problem_kinds.STRAY_SLOT in {p.kind for p in found}, found
    await aiogroupq.repair_queue(redis_client, QUEUE)
    reply = await _scripts.claim(
        redis_client, KEYS, "c1", k=4, lease_ms=60_000, scan_limit=10
    )
    assert [t.id for t in reply.tasks] == ["a2"]


async def test_a_consumer_logs_a_task_whose_group_field_was_changed(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="aiogroupq")
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        first = await producer.enqueue("work", Job(0, "g", 0), group="g")
        await producer.enqueue("work", Job(1, "g", 1), group="g")
        await redis_client.hset(KEYS.task(first), "g", "h")
        journal = Journal(redis_client)
        async with aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers=make_handlers(journal)
        ):
            with anyio.fail_after(30):
                await journal.wait_done(1)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    line = [m for m in lines if first in m]
    assert line, lines
    assert "group g " in line[0], line
    assert "check --repair" in line[0], line


async def test_a_repaired_lease_stays_with_its_live_holder(
    redis_client: redis.asyncio.Redis,
) -> None:
    # The repair of a damaged leases key gives a running task a lease of its
    # holder's length: a consumer that never met the damage (idle, blocked
    # on the wake list) must not recover it while its holder still runs it.
    release = anyio.Event()
    starts: list[str] = []

    async def hold(tag: str) -> None:
        starts.append(tag)
        if tag == "held":
            await release.wait()

    handlers = {"t": hold}
    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers=handlers, concurrency=1, lease_ttl=10
        ),
    ):
        held = await producer.enqueue("t", "held", group="g")
        with anyio.fail_after(30):
            while starts != ["held"]:
                await anyio.sleep(0.01)
        async with aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers=handlers, concurrency=1
        ):
            await anyio.sleep(0.2)  # the second one is idle, blocked on wake
            await _damage._replace(redis_client, KEYS.leases, "zset")
            assert await aiogroupq.repair_queue(redis_client, QUEUE)
            # Wake the idle one: its claim would recover an expired lease.
            await producer.enqueue("t", "other", group="h")
            with anyio.fail_after(30):
                while "other" not in starts:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.5)
            print(f"runs while the holder still ran: {starts}")  # noqa: T201
            assert starts.count("held") == 1
            release.set()
            with anyio.fail_after(30):
                while await producer.status(held) is not aiogroupq.TaskState.SUCCEEDED:
                    await anyio.sleep(0.02)
    assert starts.count("held") == 1
