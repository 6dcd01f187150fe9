"""The hand-off of claimed tasks from the fetchers to the workers.

A deque and the workers waiting on it, plain asyncio: a worker that finds
a task waiting takes it without suspending. (An anyio memory stream cost
about three calls into anyio and a checkpoint per task, a large share of a
no-op task's CPU.) One waiting worker at a time is woken: as it takes a
task, it wakes the next if more are waiting. Handlers that await get a
worker each, one loop iteration after another; handlers that return at
once are run back to back by the worker already awake, and no wake-up is
spent per task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .running import Running


class Handoff:
    """Claimed tasks waiting for a worker, in claim order.

    The slots bound what it holds (a fetcher claims only for free workers).
    Once closed, :meth:`get` returns None when nothing is left.
    """

    __slots__ = ("_waiters", "_woken", "closed", "items")

    def __init__(self) -> None:
        #: the tasks waiting, oldest first (a worker pops them directly)
        self.items: deque[Running] = deque()
        self.closed = False
        self._waiters: deque[asyncio.Future[None]] = deque()
        # Workers woken that have not resumed yet.
        self._woken = 0

    def put(self, running: Running) -> None:
        """Queue *running* for the next free worker (never blocks)."""
        self.items.append(running)
        if not self._woken:
            self._wake()

    def take(self) -> Running:
        """The oldest waiting task (there must be one): a worker's fast way."""
        running = self.items.popleft()
        if self.items and not self._woken:
            self._wake()  # the rest may need a worker of their own
        return running

    async def get(self) -> Running | None:
        """The oldest waiting task, waiting for one; None once closed and empty."""
        items = self.items
        while not items:
            if self.closed:
                return None
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                # A wake-up meant for a cancelled worker goes to the next one
                # (the task stays queued: nothing is lost with the worker).
                if not waiter.cancel() and not waiter.cancelled():
                    self._woken -= 1
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                if items and not self._woken:
                    self._wake()
                raise
            self._woken -= 1
        return self.take()

    def close(self) -> None:
        """No more tasks will come: waiting workers get None."""
        self.closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._woken += 1

    def drain(self) -> list[Running]:
        """Take every waiting task out, oldest first."""
        taken = list(self.items)
        self.items.clear()
        return taken

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._woken += 1
                return
