"""``enqueue.lua`` through its wrapper: where new tasks go (a free slot and
the ready list, or their group's line), deduplication, delays, a group's cap,
and refused calls that write nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest
import redis.asyncio
from redis.exceptions import ResponseError

from aiogroupq._store import scripts as _scripts
from aiogroupq._store.replies import FinishCode, GroupFullRefusal

from ._scripts_helpers import (
    KEYS,
    LONG_MS,
    WINDOW_MS,
    Recorder,
    assert_consistent,
    claim_one,
    counts,
    dump,
    enqueue,
    field,
    finish,
    get,
    group_of,
    hash_of,
    lrange,
    marks,
    new,
    ok,
    replaced,
    server_ms,
    set_group,
    stats,
    zmembers,
)
from ._tasks import envelope_of


async def test_enqueue_routes_heads_and_parks_the_rest(
    redis_client: redis.asyncio.Redis,
) -> None:
    before = await server_ms(redis_client)
    ids = await enqueue(
        redis_client, new("a1", "g1"), new("a2", "g1"), new("u1"), new("b1", "g2")
    )
    assert ids == ["a1", "a2", "u1", "b1"]
    # A group's first task takes its one slot (mark '@') and joins the ready
    # tail; the second waits in the group's line.
    assert await lrange(redis_client, KEYS.ready) == ["a1", "u1", "b1"]
    assert await lrange(redis_client, KEYS.parked("g1")) == ["a2"]
    assert await group_of(redis_client, "g1") == {
        "k": "1",
        "d": "0",
        "w": "1",
        "h:a1": "@",
    }
    assert await marks(redis_client, "g2") == {"b1": "@"}
    a2 = await hash_of(redis_client, KEYS.task("a2"))
    assert int(a2.pop("dt")) >= before  # runnable since (server clock)
    assert a2 == {
        "e": envelope_of("a2", "g1").decode(errors="surrogateescape"),
        "m": "3",
        "a": "0",
        "s": "queued",
        "g": "g1",
    }
    # An ungrouped task has no group field and no group state.
    assert await field(redis_client, "u1", "g") is None
    # The indexes of groups with a line, and the counters.
    assert await redis_client.zrange(KEYS.backlog, 0, -1, withscores=True) == [
        (b"g1", 1.0)
    ]
    assert await zmembers(redis_client, KEYS.waiting) == ["g1"]
    assert await stats(redis_client) == {"enqueued": 4, "parked": 1, "groups": 2}
    assert await redis_client.llen(KEYS.wake) == 3  # one per runnable task
    await assert_consistent(redis_client)


async def test_enqueue_resent_creates_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    batch = (new("a1", "g"), new("a2", "g"), new("u"), new("d", "g", delay_ms=LONG_MS))
    first = await enqueue(redis_client, *batch)
    before = await dump(redis_client)
    # A lost reply makes the client send the same ids again: a no-op.
    assert await enqueue(redis_client, *batch) == first
    assert await dump(redis_client) == before
    # Also once a task has moved on (running, then succeeded): not re-queued.
    task = await claim_one(redis_client)
    assert task.id == "a1"
    assert await finish(redis_client, ok(task)) == [FinishCode.APPLIED]
    before = await dump(redis_client)
    assert await enqueue(redis_client, *batch) == first
    assert await dump(redis_client) == before
    await assert_consistent(redis_client)


async def test_enqueue_dedup_key_within_a_batch(
    redis_client: redis.asyncio.Redis,
) -> None:
    ids = await enqueue(
        redis_client, new("a", dedup="k"), new("b", dedup="k"), new("c", dedup="j")
    )
    assert ids == ["a", "a", "c"]
    assert not await redis_client.exists(KEYS.task("b"))
    assert await lrange(redis_client, KEYS.ready) == ["a", "c"]
    assert await get(redis_client, KEYS.dedup("k")) == "a"
    assert 0 < await redis_client.pttl(KEYS.dedup("k")) <= WINDOW_MS
    await assert_consistent(redis_client)


async def test_enqueue_dedup_key_across_calls(
    redis_client: redis.asyncio.Redis,
) -> None:
    assert await enqueue(redis_client, new("a", "g", dedup="k")) == ["a"]
    before = await dump(redis_client)
    assert await enqueue(redis_client, new("b", "g", dedup="k")) == ["a"]
    assert await dump(redis_client) == before
    # Still deduplicated after the first task finished, within the window.
    task = await claim_one(redis_client)
    await finish(redis_client, ok(task))
    assert await enqueue(redis_client, new("b", "g", dedup="k")) == ["a"]
    assert not await redis_client.exists(KEYS.task("b"))
    # The window ends (the key expires): the key may be used again.
    await redis_client.delete(KEYS.dedup("k"))
    assert await enqueue(redis_client, new("b", "g", dedup="k")) == ["b"]
    assert await field(redis_client, "b", "s") == "queued"
    await assert_consistent(redis_client)


async def test_unique_dedup_holds_while_live_and_frees_at_the_end(
    redis_client: redis.asyncio.Redis,
) -> None:
    assert await enqueue(redis_client, new("a", "g", dedup="k", unique=True)) == ["a"]
    # Held without a window: no expiry, until the task ends.
    assert await get(redis_client, KEYS.dedup("k")) == "a"
    assert await redis_client.pttl(KEYS.dedup("k")) == -1
    assert await field(redis_client, "a", "u") == "k"
    assert await enqueue(redis_client, new("b", "g", dedup="k", unique=True)) == ["a"]
    task = await claim_one(redis_client)
    assert await enqueue(redis_client, new("b", "g", dedup="k", unique=True)) == ["a"]
    assert await finish(redis_client, ok(task)) == [FinishCode.APPLIED]
    # Ended: the key is free at once, not after a window.
    assert not await redis_client.exists(KEYS.dedup("k"))
    assert await enqueue(redis_client, new("b", "g", dedup="k", unique=True)) == ["b"]
    # Freed by any end: here a cancel.
    assert await _scripts.cancel(redis_client, KEYS, "b", retention_ms=WINDOW_MS) == 1
    assert not await redis_client.exists(KEYS.dedup("k"))
    await assert_consistent(redis_client)


async def test_enqueue_delayed_waits_in_the_delayed_set(
    redis_client: redis.asyncio.Redis,
) -> None:
    before = await server_ms(redis_client)
    await enqueue(redis_client, new("d", "g", delay_ms=60_000))
    after = await server_ms(redis_client)
    assert await zmembers(redis_client, KEYS.delayed) == ["d"]
    due = await redis_client.zscore(KEYS.delayed, "d")
    assert due is not None
    # The script rounds the clock up to the next ms (never due early).
    assert before + 60_000 <= due <= after + 60_000 + 1
    assert await field(redis_client, "d", "s") == "delayed"
    assert await field(redis_client, "d", "dt") == str(int(due))
    assert await lrange(redis_client, KEYS.ready) == []
    # A task in its first delay holds no slot (it is counted in d), so a
    # later undelayed task of the group is not stuck behind it.
    assert await group_of(redis_client, "g") == {"k": "0", "d": "1", "w": "0"}
    await enqueue(redis_client, new("n", "g"))
    assert await lrange(redis_client, KEYS.ready) == ["n"]
    assert await counts(redis_client, "g") == (1, 1, 0)
    assert await marks(redis_client, "g") == {"n": "@"}
    await assert_consistent(redis_client)


async def test_enqueue_over_a_groups_max_size_writes_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    await set_group(redis_client, "g", mx=2)
    await enqueue(redis_client, new("a1", "g"))
    before = await dump(redis_client)
    # The batch's third task of g would make 3 live tasks (2 allowed): the
    # whole batch is refused, the other group's task included.
    with pytest.raises(GroupFullRefusal) as refused:
        await enqueue(redis_client, new("u", "h"), new("a2", "g"), new("a3", "g"))
    assert (refused.value.index, refused.value.live, refused.value.cap) == (2, 2, 2)
    assert await dump(redis_client) == before
    # Delayed and running tasks count as live too.
    assert await enqueue(redis_client, new("d", "g", delay_ms=LONG_MS)) == ["d"]
    await claim_one(redis_client)
    with pytest.raises(GroupFullRefusal):
        await enqueue(redis_client, new("a2", "g"))
    await assert_consistent(redis_client)


async def _enqueue_args(tasks: Sequence[_scripts.NewTask], window_ms: int) -> list[Any]:
    recorder = Recorder([t.id.encode() for t in tasks])
    await _scripts.enqueue(
        cast("redis.asyncio.Redis", recorder),
        KEYS,
        tasks,
        dedup_window_ms=window_ms,
    )
    return list(recorder.args)


async def test_enqueue_malformed_arguments_write_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    good = new("a", "g")
    # Sentinels locate the second task's delay and max_attempts in the argv.
    bad = new("b", "g", delay_ms=7777, max_attempts=77)
    args = await _enqueue_args([good, bad], WINDOW_MS)
    # The wrapper sends every value as bytes (what redis-py would send).
    variants = {
        "delay": replaced(args, b"7777", "soon"),
        "max_attempts": replaced(args, b"77", "many"),
        "arity": args[:-1],
        "window": replaced(args, b"%d" % WINDOW_MS, "forever"),
        "count": replaced(args, b"2", "two"),
    }
    for name, argv in variants.items():
        with pytest.raises(ResponseError, match="malformed"):
            await redis_client.eval(_scripts.ENQUEUE.source.decode(), *argv)
        assert await redis_client.dbsize() == 0, name


async def test_enqueue_bad_dedup_window_writes_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    # Regression: a window of 0 used to pass validation, then SET PX 0 failed
    # at the second task, after the first one had been written.
    for window_ms in (0, -5):
        with pytest.raises(ResponseError, match="malformed"):
            await enqueue(
                redis_client, new("a", "g"), new("b", dedup="k"), window_ms=window_ms
            )
        assert await redis_client.dbsize() == 0
