"""How many Redis commands the hot scripts run per task (issue 20: Redis
CPU per task life). Counted from ``INFO commandstats``, never timed: a claim
writes its leases and recovery-key members once per call, a finish removes
them once per call,
an emptied group's hash goes without deleting its slot's mark first, and a
single enqueue probes only the fixed keys it writes. Each test prints its
figure. Also the batches' edge cases: an id twice in one finish, outcomes of
several consumers' claims in one finish."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio

from aiogroupq._store import scripts as _scripts
from aiogroupq._store.replies import FinishCode
from aiogroupq.errors import CorruptQueueError

from ._scripts_helpers import (
    KEYS,
    assert_consistent,
    claim,
    enqueue,
    finish,
    new,
    ok,
    smembers,
    zmembers,
)

#: commands a script's own bookkeeping runs besides the ones counted
_SCRIPTS = ("evalsha", "eval", "script|load", "fcall", "function|load", "info")


async def _commands(client: redis.asyncio.Redis) -> int:
    """Commands run so far, scripts' inner ones included, scripts not."""
    info: dict[str, Any] = await client.info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in info.items()
        if k.removeprefix("cmdstat_") not in _SCRIPTS
    )


async def _drain_commands(client: redis.asyncio.Redis, grouped: bool) -> float:
    n = 64
    await enqueue(
        client, *(new(f"t{i:03d}", f"g{i}" if grouped else None) for i in range(n))
    )
    before = await _commands(client)
    done = 0
    while done < n:
        reply = await claim(client, k=32)
        assert reply.tasks
        codes = await finish(client, *(ok(t) for t in reply.tasks))
        assert codes == [FinishCode.APPLIED] * len(reply.tasks)
        done += len(reply.tasks)
    return (await _commands(client) - before) / n


async def test_drain_commands_per_ungrouped_task(
    redis_client: redis.asyncio.Redis,
) -> None:
    per_task = await _drain_commands(redis_client, grouped=False)
    print(f"claim + finish, ungrouped: {per_task:.2f} commands per task")  # noqa: T201
    # 13.1 before: a lease and a recovery-key member added and removed per task
    assert per_task <= 9.5
    await assert_consistent(redis_client)


async def test_drain_commands_per_task_in_its_own_group(
    redis_client: redis.asyncio.Redis,
) -> None:
    per_task = await _drain_commands(redis_client, grouped=True)
    print(  # noqa: T201 - the figure this test reports
        f"claim + finish, each task its own group: {per_task:.2f} commands per task"
    )
    # 19.2 before: also a mark read apart from its group's, and deleted
    # before the group's whole hash
    assert per_task <= 14
    await assert_consistent(redis_client)


async def test_single_enqueue_probes_only_the_keys_it_writes(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("warm"))
    before = await _commands(redis_client)
    await enqueue(redis_client, new("one"))
    used = await _commands(redis_client) - before
    print(f"one ungrouped enqueue: {used} commands")  # noqa: T201
    # 14 before: conf, backlog, waiting and delayed were probed too
    assert used <= 10


async def test_an_id_twice_in_one_finish_is_applied_once(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, new("a", "g"), new("b", "g"))
    (a,) = (await claim(redis_client, k=1)).tasks
    codes = await finish(redis_client, ok(a), ok(a))
    assert codes == [FinishCode.APPLIED, FinishCode.DUPLICATE]
    assert await zmembers(redis_client, KEYS.leases) == []
    assert [t.id for t in (await claim(redis_client, k=1)).tasks] == ["b"]
    await assert_consistent(redis_client)


async def test_one_finish_for_several_consumers_claims(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, *(new(f"t{i}", f"g{i % 2}") for i in range(4)))
    mine = (await claim(redis_client, "c1", k=1)).tasks
    theirs = (await claim(redis_client, "c2", k=1)).tasks
    assert len(mine) == len(theirs) == 1
    retry = _scripts.Outcome(theirs[0].id, theirs[0].token, "retry", 0, "boom")
    codes = await finish(redis_client, ok(mine[0]), retry)
    assert codes == [FinishCode.APPLIED, FinishCode.APPLIED]
    assert await smembers(redis_client, KEYS.inflight("c1")) == set()
    assert await smembers(redis_client, KEYS.inflight("c2")) == set()
    assert await zmembers(redis_client, KEYS.leases) == []
    await assert_consistent(redis_client)


async def test_an_enqueue_checks_only_the_keys_its_tasks_write(
    redis_client: redis.asyncio.Redis,
) -> None:
    await redis_client.set(KEYS.delayed, "not a zset")
    assert await enqueue(redis_client, new("now")) == ["now"]
    with pytest.raises(CorruptQueueError) as caught:
        await enqueue(redis_client, new("later", delay_ms=60_000))
    assert caught.value.key == KEYS.delayed
    assert not await redis_client.exists(KEYS.task("later"))
