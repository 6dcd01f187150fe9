"""The views of a partitioned queue: each partition's view (one read-only
script call each, sent at once), merged into the queue's."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._store.connection import node_of
from .._store.fanout import by_partition, each_partition
from .._store.partition import MAX_PARTITIONS, Partitions
from . import reads as _reads
from .views import GroupInfo, GroupPage, GroupSort, GroupState, QueueStats

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.keys import QueueKeys
    from ..task import TaskState


async def queue_stats(client: Client, parts: Partitions) -> QueueStats:
    """The queue's counts, summed over its partitions; its consumers from
    partition 0, which holds the registry."""

    async def one(keys: QueueKeys) -> QueueStats:
        return await _reads.queue_stats(client, keys)

    each = await each_partition(parts.all(), one)
    first = each[0]
    summed = {
        name: sum(getattr(s, name) for s in each)
        for name in (
            "ready",
            "parked",
            "held",
            "delayed",
            "running",
            "dead",
            "groups",
            "groups_waiting",
            "groups_halted",
            "groups_paused",
            "groups_rate_limited",
        )
    }
    oldest = [s.oldest_waiting for s in each if s.oldest_waiting is not None]
    due = [s.next_due_in for s in each if s.next_due_in is not None]
    return dataclasses.replace(
        first,
        exists=any(s.exists for s in each),
        paused=first.paused,
        oldest_waiting=max(oldest) if oldest else None,
        next_due_in=min(due) if due else None,
        totals={
            name: sum(s.totals.get(name, 0) for s in each) for name in first.totals
        },
        partitions=parts.layout.parts,
        partitions_target=parts.layout.target,
        **summed,
    )


async def group_info(client: Client, parts: Partitions, group: str) -> GroupInfo:
    """A group as seen now, in the partition it lives in (while it may be
    moving, the old one if it is live there, else the new one)."""
    if not parts.partitioned:  # the script counts the live consumers itself
        return (await _reads.group_infos(client, parts.keys(0), [group]))[0]
    alive = await _alive(client, parts)
    homes = parts.of_group(group)
    info = (await _reads.group_infos(client, homes[0], [group], alive=alive))[0]
    if len(homes) > 1 and info.state == GroupState.IDLE:
        info = (await _reads.group_infos(client, homes[1], [group], alive=alive))[0]
    return info


async def group_page(
    client: Client, parts: Partitions, sort: GroupSort, cursor: int, limit: int
) -> GroupPage:
    """One page of groups over every partition.

    ``busiest`` and ``oldest`` are merged by their order over all partitions
    (the cursor is the offset in the merged order); ``halted`` and ``paused``
    walk the partitions one after the other (the cursor holds the partition
    and its scan cursor).
    """
    alive = await _alive(client, parts)
    if sort in ("halted", "paused"):
        partition, inner = cursor % MAX_PARTITIONS, cursor // MAX_PARTITIONS
        every = parts.all()
        if partition >= len(every):
            return GroupPage((), None)
        page = await _reads.group_page(
            client, every[partition], sort, inner, limit, alive=alive
        )
        following: int | None = None
        if page.next_cursor is not None:
            following = page.next_cursor * MAX_PARTITIONS + partition
        elif partition + 1 < len(every):
            following = partition + 1
        return GroupPage(page.groups, following)
    # Each partition's first cursor + limit groups, with their scores.
    index = "backlog" if sort == "busiest" else "waiting"

    async def top(keys: QueueKeys) -> list[tuple[float, str, QueueKeys]]:
        rows: Any = await client.zrange(
            getattr(keys, index),
            0,
            cursor + limit,
            desc=sort == "busiest",
            withscores=True,
        )
        return [
            (float(score), bytes(name).decode(errors="replace"), keys)
            for name, score in rows
        ]

    rows = [row for part in await each_partition(parts.all(), top) for row in part]
    rows.sort(key=lambda r: (-r[0], r[1]) if sort == "busiest" else (r[0], r[1]))
    chosen = rows[cursor : cursor + limit]
    more = len(rows) > cursor + limit
    by_keys: dict[QueueKeys, list[str]] = {}
    for _, name, keys in chosen:
        by_keys.setdefault(keys, []).append(name)
    described: dict[tuple[int, str], GroupInfo] = {}
    for keys, names in by_keys.items():
        infos = await _reads.group_infos(client, keys, names, alive=alive)
        for name, info in zip(names, infos, strict=True):
            described[keys.partition, name] = info
    return GroupPage(
        tuple(described[keys.partition, name] for _, name, keys in chosen),
        cursor + limit if more else None,
    )


async def _alive(client: Client, parts: Partitions) -> int:
    """Live consumers of the registry (partition 0): those whose entry says
    they count as gone only after now, on its server's clock."""
    registry = parts.keys(0)
    seconds, micros = await client.time(**node_of(client, registry.consumers))
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    return int(await client.zcount(registry.consumers, now_ms, "+inf"))


async def statuses(
    client: Client, parts: Partitions, ids: Sequence[str]
) -> list[TaskState | None]:
    """:func:`_reads.statuses` over the partitions the ids name (from the
    ids alone: a layout read before a repartition would miss new ones)."""
    groups = by_partition(parts, ids)
    if len(groups) == 1:
        ((keys, mine),) = groups.items()
        return await _reads.statuses(client, keys, mine)
    found: dict[str, TaskState | None] = {}

    async def one(keys: QueueKeys) -> None:
        mine = groups[keys]
        states = await _reads.statuses(client, keys, mine)
        found.update(zip(mine, states, strict=True))

    await each_partition(list(groups), one)
    return [found[task_id] for task_id in ids]
