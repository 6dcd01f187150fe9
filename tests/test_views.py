"""The introspection API (``Admin.stats``, ``group_info``, ``groups``,
``task``, ``position``, ``consumers``, and ``Producer.status_many``) against a
real server.

Every state is set up with the real scripts (claims, finishes, the group
controls), never by writing keys, and the consistency check runs after each
scenario, which also verifies the counters the views read.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import GroupState, TaskState
from aiogroupq._check import check as _fsck
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.replies import FinishCode, HeartbeatCode

if TYPE_CHECKING:
    from ._roles import Both
    from ._scripts_helpers import Flush

from ._clock import near

QUEUE = "views"
KEYS = QueueKeys(QUEUE)
LEASE_MS = 60_000
#: liveness only: how long a consumer may take to show up
PATIENCE = 30.0


async def claim(
    client: redis.asyncio.Redis, consumer: str = "c1", k: int = 1
) -> list[_scripts.Claimed]:
    reply = await _scripts.claim(
        client, KEYS, consumer, k=k, lease_ms=LEASE_MS, scan_limit=100
    )
    return reply.tasks


async def finish(
    client: redis.asyncio.Redis,
    task: _scripts.Claimed,
    kind: _scripts.OutcomeKind,
    arg1: str | int = "",
    arg2: str = "",
) -> None:
    outcome = _scripts.Outcome(task.id, task.token, kind, arg1, arg2)
    codes = await _scripts.finish(client, KEYS, [outcome], retention_ms=60_000)
    assert codes == [FinishCode.APPLIED]


async def consistent(client: redis.asyncio.Redis) -> None:
    assert (await _fsck.examine(client, KEYS)).problems == []


async def register(
    client: redis.asyncio.Redis, name: str, lease_ms: int = LEASE_MS
) -> None:
    """A consumer's heartbeat, as consumer.py sends it."""
    fields: list[tuple[str, Any]] = [("host", "h1"), ("pid", 4242), ("c", 8)]
    await _scripts.heartbeat(
        client, KEYS, [], lease_ms=lease_ms, consumer=name, registration=fields
    )


# -- stats ---------------------------------------------------------------------


async def test_stats_of_a_queue_that_does_not_exist(both: Both) -> None:
    _, admin = both
    stats = await admin.stats()
    assert not stats.exists
    assert (stats.ready, stats.running, stats.dead, stats.groups) == (0, 0, 0, 0)
    assert stats.oldest_waiting is None
    assert stats.next_due_in is None
    assert set(stats.totals.values()) == {0}


async def test_stats_counts_every_place_a_task_can_be(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    # One running task.
    await producer.enqueue("t", group="run")
    assert len(await claim(redis_client)) == 1
    # A retry waiting out its backoff (counted as delayed).
    await producer.enqueue("t", group="retry")
    (r,) = await claim(redis_client)
    await finish(redis_client, r, "retry", 60_000, "Boom: once")
    # A group halted behind a dead task, its next task parked behind it.
    await producer.enqueue_many([aiogroupq.Task("t", group="halt")] * 2)
    (d,) = await claim(redis_client)
    await finish(redis_client, d, "halt", "Boom: dead", "Traceback")
    # A paused group's head, held back when a claim meets it.
    await producer.enqueue("t", group="paused")
    await admin.pause_group("paused")
    assert await claim(redis_client) == []
    # A rate-limited group's head, held until its rate frees.
    await admin.set_group("rated", rate=aiogroupq.Rate(1, 60))
    await producer.enqueue_many([aiogroupq.Task("t", group="rated")] * 2)
    (q,) = await claim(redis_client)
    await finish(redis_client, q, "ok")
    assert await claim(redis_client) == []
    # Waiting: two ungrouped, a group with a head and a line, a delayed one.
    await producer.enqueue_many([aiogroupq.Task("t")] * 2)
    await producer.enqueue_many([aiogroupq.Task("t", group="line")] * 3)
    await producer.enqueue("t", delay=60)

    stats = await admin.stats()
    print(stats)  # noqa: T201
    assert stats.exists
    assert not stats.paused
    assert stats.ready == 3  # two ungrouped, the head of "line"
    assert stats.parked == 2  # "line" 2
    assert stats.held == 3  # "paused", "rated", and "halt" 1 behind its dead task
    assert stats.delayed == 2  # the retry, the delayed task
    assert stats.running == 1
    assert stats.dead == 1
    assert stats.waiting == 8
    assert stats.groups == 6
    assert stats.groups_waiting == 2
    assert (stats.groups_halted, stats.groups_paused) == (1, 1)
    assert stats.groups_rate_limited == 1
    assert stats.oldest_waiting is not None
    assert stats.oldest_waiting >= 0
    assert stats.next_due_in is not None
    assert stats.next_due_in <= 60
    totals = stats.totals
    assert totals["enqueued"] == 13
    assert totals["started"] == 4
    assert (totals["succeeded"], totals["retried"], totals["dead"]) == (1, 1, 1)
    # Every live task is in exactly one of the counts.
    ended = totals["succeeded"] + totals["dead"]
    live = stats.waiting + stats.delayed + stats.running
    assert totals["enqueued"] - ended == live
    await consistent(redis_client)


async def test_stats_of_a_paused_queue(both: Both) -> None:
    _, admin = both
    await admin.pause()
    stats = await admin.stats()
    assert stats.paused
    assert stats.exists
    await admin.resume()
    assert not (await admin.stats()).paused


async def test_stats_oldest_waiting_is_the_ready_head(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue("t")
    await anyio.sleep(0.2)
    oldest = (await admin.stats()).oldest_waiting
    assert oldest is not None
    assert oldest >= 0.19
    await claim(redis_client)
    assert (await admin.stats()).oldest_waiting is None


async def test_stats_reports_a_damaged_key(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    _, admin = both
    await redis_client.set(KEYS.ready, "not a list")
    with pytest.raises(aiogroupq.CorruptQueueError, match="ready"):
        await admin.stats()


# -- group_info: every state ---------------------------------------------------


async def test_an_unknown_group_is_idle(both: Both) -> None:
    info = await both[1].group_info("nobody")
    assert info.state == GroupState.IDLE
    assert (info.running, info.backlog, info.head) == (0, 0, None)


async def test_a_runnable_head_is_ready_and_says_when_no_consumer_lives(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    task_id = await producer.enqueue("t", group="g")
    info = await admin.group_info("g")
    assert info.state == GroupState.READY
    assert info.head is not None
    assert info.head.id == task_id
    assert info.head.slot == "ready"
    assert "no consumer is alive" in info.reason
    await register(redis_client, "c1")
    info = await admin.group_info("g")
    assert info.consumers_alive == 1
    assert "no consumer" not in info.reason


async def test_running_and_at_cap(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    first = await producer.enqueue("t", group="g")
    (_task,) = await claim(redis_client, "worker-1")
    info = await admin.group_info("g")
    assert info.state == GroupState.RUNNING
    (holder,) = info.holders
    assert (holder.id, holder.slot, holder.consumer) == (first, "running", "worker-1")
    assert near(holder.lease_deadline, info.now + LEASE_MS / 1000)
    assert "worker-1" in info.reason
    later = await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 2)
    info = await admin.group_info("g")
    assert info.state == GroupState.AT_CAP
    assert (info.running, info.backlog, info.concurrency) == (1, 2, 1)
    assert info.head is not None
    assert (info.head.id, info.head.slot) == (
        later[0],
        "line",
    )
    assert info.oldest_age is not None
    await consistent(redis_client)


async def test_at_cap_with_a_concurrency_above_one(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await admin.set_group("g", concurrency=2)
    await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 3)
    assert len(await claim(redis_client, k=2)) == 2
    info = await admin.group_info("g")
    assert info.state == GroupState.AT_CAP
    assert (info.running, info.backlog, info.concurrency) == (2, 1, 2)
    assert [h.slot for h in info.holders] == ["running", "running"]


async def test_a_retry_holds_the_group(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 2)
    (task,) = await claim(redis_client)
    await finish(redis_client, task, "retry", 60_000, "Boom: try again")
    info = await admin.group_info("g")
    assert info.state == GroupState.WAITING_RETRY
    assert info.head is not None
    assert (info.head.id, info.head.slot, info.head.attempt) == (task.id, "retry", 1)
    assert near(info.head.due_at, info.now + 60)
    assert info.backlog == 1
    details = await admin.task(task.id)
    assert details.error == "Boom: try again"
    assert near(details.due_at, details.now + 60)
    await consistent(redis_client)


async def test_a_halted_group_names_its_dead_task(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 2)
    (task,) = await claim(redis_client)
    await finish(redis_client, task, "halt", "ValueError: bad row", "Traceback ...")
    info = await admin.group_info("g")
    assert info.state == GroupState.HALTED
    assert info.halted_by == task.id
    assert info.halted_reason == "ValueError: bad row"
    assert task.id in info.reason
    assert "release" in info.reason
    assert await admin.release_group("g")
    assert (await admin.group_info("g")).state == GroupState.READY
    await consistent(redis_client)


async def test_paused_group_and_paused_queue(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 2)
    await admin.pause_group("g")
    info = await admin.group_info("g")
    assert info.state == GroupState.PAUSED
    assert info.paused
    assert not info.queue_paused
    assert "resume g" in info.reason
    await admin.resume_group("g")
    await admin.pause()
    info = await admin.group_info("g")
    assert info.state == GroupState.PAUSED
    assert info.queue_paused
    assert not info.paused
    await admin.resume()
    assert (await admin.group_info("g")).state == GroupState.READY


async def test_a_rate_limited_group_says_when_it_may_start(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await admin.set_group("g", rate=aiogroupq.Rate(1, 60))
    ids = await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 3)
    (task,) = await claim(redis_client)
    await finish(redis_client, task, "ok")
    assert await claim(redis_client) == []  # out of rate: held aside
    info = await admin.group_info("g")
    assert info.state == GroupState.RATE_LIMITED
    assert info.rate == (1, 60.0)
    assert near(info.rate_free_at, info.now + 60)
    assert info.head is not None
    assert (info.head.id, info.head.slot) == (ids[1], "held")
    assert info.head.due_at == info.rate_free_at
    assert info.backlog == 1
    await consistent(redis_client)


async def test_only_delayed_tasks_and_a_full_group(both: Both) -> None:
    producer, admin = both
    await admin.set_group("g", max_size=2)
    await producer.enqueue("t", group="g", delay=60)
    info = await admin.group_info("g")
    assert info.state == GroupState.DELAYED
    assert (info.delayed, info.full, info.max_size) == (1, False, 2)
    await producer.enqueue("t", group="g", delay=60)
    assert (await admin.group_info("g")).full


async def test_a_damaged_group_is_reported_not_raised(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue("t", group="ok")
    await redis_client.set(KEYS.group("bad"), "not a hash")
    assert (await admin.group_info("bad")).state == GroupState.DAMAGED
    assert (await admin.group_info("ok")).state == GroupState.READY


# -- groups(): pages -------------------------------------------------------------


async def _all_pages(
    admin: aiogroupq.Admin, sort: Any, limit: int
) -> list[aiogroupq.GroupInfo]:
    seen: list[aiogroupq.GroupInfo] = []
    cursor: int | None = 0
    pages = 0
    while cursor is not None:
        page = await admin.groups(sort=sort, limit=limit, cursor=cursor)
        assert len(page.groups) <= limit or sort in ("halted", "paused")
        seen += page.groups
        cursor = page.next_cursor
        pages += 1
        assert pages < 100, "the cursor never ends"
    return seen


async def test_groups_come_in_pages_busiest_or_oldest_first(both: Both) -> None:
    producer, admin = both
    for i in range(25):  # group i: a head and a line of i + 1
        await producer.enqueue_many([aiogroupq.Task("t", group=f"g{i}")] * (i + 2))
    busiest = await _all_pages(admin, "busiest", 10)
    assert sorted(g.group for g in busiest) == sorted(f"g{i}" for i in range(25))
    backlogs = [g.backlog for g in busiest]
    assert backlogs == sorted(backlogs, reverse=True)
    assert backlogs[0] == 25
    first = await admin.groups(limit=10)
    assert len(first.groups) == 10
    assert first.next_cursor == 10
    oldest = await _all_pages(admin, "oldest", 7)
    assert len({g.group for g in oldest}) == 25
    since = [g.waiting_since or 0.0 for g in oldest]
    assert since == sorted(since)
    assert all(g.state == GroupState.READY for g in oldest)


async def test_groups_lists_halted_and_paused_ones(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    for i in range(12):
        await admin.pause_group(f"p{i}")
    await producer.enqueue("t", group="h")
    (task,) = await claim(redis_client)
    await finish(redis_client, task, "halt", "Boom", "")
    paused = await _all_pages(admin, "paused", 5)
    assert sorted(g.group for g in paused) == sorted(f"p{i}" for i in range(12))
    assert {g.state for g in paused} == {GroupState.PAUSED}
    halted = await _all_pages(admin, "halted", 5)
    assert [(g.group, g.state) for g in halted] == [("h", GroupState.HALTED)]


@pytest.mark.parametrize(
    "options",
    [{"sort": "largest"}, {"limit": 0}, {"limit": 101}, {"cursor": -1}],
)
async def test_groups_refuses_bad_arguments(both: Both, options: Any) -> None:
    with pytest.raises(aiogroupq.ConfigurationError):
        await both[1].groups(**options)


# -- position, task, status_many -------------------------------------------------


async def test_position_counts_the_tasks_before_a_task_in_its_group(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    ids = await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 4)
    assert [await admin.position(i) for i in ids] == [0, 1, 2, 3]
    await claim(redis_client)
    assert [await admin.position(i) for i in ids] == [0, 1, 2, 3]
    await admin.set_group("wide", concurrency=2)
    wide = await producer.enqueue_many([aiogroupq.Task("t", group="wide")] * 4)
    assert [await admin.position(i) for i in wide] == [0, 0, 2, 3]
    loose = await producer.enqueue("t")
    later = await producer.enqueue("t", group="g", delay=60)
    assert await admin.position(loose) is None  # in no group's order
    assert await admin.position(later) is None  # not in line yet
    (details,) = [await admin.task(i) for i in ids[2:3]]
    assert (details.slot, details.position) == ("line", 2)
    with pytest.raises(aiogroupq.TaskNotFoundError):
        await admin.position("no-such-task")


async def test_task_details_through_a_life(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    task_id = await producer.enqueue("import", {"rows": [1, 2]}, group="g", priority=3)
    details = await admin.task(task_id)
    assert details.state == TaskState.QUEUED
    assert (details.type, details.group, details.priority) == ("import", "g", 3)
    assert details.payload == {"rows": [1, 2]}
    assert details.enqueued_at is not None
    assert near(details.enqueued_at, time.time())
    (task,) = await claim(redis_client, "w9")
    details = await admin.task(task_id)
    assert (details.state, details.consumer, details.slot) == (
        "running",
        "w9",
        "running",
    )
    assert near(details.lease_deadline, details.now + LEASE_MS / 1000)
    assert (details.attempt, details.position) == (1, 0)
    await finish(redis_client, task, "dead", "KeyError: 'rows'", "Traceback (most...")
    details = await admin.task(task_id)
    assert details.state == TaskState.DEAD
    assert details.error == "KeyError: 'rows'"
    assert details.traceback == "Traceback (most..."
    assert details.kept_for is None  # dead letters stay until purged
    assert details.ended_at is not None
    ok_id = await producer.enqueue("t")
    (ok,) = await claim(redis_client)
    await finish(redis_client, ok, "ok")
    details = await admin.task(ok_id)
    assert details.state == TaskState.SUCCEEDED
    # The envelope goes when it succeeds; what identifies the task stays.
    assert (details.type, details.payload, details.payload_size) == ("t", None, 1)
    assert near(details.enqueued_at, time.time())
    assert details.kept_for is not None
    assert 0 < details.kept_for <= 60
    with pytest.raises(aiogroupq.TaskNotFoundError):
        await admin.task("nope")


async def test_status_many_answers_like_status(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, _ = both
    ids = await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 3)
    ids.append(await producer.enqueue("t", delay=60))
    await claim(redis_client)
    await producer.cancel(ids[2])
    asked = [*ids, "unknown"]
    want = [await producer.status(i) for i in asked]
    assert want == ["running", "queued", "cancelled", "delayed", None]
    assert await producer.status_many(asked) == want
    assert await producer.status_many([]) == []
    with pytest.raises(TypeError):
        await producer.status_many(ids[0])
    with pytest.raises(TypeError):
        await producer.status_many([""])


async def test_status_many_of_many_ids(both: Both) -> None:
    producer, _ = both
    ids: list[str] = []
    for _ in range(25):
        ids += await producer.enqueue_many([aiogroupq.Task("t")] * 1000)
    started = time.perf_counter()
    states = await producer.status_many([*ids, "unknown"])
    elapsed = time.perf_counter() - started
    print(f"status_many of {len(ids):,} ids: {elapsed:.3f}s")  # noqa: T201
    assert states == [TaskState.QUEUED] * len(ids) + [None]


async def test_status_many_reports_a_state_no_script_writes(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, _ = both
    task_id = await producer.enqueue("t")
    await redis_client.hset(KEYS.task(task_id), "s", "weird")
    with pytest.raises(aiogroupq.CorruptTaskError, match="weird"):
        await producer.status_many([task_id])
    await redis_client.delete(KEYS.task(task_id))
    await redis_client.set(KEYS.task(task_id), "not a hash")
    with pytest.raises(aiogroupq.CorruptTaskError, match="not a task hash"):
        await producer.status_many([task_id])


# -- consumers -------------------------------------------------------------------


async def test_a_consumer_registers_itself_and_leaves_cleanly(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    release = anyio.Event()

    async def hold(payload: object) -> None:
        await release.wait()

    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"hold": hold}, concurrency=3, lease_ttl=10
    ) as consumer:
        (found,) = await admin.consumers()  # registered before it claims
        assert found.name == consumer.name
        assert (found.host, found.pid) == (socket.gethostname(), os.getpid())
        assert found.alive
        assert found.concurrency == 3
        assert found.lease_ttl == 10
        stats = await admin.stats()
        assert stats.consumers_alive == 1
        assert [c.name for c in stats.consumers] == [consumer.name]
        await producer.enqueue("hold")
        with anyio.fail_after(PATIENCE):  # the next heartbeat counts it
            while (await admin.consumers())[0].in_flight != 1:
                await anyio.sleep(0.05)
        # The registry's keys are known to the consistency check.
        await consistent(redis_client)
        release.set()
        with anyio.fail_after(PATIENCE):
            while (await admin.consumers())[0].stats.succeeded != 1:
                await anyio.sleep(0.05)
    assert await admin.consumers() == []
    assert await redis_client.exists(KEYS.consumers) == 0
    await consistent(redis_client)


async def test_a_silent_consumer_is_shown_gone_then_pruned(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    _, admin = both
    # A lease long enough that a stalled test still reads it alive first.
    await register(redis_client, "ghost", lease_ms=5000)
    (ghost,) = await admin.consumers()
    assert ghost.alive
    assert (ghost.host, ghost.pid, ghost.concurrency) == ("h1", 4242, 8)
    with anyio.fail_after(PATIENCE):  # past its lease: gone, still listed
        while (await admin.consumers())[0].alive:
            await anyio.sleep(0.1)
    stats = await admin.stats()
    assert (stats.consumers_alive, stats.consumers_gone) == (0, 1)
    with anyio.fail_after(PATIENCE):  # three leases after its last heartbeat
        while await admin.consumers():
            await anyio.sleep(0.1)
    assert await redis_client.zscore(KEYS.consumers, "ghost") is not None
    await register(redis_client, "alive")  # another's heartbeat prunes it
    assert await redis_client.zscore(KEYS.consumers, "ghost") is None
    assert [c.name for c in await admin.consumers()] == ["alive"]


async def test_every_view_runs_after_a_flush(
    redis_client: redis.asyncio.Redis, both: Both, flush: Flush
) -> None:
    producer, admin = both
    task_id = await producer.enqueue("t", group="g")
    await register(redis_client, "c1")
    views: list[Callable[[], Awaitable[object]]] = [
        admin.stats,
        functools.partial(admin.group_info, "g"),
        functools.partial(admin.groups, sort="oldest"),
        functools.partial(admin.task, task_id),
        admin.consumers,
    ]
    for view in views:
        await flush(redis_client)
        assert await view()
    await flush(redis_client)
    await register(redis_client, "c1")  # the registry's heartbeat too
    assert (await admin.stats()).consumers_alive == 1


@pytest.mark.usefixtures("scripts_only")  # a flush after each SCRIPT LOAD
async def test_status_many_survives_script_flushes(
    redis_client: redis.asyncio.Redis, both: Both, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, _ = both
    ids = await producer.enqueue_many([aiogroupq.Task("t")] * 1000)
    ids += await producer.enqueue_many([aiogroupq.Task("t")] * 500)
    await redis_client.script_flush()
    assert await producer.status_many(ids) == [TaskState.QUEUED] * 1500
    # The worst timing: every load is followed at once by another flush.
    load = redis_client.script_load

    async def load_then_flush(script: Any) -> Any:
        sha = await load(script)
        await redis_client.script_flush()
        return sha

    monkeypatch.setattr(redis_client, "script_load", load_then_flush)
    await redis_client.script_flush()
    assert await producer.status_many(ids) == [TaskState.QUEUED] * 1500


async def test_a_damaged_registry_key_never_costs_a_lease(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue("t")
    (task,) = await claim(redis_client)
    await redis_client.set(KEYS.consumers, "not a zset")
    codes = await _scripts.heartbeat(
        redis_client,
        KEYS,
        [(task.id, task.token)],
        lease_ms=LEASE_MS,
        consumer="c1",
        registration=[("host", "h1")],
    )
    assert codes == [HeartbeatCode.ALIVE]
    with pytest.raises(aiogroupq.CorruptQueueError, match="consumers"):
        await admin.stats()
