"""``finish.lua`` through its wrapper: each kind of outcome, fencing, a
re-sent or malformed batch, where a released group's next task goes
(fairness), the counters every end bumps, and the damaged keys a finish
meets."""

from __future__ import annotations

from typing import cast

import anyio
import pytest
import redis.asyncio
from redis.exceptions import ResponseError

from aiogroupq._store import scripts as _scripts
from aiogroupq._store.replies import FinishCode, GroupCorruptRefusal

from ._scripts_helpers import (
    KEYS,
    WINDOW_MS,
    Recorder,
    assert_consistent,
    claim,
    claim_ids,
    claim_one,
    control,
    counts,
    dump,
    enqueue,
    expire_lease,
    field,
    finish,
    get,
    group_of,
    lrange,
    marks,
    new,
    ok,
    replaced,
    smembers,
    stats,
    zmembers,
)

# -- fairness: round-robin and drain --------------------------------------


async def test_released_group_goes_to_the_ready_tail(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(
        redis_client, new("a1", "g"), new("a2", "g"), new("a3", "g"), new("b1", "h")
    )
    await enqueue(redis_client, new("u"))
    a1 = await claim_one(redis_client)
    assert await lrange(redis_client, KEYS.ready) == ["b1", "u"]
    assert await finish(redis_client, ok(a1)) == [FinishCode.APPLIED]
    # Round-robin: g's next task waits behind every group already waiting,
    # even u, enqueued after it.
    assert await lrange(redis_client, KEYS.ready) == ["b1", "u", "a2"]
    assert await marks(redis_client, "g") == {"a2": "@"}
    assert await lrange(redis_client, KEYS.parked("g")) == ["a3"]
    assert await field(redis_client, "a1", "s") == "succeeded"
    assert await field(redis_client, "a1", "e") is None
    assert 0 < await redis_client.pttl(KEYS.task("a1")) <= WINDOW_MS
    assert await zmembers(redis_client, KEYS.leases) == []
    await assert_consistent(redis_client)
    assert await claim_ids(redis_client) == ["b1", "u", "a2"]
    await assert_consistent(redis_client)


async def test_drain_fairness_sends_a_released_group_to_the_front(
    redis_client: redis.asyncio.Redis,
) -> None:
    await control(redis_client, "queue", "drain", "", "", "", "")
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("b1", "h"))
    await enqueue(redis_client, new("u"))
    a1 = await claim_one(redis_client)
    await finish(redis_client, ok(a1))
    assert await lrange(redis_client, KEYS.ready) == ["a2", "b1", "u"]
    await assert_consistent(redis_client)
    # Back to round-robin: the next release goes to the tail again.
    await control(redis_client, "queue", "", "", "", "", "")
    await enqueue(redis_client, new("a3", "g"))
    a2 = await claim_one(redis_client)
    await finish(redis_client, ok(a2))
    assert await lrange(redis_client, KEYS.ready) == ["b1", "u", "a3"]
    await assert_consistent(redis_client)


async def test_last_task_of_a_group_removes_its_state(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    for expected in ("a1", "a2"):
        task = await claim_one(redis_client)
        assert task.id == expected
        await finish(redis_client, ok(task))
    assert not await redis_client.exists(KEYS.group("g"))
    assert not await redis_client.exists(KEYS.parked("g"))
    assert await zmembers(redis_client, KEYS.backlog) == []
    assert await zmembers(redis_client, KEYS.waiting) == []
    assert (await stats(redis_client)).get("groups", 0) == 0
    await assert_consistent(redis_client)


# -- outcomes -------------------------------------------------------------


async def test_finish_retry_with_delay_keeps_the_slot(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    retry = _scripts.Outcome("a1", a1.token, "retry", 50, "ValueError: boom")
    assert await finish(redis_client, retry) == [FinishCode.APPLIED]
    assert await field(redis_client, "a1", "s") == "delayed"
    assert await field(redis_client, "a1", "x") == "ValueError: boom"
    assert await zmembers(redis_client, KEYS.delayed) == ["a1"]
    assert await marks(redis_client, "g") == {"a1": "r"}
    assert await counts(redis_client, "g") == (1, 0, 1)
    assert (await stats(redis_client))["retried"] == 1
    await assert_consistent(redis_client)
    # During the backoff nothing of g runs, and a new task of g waits too.
    reply = await claim(redis_client)
    assert reply.tasks == []
    assert reply.wait_ms >= 0
    await enqueue(redis_client, new("a3", "g"))
    assert await lrange(redis_client, KEYS.parked("g")) == ["a2", "a3"]
    await assert_consistent(redis_client)
    await anyio.sleep(0.1)  # past the backoff
    reply = await claim(redis_client, k=4)
    assert [(t.id, t.attempt) for t in reply.tasks] == [("a1", 2)]
    assert await lrange(redis_client, KEYS.parked("g")) == ["a2", "a3"]
    await finish(redis_client, ok(reply.tasks[0]))
    assert [t.id for t in (await claim(redis_client, k=4)).tasks] == ["a2"]
    await assert_consistent(redis_client)


async def test_finish_retry_without_delay_goes_to_the_front(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("u"))
    a1 = await claim_one(redis_client)
    retry = _scripts.Outcome("a1", a1.token, "retry", 0, "err")
    assert await finish(redis_client, retry) == [FinishCode.APPLIED]
    assert await lrange(redis_client, KEYS.ready) == ["a1", "u"]
    assert await marks(redis_client, "g") == {"a1": "@"}
    await assert_consistent(redis_client)
    again = await claim_one(redis_client)
    assert (again.id, again.attempt) == ("a1", 2)
    await assert_consistent(redis_client)


async def test_finish_dead_letters_and_passes_the_slot_on(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    dead = _scripts.Outcome("a1", a1.token, "dead", "bad input", "Traceback ...")
    assert await finish(redis_client, dead) == [FinishCode.APPLIED]
    assert await field(redis_client, "a1", "s") == "dead"
    assert await field(redis_client, "a1", "x") == "bad input"
    assert await field(redis_client, "a1", "tb") == "Traceback ..."
    assert await field(redis_client, "a1", "e") is not None  # kept to requeue
    assert await zmembers(redis_client, KEYS.dead) == ["a1"]
    assert await lrange(redis_client, KEYS.ready) == ["a2"]
    assert await marks(redis_client, "g") == {"a2": "@"}
    assert (await stats(redis_client))["dead"] == 1
    await assert_consistent(redis_client)


async def test_finish_halt_stops_the_group_until_released(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    halt = _scripts.Outcome("a1", a1.token, "halt", "bad input", "")
    assert await finish(redis_client, halt) == [FinishCode.APPLIED]
    assert await group_of(redis_client, "g") == {
        "k": "0",
        "d": "0",
        "w": "1",
        "!": "a1",
    }
    assert await smembers(redis_client, KEYS.halted) == {"g"}
    assert await claim_ids(redis_client) == []
    await enqueue(redis_client, new("a3", "g"))
    assert await lrange(redis_client, KEYS.parked("g")) == ["a2", "a3"]
    await assert_consistent(redis_client)
    # Released: the group goes on with its next task; a1 stays dead.
    assert await _scripts.dead_action(redis_client, KEYS, "release", ["g"]) == 1
    assert await smembers(redis_client, KEYS.halted) == set()
    assert await claim_ids(redis_client) == ["a2"]
    assert await field(redis_client, "a1", "s") == "dead"
    await assert_consistent(redis_client)


async def test_finish_back_does_not_count_the_attempt(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("u"))
    a1 = await claim_one(redis_client)
    back = _scripts.Outcome("a1", a1.token, "back")
    assert await finish(redis_client, back) == [FinishCode.APPLIED]
    assert await field(redis_client, "a1", "a") == "0"
    assert await field(redis_client, "a1", "s") == "queued"
    assert await lrange(redis_client, KEYS.ready) == ["a1", "u"]
    assert await marks(redis_client, "g") == {"a1": "@"}
    await assert_consistent(redis_client)
    again = await claim_one(redis_client)
    assert (again.id, again.attempt) == ("a1", 1)
    await assert_consistent(redis_client)


@pytest.mark.parametrize("kind", ["retry", "back"])
async def test_a_task_runnable_again_at_once_keeps_its_priority(
    redis_client: redis.asyncio.Redis, kind: _scripts.OutcomeKind
) -> None:
    # Handed back, or retried without a delay, a task goes back to the front
    # at its own priority: before the lower ones waiting, behind none.
    await enqueue(redis_client, new("hi", priority=5))
    await enqueue(redis_client, *(new(f"lo{i}", priority=3) for i in range(3)))
    hi = await claim_one(redis_client)
    assert hi.id == "hi"
    outcome = _scripts.Outcome("hi", hi.token, kind, 0, "err")
    assert await finish(redis_client, outcome) == [FinishCode.APPLIED]
    assert await claim_ids(redis_client) == ["hi", "lo0", "lo1", "lo2"]
    await assert_consistent(redis_client)


async def test_finish_with_a_stale_token_changes_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    before = await dump(redis_client)
    kinds: list[tuple[_scripts.OutcomeKind, str | int]] = [
        ("ok", ""),
        ("retry", 0),
        ("dead", "x"),
        ("back", ""),
    ]
    for kind, arg1 in kinds:
        stale = _scripts.Outcome("a1", a1.token + 1000, kind, arg1)
        assert await finish(redis_client, stale) == [FinishCode.LEASE_LOST], kind
        assert await dump(redis_client) == before, kind
    unknown = _scripts.Outcome("nope", 1, "ok")
    assert await finish(redis_client, unknown) == [FinishCode.LEASE_LOST]
    assert await dump(redis_client) == before
    await assert_consistent(redis_client)


async def test_finish_resent_batch_is_recognised(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("b", "h"))
    reply = await claim(redis_client, k=2)
    a1, b = reply.tasks
    batch = [ok(a1), _scripts.Outcome("b", b.token, "retry", 0, "err")]
    assert await finish(redis_client, *batch) == [1, 1]
    # Both groups move on: b runs again, a2 runs (tokens change again).
    reply = await claim(redis_client, k=2)
    assert sorted(t.id for t in reply.tasks) == ["a2", "b"]
    before = await dump(redis_client)
    # The reply was lost and the batch is sent again: recognised, not applied.
    assert await finish(redis_client, *batch) == [FinishCode.DUPLICATE] * 2
    assert await dump(redis_client) == before
    await assert_consistent(redis_client)


async def test_finish_resent_batch_without_retention_is_recognised(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"))
    # Regression: retention 0 used to delete the hash at once, and a re-sent
    # batch was then answered LEASE_LOST (0), as if the lease had been lost.
    task = await claim_one(redis_client)
    assert await finish(redis_client, ok(task), retention_ms=0) == [1]
    assert await finish(redis_client, ok(task), retention_ms=0) == [2]
    assert await field(redis_client, "a", "s") == "succeeded"
    assert await redis_client.pttl(KEYS.task("a")) > 0  # it still expires


async def test_finish_malformed_batch_changes_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("b1", "h"))
    a1, b1 = (await claim(redis_client, k=2)).tasks
    before = await dump(redis_client)
    # The first outcome is valid, the second is not: neither is applied.
    unknown = [ok(a1), _scripts.Outcome("b1", b1.token, "explode")]  # type: ignore[arg-type]
    with pytest.raises(ResponseError, match="unknown outcome"):
        await finish(redis_client, *unknown)
    assert await dump(redis_client) == before
    recorder = Recorder([1, 1])
    await _scripts.finish(
        cast("redis.asyncio.Redis", recorder),
        KEYS,
        [ok(a1), _scripts.Outcome("b1", b1.token, "retry", 424242, "err")],
        retention_ms=WINDOW_MS,
    )
    argv = replaced(recorder.args, 424242, "later")
    with pytest.raises(ResponseError, match="malformed"):
        await redis_client.eval(_scripts.FINISH.source.decode(), *argv)
    assert await dump(redis_client) == before
    await assert_consistent(redis_client)


# -- counters -------------------------------------------------------------


async def test_stats_count_every_kind_of_end(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(
        redis_client,
        new("ok"),
        new("retry"),
        new("dead"),
        new("lost", max_attempts=2),
        new("cancel"),
        new("expire", expire_at_ms=1),
        new("a1", "g"),
        new("a2", "g"),
    )
    reply = await claim(redis_client)
    by_id = {t.id: t for t in reply.tasks}
    assert sorted(by_id) == ["a1", "cancel", "dead", "lost", "ok", "retry"]
    await _scripts.cancel(redis_client, KEYS, "cancel", retention_ms=WINDOW_MS)
    codes = await finish(
        redis_client,
        ok(by_id["ok"]),
        _scripts.Outcome("retry", by_id["retry"].token, "retry", 0, "err"),
        _scripts.Outcome("dead", by_id["dead"].token, "dead", "x", ""),
        _scripts.Outcome("cancel", by_id["cancel"].token, "back"),
    )
    assert codes == [1, 1, 1, 3]
    await expire_lease(redis_client, "lost")
    await claim(redis_client, k=0)  # recovers "lost"
    assert await stats(redis_client) == {
        "enqueued": 8,
        "started": 6,
        "succeeded": 1,
        "retried": 1,
        "dead": 1,
        "cancelled": 1,
        "expired": 1,
        "recovered": 1,
        "parked": 1,  # a2, behind the running a1
        "groups": 1,
    }
    await assert_consistent(redis_client)


# -- damaged keys ---------------------------------------------------------


async def test_a_wrong_typed_group_key_harms_only_its_group(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(
        redis_client, new("b1", "h"), new("a1", "g"), new("a2", "g"), new("u1")
    )
    b1 = await claim_one(redis_client)
    await redis_client.set(KEYS.group("g"), "damage")
    await redis_client.set(KEYS.group("h"), "damage")
    # Tasks of other groups are still enqueued; one of the damaged group is
    # refused, with nothing written.
    assert await enqueue(redis_client, new("c1", "k")) == ["c1"]
    before = await dump(redis_client)
    with pytest.raises(GroupCorruptRefusal) as refused:
        await enqueue(redis_client, new("c2", "k"), new("a3", "g"))
    assert refused.value.index == 1
    assert await dump(redis_client) == before
    # The claim dead-letters the damaged group's head and runs the others.
    reply = await claim(redis_client)
    assert [t.id for t in reply.tasks] == ["u1", "c1"]
    assert reply.dead == ("a1",)
    assert await field(redis_client, "a1", "s") == "dead"
    reason = await field(redis_client, "a1", "x") or ""
    assert reason.startswith("Corrupt: a key of group g is damaged"), reason
    # A running task of a damaged group ends on its own (code 4); a failure
    # of one is dead-lettered as corrupt instead of retried.
    assert await finish(redis_client, ok(b1)) == [FinishCode.GROUP_DAMAGED]
    assert await field(redis_client, "b1", "s") == "succeeded"
    await enqueue(redis_client, new("b2", "h2"))
    b2 = await claim_one(redis_client)
    await redis_client.set(KEYS.group("h2"), "damage")
    retry = _scripts.Outcome("b2", b2.token, "retry", 0, "err")
    assert await finish(redis_client, retry) == [FinishCode.GROUP_DAMAGED]
    assert (await field(redis_client, "b2", "x") or "").startswith("Corrupt:")
    assert await zmembers(redis_client, KEYS.dead) == ["a1", "b2"]


async def test_a_finish_batch_applies_all_but_a_damaged_task(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"), new("b", "h"), new("c"))
    a, b, c = (await claim(redis_client)).tasks
    await redis_client.delete(KEYS.task("b"))
    await redis_client.set(KEYS.task("b"), "damage")
    codes = await finish(redis_client, ok(a), ok(b), ok(c))
    assert codes == [FinishCode.APPLIED, FinishCode.TASK_DAMAGED, FinishCode.APPLIED]
    assert await field(redis_client, "a", "s") == "succeeded"
    assert await field(redis_client, "c", "s") == "succeeded"
    assert await get(redis_client, KEYS.task("b")) == "damage"


async def test_a_handed_back_task_with_junk_attempts_fails_no_batch(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"), new("b", "h"), new("c"))
    a, b, c = (await claim(redis_client)).tasks
    await redis_client.hset(KEYS.task("b"), "a", "junk")
    codes = await finish(
        redis_client, ok(a), _scripts.Outcome("b", b.token, "back"), ok(c)
    )
    assert codes == [FinishCode.APPLIED] * 3
    assert await field(redis_client, "c", "s") == "succeeded"
    # b went back to the front of its group; the next claim finds its hash
    # damaged and dead-letters it, and its group moves on.
    assert await field(redis_client, "b", "s") == "queued"
    reply = await claim(redis_client)
    assert reply.dead == ("b",)
    # A lost claim reply gives back a task the same way (uncounted).
    await enqueue(redis_client, new("d", "h"))
    d = await claim_one(redis_client, "w")
    await redis_client.hset(KEYS.task("d"), "a", "junk")
    assert await _scripts.recover(redis_client, KEYS, "w", counted=False) == (1, ())
    assert await field(redis_client, "d", "s") == "queued"
    assert d.id == "d"
