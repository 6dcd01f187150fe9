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


async def leave_registry(client: Client, keys: QueueKeys, consumer: str) -> None:
    """Take *consumer* out of the registry (a clean exit: not listed as gone)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.consumers, consumer)
        pipe.delete(keys.consumer_info(consumer))
        await pipe.execute()


def pid_running(host: str | None, pid: int | None) -> bool | None:
    """Whether process *pid* of *host* runs: ``None`` when that cannot be
    told from here (another host, no pid).

    Only a consumer registered with this machine's host name is looked up:
    a pid means nothing elsewhere. A pid taken again by another process
    reads as running (the safe side: a live consumer is never called
    gone for it); a killed child its parent has not reaped yet (a zombie)
    reads as gone. A consumer in another container with the same host name
    but its own process namespace would be looked up here by mistake: give
    containers their own host names (the default).
    """
    if not host or pid is None or pid <= 0 or host != socket.gethostname():
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
