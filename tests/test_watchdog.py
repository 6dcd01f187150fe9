"""A handler that blocks the event loop past its lease is named and counted.

The issue's case: a handler calls blocking code, its consumer's heartbeats
cannot run, the lease expires, another consumer runs the task again while
the first one is still inside its handler, and the log only said that the
lease could not be renewed. Consumer A runs in the test's event loop (which
its handler blocks); consumer B runs in a thread with a loop of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import anyio
import anyio.lowlevel
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import TaskState

QUEUE = "watchdog"
#: short, so that a blocked handler outlives it soon; long enough that a
#: busy machine's pauses do not make the other attempt outlive it too
LEASE = 2.0
#: liveness only: how long anything may take before we call it hung
PATIENCE = 30.0

Handler = Callable[[], Awaitable[None]]


@contextmanager
def consumer_in_a_thread(
    redis_url: str, handlers: dict[str, Handler], start: threading.Event
) -> Iterator[list[aiogroupq.ConsumerStats]]:
    """Consumer B, entered once *start* is set, in a thread of its own."""
    stop = threading.Event()
    stats: list[aiogroupq.ConsumerStats] = []

    async def run() -> None:
        async with aiogroupq.Consumer(
            redis_url, queue=QUEUE, handlers=handlers, lease_ttl=LEASE
        ) as consumer:
            while not stop.is_set():
                await anyio.sleep(0.02)
        stats.append(consumer.stats)

    def main() -> None:
        if start.wait(PATIENCE) and not stop.is_set():
            anyio.run(run)

    thread = threading.Thread(target=main, name="consumer-b")
    thread.start()
    try:
        yield stats
    finally:
        stop.set()
        start.set()
        thread.join(PATIENCE)


class Stalls(aiogroupq.Observer):
    """Keeps the LOOP_BLOCKED events, and when each came (a stall is
    reported as the loop runs again, at its end).

    A busy machine pauses the process now and then, and the watchdog
    reports those stalls too, rightly: the tests pick out the stall their
    scenario causes and count the others apart.
    """

    def __init__(self) -> None:
        self.events: list[aiogroupq.TaskEvent] = []
        self.ends: list[float] = []

    def on_event(self, event: aiogroupq.TaskEvent) -> None:
        if event.kind is aiogroupq.EventKind.LOOP_BLOCKED:
            self.events.append(event)
            self.ends.append(time.monotonic())

    def blaming(self, task_id: str) -> list[aiogroupq.TaskEvent]:
        """The stalls put down to *task_id*'s handler."""
        return [e for e in self.events if e.task_id == task_id]

    def first_after(self, moment: float) -> aiogroupq.TaskEvent:
        """The first stall reported after *moment*."""
        pairs = zip(self.events, self.ends, strict=True)
        return next(e for e, end in pairs if end >= moment)


def blocked_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "event loop blocked" in r.getMessage()]


class LoopLag:
    """The test's own measure of its event loop's stalls, beside the
    consumer's watchdog: the gaps between the wakes of a short sleep."""

    TICK = 0.005

    def __init__(self) -> None:
        self.gaps: list[tuple[float, float]] = []

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await anyio.sleep(self.TICK)
            now = time.monotonic()
            if now - last > 10 * self.TICK:
                self.gaps.append((last, now))
            last = now

    def saw(self, end: float, seconds: float) -> bool:
        """Whether a stall of about *seconds* (half of it at least) that
        ended by *end* was seen here too."""
        return any(
            stop - start >= seconds / 2
            for start, stop in self.gaps
            if stop > end - seconds - 1.0 and start < end
        )


class Scenario:
    """Attempt 1 blocks consumer A's loop until consumer B runs attempt 2."""

    def __init__(self, *, await_after_block: bool) -> None:
        self.await_after_block = await_after_block
        self.a_blocking = threading.Event()  # B may start now
        self.b_running = threading.Event()
        self.runs: list[tuple[str, int]] = []
        self.continued = False  # A's handler went on after its next await
        self.stalls = Stalls()

    async def handler(self) -> None:
        info = aiogroupq.current_task()
        self.runs.append((threading.current_thread().name, info.attempt))
        if info.attempt > 1:
            self.b_running.set()
            return
        self.a_blocking.set()
        deadline = time.monotonic() + PATIENCE
        while not self.b_running.is_set() and time.monotonic() < deadline:
            # The bug under report: blocking the event loop.
            time.sleep(0.01)  # noqa: ASYNC251
        if self.await_after_block:
            await anyio.lowlevel.checkpoint()
            self.continued = True


async def run_scenario(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    scenario: Scenario,
) -> tuple[aiogroupq.ConsumerStats, str]:
    handlers: dict[str, Handler] = {"blocker": scenario.handler}
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("blocker", group="g")
        with consumer_in_a_thread(redis_url, handlers, scenario.a_blocking):
            async with aiogroupq.Consumer(
                redis_client,
                queue=QUEUE,
                handlers=handlers,
                lease_ttl=LEASE,
                observers=[scenario.stalls],
            ) as consumer:
                with anyio.fail_after(PATIENCE):
                    while await producer.status(task_id) != TaskState.SUCCEEDED:
                        await anyio.sleep(0.02)
                    while consumer.stats.running:
                        await anyio.sleep(0.01)
            stats = consumer.stats
    return stats, task_id


async def test_the_error_names_the_blocking_handler_and_stats_count_it(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    scenario = Scenario(await_after_block=False)
    with caplog.at_level(logging.WARNING, logger="aiogroupq"):
        stats, task_id = await run_scenario(redis_url, redis_client, scenario)
    # The task ran twice at once: B's attempt started while A's was blocked.
    assert scenario.runs == [("MainThread", 1), ("consumer-b", 2)]
    blocked = blocked_records(caplog)
    # One stall is the handler's; any other is the machine's, and no
    # other is put down to a handler.
    (record,) = [r for r in blocked if getattr(r, "task_id", None) is not None]
    message = record.getMessage()
    print(f"\n{message}")  # noqa: T201 - the line this test is about
    assert record.levelno == logging.ERROR
    assert "'blocker'" in message
    assert task_id in message
    assert "attempt 1 of 3" in message
    assert "anyio.to_thread.run_sync" in message
    assert getattr(record, "task_type", None) == "blocker"
    assert getattr(record, "task_id", None) == task_id
    assert getattr(record, "group", None) == "g"
    seconds = getattr(record, "blocked_seconds", None)
    assert isinstance(seconds, float)
    assert stats.loop_blocked == len(blocked) == len(scenario.stalls.events)
    (event,) = [e for e in scenario.stalls.events if e.task_id is not None]
    assert (event.task_id, event.task_type, event.group) == (task_id, "blocker", "g")
    assert event.duration == seconds
    # A's late "succeeded" was refused, and said so with the task's facts.
    assert stats.lease_lost == 1
    assert stats.succeeded == 0
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1
    assert "type 'blocker', group 'g', attempt 1 of 3" in refused[0].getMessage()
    assert getattr(refused[0], "task_type", None) == "blocker"


async def test_a_handler_past_its_lease_stops_at_its_next_await(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # After the block, A's lease deadline has passed. A deadline timer would
    # fire only after the handler, woken first, ran on past its next await:
    # the watchdog queues the cancellation while the loop is still blocked.
    scenario = Scenario(await_after_block=True)
    with caplog.at_level(logging.WARNING, logger="aiogroupq"):
        stats, task_id = await run_scenario(redis_url, redis_client, scenario)
    assert scenario.runs == [("MainThread", 1), ("consumer-b", 2)]
    assert not scenario.continued
    assert len(scenario.stalls.blaming(task_id)) == 1
    assert stats.loop_blocked == len(scenario.stalls.events)
    # The failed attempt A sent (the lease could not be renewed) was refused.
    assert stats.lease_lost == 1
    assert stats.retried == stats.succeeded == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("could not be renewed" in m for m in messages), messages


async def test_a_quiet_consumer_reports_no_stall(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def nap() -> None:
        await anyio.sleep(LEASE)  # waits, without blocking the loop

    stalls, lag = Stalls(), LoopLag()
    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        anyio.create_task_group() as measuring,
    ):
        measuring.start_soon(lag.run)
        ids = [await producer.enqueue("nap", group=f"g{i}") for i in range(3)]
        async with aiogroupq.Consumer(
            redis_client,
            queue=QUEUE,
            handlers={"nap": nap},
            lease_ttl=LEASE,
            observers=[stalls],
        ) as consumer:
            with anyio.fail_after(PATIENCE):
                for task_id in ids:
                    while await producer.status(task_id) != TaskState.SUCCEEDED:
                        await anyio.sleep(0.02)
        measuring.cancel_scope.cancel()
    # Quiet, it reports no stall of its own making: none is put down to a
    # handler, and any it reports (a busy machine's pause) the test saw too.
    assert consumer.stats.loop_blocked == len(stalls.events)
    for event, end in zip(stalls.events, stalls.ends, strict=True):
        assert event.task_id is None, event
        assert event.duration is not None
        assert lag.saw(end, event.duration), (event, lag.gaps)


async def test_a_stall_outside_the_handlers_is_a_warning_below_a_third_of_the_lease(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # lease_ttl 30: stalls from 1 s are reported; under 10 s no heartbeat
    # was certainly late, so it is a warning, not an error.
    async def nap() -> None:
        await anyio.sleep_forever()

    stalls = Stalls()
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue("nap")
        with caplog.at_level(logging.WARNING, logger="aiogroupq"):
            async with aiogroupq.Consumer(
                redis_client,
                queue=QUEUE,
                handlers={"nap": nap},
                grace_period=0,
                observers=[stalls],
            ) as consumer:
                with anyio.fail_after(PATIENCE):
                    while not consumer.stats.running:
                        await anyio.sleep(0.01)
                time.sleep(1.5)  # noqa: ASYNC251 - the stall, outside any handler
                ended = time.monotonic()
                with anyio.fail_after(PATIENCE):
                    while not any(end >= ended for end in stalls.ends):
                        await anyio.sleep(0.01)
    # The first stall reported after ours ended is ours (a busy machine may
    # add others, before or after it).
    ours = stalls.first_after(ended)
    assert ours.task_id is None
    assert consumer.stats.loop_blocked == len(stalls.events)
    (record,) = [
        r
        for r in blocked_records(caplog)
        if getattr(r, "blocked_seconds", None) == ours.duration
    ]
    assert record.levelno == logging.WARNING
    assert "outside the handlers (running: nap)" in record.getMessage()
