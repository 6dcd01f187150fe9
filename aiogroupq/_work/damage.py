"""A running consumer's answer to a damaged queue-level key (``ready`` or
``conf`` holding a string, say): every script that would write through the
key refuses before writing (:class:`~aiogroupq.CorruptQueueError`), and the
consumer waits for ``aiogroupq check --repair`` instead of exiting.

Each of the consumer's loops (a partition's fetcher, the finisher's call for
a partition, the heartbeat of a partition, the layout poll) reports a
refusal here and tries again every :data:`PROBE` seconds: claims stop,
outcomes stay queued, leases go on being renewed (the heartbeat reads only
``leases``). :class:`DamageWatch` logs one ERROR naming the key and the
repair, then at most one a minute per key, and one line when the key works
again.

Damage to ``leases`` costs more: while it lasts no lease can be extended,
and the repair puts each running task back with an expired lease, since it
cannot tell a live holder from a dead one. So once this consumer has met
``leases`` damaged, it neither claims nor records an outcome until one
heartbeat has set its leases again (``heartbeat.lua``'s restore), which
takes back every task that nobody recovered meanwhile; its fetchers would
otherwise recover them first, and its outcomes be refused as late. Its
fetchers wait :data:`SETTLE` seconds more, so that the other consumers
probing the key get to set their own leases again before a claim of this
one recovers them.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Final

import anyio

if TYPE_CHECKING:
    from ..errors import CorruptQueueError

logger = logging.getLogger("aiogroupq.consumer")  # the consumer's own lines

#: seconds between two tries of a refused call while a key is damaged
PROBE: Final = 0.5
#: seconds between two ERROR lines about one damaged key
LOG_EVERY: Final = 60.0
#: seconds claims wait after this consumer's leases were set again: two
#: probes of every other consumer that met the damage
SETTLE: Final = 2 * PROBE


class DamageWatch:
    """What one consumer run knows of the queue's damaged keys.

    :param queue: the queue's name, for the log lines
    """

    def __init__(self, queue: str) -> None:
        self.queue = queue
        # Which damaged key each refused loop met ("fetch:0" -> key).
        self._refused: dict[str, str] = {}
        # When each damaged key was last logged.
        self._logged: dict[str, float] = {}
        # Leases keys met damaged, whose leases a heartbeat must set again.
        self._restore: set[str] = set()
        self._restore_wanted = anyio.Event()
        self._settle_until = 0.0

    @property
    def damaged(self) -> bool:
        """Whether some loop found a key damaged at its latest try."""
        return bool(self._refused)

    @property
    def restoring(self) -> bool:
        """Whether some of this consumer's leases wait to be set again."""
        return bool(self._restore)

    def holds_claims(self) -> bool:
        """Whether claims must wait: leases wait to be set again, or were
        set again less than :data:`SETTLE` seconds ago."""
        if self._restore:
            return True
        if not self._settle_until:
            return False
        if time.monotonic() < self._settle_until:
            return True
        self._settle_until = 0.0
        return False

    def damaged_keys(self) -> frozenset[str]:
        """The keys some loop found damaged at its latest try."""
        return frozenset(self._refused.values())

    def restore_keys(self) -> frozenset[str]:
        """The leases keys whose leases wait to be set again."""
        return frozenset(self._restore)

    def refused(self, who: str, error: CorruptQueueError, *, leases: str) -> None:
        """The loop *who* was refused for *error*'s key; *leases* is the
        leases key of the partition it called."""
        key = error.key
        self._refused[who] = key
        if key == leases and key not in self._restore:
            self._restore.add(key)
            self._restore_wanted.set()
        now = time.monotonic()
        last = self._logged.get(key)
        if last is not None and now - last < LOG_EVERY:
            return
        self._logged[key] = now
        # The error names the key and the repair ('aiogroupq check --repair').
        logger.error(
            "queue %r: %s. Meanwhile this consumer claims nothing and keeps "
            "its tasks' outcomes; it resumes by itself once the key is repaired",
            self.queue,
            error,
        )

    def succeeded(self, who: str) -> None:
        """The loop *who*'s call went through (cheap: one dict lookup)."""
        if not self._refused:
            return
        key = self._refused.pop(who, None)
        if key is None or key in self._refused.values():
            return
        self._logged.pop(key, None)
        logger.warning(
            "queue %r: key %s works again; this consumer resumes", self.queue, key
        )

    def restored(self, leases: str) -> None:
        """A heartbeat set this consumer's leases in *leases* again."""
        self._restore.discard(leases)
        if not self._restore:
            self._restore_wanted = anyio.Event()
            self._settle_until = time.monotonic() + SETTLE
            logger.warning(
                "queue %r: this consumer's leases are set again after the damage to %s",
                self.queue,
                leases,
            )

    async def wait_restore_wanted(self) -> None:
        """Return once some leases wait to be set again."""
        await self._restore_wanted.wait()
