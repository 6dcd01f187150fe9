"""Each Lua script driven directly through its ``_scripts`` wrapper.

Every scenario inspects the keys the scripts leave behind (ready list, parked
lists, locks, delayed set, leases, recovery keys, task hashes) and ends with
:func:`aiogroupq._fsck.check` finding nothing wrong. Lease expiry is real: a
claim with a tiny lease, then a sleep past it (the sleep is a precondition,
never a measured duration).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest
import redis.asyncio
from redis.exceptions import ResponseError

from aiogroupq import _fsck, _scripts
from aiogroupq._keys import QueueKeys

if TYPE_CHECKING:
    from redis.typing import EncodableT

KEYS = QueueKeys("scripts")
#: a lease nobody outlives in a test
LONG_MS = 600_000
#: the dedup window and retention of the tests (never reached)
WINDOW_MS = 600_000


# -- helpers ---------------------------------------------------------------


def new(
    task_id: str,
    group: str | None = None,
    *,
    delay_ms: int = 0,
    max_attempts: int = 3,
    dedup: str | None = None,
) -> _scripts.NewTask:
    """A task whose envelope names it, so a claim's reply can be checked."""
    return _scripts.NewTask(
        id=task_id,
        group=group,
        envelope=b"env:" + task_id.encode(),
        delay_ms=delay_ms,
        max_attempts=max_attempts,
        dedup_key=dedup,
    )


async def enqueue(
    client: redis.asyncio.Redis, *tasks: _scripts.NewTask, window_ms: int = WINDOW_MS
) -> list[str]:
    """Enqueue *tasks* in one call."""
    return await _scripts.enqueue(client, KEYS, tasks, dedup_window_ms=window_ms)


async def claim(
    client: redis.asyncio.Redis,
    consumer: str = "c1",
    *,
    k: int = 10,
    lease_ms: int = LONG_MS,
) -> _scripts.ClaimReply:
    """Claim up to *k* tasks for *consumer*."""
    return await _scripts.claim(
        client, KEYS, consumer, k=k, lease_ms=lease_ms, scan_limit=1000
    )


async def claim_one(
    client: redis.asyncio.Redis, consumer: str = "c1", *, lease_ms: int = LONG_MS
) -> _scripts.Claimed:
    """Claim exactly one task (the test's precondition)."""
    reply = await claim(client, consumer, k=1, lease_ms=lease_ms)
    assert len(reply.tasks) == 1, reply
    return reply.tasks[0]


async def finish(
    client: redis.asyncio.Redis,
    *outcomes: _scripts.Outcome,
    retention_ms: int = WINDOW_MS,
) -> list[int]:
    """Apply *outcomes* in one call."""
    return await _scripts.finish(client, KEYS, outcomes, retention_ms=retention_ms)


def ok(task: _scripts.Claimed) -> _scripts.Outcome:
    """The "succeeded" outcome of *task*'s attempt."""
    return _scripts.Outcome(task.id, task.token, "ok")


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def lrange(client: redis.asyncio.Redis, key: str) -> list[str]:
    """A whole list, decoded."""
    return [_s(v) for v in await client.lrange(key, 0, -1)]


async def zmembers(client: redis.asyncio.Redis, key: str) -> list[str]:
    """A sorted set's members in score order, decoded."""
    return [_s(v) for v in await client.zrange(key, 0, -1)]


async def get(client: redis.asyncio.Redis, key: str) -> str | None:
    """A string value, decoded, or None."""
    value = await client.get(key)
    return None if value is None else _s(value)


async def field(client: redis.asyncio.Redis, task_id: str, name: str) -> str | None:
    """One field of a task hash, decoded, or None."""
    value = await client.hget(KEYS.task(task_id), name)
    return None if value is None else _s(value)


async def server_ms(client: redis.asyncio.Redis) -> int:
    """The server's clock, which the scripts use."""
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def dump(client: redis.asyncio.Redis) -> dict[str, Any]:
    """Every key of the database with its value, to prove "nothing changed"."""
    out: dict[str, Any] = {}
    for raw in sorted(await client.keys("*")):
        key = _s(raw)
        kind = _s(await client.type(raw))
        if kind == "string":
            out[key] = await client.get(raw)
        elif kind == "list":
            out[key] = await client.lrange(raw, 0, -1)
        elif kind == "set":
            out[key] = sorted(await client.smembers(raw))
        elif kind == "zset":
            out[key] = await client.zrange(raw, 0, -1, withscores=True)
        elif kind == "hash":
            out[key] = await client.hgetall(raw)
        else:
            out[key] = kind
    return out


async def assert_consistent(client: redis.asyncio.Redis) -> None:
    """The queue's keys keep every invariant (see :mod:`aiogroupq._fsck`)."""
    assert await _fsck.check(client, KEYS) == []


class _Recorder:
    """Stands in for a client to capture the exact EVALSHA arguments a wrapper
    builds, so malformed variants can be made without hard-coding the layout."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.args: tuple[Any, ...] = ()

    async def evalsha(self, sha: str, numkeys: int, *args: Any) -> Any:
        self.args = (numkeys, *args)
        return self.reply


def replaced(args: Sequence[Any], old: object, new: EncodableT) -> list[Any]:
    """*args* with the one argument equal to *old* replaced by *new*."""
    assert sum(1 for a in args if a == old) == 1, (old, args)
    return [new if a == old else a for a in args]


# -- enqueue ---------------------------------------------------------------


async def test_enqueue_routes_heads_and_parks_the_rest(
    redis_client: redis.asyncio.Redis,
) -> None:
    ids = await enqueue(
        redis_client, new("a1", "g1"), new("a2", "g1"), new("u1"), new("b1", "g2")
    )
    assert ids == ["a1", "a2", "u1", "b1"]
    # One entry per group in the ready list, marked as the group's head; the
    # second task of g1 waits in g1's parked list.
    assert await lrange(redis_client, KEYS.ready) == ["a1", "u1", "b1"]
    assert await lrange(redis_client, KEYS.parked("g1")) == ["a2"]
    assert await get(redis_client, KEYS.lock("g1")) == "@a1"
    assert await get(redis_client, KEYS.lock("g2")) == "@b1"
    assert await redis_client.hgetall(KEYS.task("a2")) == {
        b"e": b"env:a2",
        b"m": b"3",
        b"a": b"0",
        b"s": b"queued",
        b"g": b"g1",
    }
    # An ungrouped task has no group field and takes no lock.
    assert await field(redis_client, "u1", "g") is None
    assert await redis_client.llen(KEYS.wake) >= 1
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
    assert await finish(redis_client, ok(task)) == [_scripts.APPLIED]
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
    assert await lrange(redis_client, KEYS.ready) == []
    # A delayed task joins its group when due: it holds no lock meanwhile, so
    # a later undelayed task of the group is not stuck behind it.
    assert await get(redis_client, KEYS.lock("g")) is None
    await enqueue(redis_client, new("n", "g"))
    assert await lrange(redis_client, KEYS.ready) == ["n"]
    assert await get(redis_client, KEYS.lock("g")) == "@n"
    await assert_consistent(redis_client)


async def _enqueue_args(tasks: Sequence[_scripts.NewTask], window_ms: int) -> list[Any]:
    recorder = _Recorder([t.id.encode() for t in tasks])
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
    variants = {
        "delay": replaced(args, 7777, "soon"),
        "max_attempts": replaced(args, 77, "many"),
        "arity": args[:-1],
        "window": replaced(args, WINDOW_MS, "forever"),
        "count": replaced(args, 2, "two"),
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


# -- claim -----------------------------------------------------------------


async def test_claim_takes_k_tasks_of_distinct_groups(
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
        b"env:a1",
        b"env:b1",
        b"env:u1",
        b"env:u2",
    ]
    assert [t.attempt for t in reply.tasks] == [1, 1, 1, 1]
    tokens = [t.token for t in reply.tasks]
    assert tokens == sorted(set(tokens))  # fresh and increasing
    assert reply.more  # c1 is still ready
    assert reply.wait_ms == -1  # nothing delayed
    # Each grouped claim holds its group with its fencing token.
    assert await get(redis_client, KEYS.lock("g1")) == str(tokens[0])
    assert await get(redis_client, KEYS.lock("g2")) == str(tokens[1])
    assert await field(redis_client, "a1", "k") == str(tokens[0])
    assert await field(redis_client, "a1", "c") == "w1"
    assert await field(redis_client, "a1", "s") == "running"
    assert sorted(await zmembers(redis_client, KEYS.leases)) == [
        "a1",
        "b1",
        "u1",
        "u2",
    ]
    assert sorted(_s(m) for m in await redis_client.smembers(KEYS.inflight("w1"))) == [
        "a1",
        "b1",
        "u1",
        "u2",
    ]
    # a2 stays parked behind a1; the next claim gets c1 only.
    assert await lrange(redis_client, KEYS.parked("g1")) == ["a2"]
    reply = await claim(redis_client, "w2", k=4)
    assert [t.id for t in reply.tasks] == ["c1"]
    assert not reply.more
    await assert_consistent(redis_client)


async def test_claim_parks_an_entry_of_a_busy_group(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"))
    await claim_one(redis_client)
    await enqueue(redis_client, new("a2", "g"), new("u"))
    # Enqueue parks a2 behind the running a1.
    assert await lrange(redis_client, KEYS.ready) == ["u"]
    assert await lrange(redis_client, KEYS.parked("g")) == ["a2"]
    # Should an entry of the busy group reach the ready list anyway (a state
    # the scripts never make), the claim parks it instead of running it.
    await redis_client.lrem(KEYS.parked("g"), 1, "a2")
    await redis_client.lpush(KEYS.ready, "a2")
    reply = await claim(redis_client, k=4)
    assert [t.id for t in reply.tasks] == ["u"]
    assert await lrange(redis_client, KEYS.parked("g")) == ["a2"]
    assert await lrange(redis_client, KEYS.ready) == []
    await assert_consistent(redis_client)


async def test_ungrouped_tasks_take_no_lock(redis_client: redis.asyncio.Redis) -> None:
    await enqueue(redis_client, *(new(f"u{i}") for i in range(5)))
    reply = await claim(redis_client, k=5)
    assert [t.id for t in reply.tasks] == [f"u{i}" for i in range(5)]
    assert await redis_client.keys(KEYS.prefix + "lock:*") == []
    assert await finish(redis_client, *(ok(t) for t in reply.tasks)) == [1] * 5
    assert await redis_client.keys(KEYS.prefix + "lock:*") == []
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
    await assert_consistent(redis_client)


async def test_claim_promotes_due_tasks_into_their_group_order(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("d", "g", delay_ms=5))
    a1 = await claim_one(redis_client)
    await anyio.sleep(0.05)  # d is due now (precondition, not a measurement)
    # d is promoted while a1 runs: it joins g behind a1 (parked).
    reply = await claim(redis_client)
    assert reply.tasks == []
    assert reply.wait_ms == -1
    assert await lrange(redis_client, KEYS.parked("g")) == ["d"]
    assert await field(redis_client, "d", "s") == "queued"
    assert await zmembers(redis_client, KEYS.delayed) == []
    await finish(redis_client, ok(a1))
    assert (await claim_one(redis_client)).id == "d"
    # An ungrouped due task is promoted and claimed in the same call.
    await enqueue(redis_client, new("u", delay_ms=5))
    await anyio.sleep(0.05)
    assert (await claim_one(redis_client)).id == "u"
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
    assert await lrange(redis_client, KEYS.ready) == ["a1", "u"]
    assert await get(redis_client, KEYS.lock("g")) == "@a1"
    assert await lrange(redis_client, KEYS.parked("g")) == ["a2"]
    assert await field(redis_client, "a1", "s") == "queued"
    assert await field(redis_client, "a1", "a") == "1"  # the attempt counted
    assert await zmembers(redis_client, KEYS.leases) == []
    assert not await redis_client.exists(KEYS.inflight("dies"))
    await assert_consistent(redis_client)
    # The interrupted task runs again first, as attempt 2, with a new token.
    again = await claim_one(redis_client, "w")
    assert (again.id, again.attempt) == ("a1", 2)
    assert again.token > first.token
    # The dead consumer's late outcome and heartbeat are refused.
    assert await finish(redis_client, ok(first)) == [_scripts.LEASE_LOST]
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
    # Never a2: the recovered a1 is its group's head again.
    assert [(t.id, t.attempt) for t in reply.tasks] == [("a1", 2)]
    await assert_consistent(redis_client)


async def test_lease_expired_on_last_attempt_dead_letters(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g", max_attempts=1), new("a2", "g"))
    await claim_one(redis_client, "dies", lease_ms=1)
    await anyio.sleep(0.05)
    assert (await claim(redis_client, "w", k=0)).tasks == []
    assert await field(redis_client, "a1", "s") == "dead"
    assert "lease expired" in (await field(redis_client, "a1", "x") or "")
    assert await zmembers(redis_client, KEYS.dead) == ["a1"]
    # The group passed on to a2, at the front of the ready list.
    assert await get(redis_client, KEYS.lock("g")) == "@a2"
    assert await lrange(redis_client, KEYS.ready) == ["a2"]
    assert await lrange(redis_client, KEYS.parked("g")) == []
    await assert_consistent(redis_client)
    assert (await claim_one(redis_client, "w")).id == "a2"
    await assert_consistent(redis_client)


async def test_claim_resent_with_its_nonce_claims_nothing_more(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g1"), new("b", "g2"), new("c", "g3"))
    # Record one claim call's exact arguments (nonce included), then send
    # them twice, as redis-py does when it retries after a lost reply.
    recorder = _Recorder([-1, 0])
    await _scripts.claim(
        cast("redis.asyncio.Redis", recorder),
        KEYS,
        "c1",
        k=2,
        lease_ms=LONG_MS,
        scan_limit=100,
    )
    first = await redis_client.eval(_scripts.CLAIM.source.decode(), *recorder.args)
    again = await redis_client.eval(_scripts.CLAIM.source.decode(), *recorder.args)
    assert first[2:] == again[2:]
    assert [_s(first[2]), _s(first[6])] == ["a", "b"]
    assert await lrange(redis_client, KEYS.ready) == ["c"]  # not claimed twice
    assert await field(redis_client, "a", "a") == "1"
    # A task finished since is not handed out again by a late re-send.
    await finish(redis_client, _scripts.Outcome("a", int(first[5]), "ok"))
    late = await redis_client.eval(_scripts.CLAIM.source.decode(), *recorder.args)
    assert [_s(x) for x in late[2::4]] == ["b"]
    # A new call (a new nonce) claims on.
    assert (await claim_one(redis_client)).id == "c"
    await assert_consistent(redis_client)


async def test_claim_with_a_bad_lease_claims_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"))
    with pytest.raises(ResponseError):
        await claim(redis_client, lease_ms=0)
    assert await field(redis_client, "a", "s") == "queued"
    assert await field(redis_client, "a", "a") == "0"
    await assert_consistent(redis_client)


# -- finish ----------------------------------------------------------------


async def test_finish_ok_passes_the_group_to_the_front(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("a3", "g"))
    await enqueue(redis_client, new("u"))
    a1 = await claim_one(redis_client)
    assert await lrange(redis_client, KEYS.ready) == ["u"]
    assert await finish(redis_client, ok(a1)) == [_scripts.APPLIED]
    # a2 goes before u, which was enqueued later than a2.
    assert await lrange(redis_client, KEYS.ready) == ["a2", "u"]
    assert await get(redis_client, KEYS.lock("g")) == "@a2"
    assert await lrange(redis_client, KEYS.parked("g")) == ["a3"]
    assert await field(redis_client, "a1", "s") == "succeeded"
    assert await field(redis_client, "a1", "e") is None
    assert 0 < await redis_client.pttl(KEYS.task("a1")) <= WINDOW_MS
    assert await zmembers(redis_client, KEYS.leases) == []
    await assert_consistent(redis_client)
    # The last task of the group frees it.
    a2 = await claim_one(redis_client)
    await finish(redis_client, ok(a2))
    a3 = await claim_one(redis_client)
    assert a3.id == "a3"
    await finish(redis_client, ok(a3))
    assert await get(redis_client, KEYS.lock("g")) is None
    await assert_consistent(redis_client)


async def test_finish_retry_with_delay_keeps_the_group(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    retry = _scripts.Outcome("a1", a1.token, "retry", 50, "ValueError: boom")
    assert await finish(redis_client, retry) == [_scripts.APPLIED]
    assert await field(redis_client, "a1", "s") == "delayed"
    assert await field(redis_client, "a1", "x") == "ValueError: boom"
    assert await zmembers(redis_client, KEYS.delayed) == ["a1"]
    assert await get(redis_client, KEYS.lock("g")) == "@a1"
    await assert_consistent(redis_client)
    # During the backoff nothing of g runs, and a new task of g parks too.
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
    assert await finish(redis_client, retry) == [_scripts.APPLIED]
    assert await lrange(redis_client, KEYS.ready) == ["a1", "u"]
    assert await get(redis_client, KEYS.lock("g")) == "@a1"
    await assert_consistent(redis_client)
    again = await claim_one(redis_client)
    assert (again.id, again.attempt) == ("a1", 2)
    await assert_consistent(redis_client)


async def test_finish_dead_letters_and_passes_the_group_on(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    dead = _scripts.Outcome("a1", a1.token, "dead", "bad input", "Traceback ...")
    assert await finish(redis_client, dead) == [_scripts.APPLIED]
    assert await field(redis_client, "a1", "s") == "dead"
    assert await field(redis_client, "a1", "x") == "bad input"
    assert await field(redis_client, "a1", "tb") == "Traceback ..."
    assert await field(redis_client, "a1", "e") == "env:a1"  # kept to requeue
    assert await zmembers(redis_client, KEYS.dead) == ["a1"]
    assert await lrange(redis_client, KEYS.ready) == ["a2"]
    assert await get(redis_client, KEYS.lock("g")) == "@a2"
    await assert_consistent(redis_client)


async def test_finish_back_does_not_count_the_attempt(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"), new("u"))
    a1 = await claim_one(redis_client)
    back = _scripts.Outcome("a1", a1.token, "back")
    assert await finish(redis_client, back) == [_scripts.APPLIED]
    assert await field(redis_client, "a1", "a") == "0"
    assert await field(redis_client, "a1", "s") == "queued"
    assert await lrange(redis_client, KEYS.ready) == ["a1", "u"]
    assert await get(redis_client, KEYS.lock("g")) == "@a1"
    await assert_consistent(redis_client)
    again = await claim_one(redis_client)
    assert (again.id, again.attempt) == ("a1", 1)
    await assert_consistent(redis_client)


async def test_finish_with_a_stale_token_changes_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    before = await dump(redis_client)
    for kind, arg1 in (("ok", ""), ("retry", 0), ("dead", "x"), ("back", "")):
        stale = _scripts.Outcome("a1", a1.token + 1000, kind, arg1)
        assert await finish(redis_client, stale) == [_scripts.LEASE_LOST], kind
        assert await dump(redis_client) == before, kind
    unknown = _scripts.Outcome("nope", 1, "ok")
    assert await finish(redis_client, unknown) == [_scripts.LEASE_LOST]
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
    assert await finish(redis_client, *batch) == [_scripts.DUPLICATE] * 2
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
    unknown = [ok(a1), _scripts.Outcome("b1", b1.token, "explode")]
    with pytest.raises(ResponseError, match="unknown outcome"):
        await finish(redis_client, *unknown)
    assert await dump(redis_client) == before
    recorder = _Recorder([1, 1])
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


# -- heartbeat -------------------------------------------------------------


async def test_heartbeat_extends_and_reports_lost_leases(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"), new("b"))
    a, b = (await claim(redis_client, k=2, lease_ms=1000)).tasks
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
    assert new_a >= old + LONG_MS - 1000
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
    a = await claim_one(redis_client, lease_ms=1)
    # Renewed before any claim ran recovery: the lease is alive again.
    assert await _scripts.heartbeat(
        redis_client, KEYS, [(a.id, a.token)], lease_ms=LONG_MS
    ) == [1]
    await anyio.sleep(0.05)
    assert (await claim(redis_client, "other")).tasks == []
    assert await field(redis_client, "a", "k") == str(a.token)
    assert await finish(redis_client, ok(a)) == [_scripts.APPLIED]
    await assert_consistent(redis_client)


# -- NOSCRIPT ----------------------------------------------------------------


async def test_every_wrapper_reloads_after_script_flush(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def flush() -> None:
        await redis_client.script_flush()
        shas = [s.sha for s in _scripts.ALL_SCRIPTS]
        assert not any(await redis_client.script_exists(*shas))

    await flush()
    assert await enqueue(redis_client, new("a", "g"), new("b", "g")) == ["a", "b"]
    await flush()
    a = await claim_one(redis_client)
    await flush()
    assert await _scripts.heartbeat(
        redis_client, KEYS, [(a.id, a.token)], lease_ms=LONG_MS
    ) == [1]
    await flush()
    assert await finish(redis_client, ok(a)) == [_scripts.APPLIED]
    # The other scripts' wrappers go through the same reload-and-retry.
    await enqueue(redis_client, new("c"))
    await flush()
    assert (
        await _scripts.cancel(redis_client, KEYS, "c", retention_ms=WINDOW_MS)
        == _scripts.CANCELLED
    )
    b = await claim_one(redis_client, "w2")
    assert b.id == "b"
    await flush()
    assert await _scripts.recover(redis_client, KEYS, "w2", counted=False) == 1
    b = await claim_one(redis_client, "w2")
    await finish(redis_client, _scripts.Outcome("b", b.token, "dead", "why"))
    await flush()
    assert await _scripts.dead_action(redis_client, KEYS, "requeue", ["b"]) == 1
    assert (await claim_one(redis_client)).id == "b"
    await assert_consistent(redis_client)


async def test_claim_and_finish_survive_repeated_script_flushes(
    redis_client: redis.asyncio.Redis,
) -> None:
    # A flush before every call: each call reloads once and applies once, and
    # every task succeeds exactly once.
    ids = [f"t{i}" for i in range(6)]
    await enqueue(redis_client, *(new(i, "g" if int(i[1:]) % 2 else None) for i in ids))
    done: list[str] = []
    for _ in range(len(ids)):
        if len(done) == len(ids):
            break
        await redis_client.script_flush()
        reply = await claim(redis_client, k=2)
        await redis_client.script_flush()
        assert await finish(redis_client, *(ok(t) for t in reply.tasks)) == [1] * len(
            reply.tasks
        )
        done += [t.id for t in reply.tasks]
    assert sorted(done) == ids
    await assert_consistent(redis_client)


async def test_recover_never_takes_a_task_from_its_owner(
    redis_client: redis.asyncio.Redis,
) -> None:
    """A stale entry in one consumer's recovery key for a task another
    consumer runs is dropped, not recovered (that would run the group twice)."""
    await enqueue(redis_client, new("a", "g"))
    owned = await claim_one(redis_client, "owner")
    await redis_client.sadd(KEYS.inflight("other"), "a")
    assert await _scripts.recover(redis_client, KEYS, "other", counted=True) == 0
    assert await redis_client.smembers(KEYS.inflight("other")) == set()
    assert await redis_client.hget(KEYS.task("a"), "s") == b"running"
    assert await redis_client.get(KEYS.lock("g")) == str(owned.token).encode()
    await assert_consistent(redis_client)


async def test_claim_repairs_a_free_group_with_a_parked_line(
    redis_client: redis.asyncio.Redis,
) -> None:
    """Damage: the lock of a group with a parked task vanishes. The claim
    gives the group a head instead of leaving its line stuck."""
    await enqueue(redis_client, new("a", "g"), new("b", "g"))
    await redis_client.delete(KEYS.lock("g"))
    reply = await claim(redis_client, k=2)
    assert len(reply.tasks) == 1  # one of the group, never both
    assert await redis_client.llen(KEYS.parked("g")) == 1
    await assert_consistent(redis_client)


async def test_identity_hold_take_renew_force_drop(
    redis_client: redis.asyncio.Redis,
) -> None:
    key = KEYS.consumer("w")

    async def run(op: str, me: str, dead: str = "") -> str:
        return await _scripts.identity(redis_client, KEYS, "w", op, me, 60_000, dead)

    assert await run("take", "A") == ""
    assert await run("take", "B") == "A"
    # A lapsed hold is taken again by its renewal, if nobody took it.
    await redis_client.delete(key)
    assert await run("renew", "A") == ""
    assert await redis_client.get(key) == b"A"
    # force replaces only the dead holder it saw.
    assert await run("force", "B", dead="Z") == "A"
    assert await run("force", "B", dead="A") == ""
    assert await run("renew", "A") == "B"
    assert await run("drop", "A") == ""
    assert await redis_client.get(key) == b"B"
    assert await run("drop", "B") == ""
    assert await redis_client.exists(key) == 0


async def test_cancel_resent_and_purge_of_a_stale_index_entry(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a"))
    first = await _scripts.cancel(redis_client, KEYS, "a", retention_ms=WINDOW_MS)
    again = await _scripts.cancel(redis_client, KEYS, "a", retention_ms=WINDOW_MS)
    assert (first, again) == (_scripts.CANCELLED, _scripts.CANCELLED)
    # A dead index entry whose task is not dead is dropped by a purge.
    await redis_client.zadd(KEYS.dead, {"a": 1})
    assert await _scripts.dead_action(redis_client, KEYS, "purge", ["a"]) == 0
    assert await redis_client.zcard(KEYS.dead) == 0
