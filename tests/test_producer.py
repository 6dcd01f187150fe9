"""Producer: bad input is refused with a typed error before any write; good
input is enqueued in one round trip with the documented ids, states and
deduplication.

Every refusal test ends with ``dbsize() == 0``: DESIGN invariant 7 says a
refused task loses nothing and leaves nothing half-written behind.
"""

from __future__ import annotations

import asyncio
import math
import re
import string
import textwrap
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec
import pytest
import redis
import redis.asyncio

import aiogroupq
from aiogroupq import (
    AiogroupqError,
    ConfigurationError,
    InvalidGroupError,
    InvalidTaskError,
    PayloadTooLargeError,
    Producer,
    Task,
    TaskState,
    UnencodablePayloadError,
    UnknownTaskTypeError,
)
from aiogroupq._store.keys import QueueKeys
from aiogroupq.errors import NotOpenError

from ._scripts_helpers import SCRIPT_CALLS

QUEUE = "tests"
T = TypeVar("T")
HEX = frozenset(string.hexdigits.lower())


@pytest.fixture
async def producer(redis_client: redis.asyncio.Redis) -> AsyncIterator[Producer]:
    async with Producer(redis_client, queue=QUEUE) as p:
        yield p


async def _command_calls(client: redis.asyncio.Redis) -> dict[str, int]:
    """Per-command call counts from ``INFO commandstats`` (INFO itself left out)."""
    stats: dict[str, Any] = await client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in stats.items()
        if name != "cmdstat_info"
    }


async def _task_keys(client: redis.asyncio.Redis) -> list[bytes]:
    """The per-task hashes of the test queue (one per enqueued task)."""
    return [k async for k in client.scan_iter(match=QueueKeys(QUEUE).task("*"))]


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {
        name: calls - before.get(name, 0)
        for name, calls in after.items()
        if calls != before.get(name, 0)
    }


# -- refusals: each is typed, names the offending value, writes nothing --------

# (enqueue kwargs, expected error, text the message must contain)
BAD_ENQUEUES: list[tuple[str, dict[str, Any], type[InvalidTaskError], str]] = [
    # groups
    ("empty group", {"group": ""}, InvalidGroupError, "''"),
    (
        "group of 257 bytes",
        {"group": "é" * 128 + "x"},
        InvalidGroupError,
        "'éééé",  # the start of the group, then its size
    ),
    (
        "ASCII group of 257 bytes",
        {"group": "g" * 257},
        InvalidGroupError,
        "257 bytes",
    ),
    ("int group", {"group": 42}, InvalidGroupError, "42"),
    ("bytes group", {"group": b"g"}, InvalidGroupError, "b'g'"),
    ("lone surrogate group", {"group": "a\ud800"}, InvalidGroupError, r"\ud800"),
    # delays
    ("negative delay", {"delay": -1}, InvalidTaskError, "-1"),
    ("NaN delay", {"delay": math.nan}, InvalidTaskError, "nan"),
    ("inf delay", {"delay": math.inf}, InvalidTaskError, "inf"),
    ("-inf delay", {"delay": -math.inf}, InvalidTaskError, "-inf"),
    ("bool delay", {"delay": True}, InvalidTaskError, "bool"),
    ("str delay", {"delay": "5"}, InvalidTaskError, "str"),
    (
        "negative timedelta delay",
        {"delay": timedelta(seconds=-2)},
        InvalidTaskError,
        "-2",
    ),
    # a delay over the maximum (365 days): a delayed unique task held its
    # dedup key that long; delay=1e9 (31 years) was accepted
    ("delay of 31 years", {"delay": 1e9}, InvalidTaskError, "365 days"),
    (
        "delay of 366 days",
        {"delay": timedelta(days=366)},
        InvalidTaskError,
        "365 days",
    ),
    (
        "run_at in 2 years",
        {"run_at": datetime.now(UTC) + timedelta(days=730)},
        InvalidTaskError,
        "365 days",
    ),
    ("unknown dedup_scope", {"dedup_scope": "tenant"}, InvalidTaskError, "tenant"),
    # max_attempts
    ("max_attempts 0", {"max_attempts": 0}, InvalidTaskError, "0 must be"),
    ("max_attempts -1", {"max_attempts": -1}, InvalidTaskError, "-1"),
    ("max_attempts True", {"max_attempts": True}, InvalidTaskError, "True"),
    ("max_attempts 1.5", {"max_attempts": 1.5}, InvalidTaskError, "1.5"),
    # timeouts
    ("timeout 0", {"timeout": 0}, InvalidTaskError, "0.0"),
    ("negative timeout", {"timeout": -0.5}, InvalidTaskError, "-0.5"),
    ("zero timedelta timeout", {"timeout": timedelta(0)}, InvalidTaskError, "0.0"),
    ("NaN timeout", {"timeout": math.nan}, InvalidTaskError, "nan"),
    # dedup keys
    ("empty dedup_key", {"dedup_key": ""}, InvalidTaskError, "''"),
    ("dedup_key of 257 bytes", {"dedup_key": "k" * 257}, InvalidTaskError, "kkk"),
    ("int dedup_key", {"dedup_key": 7}, InvalidTaskError, "int"),
    (
        "lone surrogate dedup_key",
        {"dedup_key": "k\udfff"},
        InvalidTaskError,
        "dedup_key",
    ),
]

FIELD_OF = {
    "group": "group",
    "delay": "delay",
    "run_at": "run_at",
    "dedup_scope": "dedup_scope",
    "max_attempts": "max_attempts",
    "timeout": "timeout",
    "dedup_key": "dedup_key",
}


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [pytest.param(kw, err, text, id=label) for label, kw, err, text in BAD_ENQUEUES],
)
async def test_bad_enqueue_argument_is_refused_before_any_write(
    redis_client: redis.asyncio.Redis,
    producer: Producer,
    kwargs: dict[str, Any],
    error: type[InvalidTaskError],
    text: str,
) -> None:
    with pytest.raises(error, match=re.escape(text)) as info:
        await producer.enqueue("t", {"a": 1}, **kwargs)
    # The exact type, not a sibling that happens to share the base class.
    assert type(info.value) is error
    assert isinstance(info.value, AiogroupqError)
    assert isinstance(info.value, ValueError)
    (field,) = kwargs
    assert info.value.field == FIELD_OF[field]
    assert await redis_client.dbsize() == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [pytest.param(kw, err, text, id=label) for label, kw, err, text in BAD_ENQUEUES],
)
async def test_bad_task_in_enqueue_many_is_refused_too(
    redis_client: redis.asyncio.Redis,
    producer: Producer,
    kwargs: dict[str, Any],
    error: type[InvalidTaskError],
    text: str,
) -> None:
    # enqueue and enqueue_many share one validation: check the batch path too.
    with pytest.raises(error, match=re.escape(text)):
        await producer.enqueue_many([Task("t", 1, **kwargs)])
    assert await redis_client.dbsize() == 0


@pytest.mark.parametrize(
    ("task_type", "text"),
    [
        pytest.param("", "''", id="empty"),
        pytest.param("t" * 257, "ttt", id="257 bytes"),
        pytest.param("é" * 129, "é", id="258 UTF-8 bytes"),
        pytest.param(42, "int", id="int"),
        pytest.param(None, "NoneType", id="None"),
        pytest.param(b"t", "bytes", id="bytes"),
        # A lone surrogate cannot be stored as UTF-8: it must be refused as
        # a bad task type, not escape as a raw UnicodeEncodeError.
        pytest.param("t\ud800", "task_type", id="lone surrogate"),
    ],
)
async def test_bad_task_type_is_refused(
    redis_client: redis.asyncio.Redis, producer: Producer, task_type: Any, text: str
) -> None:
    with pytest.raises(InvalidTaskError, match=re.escape(text)) as info:
        await producer.enqueue(task_type, None)
    assert info.value.field == "task_type"
    assert await redis_client.dbsize() == 0


async def test_task_type_of_256_bytes_is_accepted(producer: Producer) -> None:
    task_id = await producer.enqueue("é" * 128, None)
    assert await producer.status(task_id) == TaskState.QUEUED


@pytest.mark.parametrize(
    "group",
    [
        pytest.param("g" * 256, id="256 ASCII"),
        pytest.param("é" * 128, id="256 bytes of 2-byte chars"),
        pytest.param("\U0001f600" * 64, id="256 bytes of 4-byte chars"),
    ],
)
async def test_group_of_exactly_256_bytes_is_accepted(
    producer: Producer, group: str
) -> None:
    task_id = await producer.enqueue("t", None, group=group)
    assert await producer.status(task_id) == TaskState.QUEUED


async def test_unknown_task_type_is_refused_when_types_are_declared(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(
        redis_client, queue=QUEUE, task_types=["send_mail", "import_rows"]
    ) as producer:
        with pytest.raises(UnknownTaskTypeError, match="'sendmail'") as info:
            await producer.enqueue("sendmail", None)
        assert info.value.task_type == "sendmail"
        # The message lists what is known, so a typo is easy to spot.
        assert "send_mail" in str(info.value)
        assert isinstance(info.value, InvalidTaskError)
        assert await redis_client.dbsize() == 0
        # The batch path checks it too, and refuses the whole batch.
        with pytest.raises(UnknownTaskTypeError, match="'sendmail'"):
            await producer.enqueue_many([Task("send_mail"), Task("sendmail")])
        assert await redis_client.dbsize() == 0
        # A declared type still goes through.
        assert await producer.enqueue("send_mail", None)


async def test_unencodable_payload_is_refused(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    with pytest.raises(UnencodablePayloadError, match="object") as info:
        await producer.enqueue("t", {"x": object()})
    assert isinstance(info.value, InvalidTaskError)
    assert info.value.field == "payload"
    assert await redis_client.dbsize() == 0


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param({1, 2, 3}.__iter__(), id="iterator"),
        pytest.param(2**64, id="int over 64 bits"),
        pytest.param(lambda: None, id="function"),
    ],
)
async def test_other_unencodable_payloads_are_refused(
    redis_client: redis.asyncio.Redis, producer: Producer, payload: object
) -> None:
    with pytest.raises(UnencodablePayloadError):
        await producer.enqueue("t", payload)
    assert await redis_client.dbsize() == 0


async def test_payload_over_the_limit_is_refused_with_its_size(
    redis_client: redis.asyncio.Redis,
) -> None:
    payload = "x" * 200
    size = len(msgspec.msgpack.encode(payload))
    async with Producer(redis_client, queue=QUEUE, max_payload_bytes=100) as producer:
        with pytest.raises(PayloadTooLargeError, match=f"{size}.*100") as info:
            await producer.enqueue("t", payload)
        assert info.value.size == size
        assert info.value.limit == 100
        assert info.value.field == "payload"
        assert await redis_client.dbsize() == 0


async def test_payload_exactly_at_the_limit_is_accepted(
    redis_client: redis.asyncio.Redis,
) -> None:
    payload = "x" * 200
    size = len(msgspec.msgpack.encode(payload))
    async with Producer(redis_client, queue=QUEUE, max_payload_bytes=size) as producer:
        task_id = await producer.enqueue("t", payload)
        assert await producer.status(task_id) == TaskState.QUEUED
        with pytest.raises(PayloadTooLargeError):
            await producer.enqueue("t", payload + "x")


async def test_default_payload_limit_is_enforced(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    with pytest.raises(PayloadTooLargeError) as info:
        await producer.enqueue("t", b"\0" * (512 * 1024 + 1))
    assert info.value.limit == 512 * 1024
    assert await redis_client.dbsize() == 0


async def test_enqueue_many_with_one_bad_task_writes_nothing(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    tasks = [Task("t", i, group=f"g{i % 3}") for i in range(50)]
    tasks.insert(37, Task("t", 37, group=""))
    with pytest.raises(InvalidGroupError, match="''"):
        await producer.enqueue_many(tasks)
    assert await redis_client.dbsize() == 0


async def test_enqueue_many_with_a_non_task_item_writes_nothing(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    items: list[Any] = [Task("t", 1), {"task_type": "t"}, Task("t", 2)]
    with pytest.raises(TypeError, match="task_type"):
        await producer.enqueue_many(items)
    assert await redis_client.dbsize() == 0


async def test_enqueue_many_of_nothing_returns_empty_without_io(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    await producer.enqueue("warm-up", None)  # scripts loaded, connection open
    before = await _command_calls(redis_client)
    assert await producer.enqueue_many([]) == []
    assert await producer.enqueue_many(iter(())) == []
    after = await _command_calls(redis_client)
    assert _delta(before, after) == {}


# -- constructors and lifecycle -------------------------------------------------


@pytest.mark.parametrize(
    "queue",
    [
        pytest.param("", id="empty"),
        pytest.param("a b", id="space"),
        pytest.param("{x}", id="hash tag braces"),
        pytest.param("q" * 129, id="129 chars"),
        pytest.param("a*", id="glob"),
        pytest.param(7, id="int"),
    ],
)
def test_bad_queue_name_is_a_configuration_error(redis_url: str, queue: Any) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(repr(queue)[:20])):
        Producer(redis_url, queue=queue)


def test_queue_name_of_128_chars_is_accepted(redis_url: str) -> None:
    assert Producer(redis_url, queue="q" * 128).queue == "q" * 128


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"max_payload_bytes": 0}, id="max_payload_bytes 0"),
        pytest.param({"max_payload_bytes": True}, id="max_payload_bytes bool"),
        pytest.param({"default_max_attempts": 0}, id="default_max_attempts 0"),
        pytest.param({"dedup_window": 0}, id="dedup_window 0"),
        pytest.param({"dedup_window": math.nan}, id="dedup_window NaN"),
        pytest.param({"dedup_window": timedelta(-1)}, id="dedup_window negative"),
    ],
)
def test_bad_producer_options_are_configuration_errors(
    redis_url: str, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError):
        Producer(redis_url, queue=QUEUE, **kwargs)


def test_redis_argument_of_the_wrong_type_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="42"):
        Producer(42, queue=QUEUE)  # type: ignore[arg-type]


async def test_unusable_url_is_a_configuration_error_on_entering() -> None:
    with pytest.raises(ConfigurationError, match="not-a-url"):
        async with Producer("not-a-url", queue=QUEUE):
            pass


async def test_borrowed_client_decoding_responses_is_refused(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigurationError, match="decode_responses"):
            async with Producer(client, queue=QUEUE):
                pass
    finally:
        await client.aclose()


async def test_methods_outside_async_with_raise_runtime_error(
    redis_client: redis.asyncio.Redis,
) -> None:
    producer = Producer(redis_client, queue=QUEUE)
    with pytest.raises(RuntimeError, match="async with"):
        await producer.enqueue("t", None)
    with pytest.raises(RuntimeError, match="async with"):
        await producer.enqueue_many([Task("t")])
    with pytest.raises(RuntimeError, match="async with"):
        await producer.status("0" * 28)
    with pytest.raises(RuntimeError, match="async with"):
        await producer.status_many(["0" * 28])
    assert await redis_client.dbsize() == 0
    async with producer:
        await producer.enqueue("t", None)
    # Closed again after the block: a stale reference must not write.
    with pytest.raises(RuntimeError, match="async with"):
        await producer.enqueue("t", None)
    assert len(await _task_keys(redis_client)) == 1


async def test_the_not_open_error_is_typed(redis_client: redis.asyncio.Redis) -> None:
    calls = {
        "Producer": Producer(redis_client, queue=QUEUE).enqueue("t"),
        "Admin": aiogroupq.Admin(redis_client, queue=QUEUE).stats(),
    }
    for name, call in calls.items():
        with pytest.raises(NotOpenError, match=f"this {name} is not open") as caught:
            await call
        assert not caught.value.other_loop
        assert isinstance(caught.value, AiogroupqError)


async def _awaited(call: Awaitable[T]) -> T:
    return await call


def test_a_handle_used_on_another_loop_says_so(redis_url: str) -> None:
    """A Producer or Admin entered on one event loop and used on another (a
    module-scoped fixture serving tests on their own loops) names the cause,
    where it used to fail inside the send lane or in redis-py."""
    with redis.Redis.from_url(redis_url) as sync_client:
        sync_client.flushdb()
    producer = Producer(redis_url, queue=QUEUE)
    admin = aiogroupq.Admin(redis_url, queue=QUEUE)
    with asyncio.Runner() as opening, asyncio.Runner() as other:
        stack = AsyncExitStack()
        opening.run(stack.enter_async_context(producer))
        opening.run(stack.enter_async_context(admin))
        try:
            elsewhere: list[Awaitable[object]] = [
                producer.enqueue("t"),
                producer.enqueue_many([Task("t")]),
                producer.status("0" * 28),
                admin.stats(),
            ]
            for call in elsewhere:
                with pytest.raises(
                    NotOpenError, match="opened on another event loop: use it on"
                ) as caught:
                    other.run(_awaited(call))
                assert caught.value.other_loop
            # On its own loop it still works, and the refusals wrote nothing.
            task_id = opening.run(_awaited(producer.enqueue("t")))
            assert opening.run(_awaited(admin.stats())).ready == 1
            state = opening.run(_awaited(producer.status(task_id)))
            assert state == TaskState.QUEUED
        finally:
            opening.run(stack.aclose())


async def test_borrowed_client_is_not_closed(redis_url: str) -> None:
    name = "borrowed-by-producer"
    client = redis.asyncio.Redis.from_url(redis_url, client_name=name)
    try:
        async with Producer(client, queue=QUEUE) as producer:
            await producer.enqueue("t", None)
        # Ask the server, through another client, whether our connection is
        # still there: a command on `client` itself would silently reconnect.
        async with redis.asyncio.Redis.from_url(redis_url) as observer:
            names = [c.get("name") for c in await observer.client_list()]
        assert name in names
    finally:
        await client.aclose()


async def test_owned_client_from_url_works(redis_url: str) -> None:
    async with Producer(redis_url, queue=QUEUE) as producer:
        task_id = await producer.enqueue("t", None)
        assert await producer.status(task_id) == TaskState.QUEUED


# -- happy paths ------------------------------------------------------------------


async def test_ids_are_unique_28_hex_chars_and_sort_by_creation(
    producer: Producer,
) -> None:
    ids = []
    for i in range(20):
        ids.append(await producer.enqueue("t", i))
        # Ids order by the millisecond: step past it so the order is defined.
        await anyio.sleep(0.002)
    ids += await producer.enqueue_many([Task("t", i) for i in range(200)])
    assert len(set(ids)) == len(ids)
    for task_id in ids:
        assert len(task_id) == 28
        assert set(task_id) <= HEX
    assert ids[:20] == sorted(ids[:20])
    # A batch made after the singles sorts after all of them.
    assert min(ids[20:]) > max(ids[:20])


async def test_status_of_unknown_fresh_and_delayed_tasks(producer: Producer) -> None:
    assert await producer.status("0" * 28) is None
    fresh = await producer.enqueue("t", None, group="g")
    behind = await producer.enqueue("t", None, group="g")  # parked behind `fresh`
    delayed = await producer.enqueue("t", None, delay=60)
    delayed_td = await producer.enqueue("t", None, delay=timedelta(minutes=1))
    zero_delay = await producer.enqueue("t", None, delay=0)
    assert await producer.status(fresh) is TaskState.QUEUED
    assert await producer.status(behind) is TaskState.QUEUED
    assert await producer.status(delayed) is TaskState.DELAYED
    assert await producer.status(delayed_td) is TaskState.DELAYED
    assert await producer.status(zero_delay) is TaskState.QUEUED


async def test_status_of_a_non_string_id_is_a_type_error(producer: Producer) -> None:
    with pytest.raises(TypeError):
        await producer.status(123)  # type: ignore[arg-type]


async def test_dedup_key_returns_the_first_id_within_the_window(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    first = await producer.enqueue("t", 1, dedup_key="order-1", group="g")
    again = await producer.enqueue("t", 2, dedup_key="order-1", group="g")
    other = await producer.enqueue("t", 3, dedup_key="order-2", group="g")
    assert again == first
    assert other != first
    batch = await producer.enqueue_many(
        [
            Task("t", 4, dedup_key="order-1", group="g"),  # the key's group
            Task("t", 5, dedup_key="order-3"),
            Task("t", 6, dedup_key="order-3"),
            Task("t", 7),
        ]
    )
    assert batch[0] == first
    assert batch[1] == batch[2]
    assert len({first, other, batch[1], batch[3]}) == 4
    # Exactly four tasks exist: the duplicates wrote no task of their own.
    assert len(await _task_keys(redis_client)) == 4


async def test_dedup_key_is_forgotten_after_the_window(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue=QUEUE, dedup_window=0.2) as producer:
        first = await producer.enqueue("t", None, dedup_key="k")
        await anyio.sleep(0.3)
        second = await producer.enqueue("t", None, dedup_key="k")
        assert second != first
        assert await producer.status(first) == TaskState.QUEUED
        assert await producer.status(second) == TaskState.QUEUED


async def test_enqueue_many_of_1000_tasks_is_one_round_trip(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    # Grouped, so that the script a batch runs is loaded (a lone plain task
    # runs a lighter one); the connection is open.
    await producer.enqueue("warm-up", None, group="w")
    tasks = [Task("t", i, group=f"g{i % 7}" if i % 10 else None) for i in range(1000)]
    before = await _command_calls(redis_client)
    ids = await producer.enqueue_many(tasks)
    after = await _command_calls(redis_client)
    assert len(ids) == 1000
    assert len(set(ids)) == 1000
    delta = _delta(before, after)
    # One script call. Commands a script runs are counted too, so the rest of
    # the delta is the script's own work; what must be absent is any other way
    # of talking to the server: a second script call, a transaction, a load.
    assert sum(delta.pop(name, 0) for name in SCRIPT_CALLS) == 1
    assert not {"multi", "exec", "script|load", "function|load"} & delta.keys()
    assert len(await _task_keys(redis_client)) == 1001


async def test_enqueue_many_keeps_per_group_order(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    # Run them: the order that matters is the order in which handlers start.
    n = 1000
    started: defaultdict[str | None, list[int]] = defaultdict(list)
    done = anyio.Event()

    async def record(payload: int) -> None:
        started[aiogroupq.current_task().group].append(payload)
        if sum(map(len, started.values())) == n:
            done.set()

    tasks = [Task("t", i, group=f"g{i % 7}" if i % 10 else None) for i in range(n)]
    ids = await producer.enqueue_many(tasks)
    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"t": record}, concurrency=16
    ):
        with anyio.fail_after(30):
            await done.wait()
    for group, seen in started.items():
        expected = [t.payload for t in tasks if t.group == group]
        if group is None:
            assert sorted(seen) == expected  # ungrouped: all ran, any order
        else:
            assert seen == expected, f"group {group} ran out of order"
    assert await producer.status(ids[-1]) == TaskState.SUCCEEDED


async def test_task_carries_enqueue_fields() -> None:
    task = Task(
        "t",
        {"a": 1},
        group="g",
        delay=1.5,
        dedup_key="d",
        max_attempts=4,
        timeout=timedelta(seconds=3),
    )
    assert (task.task_type, task.payload, task.group) == ("t", {"a": 1}, "g")
    assert (task.delay, task.dedup_key, task.max_attempts) == (1.5, "d", 4)
    assert task.timeout == timedelta(seconds=3)
    assert Task("t").payload is None


async def test_enqueue_many_over_the_batch_limit_is_refused_before_any_io(
    producer: Producer, redis_client: redis.asyncio.Redis
) -> None:
    from aiogroupq._limits import MAX_BATCH

    too_many = [aiogroupq.Task("t", n, group=f"g{n % 7}") for n in range(MAX_BATCH + 1)]
    with pytest.raises(aiogroupq.BatchTooLargeError) as info:
        await producer.enqueue_many(too_many)
    assert (info.value.size, info.value.limit) == (MAX_BATCH + 1, MAX_BATCH)
    assert await redis_client.dbsize() == 0
    assert len(await producer.enqueue_many(too_many[:MAX_BATCH])) == MAX_BATCH


async def test_the_documented_split_of_a_larger_batch(
    producer: Producer, redis_client: redis.asyncio.Redis
) -> None:
    """docs/queueing.md's loop, run as written: 2,500 tasks go in three calls,
    ids in the list's order, each group's tasks in order."""
    usage = (Path(__file__).parent.parent / "docs" / "queueing.md").read_text()
    (snippet,) = re.findall(
        r"^```python\n(ids: list\[str\] = \[\]\nfor start in .*?)^```$",
        usage,
        re.MULTILINE | re.DOTALL,
    )
    # The docs' statements, inside a coroutine as a user's code would be.
    source = (
        f"async def split(tasks):\n{textwrap.indent(snippet, '    ')}    return ids"
    )
    namespace: dict[str, Any] = {"producer": producer}
    exec(source, namespace)  # noqa: S102
    tasks = [Task("t", n, group=f"g{n % 3}") for n in range(2_500)]
    # Grouped, so that the batches' script is loaded; the connection is open.
    await producer.enqueue("warm-up", None, group="w")

    before = await _command_calls(redis_client)
    ids = await namespace["split"](tasks)
    after = await _command_calls(redis_client)

    delta = _delta(before, after)
    assert sum(delta.get(name, 0) for name in SCRIPT_CALLS) == 3
    assert len(set(ids)) == 2_500
    assert set(await producer.status_many(ids)) == {TaskState.QUEUED}
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
        for g in range(3):
            # The k-th task of a group in the list has k tasks before it,
            # on both sides of each call's boundary (list index 1,000, 2,000).
            group_ids = ids[g::3]
            sample = [0, 332, 333, 334, 666, 667, len(group_ids) - 1]
            assert [await admin.position(group_ids[k]) for k in sample] == sample
