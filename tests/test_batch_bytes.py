"""``enqueue_many`` is capped by bytes as well as by count (issue 17): 400
tasks of 512 KiB, each within ``max_payload_bytes`` and under the count cap,
held Redis for 1,847 ms in one script. A batch over ``max_batch_bytes`` is
refused before any I/O, with nothing written."""

from __future__ import annotations

import time

import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._limits import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_PAYLOAD_BYTES

QUEUE = "batchbytes"
#: a payload just within the default max_payload_bytes once encoded
BIG = b"x" * (DEFAULT_MAX_PAYLOAD_BYTES - 64)


async def test_a_batch_over_the_byte_cap_is_refused_with_nothing_written(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue("t", 1)  # something there, to stay unchanged
        before = await redis_client.dbsize()
        # Each task within max_payload_bytes, the count far under 1,000: the
        # bytes alone are over (17 x 512 KiB > 8 MiB).
        tasks = [aiogroupq.Task("t", BIG, group=f"g{i % 4}") for i in range(17)]
        start = time.perf_counter()
        with pytest.raises(aiogroupq.BatchTooLargeError) as info:
            await producer.enqueue_many(tasks)
        took = time.perf_counter() - start
        assert await redis_client.dbsize() == before
    error = info.value
    assert isinstance(error, aiogroupq.InvalidTaskError)
    assert error.unit == "bytes"
    assert error.limit == DEFAULT_MAX_BATCH_BYTES
    assert error.size > DEFAULT_MAX_BATCH_BYTES
    assert "max_batch_bytes" in str(error)
    assert str(error.size) in str(error)
    print(  # noqa: T201 - the figure this test reports
        f"17 tasks, {error.size / 2**20:.2f} MiB: refused in {took * 1000:.0f} ms "
        f"(cap {error.limit / 2**20:.0f} MiB), nothing written"
    )


async def test_the_cap_is_a_producer_setting(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with aiogroupq.Producer(
        redis_client, queue=QUEUE, max_batch_bytes=4096
    ) as producer:
        kib = b"k" * 1024
        with pytest.raises(aiogroupq.BatchTooLargeError, match="4096") as info:
            await producer.enqueue_many([aiogroupq.Task("t", kib)] * 4)
        assert info.value.unit == "bytes"
        assert await redis_client.dbsize() == 0
        assert len(await producer.enqueue_many([aiogroupq.Task("t", kib)] * 3)) == 3
        # One task is bounded by max_payload_bytes alone, in either call.
        big = b"b" * 10_000
        assert await producer.enqueue("t", big)
        assert len(await producer.enqueue_many([aiogroupq.Task("t", big)])) == 1


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "8MiB"])
def test_max_batch_bytes_must_be_a_positive_int(value: object) -> None:
    with pytest.raises(aiogroupq.ConfigurationError, match="max_batch_bytes"):
        aiogroupq.Producer("redis://localhost", queue=QUEUE, max_batch_bytes=value)  # type: ignore[arg-type]


async def test_a_batch_at_the_cap_holds_redis_briefly(
    redis_client: redis.asyncio.Redis,
) -> None:
    # The figure behind the default: what the largest accepted batch costs.
    tasks = [aiogroupq.Task("t", BIG, group=f"g{i % 4}") for i in range(15)]
    await redis_client.config_set("slowlog-log-slower-than", 0)
    await redis_client.slowlog_reset()
    try:
        async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
            start = time.perf_counter()
            ids = await producer.enqueue_many(tasks)
            took = time.perf_counter() - start
        log = await redis_client.slowlog_get(128)
    finally:
        await redis_client.config_set("slowlog-log-slower-than", 10000)
    script = max(
        entry["duration"]
        for entry in log
        if entry["command"].startswith((b"EVAL", b"FCALL"))
    )
    assert len(ids) == 15
    print(  # noqa: T201 - the figure this test reports
        f"15 x 512 KiB (7.5 MiB): script {script / 1000:.1f} ms, "
        f"call {took * 1000:.0f} ms"
    )
