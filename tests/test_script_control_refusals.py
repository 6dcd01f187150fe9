"""``control.lua`` refuses a call on a damaged key before its first write:
a group's settings, a resume or the queue's settings are replaced whole or
not at all."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio

import aiogroupq

from ._scripts_helpers import KEYS, control, dump, enqueue, new, set_group


async def _refused_and_nothing_written(
    client: redis.asyncio.Redis, call: Callable[[], Awaitable[int]], key: str
) -> None:
    before = await dump(client)
    with pytest.raises(aiogroupq.CorruptQueueError) as caught:
        await call()
    assert key in str(caught.value)
    assert await dump(client) == before


async def _queue_with_group_settings(client: redis.asyncio.Redis) -> None:
    await set_group(client, "g", c=2)
    await control(client, "pause", "g")
    await enqueue(client, new("a1", "g"), new("a2", "g"), new("a3", "g"), new("b1"))


@pytest.mark.parametrize("damage", ["wrong type", "not a count"])
async def test_a_damaged_group_state_refuses_its_settings_and_resume(
    redis_client: redis.asyncio.Redis, damage: str
) -> None:
    await _queue_with_group_settings(redis_client)
    key = KEYS.group("g")
    await redis_client.delete(key)
    if damage == "wrong type":
        await redis_client.set(key, "damage")
    else:
        await redis_client.hset(key, mapping={"k": "x", "d": "0", "w": "1"})

    async def settings() -> int:
        return await set_group(redis_client, "g", c=3, rn=5, rp=1000, pr=2)

    async def resume() -> int:
        return await control(redis_client, "resume", "g")

    await _refused_and_nothing_written(redis_client, settings, key)
    await _refused_and_nothing_written(redis_client, resume, key)


async def test_a_damaged_priority_line_refuses_settings_that_turn_priorities_on(
    redis_client: redis.asyncio.Redis,
) -> None:
    await _queue_with_group_settings(redis_client)
    await redis_client.set(KEYS.pready, "damage")

    async def group_priority() -> int:
        return await set_group(redis_client, "g", c=1, pr=5)

    async def queue_aging() -> int:
        return await control(redis_client, "queue", "drain", 4, "", "", 1000, "")

    await _refused_and_nothing_written(redis_client, group_priority, KEYS.pready)
    await _refused_and_nothing_written(redis_client, queue_aging, KEYS.pready)
    # Without damage both go through.
    await redis_client.delete(KEYS.pready)
    await group_priority()
    await queue_aging()
    assert await redis_client.hget(KEYS.group_conf("g"), "pr") == b"5"
    assert await redis_client.hget(KEYS.conf, "age") == b"1000"
