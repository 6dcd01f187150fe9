"""``recover.lua`` through its wrapper: a restarted consumer's tasks go
back, and never one another consumer owns."""

from __future__ import annotations

import redis.asyncio

from aiogroupq._store import scripts as _scripts

from ._scripts_helpers import (
    KEYS,
    assert_consistent,
    claim,
    claim_one,
    enqueue,
    field,
    lrange,
    marks,
    new,
)


async def test_recover_gives_back_a_restarted_consumers_tasks(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(
        redis_client, new("a1", "g"), new("a2", "g"), new("u", max_attempts=1)
    )
    await claim(redis_client, "w", k=2)
    # Counted (a restart): a1 goes back to the front, u was on its last
    # attempt and is dead-lettered.
    given, dead = await _scripts.recover(redis_client, KEYS, "w", counted=True)
    assert (given, dead) == (2, ("u",))
    assert await lrange(redis_client, KEYS.ready) == ["a1"]
    assert await marks(redis_client, "g") == {"a1": "@"}
    assert await field(redis_client, "a1", "a") == "1"
    assert await field(redis_client, "u", "s") == "dead"
    assert not await redis_client.exists(KEYS.inflight("w"))
    await assert_consistent(redis_client)
    # Not counted (a lost claim reply): the attempt is taken back.
    a1 = await claim_one(redis_client, "w")
    assert await _scripts.recover(redis_client, KEYS, "w", counted=False) == (1, ())
    assert await field(redis_client, "a1", "a") == "1"
    # Tasks the consumer still runs are left alone.
    a1 = await claim_one(redis_client, "w")
    assert await _scripts.recover(
        redis_client, KEYS, "w", counted=True, keep=["a1"]
    ) == (0, ())
    assert await field(redis_client, "a1", "k") == str(a1.token)
    await assert_consistent(redis_client)


async def test_recover_never_takes_a_task_from_its_owner(
    redis_client: redis.asyncio.Redis,
) -> None:
    """A stale entry in one consumer's recovery key for a task another
    consumer runs is dropped, not recovered (that would run the group twice)."""
    await enqueue(redis_client, new("a", "g"))
    owned = await claim_one(redis_client, "owner")
    await redis_client.sadd(KEYS.inflight("other"), "a")
    assert await _scripts.recover(redis_client, KEYS, "other", counted=True) == (0, ())
    assert await redis_client.smembers(KEYS.inflight("other")) == set()
    assert await field(redis_client, "a", "s") == "running"
    assert await marks(redis_client, "g") == {"a": str(owned.token)}
    await assert_consistent(redis_client)
