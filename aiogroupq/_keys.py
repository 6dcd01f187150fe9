"""Every Redis key of a queue is built here (and mirrored in ``_lua/_lib.lua``).

All keys of one queue share the hash tag ``{aiogroupq:<queue>}`` so that every
script touches a single Redis Cluster slot.
"""

from __future__ import annotations

import re
from typing import Final

from .errors import ConfigurationError

_QUEUE_NAME: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def validate_queue_name(queue: object) -> str:
    """Return *queue* if it is a usable queue name, else raise ConfigurationError."""
    if not isinstance(queue, str) or not _QUEUE_NAME.fullmatch(queue):
        raise ConfigurationError(
            f"queue name {queue!r} must be 1-128 characters of A-Z a-z 0-9 _ . : -"
        )
    return queue


class QueueKeys:
    """The key names of one queue.

    Fixed keys are attributes; per-task and per-group keys are methods. Lua
    scripts receive :attr:`prefix` and build the same names (see ``_lib.lua``).
    """

    __slots__ = (
        "dead",
        "delayed",
        "fence",
        "leases",
        "prefix",
        "queue",
        "ready",
        "wake",
    )

    def __init__(self, queue: str) -> None:
        self.queue = validate_queue_name(queue)
        self.prefix = f"{{aiogroupq:{queue}}}:"
        self.ready = self.prefix + "ready"  # LIST of runnable task ids, head first
        self.delayed = self.prefix + "delayed"  # ZSET id -> due time (server ms)
        self.leases = self.prefix + "leases"  # ZSET id -> lease deadline (server ms)
        self.wake = self.prefix + "wake"  # LIST of wake tokens for blocked fetchers
        self.fence = self.prefix + "fence"  # counter: fencing tokens
        self.dead = self.prefix + "dead"  # ZSET id -> time dead-lettered (ms)

    def task(self, task_id: str) -> str:
        """HASH holding one task's envelope and bookkeeping."""
        return f"{self.prefix}t:{task_id}"

    def lock(self, group: str) -> str:
        """STRING: fencing token of the running task, or ``@<id>`` for the next head."""
        return f"{self.prefix}lock:{group}"

    def parked(self, group: str) -> str:
        """LIST of a group's waiting task ids, oldest first."""
        return f"{self.prefix}park:{group}"

    def inflight(self, consumer: str) -> str:
        """SET of task ids a consumer holds: its recovery key."""
        return f"{self.prefix}inflight:{consumer}"

    def consumer(self, name: str) -> str:
        """STRING: the live process holding an explicit consumer name."""
        return f"{self.prefix}consumer:{name}"

    def last_claim(self, consumer: str) -> str:
        """STRING: the nonce and task ids of a consumer's latest claim."""
        return f"{self.prefix}lastclaim:{consumer}"

    def dedup(self, dedup_key: str) -> str:
        """STRING: id of the task that used *dedup_key* within the window."""
        return f"{self.prefix}dedup:{dedup_key}"

    def done(self, task_id: str) -> str:
        """LIST of tokens pushed when a waited-for task ends."""
        return f"{self.prefix}done:{task_id}"

    def pattern(self) -> str:
        """A SCAN pattern matching every key of this queue."""
        escaped = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix)
        return escaped + "*"
