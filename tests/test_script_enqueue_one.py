"""``enqueue_one.lua``, the lone plain task's script: it must leave exactly
what ``enqueue.lua`` leaves for the same task, refuse what it refuses, and
be the one a lone plain ``enqueue()`` runs (and only it)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.replies import StaleLayoutRefusal

from ._scripts_helpers import KEYS, WINDOW_MS, dump, enqueue, new, server_ms

Setup = Callable[[redis.asyncio.Redis], Awaitable[Any]]


async def _full(client: redis.asyncio.Redis, task: _scripts.NewTask) -> list[str]:
    args = _scripts._enqueue_args([task], WINDOW_MS, None)
    reply = await _scripts.ENQUEUE(client, KEYS, (), args)
    return [bytes(r).decode() for r in reply]


async def _one(client: redis.asyncio.Redis, task: _scripts.NewTask) -> list[str]:
    reply = await _scripts.ENQUEUE_ONE(client, KEYS, (), _scripts._one_args(task))
    return [bytes(reply).decode()]


_TIME_FIELDS = (b"dt", b"xp")
_DAY_MS = 86_400_000


@dataclasses.dataclass(frozen=True)
class _Offset:
    """A time the script wrote, as its offset from the script's clock: the
    script ran at some moment between *start* and *end*, so the offset lies
    in [low, high]. Two runs agree when their ranges meet; rounding to a
    unit instead fails whenever a run straddles the unit's edge."""

    low: int
    high: int

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Offset):
            return NotImplemented
        return self.low <= other.high and other.low <= self.high

    def __hash__(self) -> int:  # ranges that meet need not be one value
        return 0


def _normalized(state: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    """*state* with the times the scripts took from their clock made offsets
    from it (the two runs happen at different times). A time far from the
    run is one the caller sent (an absolute expiry) and is kept as it is."""

    def rel(value: bytes | float) -> _Offset | float:
        ms = float(value)
        if abs(ms - start) > _DAY_MS:
            return ms
        return _Offset(int(ms) - end, int(ms) - start + 1)

    out: dict[str, Any] = {}
    for key, value in state.items():
        if key.endswith(":pseq"):
            value = rel(float(value) / 8)  # 8 per ms of server time
        elif key.endswith(":pready") and all(isinstance(v, tuple) for v in value):
            # (9 - level) * 2^49 + seq: the level, and the order kept
            value = [(member, int(score) >> 49) for member, score in value]
        elif isinstance(value, dict):
            value = {f: rel(v) if f in _TIME_FIELDS else v for f, v in value.items()}
        out[key] = value
    return out


async def _nothing(client: redis.asyncio.Redis) -> None:
    pass


async def _priorities_in_use(client: redis.asyncio.Redis) -> None:
    await enqueue(client, new("p", priority=4))


async def _partitioned(client: redis.asyncio.Redis) -> None:
    await client.hset(KEYS.conf, "parts", "2")


async def _paused_with_fetchers_waiting(client: redis.asyncio.Redis) -> None:
    await client.hset(KEYS.conf, mapping={"pause": "1", "fair": "drain"})
    await client.rpush(KEYS.wake, "1")


async def _damaged_ready(client: redis.asyncio.Redis) -> None:
    await client.set(KEYS.ready, "a string")


async def _damaged_stats(client: redis.asyncio.Redis) -> None:
    await client.rpush(KEYS.stats, "a list")


async def _damaged_conf(client: redis.asyncio.Redis) -> None:
    await client.rpush(KEYS.conf, "a list")


async def _damaged_pready(client: redis.asyncio.Redis) -> None:
    await _priorities_in_use(client)
    await client.delete(KEYS.pready)
    await client.rpush(KEYS.pready, "a list")


async def _stuffed_wake(client: redis.asyncio.Redis) -> None:
    await client.rpush(KEYS.wake, *["1"] * 70)


_TASKS = [
    new("u1"),
    new("u2", max_attempts=1),
    dataclasses.replace(new("u3"), expires_ms=60_000, identity="1 4 t"),
    new("u4", expire_at_ms=4_102_444_800_000),
    new("u1"),  # re-sent: left as it is
    new("u5", priority=0),
    new("u6", max_attempts=10**17),  # stored as sent, not as a double's text
]

_SCENES: list[tuple[str, Setup]] = [
    ("empty queue", _nothing),
    ("priorities in use", _priorities_in_use),
    ("partitioned", _partitioned),
    ("paused, fetchers waiting", _paused_with_fetchers_waiting),
    ("damaged ready", _damaged_ready),
    ("damaged stats", _damaged_stats),
    ("damaged conf", _damaged_conf),
    ("priorities in use, damaged pready", _damaged_pready),
    ("wake tokens past the cap", _stuffed_wake),
]


async def _run(
    client: redis.asyncio.Redis,
    setup: Setup,
    send: Callable[[redis.asyncio.Redis, _scripts.NewTask], Awaitable[list[str]]],
) -> tuple[list[str], dict[str, Any]]:
    await client.flushdb()
    # Before the setup: the times it writes (a task's dt, pseq) are in the
    # run's window too, so both runs' ranges hold the same offsets.
    start = await server_ms(client)
    await setup(client)
    outcomes = []
    for task in _TASKS:
        assert _scripts._plain(task), task
        try:
            outcomes.append(",".join(await send(client, task)))
        except Exception as exc:  # noqa: BLE001 - compared as a name and a reason
            # The reason without the server's wording (after the key's name).
            reason = re.sub(r"(aiogroupq \w+ \S+?):? .*", r"\1", str(exc))
            outcomes.append(f"{type(exc).__name__}: {reason}")
    end = await server_ms(client)
    return outcomes, _normalized(await dump(client), start, end)


@pytest.mark.parametrize("setup", [s for _, s in _SCENES], ids=[n for n, _ in _SCENES])
async def test_it_leaves_what_the_full_script_leaves(
    redis_client: redis.asyncio.Redis, setup: Setup
) -> None:
    full = await _run(redis_client, setup, _full)
    one = await _run(redis_client, setup, _one)
    assert one == full
    assert full[0], "the scene ran no task"


async def test_a_partitioned_queue_refuses_it_and_keeps_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    await _partitioned(redis_client)
    before = await dump(redis_client)
    with pytest.raises(StaleLayoutRefusal):
        await enqueue(redis_client, new("u1"))
    assert await dump(redis_client) == before


_NOT_PLAIN = [
    ("grouped", new("x", "g")),
    ("delayed", new("x", delay_ms=5_000)),
    ("run at", dataclasses.replace(new("x"), run_at_ms=4_102_444_800_000)),
    ("dedup key", new("x", dedup="d")),
    ("unique", new("x", dedup="d", unique=True)),
    ("priority", new("x", priority=3)),
    ("schedule", dataclasses.replace(new("x"), schedule="s", tick_ms=1)),
]


async def _ran(client: redis.asyncio.Redis) -> tuple[bool, bool]:
    one, full = await client.script_exists(
        _scripts.ENQUEUE_ONE.sha, _scripts.ENQUEUE.sha
    )
    return bool(one), bool(full)


@pytest.mark.parametrize(
    "task", [t for _, t in _NOT_PLAIN], ids=[n for n, _ in _NOT_PLAIN]
)
@pytest.mark.usefixtures("scripts_only")  # which script ran: the cache tells
async def test_anything_but_a_lone_plain_task_runs_the_full_script(
    redis_client: redis.asyncio.Redis, task: _scripts.NewTask
) -> None:
    assert not _scripts._plain(task)
    await redis_client.script_flush()
    await enqueue(redis_client, task)
    assert await _ran(redis_client) == (False, True)


@pytest.mark.usefixtures("scripts_only")  # which script ran: the cache tells
async def test_a_lone_plain_enqueue_runs_the_light_script(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    await redis_client.script_flush()
    async with aiogroupq.Producer(redis_url, queue=KEYS.queue) as producer:
        task_id = await producer.enqueue("t", {"n": 1}, expires=30)
        assert await _ran(redis_client) == (True, False)
        # Two plain tasks in one call are a batch: the full script.
        await producer.enqueue_many([aiogroupq.Task("t"), aiogroupq.Task("t")])
        assert await _ran(redis_client) == (True, True)
        assert await producer.status(task_id) == aiogroupq.TaskState.QUEUED
