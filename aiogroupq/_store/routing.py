"""Sending new tasks to their partitions (``enqueue.lua`` once per partition).

A queue of one partition gets one call, exactly as before partitions existed.
A partitioned queue's batch is split by partition, order kept within each
part (so within each group), and the parts are sent at once: each part is
atomic, the batch as a whole is not. Two answers send a task again:

- ``stale``: a partition holds a newer layout than this client's (a
  repartition began or ended): read the layout again and place the task anew;
- ``moved`` (">"): while repartitioning, the task's group is no longer live in
  its old partition: it goes to its new one. Asking the old partition first
  is what keeps a group's order across the move.

A task placed in another partition than its id says gets an id of that
partition (same first 28 digits), and its envelope is packed again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import anyio
import msgspec

from ..errors import RedisUnavailableError
from . import layout as _layout, scripts as _scripts
from .codec import pack, unpack
from .connection import resent_on_failover
from .keys import id_partition
from .partition import Partitions, base_id, crc, in_partition

if TYPE_CHECKING:
    from .connection import Client

#: answers of a partition that send() handles (others are raised)
_REFUSALS: Final = (
    _scripts.StaleLayoutRefusal,
    _scripts.NotReplicatedRefusal,
    _scripts.GroupFullRefusal,
    _scripts.GroupCorruptRefusal,
)

#: rounds of "stale" answers before giving up (a repartition's steps take
#: milliseconds; this only bounds a partition left behind for good)
_STALE_ROUNDS: Final = 50


async def send(
    client: Client,
    parts: Partitions,
    news: Sequence[_scripts.NewTask],
    *,
    dedup_window_ms: int,
    replication: _scripts.Replication | None = None,
) -> list[str]:
    """Enqueue *news* (ids made for :meth:`Partitions.place`); return their
    ids, in order.

    :raises GroupFullRefusal: (index into *news*) a part was refused
    :raises GroupCorruptRefusal: (index into *news*) a part was refused
    :raises NotReplicatedRefusal: every part was written on its primary, some
        not acknowledged by enough replicas (``ids``: all of *news*' ids)
    :raises RedisUnavailableError: if partitions keep answering "stale"
    """
    if not parts.partitioned:
        try:
            return await resent_on_failover(
                client,
                lambda: _scripts.enqueue(
                    client,
                    parts.keys(0),
                    news,
                    dedup_window_ms=dedup_window_ms,
                    replication=replication,
                ),
            )
        except _scripts.StaleLayoutRefusal:
            await _layout.refresh(client, parts)  # partitioned since we looked
    out: list[str] = ["" for _ in news]
    current = list(news)
    pending = list(range(len(news)))
    moved: set[int] = set()
    acked = -1
    for rounds in range(_STALE_ROUNDS):
        stale = False
        by_part: dict[int, list[int]] = {}
        for i in pending:
            target = _target(parts, current[i], moved=i in moved)
            if target != id_partition(current[i].id):
                current[i] = _moved_to(current[i], target)
            by_part.setdefault(target, []).append(i)
        results: dict[int, list[str] | Exception] = {}
        async with anyio.create_task_group() as tg:
            for partition, indexes in by_part.items():
                tg.start_soon(
                    _send_part,
                    client,
                    parts,
                    partition,
                    [current[i] for i in indexes],
                    results,
                    dedup_window_ms,
                    replication,
                )
        pending = []
        for result in results.values():
            if not isinstance(result, (list, *_REFUSALS)):
                raise result  # the first failure, not an ExceptionGroup
        for partition, indexes in by_part.items():
            result = results[partition]
            if isinstance(result, _scripts.NotReplicatedRefusal):
                acked = result.acked if acked < 0 else min(acked, result.acked)
                result = result.ids
            if isinstance(result, _scripts.StaleLayoutRefusal):
                stale = True
                pending += indexes
                continue
            if isinstance(result, _scripts.GroupFullRefusal):
                raise _scripts.GroupFullRefusal(
                    indexes[result.index], result.live, result.cap
                )
            if isinstance(result, _scripts.GroupCorruptRefusal):
                raise _scripts.GroupCorruptRefusal(indexes[result.index])
            assert isinstance(result, list)
            for i, task_id in zip(indexes, result, strict=True):
                if task_id == _scripts.MOVED:
                    moved.add(i)
                    pending.append(i)
                else:
                    out[i] = task_id
        if not pending:
            if acked >= 0:
                raise _scripts.NotReplicatedRefusal(out, acked)
            return out
        pending.sort()
        # A "moved" answer to a client that knows of no move means the move
        # began after it read the layout: read it again, as for "stale".
        if stale or (moved and not parts.layout.migrating):
            if rounds:
                await anyio.sleep(min(0.2, 0.01 * rounds))
            await _layout.refresh(client, parts)
    raise RedisUnavailableError(
        f"queue {parts.queue!r}: its partitions keep refusing tasks as misplaced "
        f"(layout {parts.layout.text()}); run 'aiogroupq check {parts.queue}'"
    )


async def _send_part(
    client: Client,
    parts: Partitions,
    partition: int,
    batch: list[_scripts.NewTask],
    results: dict[int, list[str] | Exception],
    dedup_window_ms: int,
    replication: _scripts.Replication | None,
) -> None:
    try:
        results[partition] = await resent_on_failover(
            client,
            lambda: _scripts.enqueue(
                client,
                parts.keys(partition),
                batch,
                dedup_window_ms=dedup_window_ms,
                routing=_scripts.Routing(partition, [_hash(t) for t in batch]),
                replication=replication,
            ),
        )
    except Exception as exc:  # noqa: BLE001 - raised by send(), not in a group
        results[partition] = exc


def _hash(task: _scripts.NewTask) -> int | None:
    return None if task.group is None else crc(task.group)


def _target(parts: Partitions, task: _scripts.NewTask, *, moved: bool) -> int:
    if task.group is not None:
        h = crc(task.group)
        return parts.layout.home(h) if moved else parts.layout.first_try(h)
    if task.dedup_key is not None or task.schedule is not None:
        return parts.place(None, task.dedup_key, task.schedule)
    now = id_partition(task.id)
    if now < parts.layout.new_parts:
        return now  # ungrouped: anywhere the layout takes new tasks
    return parts.place(None, None, None)


def _moved_to(task: _scripts.NewTask, partition: int) -> _scripts.NewTask:
    task_id = in_partition(base_id(task.id), partition)
    envelope = msgspec.structs.replace(unpack(task.envelope), id=task_id)
    return dataclasses.replace(task, id=task_id, envelope=pack(envelope))
