"""``NOSCRIPT`` never reaches a caller, however often the script cache is
flushed: a call that meets it runs again as EVAL, which carries the source."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import anyio
import pytest
import redis.asyncio
from redis.exceptions import NoScriptError

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.replies import FinishCode

from ._settle import until_idle

# The scripts' cache: every client takes EVALSHA (test_functions.py has the
# library's flush).
pytestmark = pytest.mark.usefixtures("scripts_only")

QUEUE = "noscript"
KEYS = QueueKeys(QUEUE)


def flush_after_every_load(
    client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """Make every SCRIPT LOAD of *client* be followed at once by a SCRIPT
    FLUSH: the worst timing a flush on a timer can have. Returns the loads."""
    loads: list[str] = []
    load = client.script_load

    async def load_then_flush(script: Any) -> Any:
        sha = await load(script)
        await client.script_flush()
        loads.append(str(sha))
        return sha

    monkeypatch.setattr(client, "script_load", load_then_flush)
    return loads


async def test_a_flush_between_load_and_retry_does_not_reach_the_caller(
    redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: the reload retried EVALSHA, which a flush landing right
    # after SCRIPT LOAD answered with NOSCRIPT again, up to enqueue_many.
    loads = flush_after_every_load(redis_client, monkeypatch)
    await redis_client.script_flush()
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = await producer.enqueue_many(
            [aiogroupq.Task("h", n, group=f"g{n % 3}") for n in range(10)]
        )
        assert len(loads) == 1
        reply = await _scripts.claim(
            redis_client, KEYS, "c1", k=10, lease_ms=60_000, scan_limit=100
        )
        assert sorted(t.id for t in reply.tasks) == sorted(ids[:3])
        outcomes = [_scripts.Outcome(t.id, t.token, "ok") for t in reply.tasks]
        codes = await _scripts.finish(redis_client, KEYS, outcomes, retention_ms=60_000)
        assert codes == [FinishCode.APPLIED] * 3
        assert len(loads) == 3  # every call met NOSCRIPT, and none failed
        for task_id in ids[:3]:
            assert await producer.status(task_id) is aiogroupq.TaskState.SUCCEEDED


async def test_consumer_and_producer_under_a_flush_every_few_ms(
    redis_url: str, redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    batches, per_batch = 40, 25
    ran: Counter[int] = Counter()
    errors: list[BaseException] = []
    flushes = 0

    async def h(n: int) -> None:
        ran[n] += 1

    stop = anyio.Event()

    async def flush_every_few_ms() -> None:
        nonlocal flushes
        # Stopped by the event, not by cancellation: a cancelled close
        # would leave the connection open.
        async with redis.asyncio.Redis.from_url(redis_url) as flusher:
            while not stop.is_set():
                await flusher.script_flush()
                flushes += 1
                await anyio.sleep(0.002)

    stats_before = await redis_client.info("commandstats")
    with caplog.at_level(logging.WARNING, logger="aiogroupq"):
        async with (
            aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
            aiogroupq.Consumer(
                redis_client, queue=QUEUE, handlers={"h": h}, concurrency=16
            ) as consumer,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(flush_every_few_ms)
            for b in range(batches):
                tasks = [
                    aiogroupq.Task("h", b * per_batch + i, group=f"g{i % 7}")
                    for i in range(per_batch)
                ]
                try:
                    await producer.enqueue_many(tasks)
                except NoScriptError as exc:  # counted, so the figure is printed
                    errors.append(exc)
                await anyio.sleep(0.003)
            await until_idle(redis_url, QUEUE)
            stop.set()
        stats = consumer.stats
    stats_after = await redis_client.info("commandstats")
    fallbacks = stats_after.get("cmdstat_eval", {}).get("calls", 0) - stats_before.get(
        "cmdstat_eval", {}
    ).get("calls", 0)
    # redis-py words NOSCRIPT as "No matching script. Please use EVAL."
    noscript_logs = [
        r
        for r in caplog.records
        if "NOSCRIPT" in r.getMessage() or "matching script" in r.getMessage()
    ]
    print(  # noqa: T201 - the figures this test reports
        f"\nSCRIPT FLUSH x{flushes} while enqueueing {batches} batches of "
        f"{per_batch}: NoScriptError to the caller {len(errors)}, NOSCRIPT in "
        f"the consumer's logs {len(noscript_logs)}, EVAL fallbacks {fallbacks}, "
        f"succeeded {stats.succeeded}"
    )
    assert errors == []
    assert noscript_logs == []
    wanted = range(batches * per_batch)
    never = [n for n in wanted if not ran[n]]
    twice = {n: k for n, k in ran.items() if k != 1}
    assert (never, twice) == ([], {}), (
        f"each task runs exactly once: {len(never)} never ran ({never[:20]}), "
        f"these ran more than once: {twice}"
    )
    assert set(ran) == set(wanted)
    assert flushes > batches  # the flushes did interleave with the work
