"""The consistency check: silent on healthy queues, precise on damaged ones.

Each damage test builds a healthy queue of every shape with the real scripts
(``tests/_damage.py``), breaks one thing with raw commands (what a buggy
script, a partial write or an operator could do), and asserts the exact set
of problem kinds reported. ``test_repair.py`` repairs the same damages.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._check import (
    check as _fsck,
    problems as problem_kinds,
    snapshot as _snapshot,
)
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.codec import pack
from aiogroupq._store.keys import QueueKeys
from aiogroupq.task import Envelope

from ._damage import DAMAGES, KEYS, QUEUE, build, needs_priorities, new


async def kinds(client: redis.asyncio.Redis) -> set[str]:
    """The kinds of problem the check reports."""
    return {p.kind for p in (await _fsck.examine(client, KEYS)).problems}


async def test_a_claim_while_the_check_reads_is_no_fence_problem(
    redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A live claim between the check's read of the fence and its read of
    # the tasks hands out a token above the fence it read: not damage.
    await build(redis_client)
    running = KEYS.task("u03")  # ungrouped: no slot mark holds its token
    read_tasks = _snapshot._read_tasks

    async def claim_first(*args: Any, **kwargs: Any) -> None:
        token = await redis_client.incr(KEYS.fence)
        await redis_client.hset(running, "k", token)
        await read_tasks(*args, **kwargs)

    monkeypatch.setattr(_snapshot, "_read_tasks", claim_first)
    assert (await _fsck.examine(redis_client, KEYS)).problems == []


# -- healthy queues --------------------------------------------------------


async def test_an_empty_database_is_consistent_and_empty(
    redis_client: redis.asyncio.Redis,
) -> None:
    found = await _fsck.examine(redis_client, KEYS)
    assert (found.empty, found.problems) == (True, [])


@pytest.mark.parametrize("priorities", [False, True])
async def test_every_healthy_shape_is_consistent(
    redis_client: redis.asyncio.Redis, priorities: bool
) -> None:
    # build() asserts it too; here the snapshot is looked at as well.
    await build(redis_client, priorities=priorities)
    found = await _fsck.examine(redis_client, KEYS)
    assert found.problems == []
    (snap,) = found.snapshots
    assert not snap.empty
    assert snap.held == {"g4": ["d01", "d02"], "g6": ["f02"]}
    assert snap.rate_wakes() == {"g6"}
    assert (snap.limit("g3"), snap.limit("g1"), snap.is_paused("g4")) == (2, 1, True)


async def test_the_public_check_takes_a_url_or_a_client(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    await build(redis_client)
    assert await aiogroupq.check_queue(redis_url, QUEUE) == []
    await redis_client.lrem(KEYS.ready, 0, "u02")
    (problem,) = await aiogroupq.check_queue(redis_client, QUEUE)
    assert isinstance(problem, aiogroupq.Problem)
    assert (problem.kind, problem.task_id, problem.group) == (
        problem_kinds.LOST_TASK,
        "u02",
        None,
    )
    assert problem.key == KEYS.task("u02")
    assert str(problem) == (
        "lost-task task 'u02': queued, not in the ready list, its group's line "
        "or held list"
    )


# -- damage ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DAMAGES))
async def test_each_damage_is_reported_exactly(
    redis_client: redis.asyncio.Redis, name: str
) -> None:
    damage, expected = DAMAGES[name]
    q = await build(redis_client, priorities=needs_priorities(name))
    await damage(q)
    problems = (await _fsck.examine(redis_client, KEYS)).problems
    assert {p.kind for p in problems} == expected, problems
    # Each problem names the key to look at, and it is one of this queue's.
    assert all(p.key is not None and p.key.startswith(KEYS.prefix) for p in problems)


async def test_a_line_task_lost_far_into_a_long_line_is_found(
    redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lists, sets and sorted sets are read in slices of SLICE entries: none
    is read with one command however long it is, and none is cut short."""
    monkeypatch.setattr(_snapshot, "SLICE", 4)
    ranges: list[int] = []
    for name in ("lrange", "zrange"):
        real = getattr(redis_client, name)

        async def spy(
            key: Any, start: int, end: int, *args: Any, _real: Any = real, **kwargs: Any
        ) -> Any:
            ranges.append(end - start + 1)
            return await _real(key, start, end, *args, **kwargs)

        monkeypatch.setattr(redis_client, name, spy)
    await _scripts.enqueue(
        redis_client,
        KEYS,
        [new(f"a{i:02}", "g") for i in range(30)]
        + [new(f"u{i:02}") for i in range(30)],
        dedup_window_ms=60_000,
    )
    await _scripts.enqueue(
        redis_client,
        KEYS,
        [new(f"d{i:02}", delay_ms=60_000) for i in range(30)],
        dedup_window_ms=60_000,
    )
    assert (await _fsck.examine(redis_client, KEYS)).problems == []
    assert ranges
    assert max(ranges) == 4
    # Damage deep in the line, the ready list and the delayed set.
    await redis_client.lset(KEYS.parked("g"), 25, "ghost1")
    await redis_client.lset(KEYS.ready, 27, "ghost2")
    await redis_client.zrem(KEYS.delayed, "d28")
    found = {
        (p.kind, p.task_id) for p in (await _fsck.examine(redis_client, KEYS)).problems
    }
    assert found == {
        (problem_kinds.ORPHAN_ENTRY, "ghost1"),
        (problem_kinds.LOST_TASK, "a26"),
        (problem_kinds.ORPHAN_ENTRY, "ghost2"),
        (problem_kinds.LOST_TASK, "u26"),
        (problem_kinds.LOST_TASK, "d28"),
    }


def _envelope(task_id: str, payload_size: int) -> bytes:
    """An envelope whose encoded payload is *payload_size* bytes (>= 259)."""
    payload = msgspec.msgpack.encode(b"x" * (payload_size - 3))  # bin 16 header
    assert len(payload) == payload_size
    return pack(Envelope(id=task_id, type="t", payload=msgspec.Raw(payload)))


async def test_oversized_follows_the_consumers_limit(
    redis_client: redis.asyncio.Redis,
) -> None:
    limit = 1000
    # A payload of exactly the limit is what a producer with this limit
    # accepts and a consumer with it runs; one byte more is refused.
    at_limit = _envelope("ok", limit)
    over = _envelope("big", limit + 1)
    tasks = [
        _scripts.NewTask("ok", None, at_limit, 0, 3, None),
        _scripts.NewTask("big", None, over, 0, 3, None),
    ]
    await _scripts.enqueue(redis_client, KEYS, tasks, dedup_window_ms=60_000)
    found = (await _fsck.examine(redis_client, KEYS, max_payload=limit)).problems
    assert [(p.kind, p.task_id) for p in found] == [(problem_kinds.OVERSIZED, "big")]
    assert (
        await _fsck.examine(redis_client, KEYS, max_payload=limit + 1)
    ).problems == []
    # An envelope too large even to decode is refused by its size alone.
    await redis_client.hset(KEYS.task("ok"), "e", b"\xc4" * (limit + 2000))
    found = (await _fsck.examine(redis_client, KEYS, max_payload=limit)).problems
    assert {(p.kind, p.task_id) for p in found} == {
        (problem_kinds.OVERSIZED, "ok"),
        (problem_kinds.OVERSIZED, "big"),
    }


async def test_every_key_queue_keys_makes_is_known(
    redis_client: redis.asyncio.Redis,
) -> None:
    # A guard for new keys: each per-task/group/consumer key QueueKeys can
    # make must be one the check knows (here with a wrong value, so other
    # problems are expected, but never "unknown-key").
    makers = [
        name
        for name, function in inspect.getmembers(QueueKeys, inspect.isfunction)
        if not name.startswith("_")
        and len(inspect.signature(function).parameters) == 2
        and name not in ("owns", "pattern")  # a test and a SCAN pattern
    ]
    assert {"task", "group", "parked", "held", "inflight", "dedup"} <= set(makers)
    for name in makers:
        await redis_client.set(getattr(KEYS, name)("x"), "1")
    found = (await _fsck.examine(redis_client, KEYS)).problems
    assert [p for p in found if p.kind == problem_kinds.UNKNOWN_KEY] == []
    assert len(await redis_client.keys(KEYS.pattern())) == len(makers)
    # And every fixed key QueueKeys names is one the check knows.
    fixed = {
        name
        for name in QueueKeys.__slots__
        if name not in ("prefix", "queue", "partition")
    }
    assert fixed == set(_snapshot.FIXED)


# -- the command line ------------------------------------------------------------


async def _cli(redis_url: str, *args: str) -> tuple[int, str]:
    argv = [sys.executable, "-m", "aiogroupq", "check", *args]
    done = await anyio.run_process([*argv, "--redis-url", redis_url], check=False)
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def test_check_command_says_when_a_queue_has_no_keys(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    await build(redis_client)
    code, out = await _cli(redis_url, "--queue", "no-such-queue")
    assert code == 0, out
    assert "queue 'no-such-queue' has no keys" in out
    assert "problems" not in out


async def test_check_command_reports_and_repairs(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    q = await build(redis_client)
    code, out = await _cli(redis_url, "--queue", QUEUE)
    assert (code, out.splitlines()[-1]) == (0, f"queue {QUEUE!r}: 0 problems")
    await redis_client.lrem(KEYS.parked("g1"), 0, "a03")
    await redis_client.hdel(KEYS.task("u01"), "m")
    code, out = await _cli(redis_url, "--queue", QUEUE)
    assert code == 1
    assert "lost-task task 'a03' group 'g1'" in out
    assert "bad-task task 'u01'" in out
    problems = (await _fsck.examine(redis_client, KEYS)).problems
    assert out.splitlines()[-1] == f"queue {QUEUE!r}: {len(problems)} problems"
    code, out = await _cli(redis_url, "--queue", QUEUE, "--repair")
    assert code == 0, out
    assert "repaired: place task 'a03' group 'g1': put back in park:g1" in out
    assert out.splitlines()[-1].endswith("changes made, 0 problems left")
    assert (await _fsck.examine(redis_client, KEYS)).problems == []
    assert await q.line("g1") == ["a02", "a03", "a04"]
    assert await q.state("u01") == "dead"


async def test_check_command_holds_envelopes_to_the_given_limit(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    task = _scripts.NewTask("big", None, _envelope("big", 300), 0, 3, None)
    await _scripts.enqueue(redis_client, KEYS, [task], dedup_window_ms=60_000)
    code, out = await _cli(redis_url, "--queue", QUEUE)
    assert code == 0, out
    code, out = await _cli(redis_url, "--queue", QUEUE, "--max-payload-bytes", "299")
    assert code == 1
    assert "oversized task 'big': the payload is 300 bytes" in out
    code, out = await _cli(redis_url, "--queue", QUEUE, "--max-payload-bytes", "0")
    assert code == 2, out
