"""No stored byte crashes a consumer or a read API.

Each test enqueues real tasks, then overwrites what Redis stores for them (the
envelope field ``e``, the result ``r``, the state ``s``, …) with bytes no
producer writes, and checks that the consumer dead-letters the task with its
real reason and keeps running, and that every read API answers with a value
or an aiogroupq error.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import Consumer, Producer, TaskState
from aiogroupq._store.codec import MAX_DEPTH
from aiogroupq._store.keys import QueueKeys

QUEUE = "bytes"
KEYS = QueueKeys(QUEUE)
WAIT = 15.0


class Point(msgspec.Struct):
    x: int
    y: int


def mp(value: object) -> bytes:
    """One MessagePack value."""
    return msgspec.msgpack.encode(value)


def envelope(
    *,
    type_: bytes = mp("h"),
    payload: bytes = mp(1),
    group: bytes = mp(None),
    max_attempts: bytes = mp(3),
    timeout_ms: bytes = mp(None),
) -> bytes:
    """An envelope assembled field by field, so any field can hold any bytes
    (the layout of :class:`aiogroupq.task.Envelope`: a 7-element array)."""
    fields = (mp("id"), type_, payload, group, max_attempts, timeout_ms, mp(0))
    return b"\x97" + b"".join(fields)


def nested(depth: int) -> Any:
    """A list nested *depth* levels deep."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


#: (stored envelope, reason prefix, fragment of the reason)
CORRUPT = {
    # Invalid UTF-8 used to escape as UnicodeDecodeError and kill the consumer
    # (msgspec 0.23 raises its own DecodeError: either way the reason names it).
    "bad utf-8 in the task type": (
        envelope(type_=b"\xa2\xc3\x28"),
        "CorruptEnvelope: ",
        "utf-8",
    ),
    "bad utf-8 in a payload string": (
        envelope(payload=b"\xa2\xc3\x28"),
        "InvalidPayload: ",
        "utf-8",
    ),
    # RecursionError, the same (deeper than the decoder goes on any Python:
    # about 1,000 levels on 3.11, 1,500 on 3.12, 10,000 on 3.13).
    "payload nested 20,000 levels": (
        envelope(payload=b"\x91" * 20_000 + b"\x01"),
        "CorruptEnvelope: ",
        "nested too deeply",
    ),
    "truncated": (envelope()[:-3], "CorruptEnvelope: ", "truncated"),
    "random bytes": (b"\xc1\x07\xff\x00garbage", "CorruptEnvelope: ", "malformed"),
    "empty": (b"", "CorruptEnvelope: ", "truncated"),
    "a map instead of an array": (
        mp({"id": "x", "type": "h"}),
        "CorruptEnvelope: ",
        "Expected `array`",
    ),
    "fields of the wrong types": (mp([1, 2, 3]), "CorruptEnvelope: ", "Expected"),
    "max_attempts 0": (
        envelope(max_attempts=mp(0)),
        "CorruptEnvelope: ",
        "max_attempts",
    ),
    "negative timeout": (
        envelope(timeout_ms=mp(-5)),
        "CorruptEnvelope: ",
        "timeout_ms",
    ),
}


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    yield
    gc.collect()


@pytest.fixture
async def producer(redis_client: redis.asyncio.Redis) -> AsyncIterator[Producer]:
    async with Producer(redis_client, queue=QUEUE) as p:
        yield p


async def dead_letters(client: redis.asyncio.Redis) -> list[aiogroupq.DeadLetter]:
    """The queue's dead letters, oldest first."""
    async with aiogroupq.Admin(client, queue=QUEUE) as admin:
        return await admin.dead_letters()


def consumer(client: redis.asyncio.Redis, **kwargs: Any) -> Consumer:
    async def h(payload: Any) -> Any:
        return payload

    kwargs.setdefault("handlers", {"h": aiogroupq.Handler(h, store_result=True)})
    return Consumer(client, queue=QUEUE, retry_backoff=0.05, **kwargs)


async def overwrite(
    client: redis.asyncio.Redis, task_id: str, field: str, value: bytes
) -> None:
    """Replace one stored field of a task's hash."""
    assert await client.hexists(KEYS.task(task_id), field)
    await client.hset(KEYS.task(task_id), field, value)


async def wait_for(producer: Producer, task_id: str) -> TaskState | None:
    """The task's state once it is terminal."""
    with anyio.fail_after(WAIT):
        while (state := await producer.status(task_id)) not in (
            TaskState.SUCCEEDED,
            TaskState.DEAD,
            TaskState.CANCELLED,
        ):
            await anyio.sleep(0.01)
    return state


@pytest.mark.parametrize("case", list(CORRUPT))
async def test_corrupt_envelope_is_dead_lettered_and_the_consumer_goes_on(
    redis_client: redis.asyncio.Redis,
    producer: Producer,
    case: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stored, prefix, fragment = CORRUPT[case]
    bad = await producer.enqueue("h", 1, group="g")
    after = await producer.enqueue("h", 2, group="g")  # waits behind the bad one
    await overwrite(redis_client, bad, "e", stored)
    with caplog.at_level(logging.ERROR, logger="aiogroupq"):
        async with consumer(redis_client) as running:
            assert await wait_for(producer, after) == TaskState.SUCCEEDED
            assert await wait_for(producer, bad) == TaskState.DEAD
        # Once stopped: the stats count a finish when its reply is back,
        # after the state another connection may already read.
        assert running.stats.dead == 1
        assert running.stats.succeeded == 1
    letters = {letter.id: letter for letter in await dead_letters(redis_client)}
    reason = letters[bad].reason
    assert reason.startswith(prefix), reason
    assert fragment.lower() in reason.lower(), reason
    assert letters[bad].attempts == 1  # never retried
    with pytest.raises(aiogroupq.TaskFailedError, match=prefix):
        await producer.result(bad, timeout=0)
    assert await producer.result(after, timeout=0) == 2
    # One line says why; no traceback of an internal error.
    about = [r for r in caplog.records if bad in r.getMessage()]
    assert len(about) == 1, [r.getMessage() for r in about]
    assert about[0].exc_info is None


async def test_payload_nested_2000_levels_ends_its_task_and_nothing_else(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    # Deeper than the producer accepts. Whether a consumer can still decode
    # it depends on its Python (no on 3.11 and 3.12, yes on 3.13): either way
    # the task ends with a reason, and the consumer goes on.
    got: list[int] = []

    async def h(payload: Any) -> None:
        got.append(1 if isinstance(payload, list) else 0)

    bad = await producer.enqueue("h", 1, group="g")
    after = await producer.enqueue("h", 2, group="g")
    await overwrite(redis_client, bad, "e", envelope(payload=b"\x91" * 2000 + b"\x01"))
    async with consumer(redis_client, handlers={"h": h}):
        assert await wait_for(producer, after) == TaskState.SUCCEEDED
        state = await wait_for(producer, bad)
    if state == TaskState.DEAD:
        (letter,) = await dead_letters(redis_client)
        assert "nested too deeply" in letter.reason, letter.reason
    else:
        assert state == TaskState.SUCCEEDED
        assert got == [1, 0]


async def test_many_corrupt_tasks_at_once_leave_the_consumer_running(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    bad = {}
    for n, (stored, prefix, _) in enumerate(CORRUPT.values()):
        task_id = await producer.enqueue("h", n, group=f"g{n % 3}")
        await overwrite(redis_client, task_id, "e", stored)
        bad[task_id] = prefix
    async with consumer(redis_client, concurrency=4) as running:
        for task_id in bad:
            assert await wait_for(producer, task_id) == TaskState.DEAD
        # Still claiming: a task enqueued now runs.
        late = await producer.enqueue("h", 99, group="g0")
        assert await wait_for(producer, late) == TaskState.SUCCEEDED
    assert running.stats.dead == len(bad)  # once stopped, as above
    letters = {letter.id: letter for letter in await dead_letters(redis_client)}
    for task_id, prefix in bad.items():
        assert letters[task_id].reason.startswith(prefix)


# -- the consumer's payload limit ---------------------------------------------


async def test_consumer_refuses_payloads_over_its_limit(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue=QUEUE, max_payload_bytes=10_000) as p:
        # Over the consumer's limit, by a little (the envelope is decoded,
        # then its payload measured) and by a lot (refused on the stored
        # envelope's size alone, before decoding).
        over = await p.enqueue("h", "x" * 1_500, group="g")
        far_over = await p.enqueue("h", "x" * 5_000, group="g")
        small = await p.enqueue("h", "x" * 100, group="g")

        async def h(payload: str) -> None:
            del payload

        async with consumer(redis_client, handlers={"h": h}, max_payload_bytes=1_000):
            assert await wait_for(p, small) == TaskState.SUCCEEDED
            assert await wait_for(p, over) == TaskState.DEAD
            assert await wait_for(p, far_over) == TaskState.DEAD
        letters = {letter.id: letter for letter in await dead_letters(redis_client)}
    reason = letters[over].reason
    assert reason.startswith("PayloadTooLarge: the stored payload is 1503 bytes")
    assert "max_payload_bytes" in reason
    reason = letters[far_over].reason
    assert reason.startswith("PayloadTooLarge: the stored envelope is 50")
    assert "max_payload_bytes" in reason


async def test_oversized_envelope_is_refused_before_decoding(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    task_id = await producer.enqueue("h", 1)
    # Two MiB of a never-ending nested array: decoding it would be slow and
    # deep; it is refused by size first, with the default limit.
    await overwrite(redis_client, task_id, "e", b"\x91" * (2 * 1024 * 1024))
    async with consumer(redis_client):
        assert await wait_for(producer, task_id) == TaskState.DEAD
    (letter,) = await dead_letters(redis_client)
    assert letter.reason.startswith("PayloadTooLarge: the stored envelope is 2097152")
    assert letter.type == "?"


def test_consumer_payload_limit_is_validated() -> None:
    async def h() -> None:
        pass

    bad: Any
    for bad in (0, -1, 1.5, "big", True):
        with pytest.raises(aiogroupq.ConfigurationError, match="max_payload_bytes"):
            Consumer(
                "redis://localhost",
                queue=QUEUE,
                handlers={"h": h},
                max_payload_bytes=bad,
            )


# -- nesting depth --------------------------------------------------------------


async def test_producer_refuses_payloads_nested_deeper_than_the_limit(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    keys_before = await redis_client.dbsize()
    for depth in (MAX_DEPTH + 1, 2_000, 100_000):
        with pytest.raises(aiogroupq.UnencodablePayloadError, match="nested deeper"):
            await producer.enqueue("h", nested(depth))
        with pytest.raises(aiogroupq.UnencodablePayloadError, match="nested deeper"):
            await producer.enqueue_many([aiogroupq.Task("h", {"a": nested(depth)})])
    assert await redis_client.dbsize() == keys_before


async def test_payload_at_the_depth_limit_round_trips_through_a_consumer(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    # What the producer accepts, the consumer decodes: also from inside its
    # own call stack, which is deeper than the producer's here.
    deepest = nested(MAX_DEPTH)
    got: list[Any] = []

    async def h(payload: list[Any]) -> None:
        got.append(payload)

    task_id = await producer.enqueue("h", deepest)
    async with consumer(redis_client, handlers={"h": h}):
        assert await wait_for(producer, task_id) == TaskState.SUCCEEDED
    assert got == [deepest]


async def test_unencodable_result_is_dead_lettered_and_the_consumer_goes_on(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    async def h(payload: int) -> Any:
        return nested(2_000) if payload == 1 else payload

    bad = await producer.enqueue("h", 1, group="g")
    after = await producer.enqueue("h", 2, group="g")
    handler = aiogroupq.Handler(h, store_result=True)
    async with consumer(redis_client, handlers={"h": handler}):
        assert await wait_for(producer, after) == TaskState.SUCCEEDED
    assert await producer.status(bad) == TaskState.DEAD
    with pytest.raises(aiogroupq.TaskFailedError, match=r"UnencodableResult: .*nested"):
        await producer.result(bad, timeout=0)


# -- read APIs on stored bytes ------------------------------------------------------


async def test_result_that_does_not_fit_the_requested_type_is_a_typed_error(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    task_id = await producer.enqueue("h", 7)
    async with consumer(redis_client):
        assert await wait_for(producer, task_id) == TaskState.SUCCEEDED
    assert await producer.result(task_id, timeout=0) == 7
    with pytest.raises(aiogroupq.InvalidResultError, match="Point") as caught:
        await producer.result(task_id, timeout=0, result_type=Point)
    assert caught.value.task_id == task_id
    for stored in (b"\xa2\xc3\x28", b"\x91" * 5_000, b"\xc1", b"\x01\x02"):
        await overwrite(redis_client, task_id, "r", stored)
        with pytest.raises(aiogroupq.InvalidResultError):
            await producer.result(task_id, timeout=0)


async def test_unknown_stored_state_is_a_typed_error(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    task_id = await producer.enqueue("h", 7)
    for stored in (b"exploded", b"\xff\xfe"):
        await overwrite(redis_client, task_id, "s", stored)
        with pytest.raises(aiogroupq.CorruptTaskError, match="unknown state"):
            await producer.status(task_id)
        with pytest.raises(aiogroupq.CorruptTaskError, match="unknown state"):
            await producer.result(task_id, timeout=0)


async def test_dead_letters_survive_any_stored_bytes(
    redis_client: redis.asyncio.Redis, producer: Producer
) -> None:
    ids = [await producer.enqueue("nobody", n, group="g") for n in range(4)]
    async with consumer(redis_client):
        for task_id in ids:
            assert await wait_for(producer, task_id) == TaskState.DEAD
    damage = [
        {"e": b"\x91" * 3_000},  # deeper than the decoder goes
        {"e": envelope(payload=b"\xa2\xc3\x28")},  # bad UTF-8 in the payload
        {"x": b"\xff\xfe reason", "tb": b"\xc3\x28", "a": b"many"},
        {"e": envelope(type_=b"\xa2\xc3\x28")},  # bad UTF-8 in the type
    ]
    for task_id, fields in zip(ids, damage, strict=True):
        for field, value in fields.items():
            await overwrite(redis_client, task_id, field, value)
    letters = {letter.id: letter for letter in await dead_letters(redis_client)}
    assert sorted(letters) == sorted(ids)
    assert (letters[ids[0]].type, letters[ids[0]].payload) == ("?", None)
    assert (letters[ids[1]].type, letters[ids[1]].payload) == ("h", None)
    assert letters[ids[2]].reason == "\ufffd\ufffd reason"
    assert letters[ids[2]].attempts == 0
    assert letters[ids[3]].type == "?"
    for task_id in ids:
        assert await producer.status(task_id) == TaskState.DEAD
        with pytest.raises(aiogroupq.TaskFailedError):
            await producer.result(task_id, timeout=0)
