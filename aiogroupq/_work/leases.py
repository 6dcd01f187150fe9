"""Lease renewal: what a consumer holds on the server, kept alive while it runs.

Every third of ``lease_ttl`` the :class:`LeaseKeeper` renews the hold on the
consumer's name, its registry entry and the lease of every task it runs, one
``heartbeat.lua`` call per partition holding leases; then it tells each
running task what the server answered: lease extended, lease lost, or
cancellation requested. A renewal that fails changes nothing: each handler
stops by itself at its local lease deadline. As the consumer stops,
:meth:`LeaseKeeper.release` lets go of what it still holds.

A heartbeat refused for a damaged ``leases`` key is a renewal that failed;
once the key works again, one heartbeat sets the consumer's leases again
(``damage.py`` says why), tried every :data:`~.damage.PROBE` seconds until
then.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from .._store import scripts as _scripts
from .._store.connection import REDIS_FAILURES
from .._store.fanout import each_partition
from .._store.registry import leave_registry, pid_namespace
from .._store.replies import HEARTBEAT_CODES, HeartbeatCode, NotReplicatedRefusal
from ..errors import CorruptQueueError
from .damage import PROBE, DamageWatch
from .identity import Identity

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from .._store.connection import Client
    from .._store.keys import QueueKeys
    from .._store.partition import Partitions
    from .outcomes import Counters
    from .running import Running
    from .share import Share

logger = logging.getLogger("aiogroupq.consumer")  # the consumer's own lines


def local_lease(lease_ttl: float) -> float:
    """Seconds a claim or heartbeat keeps a handler running: a little less
    than the lease, so that it stops before the server recovers the task."""
    return lease_ttl - min(1.0, lease_ttl * 0.1)


class LeaseKeeper:
    """One consumer's hold on its name, its registry entry and its tasks.

    :param parts: the queue's partitions (partition 0 holds the registry)
    :param name: the consumer's name
    :param host: the host the registry lists it on
    :param concurrency: its handler slots, for the registry
    :param lease_ttl: seconds a silent consumer keeps its tasks
    :param retention_ms: how long finished tasks stay readable
    :param replication: wait for replicas before a lease counts as extended
    :param running: the consumer's held tasks, whose leases are renewed
    :param counters: the consumer's counters, for the registry
    """

    def __init__(
        self,
        parts: Partitions,
        *,
        name: str,
        host: str,
        concurrency: int,
        lease_ttl: float,
        retention_ms: int,
        replication: _scripts.Replication | None,
        running: dict[str, Running],
        counters: Counters,
    ) -> None:
        self._parts = parts
        self._keys = parts.keys(0)
        self._name = name
        self._host = host
        self._concurrency = concurrency
        self._lease_ttl = lease_ttl
        self._retention_ms = retention_ms
        self._replication = replication
        self._running = running
        self._counters = counters
        # This run of the consumer, told apart from an earlier run of its
        # name in the same host and pid (a container restarted as pid 1, a
        # Consumer entered again): heartbeat.lua starts its uptime anew.
        self._incarnation = secrets.token_hex(8)
        # Every name is held while its consumer runs, a generated one too:
        # else a consumer named (by mistake or malice) like a live one would
        # take over its running tasks at start, and a group would run twice.
        self.identity = Identity(self._keys, name, lease_ttl)
        #: the run's damaged keys (the consumer gives each run its own)
        self.watch = DamageWatch(self._keys.queue)
        #: the consumer's share of the partitions, registered with each
        #: heartbeat (field ``parts``) once its fetchers started
        self.share: Share | None = None

    async def run(self, client: Client) -> None:
        """Send a heartbeat every third of the lease, until cancelled, and
        one when the share changed; while leases wait to be set again, every
        :data:`~.damage.PROBE` seconds."""
        while True:
            if self.watch.restoring:
                await anyio.sleep(PROBE)
            else:
                with anyio.move_on_after(self._lease_ttl / 3):
                    await self._beat_wanted()
            await self.heartbeat(client)

    async def _beat_wanted(self) -> None:
        """Return once leases wait to be set again, or the share changed
        (the registry shows it at once, not a third of a lease later)."""
        share = self.share
        if share is None:
            await self.watch.wait_restore_wanted()
            return
        async with anyio.create_task_group() as tg:

            async def first(wait: Callable[[], Awaitable[None]]) -> None:
                await wait()
                tg.cancel_scope.cancel()

            tg.start_soon(first, self.watch.wait_restore_wanted)
            tg.start_soon(first, share.wait_changed)

    async def heartbeat(self, client: Client, *, starting: bool = False) -> None:
        """Renew the name, the registry entry and every running task's lease.

        :param starting: the consumer's first: a damaged ``leases`` key
            raises :class:`~aiogroupq.CorruptQueueError`
        """
        with contextlib.suppress(*REDIS_FAILURES):
            await self.identity.renew(client)
        snapshot = list(self._running.values())
        # One call per partition holding leases; partition 0 (the registry's)
        # always, to keep this consumer registered; and every partition whose
        # leases wait to be set again, though it holds none now.
        mine: dict[QueueKeys, list[Running]] = {self._keys: []}
        for running in snapshot:
            mine.setdefault(self._parts.of_id(running.claimed.id), []).append(running)
        if self.watch.restoring:
            restore = self.watch.restore_keys()
            for keys in self._parts.all():
                if keys.leases in restore:
                    mine.setdefault(keys, [])

        async def renew(keys: QueueKeys) -> None:
            await self._renew(client, keys, mine[keys], len(snapshot), starting)

        await each_partition(list(mine), renew)

    async def release(self, client: Client) -> None:
        """Let go of what the consumer still holds as it stops (best effort):
        tasks claimed but never seen, its name, its registry entry."""

        # A claim cancelled after the server ran it left tasks we never saw in
        # our recovery key: give them back now, not at lease expiry.
        async def recover(keys: QueueKeys) -> int:
            with contextlib.suppress(*REDIS_FAILURES, CorruptQueueError):
                given_back, _ = await _scripts.recover(
                    client,
                    keys,
                    self._name,
                    counted=False,
                    retention_ms=self._retention_ms,
                    keep=[i for i in self._running if keys.owns(i)],
                )
                return given_back
            return 0

        given_back = sum(await each_partition(self._parts.all(), recover))
        if given_back:
            logger.info("gave back %d tasks claimed while stopping", given_back)
        with contextlib.suppress(*REDIS_FAILURES):
            await self.identity.release(client)
        # A clean exit: out of the registry rather than listed as gone.
        with contextlib.suppress(*REDIS_FAILURES):
            await leave_registry(client, self._keys, self._name)

    def _registration(self, in_flight: int) -> list[tuple[str, EncodableT]]:
        fields: list[tuple[str, EncodableT]] = [
            ("host", self._host),
            ("pid", os.getpid()),
            ("ns", pid_namespace() or ""),
            ("i", self._incarnation),
            ("c", self._concurrency),
            ("n", in_flight),
            *self._counters.items(),
        ]
        if self.share is not None and (parts := self.share.text()) is not None:
            fields.append(("parts", parts))
        return fields

    async def _renew(
        self,
        client: Client,
        keys: QueueKeys,
        snapshot: list[Running],
        total: int,
        starting: bool,
    ) -> None:
        sent_at = anyio.current_time()
        registry = keys.partition == 0
        extended = True
        watch, who = self.watch, f"heartbeat:{keys.partition}"
        restore = watch.restoring and keys.leases in watch.restore_keys()
        alive: Sequence[HeartbeatCode]  # one per lease
        try:
            alive = await _scripts.heartbeat(
                client,
                keys,
                [(r.claimed.id, r.claimed.token) for r in snapshot],
                lease_ms=round(self._lease_ttl * 1000),
                consumer=self._name if registry else None,
                registration=self._registration(total) if registry else (),
                replication=self._replication,
                restore=restore,
            )
        except CorruptQueueError as exc:
            # Refused before writing: as a renewal that failed, each handler
            # stops by itself at its local lease deadline.
            if starting:
                raise
            watch.refused(who, exc, leases=keys.leases)
            return
        except NotReplicatedRefusal as refusal:
            # The server's answers stand (a lost lease is lost), but a
            # failover now could take the extension back: keep the deadlines.
            logger.warning("no replica acknowledged a heartbeat in time")
            alive = [HEARTBEAT_CODES[int(code)] for code in refusal.ids]
            extended = False
        except REDIS_FAILURES as exc:
            # Each handler stops by itself at its local lease deadline.
            logger.warning("heartbeat failed (%s)", exc)
            return
        watch.succeeded(who)
        if restore and extended:
            watch.restored(keys.leases)
        deadline = sent_at + local_lease(self._lease_ttl)
        for running, code in zip(snapshot, alive, strict=True):
            if self._running.get(running.claimed.id) is not running:
                continue  # finished while the heartbeat was in flight
            if code is HeartbeatCode.LOST:
                running.mark_lost()
                continue
            if extended:
                running.extend(deadline)
            if code is HeartbeatCode.CANCEL_REQUESTED:
                running.request_cancel()
