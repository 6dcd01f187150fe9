"""Waiting for a queue to settle, then saying which tasks did not end well.

A test that waits for N tasks to be done turns a lost task into a timeout
that names nothing. These helpers wait instead until nothing of the queue is
left to run (every task ended, whatever its end), then assert the count with
a message that names what is missing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

import anyio

import aiogroupq

if TYPE_CHECKING:
    from ._journal import Journal

#: the longest a settled queue may take to get there (liveness only)
SETTLE = 120.0


async def until_idle(
    url: str, queue: str, *, bound: float = SETTLE
) -> aiogroupq.QueueStats:
    """Wait until nothing of *queue* can start or runs: ready, held (a paused
    group's, or one waiting for its rate), delayed (a first delay or a
    retry's backoff) and running all 0. Tasks parked in a group's line are
    not waited for: they wait behind a holder counted in one of those, so
    with none left they are stuck, and the caller's count names them."""
    async with aiogroupq.Admin(url, queue=queue) as admin:
        with anyio.fail_after(bound):
            while True:
                stats = await admin.stats()
                if not (stats.ready or stats.held or stats.delayed or stats.running):
                    return stats
                await anyio.sleep(0.05)


async def assert_all_done(
    url: str, queue: str, journal: Journal, numbers: Iterable[int]
) -> None:
    """Wait until *queue* is idle, then assert that the handler of each job
    numbered in *numbers* returned normally, naming those that did not."""
    stats = await until_idle(url, queue)
    wanted = set(numbers)
    done = {e.n for e in await journal.entries() if e.event == "end" and e.ok}
    missing = sorted(wanted - done)
    assert not missing, (
        f"{len(missing)} of {len(wanted)} tasks never ended well though the "
        f"queue is idle (parked: {stats.parked}, dead letters: {stats.dead}): "
        f"jobs {missing[:20]}"
    )


async def producer_states(url: str, queue: str, ids: Iterable[str]) -> dict[str, int]:
    """How many of *ids* are in each state, by state name."""
    async with aiogroupq.Producer(url, queue=queue) as producer:
        states = await producer.status_many(list(ids))
    return dict(Counter(str(state) for state in states))


async def until_done(
    url: str, queue: str, journal: Journal, total: int, *, bound: float = SETTLE
) -> None:
    """Wait until *total* distinct tasks are done, failing by name as soon as
    the queue is idle with fewer (what is left can never run)."""
    async with aiogroupq.Admin(url, queue=queue) as admin:
        with anyio.fail_after(bound):
            while (done := await journal.done_count()) < total:
                stats = await admin.stats()
                if not (stats.ready or stats.held or stats.delayed or stats.running):
                    # Read again: the last one may have ended meanwhile.
                    done = await journal.done_count()
                    assert done >= total, (
                        f"{done} of {total} tasks done and the queue is idle "
                        f"(parked: {stats.parked}, dead letters: {stats.dead})"
                    )
                    return
                await anyio.sleep(0.05)
