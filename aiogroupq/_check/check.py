"""A consistency check of one queue's Redis keys (``fsck`` for a queue).

:func:`examine` reads every key of a queue and reports each broken
invariant of the Lua scripts (see the headers of ``_lua/lib/*.lua``) as a
:class:`Problem`: it is the check's one way in, behind the public
:func:`check_queue`, ``aiogroupq check``, the repair (``_check/repair.py``)
and the tests, which run it after every scenario and every model step.

The reading (``_check/snapshot.py``) uses plain pipelines, not one atomic
snapshot (a queue may be far too large for a single ``MULTI``), so on a busy
queue a problem may be a race between two reads. Each problem found is
therefore read again, with the keys it involves read together
(``_check/confirm.py``), and reported only if it is still there: a busy,
healthy queue checks clean. Long lists and sets are read in slices of
``snapshot.SLICE`` entries, so that no single command holds the server for
long; the cost is O(keys + entries) time and memory.

The rules are in ``_check/rules.py``; the kinds of problem
(``LOST_TASK``, ``STUCK_PARK``, …) in ``_check/problems.py``, whose
comments say what each means.
"""

from __future__ import annotations

__all__ = ("Examination", "check_queue", "examine", "similar_queues")

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .._limits import DEFAULT_MAX_PAYLOAD_BYTES
from .._store import layout as _layout
from .._store.connection import RedisLike, open_client
from .._store.failures import unavailable_as_error
from .._store.keys import QueueKeys
from .._store.partition import Partitions
from .confirm import confirm
from .problems import (
    Problem,
    sort_problems,
)
from .rules import find_problems, problems_across
from .snapshot import Snapshot, read

if TYPE_CHECKING:
    from .._store.connection import Client


@dataclass(frozen=True, slots=True)
class Examination:
    """What :func:`examine` read and found.

    :ivar snapshots: the keys read, one snapshot per partition examined, in
        partition order
    :ivar problems: every broken invariant, sorted by kind, group and task:
        each one seen in the first reading and again when its keys were
        read together
    :ivar unsure: stats gauges (counts of the whole partition) that differ
        from what was counted in a reading the queue moved during: neither
        right nor wrong until the queue is read at rest
    """

    snapshots: Sequence[Snapshot]
    problems: list[Problem]
    unsure: list[Problem] = field(default_factory=list)

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
    max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
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
            snap, problems, unsure = await _examine_one(client, queue, max_payload)
            return Examination((snap,), problems, unsure)
        parts = Partitions(queue)
        # A damaged conf of partition 0 is one of the problems to report,
        # not a reason to stop: its layout comes from the other partitions.
        parts.layout = await _layout.read_or_recover(client, parts)
        snaps, problems, unsure = [], [], []
        for keys in parts.all():
            snap, found, doubtful = await _examine_one(client, keys, max_payload)
            snaps.append(snap)
            problems += found
            unsure += doubtful
    if parts.partitioned:
        problems += problems_across(parts, snaps)
    return Examination(tuple(snaps), sort_problems(problems), sort_problems(unsure))


async def _examine_one(
    client: Client, keys: QueueKeys, max_payload: int
) -> tuple[Snapshot, list[Problem], list[Problem]]:
    """One partition: read, judge, and confirm what was found by reading
    its keys again (``_check/confirm.py``)."""
    before = await _activity(client, keys)
    snap = await read(client, keys, max_payload=max_payload)
    problems = find_problems(snap)
    if not problems:
        return snap, [], []
    quiet = before == await _activity(client, keys)
    done = await confirm(client, snap, problems, quiet=quiet, judge=find_problems)
    return done.snapshot, sort_problems(done.problems), sort_problems(done.unsure)


async def _activity(client: Client, keys: QueueKeys) -> Any:
    """The stats hash: any enqueue, start, end or group change moves it."""
    try:
        return await client.hgetall(keys.stats)
    except ResponseError:  # a damaged stats key: reported as a wrong type
        return None


#: keys a search for similar queue names looks at, at most (SCAN steps of
#: 1,000): the search stays short on a large database
_NAMES_SCANNED: Final = 100_000
#: the key every queue has once anything was enqueued
_STATS_SUFFIX: Final = "}:stats"


@unavailable_as_error
async def similar_queues(redis: RedisLike, queue: str, *, most: int = 3) -> list[str]:
    """The names of existing queues closest to *queue*, closest first (for
    "did you mean": a queue with no keys is most often a misspelt name).

    Looks at most at :data:`_NAMES_SCANNED` keys of the database.

    :raises RedisUnavailableError: if Redis cannot be reached
    """
    names: set[str] = set()
    async with open_client(redis, retry=True) as client:
        for raw in await _scan_bounded(client, "{aiogroupq:*" + _STATS_SUFFIX):
            key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            tag = key.removeprefix("{aiogroupq:").removesuffix(_STATS_SUFFIX)
            names.add(tag.partition("#")[0])  # a partition's tag: name#n
    names.discard(queue)
    return difflib.get_close_matches(queue, sorted(names), n=most, cutoff=0.6)


async def _scan_bounded(client: Client, match: str) -> list[Any]:
    """Keys matching *match* among the first :data:`_NAMES_SCANNED` keys a
    SCAN walks (a cluster's nodes: until as many keys matched)."""
    if isinstance(client, Redis):
        found: list[Any] = []
        cursor = 0
        for _ in range(_NAMES_SCANNED // 1000):
            cursor, keys = await client.scan(cursor, match=match, count=1000)
            found += keys
            if not cursor:
                break
        return found
    found = []
    async for key in client.scan_iter(match=match, count=1000):
        found.append(key)
        if len(found) >= _NAMES_SCANNED // 1000:
            break
    return found


async def check_queue(
    redis: RedisLike, queue: str, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
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
