"""Partitions: how a queue's groups and tasks are spread over hash tags.

A queue created with ``partitions=K`` is K sub-queues, each a complete copy
of the single-queue layout under its own hash tag (``_store/keys.py``), so that a
Redis Cluster spreads them over its nodes while every script still touches
the keys of one partition only. Partition 0 is the queue of old: a queue of
one partition (the default) is exactly the layout it always was.

Where things go (stable and documented, docs/scaling.md):

- a group lives in partition ``crc32(group as UTF-8) % K`` (zlib's CRC-32,
  the same on every platform and Python version), so all its tasks, its line,
  its slots and its settings share one slot and one node;
- an ungrouped task goes to its dedup key's partition (``crc32(key) % K``)
  when it has one, so that producers deduplicate in the same place, else to
  the next partition of its producer's round-robin;
- a task's id names its partition: ``<28 hex digits>`` in partition 0,
  ``<28 hex digits>-<p>`` in partition p, so that ``status``, ``cancel``,
  ``result`` and the dead-letter operations go straight to it;
- the queue's metadata, its consumer registry, consumer names and
  ungrouped schedules live in partition 0.

The number of partitions is stored in each partition's ``conf`` hash (field
``parts``; absent means 1, which keeps the one-partition layout untouched).
While the queue is being repartitioned from K to K' it reads ``K>K'``; see
``_store/repartition.py`` for the protocol that keeps each group's order.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Final

from ..errors import ConfigurationError
from .keys import QueueKeys, id_partition

#: most partitions a queue may have: a Redis Cluster has 16384 slots
MAX_PARTITIONS: Final = 16384


def crc(text: str) -> int:
    """The CRC-32 of *text* as UTF-8, the hash that places groups and keys."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def in_partition(task_id: str, partition: int) -> str:
    """*task_id* (a fresh one, without a suffix) as an id of *partition*."""
    return task_id if partition == 0 else f"{task_id}-{partition}"


def base_id(task_id: str) -> str:
    """*task_id* without its partition suffix."""
    return task_id if id_partition(task_id) == 0 else task_id[:28]


def check_count(name: str, value: object) -> int:
    """A partition count given by a user: an int from 1 to 16384."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_PARTITIONS
    ):
        raise ConfigurationError(
            f"{name} must be an int from 1 to {MAX_PARTITIONS}, got {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class Layout:
    """How many partitions a queue has, and, while it is being
    repartitioned, how many it is moving to (``target``)."""

    parts: int = 1
    target: int | None = None

    @classmethod
    def parse(cls, stored: bytes | str | None) -> Layout:
        """The layout a partition's ``conf`` field ``parts`` holds.

        :raises ConfigurationError: for a value no version of aiogroupq writes
        """
        if stored is None:
            return cls()
        text = stored.decode(errors="replace") if isinstance(stored, bytes) else stored
        head, sep, tail = text.partition(">")
        try:
            parts = int(head)
            target = int(tail) if sep else None
        except ValueError:
            raise ConfigurationError(
                f"the queue's stored partition count {text!r} is not one aiogroupq "
                "writes: run 'aiogroupq check'"
            ) from None
        if not 1 <= parts <= MAX_PARTITIONS or not (
            target is None or 1 <= target <= MAX_PARTITIONS
        ):
            raise ConfigurationError(
                f"the queue's stored partition count {text!r} is out of range"
            )
        return cls(parts, target)

    def text(self) -> str:
        """The stored form (``"8"``, ``"8>12"``)."""
        return str(self.parts) if self.target is None else f"{self.parts}>{self.target}"

    @property
    def migrating(self) -> bool:
        """Whether a repartition is under way."""
        return self.target is not None

    @property
    def count(self) -> int:
        """How many partitions hold tasks: consumers claim from all of them."""
        return max(self.parts, self.target or 0)

    @property
    def new_parts(self) -> int:
        """The partition count new placements follow (the target while
        repartitioning)."""
        return self.parts if self.target is None else self.target

    def home(self, group_hash: int) -> int:
        """A group's partition once the layout is settled."""
        return group_hash % self.new_parts

    def first_try(self, group_hash: int) -> int:
        """Where an enqueue of the group goes first: its partition, or while
        repartitioning its old one, which either keeps it (its group is live
        there) or answers "moved" (then :meth:`home`)."""
        return group_hash % self.parts

    def homes(self, group_hash: int) -> tuple[int, ...]:
        """The partitions a group may live in now (two while it may be
        moving, old first)."""
        old = group_hash % self.parts
        if self.target is None:
            return (old,)
        new = group_hash % self.target
        return (old,) if old == new else (old, new)


class Partitions:
    """The partitions of one queue as a client knows them: their keys, and
    the layout it last read (see ``_store/layout.py``)."""

    __slots__ = ("_keys", "_turn", "layout", "queue")

    def __init__(self, queue: str) -> None:
        self._keys = {0: QueueKeys(queue)}
        self.queue = self._keys[0].queue
        self.layout = Layout()
        # Producers start their round-robin at different partitions.
        self._turn = random.randrange(MAX_PARTITIONS)

    def place(
        self, group: str | None, dedup_key: str | None, schedule: str | None
    ) -> int:
        """The partition a new task goes to first: its group's (while
        repartitioning, the old one), else its dedup key's, else partition 0
        for a schedule's tick (the schedule's key lives there), else the next
        one in turn."""
        layout = self.layout
        if group is not None:
            return layout.first_try(crc(group))
        if dedup_key is not None:
            return crc(dedup_key) % layout.new_parts
        if schedule is not None or layout.new_parts == 1:
            return 0
        self._turn += 1
        return self._turn % layout.new_parts

    def keys(self, partition: int = 0) -> QueueKeys:
        """The keys of *partition*."""
        keys = self._keys.get(partition)
        if keys is None:
            keys = self._keys[partition] = QueueKeys(self.queue, partition)
        return keys

    def of_id(self, task_id: str) -> QueueKeys:
        """The keys of the partition a task id names."""
        return self.keys(id_partition(task_id))

    def all(self) -> list[QueueKeys]:
        """The keys of every partition that holds tasks now."""
        return [self.keys(p) for p in range(self.layout.count)]

    def of_group(self, group: str) -> list[QueueKeys]:
        """The partitions *group* may live in now (two while it may be
        moving, its old one first)."""
        return [self.keys(p) for p in self.layout.homes(crc(group))]

    @property
    def partitioned(self) -> bool:
        """Whether enqueues must carry routing (more than one partition, or
        a repartition under way)."""
        return self.layout.parts > 1 or self.layout.migrating
