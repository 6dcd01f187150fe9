"""What a consumer tells its logs and observers beyond each task's own
lines: its start-up banner, recorded outcomes, lost leases and stalls of the
event loop (which it measures with the :mod:`~aiogroupq._work.watchdog`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._store.codec import unpack
from .._telemetry.events import EventKind, Observers
from .watchdog import Watchdog, threshold_for

if TYPE_CHECKING:
    from .running import Running

logger: logging.Logger = logging.getLogger("aiogroupq.consumer")


class Telemetry:
    """One consumer's reporting: log lines, observers' events, the watchdog.

    :param observers: the consumer's observers
    :param lease_ttl: the consumer's lease, which sets the stall worth a report
    :param running: returns the consumer's held tasks (also from a thread)
    """

    def __init__(
        self,
        observers: Observers,
        *,
        lease_ttl: float,
        running: Callable[[], list[Running]],
    ) -> None:
        self.observers = observers
        self.queue = observers.queue
        self.lease_ttl = lease_ttl
        #: stalls of the event loop reported so far
        self.blocked = 0
        self.watchdog = Watchdog(
            threshold=threshold_for(lease_ttl),
            running=running,
            report=self.loop_blocked,
        )

    def banner(
        self, name: str, handlers: Sequence[str], concurrency: int, grace: float
    ) -> None:
        """Log the consumer's start (INFO): queue, handlers, concurrency, lease."""
        logger.info(
            "consumer %s claiming from queue %r: handlers %s, concurrency %d, "
            "lease_ttl %gs, grace_period %gs",
            name,
            self.queue,
            ", ".join(handlers),
            concurrency,
            self.lease_ttl,
            grace,
            extra={
                "queue": self.queue,
                "consumer": name,
                "handlers": list(handlers),
                "concurrency": concurrency,
                "lease_ttl": self.lease_ttl,
            },
        )

    def extra(self, task_id: str, running: Running | None) -> dict[str, object]:
        """The extra fields of a record about *task_id*."""
        if running is None:
            return {"queue": self.queue, "task_id": task_id}
        return running.extra(self.queue)

    def emit(
        self, kind: EventKind, running: Running | None, *, task_id: str = ""
    ) -> None:
        """Tell the observers about *running* (only *task_id* if unknown)."""
        if not self.observers:
            return
        if running is None:
            self.observers.emit(kind, task_id=task_id)
            return
        info = running.info
        self.observers.emit(
            kind,
            task_id=running.claimed.id,
            task_type=info.type if info else _task_type(running),
            group=info.group if info else None,
            attempt=running.claimed.attempt,
            duration=running.duration,
        )

    def refused(self, what: str, task_id: str, running: Running | None) -> None:
        """An outcome was refused: the lease had been lost."""
        logger.warning(
            "outcome %r of %s refused: its lease was lost (the task was "
            "recovered and may be running elsewhere)",
            what,
            f"task {task_id}" if running is None else running.describe(),
            extra=self.extra(task_id, running),
        )
        self.emit(EventKind.LEASE_LOST, running, task_id=task_id)

    def dead_elsewhere(self, ids: Sequence[str]) -> None:
        """Tasks a script dead-lettered by itself (last attempt's lease lost)."""
        if self.observers:
            for task_id in ids:
                self.observers.emit(EventKind.DEAD, task_id=task_id)

    def loop_blocked(
        self, seconds: float, culprit: Running | None, running: Sequence[Running]
    ) -> None:
        """The watchdog's report: the loop did not run for *seconds*."""
        self.blocked += 1
        late = seconds >= self.lease_ttl / 3  # a heartbeat certainly was
        consequence = (
            "heartbeats were late and leases may have expired"
            if late
            else "claims, heartbeats and the other handlers waited"
        )
        level = logging.ERROR if late else logging.WARNING
        if culprit is not None:
            logger.log(
                level,
                "event loop blocked for %.2fs by %s: %s; handlers must not "
                "block (run blocking code with anyio.to_thread.run_sync)",
                seconds,
                culprit.describe(),
                consequence,
                extra={**culprit.extra(self.queue), "blocked_seconds": seconds},
            )
        else:
            types = sorted({r.info.type for r in running if r.info is not None})
            logger.log(
                level,
                "event loop blocked for %.2fs outside the handlers (running: %s): %s",
                seconds,
                ", ".join(types) or "none",
                consequence,
                extra={"queue": self.queue, "blocked_seconds": seconds},
            )
        if self.observers:
            info = culprit.info if culprit else None
            self.observers.emit(
                EventKind.LOOP_BLOCKED,
                task_id=culprit.claimed.id if culprit else None,
                task_type=info.type if info else None,
                group=info.group if info else None,
                attempt=culprit.claimed.attempt if culprit else None,
                duration=seconds,
            )


def _task_type(running: Running) -> str | None:
    """The type of a task that never ran here (handed back unstarted)."""
    try:
        return unpack(running.claimed.envelope).type
    except Exception:  # noqa: BLE001 - any stored bytes: then unknown
        return None
