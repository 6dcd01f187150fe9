"""The workers' plain-asyncio hot path: the hand-off from the fetchers and
the stop of a running handler (lease, cancel request, timeout) without anyio
cancel scopes. Offline: no Redis involved."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from aiogroupq._store import scripts as _scripts
from aiogroupq._work.handlers import build_routes
from aiogroupq._work.handoff import Handoff
from aiogroupq._work.runner import RetryPolicy, run_task
from aiogroupq._work.running import Running

from ._tasks import envelope_of


def running_of(task_id: str) -> Running:
    return Running(_scripts.Claimed(task_id, envelope_of(task_id), 1, 1))


async def test_a_task_woken_for_a_cancelled_worker_goes_to_the_next() -> None:
    handoff = Handoff()
    got: list[str] = []

    async def worker() -> None:
        running = await handoff.get()
        assert running is not None
        got.append(running.claimed.id)

    with anyio.fail_after(30):  # a lost wake-up hangs
        first = asyncio.ensure_future(worker())
        second = asyncio.ensure_future(worker())
        await asyncio.sleep(0)  # both wait now
        handoff.put(running_of("a"))  # wakes the first...
        first.cancel()  # ...which is cancelled before it runs
        await asyncio.gather(first, return_exceptions=True)
        await second
    assert got == ["a"]
    assert handoff.drain() == []


async def test_a_closed_handoff_ends_its_workers_and_keeps_what_it_holds() -> None:
    handoff = Handoff()
    waiting = asyncio.ensure_future(handoff.get())
    await asyncio.sleep(0)
    handoff.close()
    assert await waiting is None
    handoff.put(running_of("late"))
    assert [r.claimed.id for r in handoff.drain()] == ["late"]


@pytest.mark.parametrize(
    ("order", "stop", "outcomes"),
    [
        # The shutdown's cancellation came first: it goes on, and the task
        # goes back unstarted (the stop must not swallow it).
        ("shutdown first", "lost", ["back"]),
        ("shutdown first", "cancel", ["back"]),
        # The stop came first: it stands, and the shutdown still goes on.
        ("stop first", "lost", []),
        ("stop first", "cancel", ["cancel"]),
    ],
)
async def test_a_stop_and_a_shutdown_at_once(
    order: str, stop: str, outcomes: list[str]
) -> None:
    submitted: list[_scripts.Outcome] = []
    started = anyio.Event()

    async def handler() -> None:
        started.set()
        await anyio.sleep(60)

    running = running_of("t")

    def stop_it() -> None:
        if stop == "lost":
            running.mark_lost()
        else:
            running.request_cancel()

    with anyio.fail_after(30):
        with anyio.CancelScope() as shutdown:
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: run_task(
                        running,
                        build_routes({"t": handler}),
                        RetryPolicy(1.0, 1.0),
                        lambda outcome, _notice: submitted.append(outcome),
                        max_payload_bytes=1024,
                    )
                )
                await started.wait()
                # Both in one loop iteration.
                if order == "shutdown first":
                    shutdown.cancel()
                    stop_it()
                else:
                    stop_it()
                    shutdown.cancel()
    assert shutdown.cancelled_caught
    assert [o.kind for o in submitted] == outcomes


async def test_a_stopped_handler_leaves_no_cancellation_behind() -> None:
    # The stop is taken back once caught: the worker's next await runs.
    submitted: list[_scripts.Outcome] = []

    async def handler() -> None:
        await anyio.sleep(60)

    running = running_of("t")

    async def stop_soon() -> None:
        await asyncio.sleep(0.01)
        running.request_cancel()

    task = asyncio.current_task()
    assert task is not None
    with anyio.fail_after(30):
        stopper = asyncio.ensure_future(stop_soon())
        await run_task(
            running,
            build_routes({"t": handler}),
            RetryPolicy(1.0, 1.0),
            lambda outcome, _notice: submitted.append(outcome),
            max_payload_bytes=1024,
        )
        await stopper
        assert task.cancelling() == 0
        await asyncio.sleep(0)  # not cancelled
    assert [o.kind for o in submitted] == ["cancel"]


async def test_a_stop_before_the_start_leaves_the_worker_running() -> None:
    # Stopped while it waited for a worker (lease lost, cancel requested),
    # a handler that returns without awaiting must not leave a cancellation
    # behind for the worker's next await (the whole consumer would stop).
    submitted: list[_scripts.Outcome] = []

    async def handler() -> None:
        pass

    running = running_of("t")
    running.request_cancel()
    with anyio.fail_after(30):
        await run_task(
            running,
            build_routes({"t": handler}),
            RetryPolicy(1.0, 1.0),
            lambda outcome, _notice: submitted.append(outcome),
            max_payload_bytes=1024,
        )
        await asyncio.sleep(0)  # raised CancelledError before the fix
        await asyncio.sleep(0.01)
    assert len(submitted) == 1


async def test_waiting_tasks_get_a_worker_each_when_their_handlers_await() -> None:
    # One worker is woken per put; each wakes the next as it takes a task,
    # so handlers that await still run side by side.
    handoff = Handoff()
    running_now: set[str] = set()
    all_in = anyio.Event()

    async def worker() -> None:
        while (running := await handoff.get()) is not None:
            running_now.add(running.claimed.id)
            if len(running_now) == 3:
                all_in.set()
            await all_in.wait()  # a handler that awaits

    with anyio.fail_after(30):  # one worker for all three never gets there
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(worker)
            await asyncio.sleep(0)
            for task_id in "abc":
                handoff.put(running_of(task_id))
            await all_in.wait()
            handoff.close()
    assert running_now == {"a", "b", "c"}
