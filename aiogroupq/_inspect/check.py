"""A consistency check of one queue's Redis keys (``fsck`` for a queue).

:func:`examine` reads every key of a queue and reports each broken
invariant of the Lua scripts (see the headers of ``_lua/lib/*.lua``) as a
:class:`Problem`: it is the check's one way in, behind the public
:func:`check_queue`, ``aiogroupq check``, the repair (``_inspect/repair.py``)
and the tests, which run it after every scenario and every model step.

The reading (``_inspect/snapshot.py``) uses plain pipelines, not one atomic
snapshot (a queue may be far too large for a single ``MULTI``), so on a busy
queue a problem may be a race between two reads: run it again before you
believe it. Long lists and sets are read in slices of ``snapshot.SLICE``
entries, so that no single command holds the server for long; the cost is
O(keys + entries) time and memory.

The rules are in ``_inspect/rules.py``; the kinds of problem
(``LOST_TASK``, ``STUCK_PARK``, …) in ``_inspect/problems.py``, whose
comments say what each means.
"""

from __future__ import annotations

__all__ = ("Examination", "check_queue", "examine")

from collections.abc import Sequence
from dataclasses import dataclass

from .._store import layout as _layout
from .._store.connection import RedisLike, open_client
from .._store.failures import unavailable_as_error
from .._store.keys import QueueKeys
from .._store.partition import Partitions
from .problems import (
    Problem,
    sort_problems,
)
from .rules import find_problems, problems_across
from .snapshot import (
    DEFAULT_MAX_PAYLOAD,
    Snapshot,
    read,
)


@dataclass(frozen=True, slots=True)
class Examination:
    """What :func:`examine` read and found.

    :ivar snapshots: the keys read, one snapshot per partition examined, in
        partition order
    :ivar problems: every broken invariant, sorted by kind, group and task
    """

    snapshots: Sequence[Snapshot]
    problems: list[Problem]

    @property
    def empty(self) -> bool:
        """Whether the queue has no key at all (a misspelt name, another
        database)."""
        return all(snap.empty for snap in self.snapshots)


@unavailable_as_error
async def examine(
    redis: RedisLike,
    queue: str | QueueKeys,
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> Examination:
    """Read a queue's keys and apply every rule to them.

    :param redis: a ``redis://`` URL, or a client to borrow (bytes replies)
    :param queue: the queue's name: every partition of its layout, then the
        partitions together (a group live in two, or in the wrong one); or
        one partition's :class:`~aiogroupq._store.keys.QueueKeys`: that
        partition's keys alone, without reading the layout
    :param max_payload: the consumers' payload limit, in bytes
    :raises ConfigurationError: for a bad queue name or client
    :raises RedisUnavailableError: if Redis cannot be reached
    """
    async with open_client(redis, retry=True) as client:
        if isinstance(queue, QueueKeys):
            snap = await read(client, queue, max_payload=max_payload)
            return Examination((snap,), find_problems(snap))
        parts = Partitions(queue)
        # A damaged conf of partition 0 is one of the problems to report,
        # not a reason to stop: its layout comes from the other partitions.
        parts.layout = await _layout.read_or_recover(client, parts)
        snaps = [
            await read(client, keys, max_payload=max_payload) for keys in parts.all()
        ]
    problems = [problem for snap in snaps for problem in find_problems(snap)]
    if parts.partitioned:
        problems += problems_across(parts, snaps)
    return Examination(tuple(snaps), sort_problems(problems))


async def check_queue(
    redis: RedisLike, queue: str, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD
) -> list[Problem]:
    """Check one queue's Redis keys and return every broken invariant found.

    An empty list means the queue is consistent (or has no keys at all). The
    reads are not one atomic snapshot: on a busy queue, confirm a problem by
    checking again. A partitioned queue is checked partition by partition,
    then as a whole: each group must be live in one partition only, the one
    the layout gives it.

    :param redis: a ``redis://`` URL or a ``redis.asyncio.Redis`` client
    :param queue: the queue name
    :param max_payload_bytes: the consumers' ``max_payload_bytes``: a live
        task they would refuse as too large is reported ``oversized``
    :raises ConfigurationError: for a bad queue name or client
    :raises RedisUnavailableError: if Redis cannot be reached
    """
    return (await examine(redis, queue, max_payload=max_payload_bytes)).problems
