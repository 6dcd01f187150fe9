"""A consumer's share of the queue's partitions, followed as the fleet
changes.

Every :data:`~.._store.registry.BEATS_PER_LEASE`-th of its lease the
consumer reads the registry's live names (``live_consumers``) and computes
its share with ``_store/assignment.py``, the same function every other
consumer runs on the same names: no coordinator and no barrier. Its own name
always counts (it is alive); a registry it cannot read keeps the share it
has, and before the first reading it serves every partition.

Which consumer serves a partition never decides what is safe: a claim is
atomic per partition, so two consumers serving one for a moment (each
reading the registry at its own time) is harmless.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Final

import anyio
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from .._store.assignment import share_of, share_text
from .._store.connection import REDIS_FAILURES
from .._store.registry import BEATS_PER_LEASE, live_consumers

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.keys import QueueKeys

logger = logging.getLogger("aiogroupq.consumer")

#: fleets larger than this compute their assignment off the event loop
_BIG_FLEET: Final = 500


class Share:
    """What one consumer serves, as last computed.

    :param name: the consumer's name
    :param replicas: consumers per partition (``partition_replicas``)
    :param lease_ttl: the consumer's lease; the registry is read every
        third of it
    """

    def __init__(self, name: str, replicas: int, lease_ttl: float) -> None:
        self.name = name
        self.replicas = replicas
        self.every = lease_ttl / BEATS_PER_LEASE
        #: the live names last read (``None``: not read yet: serve everything)
        self.live: tuple[str, ...] | None = None
        #: the partitions its fetchers claim from now, for the registry
        #: (``None`` until they started)
        self.serving: frozenset[int] | None = None
        self._memo: tuple[int, tuple[str, ...], frozenset[int]] | None = None
        self._changed = anyio.Event()

    async def wait_changed(self) -> None:
        """Return once what the fetchers serve changed (then the heartbeat
        registers it)."""
        await self._changed.wait()

    async def read(self, client: Client, keys: QueueKeys) -> bool:
        """Read the registry's live names; whether they changed. A failure
        (Redis, or a damaged registry key) keeps the names we have."""
        try:
            names = await live_consumers(client, keys)
        except REDIS_FAILURES as exc:
            logger.debug("could not read the consumer registry: %s", exc)
            return False
        live = tuple(sorted({*names, self.name}))
        changed = live != self.live
        self.live = live
        return changed

    async def of(self, count: int) -> frozenset[int]:
        """The partitions of ``0..count-1`` this consumer serves now."""
        if self.live is None:
            return frozenset(range(count))
        memo = self._memo
        if memo is not None and memo[:2] == (count, self.live):
            return memo[2]
        live = self.live
        if len(live) > _BIG_FLEET:
            # A second or so of hashing and sorting: not on the event loop.
            share = await anyio.to_thread.run_sync(
                share_of, count, live, self.replicas, self.name
            )
        else:
            share = share_of(count, live, self.replicas, self.name)
        self._memo = (count, live, share)
        return share

    def record(self, serving: frozenset[int], count: int) -> None:
        """Record what the fetchers serve of *count* partitions (the
        registry shows it); say so when it changed, and warn when it is
        nothing."""
        if serving == self.serving:
            return
        self.serving = serving
        self._changed.set()
        self._changed = anyio.Event()
        if serving or self.live is None:
            logger.info(
                "consumer %s serves partitions %s of %d (%d live consumers)",
                self.name,
                self.text() or "-",
                count,
                len(self.live or ()),
            )
            return
        logger.warning(
            "consumer %s serves no partition: %d partitions x %d consumers "
            "each leave nothing for %d live consumers; it stands by, and "
            "takes over a share when another consumer stops (raise the "
            "queue's partitions or partition_replicas to use it)",
            self.name,
            count,
            self.replicas,
            len(self.live),
        )

    def text(self) -> str | None:
        """What the registry says it serves (``"0-3,8"``), ``None`` before
        its fetchers started."""
        return None if self.serving is None else share_text(self.serving)


async def trim_idle(client: Client) -> None:
    """Close the client's idle connections, after a share shrank: a pool
    keeps every connection it ever opened, so the blocking pops of
    partitions no longer served would hold theirs for good. What is in use
    stays; a later call opens what it needs again."""
    with contextlib.suppress(*REDIS_FAILURES):
        if isinstance(client, Redis):
            await client.connection_pool.disconnect(inuse_connections=False)
        elif isinstance(client, RedisCluster):
            for node in client.get_nodes():
                # A cluster node's pool hands its free connections out in
                # turn, so one closed in place would soon be opened again:
                # take them out of the pool (redis-py has no call for it).
                free = getattr(node, "_free", None)
                every = getattr(node, "_connections", None)
                if free is None or every is None:
                    continue
                while free:
                    connection = free.pop()
                    with contextlib.suppress(ValueError):
                        every.remove(connection)
                    await connection.disconnect()
