"""``cancel.lua`` through its wrapper: a waiting task is cancelled where it
waits and its slot passed on, a running one's consumer is asked to, and a
re-sent cancel changes nothing."""

from __future__ import annotations

import redis.asyncio

from aiogroupq._store import scripts as _scripts
from aiogroupq._store.replies import CancelCode, FinishCode, HeartbeatCode

from ._scripts_helpers import (
    KEYS,
    LONG_MS,
    WINDOW_MS,
    assert_consistent,
    claim_ids,
    claim_one,
    counts,
    enqueue,
    field,
    finish,
    lrange,
    marks,
    new,
    stats,
    zmembers,
)


async def test_cancel_while_running_turns_a_retry_into_cancel(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    assert (
        await _scripts.cancel(redis_client, KEYS, "a1", retention_ms=WINDOW_MS)
        == CancelCode.REQUESTED
    )
    assert await _scripts.heartbeat(
        redis_client, KEYS, [(a1.id, a1.token)], lease_ms=LONG_MS
    ) == [HeartbeatCode.CANCEL_REQUESTED]
    retry = _scripts.Outcome("a1", a1.token, "retry", 0, "err")
    assert await finish(redis_client, retry) == [FinishCode.APPLIED_AS_CANCEL]
    assert await field(redis_client, "a1", "s") == "cancelled"
    assert await claim_ids(redis_client) == ["a2"]
    await assert_consistent(redis_client)


async def test_cancel_of_waiting_tasks_passes_slots_on(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(
        redis_client,
        new("a1", "g"),
        new("a2", "g"),
        new("a3", "g"),
        new("d", "g", delay_ms=LONG_MS),
    )
    cancel = _scripts.cancel
    # A line member leaves the line; the head passes its slot on.
    assert await cancel(redis_client, KEYS, "a2", retention_ms=WINDOW_MS) == 1
    assert await counts(redis_client, "g") == (1, 1, 1)
    assert await cancel(redis_client, KEYS, "a1", retention_ms=WINDOW_MS) == 1
    assert await marks(redis_client, "g") == {"a3": "@"}
    assert await lrange(redis_client, KEYS.ready) == ["a3"]
    # A task in its first delay leaves the delayed set.
    assert await cancel(redis_client, KEYS, "d", retention_ms=WINDOW_MS) == 1
    assert await counts(redis_client, "g") == (1, 0, 0)
    assert await zmembers(redis_client, KEYS.delayed) == []
    assert (await stats(redis_client))["cancelled"] == 3
    await assert_consistent(redis_client)


async def test_cancel_resent_and_purge_of_a_stale_index_entry(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a"))
    first = await _scripts.cancel(redis_client, KEYS, "a", retention_ms=WINDOW_MS)
    again = await _scripts.cancel(redis_client, KEYS, "a", retention_ms=WINDOW_MS)
    assert (first, again) == (CancelCode.CANCELLED, CancelCode.CANCELLED)
    # A dead index entry whose task is not dead is dropped by a purge.
    await redis_client.zadd(KEYS.dead, {"a": 1})
    assert await _scripts.dead_action(redis_client, KEYS, "purge", ["a"]) == 0
    assert await redis_client.zcard(KEYS.dead) == 0
