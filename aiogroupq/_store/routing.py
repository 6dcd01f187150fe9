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
from .replies import (
    MOVED,
    GroupCorruptRefusal,
    GroupFullRefusal,
    NotReplicatedRefusal,
    StaleLayoutRefusal,
)

if TYPE_CHECKING:
    from .connection import Client
    from .held import HeldConnection

#: answers of a partition that send() handles (others are raised)
_REFUSALS: Final = (
    StaleLayoutRefusal,
    NotReplicatedRefusal,
    GroupFullRefusal,
    GroupCorruptRefusal,
)

#: rounds of "stale" answers before giving up (a repartition's steps take
#: milliseconds; this only bounds a partition left behind for good)
_STALE_ROUNDS: Final = 50

#: what one partition answered in a round: the ids, or what it raised
_Result = list[str] | Exception


async def send(
    client: Client,
    parts: Partitions,
    news: Sequence[_scripts.NewTask],
    *,
    dedup_window_ms: int,
    replication: _scripts.Replication | None = None,
    held: HeldConnection | None = None,
) -> list[str]:
    """Enqueue *news* (ids made for :meth:`Partitions.place`); return their
    ids, in order. A queue of one partition is sent on *held* where given
    (a producer's connection, ``held.py``).

    :raises GroupFullRefusal: (index into *news*) a part was refused
    :raises GroupCorruptRefusal: (index into *news*) a part was refused
    :raises NotReplicatedRefusal: every part was written on its primary, some
        not acknowledged by enough replicas (``ids``: all of *news*' ids)
    :raises RedisUnavailableError: if partitions keep answering "stale"
    """
    if not parts.partitioned:
        try:
            return await _send_one(
                client, parts, news, dedup_window_ms, replication, held
            )
        except StaleLayoutRefusal:
            await _layout.refresh(client, parts)  # partitioned since we looked
    if held is not None:
        # Sent another way from here: what the held connection still owes
        # a cancelled call is read first, so that nothing overtakes it.
        await held.settle()
    batch = _Batch(news)
    for rounds in range(_STALE_ROUNDS):
        by_part = batch.place(parts)
        results = await _send_round(
            client, parts, batch.split(by_part), dedup_window_ms, replication
        )
        stale = batch.fold(by_part, results)
        if not batch.pending:
            return batch.ids()
        # A "moved" answer to a client that knows of no move means the move
        # began after it read the layout: read it again, as for "stale".
        if stale or (batch.moved and not parts.layout.migrating):
            if rounds:
                await anyio.sleep(min(0.2, 0.01 * rounds))
            await _layout.refresh(client, parts)
    raise RedisUnavailableError(
        f"queue {parts.queue!r}: its partitions keep refusing tasks as misplaced "
        f"(layout {parts.layout.text()}); run 'aiogroupq check {parts.queue}'"
    )


async def send_held(
    client: Client,
    parts: Partitions,
    news: Sequence[_scripts.NewTask],
    *,
    dedup_window_ms: int,
    held: HeldConnection,
) -> list[str]:
    """Enqueue *news* in a queue of one partition on *held* alone.

    :raises StaleLayoutRefusal: nothing written: the queue was partitioned
        since its layout was read (:func:`send` finds where the tasks go)
    :raises GroupFullRefusal: (index into *news*) refused
    :raises GroupCorruptRefusal: (index into *news*) refused
    """
    return await _send_one(client, parts, news, dedup_window_ms, None, held)


async def _send_one(
    client: Client,
    parts: Partitions,
    news: Sequence[_scripts.NewTask],
    dedup_window_ms: int,
    replication: _scripts.Replication | None,
    held: HeldConnection | None,
) -> list[str]:
    """A queue of one partition: one call, exactly as before partitions
    existed (it raises the refusals as they come)."""
    return await resent_on_failover(
        client,
        lambda: _scripts.enqueue(
            client,
            parts.keys(0),
            news,
            dedup_window_ms=dedup_window_ms,
            replication=replication,
            held=held,
        ),
    )


class _Batch:
    """A partitioned send across its rounds: where each task is, what came
    back, what is left to send."""

    __slots__ = ("acked", "current", "moved", "out", "pending")

    def __init__(self, news: Sequence[_scripts.NewTask]) -> None:
        #: each task as last placed (its id and envelope follow its partition)
        self.current = list(news)
        #: the ids answered so far, by index into *news*
        self.out: list[str] = ["" for _ in news]
        #: indexes still to send, in order
        self.pending = list(range(len(news)))
        #: indexes answered "moved": they go to their group's new partition
        self.moved: set[int] = set()
        #: the fewest replicas any part's acknowledgement reached, when one
        #: fell short (-1: none did)
        self.acked = -1

    def place(self, parts: Partitions) -> dict[int, list[int]]:
        """The pending indexes by the partition each goes to now (a task
        that changes partition gets an id of its new one)."""
        by_part: dict[int, list[int]] = {}
        for i in self.pending:
            target = _target(parts, self.current[i], moved=i in self.moved)
            if target != id_partition(self.current[i].id):
                self.current[i] = _moved_to(self.current[i], target)
            by_part.setdefault(target, []).append(i)
        return by_part

    def split(self, by_part: dict[int, list[int]]) -> dict[int, list[_scripts.NewTask]]:
        """Each partition's part of the round, in order."""
        return {
            partition: [self.current[i] for i in indexes]
            for partition, indexes in by_part.items()
        }

    def fold(self, by_part: dict[int, list[int]], results: dict[int, _Result]) -> bool:
        """Take in a round's *results*; return whether a partition answered
        "stale". What is to be sent again is left :attr:`pending`.

        :raises GroupFullRefusal: (index into the batch) a part was refused
        :raises GroupCorruptRefusal: (index into the batch) a part was refused
        """
        stale = False
        self.pending = []
        for partition, indexes in by_part.items():
            result = results[partition]
            if isinstance(result, NotReplicatedRefusal):
                self.acked = (
                    result.acked if self.acked < 0 else min(self.acked, result.acked)
                )
                result = result.ids
            if isinstance(result, StaleLayoutRefusal):
                stale = True
                self.pending += indexes
                continue
            if isinstance(result, GroupFullRefusal):
                raise GroupFullRefusal(indexes[result.index], result.live, result.cap)
            if isinstance(result, GroupCorruptRefusal):
                raise GroupCorruptRefusal(indexes[result.index])
            assert isinstance(result, list)
            for i, task_id in zip(indexes, result, strict=True):
                if task_id == MOVED:
                    self.moved.add(i)
                    self.pending.append(i)
                else:
                    self.out[i] = task_id
        self.pending.sort()
        return stale

    def ids(self) -> list[str]:
        """The batch's ids, once none is pending.

        :raises NotReplicatedRefusal: a part's acknowledgement fell short
        """
        if self.acked >= 0:
            raise NotReplicatedRefusal(self.out, self.acked)
        return self.out


async def _send_round(
    client: Client,
    parts: Partitions,
    split: dict[int, list[_scripts.NewTask]],
    dedup_window_ms: int,
    replication: _scripts.Replication | None,
) -> dict[int, _Result]:
    """Send each partition its part, all at once; return what each
    answered, refusals included; any other failure is raised."""
    results: dict[int, _Result] = {}
    async with anyio.create_task_group() as tg:
        for partition, part in split.items():
            tg.start_soon(
                _send_part,
                client,
                parts,
                partition,
                part,
                results,
                dedup_window_ms,
                replication,
            )
    for result in results.values():
        if not isinstance(result, (list, *_REFUSALS)):
            raise result  # the first failure, not an ExceptionGroup
    return results


async def _send_part(
    client: Client,
    parts: Partitions,
    partition: int,
    part: list[_scripts.NewTask],
    results: dict[int, _Result],
    dedup_window_ms: int,
    replication: _scripts.Replication | None,
) -> None:
    try:
        results[partition] = await resent_on_failover(
            client,
            lambda: _scripts.enqueue(
                client,
                parts.keys(partition),
                part,
                dedup_window_ms=dedup_window_ms,
                routing=_scripts.Routing(partition, [_hash(t) for t in part]),
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
