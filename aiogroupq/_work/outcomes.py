"""What follows an attempt's outcome: the finisher records it, and once it is
recorded the consumer counts it, tells its observers, calls ``on_dead`` for a
dead letter and forgets the task.

The :class:`Counters` live as long as the consumer (``Consumer.stats`` counts
over all its runs); an :class:`Outcomes` lives for one run, with its client.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import anyio

from .._store import scripts as _scripts
from .._store.codec import dead_letter
from .._store.connection import REDIS_FAILURES
from .._store.fanout import by_partition
from .._store.queries import dead_rows_by_id
from .._store.registry import COUNTERS
from .._store.replies import FinishCode
from .._telemetry.events import EventKind
from .finisher import Finisher

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .._store.connection import Client
    from .._store.partition import Partitions
    from ..task import DeadLetter
    from .damage import DamageWatch
    from .running import Running
    from .telemetry import Telemetry

logger = logging.getLogger("aiogroupq.consumer")  # the consumer's own lines

OnDead = Callable[["DeadLetter"], Awaitable[None]]

#: dead letters made by a script logged one line each per window; the rest
#: are counted in one line (a damaged queue may bury thousands in a claim)
DEAD_LINES: Final = 50
DEAD_WINDOW: Final = 60.0


@dataclass(slots=True)
class Counters:
    """A consumer's counters over all its runs (as in ``ConsumerStats``)."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    handed_back: int = 0
    lease_lost: int = 0

    def items(self) -> list[tuple[str, int]]:
        """``(name, count)`` pairs in the order a heartbeat records them."""
        return [(name, getattr(self, name)) for name in COUNTERS]


#: the counter and the event of each recorded outcome kind
_COUNTED: Final = {
    "ok": ("succeeded", EventKind.SUCCEEDED),
    "retry": ("retried", EventKind.RETRIED),
    "dead": ("dead", EventKind.DEAD),
    "halt": ("dead", EventKind.DEAD),
    "cancel": ("cancelled", EventKind.CANCELLED),
    "back": ("handed_back", EventKind.HANDED_BACK),
    "line": ("handed_back", EventKind.HANDED_BACK),
}


class Outcomes:
    """One run's outcomes, from the runner's submission to what follows
    their recording.

    :param client: the run's client (the finisher's, and ``on_dead``'s reads)
    :param parts: the queue's partitions
    :param running: the consumer's held tasks, which a recorded outcome ends
    :param counters: the consumer's counters
    :param telemetry: the consumer's log lines and observers
    :param on_dead: the consumer's ``on_dead`` callback, if any
    :param retention_ms: how long finished tasks stay readable
    :param side_tasks: where ``on_dead`` calls run, beside the handlers
    :param watch: the run's damaged keys (the finisher reports refusals)
    """

    def __init__(
        self,
        client: Client,
        parts: Partitions,
        *,
        running: dict[str, Running],
        counters: Counters,
        telemetry: Telemetry,
        on_dead: OnDead | None,
        retention_ms: int,
        side_tasks: TaskGroup,
        watch: DamageWatch,
    ) -> None:
        self.counters = counters
        self._client = client
        self._parts = parts
        self._running = running
        self._telemetry = telemetry
        self._on_dead = on_dead
        self._side_tasks = side_tasks
        # Dead letters whose on_dead call waits for their outcome's recording.
        self._notices: dict[str, DeadLetter] = {}
        # on_dead calls under way: a closing consumer waits for them.
        self._hooks = 0
        self._hooks_done = asyncio.Event()
        self._hooks_done.set()
        self.finisher = Finisher(
            client,
            parts,
            retention_ms=retention_ms,
            on_done=self._recorded,
            watch=watch,
        )
        self._dead_log = _DeadLog()

    def submit(self, outcome: _scripts.Outcome, notice: DeadLetter | None) -> None:
        """Queue an attempt's outcome (the runner's ``submit``)."""
        if notice is not None and self._on_dead is not None:
            self._notices[outcome.id] = notice
        self.finisher.submit(outcome)

    def hand_back(self, running: Running) -> None:
        """Give a task back unstarted, to the front of its group, uncounted
        (a batch's members to the front of its group's line behind it)."""
        running.line_members(self.finisher.submit)
        claimed = running.claimed
        kind: _scripts.OutcomeKind = "line" if running.head is not None else "back"
        self.finisher.submit(_scripts.Outcome(claimed.id, claimed.token, kind))

    def lease_lost(self, running: Running) -> None:
        """The heartbeat found the lease lost and the handler stopped: no
        outcome will come for this attempt."""
        self._forget(running.claimed.id, running.claimed.token)
        self.counters.lease_lost += 1
        self._telemetry.emit(EventKind.LEASE_LOST, running)

    def expired(self, ids: Sequence[str]) -> None:
        """Tasks a claim found past their expiry time and ended."""
        for task_id in ids:
            self._telemetry.emit(EventKind.EXPIRED, None, task_id=task_id)

    def dead_elsewhere(self, ids: Sequence[str], reasons: Sequence[str] = ()) -> None:
        """Log tasks a script dead-lettered on its own (a lease that expired
        on the last attempt, damaged keys) with their *reasons*, and call
        on_dead for them."""
        if ids:
            self._dead_log.log(ids, reasons, self._telemetry.extra)
        self._telemetry.dead_elsewhere(ids)
        if ids and self._on_dead is not None:
            self._hook(functools.partial(self._notify_dead, ids))

    async def close(self, timeout: float) -> None:
        """Record what is pending within *timeout* (the run is ending)."""
        left = await self.finisher.close(timeout)
        if left:
            logger.warning(
                "%d outcomes could not be recorded; their tasks will be "
                "recovered when their leases expire",
                left,
            )

    async def hooks_done(self, timeout: float) -> None:
        """Wait up to *timeout* for the on_dead calls under way (the run is
        ending; its side tasks are cancelled next)."""
        with anyio.move_on_after(timeout):
            await self._hooks_done.wait()
        if self._hooks:
            logger.warning(
                "%d on_dead calls did not finish within %.1f s of the shutdown "
                "and were cancelled",
                self._hooks,
                timeout,
            )

    def _hook(self, call: Callable[[], Awaitable[None]]) -> None:
        """Run an on_dead call beside the handlers, counted from now (a
        closing consumer waits for it even if it has not started yet)."""
        self._hooks += 1
        self._hooks_done.clear()
        self._side_tasks.start_soon(self._run_hook, call)

    async def _run_hook(self, call: Callable[[], Awaitable[None]]) -> None:
        try:
            await call()
        finally:
            self._hooks -= 1
            if not self._hooks:
                self._hooks_done.set()

    def _recorded(self, outcome: _scripts.Outcome, code: FinishCode) -> None:
        running = self._running.get(outcome.id)
        if running is not None and running.claimed.token != outcome.token:
            running = None  # a later attempt's: not the one this is about
        self._forget(outcome.id, outcome.token)
        notice = self._notices.pop(outcome.id, None)
        if notice is not None and code is FinishCode.APPLIED:
            self._hook(functools.partial(self._call_on_dead, notice))
        if code is FinishCode.LEASE_LOST:
            self.counters.lease_lost += 1
            self._telemetry.refused(outcome.kind, outcome.id, running)
            return
        kind = outcome.kind
        if code in (FinishCode.GROUP_DAMAGED, FinishCode.TASK_DAMAGED):
            logger.error(
                "outcome %r of task %s: %s; run 'aiogroupq check --repair'",
                outcome.kind,
                outcome.id,
                "a key of its group is damaged, so the task ended alone"
                if code is FinishCode.GROUP_DAMAGED
                else "its hash is damaged, so nothing was recorded",
                extra=self._telemetry.extra(outcome.id, running),
            )
            if code is FinishCode.TASK_DAMAGED:
                return
            if kind not in ("ok", "cancel"):
                kind = "dead"  # dead-lettered as corrupt
        elif code is FinishCode.APPLIED_AS_CANCEL:
            # The server turns a retry or hand-back into a cancel when one was
            # requested; count what was applied.
            kind = "cancel"
        counter, event = _COUNTED[kind]
        setattr(self.counters, counter, getattr(self.counters, counter) + 1)
        self._telemetry.emit(event, running, task_id=outcome.id)

    def _forget(self, task_id: str, token: int) -> None:
        # Only the attempt this token belongs to: the outcome of an earlier
        # attempt may be recorded after the same task was claimed again.
        running = self._running.get(task_id)
        if running is not None and running.claimed.token == token:
            del self._running[task_id]

    async def _notify_dead(self, ids: Sequence[str]) -> None:
        try:
            rows = []
            for keys, mine in by_partition(self._parts, ids).items():
                rows += await dead_rows_by_id(self._client, keys, mine)
        except REDIS_FAILURES as exc:
            logger.warning("could not read dead letters %s for on_dead: %s", ids, exc)
            return
        for row in rows:
            await self._call_on_dead(dead_letter(row))

    async def _call_on_dead(self, notice: DeadLetter) -> None:
        assert self._on_dead is not None
        try:
            await self._on_dead(notice)
        except Exception:
            logger.exception("on_dead callback failed for task %s", notice.id)


class _DeadLog:
    """ERROR lines for dead letters made by a script: one per task, at most
    :data:`DEAD_LINES` per :data:`DEAD_WINDOW` seconds, then a count."""

    def __init__(self) -> None:
        self._window = -DEAD_WINDOW
        self._lines = 0
        self._unlogged = 0

    def log(
        self,
        ids: Sequence[str],
        reasons: Sequence[str],
        extra: Callable[[str, None], dict[str, object]],
    ) -> None:
        now = time.monotonic()
        if now - self._window >= DEAD_WINDOW:
            if self._unlogged:
                logger.error(
                    "%d more tasks were dead-lettered without a line each; "
                    "'aiogroupq dead list' shows them with their reasons",
                    self._unlogged,
                )
            self._window, self._lines, self._unlogged = now, 0, 0
        for i, task_id in enumerate(ids):
            if self._lines >= DEAD_LINES:
                self._unlogged += len(ids) - i
                return
            self._lines += 1
            reason = reasons[i] if i < len(reasons) else "?"
            logger.error(
                "task %s dead-lettered: %s", task_id, reason, extra=extra(task_id, None)
            )
