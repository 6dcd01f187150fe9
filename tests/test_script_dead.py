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
