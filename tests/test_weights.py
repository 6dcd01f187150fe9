"""Weighted groups: under backlog each group's share of starts is its weight
over the sum of the weights, every group still starts within a bounded
number of starts, order and exclusion hold, a bad weight is refused, and a
queue without weights runs no more commands per task than before.

Shares are counted from the journal of real consumers (one in this process,
or two spawned processes), never from timing.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio
import redis.exceptions

import aiogroupq
from aiogroupq._check import (
    check as _fsck,
    problems as problem_kinds,
    repair as _repair,
)
from aiogroupq._inspect import render
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.replies import FinishCode
from aiogroupq.dashboard import create_app
from aiogroupq.errors import ConfigurationError

from ._journal import Entry, Job, Journal, check, consumer_processes, make_handlers
from ._scripts_helpers import (
    KEYS,
    assert_consistent,
    claim,
    claim_one,
    enqueue,
    finish,
    new,
    ok,
)
from ._web import serving
from .test_script_commands import _commands

LIVENESS = 120.0
WEIGHTS = {"w1": 1, "w2": 2, "w3": 3, "w4": 4}
#: starts whose shares are judged
COUNTED = 1000
#: commands per task of _line_drain_commands before weights existed
PLAIN_LINE_DRAIN = 57.25  # 57.23 measured at 95f7ed4


def _show(name: str, **figures: object) -> None:
    print(f"[{name}] " + " ".join(f"{k}={v}" for k, v in figures.items()))  # noqa: T201


def _backlog(groups: Sequence[str], per_group: int) -> list[Job]:
    """*per_group* jobs of each group, interleaved (so enqueue order favours
    nobody)."""
    n = itertools.count()
    return [
        Job(n=next(n), group=g, seq=seq) for seq in range(per_group) for g in groups
    ]


async def _enqueue(producer: aiogroupq.Producer, jobs: Sequence[Job]) -> None:
    tasks = [aiogroupq.Task("work", job, group=job.group) for job in jobs]
    # Interleaved batches: every group has a backlog from the first claim on.
    for start in range(0, len(tasks), 1000):
        await producer.enqueue_many(tasks[start : start + 1000])


def _starts(entries: Sequence[Entry]) -> list[Entry]:
    # Claims are ordered by their fencing tokens (a handler may journal its
    # start after one claimed later by another process does).
    return sorted((e for e in entries if e.event == "start"), key=lambda e: e.token)


async def _set_weights(
    url: str, queue: str, weights: dict[str, int], **configure: Any
) -> None:
    async with aiogroupq.Admin(url, queue=queue) as admin:
        if configure:
            await admin.configure(**configure)
        for group, weight in weights.items():
            await admin.set_group(group, weight=weight)


def _assert_shares(
    starts: Sequence[Entry], weights: dict[str, int], slack: float = 0.1
) -> None:
    first = Counter(e.group for e in starts[:COUNTED])
    total = sum(weights.values())
    shares = {g: first[g] / COUNTED for g in weights}
    _show("shares", **{g: f"{s:.3f}" for g, s in shares.items()})
    for g, w in weights.items():
        want = w / total
        assert abs(shares[g] - want) <= slack * want, (g, shares[g], want)


async def _run_one_consumer(
    url: str,
    client: redis.asyncio.Redis,
    queue: str,
    jobs: Sequence[Job],
    concurrency: int = 1,
) -> list[Entry]:
    """One consumer, one handler by default: the worker is the bottleneck.
    Stops once COUNTED tasks are done (the rest is handed back)."""
    journal = Journal(client)
    async with aiogroupq.Producer(url, queue=queue) as producer:
        await _enqueue(producer, jobs)
    async with aiogroupq.Consumer(
        url, queue=queue, handlers=make_handlers(journal), concurrency=concurrency
    ):
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(COUNTED + 10)
    entries = await journal.entries()
    figures = check(entries, {j.n: j for j in jobs})
    assert figures.order_violations == figures.overlaps == 0
    assert figures.max_group_concurrency == 1
    return entries


async def test_shares_follow_the_weights_with_one_handler(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "weights"
    await _set_weights(redis_url, queue, WEIGHTS)
    jobs = _backlog(list(WEIGHTS), 500)
    entries = await _run_one_consumer(redis_url, redis_client, queue, jobs)
    _assert_shares(_starts(entries), WEIGHTS)


async def test_the_queue_default_weight_applies_to_groups_without_their_own(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """group_weight=3: the groups without a weight of their own run at 3, the
    one set to 1 at 1 (shares 3:3:3:1)."""
    queue = "weights-default"
    await _set_weights(redis_url, queue, {"one": 1}, group_weight=3)
    async with aiogroupq.Admin(redis_url, queue=queue) as admin:
        assert (await admin.settings()).group_weight == 3
        assert (await admin.group_info("d1")).weight == 3
        assert (await admin.group_info("one")).weight == 1
    groups = ["d1", "d2", "d3", "one"]
    jobs = _backlog(groups, 400)
    entries = await _run_one_consumer(redis_url, redis_client, queue, jobs)
    _assert_shares(_starts(entries), {"d1": 3, "d2": 3, "d3": 3, "one": 1})


async def test_weights_with_priorities_and_aging(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """With priorities in use (the ready tasks in pready), a weighted group
    keeps the front of its level: the shares hold among groups of one level,
    with aging too."""
    queue = "weights-prio"
    await _set_weights(redis_url, queue, {}, priority_aging=5.0)
    async with aiogroupq.Admin(redis_url, queue=queue) as admin:
        for group, weight in WEIGHTS.items():
            await admin.set_group(group, weight=weight, priority=3)
    jobs = _backlog(list(WEIGHTS), 500)
    entries = await _run_one_consumer(redis_url, redis_client, queue, jobs)
    _assert_shares(_starts(entries), WEIGHTS)


async def test_drain_ignores_weights(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """fairness="drain": a group keeps the front until its backlog is done,
    whatever its weight (as documented). Claims and finishes in lockstep,
    one task at a time: a consumer may claim again before its last finish
    has landed (its slot frees when the handler returns), which lets
    another group's head in once, so the queue's own order is judged here."""
    await _set_weights(redis_url, KEYS.queue, WEIGHTS, fairness="drain")
    await enqueue(
        redis_client,
        *(new(f"t{seq}-{g}", g) for seq in range(300) for g in WEIGHTS),
    )
    groups = []
    for _ in range(300 * len(WEIGHTS)):
        task = await claim_one(redis_client)
        groups.append(task.id.split("-")[1])
        assert await finish(redis_client, ok(task)) == [FinishCode.APPLIED]
    runs = [len(list(run)) for _, run in itertools.groupby(groups)]
    _show("drain", runs=runs)
    assert runs == [300] * len(WEIGHTS)
    await assert_consistent(redis_client)


async def test_shares_follow_the_weights_with_claims_and_finishes_of_many(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """Four handlers on one consumer, 5 groups of each weight: claims and
    finishes handle several tasks of several weighted groups in one call,
    so each group's turn counter must be its own however many groups a call
    moves on. While a group's task runs, others take the front beside it,
    so a light group comes round a little more often than its share (1.1-
    1.2x here): the shares are judged within 30 % and in weight order."""
    queue = "weights-many"
    groups = {f"{g}-{i}": w for g, w in WEIGHTS.items() for i in range(5)}
    await _set_weights(redis_url, queue, groups)
    jobs = _backlog(list(groups), 150)
    entries = await _run_one_consumer(
        redis_url, redis_client, queue, jobs, concurrency=4
    )
    by_weight = [
        Entry(e.clock, e.event, e.n, (e.group or "").split("-")[0], *rest)
        for e in _starts(entries)
        for rest in [dataclasses.astuple(e)[4:]]
    ]
    _assert_shares(by_weight, {g: 5 * w for g, w in WEIGHTS.items()}, slack=0.3)
    shares = Counter(e.group for e in by_weight[:COUNTED])
    assert sorted(WEIGHTS, key=shares.__getitem__) == list(WEIGHTS), shares


@pytest.mark.slow
async def test_shares_follow_the_weights_across_two_processes(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """Two handlers in two processes, 5 groups of each weight. While one
    group keeps the front, others start beside it: with few groups per
    handler a light group comes round more often than its share (4 groups
    on 2 handlers: weight 1 gets 1.29x its share, docs/groups.md), from
    about 5 per handler on the shares are within 10 %."""
    queue = "weights-mp"
    groups = {f"{g}-{i}": w for g, w in WEIGHTS.items() for i in range(5)}
    await _set_weights(redis_url, queue, groups)
    journal = Journal(redis_client)
    jobs = _backlog(list(groups), 150)
    async with (
        consumer_processes(redis_url, queue, processes=2, concurrency=1),
        aiogroupq.Producer(redis_url, queue=queue) as producer,
    ):
        await _enqueue(producer, jobs)
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(COUNTED + 10)
    entries = await journal.entries()
    figures = check(entries, {j.n: j for j in jobs})
    _show("two processes", processes=figures.processes, starts=figures.starts)
    assert figures.processes == 2
    assert figures.order_violations == figures.overlaps == 0
    by_weight = [
        Entry(e.clock, e.event, e.n, (e.group or "").split("-")[0], *rest)
        for e in _starts(entries)
        for rest in [dataclasses.astuple(e)[4:]]
    ]
    _assert_shares(by_weight, {g: 5 * w for g, w in WEIGHTS.items()})


async def test_a_weight_1_group_among_weight_100_groups_is_not_starved(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """Heavy groups keep the front for 100 turns each, then go behind: the
    light group waits at most the other groups' weights' worth of starts
    between two of its own."""
    queue = "weights-starve"
    heavy = {f"h{i}": 100 for i in range(3)}
    await _set_weights(redis_url, queue, heavy)
    jobs = _backlog([*heavy, "light"], 400)
    entries = await _run_one_consumer(redis_url, redis_client, queue, jobs)
    groups = [e.group for e in _starts(entries)][:COUNTED]
    light_at = [i for i, g in enumerate(groups) if g == "light"]
    gaps = [b - a - 1 for a, b in itertools.pairwise([-1, *light_at])]
    runs = [len(list(run)) for g, run in itertools.groupby(groups) if g != "light"]
    _show("starvation", light_starts=len(light_at), longest_gap=max(gaps))
    assert max(runs) >= 90  # the weights are in force...
    assert max(gaps) <= sum(heavy.values())  # ...and bounded
    assert len(light_at) >= COUNTED // (sum(heavy.values()) + 1)


# -- settings, views, bad input ---------------------------------------------------


@pytest.mark.parametrize("bad", [0, 101, 1.5, "2", True, -1, None])
async def test_a_bad_weight_is_refused_and_nothing_is_written(
    redis_client: redis.asyncio.Redis, bad: object
) -> None:
    async with aiogroupq.Admin(redis_client, queue="bad-weight") as admin:
        await admin.set_group("g", concurrency=2)
        if bad is not None:  # None is "leave to the default" for set_group
            with pytest.raises(ConfigurationError, match="weight"):
                await admin.set_group("g", weight=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="group_weight"):
            await admin.configure(group_weight=bad)  # type: ignore[arg-type]
        assert await admin.group_settings("g") == aiogroupq.GroupSettings(concurrency=2)
        assert (await admin.settings()).group_weight == 1
    assert await redis_client.hget(QueueKeys("bad-weight").conf, "wt") is None


async def test_update_group_changes_one_setting_and_keeps_the_others(
    redis_client: redis.asyncio.Redis,
) -> None:
    # set_group(g, weight=2) replaced every setting: an earlier
    # concurrency=4 was lost. update_group changes only what it is given.
    rate = aiogroupq.Rate(10, 60)
    async with aiogroupq.Admin(redis_client, queue="keep-settings") as admin:
        await admin.set_group("g", concurrency=4, rate=rate, priority=5)
        await admin.pause_group("g")
        await admin.update_group("g", weight=2)
        assert await admin.group_settings("g") == aiogroupq.GroupSettings(
            concurrency=4, rate=rate, priority=5, weight=2, paused=True
        )
        await admin.update_group("g", ordering="exclusive", rate=False)
        await admin.update_group("g", concurrency=None)  # the queue's default
        assert await admin.group_settings("g") == aiogroupq.GroupSettings(
            rate=False, priority=5, weight=2, paused=True, ordering="exclusive"
        )
        await admin.update_group("g", rate=None, ordering="strict", max_size=9)
        assert await admin.group_settings("g") == aiogroupq.GroupSettings(
            max_size=9, priority=5, weight=2, paused=True
        )
        # set_group keeps its documented meaning: it replaces them all.
        await admin.set_group("g", weight=3)
        assert await admin.group_settings("g") == aiogroupq.GroupSettings(
            weight=3, paused=True
        )


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({}, "no setting"),
        ({"weight": 0}, "weight"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"rate": 5}, "rate"),
        ({"ordering": "fifo"}, "ordering"),
    ],
)
async def test_update_group_refuses_bad_input_and_writes_nothing(
    redis_client: redis.asyncio.Redis, settings: dict[str, Any], match: str
) -> None:
    async with aiogroupq.Admin(redis_client, queue="keep-bad") as admin:
        await admin.set_group("g", concurrency=2)
        with pytest.raises(ConfigurationError, match=match):
            await admin.update_group("g", **settings)
        assert await admin.group_settings("g") == aiogroupq.GroupSettings(concurrency=2)


async def test_an_update_raising_concurrency_starts_waiting_tasks_at_once(
    redis_client: redis.asyncio.Redis,
) -> None:
    await enqueue(redis_client, *[new(f"t{i}", group="g") for i in range(3)])
    assert len((await claim(redis_client, "c1", k=10)).tasks) == 1
    await _scripts.control(redis_client, KEYS, "update", "g", "c", 3, "wt", 2)
    assert len((await claim(redis_client, "c1", k=10)).tasks) == 2
    await assert_consistent(redis_client)
    assert await redis_client.hgetall(KEYS.group_conf("g")) == {b"c": b"3", b"wt": b"2"}
    # Malformed calls are refused before any write.
    for args in (("g",), ("g", "c"), ("g", "zz", 1), ("g", "c", 1, "wt")):
        with pytest.raises(redis.exceptions.ResponseError, match="aiogroupq control"):
            await _scripts.control(redis_client, KEYS, "update", *args)
    assert await redis_client.hgetall(KEYS.group_conf("g")) == {b"c": b"3", b"wt": b"2"}


async def test_weight_shows_in_settings_views_and_the_cli_text(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with (
        aiogroupq.Admin(redis_client, queue="show-weight") as admin,
        aiogroupq.Producer(redis_client, queue="show-weight") as producer,
    ):
        await admin.set_group("g", weight=7)
        await producer.enqueue("work", {}, group="g")
        assert (await admin.group_settings("g")).weight == 7
        assert (await admin.group_settings("other")).weight is None
        info = await admin.group_info("g")
        assert info.weight == 7
        assert (await admin.group_info("other")).weight == 1
        page = await admin.groups()
        assert [i.weight for i in page.groups if i.group == "g"] in ([7], [])
        assert "weight:" in render.render_group(info)
        assert render.render_group(info).split("weight:")[1].split()[0] == "7"
        await admin.set_group("g")  # back to the default
        assert (await admin.group_info("g")).weight == 1


async def test_the_dashboard_group_page_shows_the_weight(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with aiogroupq.Admin(redis_client, queue="dash-weight") as admin:
        await admin.set_group("g", weight=9)
    with serving(create_app(redis_url, queues=["dash-weight"])) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            page = await client.get("/q/dash-weight/group", params={"name": "g"})
            other = await client.get("/q/dash-weight/group", params={"name": "h"})
    assert page.status_code == other.status_code == 200
    assert re.search(r"<th>weight</th><td data-weight>9</td>", page.text)
    assert "weight 9, ordering strict</td>" in page.text  # its own setting
    assert re.search(r"<th>weight</th><td data-weight>1</td>", other.text)
    assert "weight queue default, ordering strict</td>" in other.text


async def test_a_finish_of_many_groups_turns_each_groups_counter_alone(
    redis_client: redis.asyncio.Redis,
) -> None:
    """Four groups of weight 3 finish their heads in one call, three times:
    each group's turn counter counts that group's turns alone (1, 2, then
    round over), whatever the other groups in the same call did."""
    groups = [f"g{n}" for n in range(4)]
    for g in groups:
        await _scripts.control(redis_client, KEYS, "update", g, "wt", 3)
    await enqueue(redis_client, *(new(f"t{s}{g}", g) for s in range(4) for g in groups))
    for seq, turns in enumerate(("1", "2", "0")):
        reply = await claim(redis_client, "c1", k=10)
        assert sorted(t.id for t in reply.tasks) == [f"t{seq}{g}" for g in groups]
        await finish(redis_client, *(ok(t) for t in reply.tasks))
        counters = {g: await redis_client.hget(KEYS.group(g), "tn") for g in groups}
        assert counters == dict.fromkeys(groups, turns.encode()), (
            f"after one finish of the four groups' heads each counter is "
            f"{turns}: {counters}"
        )
    await assert_consistent(redis_client)


async def test_the_check_reports_a_bad_stored_weight_and_repair_resets_it(
    redis_client: redis.asyncio.Redis,
) -> None:
    keys = KEYS
    async with (
        aiogroupq.Admin(redis_client, queue=keys.queue) as admin,
        aiogroupq.Producer(redis_client, queue=keys.queue) as producer,
    ):
        await admin.configure(group_weight=2)
        await admin.set_group("g", weight=5)
        for n in range(4):
            await producer.enqueue("work", {"n": n}, group="g")
        for _ in range(2):
            await finish(redis_client, ok(await claim_one(redis_client)))
        # A weighted group's turn counter is state the check accepts.
        assert await redis_client.hget(keys.group("g"), "tn") == b"2"
        assert (await _fsck.examine(redis_client, keys)).problems == []
        await redis_client.hset(keys.group_conf("g"), "wt", "500")
        await redis_client.hset(keys.group_conf("g"), "o", "loose")
        await redis_client.hset(keys.conf, "wt", "two")
        found = (await _fsck.examine(redis_client, keys)).problems
        assert {(p.kind, p.group) for p in found} == {
            (problem_kinds.BAD_SETTING, "g"),
            (problem_kinds.BAD_SETTING, None),
        }, found
        # Meanwhile the scripts take both as unset.
        assert (await admin.group_info("g")).weight == 1
        done, left = await _repair.repair(redis_client, keys)
        assert left == [], (left, done)
        assert {r.step for r in done} == {"setting"}
        assert (await admin.group_settings("g")).weight is None
        assert await redis_client.hget(keys.group_conf("g"), "o") is None
        assert (await admin.settings()).group_weight == 1
        assert (await _fsck.examine(redis_client, keys)).problems == []


async def test_weights_live_in_the_groups_partition_and_move_with_it(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """Two partitions: a group's weight is stored in its own partition and
    read there; a repartition copies it to the group's new partition (with
    its other settings), so it holds after the move."""
    queue = "weights-parts"
    groups = [f"g{i}" for i in range(12)]
    async with aiogroupq.Admin(redis_client, queue=queue, partitions=2) as admin:
        for n, g in enumerate(groups):
            await admin.set_group(g, weight=n + 2, concurrency=3, ordering="exclusive")
        for n, g in enumerate(groups):
            assert (await admin.group_info(g)).weight == n + 2
        await admin.start_repartition(3)
        assert await admin.finish_repartition() == []
        for n, g in enumerate(groups):
            settings = await admin.group_settings(g)
            assert (settings.weight, settings.concurrency) == (n + 2, 3), g
            assert settings.ordering == "exclusive", g
            assert (await admin.group_info(g)).weight == n + 2
    found = await _fsck.examine(redis_url, queue)
    assert found.problems == []


# -- pay only for what you use ------------------------------------------------------


async def _line_drain_commands(
    client: redis.asyncio.Redis, weight: int | None = None
) -> float:
    """Commands per task of a drain of 8 groups of 8 tasks each by one
    handler, scripts alone (each finish moves its group's line on)."""
    if weight is not None:
        await _scripts.control(client, KEYS, "queue", "", "", "", "", "", weight)
    await enqueue(
        client, *(new(f"t{s}{g}", f"g{g}") for s in range(8) for g in range(8))
    )
    before = await _commands(client)
    done = 0
    while done < 64:
        reply = await claim(client, k=1)
        assert len(reply.tasks) == 1
        await finish(client, *(ok(t) for t in reply.tasks))
        done += 1
    return (await _commands(client) - before) / 64


async def test_a_queue_without_weights_runs_no_more_commands_per_task(
    redis_client: redis.asyncio.Redis,
) -> None:
    """A grouped drain with lines (a release that moves a line on per task)
    runs the commands it ran before weights existed; a weighted one reads
    and writes its turn counter in commands it runs anyway, but one HGET
    per turn."""
    plain = await _line_drain_commands(redis_client)
    await redis_client.flushdb()
    weighted = await _line_drain_commands(redis_client, weight=4)
    _show("commands per task", plain=f"{plain:.2f}", weighted=f"{weighted:.2f}")
    assert plain <= PLAIN_LINE_DRAIN  # measured before weights
    assert weighted <= plain + 1
    await assert_consistent(redis_client)
