"""A task's life after enqueue: run_at, cancel, results, dead letters and the
halt policy, per-type handler options."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import TaskState

QUEUE = "life"


@asynccontextmanager
async def consuming(
    client: redis.asyncio.Redis,
    handlers: dict[str, Any],
    **options: Any,
) -> AsyncIterator[aiogroupq.Consumer]:
    options.setdefault("retry_backoff", 0.01)
    async with aiogroupq.Consumer(
        client, queue=QUEUE, handlers=handlers, **options
    ) as consumer:
        yield consumer


async def wait_for(predicate: Callable[[], Awaitable[bool]], limit: float = 10) -> None:
    with anyio.fail_after(limit):
        while not await predicate():
            await anyio.sleep(0.01)


@pytest.fixture
async def producer(
    redis_client: redis.asyncio.Redis,
) -> AsyncIterator[aiogroupq.Producer]:
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as p:
        yield p


@pytest.fixture
async def admin(redis_client: redis.asyncio.Redis) -> AsyncIterator[aiogroupq.Admin]:
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as a:
        yield a


async def test_run_at_is_validated_and_delays(
    producer: aiogroupq.Producer, redis_client: redis.asyncio.Redis
) -> None:
    with pytest.raises(aiogroupq.InvalidTaskError, match="no timezone"):
        await producer.enqueue("h", run_at=datetime.now() + timedelta(seconds=5))
    with pytest.raises(aiogroupq.InvalidTaskError, match="in the past"):
        await producer.enqueue("h", run_at=datetime.now(UTC) - timedelta(1))
    with pytest.raises(aiogroupq.InvalidTaskError, match="not both"):
        await producer.enqueue("h", delay=1.0, run_at=datetime.now(UTC) + timedelta(1))
    assert await redis_client.dbsize() == 0
    due = datetime.now(UTC) + timedelta(seconds=0.3)
    task_id = await producer.enqueue("h", run_at=due)
    assert await producer.status(task_id) is TaskState.DELAYED
    started: list[datetime] = []

    async def h() -> None:
        started.append(datetime.now(UTC))

    async with consuming(redis_client, {"h": h}):
        await wait_for(lambda: _is(producer, task_id, TaskState.SUCCEEDED))
    # Server and test share one clock here; allow the ms rounding only.
    assert started[0] >= due - timedelta(milliseconds=2)


async def _is(producer: aiogroupq.Producer, task_id: str, state: TaskState) -> bool:
    return await producer.status(task_id) is state


async def test_cancel_waiting_tasks_wherever_they_wait(
    producer: aiogroupq.Producer, redis_client: redis.asyncio.Redis
) -> None:
    ungrouped = await producer.enqueue("h", 0)
    head = await producer.enqueue("h", 1, group="g")
    parked = await producer.enqueue("h", 2, group="g")
    survivor = await producer.enqueue("h", 3, group="g")
    delayed = await producer.enqueue("h", 4, group="g", delay=60)
    for task_id in (ungrouped, head, parked, delayed):
        assert await producer.cancel(task_id) is True
        assert await producer.status(task_id) is TaskState.CANCELLED
    with pytest.raises(aiogroupq.TaskNotFoundError):
        await producer.cancel("nope")
    ran: list[int] = []

    async def h(n: int) -> None:
        ran.append(n)

    async with consuming(redis_client, {"h": h}):
        # Cancelling the head passed the group on to the survivor.
        await wait_for(lambda: _is(producer, survivor, TaskState.SUCCEEDED))
    assert ran == [3]
    assert await producer.cancel(survivor) is False
    with pytest.raises(aiogroupq.TaskCancelledError):
        await producer.result(head, timeout=1)


async def test_cancel_running_task_through_its_heartbeat(
    producer: aiogroupq.Producer, redis_client: redis.asyncio.Redis
) -> None:
    started = anyio.Event()
    after: list[int] = []

    async def slow(n: int) -> None:
        if n == 0:
            started.set()
            await anyio.sleep(60)
        after.append(n)

    running = await producer.enqueue("h", 0, group="g")
    following = await producer.enqueue("h", 1, group="g")
    async with consuming(redis_client, {"h": slow}, lease_ttl=3.0) as consumer:
        with anyio.fail_after(30):
            await started.wait()
        assert await producer.status(running) is TaskState.RUNNING
        assert await producer.cancel(running) is True
        with pytest.raises(aiogroupq.TaskCancelledError):
            await producer.result(running, timeout=30)
        await wait_for(lambda: _is(producer, following, TaskState.SUCCEEDED))
    assert after == [1]
    assert consumer.stats.cancelled == 1


async def test_results(
    producer: aiogroupq.Producer, redis_client: redis.asyncio.Redis
) -> None:
    async def double(n: int) -> dict[str, int]:
        return {"n": n * 2}

    async def plain(n: int) -> int:
        return n

    async def broken(n: int) -> None:
        raise ValueError(f"bad {n}")

    handlers = {
        "double": aiogroupq.Handler(double, store_result=True),
        "plain": plain,
        "broken": broken,
    }
    doubled = await producer.enqueue("double", 21)
    unstored = await producer.enqueue("plain", 1)
    failing = await producer.enqueue("broken", 7, max_attempts=1)
    never = await producer.enqueue("double", 1, delay=60)
    async with consuming(redis_client, handlers):
        assert await producer.result(doubled, timeout=30) == {"n": 42}
        with pytest.raises(aiogroupq.NoResultError):
            await producer.result(unstored, timeout=30)
        with pytest.raises(aiogroupq.TaskFailedError, match="ValueError: bad 7"):
            await producer.result(failing, timeout=30)
        with pytest.raises(TimeoutError):
            await producer.result(never, timeout=0.2)
    with pytest.raises(aiogroupq.TaskNotFoundError):
        await producer.result("unknown", timeout=0.1)


async def test_halt_policy_stops_only_that_group_until_requeued(
    producer: aiogroupq.Producer,
    admin: aiogroupq.Admin,
    redis_client: redis.asyncio.Redis,
) -> None:
    ran: list[tuple[str, int, int]] = []
    healed = False
    notices: list[aiogroupq.DeadLetter] = []

    async def h(n: int) -> None:
        info = aiogroupq.current_task()
        ran.append((info.group or "", n, info.attempt))
        if n == 1 and not healed:
            raise RuntimeError("poison")

    async def on_dead(letter: aiogroupq.DeadLetter) -> None:
        notices.append(letter)

    handler = aiogroupq.Handler(h, on_dead="halt")
    poison = await producer.enqueue("h", 1, group="a", max_attempts=2)
    behind = [await producer.enqueue("h", n, group="a") for n in (2, 3)]
    other = [await producer.enqueue("h", n, group="b") for n in (10, 11)]
    async with consuming(redis_client, {"h": handler}, on_dead=on_dead):
        await wait_for(lambda: _is(producer, other[-1], TaskState.SUCCEEDED))
        await wait_for(lambda: _is(producer, poison, TaskState.DEAD))
        await anyio.sleep(0.2)
        # Group "a" is halted behind its dead head; "b" went on.
        assert [await producer.status(t) for t in behind] == [TaskState.QUEUED] * 2
        [letter] = await admin.dead_letters()
        assert letter.id == poison
        assert letter.reason == "RuntimeError: poison"
        assert "RuntimeError" in letter.traceback
        assert letter.attempts == 2
        assert letter.payload == 1
        await wait_for(lambda: _true(len(notices) == 1))
        assert notices[0].id == poison
        healed = True
        assert await admin.requeue_dead(poison) == 1
        await wait_for(lambda: _is(producer, behind[-1], TaskState.SUCCEEDED))
    a_runs = [(n, attempt) for group, n, attempt in ran if group == "a"]
    # The requeued task got a fresh set of attempts and ran before the rest.
    assert a_runs == [(1, 1), (1, 2), (1, 1), (2, 1), (3, 1)]
    assert await admin.dead_letters() == []


async def _true(value: bool) -> bool:
    return value


async def test_release_group_and_purge(
    producer: aiogroupq.Producer,
    admin: aiogroupq.Admin,
    redis_client: redis.asyncio.Redis,
) -> None:
    async def h(n: int) -> None:
        if n < 0:
            raise KeyError(n)

    handler = aiogroupq.Handler(h, on_dead="halt", no_retry=(KeyError,))
    first_poison = await producer.enqueue("h", -1, group="a")
    after_first = await producer.enqueue("h", 1, group="a")
    second_poison = await producer.enqueue("h", -2, group="b")
    after_second = await producer.enqueue("h", 2, group="b")
    async with consuming(redis_client, {"h": handler}):
        await wait_for(lambda: _is(producer, second_poison, TaskState.DEAD))
        await wait_for(lambda: _is(producer, first_poison, TaskState.DEAD))
        assert await admin.release_group("a") is True
        assert await admin.release_group("a") is False
        await wait_for(lambda: _is(producer, after_first, TaskState.SUCCEEDED))
        # Purging the task that halts "b" lets "b" go on too.
        assert await producer.status(after_second) is TaskState.QUEUED
        assert await admin.purge_dead(all=True) == 2
        await wait_for(lambda: _is(producer, after_second, TaskState.SUCCEEDED))
    assert await producer.status(first_poison) is None
    with pytest.raises(aiogroupq.InvalidGroupError):
        await admin.release_group("")


async def test_no_retry_and_per_type_timeout(
    producer: aiogroupq.Producer, redis_client: redis.asyncio.Redis
) -> None:
    attempts: list[int] = []

    async def refuse(n: int) -> None:
        attempts.append(aiogroupq.current_task().attempt)
        raise LookupError("not retried")

    async def hang() -> None:
        await anyio.sleep(60)

    handlers = {
        "refuse": aiogroupq.Handler(refuse, no_retry=(LookupError,)),
        "hang": aiogroupq.Handler(hang, timeout=0.1),
    }
    refused = await producer.enqueue("refuse", 1, max_attempts=5)
    hung = await producer.enqueue("hang", max_attempts=2)
    async with consuming(redis_client, handlers):
        with pytest.raises(aiogroupq.TaskFailedError, match="LookupError"):
            await producer.result(refused, timeout=30)
        with pytest.raises(aiogroupq.TaskFailedError, match=r"timeout of 0\.1s"):
            await producer.result(hung, timeout=30)
    assert attempts == [1]


def test_handler_options_are_validated() -> None:
    async def h() -> None:
        pass

    with pytest.raises(aiogroupq.ConfigurationError, match="on_dead"):
        aiogroupq.Handler(h, on_dead="stop")  # type: ignore[arg-type]
    with pytest.raises(aiogroupq.ConfigurationError, match="no_retry"):
        aiogroupq.Handler(h, no_retry=(ValueError, 3))  # type: ignore[arg-type]
    with pytest.raises(aiogroupq.ConfigurationError, match="timeout"):
        aiogroupq.Handler(h, timeout=0)
