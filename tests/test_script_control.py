"""``control.lua`` through its wrapper: a group's concurrency, and pausing
and resuming a group or the whole queue."""

from __future__ import annotations

import redis.asyncio

from ._scripts_helpers import (
    KEYS,
    assert_consistent,
    claim,
    claim_ids,
    control,
    counts,
    enqueue,
    finish,
    lrange,
    marks,
    new,
    ok,
    server_ms,
    set_group,
    smembers,
    stats,
)

# -- group concurrency ----------------------------------------------------


async def test_group_concurrency_runs_n_at_once_in_order(
    redis_client: redis.asyncio.Redis,
) -> None:
    await set_group(redis_client, "g", c=2)
    await enqueue(redis_client, *(new(f"a{i}", "g") for i in range(1, 6)))
    # Two slots: the first two are runnable, the rest wait in line.
    assert await lrange(redis_client, KEYS.ready) == ["a1", "a2"]
    assert await lrange(redis_client, KEYS.parked("g")) == ["a3", "a4", "a5"]
    reply = await claim(redis_client)
    assert [t.id for t in reply.tasks] == ["a1", "a2"]
    assert await marks(redis_client, "g") == {
        "a1": str(reply.tasks[0].token),
        "a2": str(reply.tasks[1].token),
    }
    assert await counts(redis_client, "g") == (2, 0, 3)
    await assert_consistent(redis_client)
    # Raised to 3: the free slot takes the oldest of the line at once.
    assert await set_group(redis_client, "g", c=3) == 1
    assert await claim_ids(redis_client) == ["a3"]
    # Each end passes its slot to the next in line, in order.
    a1, a2 = reply.tasks
    await finish(redis_client, ok(a2))
    await finish(redis_client, ok(a1))
    assert await claim_ids(redis_client) == ["a4", "a5"]
    assert await counts(redis_client, "g") == (3, 0, 0)
    await assert_consistent(redis_client)


async def test_lowered_concurrency_lets_running_tasks_finish(
    redis_client: redis.asyncio.Redis,
) -> None:
    await set_group(redis_client, "g", c=2)
    await enqueue(redis_client, *(new(f"a{i}", "g") for i in range(1, 4)))
    a1, a2 = (await claim(redis_client)).tasks
    await set_group(redis_client, "g", c=1)
    await assert_consistent(redis_client)
    # One end frees a slot the lower limit does not give away.
    await finish(redis_client, ok(a1))
    assert await claim_ids(redis_client) == []
    await finish(redis_client, ok(a2))
    assert await claim_ids(redis_client) == ["a3"]
    await assert_consistent(redis_client)


# -- pause and resume -----------------------------------------------------


async def test_paused_group_holds_its_heads_back_in_order(
    redis_client: redis.asyncio.Redis,
) -> None:
    await set_group(redis_client, "g", c=2)
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("a3", "g"))
    await enqueue(redis_client, new("u1"))
    assert await control(redis_client, "pause", "g") == 0
    assert await smembers(redis_client, KEYS.paused) == {"g"}
    # The heads already in the ready list are held aside when met, in order.
    assert await claim_ids(redis_client) == ["u1"]
    assert await lrange(redis_client, KEYS.held("g")) == ["a1", "a2"]
    assert await marks(redis_client, "g") == {"a1": "~", "a2": "~"}
    assert (await stats(redis_client))["held"] == 2
    # New tasks of a paused group wait in its line.
    await enqueue(redis_client, new("a4", "g"), new("u2"))
    assert await lrange(redis_client, KEYS.parked("g")) == ["a3", "a4"]
    await assert_consistent(redis_client)
    # Resumed: the held heads go first, in order, before u2.
    assert await control(redis_client, "resume", "g") == 2
    assert await lrange(redis_client, KEYS.ready) == ["a1", "a2", "u2"]
    assert not await redis_client.exists(KEYS.held("g"))
    assert await smembers(redis_client, KEYS.paused) == set()
    assert await claim_ids(redis_client) == ["a1", "a2", "u2"]
    assert (await stats(redis_client)).get("held", 0) == 0
    await assert_consistent(redis_client)


async def test_pause_waits_out_the_start_window_of_earlier_claims(
    redis_client: redis.asyncio.Redis,
) -> None:
    window = 3_000_000  # ms: far more than this test can take
    await set_group(redis_client, "g", c=2)
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("a3", "g"))
    reply = await claim(redis_client, k=1)
    a1 = reply.tasks[0]
    before = await server_ms(redis_client)
    wait = await control(redis_client, "pause", "g", window)
    after = await server_ms(redis_client)
    # Until a1's claim is a window old, its consumer may still start it.
    assert (
        reply.now_ms + window + 1 - after <= wait <= reply.now_ms + window + 1 - before
    )
    # a2 holds a slot but was not claimed: nothing to wait for but a1.
    assert await marks(redis_client, "g") == {"a1": str(a1.token), "a2": "@"}
    assert await claim_ids(redis_client) == []  # a2 is held back
    # A claim older than the window can no longer start: no wait.
    await redis_client.hset(KEYS.task("a1"), "cl", reply.now_ms - window - 1)
    assert await control(redis_client, "pause", "g", window) == 0
    # A group with no running task, or a pause without a window, waits for none.
    await enqueue(redis_client, new("b1", "h"))
    assert await control(redis_client, "pause", "h", window) == 0
    await finish(redis_client, ok(a1))
    assert await control(redis_client, "pause", "g") == 0
    await assert_consistent(redis_client)


async def test_paused_queue_claims_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"), new("u"))
    await control(redis_client, "qpause")
    reply = await claim(redis_client)
    assert (reply.tasks, reply.more) == ([], False)
    assert await lrange(redis_client, KEYS.ready) == ["a", "u"]
    assert await control(redis_client, "qresume") == 2
    assert await claim_ids(redis_client) == ["a", "u"]
    await assert_consistent(redis_client)
