"""The consumer's workers: ``concurrency`` loops, each running one claimed
task at a time, fed by the fetchers through one :class:`~.handoff.Handoff`.

A worker gives its handler slot back to the :class:`SlotPool` when its task
ends, so a fetcher claims at most as many tasks as there are free workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .batch import TopUp, run_batch
from .fetcher import SlotPool
from .handoff import Handoff
from .runner import RetryPolicy, run_task

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .._telemetry.events import Observers
    from ..task import Envelope
    from .handlers import Route
    from .outcomes import Outcomes
    from .runner import _Attempt


class Workers:
    """One run's workers, the hand-off that feeds them and their slots.

    :param concurrency: how many tasks run at once
    :param outcomes: where each attempt's outcome goes
    :param routes: the handlers, by task type
    :param policy: the consumer's retry backoff
    :param max_payload_bytes: a task storing more is dead-lettered undecoded
    :param observers: the consumer's observers
    """

    def __init__(
        self,
        concurrency: int,
        outcomes: Outcomes,
        *,
        routes: dict[str, Route],
        policy: RetryPolicy,
        max_payload_bytes: int,
        observers: Observers,
    ) -> None:
        self.slots = SlotPool(concurrency)
        #: where the fetchers put what they claimed
        self.send = Handoff()
        self._concurrency = concurrency
        self._outcomes = outcomes
        self._routes = routes
        self._policy = policy
        self._max_payload_bytes = max_payload_bytes
        self._observers = observers
        #: tops up a batch handler's batch (set by the consumer's run)
        self.topup: TopUp | None = None

    def start(self, tg: TaskGroup) -> None:
        """Start every worker in *tg*."""
        for _ in range(self._concurrency):
            tg.start_soon(self._work)

    def hand_back_unstarted(self) -> None:
        """Close the hand-off and hand back what it still holds, unstarted."""
        self.send.close()
        # Each hand-back goes to the front: reversed, they keep claim order.
        for running in reversed(self.send.drain()):
            self._outcomes.hand_back(running)

    async def _run_batch(
        self,
        head: _Attempt,
        envelope: Envelope,
        policy: RetryPolicy,
        routes: dict[str, Route],
        max_payload_bytes: int,
    ) -> None:
        await run_batch(
            head, envelope, policy, routes, max_payload_bytes, topup=self.topup
        )

    async def _work(self) -> None:
        slots, outcomes, submit = self.slots, self._outcomes, self._outcomes.submit
        routes, policy, observers = self._routes, self._policy, self._observers
        max_payload_bytes = self._max_payload_bytes
        run_batch = self._run_batch  # one bound method, not one per task
        handoff = self.send
        waiting = handoff.items
        while True:
            # A task already waiting is taken without a trip through the
            # event loop (the handler's awaits are where it lets others run).
            if waiting:
                running = handoff.take()
            elif (got := await handoff.get()) is not None:
                running = got
            else:
                return  # closed: the fetchers are done
            if slots.closed:
                outcomes.hand_back(running)
                continue
            try:
                await run_task(
                    running,
                    routes,
                    policy,
                    submit,
                    max_payload_bytes=max_payload_bytes,
                    observers=observers,
                    batch=run_batch,
                )
            finally:
                if running.lost:
                    outcomes.lease_lost(running)
                    for member in running.members:  # recovered with it
                        outcomes.lease_lost(member)
                slots.give(1)
