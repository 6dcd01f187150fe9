"""A consumer that lost its lease stops, and its late outcome is refused.

Each test covers one mechanism on its own and fails when only that
mechanism is taken out:

- the fencing check of ``finish.lua``: an outcome carrying the token of an
  attempt whose task was since recovered and claimed again changes nothing;
- the heartbeat reporting a lease LOST cancels the handler (while the local
  lease deadline is still ahead);
- the local lease deadline cancels the handler when no renewal gets through
  (while the heartbeats cannot report anything).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import TaskState
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.replies import FinishCode

QUEUE = "fencing"
KEYS = QueueKeys(QUEUE)
LONG_MS = 600_000


async def dump(client: redis.asyncio.Redis) -> dict[bytes, Any]:
    """Every key with its value, to show that nothing changed."""
    out: dict[bytes, Any] = {}
    keys: Any = await client.keys("*")
    for key in sorted(keys):
        kind_name: Any = await client.type(key)
        kind = kind_name.decode()
        if kind == "string":
            out[key] = await client.get(key)
        elif kind == "list":
            out[key] = await client.lrange(key, 0, -1)
        elif kind == "set":
            out[key] = sorted(await client.smembers(key))
        elif kind == "zset":
            out[key] = await client.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            out[key] = await client.hgetall(key)
        else:
            out[key] = kind
    return out


async def expire_lease(client: redis.asyncio.Redis, task_id: str) -> None:
    """Move the task's lease deadline into the past: the next claim recovers
    it, as after a consumer stalled past its lease."""
    assert await client.zadd(KEYS.leases, {task_id: 0}, xx=True, ch=True) == 1


async def test_finish_with_the_token_of_a_recovered_attempt_is_refused(
    redis_client: redis.asyncio.Redis,
) -> None:
    tasks = [
        _scripts.NewTask(task_id, "g", b"envelope", 0, 3, None)
        for task_id in ("a1", "a2")
    ]
    await _scripts.enqueue(redis_client, KEYS, tasks, dedup_window_ms=LONG_MS)
    old = (
        await _scripts.claim(
            redis_client, KEYS, "stalled", k=1, lease_ms=LONG_MS, scan_limit=10
        )
    ).tasks[0]
    await expire_lease(redis_client, "a1")
    new = (
        await _scripts.claim(
            redis_client, KEYS, "other", k=1, lease_ms=LONG_MS, scan_limit=10
        )
    ).tasks[0]
    assert (new.id, new.attempt) == ("a1", 2)
    assert new.token != old.token
    before = await dump(redis_client)
    # Every kind of late outcome from the stalled consumer: refused, and not
    # one key changed (the group stays with the new attempt, a2 waits).
    late: list[tuple[_scripts.OutcomeKind, str | int | bytes, str]] = [
        ("ok", "", ""),
        ("ok", b"\x01", ""),
        ("retry", 0, "err"),
        ("retry", 5_000, "err"),
        ("dead", "why", "trace"),
        ("halt", "why", "trace"),
        ("cancel", "", ""),
        ("back", "", ""),
    ]
    for kind, arg1, arg2 in late:
        stale = _scripts.Outcome("a1", old.token, kind, arg1, arg2)
        codes = await _scripts.finish(redis_client, KEYS, [stale], retention_ms=LONG_MS)
        assert codes == [FinishCode.LEASE_LOST], kind
        assert await dump(redis_client) == before, kind
    # The current attempt's outcome applies, and the group moves on.
    current = _scripts.Outcome("a1", new.token, "ok")
    codes = await _scripts.finish(redis_client, KEYS, [current], retention_ms=LONG_MS)
    assert codes == [FinishCode.APPLIED]
    assert await redis_client.hget(KEYS.task("a1"), "s") == b"succeeded"
    nxt = await _scripts.claim(
        redis_client, KEYS, "other", k=1, lease_ms=LONG_MS, scan_limit=10
    )
    assert [t.id for t in nxt.tasks] == ["a2"]
    # A late outcome of the stalled attempt after the task ended: still refused.
    stale = _scripts.Outcome("a1", old.token, "ok")
    codes = await _scripts.finish(redis_client, KEYS, [stale], retention_ms=LONG_MS)
    assert codes == [FinishCode.LEASE_LOST]


class _Blocker:
    """A handler that blocks on its first attempt and records its
    cancellation; later attempts return at once."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.cancelled = anyio.Event()

    async def __call__(self) -> None:
        if aiogroupq.current_task().attempt > 1:
            return
        self.started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled.set()
            raise


async def test_heartbeat_reporting_the_lease_lost_cancels_the_handler(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Heartbeats every lease_ttl / 3 = 2 s; the local deadline lies 5.4 s
    # after the last renewal, so the first heartbeat after the loss sees it
    # well before the deadline could, also on a busy machine that pauses
    # the consumer for a second or two.
    handler = _Blocker()
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("h", group="g")
        with caplog.at_level(logging.INFO, logger="aiogroupq"):
            async with aiogroupq.Consumer(
                redis_client, queue=QUEUE, handlers={"h": handler}, lease_ttl=6.0
            ) as consumer:
                with anyio.fail_after(30):
                    await handler.started.wait()
                # The server recovers the task and another consumer takes it.
                await expire_lease(redis_client, task_id)
                reply = await _scripts.claim(
                    redis_client, KEYS, "other", k=1, lease_ms=LONG_MS, scan_limit=10
                )
                assert [(t.id, t.attempt) for t in reply.tasks] == [(task_id, 2)]
                with anyio.fail_after(30):
                    await handler.cancelled.wait()
                    while consumer.stats.running:
                        await anyio.sleep(0.01)
                stats = consumer.stats
        assert stats.lease_lost == 1
        assert stats.retried == stats.succeeded == stats.dead == 0
        messages = [r.getMessage() for r in caplog.records]
        # This path drops the attempt without sending an outcome; the local
        # deadline's path would have sent a retry (refused, and logged so).
        assert any("was lost; its handler was cancelled" in m for m in messages)
        assert not any("could not be renewed" in m for m in messages), messages
        assert not any("refused" in m for m in messages), messages
        # The other consumer's attempt was left alone.
        assert await producer.status(task_id) is TaskState.RUNNING
        token = await redis_client.hget(KEYS.task(task_id), "k")
        assert token == str(reply.tasks[0].token).encode()


async def test_lease_deadline_cancels_the_handler_when_renewals_fail(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    handler = _Blocker()
    lease_ttl = 1.0  # the local deadline: 0.9 s after the claim or a renewal
    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Consumer(
            redis_url, queue=QUEUE, handlers={"h": handler}, lease_ttl=lease_ttl
        ) as consumer,
    ):
        task_id = await producer.enqueue("h", group="g")
        with anyio.fail_after(30):
            await handler.started.wait()
        # Every write, scripts included, now waits: no heartbeat gets an
        # answer, so none can report anything. Only the consumer's own lease
        # deadline can stop the handler while the pause lasts. (The pause
        # lifts itself after 20 s if the test dies.)
        await redis_client.client_pause(20_000, all=False)  # WRITE mode
        try:
            with anyio.fail_after(30):
                await handler.cancelled.wait()
        finally:
            await redis_client.client_unpause()
        # Afterwards the task runs again (a retry, or a recovery) and ends.
        with anyio.fail_after(30):
            while await producer.status(task_id) is not TaskState.SUCCEEDED:
                await anyio.sleep(0.01)
            # The stats count the finish once its reply is back, after the
            # state another connection may already read.
            while consumer.stats.succeeded < 1:
                await anyio.sleep(0.01)
        assert consumer.stats.succeeded == 1
