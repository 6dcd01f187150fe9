"""What the script tests share: a queue's keys, calls of each wrapper with
the tests' defaults, and readers of the keys the scripts leave behind.

Every scenario inspects the keys the scripts leave behind (the ready list,
the priority set, group hashes ``grp:<g>`` with their counts and slot marks,
lines ``park:<g>``, held lists, the delayed set, leases, recovery keys, task
hashes, counters) and, where the queue is meant to be healthy, ends with
:func:`assert_consistent`. Lease expiry is real (a claim with a tiny lease,
then a sleep past it) or simulated by setting a lease's score to 0; either
is a precondition, never a measured duration.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio

from aiogroupq._check import check as _fsck
from aiogroupq._store import functions as _functions, scripts as _scripts
from aiogroupq._store.keys import QueueKeys

from ._tasks import envelope_of

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from aiogroupq._store.replies import FinishCode

KEYS = QueueKeys("scripts")
#: a lease nobody outlives in a test
LONG_MS = 600_000
#: the dedup window and retention of the tests (never reached)
WINDOW_MS = 600_000


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
) -> list[FinishCode]:
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


def decoded(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="surrogateescape")
    return str(value)


async def lrange(client: redis.asyncio.Redis, key: str) -> list[str]:
    """A whole list, decoded."""
    return [decoded(v) for v in await client.lrange(key, 0, -1)]


async def zmembers(client: redis.asyncio.Redis, key: str) -> list[str]:
    """A sorted set's members in score order, decoded."""
    return [decoded(v) for v in await client.zrange(key, 0, -1)]


async def smembers(client: redis.asyncio.Redis, key: str) -> set[str]:
    """A set's members, decoded."""
    return {decoded(v) for v in await client.smembers(key)}


async def get(client: redis.asyncio.Redis, key: str) -> str | None:
    """A string value, decoded, or None."""
    value = await client.get(key)
    return None if value is None else decoded(value)


async def field(client: redis.asyncio.Redis, task_id: str, name: str) -> str | None:
    """One field of a task hash, decoded, or None."""
    value = await client.hget(KEYS.task(task_id), name)
    return None if value is None else decoded(value)


async def hash_of(client: redis.asyncio.Redis, key: str) -> dict[str, str]:
    """A whole hash, decoded."""
    return {decoded(k): decoded(v) for k, v in (await client.hgetall(key)).items()}


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


async def dump(client: redis.asyncio.Redis, pattern: str = "*") -> dict[str, Any]:
    """Every key of the database (matching *pattern*) with its value, to
    prove "nothing changed": values as read, not ``DUMP``'s bytes, which
    give a hash table's entries in its own order, one that a server's
    rehashing may change with no write."""
    out: dict[str, Any] = {}
    for raw in sorted(await client.keys(pattern)):
        key = decoded(raw)
        kind = decoded(await client.type(raw))
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
    """The queue's keys keep every invariant (see :mod:`aiogroupq._check.check`)."""
    assert (await _fsck.examine(client, KEYS)).problems == []


async def expire_lease(client: redis.asyncio.Redis, task_id: str) -> None:
    """The task's consumer stopped renewing: its lease deadline is past."""
    assert await client.zadd(KEYS.leases, {task_id: 0}, xx=True, ch=True) == 1


async def fall_due(client: redis.asyncio.Redis, member: str) -> None:
    """A delayed member (task or rate wake-up) is due now."""
    assert await client.zadd(KEYS.delayed, {member: 0}, xx=True, ch=True) == 1


#: empties the cache of the way a test's calls take (conftest's ``flush``)
Flush = Callable[[redis.asyncio.Redis], Awaitable[None]]

#: the commands that run a script: EVALSHA or EVAL, or FCALL (the library)
SCRIPT_CALLS = ("evalsha", "eval", "fcall")


async def script_calls(client: redis.asyncio.Redis) -> int:
    """Script calls the server has run so far, by either way."""
    stats: dict[str, Any] = await client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPT_CALLS
    )


class Recorder:
    """Stands in for a client to capture the exact EVALSHA arguments a wrapper
    builds, so malformed variants can be made without hard-coding the layout."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.args: tuple[Any, ...] = ()
        _functions.settle(self, fcall=False)  # EVALSHA: what it records

    async def evalsha(self, sha: str, numkeys: int, *args: Any) -> Any:
        self.args = (numkeys, *args)
        return self.reply


def replaced(args: Sequence[Any], old: object, new: EncodableT) -> list[Any]:
    """*args* with the one argument equal to *old* replaced by *new*."""
    assert sum(1 for a in args if a == old) == 1, (old, args)
    return [new if a == old else a for a in args]
