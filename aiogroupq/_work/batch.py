"""A batch handler's run (``Handler(batch_size=N)``): the head's claim and
its members, topped up while the batch fills, decoded and judged one by
one, their outcomes sent together at the end.

:mod:`.runner` runs single tasks and knows nothing of this module: the
workers hand :func:`run_batch` in (see :data:`.runner.RunBatch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..errors import BatchFailed, Retry
from ..task import CURRENT_BATCH
from .runner import (
    RetryPolicy,
    Submit,
    _Attempt,
    _begin,
    _conclude,
    _decode,
    _invoke,
    _line_rest,
)
from .running import Running

if TYPE_CHECKING:
    from .._store.scripts import Outcome
    from ..task import DeadLetter, Envelope
    from .handlers import Route

__all__ = ("TopUp", "run_batch")

#: top up a batch: ``topup(head, task_type, most)`` claims up to *most*
#: more tasks of the head's group (``batch_extend.lua``), adds them to
#: ``head.members`` and returns how many it added, or -1 when the batch must
#: not grow any more (the call failed and the head was abandoned, or what it
#: took was handed back unreplicated); *most* 0 only asks whether the head
#: may grow at all (-1: a recovered batch's head, which runs alone)
TopUp = Callable[[Running, str, int], Awaitable[int]]


async def run_batch(
    head: _Attempt,
    envelope: Envelope,
    policy: RetryPolicy,
    routes: dict[str, Route],
    max_payload_bytes: int,
    *,
    topup: TopUp | None,
) -> None:
    """Run the batch that *head* (decoded: *envelope*) leads and submit each
    of its tasks' outcomes."""
    batch = _Batch(head, head.running, envelope, policy)
    await batch.run(routes, max_payload_bytes, topup)


class _Batch:
    """One run of a batch handler (``Handler(batch_size=N)``): the head's
    attempt and its members', whose outcomes are sent together at the end:
    the members given back first (``line``), then the judged ones, the
    head's last (``finish.lua`` keeps the head's member list until then,
    for a recovery that meets the batch half finished)."""

    def __init__(
        self,
        head: _Attempt,
        running: Running,
        envelope: Envelope,
        policy: RetryPolicy,
    ) -> None:
        self.head = head
        self.running = running
        self.envelope = envelope
        self.policy = policy
        self.route = head.route
        #: the outcomes submitted so far, by the task's place in the batch
        self.judged: list[tuple[int, Outcome, DeadLetter | None]] = []
        #: the attempts that run in the handler, in order
        self.runs: list[_Attempt] = [head]
        self._submit = head._submit
        head._submit = self._collector(0)

    def _collector(self, place: int) -> Submit:
        def collect(outcome: Outcome, notice: DeadLetter | None) -> None:
            self.judged.append((place, outcome, notice))

        return collect

    async def run(
        self,
        routes: dict[str, Route],
        max_payload_bytes: int,
        topup: TopUp | None,
    ) -> None:
        try:
            await self._run(routes, max_payload_bytes, topup)
        finally:
            self._flush()

    def _flush(self) -> None:
        running, submit = self.running, self._submit
        self.head._submit = submit  # an internal error's outcome goes out
        for place, _, _ in self.judged:
            if place:
                running.members[place - 1].settled = True
        _line_rest(running, submit)
        if running.lost:
            return  # the batch was recovered: nothing of it is ours to judge
        for _, outcome, notice in sorted(self.judged, key=_place, reverse=True):
            submit(outcome, notice)

    async def _fill(self, topup: TopUp) -> None:
        """Wait up to batch_wait for more tasks of the group (a little less
        than the start window of the claim: the batch must start in it)."""
        running, options = self.running, self.route.options
        size = options.batch_size
        assert size is not None
        loop = asyncio.get_running_loop()
        until = min(
            loop.time() + options.batch_wait,
            running.start_by - 0.5,
            running.deadline - 0.5,
        )
        step = max(0.01, options.batch_wait / 10)
        if running.claimed.alone:
            return  # a recovered batch's head: it runs alone (lib/batch.lua)
        while len(running.members) + 1 < size:
            left = until - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(left, step))
            if running.lost:
                return
            most = size - 1 - len(running.members)
            if await topup(running, self.envelope.type, most) < 0:
                return

    async def _run(
        self,
        routes: dict[str, Route],
        max_payload_bytes: int,
        topup: TopUp | None,
    ) -> None:
        running, head, envelope = self.running, self.head, self.envelope
        options = self.route.options
        try:
            if options.batch_wait and envelope.group is not None and topup is not None:
                await self._fill(topup)
            if running.lost:
                return
            task = asyncio.current_task()
            assert task is not None
            now = task.get_loop().time()
            if now >= running.deadline or (
                envelope.group is not None and now >= running.start_by
            ):
                # As for a single task (see _run): not started, handed back
                # uncounted, its members to the front of the line behind it.
                head.outcome("back")
                return
            envelopes = [envelope]
            for place, member in enumerate(running.members, 1):
                attempt = _Attempt(member, self._collector(place), head.observers)
                found = _decode(attempt, routes, max_payload_bytes)
                if found is None:
                    break  # rejected: the members after it go back to the line
                if attempt.route is not self.route:
                    # Another type (a damaged hash): it and those after it go
                    # back to the line, to run as heads of their own.
                    break
                self.runs.append(attempt)
                envelopes.append(found)
        except asyncio.CancelledError:
            # The shutdown, before the handler started: the head goes back
            # uncounted, its members behind it (_flush), as an unstarted
            # claim's; an abandoned batch sends nothing.
            if not running.lost and not head.sent:
                head.outcome("back")
            raise
        await self._call(task, envelopes)

    async def _call(self, task: asyncio.Task[Any], envelopes: list[Envelope]) -> None:
        running, head, route, policy = self.running, self.head, self.route, self.policy
        timeout = (
            route.options.timeout
            if self.envelope.timeout_ms is None
            else self.envelope.timeout_ms / 1000
        )
        infos = [
            _begin(attempt, envelope)
            for attempt, envelope in zip(self.runs, envelopes, strict=True)
        ]
        batch_token = CURRENT_BATCH.set(infos)
        try:
            payloads = [attempt.payload for attempt in self.runs]
            stopped, result, error = await _invoke(
                head, task, infos[0], timeout, payloads
            )
        finally:
            CURRENT_BATCH.reset(batch_token)
        for attempt in self.runs[1:]:
            attempt.running.duration = running.duration
        if isinstance(error, BatchFailed):
            self._failed_at(error)
        elif error is not None:
            delay = error.delay if isinstance(error, Retry) else None
            head.failed(policy, error, delay=delay)
        elif stopped is not None:
            # Stopped as a single task is, and judged as one: the head's
            # outcome; the members go back to the line behind it.
            _conclude(head, policy, None, stopped, timeout)
        else:
            self._succeeded(result)

    def _failed_at(self, exc: BatchFailed) -> None:
        """BatchFailed(done=k): the first k succeeded, the next one failed."""
        done = min(exc.done, len(self.runs))
        self._ok(self.runs[:done], [None] * done)
        if done < len(self.runs):
            error = exc.error
            delay = error.delay if isinstance(error, Retry) else None
            self.runs[done].failed(self.policy, error, delay=delay)

    def _succeeded(self, result: object) -> None:
        runs = self.runs
        results: list[object] = [None] * len(runs)
        if self.route.options.store_result and result is not None:
            if not isinstance(result, list) or len(result) != len(runs):
                got = (
                    f"a list of {len(result)}"
                    if isinstance(result, list)
                    else type(result).__name__
                )
                wrong = TypeError(
                    "a batch handler with store_result must return None or a "
                    f"list of one result per task ({len(runs)}), got {got}"
                )
                self.head.failed(self.policy, wrong, delay=None)
                return
            results = result
        self._ok(runs, results)

    def _ok(self, runs: list[_Attempt], results: list[object]) -> None:
        """Each of *runs* succeeded with its result; one whose result cannot
        be stored is dead-lettered, and those after it go back to the line."""
        for attempt, value in zip(runs, results, strict=True):
            if not attempt.succeeded(value):
                return


def _place(item: tuple[int, Outcome, DeadLetter | None]) -> int:
    return item[0]
