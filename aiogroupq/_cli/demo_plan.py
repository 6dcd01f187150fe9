"""The demo's workload: its tasks' payload, the plan drawn from a seed (a few
hot groups holding a large share, many small groups, ungrouped tasks), and
its enqueueing in batches."""

from __future__ import annotations

__all__ = ("BATCH", "HOT_GROUPS", "Job", "enqueue_plan", "is_hot", "make_plan")

import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Final

import anyio
import msgspec
import redis.asyncio

import aiogroupq

#: tasks per ``enqueue_many`` round trip
BATCH: Final = 1_000
#: the plan's hot groups: how many, and how their names end
HOT_GROUPS: Final = 3
_HOT_SUFFIX: Final = ":bulk-import"


class Job(msgspec.Struct, array_like=True, frozen=True):
    """A demo task's payload.

    :ivar i: the task's index in the enqueue plan
    :ivar group: its group, or ``None``
    :ivar seq: its position among its group's tasks, from 0 (0 if ungrouped)
    :ivar work_us: simulated work in microseconds (0: just yield once)
    :ivar type: its task type
    """

    i: int
    group: str | None
    seq: int
    work_us: int
    type: str


def make_plan(tasks: int, groups: int, rng: random.Random) -> tuple[list[Job], str]:
    """Draw the workload: 3 hot groups of 5 % each, 20 % ungrouped, the rest
    spread over the other groups, all shuffled together; return it in enqueue
    order, and its description.

    :param tasks: how many tasks
    :param groups: how many groups
    :param rng: the random source
    """
    ungrouped = tasks // 5
    grouped = tasks - ungrouped
    hot_groups = min(HOT_GROUPS, groups)
    hot_each = min(tasks // 20, grouped // hot_groups)
    hot = [f"tenant-{k:04d}{_HOT_SUFFIX}" for k in range(hot_groups)]
    cold = [f"tenant-{k:04d}:orders" for k in range(hot_groups, groups)]
    cold_tasks = grouped - hot_groups * hot_each
    labels: list[str | None] = [g for g in hot for _ in range(hot_each)]
    spread = cold or hot  # with 3 groups or fewer, everything is hot
    labels += spread[: min(cold_tasks, len(spread))]  # each group at least once
    labels += rng.choices(spread, k=cold_tasks - min(cold_tasks, len(spread)))
    labels += [None] * ungrouped
    rng.shuffle(labels)
    seqs: Counter[str] = Counter()
    jobs = []
    for i, group in enumerate(labels):
        seq = 0
        if group is not None:
            seq = seqs[group]
            seqs[group] += 1
        work = rng.randint(0, 2_000) if rng.random() < 0.05 else 0
        kind = "import_rows" if group else rng.choice(("send_mail", "resize_image"))
        jobs.append(Job(i, group, seq, work, kind))
    hot_part = f"{hot_groups} hot groups x {hot_each:,}, " if hot_each else ""
    return jobs, (
        f"{tasks:,} tasks: {hot_part}{cold_tasks:,} over "
        f"{min(cold_tasks, len(spread)):,} groups, {ungrouped:,} ungrouped"
    )


def is_hot(group: str) -> bool:
    """Whether *group* is one of the plan's hot groups."""
    return group.endswith(_HOT_SUFFIX)


async def enqueue_plan(
    client: redis.asyncio.Redis,
    queue: str,
    jobs: Sequence[Job],
    started: float,
    say: Callable[[str], None],
) -> list[str]:
    """Enqueue the plan in batches of :data:`BATCH`, say how fast; return the
    ids.

    :param started: when the enqueueing started (``anyio.current_time()``)
    """
    async with aiogroupq.Producer(client, queue=queue) as producer:
        ids: list[str] = []
        for at in range(0, len(jobs), BATCH):
            ids += await producer.enqueue_many(
                aiogroupq.Task(job.type, job, group=job.group)
                for job in jobs[at : at + BATCH]
            )
    took = anyio.current_time() - started
    say(
        f"enqueued: {len(ids):,} tasks in {took:.2f} s "
        f"({len(ids) / took:,.0f} tasks/s, batches of {BATCH:,})"
    )
    return ids
