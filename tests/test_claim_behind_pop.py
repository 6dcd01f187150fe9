"""An idle fetcher writes its claim right behind its blocking pop of the wake
list, on one connection: the server claims the moment a wake token comes,
with no round trip back to the consumer in between (the idle pickup's
latency); a stop or a flushed script cache costs no task, and a pop refused
in front of a claim that ran is waited out as a plain pop's refusal."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio
from redis.exceptions import ResponseError

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys

from ._scripts_helpers import Flush, script_calls

QUEUE = "behind-pop"
KEYS = QueueKeys(QUEUE)


def enqueue_from_another_loop(url: str, *args: object, **kwargs: object) -> str:
    """Enqueue in a thread of its own, while this test's event loop stays
    blocked: nothing of the consumer in this loop runs meanwhile."""
    ids: list[str] = []

    async def go() -> None:
        async with aiogroupq.Producer(url, queue=QUEUE) as producer:
            ids.append(await producer.enqueue(*args, **kwargs))  # type: ignore[arg-type]

    thread = threading.Thread(target=asyncio.run, args=(go(),))
    thread.start()
    thread.join(10)
    assert ids, "the enqueue did not finish"
    return ids[0]


async def blocked_in_pop(client: redis.asyncio.Redis) -> None:
    """Wait until some connection is blocked in BLPOP (the fetcher idles)."""
    with anyio.fail_after(10):
        while not any(c["cmd"] == "blpop" for c in await client.client_list()):
            await anyio.sleep(0.01)


async def test_the_server_claims_for_an_idle_consumer_whose_loop_is_busy(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    ran = anyio.Event()

    async def handler() -> None:
        ran.set()

    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"h": handler}, concurrency=4
    ):
        await blocked_in_pop(redis_client)
        # From here to the end of the polling, this loop is blocked: only
        # the server can claim, by the claim already written behind the pop.
        wait_until_running(redis_url, enqueue_from_another_loop(redis_url, "h"))
        with anyio.fail_after(10):
            await ran.wait()


async def test_a_cache_flushed_while_idle_costs_no_task(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture, flush: Flush
) -> None:
    # The claim written behind the pop answers NOSCRIPT (or finds the
    # library gone) once the pop ends: it did not run, and goes again as a
    # plain script call. Not re-sent,
    # the claim fails (a warning, the recovery of what the consumer holds,
    # a backoff) and the task waits for the claim after: none is lost
    # either way, so the warnings are what tell the two apart.
    caplog.set_level(logging.WARNING, logger="aiogroupq")
    done: list[int] = []

    async def handler(n: int) -> None:
        done.append(n)

    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers={"h": handler}, concurrency=4
        ),
    ):
        for n in range(5):
            await blocked_in_pop(redis_client)
            await flush(redis_client)
            await producer.enqueue("h", n)
            with anyio.fail_after(10):
                while len(done) <= n:
                    await anyio.sleep(0.01)
    assert done == [0, 1, 2, 3, 4]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [], f"a claim behind the pop failed after a flush: {warned}"


async def test_a_claim_behind_a_pop_that_meets_a_flushed_cache_is_sent_again(
    redis_client: redis.asyncio.Redis, flush: Flush
) -> None:
    # The script cache is empty when the pop ends: the claim behind it did
    # not run, and this one call still claims (sent again on its own).
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = [await producer.enqueue("h", n) for n in range(3)]
    await flush(redis_client)
    tokens = await redis_client.rpush(KEYS.wake, "1")  # the pop ends at once
    try:
        reply = await _scripts.claim(
            redis_client, KEYS, "c1", k=4, lease_ms=60_000, scan_limit=100, pop=5
        )
    except ResponseError as exc:
        pytest.fail(f"the claim behind the pop was not sent again after a flush: {exc}")
    claimed = [t.id for t in reply.tasks]
    assert claimed == ids, (
        f"the claim behind the pop, sent again after a flush, claimed {claimed} "
        f"of {ids}"
    )
    assert reply.pop_error is None
    assert await redis_client.llen(KEYS.wake) == tokens - 1  # the pop took one


def wait_until_running(url: str, task_id: str) -> None:
    """Poll (blocking this loop) until the server claimed *task_id*."""
    state = None
    with redis.Redis.from_url(url) as sync:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            state = sync.hget(KEYS.task(task_id), "s")
            if state == b"running":
                return
            time.sleep(0.005)
    raise AssertionError(f"not claimed while the loop was blocked: {state!r}")


async def test_a_consumer_stopped_with_a_claim_unread_holds_nothing(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    # The claim behind the pop ran, its reply is not read yet, and the
    # consumer stops: the stop cuts the wait short and the reply is lost.
    # What it claimed goes back at once, not when its lease (60 s) ends.
    ran: list[int] = []

    async def handler(n: int) -> None:
        ran.append(n)

    ids = []
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        for n in range(3):
            async with aiogroupq.Consumer(
                redis_client,
                queue=QUEUE,
                handlers={"h": handler},
                concurrency=4,
                lease_ttl=60,
                name="stopper",
            ):
                await blocked_in_pop(redis_client)
                ids.append(enqueue_from_another_loop(redis_url, "h", n))
                wait_until_running(redis_url, ids[-1])
                # The stop begins here, before this loop reads the reply.
            assert await redis_client.scard(KEYS.inflight("stopper")) == 0
            assert await redis_client.zcard(KEYS.leases) == 0
            assert await producer.status(ids[-1]) == aiogroupq.TaskState.QUEUED
        async with aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers={"h": handler}, concurrency=4
        ):
            with anyio.fail_after(10):
                while len(ran) < 3:
                    await anyio.sleep(0.02)
    assert sorted(ran) == [0, 1, 2]


async def test_a_pop_refused_in_front_of_a_claim_that_runs_is_paced(
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A user allowed everything but BLPOP (an ACL rule missing it): the pop
    # in front of each claim is refused at once, and the claim behind it
    # runs. The refusal is logged and waited out as a plain pop's is, not
    # answered by the next claim at once, over and over.
    caplog.set_level(logging.WARNING, logger="aiogroupq")
    user = f"behind-pop-{os.getpid()}"
    execute: Any = redis_client.execute_command
    await execute("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-blpop")
    url = redis_url.replace("redis://", f"redis://{user}:pw@")
    done = anyio.Event()

    async def handler() -> None:
        done.set()

    try:
        async with (
            aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
            aiogroupq.Consumer(url, queue=QUEUE, handlers={"h": handler}),
        ):
            with anyio.fail_after(10):
                while "waiting for work failed" not in caplog.text:
                    await anyio.sleep(0.01)
            before = await script_calls(redis_client)
            await anyio.sleep(0.5)
            claims = await script_calls(redis_client) - before
            print(f"claims in 0.5 s while the pop is refused: {claims}")  # noqa: T201
            # About one per 50 ms wait; without the wait, claims follow one
            # another as fast as round trips go (thousands a second).
            assert claims < 200, claims
            await producer.enqueue("h")
            with anyio.fail_after(10):
                await done.wait()
    finally:
        await redis_client.acl_deluser(user)
