"""Leases and recovery: restart with the same name, expired leases, lost leases."""

from __future__ import annotations

import socket
import subprocess
import time

import anyio
import anyio.lowlevel
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys

QUEUE = "recovery"


async def test_restart_with_same_name_resumes_at_once(
    redis_client: redis.asyncio.Redis,
) -> None:
    keys = QueueKeys(QUEUE)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        first = await producer.enqueue("h", 1, group="g")
        second = await producer.enqueue("h", 2, group="g")
    # A consumer named "c1" claims the first task and dies: its lease is long,
    # so only the restart can bring the task back quickly.
    reply = await _scripts.claim(
        redis_client, keys, "c1", k=4, lease_ms=3_600_000, scan_limit=10
    )
    assert [t.id for t in reply.tasks] == [first]

    runs: list[tuple[int, int]] = []
    done = anyio.Event()

    async def handler(payload: int) -> None:
        runs.append((payload, aiogroupq.current_task().attempt))
        if len(runs) == 2:
            done.set()

    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"h": handler}, name="c1"
    ):
        with anyio.fail_after(30):
            await done.wait()
    # The interrupted task ran again first, with its attempt counted.
    assert runs == [(1, 2), (2, 1)]
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        assert await producer.status(second) is aiogroupq.TaskState.SUCCEEDED


async def test_expired_lease_recovered_by_another_consumer(
    redis_client: redis.asyncio.Redis,
) -> None:
    keys = QueueKeys(QUEUE)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        first = await producer.enqueue("h", 1, group="g")
        await producer.enqueue("h", 2, group="g")
    await _scripts.claim(redis_client, keys, "dead", k=1, lease_ms=200, scan_limit=10)

    runs: list[tuple[int, int]] = []
    done = anyio.Event()

    async def handler(payload: int) -> None:
        runs.append((payload, aiogroupq.current_task().attempt))
        if len(runs) == 2:
            done.set()

    async with aiogroupq.Consumer(redis_client, queue=QUEUE, handlers={"h": handler}):
        with anyio.fail_after(30):
            await done.wait()
    assert runs == [(1, 2), (2, 1)]
    assert await redis_client.smembers(keys.inflight("dead")) == set()
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        assert await producer.status(first) is aiogroupq.TaskState.SUCCEEDED


async def test_on_dead_hears_of_a_lease_that_expired_on_the_last_attempt(
    redis_client: redis.asyncio.Redis,
) -> None:
    """A consumer that dies on a task's last attempt cannot call its own
    on_dead: the consumer whose claim recovers the lease and dead-letters the
    task calls its on_dead with the dead letter."""
    keys = QueueKeys(QUEUE)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("h", 7, group="g", max_attempts=1)
    # "gone" claims it and is never heard of again; its lease is over at once.
    reply = await _scripts.claim(
        redis_client, keys, "gone", k=1, lease_ms=1, scan_limit=5
    )
    assert [t.id for t in reply.tasks] == [task_id]
    await anyio.sleep(0.01)
    letters: list[aiogroupq.DeadLetter] = []
    heard = anyio.Event()

    async def on_dead(letter: aiogroupq.DeadLetter) -> None:
        letters.append(letter)
        heard.set()

    async def h(n: int) -> None:
        raise AssertionError("a task dead on its last attempt must not run")

    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"h": h}, on_dead=on_dead
    ):
        with anyio.fail_after(30):
            await heard.wait()
    (letter,) = letters
    assert (letter.id, letter.group, letter.type, letter.attempts) == (
        task_id,
        "g",
        "h",
        1,
    )
    assert "lease expired on the last attempt" in letter.reason
    assert letter.payload == 7


async def test_stalled_consumer_loses_lease_and_its_ack_is_refused(
    redis_client: redis.asyncio.Redis,
) -> None:
    """A handler that blocks the event loop past the lease: another consumer
    takes the group over; the stalled one's outcome is refused, never applied."""
    runs: list[str] = []
    done = anyio.Event()

    async def stall(payload: int) -> None:
        runs.append(f"stall-{aiogroupq.current_task().attempt}")
        if aiogroupq.current_task().attempt == 1:
            time.sleep(5)  # noqa: ASYNC251 - blocks the loop: no heartbeat can run
            await anyio.lowlevel.checkpoint()
        else:
            done.set()

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue("h", 1, group="g")
    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"h": stall}, lease_ttl=2.0
    ) as stalled:
        # Past the stall: it blocks this loop too, and a second consumer
        # starting beside it would count the stall against its start-up
        # checks' budget (5 s, as long as the stall).
        with anyio.fail_after(30):
            while "stall-1" not in runs:
                await anyio.sleep(0.01)
        async with aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers={"h": stall}, lease_ttl=2.0
        ) as other:
            with anyio.fail_after(30):
                await done.wait()
            with anyio.fail_after(30):
                while stalled.stats.running or other.stats.running:
                    await anyio.sleep(0.01)
        # The test's own loop stalls too, so either consumer may run attempt 2;
        # what matters: attempt 1's outcome was refused, attempt 2's applied.
        assert stalled.stats.lease_lost == 1
        assert stalled.stats.succeeded + other.stats.succeeded == 1
    assert runs == ["stall-1", "stall-2"]


async def test_two_live_consumers_never_share_a_name(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def h() -> None:
        pass

    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"h": h}, name="twin", lease_ttl=5
    ):
        with pytest.raises(aiogroupq.ConfigurationError, match="named 'twin'"):
            async with aiogroupq.Consumer(
                redis_client, queue=QUEUE, handlers={"h": h}, name="twin", lease_ttl=5
            ):
                pass
    # Once the first let go, the name is free again.
    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"h": h}, name="twin", lease_ttl=5
    ):
        pass


async def test_name_of_a_dead_process_on_this_host_is_taken_over_at_once(
    redis_client: redis.asyncio.Redis,
) -> None:
    dead_pid = _exited_pid()
    holder = f"{socket.gethostname()}:{dead_pid}:feed"
    await redis_client.set(QueueKeys(QUEUE).consumer("phoenix"), holder, px=3_600_000)

    async def h() -> None:
        pass

    with anyio.fail_after(60):  # not the hour the stale hold would last
        async with aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers={"h": h}, name="phoenix"
        ):
            pass


def _exited_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid
