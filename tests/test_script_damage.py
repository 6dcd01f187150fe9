"""Every script against damaged keys: each fixed key of the wrong type, and
stats counters that are not integers.

Each test damages a key and checks that the scripts refuse before writing
(nothing changes) or harm only the damaged task or group. The engine before
the group-slot layout failed each one: its scripts read keys with
redis.call, so a wrong-typed key stopped them half-way through (writes done
before the error stay: Redis has no rollback), and they never checked the
fence or a task hash's fields. The damage each script meets on its own is
in its own test file.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio

from aiogroupq._check import (
    check as _fsck,
    problems as problem_kinds,
    snapshot as _snapshot,
)
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.replies import FinishCode
from aiogroupq.errors import CorruptQueueError

from ._scripts_helpers import (
    KEYS,
    LONG_MS,
    WINDOW_MS,
    assert_consistent,
    claim,
    claim_ids,
    claim_one,
    control,
    dump,
    enqueue,
    expire_lease,
    fall_due,
    finish,
    hash_of,
    lrange,
    new,
    ok,
    set_group,
)

if TYPE_CHECKING:
    from redis.typing import EncodableT


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
    for name, kind in sorted(_snapshot.FIXED.items()):
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
    assert await finish(redis_client, ok(a1)) == [FinishCode.APPLIED]
    assert await claim_ids(redis_client) == ["a2"]
    assert await hash_of(redis_client, KEYS.stats) == {
        "parked": "junk",
        "started": "x",
        "enqueued": "2",
        "succeeded": "1",
        "groups": "1",
    }
    problems = (await _fsck.examine(redis_client, KEYS)).problems
    assert {p.kind for p in problems} == {problem_kinds.BAD_COUNT}


@pytest.mark.parametrize("junk", ["01", "-0", " 1", "+1", "1.5"])
async def test_a_counter_the_server_does_not_read_as_an_integer_is_reported(
    redis_client: redis.asyncio.Redis, junk: str
) -> None:
    """Python's int() takes some of these: the check must not, as the
    server refuses to increment any of them (and the call goes through)."""
    await redis_client.hset(KEYS.stats, "enqueued", junk)
    assert await enqueue(redis_client, new("u1")) == ["u1"]
    assert await enqueue(redis_client, new("a1", "g"), new("u2")) == ["a1", "u2"]
    assert (await hash_of(redis_client, KEYS.stats))["enqueued"] == junk
    problems = (await _fsck.examine(redis_client, KEYS)).problems
    assert {p.kind for p in problems} == {problem_kinds.BAD_COUNT}


async def test_a_counter_at_its_limit_fails_no_script(
    redis_client: redis.asyncio.Redis,
) -> None:
    """A counter one step from overflow: the server refuses the increment
    (worded as it likes); the call goes through and the counter stays."""
    top = str(2**63 - 1)
    await redis_client.hset(KEYS.stats, "enqueued", top)
    assert await enqueue(redis_client, new("a1", "g"), new("u1")) == ["a1", "u1"]
    assert await enqueue(redis_client, new("u2")) == ["u2"]
    assert (await hash_of(redis_client, KEYS.stats))["enqueued"] == top
