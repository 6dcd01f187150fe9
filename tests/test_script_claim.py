"""``claim.lua`` through its wrapper: the order tasks are claimed in, the
recovery of expired leases and the promotion of due tasks it does first,
rate limits, priorities and expiry (which act at claim time), a re-sent
claim, and the damaged keys a claim meets."""

from __future__ import annotations

from typing import cast

import anyio
import pytest
import redis.asyncio
from redis.exceptions import ResponseError

from aiogroupq._store import scripts as _scripts
from aiogroupq._store.replies import FinishCode
from aiogroupq.errors import CorruptQueueError

from ._scripts_helpers import (
    KEYS,
    LONG_MS,
    WINDOW_MS,
    Recorder,
    assert_consistent,
    claim,
    claim_ids,
    claim_one,
    counts,
    decoded,
    dump,
    enqueue,
    expire_lease,
    fall_due,
    field,
    finish,
    get,
    hash_of,
    lrange,
    marks,
    new,
    ok,
    server_ms,
    set_group,
    smembers,
    stats,
    zmembers,
)
from ._tasks import envelope_of


async def test_claim_takes_k_tasks_in_order(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(
        redis_client,
        new("a1", "g1"),
        new("a2", "g1"),
        new("b1", "g2"),
        new("u1"),
        new("u2"),
        new("c1", "g3"),
    )
    reply = await claim(redis_client, "w1", k=4)
    assert [t.id for t in reply.tasks] == ["a1", "b1", "u1", "u2"]
    assert [t.envelope for t in reply.tasks] == [
        envelope_of("a1", "g1"),
        envelope_of("b1", "g2"),
        envelope_of("u1"),
        envelope_of("u2"),
    ]
    assert [t.attempt for t in reply.tasks] == [1, 1, 1, 1]
    assert [t.max_attempts for t in reply.tasks] == [3, 3, 3, 3]
    tokens = [t.token for t in reply.tasks]
    assert tokens == sorted(set(tokens))  # fresh and increasing
    assert await get(redis_client, KEYS.fence) == str(tokens[-1])
    assert reply.more  # c1 is still ready
    assert reply.wait_ms == -1  # nothing delayed
    assert (reply.dead, reply.problems) == ((), ())
    # Each grouped claim's slot mark is its fencing token.
    assert await marks(redis_client, "g1") == {"a1": str(tokens[0])}
    assert await marks(redis_client, "g2") == {"b1": str(tokens[1])}
    assert await field(redis_client, "a1", "k") == str(tokens[0])
    assert await field(redis_client, "a1", "c") == "w1"
    assert await field(redis_client, "a1", "s") == "running"
    assert await field(redis_client, "a1", "a") == "1"
    assert sorted(await zmembers(redis_client, KEYS.leases)) == [
        "a1",
        "b1",
        "u1",
        "u2",
    ]
    assert await smembers(redis_client, KEYS.inflight("w1")) == {
        "a1",
        "b1",
        "u1",
        "u2",
    }
    # a2 stays in g1's line behind a1; the next claim gets c1 only.
    assert await lrange(redis_client, KEYS.parked("g1")) == ["a2"]
    reply = await claim(redis_client, "w2", k=4)
    assert [t.id for t in reply.tasks] == ["c1"]
    assert not reply.more
    assert (await stats(redis_client))["started"] == 5
    await assert_consistent(redis_client)


async def test_claim_parks_an_unmarked_entry_of_a_busy_group(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"))
    await claim_one(redis_client)
    await enqueue(redis_client, new("a2", "g"), new("u"))
    # Enqueue parks a2 behind the running a1.
    assert await lrange(redis_client, KEYS.ready) == ["u"]
    assert await lrange(redis_client, KEYS.parked("g")) == ["a2"]
    # Should an entry of the busy group reach the ready list anyway, without
    # a slot mark (a state the scripts never make), the claim puts it back in
    # the group's line instead of running it beside a1.
    await redis_client.lrem(KEYS.parked("g"), 1, "a2")
    await redis_client.hset(KEYS.group("g"), "w", 0)
    await redis_client.hincrby(KEYS.stats, "parked", -1)
    await redis_client.lpush(KEYS.ready, "a2")
    reply = await claim(redis_client, k=4)
    assert [t.id for t in reply.tasks] == ["u"]
    assert await lrange(redis_client, KEYS.parked("g")) == ["a2"]
    assert await lrange(redis_client, KEYS.ready) == []
    assert await counts(redis_client, "g") == (1, 0, 1)
    await assert_consistent(redis_client)


async def test_claim_gives_a_free_slot_to_an_unmarked_entry(
    redis_client: redis.asyncio.Redis,
) -> None:
    # An unmarked entry of a group with a free slot and no line: it takes the
    # slot and runs.
    await enqueue(redis_client, new("a", "g"))
    await redis_client.delete(KEYS.group("g"))
    await redis_client.hincrby(KEYS.stats, "groups", -1)
    task = await claim_one(redis_client)
    assert task.id == "a"
    assert await marks(redis_client, "g") == {"a": str(task.token)}
    assert await counts(redis_client, "g") == (1, 0, 0)
    await assert_consistent(redis_client)


async def test_ungrouped_tasks_have_no_group_state(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, *(new(f"u{i}") for i in range(5)))
    reply = await claim(redis_client, k=5)
    assert [t.id for t in reply.tasks] == [f"u{i}" for i in range(5)]
    assert await redis_client.keys(KEYS.prefix + "grp:*") == []
    assert await finish(redis_client, *(ok(t) for t in reply.tasks)) == [1] * 5
    assert await redis_client.keys(KEYS.prefix + "grp:*") == []
    await assert_consistent(redis_client)


async def test_claim_returns_the_wait_until_the_next_due_task(
    redis_client: redis.asyncio.Redis,
) -> None:
    reply = await claim(redis_client)
    assert (reply.tasks, reply.wait_ms, reply.more) == ([], -1, False)
    await enqueue(redis_client, new("d", delay_ms=60_000))
    reply = await claim(redis_client)
    assert reply.tasks == []
    assert 0 < reply.wait_ms <= 60_001  # due rounds up, now rounds down
    assert reply.now_ms > 0
    await assert_consistent(redis_client)


async def test_claim_promotes_due_tasks_into_their_group_order(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("d", "g", delay_ms=5))
    a1 = await claim_one(redis_client)
    await anyio.sleep(0.05)  # d is due now (precondition, not a measurement)
    # d is promoted while a1 runs: it joins g's line behind a1.
    reply = await claim(redis_client)
    assert reply.tasks == []
    assert reply.wait_ms == -1
    assert await lrange(redis_client, KEYS.parked("g")) == ["d"]
    assert await field(redis_client, "d", "s") == "queued"
    assert await zmembers(redis_client, KEYS.delayed) == []
    assert await counts(redis_client, "g") == (1, 0, 1)  # d left the first delay
    await finish(redis_client, ok(a1))
    assert (await claim_one(redis_client)).id == "d"
    # An ungrouped due task is promoted and claimed in the same call.
    await enqueue(redis_client, new("u", delay_ms=5))
    await anyio.sleep(0.05)
    assert (await claim_one(redis_client)).id == "u"
    await assert_consistent(redis_client)


async def test_a_due_task_is_runnable_from_its_due_time(
    redis_client: redis.asyncio.Redis,
) -> None:
    # Pickup latency is the claim's time minus the task's due time: a retry
    # counts from the end of its backoff, never from its first enqueue, and
    # a delayed task from its due time, not from the claim that promoted it.
    await enqueue(redis_client, new("a", "g"), new("d", "h", delay_ms=LONG_MS))
    a = await claim_one(redis_client)
    await redis_client.hset(KEYS.task("a"), "dt", 1)  # enqueued long ago
    retry = _scripts.Outcome("a", a.token, "retry", LONG_MS, "err")
    assert await finish(redis_client, retry) == [FinishCode.APPLIED]
    due = await server_ms(redis_client) - 10_000
    for member in ("a", "d"):
        assert await redis_client.zadd(KEYS.delayed, {member: due}, xx=True, ch=True)
    reply = await claim(redis_client)
    assert [(t.id, t.due_ms) for t in reply.tasks] == [("a", due), ("d", due)]
    assert reply.now_ms > due
    await assert_consistent(redis_client)


async def test_a_grouped_claim_records_its_time_for_a_pause_to_wait_on(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"), new("u"))
    reply = await claim(redis_client)
    assert [t.id for t in reply.tasks] == ["a", "u"]
    assert await field(redis_client, "a", "cl") == str(reply.now_ms)
    assert await field(redis_client, "u", "cl") is None  # no group to pause
    await assert_consistent(redis_client)


async def test_claim_recovers_an_expired_lease_first(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("u"))
    first = await claim_one(redis_client, "dies", lease_ms=1)
    assert first.id == "a1"
    await anyio.sleep(0.05)  # past the lease
    # k=0: recovery only, so the state between recovery and claim is visible.
    assert (await claim(redis_client, "w", k=0)).tasks == []
    # a1 is its group's continuation: the front, keeping its slot.
    assert await lrange(redis_client, KEYS.ready) == ["a1", "u"]
    assert await marks(redis_client, "g") == {"a1": "@"}
    assert await lrange(redis_client, KEYS.parked("g")) == ["a2"]
    assert await field(redis_client, "a1", "s") == "queued"
    assert await field(redis_client, "a1", "a") == "1"  # the attempt counted
    assert await field(redis_client, "a1", "c") is None
    assert await zmembers(redis_client, KEYS.leases) == []
    assert not await redis_client.exists(KEYS.inflight("dies"))
    assert (await stats(redis_client))["recovered"] == 1
    await assert_consistent(redis_client)
    # The interrupted task runs again first, as attempt 2, with a new token.
    again = await claim_one(redis_client, "w")
    assert (again.id, again.attempt) == ("a1", 2)
    assert again.token > first.token
    # The dead consumer's late outcome and heartbeat are refused.
    assert await finish(redis_client, ok(first)) == [FinishCode.LEASE_LOST]
    assert await _scripts.heartbeat(
        redis_client, KEYS, [(first.id, first.token)], lease_ms=LONG_MS
    ) == [0]
    assert await field(redis_client, "a1", "s") == "running"
    await assert_consistent(redis_client)


async def test_claim_recovers_and_runs_in_one_call(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    await claim_one(redis_client, "dies", lease_ms=1)
    await anyio.sleep(0.05)
    reply = await claim(redis_client, "w", k=4)
    # Never a2: the recovered a1 holds the group's slot.
    assert [(t.id, t.attempt) for t in reply.tasks] == [("a1", 2)]
    await assert_consistent(redis_client)


async def test_lease_expired_on_last_attempt_dead_letters(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(
        redis_client, new("a1", "g", max_attempts=1), new("a2", "g"), new("u")
    )
    await claim_one(redis_client, "dies")
    await expire_lease(redis_client, "a1")
    reply = await claim(redis_client, "w", k=0)
    assert reply.dead == ("a1",)
    assert await field(redis_client, "a1", "s") == "dead"
    assert "lease expired" in (await field(redis_client, "a1", "x") or "")
    assert await zmembers(redis_client, KEYS.dead) == ["a1"]
    # The slot passed on to a2, which joins the ready tail (round-robin).
    assert await marks(redis_client, "g") == {"a2": "@"}
    assert await lrange(redis_client, KEYS.ready) == ["u", "a2"]
    assert await lrange(redis_client, KEYS.parked("g")) == []
    await assert_consistent(redis_client)
    assert await claim_ids(redis_client, "w") == ["u", "a2"]
    await assert_consistent(redis_client)


async def test_claim_resent_with_its_nonce_claims_nothing_more(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g1"), new("b", "g2"), new("c", "g3"))
    # Record one claim call's exact arguments (nonce included), then send
    # them twice, as redis-py does when it retries after a lost reply.
    recorder = Recorder([-1, 0, 0, [], [], []])
    await _scripts.claim(
        cast("redis.asyncio.Redis", recorder),
        KEYS,
        "c1",
        k=2,
        lease_ms=LONG_MS,
        scan_limit=100,
    )
    source = _scripts.CLAIM.source.decode()
    first = await redis_client.eval(source, *recorder.args)
    again = await redis_client.eval(source, *recorder.args)
    # Tasks from index 6 on, six values each: id, envelope, attempt, token, ...
    assert first[6:] == again[6:]
    assert [decoded(first[6]), decoded(first[12])] == ["a", "b"]
    assert await lrange(redis_client, KEYS.ready) == ["c"]  # not claimed twice
    assert await field(redis_client, "a", "a") == "1"
    assert (await stats(redis_client))["started"] == 2
    # A task finished since is not handed out again by a late re-send.
    await finish(redis_client, _scripts.Outcome("a", int(first[9]), "ok"))
    late = await redis_client.eval(source, *recorder.args)
    assert [decoded(x) for x in late[6::6]] == ["b"]
    # A new call (a new nonce) claims on.
    assert (await claim_one(redis_client)).id == "c"
    await assert_consistent(redis_client)


async def test_claim_with_a_bad_lease_claims_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"))
    before = await dump(redis_client)
    with pytest.raises(ResponseError, match="malformed"):
        await claim(redis_client, lease_ms=0)
    assert await dump(redis_client) == before
    await assert_consistent(redis_client)


# -- rate limits ----------------------------------------------------------


async def test_rate_limited_group_waits_for_its_window(
    redis_client: redis.asyncio.Redis,
) -> None:
    # One start per 200 ms.
    await set_group(redis_client, "g", rn=1, rp=200)
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("u"))
    a1 = await claim_one(redis_client)
    assert a1.id == "a1"
    assert await redis_client.llen(KEYS.rate("g")) == 1
    await finish(redis_client, ok(a1))
    # a2 is the head now, but the window's one start is used: held aside,
    # keeping its slot, with a "~g" wake-up due when the window ends.
    reply = await claim(redis_client)
    assert [t.id for t in reply.tasks] == ["u"]
    assert await lrange(redis_client, KEYS.held("g")) == ["a2"]
    assert await marks(redis_client, "g") == {"a2": "~"}
    assert await zmembers(redis_client, KEYS.delayed) == ["~g"]
    assert 0 <= reply.wait_ms <= 200
    assert (await stats(redis_client))["ratewait"] == 1
    await assert_consistent(redis_client)
    await anyio.sleep(0.25)  # past the window (a precondition)
    reply = await claim(redis_client)
    assert [t.id for t in reply.tasks] == ["a2"]
    assert await zmembers(redis_client, KEYS.delayed) == []
    assert (await stats(redis_client)).get("ratewait", 0) == 0
    await assert_consistent(redis_client)


# -- priorities -----------------------------------------------------------


async def test_higher_priority_first_fifo_within_a_level(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(
        redis_client,
        new("low1"),
        new("high1", priority=9),
        new("mid1", "g1", priority=5),
        new("high2", priority=9),
        new("low2"),
        new("mid2", "g2", priority=5),
    )
    assert await hash_of(redis_client, KEYS.conf) == {"pu": "1"}
    assert await field(redis_client, "high1", "p") == "9"
    assert await field(redis_client, "low1", "p") is None
    assert sorted(await zmembers(redis_client, KEYS.pready)) == sorted(
        ["low1", "high1", "mid1", "high2", "low2", "mid2"]
    )
    reply = await claim(redis_client)
    assert [t.id for t in reply.tasks] == [
        "high1",
        "high2",
        "mid1",
        "mid2",
        "low1",
        "low2",
    ]
    await assert_consistent(redis_client)


async def test_a_group_with_several_slots_waits_at_its_groups_level(
    redis_client: redis.asyncio.Redis,
) -> None:
    # Its heads would otherwise wait at their own levels, and a later one of
    # higher priority could start before an earlier one of lower priority.
    await set_group(redis_client, "g", c=2)
    await enqueue(
        redis_client,
        new("a1", "g", priority=1),
        new("a2", "g", priority=9),
        new("u", priority=5),
    )
    assert await claim_ids(redis_client) == ["u", "a1", "a2"]
    await assert_consistent(redis_client)
    # With a priority of its own, the group's heads all wait at that level.
    await set_group(redis_client, "h", c=2, pr=7)
    await enqueue(
        redis_client, new("b1", "h"), new("b2", "h", priority=0), new("v", priority=5)
    )
    assert await claim_ids(redis_client) == ["b1", "b2", "v"]
    await assert_consistent(redis_client)


async def test_a_released_group_keeps_its_level(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g", priority=9), new("a2", "g", priority=9))
    await enqueue(redis_client, new("u", priority=5))
    a1 = await claim_one(redis_client)
    await finish(redis_client, ok(a1))
    # a2 joins the tail of level 9, which is before u's level.
    assert await claim_ids(redis_client) == ["a2", "u"]
    await assert_consistent(redis_client)


# -- expiry ---------------------------------------------------------------


async def test_expired_head_ends_expired_and_its_group_moves_on(
    redis_client: redis.asyncio.Redis,
) -> None:
    # Expiry time 1 (Unix ms): long past, so the task must never start.
    await enqueue(redis_client, new("a1", "g", expire_at_ms=1), new("a2", "g"))
    assert await field(redis_client, "a1", "xp") == "1"
    reply = await claim(redis_client)
    assert [t.id for t in reply.tasks] == ["a2"]
    assert await field(redis_client, "a1", "s") == "expired"
    assert (await field(redis_client, "a1", "x") or "").startswith("Expired")
    assert await field(redis_client, "a1", "a") == "0"  # never started
    assert await field(redis_client, "a1", "e") is None
    assert 0 < await redis_client.pttl(KEYS.task("a1")) <= WINDOW_MS
    assert (await stats(redis_client))["expired"] == 1
    await assert_consistent(redis_client)
    # A delayed task that expires before its due time ends at its promotion.
    await enqueue(redis_client, new("d", "g", delay_ms=LONG_MS, expire_at_ms=1))
    await fall_due(redis_client, "d")
    assert await claim_ids(redis_client) == []
    assert await field(redis_client, "d", "s") == "expired"
    await assert_consistent(redis_client)


async def test_expiry_applies_only_before_the_first_start(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g", expire_at_ms=10**13))
    task = await claim_one(redis_client)
    assert await field(redis_client, "a", "xp") is None  # cleared by the start
    retry = _scripts.Outcome("a", task.token, "retry", 0, "err")
    assert await finish(redis_client, retry) == [FinishCode.APPLIED]
    assert (await claim_one(redis_client)).attempt == 2
    await assert_consistent(redis_client)


# -- damaged keys ---------------------------------------------------------


async def test_a_non_integer_fence_makes_claims_refuse_losing_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("u"))
    await redis_client.set(KEYS.fence, "twelve")
    before = await dump(redis_client)
    with pytest.raises(CorruptQueueError) as refused:
        await claim(redis_client)
    assert refused.value.key == KEYS.fence
    # Nothing was popped from the ready list: no task is lost.
    assert await dump(redis_client) == before
    await redis_client.set(KEYS.fence, 7)
    reply = await claim(redis_client)
    assert [(t.id, t.token) for t in reply.tasks] == [("a1", 8), ("u", 9)]
    await assert_consistent(redis_client)


@pytest.mark.parametrize("missing", ["e", "m", "s"])
async def test_a_task_hash_missing_fields_is_dead_lettered(
    redis_client: redis.asyncio.Redis, missing: str
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("u"))
    await redis_client.hdel(KEYS.task("a1"), missing)
    reply = await claim(redis_client)
    # a1 is dead-lettered as corrupt, and its group moves on to a2 at once.
    assert reply.dead == ("a1",)
    assert [t.id for t in reply.tasks] == ["u", "a2"]
    assert await field(redis_client, "a1", "s") == "dead"
    reason = await field(redis_client, "a1", "x") or ""
    assert reason.startswith("Corrupt: the task hash lacks fields"), reason
    assert await zmembers(redis_client, KEYS.dead) == ["a1"]
    assert await marks(redis_client, "g") == {"a2": str(reply.tasks[1].token)}
    await assert_consistent(redis_client)


async def test_a_delayed_task_missing_fields_is_dead_lettered_at_promotion(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("d", "g", delay_ms=LONG_MS), new("a", "g"))
    a = await claim_one(redis_client)
    retry = _scripts.Outcome("a", a.token, "retry", LONG_MS, "err")
    await finish(redis_client, retry)
    await redis_client.hdel(KEYS.task("d"), "m")
    await redis_client.hset(KEYS.task("a"), "m", "many")
    await fall_due(redis_client, "d")
    await fall_due(redis_client, "a")
    reply = await claim(redis_client)
    assert sorted(reply.dead) == ["a", "d"]
    assert reply.tasks == []
    # Both ended; the group's state is gone with them.
    assert not await redis_client.exists(KEYS.group("g"))
    await assert_consistent(redis_client)


async def test_damaged_entries_in_lists_are_dropped_and_reported(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"))
    # An entry that is not a task id, and one whose task key is not a hash.
    await redis_client.rpush(KEYS.ready, "\x00\xff")
    await redis_client.set(KEYS.task("s"), "damage")
    await redis_client.rpush(KEYS.ready, "s")
    await redis_client.zadd(KEYS.delayed, {"s": 0})
    reply = await claim(redis_client)
    assert [t.id for t in reply.tasks] == ["a"]
    assert len(reply.problems) == 3, reply.problems
    assert await lrange(redis_client, KEYS.ready) == []
    assert await zmembers(redis_client, KEYS.delayed) == []
