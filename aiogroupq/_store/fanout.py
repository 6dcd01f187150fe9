"""Operations of a partitioned queue that span partitions: one call per
partition (each script still touches one partition's keys), sent at once,
their answers merged."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from . import scripts as _scripts
from .partition import Partitions, crc
from .queries import dead_rows

if TYPE_CHECKING:
    from .connection import Client
    from .keys import QueueKeys
    from .queries import DeadRow

logger = logging.getLogger("aiogroupq")

T = TypeVar("T")


def by_partition(parts: Partitions, ids: Sequence[str]) -> dict[QueueKeys, list[str]]:
    """*ids* by the partition each names, in their order."""
    out: dict[QueueKeys, list[str]] = {}
    for task_id in ids:
        out.setdefault(parts.of_id(task_id), []).append(task_id)
    return out


async def each_partition(
    partitions: Sequence[QueueKeys], call: Callable[[QueueKeys], Awaitable[T]]
) -> list[T]:
    """``call(keys)`` for every partition at once; the results in order."""
    if len(partitions) == 1:
        return [await call(partitions[0])]
    results: list[Any] = [None] * len(partitions)
    failures: list[Exception] = []

    async def one(i: int) -> None:
        try:
            results[i] = await call(partitions[i])
        except Exception as exc:  # noqa: BLE001 - raised below, alone
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        for i in range(len(partitions)):
            tg.start_soon(one, i)
    if failures:
        # The first failure as it is, not in an ExceptionGroup: callers
        # translate Redis errors into aiogroupq's (unavailable_as_error).
        raise failures[0]
    return results


async def requeue_dead(client: Client, parts: Partitions, ids: Sequence[str]) -> int:
    """Requeue dead letters, each in its own partition. A partitioned
    queue's dead letter of a group that lives in another partition now (the
    queue was repartitioned since) is requeued only while its group is still
    live in the dead letter's partition: a group never has live tasks in two
    partitions. Return how many were requeued."""
    if not parts.partitioned:
        return await _scripts.dead_action(client, parts.keys(0), "requeue", ids)
    total = 0
    for keys, mine in by_partition(parts, ids).items():
        async with client.pipeline(transaction=False) as pipe:
            for task_id in mine:
                pipe.hget(keys.task(task_id), "g")
            groups: list[Any] = await pipe.execute()
        here: list[str] = []
        elsewhere: list[str] = []
        for task_id, raw in zip(mine, groups, strict=True):
            group = None if raw is None else bytes(raw).decode(errors="replace")
            home = None if group is None else parts.layout.home(crc(group))
            (here if home in (None, keys.partition) else elsewhere).append(task_id)
        if here:
            total += await _scripts.dead_action(client, keys, "requeue", here)
        if elsewhere:
            done = await _scripts.dead_action(client, keys, "requeue_here", elsewhere)
            total += done
            if done < len(elsewhere):
                logger.warning(
                    "queue %r: %d dead letters of partition %d were not requeued: "
                    "their groups live in another partition since the queue was "
                    "repartitioned (enqueue their payloads again, then purge them)",
                    parts.queue,
                    len(elsewhere) - done,
                    keys.partition,
                )
    return total


async def dead_letter_rows(
    client: Client, parts: Partitions, limit: int
) -> list[DeadRow]:
    """The oldest *limit* dead letters over every partition."""

    async def rows(keys: QueueKeys) -> list[DeadRow]:
        return await dead_rows(client, keys, limit)

    merged = [row for part in await each_partition(parts.all(), rows) for row in part]
    merged.sort(key=lambda row: (row.dead_at_ms, row.id))
    return merged[:limit]
