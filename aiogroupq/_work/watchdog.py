"""The blocked-loop watchdog: how late the event loop runs, and which handler
held it.

A coroutine that sleeps a short tick and measures how late it wakes gives
the stall's length, but only once the stall is over, when the handler that
caused it has moved on. So a thread samples the loop thread's stack while it
is stalled and finds the handler whose frame is on it. While the loop is
blocked the thread also queues the cancellation of every handler whose local
lease deadline has passed: queued during the stall, it runs before the
handler resumes, so a handler that outlived its lease stops at its very next
``await`` (a deadline timer would only fire after the handlers already
woken).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Final

import anyio

if TYPE_CHECKING:
    from .running import Running

#: longest stall that goes unreported, in seconds (less with short leases)
MAX_THRESHOLD: Final = 1.0

Report = Callable[[float, "Running | None", Sequence["Running"]], None]


class Watchdog:
    """Measures the event loop's lag for one consumer.

    :param threshold: stalls at least this long (seconds) are reported
    :param running: returns the consumer's held tasks (called from the
        sampling thread too, so it must only copy)
    :param report: ``report(seconds, culprit, running)`` after each stall,
        on the loop; *culprit* is the handler seen holding the loop, if any
    """

    def __init__(
        self,
        *,
        threshold: float,
        running: Callable[[], list[Running]],
        report: Report,
    ) -> None:
        self.threshold = threshold
        self.tick = threshold / 4
        self._running = running
        self._report = report
        self._beat = time.monotonic()
        self._lock = threading.Lock()
        self._seen: Counter[Running | None] = Counter()

    async def run(self) -> None:
        """Measure until cancelled, with the sampling thread beside."""
        loop = asyncio.get_running_loop()
        stopped = threading.Event()
        sampler = threading.Thread(
            target=self._sample,
            args=(loop, threading.get_ident(), stopped),
            name="aiogroupq-watchdog",
            daemon=True,
        )
        sampler.start()
        try:
            while True:
                start = self._beat = time.monotonic()
                await anyio.sleep(self.tick)
                lag = time.monotonic() - start - self.tick
                with self._lock:
                    seen, self._seen = self._seen, Counter()
                if lag >= self.threshold:
                    self._report(lag, _most_seen(seen), self._running())
        finally:
            # The thread notices within a tick; joining would block the loop.
            stopped.set()

    def _sample(
        self,
        loop: asyncio.AbstractEventLoop,
        loop_thread: int,
        stopped: threading.Event,
    ) -> None:
        cancelled: set[int] = set()
        while not stopped.wait(self.tick):
            now = time.monotonic()
            if now - self._beat <= 2 * self.tick:
                cancelled.clear()
                continue
            # The loop is stalled: who is on its stack, and whose lease ran out?
            frame = sys._current_frames().get(loop_thread)
            stack = _frames(frame)
            try:
                held = self._running()
            except RuntimeError:  # changed size while copied: sample again
                continue
            culprit = next((r for r in held if id(r.frame) in stack), None)
            with self._lock:
                self._seen[culprit] += 1
            for running in held:
                if id(running) in cancelled or running.frame is None:
                    continue
                if now >= running.deadline:
                    cancelled.add(id(running))
                    try:
                        loop.call_soon_threadsafe(running.expire)
                    except RuntimeError:  # the loop is closed: nothing to stop
                        return


def _most_seen(seen: Counter[Running | None]) -> Running | None:
    # A sample that found no handler may be taken just after the stall, as
    # the loop catches up: a handler seen holding the loop at all wins.
    handlers = [(count, running) for running, count in seen.items() if running]
    return max(handlers, key=lambda pair: pair[0])[1] if handlers else None


def _frames(frame: FrameType | None) -> set[int]:
    """The ids of *frame* and of every frame below it."""
    found = set()
    while frame is not None:
        found.add(id(frame))
        frame = frame.f_back
    return found


def threshold_for(lease_ttl: float) -> float:
    """The stall worth reporting: a third of the lease (a heartbeat's
    interval), at most :data:`MAX_THRESHOLD`."""
    return min(MAX_THRESHOLD, lease_ttl / 3)
