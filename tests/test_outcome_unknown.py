"""An enqueue that was sent and got no reply is an unknown outcome, never
"unavailable" (issue 17): a batch whose script outlasted the budget had been
written, and its caller was told Redis was unreachable (a caller that
retried wrote it twice). Refused before sending, nothing is written, and the
error says so; a reply lost mid-way is re-sent without writing twice.

Real servers throughout: a loopback proxy (the chaos tests') holds or cuts
replies, ``CLIENT PAUSE WRITE`` holds a script before it runs. The budget of
a call is lowered to 1 s so that each case takes seconds, not tens.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import anyio
import pytest
import redis.asyncio
import redis.exceptions

import aiogroupq
from aiogroupq import ConfigurationError
from aiogroupq._store import failures as _failures
from aiogroupq._store.keys import QueueKeys

from ._budget import SHORT_BUDGET
from .chaos._proxy import ChaosProxy

if TYPE_CHECKING:
    from aiogroupq.testing._server import ServerProcess

QUEUE = "outcome"
KEYS = QueueKeys(QUEUE)
BUDGET = SHORT_BUDGET
pytestmark = pytest.mark.usefixtures("short_budget")


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[ChaosProxy]:
    port = int(server.url.rsplit(":", 1)[1].split("/", 1)[0])
    chaos = ChaosProxy(port)
    chaos.start()
    try:
        yield chaos
    finally:
        chaos.stop()


def _batch(n: int) -> list[aiogroupq.Task]:
    return [
        aiogroupq.Task("t", i, group=f"g{i % 3}", dedup_key=f"d{i}", unique=i % 2 == 0)
        for i in range(n)
    ]


async def _present(client: redis.asyncio.Redis, ids: list[str]) -> int:
    # One EXISTS of every key: reads of one key at a time could span the
    # script (some before it ran, some after) and count a part of its tasks.
    return int(await client.exists(*(KEYS.task(task_id) for task_id in ids)))


async def test_a_reply_that_never_comes_is_an_unknown_outcome_and_the_tasks_landed(
    server: ServerProcess, proxy: ChaosProxy
) -> None:
    url = proxy.add_link()
    direct = redis.asyncio.Redis.from_url(server.url)
    try:
        async with aiogroupq.Producer(url, queue=QUEUE) as producer:
            await producer.enqueue(
                "t", "warm", group="w"
            )  # a pooled connection, the script loaded
            # Nothing forwarded for 2.5 budgets: the script reaches the server
            # when the pause ends, the producer has given up by then.
            proxy.pause(BUDGET * 2.5)
            start = time.monotonic()
            with pytest.raises(aiogroupq.OutcomeUnknownError) as info:
                await producer.enqueue_many(_batch(6))
            took = time.monotonic() - start
        ids = info.value.task_ids
        assert len(ids) == 6
        assert len(set(ids)) == 6
        assert isinstance(info.value, aiogroupq.RedisUnavailableError)
        assert "outcome unknown" in str(info.value)
        assert ids[0] in str(info.value)
        with anyio.fail_after(30):
            while (landed := await _present(direct, ids)) == 0:
                await anyio.sleep(0.05)
        # One atomic script: all of them, once each.
        assert landed == 6
        stats = await direct.hgetall(KEYS.stats)
        assert int(stats[b"enqueued"]) == 7
    finally:
        await direct.aclose()
    print(  # noqa: T201 - the figures this test reports
        f"no reply: OutcomeUnknownError after {took:.2f} s (budget {BUDGET} s); "
        f"{landed}/6 tasks there once the reply would have come"
    )


async def test_a_script_held_past_the_budget_is_an_unknown_outcome_all_or_none(
    server: ServerProcess,
) -> None:
    direct = redis.asyncio.Redis.from_url(server.url)
    try:
        async with aiogroupq.Producer(server.url, queue=QUEUE) as producer:
            await producer.enqueue("t", "warm", group="w")  # the batch's script loaded
            # CLIENT PAUSE WRITE holds the enqueue script unrun (Redis 7.0 and
            # Valkey 8 alike) until after the producer gave up.
            await direct.client_pause(int(BUDGET * 2500), all=False)
            start = time.monotonic()
            with pytest.raises(aiogroupq.OutcomeUnknownError) as info:
                await producer.enqueue_many(_batch(5))
            took = time.monotonic() - start
            await anyio.sleep(BUDGET * 2)  # the pause is over
            ids = info.value.task_ids
            present = await _present(direct, ids)
            states = await producer.status_many(ids)
    finally:
        await direct.aclose()
    assert present in (0, 5), present
    assert states == ([None] * 5 if present == 0 else states)
    print(  # noqa: T201 - the figures this test reports
        f"paused writes: OutcomeUnknownError after {took:.2f} s; "
        f"{present}/5 tasks written once the pause ended"
    )


async def test_refused_before_sending_is_unavailable_with_nothing_written(
    server: ServerProcess,
) -> None:
    async with aiogroupq.Producer(server.url, queue=QUEUE) as producer:
        await producer.enqueue("t", "warm", group="w")  # the batch's script loaded
        server.stop()
        # The pooled connection, closed by the server, goes with a first call
        # (redis-py 8 no longer checks a pooled connection for a pending EOF
        # before reuse: an enqueue written into it would be a request that
        # may have reached a server, an unknown outcome to the client).
        with pytest.raises(aiogroupq.RedisUnavailableError):
            await producer.status("0" * 28)
        start = time.monotonic()
        with pytest.raises(aiogroupq.RedisUnavailableError) as info:
            await producer.enqueue_many(_batch(3))
        took = time.monotonic() - start
    # Every try was refused: certainly nothing written, and said so.
    assert type(info.value) is aiogroupq.RedisUnavailableError, info.value
    assert "refused" in str(info.value)
    print(  # noqa: T201 - the figure this test reports
        f"refused: RedisUnavailableError after {took:.2f} s"
    )


async def test_a_reply_cut_midway_is_resent_and_writes_each_task_once(
    server: ServerProcess, proxy: ChaosProxy
) -> None:
    # The script ran, its reply was lost: the client's re-send within the
    # budget finds every id written and writes nothing again (ids are made
    # by the producer, and the script leaves an existing id as it is).
    url = proxy.add_link()
    direct = redis.asyncio.Redis.from_url(server.url)
    try:
        async with aiogroupq.Producer(url, queue=QUEUE) as producer:
            await producer.enqueue("t", "warm", group="w")  # the batch's script loaded
            proxy.cut_next_reply()
            ids = await producer.enqueue_many(_batch(9))
            assert proxy.cuts == 1
            assert await _present(direct, ids) == 9
            stats = await direct.hgetall(KEYS.stats)
            lines = {g: await direct.llen(KEYS.parked(g)) for g in ("g0", "g1", "g2")}
    finally:
        await direct.aclose()
    assert int(stats[b"enqueued"]) == 10  # the warm-up and nine, none twice
    # Each group: one task in its slot, two in its line (not four).
    assert lines == {"g0": 2, "g1": 2, "g2": 2}
    print(  # noqa: T201 - the figure this test reports
        f"reply cut once: {len(ids)} ids returned, {int(stats[b'enqueued']) - 1} "
        "written, none twice"
    )


def test_a_reply_that_cannot_be_read_mid_call_is_an_unknown_outcome() -> None:
    # Only a new connection's handshake meeting another protocol is "not a
    # Redis server" (nothing sent); a broken reply to a sent enqueue may
    # follow a write that landed.
    with (
        pytest.raises(aiogroupq.OutcomeUnknownError) as info,
        _failures.outcome_of(["t1"], certain=lambda: True),
    ):
        raise redis.exceptions.InvalidResponse("Protocol Error: b'?'")
    assert info.value.task_ids == ["t1"]
    not_redis = _failures.NotRedisError("127.0.0.1:1", ValueError("HTTP/1.1"))
    assert isinstance(_failures.as_aiogroupq_error(not_redis), ConfigurationError)
