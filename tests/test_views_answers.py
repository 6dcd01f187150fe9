"""What the views answer an operator in the middle of the night: a running
task whose consumer died (for its group and for itself), when a delayed
group's first task is due, why a task of a paused or halted group waits,
the tasks paused and halted groups hold back (``held``), what identifies a
task once it ended, and the groups table fitted to the terminal.

States are set up with the real scripts against the test server. A dead
consumer is one registered with a short lease that then sends no more
heartbeats (a sleep past that lease is a precondition, not a measurement),
or one that never registered.
"""

from __future__ import annotations

import io
import sys
import time
import zlib
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import GroupState, TaskState
from aiogroupq._check import check as _fsck
from aiogroupq._inspect import render
from aiogroupq._inspect.views import GroupInfo, span_text
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.codec import encode_payload
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.replies import FinishCode

if TYPE_CHECKING:
    from ._roles import Both

from ._clock import near

QUEUE = "answers"
KEYS = QueueKeys(QUEUE)
LEASE_MS = 60_000


async def claim_as(
    client: redis.asyncio.Redis, consumer: str, keys: QueueKeys = KEYS, k: int = 1
) -> list[_scripts.Claimed]:
    """What one claim of *consumer* takes, as its fetcher would claim."""
    reply = await _scripts.claim(
        client, keys, consumer, k=k, lease_ms=LEASE_MS, scan_limit=100
    )
    return reply.tasks


async def register(
    client: redis.asyncio.Redis, name: str, lease_ms: int, keys: QueueKeys = KEYS
) -> None:
    """A consumer's heartbeat, as consumer.py sends it (no tasks renewed)."""
    await _scripts.heartbeat(
        client, keys, [], lease_ms=lease_ms, consumer=name, registration=[("c", 1)]
    )


async def finish(
    client: redis.asyncio.Redis,
    task: _scripts.Claimed,
    kind: _scripts.OutcomeKind,
    *args: str,
) -> None:
    outcome = _scripts.Outcome(task.id, task.token, kind, *args)
    codes = await _scripts.finish(client, KEYS, [outcome], retention_ms=60_000)
    assert codes == [FinishCode.APPLIED]


async def consistent(client: redis.asyncio.Redis) -> None:
    assert (await _fsck.examine(client, KEYS)).problems == []


def hms(at: float | None) -> str:
    """A time as the reasons name it."""
    assert at is not None
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%SZ")


# -- item: a running task whose consumer died ------------------------------------


async def test_a_dead_consumers_task_says_so_until_a_claim_recovers_it(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    stuck, behind = await producer.enqueue_many(
        [aiogroupq.Task("t", group="99:stuck")] * 2
    )
    await register(redis_client, "ghost", lease_ms=1000)
    (task,) = await claim_as(redis_client, "ghost")
    assert task.id == stuck
    await anyio.sleep(1.1)  # past its lease without a heartbeat: not alive

    info = await admin.group_info("99:stuck")
    print(info.reason)  # noqa: T201
    assert info.state == GroupState.AT_CAP
    (holder,) = info.holders
    assert (holder.consumer, holder.consumer_alive) == ("ghost", False)
    assert near(holder.consumer_heartbeat, info.now - 1.1)
    assert f"task {stuck}'s consumer ghost stopped heartbeating" in info.reason
    assert f"the lease ends at {hms(holder.lease_deadline)}" in info.reason
    assert "no consumer is alive to recover the task" in info.reason
    details = await admin.task(stuck)
    assert details.reason.startswith(
        "running, but its consumer ghost stopped heartbeating"
    )
    assert (details.consumer_alive, details.lease_deadline) == (
        False,
        holder.lease_deadline,
    )

    # Another consumer lives: it recovers the task once the lease ends.
    await register(redis_client, "rescuer", lease_ms=LEASE_MS)
    info = await admin.group_info("99:stuck")
    assert "the first claim after that recovers the task" in info.reason
    await redis_client.zadd(KEYS.leases, {stuck: 0}, xx=True)  # the lease ran out
    info = await admin.group_info("99:stuck")
    assert f"the lease ended at {hms(0.0)}" in info.reason
    assert "the next claim recovers the task" in info.reason
    assert "the next claim recovers the task" in (await admin.task(stuck)).reason

    # ... and so it does: the task goes back first in its group, and runs again.
    (again,) = await claim_as(redis_client, "rescuer")
    assert (again.id, again.attempt) == (stuck, 2)
    info = await admin.group_info("99:stuck")
    assert info.state == GroupState.AT_CAP
    assert "heartbeat" not in info.reason
    details = await admin.task(stuck)
    assert (details.consumer, details.consumer_alive) == ("rescuer", True)
    assert details.reason.startswith("running on consumer rescuer (attempt 2 of 3)")
    assert (await admin.task(behind)).slot == "line"
    await consistent(redis_client)


async def test_a_consumer_that_never_registered_is_not_alive(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    task_id = await producer.enqueue("t", group="g")
    await claim_as(redis_client, "nobody")
    info = await admin.group_info("g")
    assert info.state == GroupState.RUNNING
    assert info.reason.startswith(
        f"1 running, but task {task_id}'s consumer nobody is not alive "
        "(not in the consumer registry)"
    )
    assert info.holders[0].consumer_heartbeat is None


async def test_a_live_consumer_keeps_the_plain_reason(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    task_id = await producer.enqueue("t", group="g")
    await register(redis_client, "w1", lease_ms=LEASE_MS)
    await claim_as(redis_client, "w1")
    info = await admin.group_info("g")
    assert info.reason.startswith(f"1 running: task {task_id} on consumer w1")
    lease = info.holders[0].lease_deadline
    assert lease is not None
    assert info.reason == (
        f"1 running: task {task_id} on consumer w1, its lease ends in "
        f"{span_text(lease - info.now)} unless renewed"
    )
    assert info.holders[0].consumer_alive is True
    details = await admin.task(task_id)
    assert details.consumer_alive is True
    assert details.reason == (
        "running on consumer w1 (attempt 1 of 3); its lease ends in "
        f"{span_text(lease - details.now)} unless renewed"
    )


async def test_a_partitioned_queue_reads_consumers_from_partition_0(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "answers-parts"
    group = next(g for g in (f"g{i}" for i in range(100)) if zlib.crc32(g.encode()) % 4)
    home = QueueKeys(queue, zlib.crc32(group.encode()) % 4)
    async with (
        aiogroupq.Producer(redis_client, queue=queue, partitions=4) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        task_id = await producer.enqueue("t", group=group)
        await register(redis_client, "w1", lease_ms=LEASE_MS, keys=QueueKeys(queue))
        (task,) = await claim_as(redis_client, "w1", keys=home)
        assert task.id == task_id
        info = await admin.group_info(group)
        assert info.holders[0].consumer_alive is True
        assert "on consumer w1" in info.reason
        details = await admin.task(task_id)
        assert (details.consumer_alive, details.reason[:19]) == (
            True,
            "running on consumer",
        )
        await redis_client.zadd(QueueKeys(queue).consumers, {"w1": 0}, xx=True)
        info = await admin.group_info(group)  # its heartbeats stopped
        assert info.holders[0].consumer_alive is False
        assert "consumer w1 stopped heartbeating" in info.reason


# -- item: delayed groups, and why a task waits ------------------------------------


async def test_a_delayed_group_says_when_its_first_task_is_due(both: Both) -> None:
    producer, admin = both
    await producer.enqueue("t", group="later", delay=120)
    first = await producer.enqueue("t", group="later", delay=60)
    await producer.enqueue("t", group="other", delay=30)
    info = await admin.group_info("later")
    assert info.state == GroupState.DELAYED
    assert info.next_due_at is not None
    assert near(info.next_due_at, info.now + 60)
    assert info.reason == (
        "2 delayed tasks, none due yet: the first is due in "
        f"{span_text(info.next_due_at - info.now)} (at {hms(info.next_due_at)})"
    )
    details = await admin.task(first)
    assert details.state == TaskState.DELAYED
    assert details.runnable_since is None  # not runnable yet
    assert details.due_at is not None
    assert details.reason.startswith(
        f"delayed: it is due in {span_text(details.due_at - details.now)}"
    )
    assert f"(at {hms(details.due_at)})" in details.reason


async def test_one_delayed_task_and_one_in_line_are_said_in_the_singular(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue("t", group="one", delay=60)
    info = await admin.group_info("one")
    assert info.next_due_at is not None
    assert info.reason == (
        "1 delayed task, not due yet: it is due in "
        f"{span_text(info.next_due_at - info.now)} (at {hms(info.next_due_at)})"
    )
    await producer.enqueue_many([aiogroupq.Task("t", group="pair")] * 2)
    await register(redis_client, "w1", lease_ms=LEASE_MS)
    await claim_as(redis_client, "w1")
    info = await admin.group_info("pair")
    assert info.reason == "1 running, at its concurrency of 1; 1 waits in line behind"


async def test_a_retry_and_a_rate_limited_task_say_when_they_may_start(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    failing = await producer.enqueue("t", group="r")
    (task,) = await claim_as(redis_client, "c1")
    await finish(redis_client, task, "retry", "60000", "Boom: once")
    details = await admin.task(failing)
    assert details.due_at is not None
    assert details.runnable_since is None
    assert details.reason == (
        "attempt 1 of 3 failed; its retry is due in "
        f"{span_text(details.due_at - details.now)} (at {hms(details.due_at)})"
    )
    await admin.set_group("rated", rate=aiogroupq.Rate(1, 60))
    first, second = await producer.enqueue_many(
        [aiogroupq.Task("t", group="rated")] * 2
    )
    (started,) = await claim_as(redis_client, "c1")
    assert started.id == first
    await finish(redis_client, started, "ok")
    assert await claim_as(redis_client, "c1") == []  # out of rate: held aside
    details = await admin.task(second)
    assert details.slot == "held"
    assert near(details.due_at, details.now + 60)
    assert details.reason.startswith(
        "its group's rate limit is used up: it may start in "
    )


async def test_a_task_of_a_paused_or_halted_group_says_why_it_waits(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    head, second, third = await producer.enqueue_many(
        [aiogroupq.Task("t", group="p")] * 3
    )
    await admin.pause_group("p")
    paused = "it does not start while its group p is paused (aiogroupq resume p)"
    assert (await admin.task(head)).reason == paused
    assert (
        await admin.task(second)
    ).reason == f"{paused}; 1 task of its group goes before it"
    assert (await admin.task(third)).reason.endswith(
        "; 2 tasks of its group go before it"
    )
    await admin.resume_group("p")
    assert (await admin.task(head)).reason.startswith("runnable since ")
    assert (await admin.task(head)).reason.endswith(
        "waits for a free consumer; no consumer is alive"
    )
    assert (
        await admin.task(second)
    ).reason == "waits in its group's line; 1 task of its group goes before it"

    dead, waiting = await producer.enqueue_many([aiogroupq.Task("t", group="h")] * 2)
    for claimed in await claim_as(redis_client, "c1", k=10):
        if claimed.id == dead:
            await finish(redis_client, claimed, "halt", "ValueError: bad row", "")
    assert (await admin.task(waiting)).reason.startswith(
        f"it does not start while its group h is halted behind dead task {dead}"
    )
    assert (await admin.task(dead)).reason.endswith("; its group h is halted behind it")


# -- item: held -------------------------------------------------------------------


async def test_held_counts_what_paused_and_halted_groups_hold_back(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue_many([aiogroupq.Task("t", group="p")] * 3)
    await admin.pause_group("p")
    # No claim has met the paused group's head yet: it is in the ready
    # list, the others in the group's line; all three are held back.
    stats = await admin.stats()
    assert (stats.ready, stats.parked, stats.held) == (0, 0, 3)
    await producer.enqueue_many([aiogroupq.Task("t", group="h")] * 3)
    await producer.enqueue("t")
    claimed = await claim_as(redis_client, "c1", k=10)  # sets "p"'s head aside
    by_id = {c.id: c for c in claimed}
    assert len(by_id) == 2  # "h"'s head and the ungrouped task
    in_h = await _group_ids(admin, "h")
    halting = next(c for c in claimed if c.id in in_h)
    await finish(redis_client, halting, "halt", "ValueError: bad row", "")
    stats = await admin.stats()
    assert (stats.ready, stats.parked, stats.held, stats.running) == (0, 0, 5, 1)
    assert stats.waiting == 5
    await admin.resume_group("p")
    stats = await admin.stats()
    assert (stats.ready, stats.parked, stats.held) == (1, 2, 2)
    await consistent(redis_client)


async def _group_ids(admin: aiogroupq.Admin, group: str) -> set[str]:
    info = await admin.group_info(group)
    return {h.id for h in info.holders}


# -- item: an ended task keeps what identifies it -----------------------------------


async def test_an_ended_task_keeps_its_type_size_and_enqueue_time(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    payload: Any = {
        "rows": [1, -1, 2**40, -(2**40), 1.5, None, True, False, "x" * 300],
        "blob": b"y" * 70_000,
        "text": "z" * 70_000,
        "nested": {"n": [[]] * 20, "m": {str(i): i for i in range(20)}},
        "ext": [
            msgspec.msgpack.Ext(5, b"q" * 3),
            msgspec.msgpack.Ext(5, b"q" * 4),
            msgspec.msgpack.Ext(5, b"q" * 300),
        ],
        "at": datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=UTC),
        "many": list(range(300)),
    }
    size = len(msgspec.msgpack.encode(payload))
    done = await producer.enqueue("import", payload, group="g")
    (task,) = await claim_as(redis_client, "c1")
    await finish(redis_client, task, "ok", "", "")
    cancelled = await producer.enqueue("report", b"r" * 500_000, delay=60)
    assert await producer.cancel(cancelled)
    expired = await producer.enqueue("late", [1, 2], expires=0.001)
    await anyio.sleep(0.01)  # past its expiry time
    assert await claim_as(redis_client, "c1") == []

    for task_id, kind, state, nbytes in (
        (done, "import", TaskState.SUCCEEDED, size),
        (cancelled, "report", TaskState.CANCELLED, 500_005),
        (expired, "late", TaskState.EXPIRED, 3),
    ):
        details = await admin.task(task_id)
        assert details.state == state
        assert (details.type, details.payload_size, details.payload) == (
            kind,
            nbytes,
            None,
        )
        assert near(details.enqueued_at, time.time(), 30)
        assert details.ended_at is not None
        assert details.reason.startswith(f"{state} ")
        assert not await redis_client.hexists(KEYS.task(task_id), "e")
    await consistent(redis_client)


async def test_a_payload_of_many_values_keeps_its_type_size_and_enqueue_time(
    redis_client: redis.asyncio.Redis, both: Both
) -> None:
    """What an ended task keeps is written at enqueue: its end reads nothing
    of the envelope, however many values the payload holds."""
    producer, admin = both
    payload = list(range(20_000))
    task_id = await producer.enqueue("bulk", payload)
    (task,) = await claim_as(redis_client, "c1")
    await finish(redis_client, task, "ok", "", "")
    details = await admin.task(task_id)
    assert (details.type, details.payload_size) == (
        "bulk",
        len(encode_payload(payload)),
    )
    assert near(details.enqueued_at, int(task_id[:12], 16) / 1000, 0.002, stall=0)


@pytest.mark.parametrize("task_type", ["t", "send_invoice_email"])
async def test_what_an_ended_task_keeps_costs_a_few_dozen_bytes(
    redis_client: redis.asyncio.Redis, both: Both, task_type: str
) -> None:
    """Its identity field costs one hash entry; the runnable-since time it
    drops costs one less."""
    producer, _ = both
    task_id = await producer.enqueue(task_type, b"p" * 500 * 1024)
    (task,) = await claim_as(redis_client, "c1")
    await finish(redis_client, task, "ok", "", "")
    key = KEYS.task(task_id)
    now = await redis_client.memory_usage(key, samples=0)
    assert await redis_client.hdel(key, "i") == 1
    assert await redis_client.hset(key, "dt", int(time.time() * 1000)) == 1
    before = await redis_client.memory_usage(key, samples=0)  # as it was
    assert now is not None
    assert before is not None
    print(f"an ended task takes {now - before:+} bytes: {before} -> {now}")  # noqa: T201
    assert now - before <= 48


# -- item: the groups table fits the terminal -------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _group(reason: str) -> GroupInfo:
    return GroupInfo(
        "tenant-42", GroupState.RUNNING, reason, 1, 3, 0, 1, (), None, 12.0, None,
        None, None, False, False, None, None, None, False, 0, 0.0,
    )  # fmt: skip


def test_the_why_column_is_wrapped_to_the_width_never_cut() -> None:
    reason = (
        "1 running, but task 01a2151236c0ffee's consumer ghost stopped heartbeating "
        "40.0s ago; the lease ended at 03:12:45Z; no consumer is "
        "alive to recover the task: start one"
    )
    rows = [render.group_row(_group(reason))]
    assert rows[0][-1] == reason  # the row keeps it whole
    out = render.table(render.GROUP_HEADERS, rows, width=80)
    print(out)  # noqa: T201
    lines = out.splitlines()
    assert len(lines) > 2
    assert all(len(line) <= 80 for line in lines)
    start = lines[0].index("WHY")
    assert " ".join(line[start:] for line in lines[1:]) == reason
    assert all(line[:start].strip() == "" for line in lines[2:])
    one_line = render.table(render.GROUP_HEADERS, rows, width=None)
    assert len(one_line.splitlines()) == 2
    assert one_line.endswith(reason)
    # A terminal too narrow still gets every word, in a readable column.
    narrow = render.table(render.GROUP_HEADERS, rows, width=20)
    assert " ".join(narrow.split()).endswith(" ".join(reason.split()))


def test_the_width_is_the_terminals_and_no_limit_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "123")
    assert render.terminal_width(_Terminal()) == 123
    assert render.terminal_width(io.StringIO()) is None  # a pipe or a file
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    long = render.table(("A", "WHY"), [("x", "word " * 100)])
    assert len(long.splitlines()) == 2  # not a terminal: whole lines


async def test_the_groups_command_prints_the_whole_reason(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue_many([aiogroupq.Task("t", group="99:stuck")] * 2)
    await claim_as(redis_client, "a-consumer-with-a-rather-long-name-that-died")
    reason = (await admin.group_info("99:stuck")).reason
    assert len(reason) > 200
    argv = [
        sys.executable, "-m", "aiogroupq", "groups",
        "--queue", QUEUE, "--redis-url", redis_url,
    ]  # fmt: skip
    with anyio.fail_after(120):  # liveness only
        done = await anyio.run_process(argv, check=False)
    out = done.stdout.decode()
    print(out)  # noqa: T201
    assert done.returncode == 0
    assert reason in out  # whole, on its row's line: stdout is not a terminal
