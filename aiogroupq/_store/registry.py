"""The consumer registry: which consumers are alive, where, and how busy.

Every consumer's heartbeat (``heartbeat.lua``) writes its entry: the
``consumers`` ZSET maps its name to the moment it counts as gone (its last
heartbeat plus its lease, server ms), and ``cinfo:<name>`` holds the details
below, expiring three leases after the last heartbeat. A consumer that stops
cleanly takes itself out; one that dies is listed as gone until its details
expire, and heartbeats of the others then prune its entry.

A consumer beats every :data:`BEATS_PER_LEASE`-th of its lease
(``_work/leases.py``); the views call it silent once its latest heartbeat is
:data:`LATE_BEATS` beats old.
"""

from __future__ import annotations

import functools
import os
import socket
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .connection import Client
    from .keys import QueueKeys

#: heartbeats a consumer sends per lease (``LeaseKeeper.run`` waits a third)
BEATS_PER_LEASE: Final = 3
#: a heartbeat this many intervals old is late: one missed, with room for a
#: slow call on a busy machine (the views say the consumer is silent)
LATE_BEATS: Final = 1.5

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


async def live_consumers(client: Client, keys: QueueKeys) -> list[str]:
    """The names the registry counts alive now (their gone-at is still
    ahead on the server's clock), sorted: what each consumer computes its
    share of partitions from (``_store/assignment.py``).

    Two calls: the server's clock, then the live range of the ZSET (a
    cluster pipeline has no node for a keyless command). In a cluster the
    clock is another node's, within the nodes' skew of the registry's.

    :raises redis.exceptions.RedisError: (and the other failures of
        ``REDIS_FAILURES``) if Redis fails or the key is not a ZSET
    """
    seconds, micros = await client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    names = await client.zrangebyscore(keys.consumers, now_ms, "+inf")
    return sorted(
        name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        for name in names
    )


async def leave_registry(client: Client, keys: QueueKeys, consumer: str) -> None:
    """Take *consumer* out of the registry (a clean exit: not listed as gone)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.consumers, consumer)
        pipe.delete(keys.consumer_info(consumer))
        await pipe.execute()


@functools.cache
def pid_namespace() -> str | None:
    """This process's pid namespace (``"pid:[4026531836]"``), which a
    consumer registers beside its host and pid; ``None`` where ``/proc``
    does not tell (macOS)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def pid_running(
    host: str | None, pid: int | None, namespace: str | None = None
) -> bool | None:
    """Whether process *pid* of *host* runs: ``None`` when that cannot be
    told from here (another host, another pid namespace, no pid).

    Only a consumer registered with this machine's host name, and with this
    process's pid namespace when it registered one, is looked up: a pid
    means nothing elsewhere (a container sharing the host's network, and so
    its host name, has a pid namespace of its own). A pid taken again by
    another process reads as running (the safe side: a live consumer is
    never called gone for it); a killed child its parent has not reaped yet
    (a zombie) reads as gone.
    """
    if not host or pid is None or pid <= 0 or host != socket.gethostname():
        return None
    if namespace is not None and namespace != pid_namespace():
        return None
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError, UnicodeDecodeError):
        return True  # no /proc here (macOS): it answered the signal
