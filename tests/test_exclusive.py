"""Exclusive groups (``set_group(g, ordering="exclusive")``): still one task
of the group at a time, but a task waiting out its retry backoff lets later
tasks of the group run meanwhile, and re-joins the tail of the group's line
when due. Judged from the journal of real consumers: exclusion always, order
only where strict. The scripts' exact behaviour is in the model test
(tests/test_model.py)."""

from __future__ import annotations

import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._check import check as _fsck
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq.errors import ConfigurationError

from ._journal import Entry, Job, Journal, check, consumer_processes, make_handlers
from ._scripts_helpers import (
    KEYS,
    assert_consistent,
    claim,
    claim_one,
    control,
    enqueue,
    finish,
    new,
    ok,
)
from ._settle import assert_all_done, until_done


def _show(name: str, **figures: object) -> None:
    print(f"[{name}] " + " ".join(f"{k}={v}" for k, v in figures.items()))  # noqa: T201


def _starts(entries: list[Entry], group: str) -> list[tuple[int, int]]:
    """(seq, attempt) of the group's starts, in claim order."""
    return [
        (e.seq, e.attempt)
        for e in sorted(entries, key=lambda e: e.token)
        if e.event == "start" and e.group == group
    ]


async def test_later_tasks_run_during_a_retry_backoff_one_at_a_time(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """The first task of each group fails once. In the exclusive group the
    others start during its backoff, and it runs again after them (the
    tail); in the strict group nothing overtakes it. Neither ever runs two
    at once, and the check finds nothing while the retry waits."""
    queue = "exclusive"
    async with aiogroupq.Admin(redis_url, queue=queue) as admin:
        await admin.set_group("x", ordering="exclusive")
        await admin.set_group("s", ordering="strict")
        assert (await admin.group_settings("x")).ordering == "exclusive"
        assert (await admin.group_settings("s")).ordering is None
    journal = Journal(redis_client)
    jobs = [
        Job(n=g * 10 + seq, group=name, seq=seq, fail_until=2 if seq == 0 else 0)
        for g, name in enumerate(("x", "s"))
        for seq in range(4)
    ]
    async with aiogroupq.Producer(redis_url, queue=queue) as producer:
        for job in jobs:
            await producer.enqueue("work", job, group=job.group)
    problems_meanwhile: list[object] = []
    async with aiogroupq.Consumer(
        redis_url,
        queue=queue,
        handlers=make_handlers(journal),
        concurrency=4,
        retry_backoff=1.0,
    ):
        await until_done(redis_url, queue, journal, 3)  # x's later, in the backoff
        found = await _fsck.examine(redis_client, QueueKeys(queue))
        problems_meanwhile += found.problems
        await assert_all_done(redis_url, queue, journal, (j.n for j in jobs))
    entries = await journal.entries()
    figures = check(entries, {j.n: j for j in jobs})
    x, s = _starts(entries, "x"), _starts(entries, "s")
    _show("exclusive", x=x, strict=s)
    assert problems_meanwhile == []
    assert x == [(0, 1), (1, 1), (2, 1), (3, 1), (0, 2)]
    assert s == [(0, 1), (0, 2), (1, 1), (2, 1), (3, 1)]
    assert figures.overlaps == 0
    assert figures.max_group_concurrency == 1
    assert figures.order_violations == 1  # x's retry, after its later tasks


@pytest.mark.slow
async def test_exclusion_holds_across_processes_with_retries(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """Two processes of 4 handlers, 4 exclusive groups whose tasks fail their
    first attempt one in three: never two of a group at once, every task
    done, the queue consistent afterwards."""
    queue = "exclusive-mp"
    groups = [f"x{i}" for i in range(4)]
    async with aiogroupq.Admin(redis_url, queue=queue) as admin:
        for g in groups:
            await admin.set_group(g, ordering="exclusive")
    journal = Journal(redis_client)
    jobs = [
        Job(
            n=i * len(groups) + k,
            group=g,
            seq=i,
            sleep_ms=3,
            fail_until=2 if i % 3 == 0 else 0,
        )
        for i in range(30)
        for k, g in enumerate(groups)
    ]
    async with (
        consumer_processes(
            redis_url, queue, processes=2, concurrency=4, retry_backoff=0.05
        ),
        aiogroupq.Producer(redis_url, queue=queue) as producer,
    ):
        await producer.enqueue_many(
            [aiogroupq.Task("work", job, group=job.group) for job in jobs]
        )
        await assert_all_done(redis_url, queue, journal, (j.n for j in jobs))
    figures = check(await journal.entries(), {j.n: j for j in jobs})
    _show(
        "exclusive-mp",
        overlaps=figures.overlaps,
        reordered=figures.order_violations,
        processes=figures.processes,
    )
    assert figures.processes == 2
    assert figures.order_violations > 0  # retries were overtaken: exclusive
    assert figures.overlaps == 0
    assert figures.max_group_concurrency == 1
    assert figures.never_run == figures.unfinished == 0
    assert (await _fsck.examine(redis_client, QueueKeys(queue))).problems == []


@pytest.mark.parametrize("bad", ["fifo", "", 1, True])
async def test_a_bad_ordering_is_refused_and_nothing_is_written(
    redis_client: redis.asyncio.Redis, bad: object
) -> None:
    async with aiogroupq.Admin(redis_client, queue="bad-ordering") as admin:
        await admin.set_group("g", concurrency=2)
        with pytest.raises(ConfigurationError, match="ordering"):
            await admin.set_group("g", ordering=bad)  # type: ignore[arg-type]
        assert await admin.group_settings("g") == aiogroupq.GroupSettings(concurrency=2)


async def test_a_retry_waiting_when_its_group_turns_strict_rejoins_the_tail(
    redis_client: redis.asyncio.Redis,
) -> None:
    """The scripts alone: a's retry gives its slot to b; the group goes back
    to strict meanwhile (the check still finds nothing); when due, a joins
    the line behind c, and the group never has two runnable at once."""

    async def ordering(value: str) -> None:
        await control(redis_client, "group", "g", "", "", "", "", "", "", value)

    await ordering("exclusive")
    await enqueue(redis_client, new("a", "g"), new("b", "g"), new("c", "g"))
    a = await claim_one(redis_client)
    retry = _scripts.Outcome("a", a.token, "retry", 86_400_000, "err")
    await finish(redis_client, retry)
    await assert_consistent(redis_client)
    await ordering("")  # strict again, with a's retry holding no slot
    await assert_consistent(redis_client)
    b = await claim_one(redis_client)
    assert b.id == "b"
    await finish(redis_client, ok(b))
    await redis_client.zadd(KEYS.delayed, {"a": 0}, xx=True)  # a falls due
    reply = await claim(redis_client, k=3)
    assert [t.id for t in reply.tasks] == ["c"]  # a waits behind it
    await assert_consistent(redis_client)
    await finish(redis_client, ok(reply.tasks[0]))
    last = await claim_one(redis_client)
    assert (last.id, last.attempt) == ("a", 2)
    await finish(redis_client, ok(last))
    await assert_consistent(redis_client)


async def test_the_ordering_shows_in_group_info_and_the_group_command(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    from .test_cli_ops import cli, value

    queue = "excl-shown"
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        await producer.enqueue("t", 1, group="x")
        await producer.enqueue("t", 1, group="s")
        await admin.set_group("x", ordering="exclusive")
        assert (await admin.group_info("x")).ordering == "exclusive"
        assert (await admin.group_info("s")).ordering == "strict"
    run = await cli("group", "x", url=redis_url, queue=queue)
    assert run.code == 0, run
    assert value(run.out, "ordering") == "exclusive"
    run = await cli("group", "s", "--json", url=redis_url, queue=queue)
    assert run.json()["ordering"] == "strict"
