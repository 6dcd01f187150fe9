"""``dead.lua`` through its wrapper: a requeued dead letter runs again at
the front of its group (releasing and purging are in the finish and cancel
tests, which set them up)."""

from __future__ import annotations

import redis.asyncio

from aiogroupq._store import scripts as _scripts

from ._scripts_helpers import (
    KEYS,
    assert_consistent,
    claim_ids,
    claim_one,
    enqueue,
    field,
    finish,
    new,
    ok,
    zmembers,
)


async def test_requeue_of_the_halting_task_resumes_its_group_with_it(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    await finish(redis_client, _scripts.Outcome("a1", a1.token, "halt", "x", ""))
    assert await _scripts.dead_action(redis_client, KEYS, "requeue", ["a1"]) == 1
    assert await zmembers(redis_client, KEYS.dead) == []
    assert await field(redis_client, "a1", "a") == "0"
    again = await claim_one(redis_client)
    assert (again.id, again.attempt) == ("a1", 1)
    await finish(redis_client, ok(again))
    assert await claim_ids(redis_client) == ["a2"]
    await assert_consistent(redis_client)


async def _group_cap(client: redis.asyncio.Redis, cap: int) -> None:
    assert await control_group(client, "g", max_size=cap) == 0


async def control_group(
    client: redis.asyncio.Redis, group: str, *, max_size: int
) -> int:
    """Give *group* a max_size as ``Admin.set_group`` does."""
    return await _scripts.control(
        client, KEYS, "group", group, "", "", "", max_size, ""
    )


async def _live(client: redis.asyncio.Redis) -> int:
    """The live tasks of group g (k + d + w of its hash)."""
    counts = await client.hmget(KEYS.group("g"), "k", "d", "w")
    return sum(int(c or 0) for c in counts)


async def test_requeue_fills_a_capped_group_only_up_to_its_max_size(
    redis_client: redis.asyncio.Redis,
) -> None:
    # Three dead letters of group g, then one live task; max_size 3: a
    # requeue of all three took it to 4 live tasks (6 with three live).
    dead = ["d1", "d2", "d3"]
    await enqueue(redis_client, *(new(i, "g") for i in dead))
    for _ in dead:
        t = await claim_one(redis_client)
        await finish(redis_client, _scripts.Outcome(t.id, t.token, "dead", "x", ""))
    await enqueue(redis_client, new("live", "g"))
    await _group_cap(redis_client, 3)
    done = await _scripts.dead_action(redis_client, KEYS, "requeue", dead)
    live = await _live(redis_client)
    print(f"requeued {done} of {len(dead)}; group g holds {live} live, max_size 3")  # noqa: T201
    assert (done, live) == (2, 3)
    # The one left alone is still a dead letter, untouched.
    assert await zmembers(redis_client, KEYS.dead) == ["d3"]
    assert await field(redis_client, "d3", "s") == "dead"
    # Once the group has room, it is requeued like any other.
    for _ in range(3):
        await finish(redis_client, ok(await claim_one(redis_client)))
    assert await _scripts.dead_action(redis_client, KEYS, "requeue", ["d3"]) == 1
    await assert_consistent(redis_client)


async def test_the_task_a_full_group_is_halted_behind_is_still_requeued(
    redis_client: redis.asyncio.Redis,
) -> None:
    # The halter is the group's only way on: requeued even when the group's
    # line filled up to max_size meanwhile (one over the cap at most).
    await enqueue(redis_client, new("h", "g"), new("w1", "g"))
    t = await claim_one(redis_client)
    await finish(redis_client, _scripts.Outcome(t.id, t.token, "halt", "x", ""))
    await enqueue(redis_client, new("w2", "g"))
    await _group_cap(redis_client, 2)
    assert await _live(redis_client) == 2
    assert await _scripts.dead_action(redis_client, KEYS, "requeue", ["h"]) == 1
    assert await claim_ids(redis_client) == ["h"]
    await assert_consistent(redis_client)
