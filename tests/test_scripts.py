"""Each Lua script driven directly through its ``_scripts`` wrapper.

Every scenario inspects the keys the scripts leave behind (the ready list,
the priority set, group hashes ``grp:<g>`` with their counts and slot marks,
lines ``park:<g>``, held lists, the delayed set, leases, recovery keys, task
hashes, counters) and, where the queue is meant to be healthy, ends with
:func:`aiogroupq._inspect.check.check` finding nothing wrong. Lease expiry is real (a
claim with a tiny lease, then a sleep past it) or simulated by setting a
lease's score to 0; either is a precondition, never a measured duration.

The last part damages keys the way a buggy client, an operator or a partial
write could, and checks that every script refuses before writing, or harms
only the damaged task or group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest
import redis.asyncio
from redis.exceptions import ResponseError

from aiogroupq._inspect import check as _fsck
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq.errors import CorruptQueueError

from ._tasks import envelope_of

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
    unique: bool = False,
    priority: int | None = None,
    expire_at_ms: int = 0,
) -> _scripts.NewTask:
    """A task whose envelope names it, so a claim's reply can be checked."""
    return _scripts.NewTask(
        id=task_id,
        group=group,
        envelope=envelope_of(task_id, group),
        delay_ms=delay_ms,
        max_attempts=max_attempts,
        dedup_key=dedup,
        unique=unique,
        priority=priority,
        expire_at_ms=expire_at_ms,
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
        client,
        KEYS,
        consumer,
        k=k,
        lease_ms=lease_ms,
        scan_limit=1000,
        retention_ms=WINDOW_MS,
    )


async def claim_ids(client: redis.asyncio.Redis, consumer: str = "c1") -> list[str]:
    """The ids one claim of up to 10 tasks takes, in order."""
    return [t.id for t in (await claim(client, consumer)).tasks]


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


async def control(client: redis.asyncio.Redis, op: str, *args: EncodableT) -> int:
    """Run a ``control.lua`` operation."""
    return await _scripts.control(client, KEYS, op, *args)


async def set_group(
    client: redis.asyncio.Redis,
    group: str,
    *,
    c: int | str = "",
    rn: int | str = "",
    rp: int | str = "",
    mx: int | str = "",
    pr: int | str = "",
) -> int:
    """Replace a group's own settings ("" leaves one to the queue)."""
    return await control(client, "group", group, c, rn, rp, mx, pr)


def _s(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="surrogateescape")
    return str(value)


async def lrange(client: redis.asyncio.Redis, key: str) -> list[str]:
    """A whole list, decoded."""
    return [_s(v) for v in await client.lrange(key, 0, -1)]


async def zmembers(client: redis.asyncio.Redis, key: str) -> list[str]:
    """A sorted set's members in score order, decoded."""
    return [_s(v) for v in await client.zrange(key, 0, -1)]


async def smembers(client: redis.asyncio.Redis, key: str) -> set[str]:
    """A set's members, decoded."""
    return {_s(v) for v in await client.smembers(key)}


async def get(client: redis.asyncio.Redis, key: str) -> str | None:
    """A string value, decoded, or None."""
    value = await client.get(key)
    return None if value is None else _s(value)


async def field(client: redis.asyncio.Redis, task_id: str, name: str) -> str | None:
    """One field of a task hash, decoded, or None."""
    value = await client.hget(KEYS.task(task_id), name)
    return None if value is None else _s(value)


async def hash_of(client: redis.asyncio.Redis, key: str) -> dict[str, str]:
    """A whole hash, decoded."""
    return {_s(k): _s(v) for k, v in (await client.hgetall(key)).items()}


async def group_of(client: redis.asyncio.Redis, group: str) -> dict[str, str]:
    """A group's hash ``grp:<g>``: counts k, d, w, halt marker !, marks h:<id>."""
    return await hash_of(client, KEYS.group(group))


async def marks(client: redis.asyncio.Redis, group: str) -> dict[str, str]:
    """A group's slot marks: holder id -> '@', '~', 'r' or its token."""
    return {
        name[2:]: value
        for name, value in (await group_of(client, group)).items()
        if name.startswith("h:")
    }


async def counts(client: redis.asyncio.Redis, group: str) -> tuple[int, int, int]:
    """A group's (k, d, w): slots held, tasks in their first delay, line."""
    state = await group_of(client, group)
    return int(state.get("k", 0)), int(state.get("d", 0)), int(state.get("w", 0))


async def stats(client: redis.asyncio.Redis) -> dict[str, int]:
    """The queue's counters, zeros left out."""
    raw = await hash_of(client, KEYS.stats)
    return {name: int(value) for name, value in raw.items() if int(value)}


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
    """The queue's keys keep every invariant (see :mod:`aiogroupq._inspect.check`)."""
    assert await _fsck.check(client, KEYS) == []


async def expire_lease(client: redis.asyncio.Redis, task_id: str) -> None:
    """The task's consumer stopped renewing: its lease deadline is past."""
    assert await client.zadd(KEYS.leases, {task_id: 0}, xx=True, ch=True) == 1


async def fall_due(client: redis.asyncio.Redis, member: str) -> None:
    """A delayed member (task or rate wake-up) is due now."""
    assert await client.zadd(KEYS.delayed, {member: 0}, xx=True, ch=True) == 1


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
    assert await finish(redis_client, ok(task)) == [_scripts.APPLIED]
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
    with pytest.raises(_scripts.GroupFullRefusal) as refused:
        await enqueue(redis_client, new("u", "h"), new("a2", "g"), new("a3", "g"))
    assert (refused.value.index, refused.value.live, refused.value.cap) == (2, 2, 2)
    assert await dump(redis_client) == before
    # Delayed and running tasks count as live too.
    assert await enqueue(redis_client, new("d", "g", delay_ms=LONG_MS)) == ["d"]
    await claim_one(redis_client)
    with pytest.raises(_scripts.GroupFullRefusal):
        await enqueue(redis_client, new("a2", "g"))
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
    recorder = _Recorder([-1, 0, 0, [], [], []])
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
    assert [_s(first[6]), _s(first[12])] == ["a", "b"]
    assert await lrange(redis_client, KEYS.ready) == ["c"]  # not claimed twice
    assert await field(redis_client, "a", "a") == "1"
    assert (await stats(redis_client))["started"] == 2
    # A task finished since is not handed out again by a late re-send.
    await finish(redis_client, _scripts.Outcome("a", int(first[9]), "ok"))
    late = await redis_client.eval(source, *recorder.args)
    assert [_s(x) for x in late[6::6]] == ["b"]
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


# -- fairness: round-robin and drain ---------------------------------------


async def test_released_group_goes_to_the_ready_tail(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(
        redis_client, new("a1", "g"), new("a2", "g"), new("a3", "g"), new("b1", "h")
    )
    await enqueue(redis_client, new("u"))
    a1 = await claim_one(redis_client)
    assert await lrange(redis_client, KEYS.ready) == ["b1", "u"]
    assert await finish(redis_client, ok(a1)) == [_scripts.APPLIED]
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


# -- group concurrency -----------------------------------------------------


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


# -- pause and resume -------------------------------------------------------


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


# -- rate limits -------------------------------------------------------------


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


# -- priorities ---------------------------------------------------------------


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


# -- expiry -------------------------------------------------------------------


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
    assert await finish(redis_client, retry) == [_scripts.APPLIED]
    assert (await claim_one(redis_client)).attempt == 2
    await assert_consistent(redis_client)


# -- finish ----------------------------------------------------------------


async def test_finish_retry_with_delay_keeps_the_slot(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    retry = _scripts.Outcome("a1", a1.token, "retry", 50, "ValueError: boom")
    assert await finish(redis_client, retry) == [_scripts.APPLIED]
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
    assert await finish(redis_client, retry) == [_scripts.APPLIED]
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
    assert await finish(redis_client, dead) == [_scripts.APPLIED]
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
    assert await finish(redis_client, halt) == [_scripts.APPLIED]
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
    assert await marks(redis_client, "g") == {"a1": "@"}
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


async def test_cancel_while_running_turns_a_retry_into_cancel(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    a1 = await claim_one(redis_client)
    assert (
        await _scripts.cancel(redis_client, KEYS, "a1", retention_ms=WINDOW_MS)
        == _scripts.REQUESTED
    )
    assert await _scripts.heartbeat(
        redis_client, KEYS, [(a1.id, a1.token)], lease_ms=LONG_MS
    ) == [_scripts.CANCEL_REQUESTED]
    retry = _scripts.Outcome("a1", a1.token, "retry", 0, "err")
    assert await finish(redis_client, retry) == [_scripts.APPLIED_AS_CANCEL]
    assert await field(redis_client, "a1", "s") == "cancelled"
    assert await claim_ids(redis_client) == ["a2"]
    await assert_consistent(redis_client)


async def test_cancel_of_waiting_tasks_passes_slots_on(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(
        redis_client,
        new("a1", "g"),
        new("a2", "g"),
        new("a3", "g"),
        new("d", "g", delay_ms=LONG_MS),
    )
    cancel = _scripts.cancel
    # A line member leaves the line; the head passes its slot on.
    assert await cancel(redis_client, KEYS, "a2", retention_ms=WINDOW_MS) == 1
    assert await counts(redis_client, "g") == (1, 1, 1)
    assert await cancel(redis_client, KEYS, "a1", retention_ms=WINDOW_MS) == 1
    assert await marks(redis_client, "g") == {"a3": "@"}
    assert await lrange(redis_client, KEYS.ready) == ["a3"]
    # A task in its first delay leaves the delayed set.
    assert await cancel(redis_client, KEYS, "d", retention_ms=WINDOW_MS) == 1
    assert await counts(redis_client, "g") == (1, 0, 0)
    assert await zmembers(redis_client, KEYS.delayed) == []
    assert (await stats(redis_client))["cancelled"] == 3
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
    # Long enough to outlive the round trip to the heartbeat (a lease that
    # ran out before its heartbeat is lost, whether or not a claim saw it).
    a = await claim_one(redis_client, lease_ms=1_000)
    assert await _scripts.heartbeat(
        redis_client, KEYS, [(a.id, a.token)], lease_ms=LONG_MS
    ) == [1]
    await anyio.sleep(1.1)  # past the first lease: the renewal holds it
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
    assert await _scripts.recover(redis_client, KEYS, "w2", counted=False) == (1, ())
    b = await claim_one(redis_client, "w2")
    await finish(redis_client, _scripts.Outcome("b", b.token, "dead", "why"))
    await flush()
    assert await _scripts.dead_action(redis_client, KEYS, "requeue", ["b"]) == 1
    await flush()
    assert await control(redis_client, "pause", "g") == 0
    await flush()
    assert await _scripts.wait_done(redis_client, KEYS, "b", 0, 1) == (
        "queued",
        None,
        "",
    )
    await flush()
    assert await _scripts.identity(redis_client, KEYS, "w", "take", "A", 1000) == ""
    await control(redis_client, "resume", "g")
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


# -- recover ---------------------------------------------------------------


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


# -- identity, cancel, purge ---------------------------------------------------


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


# -- counters ------------------------------------------------------------------


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


# -- damaged keys ----------------------------------------------------------------
#
# Each test below damages a key and checks that the scripts refuse before
# writing (nothing changes) or harm only the damaged task or group. The
# engine before the group-slot layout failed each one: its scripts read keys
# with redis.call, so a wrong-typed key stopped them half-way through (writes
# done before the error stay: Redis has no rollback), and they never checked
# the fence or a task hash's fields.


async def _wrong_type(client: redis.asyncio.Redis, key: str, kind: str) -> None:
    """Replace *key* with a key of another type than *kind*."""
    await client.delete(key)
    if kind == "string":
        await client.rpush(key, "damage")
    else:
        await client.set(key, "damage")


async def _rich_state(client: redis.asyncio.Redis) -> dict[str, _scripts.Claimed]:
    """A queue in which every script has something to do: heads, lines, a
    due delayed task, an expired lease, running tasks, a dead letter, a
    halted group, priorities in use, a rate-limited group. Returns the
    running tasks by id."""
    await set_group(client, "gr", rn=1, rp=LONG_MS)
    await enqueue(
        client,
        new("a1", "g1"),
        new("a2", "g1"),
        new("b1", "g2"),
        new("x1", "g3"),
        new("h1", "g4"),
        new("h2", "g4"),
        new("z1", max_attempts=1),
        new("r1", "gr"),
        new("r2", "gr"),
        new("p1", priority=5),
        new("d1", "g1", delay_ms=LONG_MS),
        new("e1", delay_ms=LONG_MS),
    )
    running = {t.id: t for t in (await claim(client, "c1", k=7)).tasks}
    assert sorted(running) == ["a1", "b1", "h1", "p1", "r1", "x1", "z1"]
    await finish(
        client,
        _scripts.Outcome("h1", running.pop("h1").token, "halt", "x", ""),
        _scripts.Outcome("z1", running.pop("z1").token, "dead", "x", ""),
        ok(running.pop("r1")),
        ok(running.pop("p1")),
    )
    assert (await claim(client, "c2", k=1)).tasks == []  # r2: held by the rate
    assert await lrange(client, KEYS.held("gr")) == ["r2"]
    await expire_lease(client, "x1")
    await fall_due(client, "e1")
    await enqueue(client, new("q1", "g5"))
    await assert_consistent(client)
    return running


def _calls(
    running: dict[str, _scripts.Claimed],
) -> dict[str, Callable[[redis.asyncio.Redis], Awaitable[object]]]:
    """One call of each script (and of each operation), by name."""
    a1, b1 = running["a1"], running["b1"]

    def ctl(op: str, *args: EncodableT) -> Callable[[redis.asyncio.Redis], Any]:
        return lambda c: control(c, op, *args)

    def dead(op: str, *args: str) -> Callable[[redis.asyncio.Redis], Any]:
        return lambda c: _scripts.dead_action(c, KEYS, op, args)

    return {
        "enqueue": lambda c: enqueue(
            c,
            new("n1", "g1"),
            new("n2", "g6"),
            new("n3", delay_ms=LONG_MS),
            new("n4", dedup="k", unique=True),
            new("n5", priority=3),
        ),
        "claim": lambda c: claim(c, "c3"),
        "finish": lambda c: finish(
            c, ok(a1), _scripts.Outcome("b1", b1.token, "retry", LONG_MS, "err")
        ),
        "finish-halt": lambda c: finish(
            c, _scripts.Outcome("a1", a1.token, "halt", "x", "")
        ),
        "heartbeat": lambda c: _scripts.heartbeat(
            c, KEYS, [(a1.id, a1.token)], lease_ms=LONG_MS
        ),
        "recover": lambda c: _scripts.recover(c, KEYS, "c1", counted=True),
        "cancel-queued": lambda c: _scripts.cancel(
            c, KEYS, "q1", retention_ms=WINDOW_MS
        ),
        "cancel-delayed": lambda c: _scripts.cancel(
            c, KEYS, "d1", retention_ms=WINDOW_MS
        ),
        "cancel-held": lambda c: _scripts.cancel(c, KEYS, "r2", retention_ms=WINDOW_MS),
        "requeue": dead("requeue", "z1", "h1"),
        "purge": dead("purge", "z1", "h1"),
        "release": dead("release", "g4"),
        "pause": ctl("pause", "g2"),
        "resume": ctl("resume", "gr"),
        "group": ctl("group", "g1", 2, "", "", "", 4),
        "queue": ctl("queue", "drain", 2, "", "", 10),
        "qpause": ctl("qpause"),
        "qresume": ctl("qresume"),
        "refill": ctl("refill", "g1", "g4"),
        "wait": lambda c: _scripts.wait_done(c, KEYS, "a1", 0, 1),
        "identity": lambda c: _scripts.identity(c, KEYS, "c1", "take", "A", 1000),
    }


async def _refusal(call: Awaitable[object]) -> CorruptQueueError | None:
    """The CorruptQueueError *call* raises, or None if it runs."""
    try:
        await call
    except CorruptQueueError as exc:
        return exc
    return None


CALLS = (
    "enqueue",
    "claim",
    "finish",
    "finish-halt",
    "heartbeat",
    "recover",
    "cancel-queued",
    "cancel-delayed",
    "cancel-held",
    "requeue",
    "purge",
    "release",
    "pause",
    "resume",
    "group",
    "queue",
    "qpause",
    "qresume",
    "refill",
    "wait",
    "identity",
)


@pytest.mark.parametrize("call", CALLS)
async def test_a_wrong_typed_fixed_key_is_refused_before_any_write(
    redis_client: redis.asyncio.Redis, call: str
) -> None:
    """Each script, with each fixed key of the wrong type: it refuses with
    CorruptQueueError and nothing changed, or it runs without touching that
    key. It never fails half-way with a raw WRONGTYPE error."""
    running = await _rich_state(redis_client)
    before = await dump(redis_client)
    await _calls(running)[call](redis_client)
    if call not in ("qresume", "refill"):  # these may have nothing to do
        assert await dump(redis_client) != before  # undamaged, the call writes
    refused = []
    for name, kind in sorted(_fsck.FIXED.items()):
        await redis_client.flushdb()
        running = await _rich_state(redis_client)
        key = KEYS.prefix + name
        await _wrong_type(redis_client, key, kind)
        before = await dump(redis_client)
        error = await _refusal(_calls(running)[call](redis_client))
        if error is not None:
            assert error.key == key, (name, error)
            assert await dump(redis_client) == before, name
            refused.append(name)
        else:
            assert (await dump(redis_client)).get(key) == before[key], name
    print(call, "refused for", refused)  # noqa: T201 - what the test covered


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
    with pytest.raises(_scripts.GroupCorruptRefusal) as refused:
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
    assert await finish(redis_client, ok(b1)) == [_scripts.GROUP_DAMAGED]
    assert await field(redis_client, "b1", "s") == "succeeded"
    await enqueue(redis_client, new("b2", "h2"))
    b2 = await claim_one(redis_client)
    await redis_client.set(KEYS.group("h2"), "damage")
    retry = _scripts.Outcome("b2", b2.token, "retry", 0, "err")
    assert await finish(redis_client, retry) == [_scripts.GROUP_DAMAGED]
    assert (await field(redis_client, "b2", "x") or "").startswith("Corrupt:")
    assert await zmembers(redis_client, KEYS.dead) == ["a1", "b2"]


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


async def test_a_finish_batch_applies_all_but_a_damaged_task(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"), new("b", "h"), new("c"))
    a, b, c = (await claim(redis_client)).tasks
    await redis_client.delete(KEYS.task("b"))
    await redis_client.set(KEYS.task("b"), "damage")
    codes = await finish(redis_client, ok(a), ok(b), ok(c))
    assert codes == [_scripts.APPLIED, _scripts.TASK_DAMAGED, _scripts.APPLIED]
    assert await field(redis_client, "a", "s") == "succeeded"
    assert await field(redis_client, "c", "s") == "succeeded"
    assert await get(redis_client, KEYS.task("b")) == "damage"


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


async def test_a_counter_that_is_not_an_integer_fails_no_script(
    redis_client: redis.asyncio.Redis,
) -> None:
    """The stats counters are bumped at the end of a call: a counter holding
    junk used to fail the script there, after its writes (no rollback), so
    an enqueue reported an error for tasks it had written. The junk stays
    (the check reports it, the repair resets it); the call goes through."""
    await redis_client.hset(KEYS.stats, mapping={"parked": "junk", "started": "x"})
    assert await enqueue(redis_client, new("a1", "g"), new("a2", "g")) == [
        "a1",
        "a2",
    ]
    assert await lrange(redis_client, KEYS.parked("g")) == ["a2"]
    a1 = await claim_one(redis_client)
    assert await finish(redis_client, ok(a1)) == [_scripts.APPLIED]
    assert await claim_ids(redis_client) == ["a2"]
    assert await hash_of(redis_client, KEYS.stats) == {
        "parked": "junk",
        "started": "x",
        "enqueued": "2",
        "succeeded": "1",
        "groups": "1",
    }
    problems = await _fsck.check(redis_client, KEYS)
    assert {p.kind for p in problems} == {_fsck.BAD_COUNT}


async def test_a_handed_back_task_with_junk_attempts_fails_no_batch(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"), new("b", "h"), new("c"))
    a, b, c = (await claim(redis_client)).tasks
    await redis_client.hset(KEYS.task("b"), "a", "junk")
    codes = await finish(
        redis_client, ok(a), _scripts.Outcome("b", b.token, "back"), ok(c)
    )
    assert codes == [_scripts.APPLIED] * 3
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
