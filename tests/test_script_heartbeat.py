"""``heartbeat.lua`` through its wrapper: leases extended, and lost ones
reported."""

from __future__ import annotations

import anyio
import redis.asyncio

from aiogroupq._store import scripts as _scripts
from aiogroupq._store.replies import FinishCode

from ._scripts_helpers import (
    KEYS,
    LONG_MS,
    assert_consistent,
    claim,
    claim_one,
    enqueue,
    field,
    finish,
    new,
    ok,
)


async def test_heartbeat_extends_and_reports_lost_leases(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"), new("b"))
    # Long enough that a busy machine's pause does not end it before the
    # heartbeat (a lease that ran out before its heartbeat is lost).
    a, b = (await claim(redis_client, k=2, lease_ms=5_000)).tasks
    old = await redis_client.zscore(KEYS.leases, "a")
    assert old is not None
    codes = await _scripts.heartbeat(
        redis_client,
        KEYS,
        [(a.id, a.token), (b.id, b.token + 1), ("nope", 1)],
        lease_ms=LONG_MS,
    )
    assert codes == [1, 0, 0]
    new_a = await redis_client.zscore(KEYS.leases, "a")
    assert new_a is not None
    assert new_a >= old + LONG_MS - 5_000
    # b's lease was not touched by the refused heartbeat.
    assert await redis_client.zscore(KEYS.leases, "b") is not None
    assert (await redis_client.zscore(KEYS.leases, "b") or 0) < new_a
    # Once finished, the token owns nothing any more.
    await finish(redis_client, ok(a))
    assert await _scripts.heartbeat(
        redis_client, KEYS, [(a.id, a.token)], lease_ms=LONG_MS
    ) == [0]
    assert await redis_client.zscore(KEYS.leases, "a") is None
    await assert_consistent(redis_client)


async def test_heartbeat_keeps_a_short_lease_from_expiring(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"), new("a2", "g"))
    # Long enough to outlive the round trip to the heartbeat, also on a busy
    # machine that pauses the test for a second or two (a lease that ran out
    # before its heartbeat is lost, whether or not a claim saw it).
    a = await claim_one(redis_client, lease_ms=3_000)
    assert await _scripts.heartbeat(
        redis_client, KEYS, [(a.id, a.token)], lease_ms=LONG_MS
    ) == [1]
    await anyio.sleep(3.1)  # past the first lease: the renewal holds it
    assert (await claim(redis_client, "other")).tasks == []
    assert await field(redis_client, "a", "k") == str(a.token)
    assert await finish(redis_client, ok(a)) == [FinishCode.APPLIED]
    await assert_consistent(redis_client)
