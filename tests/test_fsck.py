"""The consistency check: silent on healthy queues, precise on damaged ones.

Each damage test builds a healthy queue with the real scripts, breaks one
thing with raw commands (what a buggy script, a partial write or an operator
could do), and asserts the exact set of problem kinds reported.
"""

from __future__ import annotations

import inspect
import sys

import anyio
import redis.asyncio

import aiogroupq
from aiogroupq import _fsck, _scripts
from aiogroupq._keys import QueueKeys

KEYS = QueueKeys("fsck")
LONG_MS = 600_000


def new(
    task_id: str, group: str | None = None, *, delay_ms: int = 0
) -> _scripts.NewTask:
    """A task with a recognisable envelope."""
    return _scripts.NewTask(
        id=task_id,
        group=group,
        envelope=b"env:" + task_id.encode(),
        delay_ms=delay_ms,
        max_attempts=3,
        dedup_key=None,
    )


async def enqueue(client: redis.asyncio.Redis, *tasks: _scripts.NewTask) -> None:
    """Enqueue *tasks* in one call."""
    await _scripts.enqueue(client, KEYS, tasks, dedup_window_ms=LONG_MS)


async def claim(
    client: redis.asyncio.Redis, k: int = 1, consumer: str = "c1"
) -> list[_scripts.Claimed]:
    """Claim up to *k* tasks."""
    reply = await _scripts.claim(
        client, KEYS, consumer, k=k, lease_ms=LONG_MS, scan_limit=100
    )
    return reply.tasks


async def problems(client: redis.asyncio.Redis) -> list[_fsck.Problem]:
    """The check's report on the test queue."""
    return await _fsck.check(client, KEYS)


async def kinds(client: redis.asyncio.Redis) -> set[str]:
    """The kinds of problem the check reports."""
    return {p.kind for p in await problems(client)}


async def running_and_parked(client: redis.asyncio.Redis) -> _scripts.Claimed:
    """Group g with a1 running and a2 parked behind it; u ungrouped, ready."""
    await enqueue(client, new("a1", "g"), new("a2", "g"))
    (a1,) = await claim(client)
    await enqueue(client, new("u"))
    assert await problems(client) == []
    return a1


# -- healthy queues --------------------------------------------------------


async def test_empty_database_is_consistent(redis_client: redis.asyncio.Redis) -> None:
    assert await problems(redis_client) == []


async def test_every_healthy_state_is_consistent(
    redis_client: redis.asyncio.Redis,
) -> None:
    # Queued heads, parked tasks, delayed tasks, a retry in backoff, running
    # tasks, succeeded, dead (passed on and halting), dedup keys, wake tokens.
    await enqueue(
        redis_client,
        new("a1", "ga"),
        new("a2", "ga"),
        new("b1", "gb"),
        new("b2", "gb"),
        new("c1", "gc"),
        new("c2", "gc"),
        new("h1", "gh"),
        new("h2", "gh"),
        new("u1"),
        new("d1", "ga", delay_ms=LONG_MS),
    )
    await _scripts.enqueue(
        redis_client,
        KEYS,
        [_scripts.NewTask("k1", None, b"x", 0, 1, "key")],
        dedup_window_ms=LONG_MS,
    )
    a1, b1, c1, h1 = await claim(redis_client, k=4)
    assert [a1.id, b1.id, c1.id, h1.id] == ["a1", "b1", "c1", "h1"]
    codes = await _scripts.finish(
        redis_client,
        KEYS,
        [
            _scripts.Outcome("b1", b1.token, "retry", LONG_MS, "err"),
            _scripts.Outcome("c1", c1.token, "dead", "bad", ""),
            _scripts.Outcome("h1", h1.token, "halt", "bad", ""),
        ],
        retention_ms=LONG_MS,
    )
    assert codes == [1, 1, 1]
    (next_c,) = await claim(redis_client, consumer="c2")
    await _scripts.finish(
        redis_client,
        KEYS,
        [_scripts.Outcome(next_c.id, next_c.token, "ok")],
        retention_ms=LONG_MS,
    )
    assert await problems(redis_client) == []


async def test_a_client_with_decoded_replies_works_too(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        await client.flushdb()
        raw = redis.asyncio.Redis.from_url(redis_url)
        try:
            await enqueue(raw, new("a1", "g"), new("a2", "g"))
            await claim(raw)
        finally:
            await raw.aclose()
        assert await _fsck.check(client, KEYS) == []
        await client.delete(KEYS.lock("g"))
        assert {p.kind for p in await _fsck.check(client, KEYS)} == {
            _fsck.LOCK_MISMATCH,
            _fsck.STUCK_PARK,
        }
    finally:
        await client.aclose()


# -- damage ------------------------------------------------------------------


async def test_lock_deleted_behind_a_running_task(
    redis_client: redis.asyncio.Redis,
) -> None:
    a1 = await running_and_parked(redis_client)
    await redis_client.delete(KEYS.lock("g"))
    found = await problems(redis_client)
    assert {(p.kind, p.task_id, p.group) for p in found} == {
        (_fsck.LOCK_MISMATCH, a1.id, "g"),
        (_fsck.STUCK_PARK, None, "g"),
    }


async def test_lock_deleted_behind_a_ready_head(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    await redis_client.delete(KEYS.lock("g"))
    found = await problems(redis_client)
    assert {(p.kind, p.task_id, p.group) for p in found} == {
        (_fsck.UNMARKED_HEAD, "a1", "g"),
        (_fsck.STUCK_PARK, None, "g"),
    }


async def test_orphaned_ready_entry(redis_client: redis.asyncio.Redis) -> None:
    await running_and_parked(redis_client)
    await redis_client.rpush(KEYS.ready, "ghost")
    found = await problems(redis_client)
    assert [(p.kind, p.task_id) for p in found] == [(_fsck.ORPHAN_ENTRY, "ghost")]


async def test_orphaned_entries_everywhere(redis_client: redis.asyncio.Redis) -> None:
    await redis_client.rpush(KEYS.parked("g"), "p")
    await redis_client.set(KEYS.lock("g"), "@head")  # so the park is not stuck
    await redis_client.zadd(KEYS.delayed, {"d": 1})
    await redis_client.zadd(KEYS.leases, {"l": 1})
    await redis_client.sadd(KEYS.inflight("c"), "i")
    await redis_client.zadd(KEYS.dead, {"x": 1})
    found = await problems(redis_client)
    assert {(p.kind, p.task_id) for p in found} == {
        (_fsck.ORPHAN_ENTRY, "p"),
        (_fsck.ORPHAN_ENTRY, "d"),
        (_fsck.ORPHAN_ENTRY, "l"),
        (_fsck.ORPHAN_ENTRY, "i"),
        (_fsck.ORPHAN_ENTRY, "x"),
        (_fsck.STRAY_LOCK, "head"),
    }


async def test_lock_with_a_wrong_token(redis_client: redis.asyncio.Redis) -> None:
    a1 = await running_and_parked(redis_client)
    await redis_client.set(KEYS.lock("g"), str(a1.token - 1))
    found = await problems(redis_client)
    assert [(p.kind, p.task_id, p.group) for p in found] == [
        (_fsck.LOCK_MISMATCH, a1.id, "g")
    ]


async def test_token_lock_of_an_idle_group(redis_client: redis.asyncio.Redis) -> None:
    await redis_client.set(KEYS.lock("g"), "17")
    await redis_client.set(KEYS.fence, "17")
    found = await problems(redis_client)
    assert [(p.kind, p.group) for p in found] == [(_fsck.STRAY_LOCK, "g")]


async def test_head_lock_naming_a_parked_task(
    redis_client: redis.asyncio.Redis,
) -> None:
    # The lock says a2 is the head, but a2 waits in the parked list: nobody
    # would ever claim it, and a1 in the ready list is not marked.
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    await redis_client.set(KEYS.lock("g"), "@a2")
    assert {(p.kind, p.task_id) for p in await problems(redis_client)} == {
        (_fsck.STRAY_LOCK, "a2"),
        (_fsck.UNMARKED_HEAD, "a1"),
    }


async def test_halting_lock_of_a_live_task(redis_client: redis.asyncio.Redis) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    await redis_client.set(KEYS.lock("g"), "!a2")
    assert {(p.kind, p.task_id) for p in await problems(redis_client)} == {
        (_fsck.STRAY_LOCK, "a2"),
        (_fsck.UNMARKED_HEAD, "a1"),
    }


async def test_task_in_two_places(redis_client: redis.asyncio.Redis) -> None:
    a1 = await running_and_parked(redis_client)
    # A running task pushed to the ready list as well.
    await redis_client.rpush(KEYS.ready, a1.id)
    found = await problems(redis_client)
    assert [(p.kind, p.task_id) for p in found] == [(_fsck.DUPLICATE, a1.id)]


async def test_delayed_task_also_parked(redis_client: redis.asyncio.Redis) -> None:
    await running_and_parked(redis_client)
    await enqueue(redis_client, new("d", "g", delay_ms=LONG_MS))
    await redis_client.rpush(KEYS.parked("g"), "d")
    found = await problems(redis_client)
    assert [(p.kind, p.task_id) for p in found] == [(_fsck.DUPLICATE, "d")]


async def test_task_twice_in_the_ready_list(redis_client: redis.asyncio.Redis) -> None:
    await enqueue(redis_client, new("u"))
    await redis_client.rpush(KEYS.ready, "u")
    found = await problems(redis_client)
    assert [(p.kind, p.task_id) for p in found] == [(_fsck.DUPLICATE, "u")]


async def test_task_in_no_place(redis_client: redis.asyncio.Redis) -> None:
    await running_and_parked(redis_client)
    await redis_client.lrem(KEYS.parked("g"), 1, "a2")
    await redis_client.lrem(KEYS.ready, 1, "u")
    found = await problems(redis_client)
    assert {(p.kind, p.task_id) for p in found} == {
        (_fsck.LOST_TASK, "a2"),
        (_fsck.LOST_TASK, "u"),
    }


async def test_running_task_without_lease_or_recovery_key(
    redis_client: redis.asyncio.Redis,
) -> None:
    a1 = await running_and_parked(redis_client)
    await redis_client.srem(KEYS.inflight("c1"), a1.id)
    assert [(p.kind, p.task_id) for p in await problems(redis_client)] == [
        (_fsck.NOT_INFLIGHT, a1.id)
    ]
    await redis_client.zrem(KEYS.leases, a1.id)
    assert {(p.kind, p.task_id) for p in await problems(redis_client)} == {
        (_fsck.NOT_INFLIGHT, a1.id),
        (_fsck.LOST_TASK, a1.id),
    }


async def test_recovery_key_of_another_consumer(
    redis_client: redis.asyncio.Redis,
) -> None:
    a1 = await running_and_parked(redis_client)
    await redis_client.smove(KEYS.inflight("c1"), KEYS.inflight("c2"), a1.id)
    assert {(p.kind, p.task_id) for p in await problems(redis_client)} == {
        (_fsck.NOT_INFLIGHT, a1.id),
        (_fsck.MISPLACED, a1.id),
    }


async def test_two_running_tasks_in_one_group(
    redis_client: redis.asyncio.Redis,
) -> None:
    a1 = await running_and_parked(redis_client)
    # Forge a second claim of a2 that ignored the lock.
    token = await redis_client.incr(KEYS.fence)
    await redis_client.lrem(KEYS.parked("g"), 1, "a2")
    await redis_client.hset(
        KEYS.task("a2"), mapping={"s": "running", "k": token, "c": "c2", "a": 1}
    )
    await redis_client.zadd(KEYS.leases, {"a2": 1})
    await redis_client.sadd(KEYS.inflight("c2"), "a2")
    found = await problems(redis_client)
    assert {(p.kind, p.task_id, p.group) for p in found} == {
        (_fsck.GROUP_OVERLAP, None, "g"),
        (_fsck.LOCK_MISMATCH, "a2", "g"),
    }
    assert a1.token != token


async def test_terminal_task_in_a_list(redis_client: redis.asyncio.Redis) -> None:
    a1 = await running_and_parked(redis_client)
    await _scripts.finish(
        redis_client,
        KEYS,
        [_scripts.Outcome(a1.id, a1.token, "ok")],
        retention_ms=LONG_MS,
    )
    await redis_client.rpush(KEYS.ready, a1.id)
    await redis_client.zadd(KEYS.dead, {a1.id: 1})
    found = await problems(redis_client)
    assert [(p.kind, p.task_id) for p in found] == [
        (_fsck.MISPLACED, a1.id),
        (_fsck.MISPLACED, a1.id),
    ]


async def test_dead_task_missing_from_the_index(
    redis_client: redis.asyncio.Redis,
) -> None:
    a1 = await running_and_parked(redis_client)
    await _scripts.finish(
        redis_client,
        KEYS,
        [_scripts.Outcome(a1.id, a1.token, "dead", "why", "")],
        retention_ms=LONG_MS,
    )
    assert await problems(redis_client) == []
    await redis_client.zrem(KEYS.dead, a1.id)
    assert [(p.kind, p.task_id) for p in await problems(redis_client)] == [
        (_fsck.UNINDEXED_DEAD, a1.id)
    ]


async def test_queued_task_in_the_wrong_park(
    redis_client: redis.asyncio.Redis,
) -> None:
    await running_and_parked(redis_client)
    await redis_client.lrem(KEYS.ready, 1, "u")
    await redis_client.rpush(KEYS.parked("g"), "u")  # ungrouped, parked
    assert [(p.kind, p.task_id) for p in await problems(redis_client)] == [
        (_fsck.MISPLACED, "u")
    ]


async def test_second_entry_of_a_group_in_the_ready_list(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a1", "g"), new("a2", "g"))
    await redis_client.lrem(KEYS.parked("g"), 1, "a2")
    await redis_client.rpush(KEYS.ready, "a2")
    assert [(p.kind, p.task_id) for p in await problems(redis_client)] == [
        (_fsck.UNMARKED_HEAD, "a2")
    ]


async def test_malformed_task_hashes(redis_client: redis.asyncio.Redis) -> None:
    await enqueue(redis_client, new("u"), new("v"))
    await redis_client.hdel(KEYS.task("u"), "e")
    await redis_client.hset(KEYS.task("v"), "s", "sleeping")
    await redis_client.hset(KEYS.task("w"), "x", "1")  # a hash of junk
    found = {(p.kind, p.task_id) for p in await problems(redis_client)}
    assert found == {
        (_fsck.BAD_TASK, "u"),
        (_fsck.BAD_TASK, "v"),
        (_fsck.BAD_TASK, "w"),
    }


async def test_token_above_the_fence(redis_client: redis.asyncio.Redis) -> None:
    a1 = await running_and_parked(redis_client)
    await redis_client.set(KEYS.fence, a1.token - 1)
    assert [(p.kind, p.task_id) for p in await problems(redis_client)] == [
        (_fsck.BAD_FENCE, a1.id)
    ]
    await redis_client.delete(KEYS.fence)
    assert [p.kind for p in await problems(redis_client)] == [_fsck.BAD_FENCE]


async def test_unknown_keys_and_wrong_types(redis_client: redis.asyncio.Redis) -> None:
    await enqueue(redis_client, new("u"))
    await redis_client.set(KEYS.prefix + "mystery", "1")
    await redis_client.set(KEYS.prefix + "t:", "1")
    await redis_client.set(KEYS.delayed, "not a zset")
    await redis_client.rpush(KEYS.lock("g"), "x")
    await redis_client.set("{aiogroupq:other}:ready", "another queue: ignored")
    found = sorted(
        (p.kind, p.detail.split(": ")[0]) for p in await problems(redis_client)
    )
    assert found == [
        (_fsck.UNKNOWN_KEY, KEYS.prefix + "mystery"),
        (_fsck.UNKNOWN_KEY, KEYS.prefix + "t:"),
        (_fsck.WRONG_TYPE, KEYS.delayed),
        (_fsck.WRONG_TYPE, KEYS.lock("g")),
    ]


async def test_keys_outside_the_queue_slot(redis_client: redis.asyncio.Redis) -> None:
    # QueueKeys always makes tagged names; a prefix without a hash tag stands
    # for a future mistake in it: per-group keys then land in other slots.
    keys = QueueKeys("fsck")
    keys.prefix = "aiogroupq-untagged:"
    keys.ready = keys.prefix + "ready"
    await _scripts.enqueue(
        redis_client,
        keys,
        [new(f"a{i}", f"g{i}") for i in range(8)],
        dedup_window_ms=LONG_MS,
    )
    assert _fsck.WRONG_SLOT in {p.kind for p in await _fsck.check(redis_client, keys)}


async def test_every_key_queue_keys_makes_is_known(
    redis_client: redis.asyncio.Redis,
) -> None:
    # A guard for new keys: each per-task/group/consumer key QueueKeys can
    # make must be one the check knows (here with a wrong value, so other
    # problems are expected, but never "unknown-key").
    makers = [
        name
        for name, function in inspect.getmembers(QueueKeys, inspect.isfunction)
        if not name.startswith("_") and len(inspect.signature(function).parameters) == 2
    ]
    assert {"task", "lock", "parked", "inflight", "dedup"} <= set(makers)
    for name in makers:
        await redis_client.set(getattr(KEYS, name)("x"), "1")
    found = await problems(redis_client)
    assert [p for p in found if p.kind == _fsck.UNKNOWN_KEY] == []
    assert len(await redis_client.keys(KEYS.pattern())) == len(makers)


async def test_check_command_reports_and_exits_1_on_a_broken_queue(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    async with aiogroupq.Producer(redis_client, queue="cli-check") as producer:
        await producer.enqueue("t", 1, group="g")
        await producer.enqueue("t", 2, group="g")
    argv = [sys.executable, "-m", "aiogroupq", "check", "--queue", "cli-check"]
    argv += ["--redis-url", redis_url]
    clean = await anyio.run_process(argv, check=False)
    assert clean.returncode == 0, clean.stderr.decode()
    assert b"0 problems" in clean.stdout
    assert await aiogroupq.check_queue(redis_client, "cli-check") == []
    await redis_client.delete(QueueKeys("cli-check").lock("g"))
    broken = await anyio.run_process(argv, check=False)
    assert broken.returncode == 1
    assert b"stuck-park group 'g'" in broken.stdout
    problems = await aiogroupq.check_queue(redis_client, "cli-check")
    # The head left in the ready list lost its mark; its line is stuck.
    assert sorted(p.kind for p in problems) == [_fsck.STUCK_PARK, _fsck.UNMARKED_HEAD]
    assert isinstance(problems[0], aiogroupq.Problem)
