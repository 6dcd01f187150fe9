"""A task this consumer holds, from claim until its outcome is recorded:
its lease deadline and the one timer that stops its handler, the flags the
heartbeat sets (lost, cancellation asked), and a batch's head and members.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

from .._store.scripts import Claimed, Outcome
from .._telemetry.log import describe, task_extra

if TYPE_CHECKING:
    from ..task import TaskInfo

__all__ = ("Running", "StoppedBy")

#: what stopped a handler: its lease (lost, cancelled on request, or past
#: the local lease deadline) or its timeout
StoppedBy = Literal["lease", "timeout"]


class Running:
    """A task this consumer holds, from claim until its outcome is recorded.

    The heartbeat tells it what the server answered through :meth:`extend`,
    :meth:`mark_lost` and :meth:`request_cancel`; the runner reads the flags
    once the handler ended.

    :param claimed: what the claim returned
    :param deadline: the local lease deadline (the event loop's clock): a
        handler still running then is stopped, so a consumer that cannot
        renew its leases stops by itself
    :param start_by: a task of a group starts before this (the event loop's
        clock) or not at all: its claim's start window (START_WINDOW)
    """

    # One timer per running handler, plain asyncio: an anyio cancel scope
    # for the lease and another for the timeout cost several times more per
    # task, and a consumer runs thousands of tasks a second.
    __slots__ = (
        "__weakref__",
        "_handle",
        "_task",
        "_until",
        "_when",
        "cancel_requested",
        "claimed",
        "deadline",
        "duration",
        "frame",
        "head",
        "info",
        "lost",
        "members",
        "settled",
        "start_by",
        "stopped_by",
    )

    def __init__(
        self,
        claimed: Claimed,
        *,
        deadline: float = math.inf,
        start_by: float = math.inf,
    ) -> None:
        self.claimed = claimed
        self.deadline = deadline
        self.start_by = start_by
        self.lost = False
        self.cancel_requested = False
        # What the handler sees, once the envelope decoded (for logs and events).
        self.info: TaskInfo | None = None
        # The frame that awaits the handler, while it runs: the watchdog looks
        # for it on a stalled loop's stack.
        self.frame: FrameType | None = None
        # Seconds the handler ran, once it ended.
        self.duration: float | None = None
        #: what stopped the handler: "lease" (lost, cancelled on request or
        #: past the local lease deadline) or "timeout"; None while it runs
        #: or when it ended by itself
        self.stopped_by: StoppedBy | None = None
        # While the handler runs: its task, the end of its timeout, and the
        # timer that stops it at the earlier of that and the lease deadline.
        self._task: asyncio.Task[Any] | None = None
        self._until = math.inf
        self._handle: asyncio.Handle | None = None
        self._when = math.inf
        #: a batch's head: its members, in order (they run in its handler);
        #: a tuple, so that a task of no batch allocates nothing for it
        self.members: Sequence[Running] = ()
        #: a batch's member: its head, whose handler runs it
        self.head: Running | None = None
        #: a member's outcome was submitted (or will never be: lease lost)
        self.settled = False

    def extend(self, deadline: float) -> None:
        """Move the local lease deadline: a renewal holds the lease until then."""
        self.deadline = deadline
        # A later deadline is seen when the timer fires (no re-arming per
        # heartbeat); an earlier one needs the timer earlier.
        if self._task is not None and deadline < self._when:
            self._arm()

    def mark_lost(self) -> None:
        """The lease is gone (the task was recovered): stop the handler, and
        drop whatever it returns."""
        self.lost = True
        self._stop("lease")
        # A batch runs as one: a member's lease lost means the whole batch
        # was recovered (lib/batch.lua), so its handler stops.
        if self.head is not None and not self.head.lost:
            self.head.mark_lost()

    def line_members(self, send: Callable[[Outcome], object]) -> None:
        """Send the members of this head's batch that have no outcome back
        to the front of their group's line, last first (each goes to the
        front), so that the line keeps their order; nothing when the lease
        was lost (the batch comes back whole)."""
        for member in reversed(self.members):
            if not member.settled:
                member.settled = True
                if not self.lost:
                    claimed = member.claimed
                    send(Outcome(claimed.id, claimed.token, "line"))

    def abandon(self) -> None:
        """Give up a batch before its handler started, with no outcome (a
        top-up's reply was lost: the batch may hold members we do not know):
        dropped as a lost lease's are, the batch comes back whole when its
        leases expire."""
        self.lost = True

    def request_cancel(self) -> None:
        """Someone asked to cancel the task: stop the handler (once)."""
        if not self.cancel_requested:
            self.cancel_requested = True
            self._stop("lease")

    def expire(self) -> None:
        """The local lease deadline passed: stop the handler now, before its
        deadline's timer would (the watchdog's way on a stalled loop)."""
        self._stop("lease")

    def begin(self, task: asyncio.Task[Any], timeout: float | None) -> None:
        """The handler starts in *task*, for at most *timeout* seconds: stop
        it at the earlier of that and the lease deadline, or at once when
        the lease was lost or a cancellation requested before it started."""
        self._task = task
        if timeout is not None:
            self._until = task.get_loop().time() + timeout
        if self.lost or self.cancel_requested:
            # From the loop, not here: a task that cancels itself keeps the
            # request even when the handler returns without awaiting
            # (Python 3.11/3.12), and its worker's next await would raise.
            self._handle = task.get_loop().call_soon(self._stop, "lease")
        else:
            self._arm()

    def end(self, *, cancelled: bool) -> StoppedBy | None:
        """The handler ended (*cancelled*: with a cancellation): what stopped
        it, or None if nothing of ours did, or if something else cancelled it
        too (the consumer's shutdown: that cancellation goes on)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        task, self._task = self._task, None
        if self.stopped_by is None or task is None:
            return None
        # Our task.cancel() is ours to take back, caught or not (a handler
        # may swallow it), so that no later await sees it.
        if task.uncancel() > 0 or not cancelled:
            self.stopped_by = None
        return self.stopped_by

    def _arm(self) -> None:
        assert self._task is not None
        when = min(self.deadline, self._until)
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._when = when
        if when != math.inf:
            self._handle = self._task.get_loop().call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        if self._task is None:
            return
        now = self._task.get_loop().time()
        if now >= self.deadline:
            self._stop("lease")
        elif now >= self._until:
            self._stop("timeout")
        else:  # the lease was extended meanwhile
            self._arm()

    def _stop(self, reason: StoppedBy) -> None:
        # Only while the handler runs, and once: the first reason stands.
        if self._task is not None and self.stopped_by is None:
            self.stopped_by = reason
            self._task.cancel()

    def describe(self) -> str:
        """``task <id> (type …, group …, attempt n of m)``, as known."""
        info = self.info
        if info is None:
            return describe(self.claimed.id, None, None, self.claimed.attempt)
        return describe(info.id, info.type, info.group, info.attempt, info.max_attempts)

    def extra(self, queue: str) -> dict[str, object]:
        """The extra fields of a log record about this task."""
        info = self.info
        return task_extra(
            queue,
            self.claimed.id,
            info.type if info else None,
            info.group if info else None,
            self.claimed.attempt,
        )
