"""The consumer registry: which consumers are alive, where, and how busy.

Every consumer's heartbeat (``heartbeat.lua``) writes its entry: the
``consumers`` ZSET maps its name to the moment it counts as gone (its last
heartbeat plus its lease, server ms), and ``cinfo:<name>`` holds the details
below, expiring three leases after the last heartbeat. A consumer that stops
cleanly takes itself out; one that dies is listed as gone until its details
expire, and heartbeats of the others then prune its entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .connection import Client
    from .keys import QueueKeys

#: the counters of ConsumerStats a heartbeat records, in its field order
COUNTERS: Final = (
    "claimed",
    "succeeded",
    "retried",
    "dead",
    "cancelled",
    "handed_back",
    "lease_lost",
)


async def leave_registry(client: Client, keys: QueueKeys, consumer: str) -> None:
    """Take *consumer* out of the registry (a clean exit: not listed as gone)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.consumers, consumer)
        pipe.delete(keys.consumer_info(consumer))
        await pipe.execute()
