"""Every Redis key of a queue is built here (and mirrored in ``_lua/lib/base.lua``).

A queue is stored in one or more partitions (``partitions=K``, see
``_store/partition.py``). All keys of one partition share one hash tag, so that
every script touches a single Redis Cluster slot: partition 0 keeps the tag
``{aiogroupq:<queue>}`` that a queue has always had (a queue of one partition
is laid out exactly as before partitions existed), partition ``p >= 1`` has
``{aiogroupq:<queue>#<p>}``. ``#`` cannot occur in a queue name, so no
partition of one queue can share a tag with another queue.
"""

from __future__ import annotations

import re
from typing import Final

from ..errors import ConfigurationError

_QUEUE_NAME: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
# A task id of partition p >= 1: the 28 hex digits of new_task_id(), "-", p.
_PARTITIONED_ID: Final = re.compile(r"[0-9a-f]{28}-([1-9][0-9]{0,4})")


def id_partition(task_id: str) -> int:
    """The partition a task id names (0 for an id without a suffix)."""
    match = _PARTITIONED_ID.fullmatch(task_id)
    return 0 if match is None else int(match.group(1))


def validate_queue_name(queue: object) -> str:
    """Return *queue* if it is a usable queue name, else raise ConfigurationError."""
    if not isinstance(queue, str) or not _QUEUE_NAME.fullmatch(queue):
        raise ConfigurationError(
            f"queue name {queue!r} must be 1-128 characters of A-Z a-z 0-9 _ . : -"
        )
    return queue


def scoped_dedup(group: str, dedup_key: str) -> bytes:
    """The dedup key of *dedup_key* among the tasks of *group* (the
    ``dedup_scope="group"`` of a grouped task), as ``enqueue.lua`` and the
    task's hash (field ``u``) take it: ``\\xff<group>\\xff<key>``. A byte
    0xFF never occurs in UTF-8, so it cannot be a queue-wide key (valid UTF-8),
    nor can two groups' keys meet; it stays in the group's partition, under
    the partition's hash tag, like every key of the group."""
    return b"\xff" + group.encode("utf-8") + b"\xff" + dedup_key.encode("utf-8")


class QueueKeys:
    """The key names of one partition of a queue (partition 0 by default).

    Fixed keys are attributes; per-task, per-group and per-consumer keys are
    methods. Lua scripts receive :attr:`prefix` and build the same names (see
    ``_lua/lib/base.lua`` and ``_lua/lib/slots.lua``).
    """

    __slots__ = (
        "backlog",
        "conf",
        "consumers",
        "dead",
        "delayed",
        "fence",
        "halted",
        "leases",
        "partition",
        "paused",
        "pready",
        "prefix",
        "pseq",
        "queue",
        "ready",
        "starts",
        "stats",
        "waiting",
        "wake",
    )

    def __init__(self, queue: str, partition: int = 0) -> None:
        self.queue = validate_queue_name(queue)
        self.partition = partition
        tag = queue if partition == 0 else f"{queue}#{partition}"
        self.prefix = p = f"{{aiogroupq:{tag}}}:"
        self.ready = p + "ready"  # LIST of runnable task ids, next first
        self.delayed = p + "delayed"  # ZSET id -> due time (server ms)
        self.leases = p + "leases"  # ZSET id -> lease deadline (server ms)
        self.wake = p + "wake"  # LIST of wake tokens for blocked fetchers
        self.fence = p + "fence"  # counter: fencing tokens
        self.dead = p + "dead"  # ZSET id -> time dead-lettered (ms)
        self.conf = p + "conf"  # HASH the queue's settings
        self.stats = p + "stats"  # HASH counters kept by the scripts
        # HASH second -> starts: the rolling start counter of estimates
        # (kept by claim.lua only once conf has ``est``)
        self.starts = p + "starts"
        self.pready = p + "pready"  # ZSET runnable ids once priorities are used
        self.pseq = p + "pseq"  # STRING the score sequence of pready
        self.backlog = p + "backlog"  # ZSET group -> tasks in its line
        self.waiting = p + "waiting"  # ZSET group -> since when it has a line
        self.halted = p + "halted"  # SET groups halted behind a dead task
        self.paused = p + "paused"  # SET paused groups
        self.consumers = p + "consumers"  # ZSET consumer -> when it counts as gone

    def owns(self, task_id: str) -> bool:
        """Whether *task_id* names this partition."""
        return id_partition(task_id) == self.partition

    def task(self, task_id: str) -> str:
        """HASH holding one task's envelope and bookkeeping."""
        return f"{self.prefix}t:{task_id}"

    def group(self, group: str) -> str:
        """HASH of a group with live tasks: slot holders and counts."""
        return f"{self.prefix}grp:{group}"

    def parked(self, group: str) -> str:
        """LIST of a group's waiting task ids (its line), oldest first."""
        return f"{self.prefix}park:{group}"

    def held(self, group: str) -> str:
        """LIST of a paused or halted group's slot holders held back."""
        return f"{self.prefix}held:{group}"

    def group_conf(self, group: str) -> str:
        """HASH of a group's own settings."""
        return f"{self.prefix}gconf:{group}"

    def rate(self, group: str) -> str:
        """LIST of a rate-limited group's latest start times."""
        return f"{self.prefix}rate:{group}"

    def inflight(self, consumer: str) -> str:
        """SET of task ids a consumer holds: its recovery key."""
        return f"{self.prefix}inflight:{consumer}"

    def consumer(self, name: str) -> str:
        """STRING: the live process holding a consumer name."""
        return f"{self.prefix}consumer:{name}"

    def consumer_info(self, name: str) -> str:
        """HASH: a consumer's registration (host, pid, last heartbeat, ...)."""
        return f"{self.prefix}cinfo:{name}"

    def last_claim(self, consumer: str) -> str:
        """STRING: the nonce and task ids of a consumer's latest claim."""
        return f"{self.prefix}lastclaim:{consumer}"

    def dedup(self, dedup_key: str) -> str:
        """STRING: id of the task that holds *dedup_key* queue-wide."""
        return f"{self.prefix}dedup:{dedup_key}"

    def group_dedup(self, group: str, dedup_key: str) -> bytes:
        """STRING: id of the task that holds *dedup_key* in *group*."""
        return f"{self.prefix}dedup:".encode() + scoped_dedup(group, dedup_key)

    def done(self, task_id: str) -> str:
        """LIST of tokens pushed when a waited-for task ends."""
        return f"{self.prefix}done:{task_id}"

    def schedule(self, name: str) -> str:
        """STRING: the latest tick enqueued for a periodic schedule."""
        return f"{self.prefix}sched:{name}"

    def pattern(self, family: str = "") -> str:
        """A SCAN pattern matching every key of this partition (of one
        *family*, e.g. ``"grp:"``, if given)."""
        escaped = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix + family)
        return escaped + "*"
