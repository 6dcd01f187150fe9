"""The estimates' start counter (``starts``) stuffed with fields no claim
wrote: a claim does a bounded part of the cleanup (it swept the whole hash in
one script, 265 ms of Redis for 200,000 fields), the check reports the rest
(``stale-starts``) and its repair deletes it in slices, keeping the window's
samples.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio

import aiogroupq
from aiogroupq._check import problems as problem_kinds
from aiogroupq._check.repair import repair_queue
from aiogroupq._limits import STARTS_MOST
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys

#: fields stuffed into the counter
STUFFED = 200_000


async def _stuff(client: redis.asyncio.Redis, key: str, now_s: int, n: int) -> None:
    """*n* fields of old seconds (none within a claim's own cleanup, the
    window before the current one), in slices."""
    first = now_s - 10 * 86_400 - n
    for start in range(0, n, 10_000):
        fields = {str(first + i): "1" for i in range(start, min(n, start + 10_000))}
        await client.hset(key, mapping=fields)  # type: ignore[arg-type]


async def _start_counting(
    client: redis.asyncio.Redis, queue: str
) -> tuple[aiogroupq.Producer, str]:
    """A task of *queue*, with the counter switched on (an estimate asked)."""
    async with (
        aiogroupq.Producer(client, queue=queue) as producer,
        aiogroupq.Admin(client, queue=queue) as admin,
    ):
        task_id = await producer.enqueue("work", 1)
        assert await admin.estimate(task_id) is None  # switches the counter on
    return producer, task_id


async def test_a_claim_does_bounded_work_on_a_stuffed_counter(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "est-stuffed"
    keys = QueueKeys(queue)
    _, task_id = await _start_counting(redis_client, queue)
    (now_s, _) = await redis_client.time()
    await _stuff(redis_client, keys.starts, now_s, STUFFED)
    before = await redis_client.hlen(keys.starts)
    assert before == STUFFED

    reply = await _scripts.claim(
        redis_client, keys, "c1", k=1, lease_ms=60_000, scan_limit=50
    )
    assert [t.id for t in reply.tasks] == [task_id]  # counted: a new second
    after = await redis_client.hlen(keys.starts)
    removed = before + 1 - after  # + the second the claim counted in
    print(f"one claim removed {removed} of {STUFFED} stuffed fields")  # noqa: T201
    # The claim used to read and delete all 200,000 in one script.
    assert 0 <= removed <= STARTS_MOST, removed
    raw: Any = await redis_client.hgetall(keys.starts)
    assert sum(1 for k in raw if int(k) >= now_s) == 1  # its own second counted


async def test_a_claim_still_sweeps_the_few_fields_claims_leave(
    redis_client: redis.asyncio.Redis,
) -> None:
    """Below the bound, leftovers (a busy spell before an idle gap, a clock
    set back) still go at the next claim of a new second."""
    queue = "est-few"
    keys = QueueKeys(queue)
    _, task_id = await _start_counting(redis_client, queue)
    (now_s, _) = await redis_client.time()
    await _stuff(redis_client, keys.starts, now_s, STARTS_MOST - 10)
    await redis_client.hset(keys.starts, str(now_s + 3600), "5")  # clock set back
    reply = await _scripts.claim(
        redis_client, keys, "c1", k=1, lease_ms=60_000, scan_limit=50
    )
    assert [t.id for t in reply.tasks] == [task_id]
    raw: Any = await redis_client.hgetall(keys.starts)
    assert len(raw) == 1
    assert now_s <= int(next(iter(raw))) <= now_s + 1


async def test_the_check_reports_a_stuffed_counter_and_repair_clears_it(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "est-repair"
    keys = QueueKeys(queue)
    await _start_counting(redis_client, queue)
    (now_s, _) = await redis_client.time()
    await _stuff(redis_client, keys.starts, now_s, STUFFED)
    await redis_client.hset(keys.starts, "junk", "1")
    # The window's samples, which the repair keeps.
    window = {str(now_s - i): str(i + 1) for i in range(3)}
    await redis_client.hset(keys.starts, mapping=window)  # type: ignore[arg-type]

    problems = await aiogroupq.check_queue(redis_client, queue)
    assert [(p.kind, p.key) for p in problems] == [
        (problem_kinds.STALE_STARTS, keys.starts)
    ]
    assert str(STUFFED + 1 + len(window)) in problems[0].detail
    print(problems[0])  # noqa: T201

    done = await repair_queue(redis_client, queue)
    assert [r.step for r in done] == ["starts"]
    assert f"deleted {STUFFED + 1} fields" in done[0].detail
    raw: Any = await redis_client.hgetall(keys.starts)
    assert {k.decode(): v.decode() for k, v in raw.items()} == window
    assert await aiogroupq.check_queue(redis_client, queue) == []
