"""Concurrent ``enqueue()`` calls of one producer are coalesced into one
script call while another is on the wire (_store/coalesce.py): each caller
still gets its own id and its own error, tasks of a group keep the order of
the calls, and the batch caps split what queued up."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio

from aiogroupq import (
    Admin,
    GroupFullError,
    OutcomeUnknownError,
    Producer,
    RedisUnavailableError,
    Task,
)
from aiogroupq._store import routing
from aiogroupq._store.coalesce import Coalescer, Refusal, SendElsewhere, Sender
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.replies import GroupFullRefusal
from aiogroupq._store.scripts import NewTask

from ._scripts_helpers import script_calls

QUEUE = "coalesce"


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


async def _all(calls: Sequence[Any]) -> list[Any]:
    return list(await asyncio.gather(*calls, return_exceptions=True))


def _never_refused(refusal: Refusal, news: Sequence[NewTask]) -> BaseException:
    raise AssertionError(refusal)


def _lane(send: Sender, direct: Sender | None = None) -> Coalescer:
    """A lane whose calls are never refused (a refusal fails the test)."""
    return Coalescer(
        send, _never_refused, max_tasks=1000, max_bytes=10**6, direct=lambda: direct
    )


async def test_concurrent_enqueues_share_script_calls(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue=QUEUE) as p:
        await p.enqueue("warm")
        before = await script_calls(redis_client)
        ids = await _all([p.enqueue("t", i) for i in range(200)])
        calls = await script_calls(redis_client) - before
    print(f"\n200 concurrent enqueue() calls: {calls} script calls")  # noqa: T201
    assert len(set(ids)) == 200
    assert all(isinstance(i, str) for i in ids)
    for task_id in ids:
        assert await redis_client.exists(QueueKeys(QUEUE).task(task_id))
    # One sent at once, the others in a few coalesced calls (not 200).
    assert calls <= 5


async def test_sequential_enqueues_go_one_by_one(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue=QUEUE) as p:
        await p.enqueue("warm")  # its script cached: one call each from here
        before = await script_calls(redis_client)
        for i in range(20):
            await p.enqueue("t", i)
        assert await script_calls(redis_client) - before == 20


async def test_group_keeps_the_order_of_the_calls(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue=QUEUE) as p:
        ids = await _all([p.enqueue("t", i, group="g") for i in range(150)])
    keys = QueueKeys(QUEUE)
    ready = [_text(x) for x in await redis_client.lrange(keys.ready, 0, -1)]
    parked = await redis_client.lrange(keys.parked("g"), 0, -1)
    assert ready == ids[:1]
    assert [_text(x) for x in parked] == ids[1:]


async def test_group_full_goes_to_its_callers_only(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Admin(redis_client, queue=QUEUE) as admin:
        await admin.set_group("small", max_size=3)
    async with Producer(redis_client, queue=QUEUE) as p:
        calls = [
            p.enqueue("t", i, group="small" if i % 2 else f"own{i}") for i in range(40)
        ]
        results = await _all(calls)
    refused = [i for i, r in enumerate(results) if isinstance(r, GroupFullError)]
    written = [i for i, r in enumerate(results) if isinstance(r, str)]
    # The first three of the small group got in; every other call as well.
    assert refused == list(range(7, 40, 2))
    assert len(written) == 40 - len(refused)
    assert all(results[i].group == "small" for i in refused)
    assert await redis_client.llen(QueueKeys(QUEUE).parked("small")) == 2


async def test_dedup_hit_goes_to_its_caller(redis_client: redis.asyncio.Redis) -> None:
    async with Producer(redis_client, queue=QUEUE) as p:
        ids = await _all(
            [
                p.enqueue("t", i, dedup_key="k" if i in (3, 7) else None)
                for i in range(20)
            ]
        )
    assert ids[7] == ids[3]
    assert len(set(ids)) == 19


async def test_enqueue_many_joins_whole(redis_client: redis.asyncio.Redis) -> None:
    async with Admin(redis_client, queue=QUEUE) as admin:
        await admin.set_group("cap", max_size=2)
    async with Producer(redis_client, queue=QUEUE) as p:
        results = await _all(
            [
                p.enqueue("t", 0),
                p.enqueue("t", 1),
                p.enqueue_many([Task("t", 2), Task("t", 3, group="cap")]),
                p.enqueue_many([Task("t", 4, group="cap")] * 2),  # refused whole
                p.enqueue("t", 5, group="cap"),
            ]
        )
    assert isinstance(results[2], list)
    assert len(results[2]) == 2
    assert isinstance(results[3], GroupFullError)
    assert isinstance(results[4], str)
    assert await redis_client.llen(QueueKeys(QUEUE).parked("cap")) == 1


async def test_caps_split_coalesced_calls(
    redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[tuple[int, int]] = []
    send = routing.send

    async def spy(client: Any, parts: Any, news: Sequence[NewTask], **kw: Any) -> Any:
        sizes.append((len(news), sum(len(n.envelope) + len(n.identity) for n in news)))
        return await send(client, parts, news, **kw)

    monkeypatch.setattr(routing, "send", spy)
    async with Producer(redis_client, queue=QUEUE, max_batch_bytes=4_000) as p:
        ids = await _all([p.enqueue("t", "x" * 300) for _ in range(1_000)])
    assert len(set(ids)) == 1_000
    print(  # noqa: T201 - the figure this test reports
        f"\n1,000 enqueues of ~350 B under 4,000 B: {len(sizes)} script calls"
    )
    assert max(size for _, size in sizes) <= 4_000
    assert len(sizes) < 1_000 / 5


async def test_partitioned_queue_keeps_group_order(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with Producer(redis_client, queue="coalesce-parts", partitions=4) as p:
        ids = await _all([p.enqueue("t", i, group=f"g{i % 9}") for i in range(300)])
        homes = {f"g{g}": p._parts.of_group(f"g{g}")[0] for g in range(9)}
    assert len(set(ids)) == 300
    assert len({keys.partition for keys in homes.values()}) > 1
    for g in range(9):
        mine = [ids[i] for i in range(g, 300, 9)]
        parked = await redis_client.lrange(homes[f"g{g}"].parked(f"g{g}"), 0, -1)
        assert [_text(x) for x in parked] == mine[1:]


# Coalescer on its own, with a send function of the test's: what each
# caller gets when the whole script call fails.


async def test_whole_call_failure_gives_each_caller_its_ids() -> None:
    sent: list[int] = []
    gate = asyncio.Event()

    async def send(news: Sequence[NewTask]) -> list[str]:
        sent.append(len(news))
        if len(sent) == 1:
            await gate.wait()
            return [n.id for n in news]
        raise OutcomeUnknownError([n.id for n in news], "cut")

    lane = _lane(send)
    first = asyncio.ensure_future(lane.submit([_new("a")]))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(lane.submit([_new(x)])) for x in "bcd"]
    await asyncio.sleep(0)
    gate.set()
    assert await first == ["a"]
    errors = await _all(rest)
    assert sent == [1, 3]
    assert [e.task_ids for e in errors] == [["b"], ["c"], ["d"]]


async def test_refusal_of_one_caller_resends_the_others() -> None:
    sent: list[list[str]] = []
    gate = asyncio.Event()

    async def send(news: Sequence[NewTask]) -> list[str]:
        sent.append([n.id for n in news])
        if len(sent) == 1:
            await gate.wait()
        if "c" in sent[-1]:
            raise GroupFullRefusal(sent[-1].index("c"), 5, 5)
        return [n.id for n in news]

    def public(refusal: Refusal, news: Sequence[NewTask]) -> BaseException:
        assert isinstance(refusal, GroupFullRefusal)
        return GroupFullError(news[refusal.index].id, refusal.live, refusal.cap)

    lane = Coalescer(send, public, max_tasks=1000, max_bytes=10**6)
    first = asyncio.ensure_future(lane.submit([_new("a")]))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(lane.submit([_new(x)])) for x in "bcd"]
    cancelled = asyncio.ensure_future(lane.submit([_new("e")]))
    await asyncio.sleep(0)
    cancelled.cancel()
    gate.set()
    assert await first == ["a"]
    results = await _all(rest)
    assert results[0] == ["b"]
    assert results[2] == ["d"]
    assert isinstance(results[1], GroupFullError)
    assert results[1].group == "c"
    # Refused alone, the others sent again; the cancelled caller never sent.
    assert sent == [["a"], ["b", "c", "d"], ["b", "d"]]


def _new(task_id: str) -> NewTask:
    return NewTask(
        id=task_id,
        group=None,
        envelope=b"x",
        delay_ms=0,
        max_attempts=1,
        dedup_key=None,
    )


async def test_calls_queued_behind_an_unanswered_call_fail_at_once() -> None:
    # Nothing of them was sent: they need not wait out budgets of their own.
    sent: list[int] = []
    gate = asyncio.Event()

    async def send(news: Sequence[NewTask]) -> list[str]:
        sent.append(len(news))
        await gate.wait()
        raise OutcomeUnknownError([n.id for n in news], "no reply")

    lane = _lane(send)
    first = asyncio.ensure_future(lane.submit([_new("a")]))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(lane.submit([_new(x)])) for x in "bc"]
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(OutcomeUnknownError):
        await first
    errors = await _all(rest)
    assert sent == [1]
    assert [type(e) for e in errors] == [RedisUnavailableError] * 2


async def test_a_cancelled_caller_keeps_the_lane_until_its_call_ends() -> None:
    # Its request may still run: nothing may overtake it, and closing waits.
    log: list[str] = []
    gate = asyncio.Event()

    async def send(news: Sequence[NewTask]) -> list[str]:
        log.append(f"start {news[0].id}")
        if news[0].id == "a":
            await gate.wait()
        log.append(f"end {news[0].id}")
        return [n.id for n in news]

    lane = _lane(send)
    first = asyncio.ensure_future(lane.submit([_new("a")]))
    await asyncio.sleep(0)
    first.cancel()
    second = asyncio.ensure_future(lane.submit([_new("b")]))
    closed = asyncio.ensure_future(lane.aclose())
    await asyncio.sleep(0.01)
    assert log == ["start a"]
    assert not closed.done()
    gate.set()
    assert await second == ["b"]
    await closed
    assert log == ["start a", "end a", "start b", "end b"]


async def test_a_lone_call_runs_in_its_callers_task_on_a_direct_sender() -> None:
    # The direct sender keeps a cancelled call's order itself: no task, and
    # the calls queued meanwhile go the lane's way once it is answered.
    where: list[object] = []
    gate = asyncio.Event()

    async def direct(news: Sequence[NewTask]) -> list[str]:
        where.append(asyncio.current_task())
        await gate.wait()
        return [n.id for n in news]

    async def send(news: Sequence[NewTask]) -> list[str]:
        where.append("lane")
        return [n.id for n in news]

    lane = _lane(send, direct)
    first = asyncio.ensure_future(lane.submit([_new("a")]))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(lane.submit([_new("b")]))
    await asyncio.sleep(0)
    gate.set()
    assert await first == ["a"]
    assert await second == ["b"]
    assert where == [first, "lane"]
    await lane.aclose()


async def test_a_direct_sender_that_cannot_send_hands_the_call_to_the_lane() -> None:
    sent: list[str] = []

    async def direct(news: Sequence[NewTask]) -> list[str]:
        raise SendElsewhere  # e.g. the queue was partitioned meanwhile

    async def send(news: Sequence[NewTask]) -> list[str]:
        sent.extend(n.id for n in news)
        return [n.id for n in news]

    lane = _lane(send, direct)
    assert await lane.submit([_new("a")]) == ["a"]
    assert sent == ["a"]
    await lane.aclose()


async def test_a_cancelled_direct_call_frees_the_lane_for_the_next() -> None:
    # The caller's own task carried it: cancelled, it ends, and the lane
    # goes on (the sender, not the lane, keeps the next call behind it).
    gate = asyncio.Event()

    async def direct(news: Sequence[NewTask]) -> list[str]:
        if news[0].id == "a":
            await gate.wait()
        return [n.id for n in news]

    async def send(news: Sequence[NewTask]) -> list[str]:
        return [n.id for n in news]

    lane = _lane(send, direct)
    first = asyncio.ensure_future(lane.submit([_new("a")]))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await lane.submit([_new("b")]) == ["b"]
    await lane.aclose()
