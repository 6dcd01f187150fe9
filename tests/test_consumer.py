"""Consumer: payload decoding, dead letters, retries, timeouts, delays,
shutdown and hand-back, against a real server.

Waits are bounded by generous ``anyio.fail_after`` limits; nothing asserts
that something was fast. The one timing comparison (a delayed task must not
start early) is a correctness bound, not a speed target.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, TypedDict

import anyio
import msgspec
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import (
    Admin,
    ConfigurationError,
    Consumer,
    DeadLetter,
    Producer,
    Task,
    TaskInfo,
    TaskState,
)

QUEUE = "consumer-tests"
#: generous bound on any wait for work that takes milliseconds when healthy
WAIT = 30.0
#: clock granularity allowed when comparing a start time with a due time
#: (the server's TIME is read in whole milliseconds)
CLOCK_SLACK = 0.005

TERMINAL = (TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED)


class Point(msgspec.Struct):
    x: int
    y: int


@dataclasses.dataclass
class Order:
    id: int
    note: str = ""


class Mail(TypedDict):
    to: str
    subject: str


class Boom(Exception):
    """Raised by tests to check that it surfaces as itself."""


# Module-level handlers: annotations are strings here (postponed), resolved
# against this module's globals.


async def _takes_point(payload: Point) -> None:
    del payload


async def _takes_order(payload: Order) -> None:
    del payload


async def _takes_mail(payload: Mail) -> None:
    del payload


async def _takes_ints(payload: list[int]) -> None:
    del payload


async def _noop() -> None:
    pass


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    # Objects a consumer leaks (an unclosed stream warns when collected) must
    # fail the test that leaked them, not whichever test runs the GC later.
    yield
    gc.collect()


@pytest.fixture
async def producer(redis_client: redis.asyncio.Redis) -> AsyncIterator[Producer]:
    async with Producer(redis_client, queue=QUEUE) as p:
        yield p


@pytest.fixture
async def admin(redis_client: redis.asyncio.Redis) -> AsyncIterator[Admin]:
    async with Admin(redis_client, queue=QUEUE) as a:
        yield a


def consumer(
    client: redis.asyncio.Redis, handlers: Mapping[str, Any], **kwargs: Any
) -> Consumer:
    # Fast retries keep the suite short; tests that care override them.
    kwargs.setdefault("retry_backoff", 0.05)
    kwargs.setdefault("concurrency", 8)
    return Consumer(client, queue=QUEUE, handlers=handlers, **kwargs)


async def wait_for(
    producer: Producer, task_id: str, *states: TaskState
) -> TaskState | None:
    """Poll until *task_id* is in one of *states* (default: any terminal one)."""
    wanted = states or TERMINAL
    with anyio.fail_after(WAIT):
        while (state := await producer.status(task_id)) not in wanted:
            await anyio.sleep(0.01)
    return state


async def dead_letter(admin: Admin, task_id: str) -> DeadLetter:
    letters = {letter.id: letter for letter in await admin.dead_letters()}
    assert task_id in letters, f"{task_id} is not among the dead letters"
    return letters[task_id]


# -- payload decoding -------------------------------------------------------------


async def test_payload_is_decoded_into_the_declared_type(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    got: dict[str, object] = {}
    all_seen = anyio.Event()

    def seen(kind: str, value: object) -> None:
        got[kind] = value
        if len(got) == 5:
            all_seen.set()

    async def struct(payload: Point) -> None:
        seen("struct", payload)

    async def dataclass_(payload: Order) -> None:
        seen("dataclass", payload)

    async def typeddict(payload: Mail) -> None:
        seen("typeddict", payload)

    async def ints(payload: list[int]) -> None:
        seen("ints", payload)

    async def plain(payload):  # type: ignore[no-untyped-def]  # unannotated on purpose
        seen("plain", payload)

    handlers = {
        "struct": struct,
        "dataclass": dataclass_,
        "typeddict": typeddict,
        "ints": ints,
        "plain": plain,
    }
    async with consumer(redis_client, handlers):
        await producer.enqueue("struct", Point(1, 2))
        await producer.enqueue("dataclass", Order(7, "n"))
        await producer.enqueue("typeddict", {"to": "a@b", "subject": "hi"})
        await producer.enqueue("ints", (1, 2, 3))
        # A Struct sent to an unannotated handler arrives as plain builtins.
        await producer.enqueue("plain", Point(3, 4))
        with anyio.fail_after(WAIT):
            await all_seen.wait()

    assert type(got["struct"]) is Point
    assert got["struct"] == Point(1, 2)
    assert type(got["dataclass"]) is Order
    assert got["dataclass"] == Order(7, "n")
    assert got["typeddict"] == {"to": "a@b", "subject": "hi"}
    assert got["ints"] == [1, 2, 3]
    assert type(got["plain"]) is dict
    assert got["plain"] == {"x": 3, "y": 4}


@pytest.mark.parametrize(
    ("handler", "bad_payload", "fragments"),
    [
        pytest.param(_takes_point, {"x": "one", "y": 2}, ["Point", "$.x"], id="struct"),
        pytest.param(_takes_point, {"x": 1}, ["Point", "`y`"], id="struct missing"),
        pytest.param(_takes_order, {"id": "seven"}, ["Order", "$.id"], id="dataclass"),
        pytest.param(_takes_mail, {"to": "a"}, ["Mail", "subject"], id="typeddict"),
        pytest.param(_takes_ints, [1, "two"], ["list", "$[1]"], id="list[int]"),
        pytest.param(_takes_ints, {"a": 1}, ["list", "object"], id="list vs map"),
    ],
)
async def test_payload_that_does_not_validate_is_dead_lettered(
    redis_client: redis.asyncio.Redis,
    producer: Producer,
    admin: Admin,
    handler: Any,
    bad_payload: object,
    fragments: list[str],
) -> None:
    ran: list[object] = []

    async def good(payload: Point) -> None:
        ran.append(payload)

    async with consumer(redis_client, {"typed": handler, "good": good}):
        bad = await producer.enqueue("typed", bad_payload, group="g")
        # Same group, enqueued later: the dead letter must release the group
        # and the consumer must keep going.
        after = await producer.enqueue("good", Point(5, 6), group="g")
        assert await wait_for(producer, after) == TaskState.SUCCEEDED
    assert await producer.status(bad) == TaskState.DEAD
    letter = await dead_letter(admin, bad)
    for fragment in fragments:
        assert fragment in letter.reason, letter.reason
    assert letter.type == "typed"
    assert letter.group == "g"
    assert letter.payload == bad_payload
    assert letter.attempts == 1  # a decoding failure is never retried
    assert ran == [Point(5, 6)]


async def test_unknown_task_type_is_dead_lettered(
    redis_client: redis.asyncio.Redis, producer: Producer, admin: Admin
) -> None:
    async with consumer(redis_client, {"known": _noop}):
        unknown = await producer.enqueue("mystery_type", {"a": 1}, group="g")
        after = await producer.enqueue("known", None, group="g")
        assert await wait_for(producer, after) == TaskState.SUCCEEDED
    assert await producer.status(unknown) == TaskState.DEAD
    letter = await dead_letter(admin, unknown)
    assert "mystery_type" in letter.reason
    assert letter.payload == {"a": 1}


# -- task metadata ------------------------------------------------------------------


async def test_current_task_inside_a_handler(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    infos: dict[int, TaskInfo] = {}

    async def record(payload: int) -> None:
        infos[payload] = aiogroupq.current_task()

    async def no_params() -> None:
        infos[-1] = aiogroupq.current_task()

    before = time.time()
    async with consumer(redis_client, {"record": record, "bare": no_params}):
        first = await producer.enqueue("record", 1, group="g1", max_attempts=5)
        second = await producer.enqueue("record", 2, group="g1")
        bare = await producer.enqueue("bare", None)
        for task_id in (first, second, bare):
            assert await wait_for(producer, task_id) == TaskState.SUCCEEDED

    one, two = infos[1], infos[2]
    assert (one.id, one.type, one.group) == (first, "record", "g1")
    assert (one.attempt, one.max_attempts) == (1, 5)
    assert (two.id, two.attempt, two.max_attempts) == (second, 1, 3)
    assert isinstance(one.fencing_token, int)
    # Tokens grow with every claim: a later claim of the group outranks it.
    assert two.fencing_token > one.fencing_token > 0
    assert infos[-1].id == bare
    assert infos[-1].group is None
    # Producer wall clock; loose bound, only catches unit mistakes (ms vs s).
    assert before - 60 < one.enqueued_at < time.time() + 60


async def test_current_task_is_per_handler_under_concurrency(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    n = 6
    arrived = 0
    everyone_in = anyio.Event()
    seen: dict[int, tuple[str, str]] = {}

    async def overlap(payload: int) -> None:
        nonlocal arrived
        mine = aiogroupq.current_task().id
        arrived += 1
        if arrived == n:
            everyone_in.set()
        # All n handlers are suspended here at once: a shared (non-context)
        # slot would hand some of them another task's metadata.
        await everyone_in.wait()
        seen[payload] = (mine, aiogroupq.current_task().id)

    async with consumer(redis_client, {"overlap": overlap}, concurrency=n):
        ids = await producer.enqueue_many([Task("overlap", i) for i in range(n)])
        for task_id in ids:
            assert await wait_for(producer, task_id) == TaskState.SUCCEEDED
    assert seen == {i: (task_id, task_id) for i, task_id in enumerate(ids)}


def test_current_task_outside_a_handler_raises() -> None:
    with pytest.raises(RuntimeError, match="outside"):
        aiogroupq.current_task()


async def test_current_task_does_not_leak_after_the_handler(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    async with consumer(redis_client, {"n": _noop}):
        task_id = await producer.enqueue("n", None)
        await wait_for(producer, task_id)
        with pytest.raises(RuntimeError):
            aiogroupq.current_task()


# -- failures, retries, dead letters -------------------------------------------------


async def test_failing_handler_is_retried_then_succeeds(
    redis_client: redis.asyncio.Redis, producer: Producer, admin: Admin
) -> None:
    order: list[tuple[str, int]] = []

    async def flaky(payload: str) -> None:
        attempt = aiogroupq.current_task().attempt
        order.append((payload, attempt))
        if payload == "flaky" and attempt == 1:
            raise ValueError("first attempt fails")

    async with consumer(redis_client, {"t": flaky}) as c:
        first = await producer.enqueue("t", "flaky", group="g")
        later = await producer.enqueue("t", "later", group="g")
        assert await wait_for(producer, first) == TaskState.SUCCEEDED
        assert await wait_for(producer, later) == TaskState.SUCCEEDED
    # The retry runs before the group's next task (DESIGN invariant 2).
    assert order == [("flaky", 1), ("flaky", 2), ("later", 1)]
    assert c.stats.retried == 1
    assert await admin.dead_letters() == []


async def test_retry_exception_reruns_after_its_delay(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    starts: list[tuple[int, float]] = []

    async def again(payload: object) -> None:
        del payload
        starts.append((aiogroupq.current_task().attempt, time.time()))
        if len(starts) == 1:
            raise aiogroupq.Retry(delay=0.1)

    # A large backoff proves the requested delay, not the policy, is used.
    async with consumer(redis_client, {"t": again}, retry_backoff=60):
        task_id = await producer.enqueue("t", None, group="g")
        assert await wait_for(producer, task_id) == TaskState.SUCCEEDED
    assert [attempt for attempt, _ in starts] == [1, 2]
    # Correctness bound: the retry never runs before its requested delay.
    assert starts[1][1] - starts[0][1] >= 0.1 - CLOCK_SLACK


async def test_retry_on_the_last_attempt_dead_letters(
    redis_client: redis.asyncio.Redis, producer: Producer, admin: Admin
) -> None:
    async def always(payload: object) -> None:
        raise aiogroupq.Retry(delay=0)

    async with consumer(redis_client, {"t": always}):
        task_id = await producer.enqueue("t", None, max_attempts=2)
        assert await wait_for(producer, task_id) == TaskState.DEAD
    letter = await dead_letter(admin, task_id)
    assert letter.attempts == 2
    assert "Retry" in letter.reason


async def test_dead_letter_after_max_attempts_keeps_the_traceback(
    redis_client: redis.asyncio.Redis, producer: Producer, admin: Admin
) -> None:
    calls = 0

    async def broken_handler(payload: str) -> None:
        nonlocal calls
        calls += 1
        raise ValueError(f"cannot process {payload}")

    async with consumer(redis_client, {"t": broken_handler}) as c:
        task_id = await producer.enqueue("t", "row-17", group="g", max_attempts=2)
        after = await producer.enqueue("t", "row-18", group="g", max_attempts=1)
        assert await wait_for(producer, task_id) == TaskState.DEAD
        # The group is passed on after the dead letter.
        assert await wait_for(producer, after) == TaskState.DEAD
    assert calls == 3
    letter = await dead_letter(admin, task_id)
    assert letter.attempts == 2
    assert letter.reason == "ValueError: cannot process row-17"
    assert "Traceback (most recent call last)" in letter.traceback
    assert "broken_handler" in letter.traceback
    assert "ValueError: cannot process row-17" in letter.traceback
    assert letter.payload == "row-17"
    assert letter.dead_at > 0
    assert c.stats.dead == 2


async def test_dead_letters_limit(
    redis_client: redis.asyncio.Redis, producer: Producer, admin: Admin
) -> None:
    async def broken(payload: object) -> None:
        raise ValueError("no")

    async with consumer(redis_client, {"t": broken}):
        ids = [await producer.enqueue("t", i, max_attempts=1) for i in range(3)]
        for task_id in ids:
            assert await wait_for(producer, task_id) == TaskState.DEAD
    assert {letter.id for letter in await admin.dead_letters()} == set(ids)
    assert len(await admin.dead_letters(limit=2)) == 2
    with pytest.raises(ValueError, match="0"):
        await admin.dead_letters(limit=0)


async def test_attempt_timeout_fails_the_attempt(
    redis_client: redis.asyncio.Redis, producer: Producer, admin: Admin
) -> None:
    attempts: defaultdict[str, list[int]] = defaultdict(list)

    async def slow(payload: str) -> None:
        attempt = aiogroupq.current_task().attempt
        attempts[payload].append(attempt)
        if payload == "always" or attempt == 1:
            await anyio.sleep(10)

    async with consumer(redis_client, {"t": slow}):
        dead = await producer.enqueue("t", "always", timeout=0.2, max_attempts=1)
        retried = await producer.enqueue("t", "once", timeout=0.2, max_attempts=2)
        assert await wait_for(producer, dead) == TaskState.DEAD
        assert await wait_for(producer, retried) == TaskState.SUCCEEDED
    assert attempts == {"always": [1], "once": [1, 2]}
    assert "TimeoutError" in (await dead_letter(admin, dead)).reason


# -- delays ---------------------------------------------------------------------------


async def test_delayed_task_does_not_start_before_its_due_time(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    started: dict[str, float] = {}

    async def record(payload: str) -> None:
        started[payload] = time.time()

    async with consumer(redis_client, {"t": record}):
        enqueued_at = time.time()
        delayed = await producer.enqueue("t", "delayed", delay=0.3, group="g")
        now = await producer.enqueue("t", "now", group="other")
        assert await wait_for(producer, now) == TaskState.SUCCEEDED
        assert await wait_for(producer, delayed) == TaskState.SUCCEEDED
    # Correctness bound (DESIGN invariant 6): never before the due time.
    assert started["delayed"] - enqueued_at >= 0.3 - CLOCK_SLACK


# -- shutdown -------------------------------------------------------------------------


async def test_shutdown_hands_unfinished_tasks_back_in_order(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    heads = ("g", 0), ("h", 0), ("", 0)
    started: list[tuple[str, int]] = []
    heads_running = anyio.Event()

    async def stuck(payload: tuple[str, int]) -> None:
        started.append(payload)
        if len(started) == len(heads):
            heads_running.set()
        await anyio.sleep_forever()

    tasks = [Task("t", ("g", i), group="g") for i in range(4)]
    tasks += [Task("t", ("h", i), group="h") for i in range(3)]
    tasks.append(Task("t", ("", 0)))
    ids = await producer.enqueue_many(tasks)

    first = consumer(redis_client, {"t": stuck}, grace_period=0.2)
    async with first:
        with anyio.fail_after(WAIT):
            await heads_running.wait()
    assert sorted(started) == sorted(heads)
    # Handed back: runnable again, nothing left marked running.
    assert [await producer.status(task_id) for task_id in ids] == [
        TaskState.QUEUED
    ] * len(ids)
    assert first.stats.handed_back == len(heads)
    assert first.stats.running == 0

    ran: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
    all_ran = anyio.Event()

    async def finish(payload: tuple[str, int]) -> None:
        group, index = payload
        ran[group].append((index, aiogroupq.current_task().attempt))
        if sum(map(len, ran.values())) == len(tasks):
            all_ran.set()

    async with consumer(redis_client, {"t": finish}):
        with anyio.fail_after(WAIT):
            await all_ran.wait()
    # Same order as enqueued, and the interrupted attempt was not counted.
    assert ran == {
        "g": [(0, 1), (1, 1), (2, 1), (3, 1)],
        "h": [(0, 1), (1, 1), (2, 1)],
        "": [(0, 1)],
    }


async def test_handlers_that_finish_within_the_grace_period_succeed(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    running = anyio.Event()
    finished: list[int] = []

    async def short(payload: int) -> None:
        running.set()
        await anyio.sleep(0.2)
        finished.append(payload)

    async with consumer(redis_client, {"t": short}, grace_period=WAIT) as c:
        task_id = await producer.enqueue("t", 1, group="g")
        with anyio.fail_after(WAIT):
            await running.wait()
    # Recorded by the time the block is left: no wait needed.
    assert finished == [1]
    assert await producer.status(task_id) == TaskState.SUCCEEDED
    assert c.stats.succeeded == 1
    assert c.stats.handed_back == 0


async def test_exception_in_the_block_surfaces_as_itself(
    redis_client: redis.asyncio.Redis,
) -> None:
    with pytest.raises(Boom, match="from the body") as info:
        async with consumer(redis_client, {"t": _noop}):
            raise Boom("from the body")
    assert type(info.value) is Boom


async def test_exception_in_the_block_still_hands_running_tasks_back(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    running = anyio.Event()

    async def stuck(payload: object) -> None:
        running.set()
        await anyio.sleep_forever()

    task_id = await producer.enqueue("t", None, group="g")

    async def leave_by_exception() -> None:
        async with consumer(redis_client, {"t": stuck}, grace_period=0.2):
            with anyio.fail_after(WAIT):
                await running.wait()
            raise Boom("leave")

    with pytest.raises(Boom):  # no `as`: the traceback would keep frames alive
        await leave_by_exception()
    # Leaving by an exception is still leaving: the task must not stay
    # "running" until its lease expires (and then count an attempt).
    assert await producer.status(task_id) == TaskState.QUEUED


async def test_cancelled_block_still_hands_running_tasks_back(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    running = anyio.Event()

    async def stuck(payload: object) -> None:
        running.set()
        await anyio.sleep_forever()

    task_id = await producer.enqueue("t", None, group="g")
    # As a web server's shutdown does: the scope around the consumer is
    # cancelled while a handler runs.
    with anyio.CancelScope() as scope:
        async with consumer(redis_client, {"t": stuck}, grace_period=0.2):
            with anyio.fail_after(WAIT):
                await running.wait()
            scope.cancel()
            await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert await producer.status(task_id) == TaskState.QUEUED


async def test_borrowed_client_is_not_closed(redis_url: str) -> None:
    name = "borrowed-by-consumer"
    client = redis.asyncio.Redis.from_url(redis_url, client_name=name)
    try:
        await client.ping()  # one pooled connection exists before we start
        async with Producer(client, queue=QUEUE) as producer:
            async with consumer(client, {"t": _noop}):
                task_id = await producer.enqueue("t", None)
                await wait_for(producer, task_id)
            # Ask the server through another client: a command on `client`
            # would silently reconnect a closed pool and hide the bug.
            async with redis.asyncio.Redis.from_url(redis_url) as observer:
                names = [c.get("name") for c in await observer.client_list()]
            assert name in names
            assert await producer.status(task_id) == TaskState.SUCCEEDED
    finally:
        await client.aclose()


async def test_borrowed_client_decoding_responses_is_refused(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigurationError, match="decode_responses"):
            async with Consumer(client, queue=QUEUE, handlers={"t": _noop}):
                pass
    finally:
        await client.aclose()


async def test_consumer_from_url_owns_its_client(
    redis_url: str, producer: Producer
) -> None:
    async with Consumer(redis_url, queue=QUEUE, handlers={"t": _noop}):
        task_id = await producer.enqueue("t", None)
        assert await wait_for(producer, task_id) == TaskState.SUCCEEDED


# -- stats and configuration ------------------------------------------------------------


async def test_stats_count_what_happened(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    release = anyio.Event()
    inside = anyio.Event()

    async def work(payload: str) -> None:
        attempt = aiogroupq.current_task().attempt
        if payload == "hold":
            inside.set()
            await release.wait()
        elif payload == "flaky" and attempt == 1:
            raise ValueError("once")
        elif payload == "broken":
            raise ValueError("always")

    async with consumer(redis_client, {"t": work}, concurrency=16) as c:
        assert c.stats.claimed == c.stats.running == 0
        hold = await producer.enqueue("t", "hold")
        with anyio.fail_after(WAIT):
            await inside.wait()
        assert c.stats.running == 1
        assert c.stats.claimed == 1
        # Enqueued in one call while the consumer has 15 free slots: its
        # next claim takes them together, and each finish call settles
        # several, so a counter bumped per call instead of per task is off.
        ids = await producer.enqueue_many(
            [aiogroupq.Task("t", "ok", group=f"ok-{n}") for n in range(10)]
            + [
                aiogroupq.Task("t", "flaky", group="flaky"),
                aiogroupq.Task("t", "broken", group="broken", max_attempts=1),
                aiogroupq.Task("unknown", None, group="unknown"),
            ]
        )
        for task_id in ids:
            await wait_for(producer, task_id)
        release.set()
        await wait_for(producer, hold)
        with anyio.fail_after(WAIT):  # its outcome is counted once recorded
            while c.stats.running:
                await anyio.sleep(0.01)
    stats = c.stats
    assert isinstance(stats, aiogroupq.ConsumerStats)
    assert stats.claimed == 15, (
        f"claimed counts each task claimed (hold, 10 ok, flaky twice, broken, "
        f"unknown), not each claim: {stats}"
    )
    assert (stats.succeeded, stats.retried, stats.dead) == (12, 1, 2), (
        f"succeeded: hold, 10 ok, flaky; retried: flaky; dead: broken, unknown: {stats}"
    )
    assert (stats.handed_back, stats.lease_lost, stats.running) == (0, 0, 0)


async def _two_params(a: int, b: int) -> None:
    del a, b


def _sync(payload: object) -> None:
    del payload


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        pytest.param({"concurrency": 0}, "concurrency", id="concurrency 0"),
        pytest.param({"concurrency": True}, "concurrency", id="concurrency bool"),
        pytest.param({"handlers": {}}, "handlers", id="no handlers"),
        pytest.param({"handlers": {"t": _sync}}, "async", id="sync handler"),
        pytest.param({"handlers": {"t": _two_params}}, "requires 2", id="two params"),
        pytest.param({"lease_ttl": 0}, "lease_ttl", id="lease_ttl 0"),
        pytest.param({"lease_ttl": -1.0}, "lease_ttl", id="lease_ttl negative"),
        pytest.param({"grace_period": -1}, "grace_period", id="grace negative"),
        pytest.param({"claim_batch": 0}, "claim_batch", id="claim_batch 0"),
        pytest.param({"name": ""}, "name", id="empty name"),
        pytest.param({"queue": "a b"}, "a b", id="bad queue"),
        pytest.param({"redis": 42}, "42", id="redis not a client"),
    ],
)
def test_bad_consumer_arguments_are_configuration_errors(
    redis_url: str, kwargs: dict[str, Any], text: str
) -> None:
    args: dict[str, Any] = {
        "redis": redis_url,
        "queue": QUEUE,
        "handlers": {"t": _noop},
    }
    args.update(kwargs)
    with pytest.raises(ConfigurationError, match=text):
        Consumer(**args)
