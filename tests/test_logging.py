"""What a consumer logs: a start-up banner, each failure, retry, dead letter
and lost lease at WARNING or above with the task's id, type, group and
attempt in the message and as extra fields, per-task lines at DEBUG, and
never a payload."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import TaskState
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys

QUEUE = "logging"
KEYS = QueueKeys(QUEUE)
SECRET = "s3cr3t-payload-value"
#: liveness only
PATIENCE = 30.0


async def settle(producer: aiogroupq.Producer, ids: list[str]) -> list[TaskState]:
    """Wait until every task ended; return their states."""
    terminal = {TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED}
    with anyio.fail_after(PATIENCE):
        while True:
            states = [await producer.status(i) for i in ids]
            if all(s in terminal for s in states):
                return [s for s in states if s is not None]
            await anyio.sleep(0.02)


def about(caplog: pytest.LogCaptureFixture, task_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if task_id in r.getMessage()]


def fields(record: logging.LogRecord) -> dict[str, Any]:
    names = ("queue", "task_id", "task_type", "group", "attempt")
    return {name: getattr(record, name, "<missing>") for name in names}


async def run(
    redis_client: redis.asyncio.Redis,
    handlers: dict[str, Callable[..., Awaitable[None]]],
    tasks: list[aiogroupq.Task],
) -> tuple[list[str], aiogroupq.ConsumerStats]:
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = await producer.enqueue_many(tasks)
        async with aiogroupq.Consumer(
            redis_client,
            queue=QUEUE,
            handlers=handlers,
            retry_backoff=0.01,
            concurrency=4,
        ) as consumer:
            await settle(producer, ids)
            with anyio.fail_after(PATIENCE):
                while consumer.stats.running:
                    await anyio.sleep(0.01)
    return ids, consumer.stats


async def test_failure_retry_and_dead_letter_lines_name_the_task(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(payload: dict[str, str]) -> None:
        raise ValueError("upstream said no")

    async def later(payload: dict[str, str]) -> None:
        if aiogroupq.current_task().attempt == 1:
            raise aiogroupq.Retry(delay=0.01)

    with caplog.at_level(logging.INFO, logger="aiogroupq"):
        (fails, retries), _ = await run(
            redis_client,
            {"broken": broken, "later": later},
            [
                aiogroupq.Task(
                    "broken", {"token": SECRET}, group="tenant-1", max_attempts=2
                ),
                aiogroupq.Task("later", {"token": SECRET}, group="tenant-2"),
            ],
        )
    lines = about(caplog, fails)
    assert [r.levelno for r in lines] == [logging.WARNING, logging.ERROR]
    first, last = lines
    assert fields(first) == {
        "queue": QUEUE,
        "task_id": fails,
        "task_type": "broken",
        "group": "tenant-1",
        "attempt": 1,
    }
    assert fields(last)["attempt"] == 2
    for record, attempt in ((first, 1), (last, 2)):
        message = record.getMessage()
        assert f"type 'broken', group 'tenant-1', attempt {attempt} of 2" in message
        assert "ValueError: upstream said no" in message
        assert record.exc_info is not None  # the traceback goes with it
    assert "retrying in" in first.getMessage()
    assert "dead-lettered" in last.getMessage()
    (asked,) = about(caplog, retries)
    assert asked.levelno == logging.WARNING
    assert "type 'later', group 'tenant-2', attempt 1 of 3" in asked.getMessage()
    assert "asked to retry" in asked.getMessage()
    assert fields(asked)["task_type"] == "later"
    # The banner: queue, handlers, concurrency, lease.
    (banner,) = [r for r in caplog.records if "claiming from queue" in r.getMessage()]
    assert banner.levelno == logging.INFO
    assert "handlers broken, later, concurrency 4, lease_ttl 30s" in banner.getMessage()
    assert getattr(banner, "handlers", None) == ["broken", "later"]
    # Payloads are never logged, in messages or in fields.
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in repr(vars(record))


async def test_per_task_lines_are_debug(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    async def fine(payload: int) -> None:
        pass

    with caplog.at_level(logging.DEBUG, logger="aiogroupq"):
        (task_id,), _ = await run(
            redis_client, {"fine": fine}, [aiogroupq.Task("fine", 7, group="g")]
        )
    lines = about(caplog, task_id)
    assert [r.levelno for r in lines] == [logging.DEBUG, logging.DEBUG]
    started, succeeded = (r.getMessage() for r in lines)
    assert started.endswith("(type 'fine', group 'g', attempt 1 of 3) started")
    assert "succeeded in" in succeeded
    assert all(fields(r)["task_type"] == "fine" for r in lines)


async def _expire_and_take(client: redis.asyncio.Redis, task_id: str) -> bool:
    """Expire *task_id*'s lease and claim it as consumer "other", atomically;
    whether "other" got it."""
    script = _scripts.CLAIM
    extra = (KEYS.inflight("other"), KEYS.last_claim("other"))
    args = ("other", 1, 600_000, 9, 1000, 100, "n0", 3_600_000)
    await client.script_load(script.source)
    async with client.pipeline(transaction=True) as pipe:
        pipe.zadd(KEYS.leases, {task_id: 0}, xx=True)
        pipe.execute_command(*script.command(KEYS, extra, args))
        _, reply = await pipe.execute()
    return task_id.encode() in reply[6::6]  # ids of the claimed tasks


async def test_a_lost_lease_is_a_warning_that_names_the_task(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    started, cancelled = anyio.Event(), anyio.Event()

    async def hold() -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("hold", group="g")
        with caplog.at_level(logging.INFO, logger="aiogroupq"):
            async with aiogroupq.Consumer(
                redis_client, queue=QUEUE, handlers={"hold": hold}, lease_ttl=3.0
            ):
                with anyio.fail_after(PATIENCE):
                    await started.wait()
                # The server recovers the task and another consumer takes it,
                # in one transaction: between two round trips, this consumer's
                # own heartbeat or claim could recover it first.
                assert await _expire_and_take(redis_client, task_id)
                with anyio.fail_after(PATIENCE):
                    await cancelled.wait()
    (lost,) = [r for r in about(caplog, task_id) if "lost" in r.getMessage()]
    assert lost.levelno == logging.WARNING
    assert "type 'hold', group 'g', attempt 1 of 3" in lost.getMessage()
    assert fields(lost) == {
        "queue": QUEUE,
        "task_id": task_id,
        "task_type": "hold",
        "group": "g",
        "attempt": 1,
    }
