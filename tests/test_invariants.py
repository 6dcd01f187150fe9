"""The product's invariants under real concurrency, judged from a Redis journal.

The handlers of the invariant tests journal their start and end on the Redis
server's own timeline (see ``tests/_journal.py``), and the checks are counts
over that journal: lost or duplicated tasks, group order violations,
same-group overlaps, parallelism. The tests at the end check, through the
public ``status`` API, that leaving a consumer hands back what it held.
Nothing is mocked and nothing asserts on durations: timeouts are only
generous liveness bounds, so a slow machine makes these tests slower, never
flaky.

The multi-process test draws a fresh seed each run and prints it; set
``INVARIANTS_SEED`` to replay one.
"""

from __future__ import annotations

import multiprocessing
import os
import random
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import anyio.lowlevel
import pytest
import redis.asyncio
from anyio.abc import TaskStatus

import aiogroupq

from ._journal import (
    Entry,
    Figures,
    Job,
    Journal,
    check,
    consume_in_process,
    make_handlers,
)

#: liveness bound for anything that should take seconds
LIVENESS = 60.0


def _show(name: str, figures: Figures, **extra: object) -> None:
    """Print the figures (visible with ``-s`` or in a failure's report)."""
    parts = [f"{k}={v}" for k, v in extra.items()]
    print(f"[{name}] {figures} {' '.join(parts)}")  # noqa: T201


async def _statuses(
    redis_url: str, queue: str, ids: Iterable[str]
) -> dict[aiogroupq.TaskState | None, int]:
    """How many of *ids* are in each state, read through the public API."""
    todo = list(ids)
    counts: dict[aiogroupq.TaskState | None, int] = {}

    async def reader(producer: aiogroupq.Producer) -> None:
        while todo:
            state = await producer.status(todo.pop())
            counts[state] = counts.get(state, 0) + 1

    async with (
        aiogroupq.Producer(redis_url, queue=queue) as producer,
        anyio.create_task_group() as tg,
    ):
        for _ in range(16):
            tg.start_soon(reader, producer)
    return counts


async def _enqueue_calls(
    producer: aiogroupq.Producer,
    calls: Sequence[Sequence[Job]],
    ids: dict[int, str],
) -> None:
    """Enqueue *calls* in order: one job with ``enqueue``, more with
    ``enqueue_many``. Each call is awaited before the next, so the order of
    the calls is the enqueue order that group order is judged against."""
    for call in calls:
        if len(call) == 1:
            job = call[0]
            ids[job.n] = await producer.enqueue("work", job, group=job.group)
        else:
            batch = [aiogroupq.Task("work", job, group=job.group) for job in call]
            for job, task_id in zip(
                call, await producer.enqueue_many(batch), strict=True
            ):
                ids[job.n] = task_id


def _chop(jobs: Sequence[Job], rng: random.Random) -> list[list[Job]]:
    """Split *jobs* into consecutive calls: about a third single enqueues,
    the rest ``enqueue_many`` batches of 2-50."""
    calls: list[list[Job]] = []
    i = 0
    while i < len(jobs):
        size = 1 if rng.random() < 0.35 else rng.randint(2, 50)
        calls.append(list(jobs[i : i + size]))
        i += size
    return calls


# -- many processes -----------------------------------------------------------

N_PROCESSES = 3
N_PRODUCERS = 4
N_GROUPS = 500
N_UNGROUPED = 3000


def _multi_process_plan(rng: random.Random) -> list[list[list[Job]]]:
    """Per producer coroutine, its enqueue calls.

    Each group belongs to ONE producer: group order is only defined for
    tasks whose enqueues are themselves ordered. The producers run
    concurrently, so groups (and ungrouped tasks) interleave in the queue.
    """
    tokens: list[list[str | None]] = [[] for _ in range(N_PRODUCERS)]
    for g in range(N_GROUPS):
        tokens[g % N_PRODUCERS] += [f"g{g}"] * rng.randint(5, 45)
    for u in range(N_UNGROUPED):
        tokens[u % N_PRODUCERS].append(None)
    plans = []
    n = 0
    for mine in tokens:
        rng.shuffle(mine)
        next_seq: dict[str | None, int] = {}
        jobs = []
        for group in mine:
            seq = next_seq.get(group, 0)
            next_seq[group] = seq + 1
            # A quarter of the handlers sleep 0-3 ms so runs really overlap.
            sleep_ms = rng.uniform(0, 3) if rng.random() < 0.25 else 0.0
            jobs.append(Job(n=n, group=group, seq=seq, sleep_ms=sleep_ms))
            n += 1
        plans.append(_chop(jobs, rng))
    return plans


@pytest.mark.slow
async def test_many_processes_run_each_task_once_in_group_order(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """3 consumer processes x 16 coroutines against 4 concurrent producers:
    every task runs exactly once, groups stay exclusive and ordered, and
    ungrouped tasks run in parallel."""
    queue = "inv-mp"
    seed = int(os.environ.get("INVARIANTS_SEED") or random.randrange(2**32))
    plans = _multi_process_plan(random.Random(seed))
    expected = {job.n: job for plan in plans for call in plan for job in call}
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    readies = [ctx.Event() for _ in range(N_PROCESSES)]
    processes = [
        ctx.Process(
            target=consume_in_process,
            args=(redis_url, queue, 16, ready, stop),
            daemon=True,  # never outlive a crashed test
        )
        for ready in readies
    ]
    for process in processes:
        process.start()
    journal = Journal(redis_client)
    ids: dict[int, str] = {}
    started_at = anyio.current_time()
    try:
        with anyio.fail_after(LIVENESS):
            while not all(ready.is_set() for ready in readies):
                if any(p.exitcode is not None for p in processes):
                    pytest.fail("a consumer process died while starting")
                await anyio.sleep(0.02)
            async with anyio.create_task_group() as tg:
                for plan in plans:
                    producer = aiogroupq.Producer(redis_url, queue=queue)
                    await tg.start(_run_producer, producer, plan, ids)
            # Not journal.wait_done: a consumer process that dies must fail
            # the test at once, not after the liveness bound.
            while await journal.done_count() < len(expected):
                if any(p.exitcode is not None for p in processes):
                    pytest.fail("a consumer process died while consuming")
                await anyio.sleep(0.05)
    finally:
        stop.set()
        for process in processes:
            await anyio.to_thread.run_sync(process.join, 30)
            if process.is_alive():
                process.kill()
    elapsed = anyio.current_time() - started_at
    assert [p.exitcode for p in processes] == [0] * N_PROCESSES

    figures = check(await journal.entries(), expected)
    states = await _statuses(redis_url, queue, ids.values())
    _show(
        "many-processes",
        figures,
        seed=seed,
        seconds=round(elapsed, 2),
        states={str(k): v for k, v in states.items()},
    )
    assert len(ids) == len(expected)
    assert figures.never_run == 0
    assert figures.started == figures.starts == len(expected)
    assert figures.started_more_than_once == 0
    assert figures.unexpected == figures.unfinished == figures.failed_runs == 0
    assert figures.order_violations == 0
    assert figures.overlaps == 0
    assert figures.max_group_concurrency == 1
    assert figures.meta_mismatches == 0
    assert figures.max_ungrouped_concurrency > 1
    assert figures.groups == N_GROUPS
    # Not a fairness claim, only that every process took part.
    assert figures.processes == N_PROCESSES
    assert states == {aiogroupq.TaskState.SUCCEEDED: len(expected)}


async def _run_producer(
    producer: aiogroupq.Producer,
    plan: Sequence[Sequence[Job]],
    ids: dict[int, str],
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    async with producer:
        task_status.started()
        await _enqueue_calls(producer, plan, ids)


# -- one hot group --------------------------------------------------------------


@dataclass
class _HotState:
    hot_done: int = 0
    others_left: int = 0
    hot_done_when_others_finished: int = -1
    hot_sleeps: bool = True


async def test_hot_group_backlog_does_not_block_other_groups(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """5,000 tasks of one group at the head of the queue, then 50 other
    groups: the others all finish while most of the hot backlog still waits.

    With head-of-line blocking (a scan that stops at, or crawls through, the
    busy group's entries) the others would finish only near the end of the
    hot backlog; the measure is a count of hot completions, not a time.
    The consumer then leaves with the backlog unfinished: what it did not
    run must be handed back (queued, not running, not lost), and a second
    consumer must carry on with the hot group exactly where it stopped.
    """
    queue = "inv-hot"
    backlog, n_others, per_other = 5000, 50, 10
    journal = Journal(redis_client)
    hot = [Job(n=i, group="hot", seq=i, sleep_ms=2.0) for i in range(backlog)]
    others = [
        Job(n=backlog + s * n_others + g, group=f"o{g}", seq=s)
        for s in range(per_other)
        for g in range(n_others)
    ]
    expected = {job.n: job for job in hot + others}
    state = _HotState(others_left=len(others))
    others_finished = anyio.Event()

    async def work(job: Job) -> None:
        async with journal.run(job):
            if job.sleep_ms and state.hot_sleeps:
                await anyio.sleep(job.sleep_ms / 1000)
        if job.group == "hot":
            state.hot_done += 1
            return
        state.others_left -= 1
        if state.others_left == 0:
            state.hot_done_when_others_finished = state.hot_done
            others_finished.set()

    ids: dict[int, str] = {}
    async with aiogroupq.Producer(redis_client, queue=queue) as producer:
        # The whole hot backlog is in front of the others before anyone
        # consumes: the worst shape for a head-of-line-blocking queue.
        for i in range(0, backlog, 1000):
            await _enqueue_calls(producer, [hot[i : i + 1000]], ids)
        await _enqueue_calls(producer, _chop(others, random.Random(7)), ids)
    with anyio.fail_after(LIVENESS):
        async with aiogroupq.Consumer(
            redis_url,
            queue=queue,
            handlers={"work": work},
            concurrency=64,
            grace_period=5.0,
        ):
            await others_finished.wait()

    entries = await journal.entries()
    figures = check(entries, expected)
    at_end = state.hot_done_when_others_finished
    done_in_phase_1 = state.hot_done
    after_exit = await _statuses(redis_url, queue, ids.values())
    _show(
        "hot-group",
        figures,
        hot_backlog=backlog,
        hot_done_when_others_finished=at_end,
        hot_done_at_exit=done_in_phase_1,
    )
    started = {e.n for e in entries if _start(e)}
    assert {job.n for job in others} <= started, "another group lost a task"
    assert at_end >= 0
    assert at_end < backlog * 0.5, (
        f"the other groups finished only after {at_end} of {backlog} hot tasks"
    )
    assert figures.order_violations == 0
    assert figures.overlaps == 0
    assert figures.started_more_than_once == 0
    assert figures.unfinished == 0
    assert after_exit == {
        aiogroupq.TaskState.SUCCEEDED: len(others) + done_in_phase_1,
        aiogroupq.TaskState.QUEUED: backlog - done_in_phase_1,
    }

    # Phase 2: a fresh consumer drains the rest of the hot group, unslowed.
    state.hot_sleeps = False
    with anyio.fail_after(LIVENESS):
        async with aiogroupq.Consumer(
            redis_url, queue=queue, handlers={"work": work}, concurrency=64
        ):
            await journal.wait_done(len(expected))
    figures = check(await journal.entries(), expected)
    _show("hot-group, drained by a second consumer", figures)
    assert figures.never_run == 0
    assert figures.started == figures.starts == len(expected)
    assert figures.order_violations == 0
    assert figures.overlaps == 0
    assert await _statuses(redis_url, queue, ids.values()) == {
        aiogroupq.TaskState.SUCCEEDED: len(expected)
    }


# -- retry keeps its place --------------------------------------------------------


@asynccontextmanager
async def _consumers(
    redis_url: str, queue: str, journal: Journal, processes: int
) -> AsyncIterator[None]:
    """Consume *queue* in this process, or in *processes* spawned ones."""
    if processes == 1:
        async with aiogroupq.Consumer(
            redis_url,
            queue=queue,
            handlers=make_handlers(journal),
            concurrency=16,
            retry_backoff=0.2,
            grace_period=5.0,
        ):
            yield
        return
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    readies = [ctx.Event() for _ in range(processes)]
    children = [
        ctx.Process(
            target=consume_in_process,
            args=(redis_url, queue, 16, ready, stop, 0.2),
            daemon=True,
        )
        for ready in readies
    ]
    for child in children:
        child.start()
    try:
        while not all(ready.is_set() for ready in readies):
            assert all(c.exitcode is None for c in children), "a consumer died"
            await anyio.sleep(0.02)
        yield
    finally:
        stop.set()
        for child in children:
            await anyio.to_thread.run_sync(child.join, 30)
            if child.is_alive():
                child.kill()


@pytest.mark.parametrize("processes", [1, 3], ids=["one-process", "three-processes"])
async def test_retry_runs_before_later_tasks_of_its_group(
    redis_url: str, redis_client: redis.asyncio.Redis, processes: int
) -> None:
    """A grouped task failing twice runs again (attempts 2 and 3) before any
    later task of its group, and other groups keep running meanwhile, with
    one consumer process or several."""
    queue = f"inv-retry-{processes}"
    journal = Journal(redis_client)
    n_retry_group, failing_seq = 10, 2
    retry_group = [
        Job(n=i, group="r", seq=i, fail_until=3 if i == failing_seq else 0)
        for i in range(n_retry_group)
    ]
    # Each other group runs at least 60 x 10 ms = 0.6 s, the most the two
    # backoffs (0.2 s then 0.4 s, times a jitter factor <= 1) can last, so
    # they are still busy during both backoffs.
    others = [
        Job(n=n_retry_group + s * 10 + g, group=f"o{g}", seq=s, sleep_ms=10.0)
        for s in range(60)
        for g in range(10)
    ]
    expected = {job.n: job for job in retry_group + others}
    failing = retry_group[failing_seq]

    ids: dict[int, str] = {}
    async with aiogroupq.Producer(redis_client, queue=queue) as producer:
        await _enqueue_calls(producer, [retry_group], ids)
        await _enqueue_calls(producer, _chop(others, random.Random(11)), ids)
        with anyio.fail_after(LIVENESS):
            async with _consumers(redis_url, queue, journal, processes):
                await journal.wait_done(len(expected))
        final_state = await producer.status(ids[failing.n])

    entries = await journal.entries()
    figures = check(entries, expected)
    r_starts = [(e.seq, e.attempt) for e in entries if e.group == "r" and _start(e)]
    windows = [
        _starts_between(
            entries,
            _clock(entries, "end", failing.n, attempt),
            _clock(entries, "start", failing.n, attempt + 1),
            exclude_group="r",
        )
        for attempt in (1, 2)
    ]
    _show("retry", figures, other_group_starts_during_backoffs=windows)
    assert r_starts == [
        *((s, 1) for s in range(failing_seq)),
        (failing_seq, 1),
        (failing_seq, 2),
        (failing_seq, 3),
        *((s, 1) for s in range(failing_seq + 1, n_retry_group)),
    ]
    assert figures.order_violations == 0
    assert figures.overlaps == 0
    assert figures.never_run == 0
    assert figures.failed_runs == 2
    assert figures.started_more_than_once == 1
    assert all(count > 0 for count in windows), "other groups stalled in a backoff"
    assert final_state == aiogroupq.TaskState.SUCCEEDED


def _start(entry: Entry) -> bool:
    return entry.event == "start"


def _clock(entries: Iterable[Entry], event: str, n: int, attempt: int) -> int:
    for e in entries:
        if e.event == event and e.n == n and e.attempt == attempt:
            return e.clock
    raise AssertionError(f"no {event} of task {n} attempt {attempt} in the journal")


def _starts_between(
    entries: Iterable[Entry], after: int, before: int, *, exclude_group: str
) -> int:
    return sum(
        1
        for e in entries
        if _start(e) and after < e.clock < before and e.group != exclude_group
    )


# -- parallelism in one process -------------------------------------------------


async def test_distinct_groups_all_run_at_once(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """concurrency=32 and 32 groups: all 32 first tasks are running at the
    same moment (each waits until the 32nd has started), and each group's
    second task still waits for its first."""
    queue = "inv-parallel"
    width = 32
    journal = Journal(redis_client)
    jobs = [
        Job(n=g * 2 + s, group=f"p{g}", seq=s) for g in range(width) for s in range(2)
    ]
    expected = {job.n: job for job in jobs}
    inside = 0
    peak = 0
    all_in = anyio.Event()
    release = anyio.Event()

    async def work(job: Job) -> None:
        nonlocal inside, peak
        async with journal.run(job):
            if job.seq != 0:
                return
            inside += 1
            peak = max(peak, inside)
            if inside == width:
                all_in.set()
            try:
                await release.wait()
            finally:
                inside -= 1

    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Consumer(
            redis_url,
            queue=queue,
            handlers={"work": work},
            concurrency=width,
            grace_period=5.0,
        ),
    ):
        # Interleaved (p0 s0, p0 s1, p1 s0, ...): the claim has to look past
        # each group's second task to find the next group's first.
        await _enqueue_calls(producer, [jobs], {})
        with anyio.move_on_after(LIVENESS):
            await all_in.wait()
        reached = peak
        release.set()  # unblock the handlers whatever happened
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(len(jobs))

    figures = check(await journal.entries(), expected)
    _show("parallel", figures, peak_waiting_together=reached)
    assert reached == width, f"only {reached} of {width} groups ran at once"
    assert figures.max_concurrency == width
    assert figures.overlaps == 0
    assert figures.order_violations == 0
    assert figures.never_run == 0
    assert figures.started_more_than_once == 0


# -- exclusion in one process ---------------------------------------------------


async def test_one_group_never_runs_twice_at_once(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """One group, 200 tasks, 64 coroutines free to take them: never two at
    once, in enqueue order, each exactly once; enqueued while consuming."""
    queue = "inv-exclusive"
    journal = Journal(redis_client)
    rng = random.Random(3)
    jobs = [
        Job(n=i, group="solo", seq=i, sleep_ms=rng.uniform(0, 1)) for i in range(200)
    ]
    expected = {job.n: job for job in jobs}
    running = 0
    peak = 0

    async def work(job: Job) -> None:
        nonlocal running, peak
        async with journal.run(job):
            running += 1
            peak = max(peak, running)
            try:
                if job.sleep_ms:
                    await anyio.sleep(job.sleep_ms / 1000)
            finally:
                running -= 1

    ids: dict[int, str] = {}
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Consumer(
            redis_url,
            queue=queue,
            handlers={"work": work},
            concurrency=64,
            grace_period=5.0,
        ),
    ):
        with anyio.fail_after(LIVENESS):
            await _enqueue_calls(producer, _chop(jobs, rng), ids)
            await journal.wait_done(len(jobs))

    figures = check(await journal.entries(), expected)
    _show("exclusive", figures, peak_in_process=peak, pid=os.getpid())
    assert peak == 1
    assert figures.max_group_concurrency == 1
    assert figures.overlaps == 0
    assert figures.order_violations == 0
    assert figures.never_run == 0
    assert figures.started == figures.starts == len(jobs)


# -- the checker itself ---------------------------------------------------------


def _entry(
    clock: int, event: str, job: Job, *, attempt: int = 1, pid: int = 1
) -> Entry:
    assert event in ("start", "end")
    return Entry(
        clock,
        "start" if event == "start" else "end",
        job.n,
        job.group,
        job.seq,
        pid,
        attempt,
        job.group,
        True,
        f"id{job.n}",
    )


def test_checker_flags_what_it_must() -> None:
    """The journal checks above are only worth something if they can fail."""
    a0, a1, a2 = (Job(n=i, group="a", seq=i) for i in range(3))
    u0, u1 = Job(n=10, group=None, seq=0), Job(n=11, group=None, seq=1)
    expected = {j.n: j for j in (a0, a1, a2, u0, u1)}

    clean = check(
        [
            _entry(1, "start", a0),
            _entry(2, "start", u0),
            _entry(3, "start", u1),
            _entry(4, "end", a0),
            _entry(5, "start", a1),
            _entry(6, "end", a1),
            _entry(7, "start", a1, attempt=2),  # a retry before a2: fine
            _entry(8, "end", a1, attempt=2),
            _entry(9, "start", a2),
            _entry(10, "end", a2),
            _entry(11, "end", u0),
            _entry(12, "end", u1),
        ],
        expected,
    )
    assert (clean.order_violations, clean.overlaps, clean.never_run) == (0, 0, 0)
    assert clean.started_more_than_once == 1  # a1's retry
    assert clean.max_ungrouped_concurrency == 2
    assert clean.max_concurrency == 3

    overlap = check(
        [
            _entry(1, "start", a0),
            _entry(2, "start", a1, pid=2),
            _entry(3, "end", a0),
            _entry(4, "end", a1, pid=2),
        ],
        expected,
    )
    assert overlap.overlaps == 1
    assert overlap.max_group_concurrency == 2
    assert overlap.never_run == 3

    overtaken = check(  # a2 overtakes a1, then a0 runs again after a1
        [
            _entry(1, "start", a0),
            _entry(2, "end", a0),
            _entry(3, "start", a2),
            _entry(4, "end", a2),
            _entry(5, "start", a1),
            _entry(6, "end", a1),
            _entry(7, "start", a0, attempt=2),
        ],
        expected,
    )
    assert overtaken.order_violations == 3
    assert overtaken.unfinished == 1
    assert overtaken.started_more_than_once == 1


# -- leaving hands back everything it claimed -------------------------------------


async def test_leaving_while_a_claim_is_in_flight_hands_it_back(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """After ``async with Consumer`` returns, none of its tasks may still be
    RUNNING: "leaving ... hands back what did not finish". A task left
    RUNNING by a consumer that is gone blocks its whole group until its lease
    expires (``lease_ttl``, 30 s by default) and then counts an attempt.

    Each round fills the consumer's slots with handlers that wait, releases
    them (so the consumer claims again at once) and leaves with
    ``grace_period=0`` after a varying number of event-loop turns, so that
    across rounds the exit lands at every stage of a claim round trip,
    including after the server ran the claim but before its reply was read.
    """
    queue = "inv-leave"
    async with aiogroupq.Producer(redis_client, queue=queue) as producer:
        ids = await producer.enqueue_many(
            [aiogroupq.Task("work", i, group=f"g{i % 50}") for i in range(1000)]
        )
    left_running: list[tuple[int, int]] = []
    for turns in (2, 5, 10, 20, 40, 60, 80, 100, 150, 200, 300, 400):
        with anyio.fail_after(LIVENESS):
            await _fill_release_and_leave(redis_url, queue, width=8, turns=turns)
        states = await _statuses(redis_url, queue, ids)
        running = states.get(aiogroupq.TaskState.RUNNING, 0)
        left_running.append((turns, running))
        if running:
            break  # they stay RUNNING until their leases expire: stop here
    print(f"[leave mid-claim] (loop turns, tasks left RUNNING): {left_running}")  # noqa: T201
    assert all(running == 0 for _, running in left_running), (
        f"tasks left RUNNING after the consumer was gone: {left_running}"
    )


async def _fill_release_and_leave(
    redis_url: str, queue: str, *, width: int, turns: int
) -> None:
    busy = 0
    all_busy = anyio.Event()
    release = anyio.Event()

    async def work(payload: int) -> None:
        nonlocal busy
        busy += 1
        if busy >= width:
            all_busy.set()
        await release.wait()

    async with aiogroupq.Consumer(
        redis_url,
        queue=queue,
        handlers={"work": work},
        concurrency=width,
        grace_period=0,
    ):
        await all_busy.wait()
        release.set()  # the slots free up and the consumer claims again
        for _ in range(turns):
            await anyio.lowlevel.checkpoint()


class _Abort(Exception):
    """Raised by a test inside ``async with Consumer`` to leave it by error."""


@pytest.mark.parametrize("how", ["exception", "cancellation"])
async def test_leaving_by_error_hands_back_and_closes(
    redis_url: str, redis_client: redis.asyncio.Redis, how: str
) -> None:
    """Leaving the block by an exception, or by the cancellation of the scope
    around it (a service shutting down), still hands every unfinished task
    back to the front of its group and closes the consumer's connections."""
    queue = f"inv-abort-{how}"
    width = 4
    async with aiogroupq.Producer(redis_client, queue=queue) as producer:
        ids = await producer.enqueue_many(
            [aiogroupq.Task("work", i, group=f"g{i}") for i in range(20)]
        )
    started = 0
    all_in = anyio.Event()

    async def work(payload: int) -> None:
        nonlocal started
        started += 1
        if started == width:
            all_in.set()
        await anyio.sleep_forever()

    # Counted on the server: a socket the consumer failed to close stays
    # open there (a ResourceWarning would only come at garbage collection).
    connections_before = len(await redis_client.client_list())
    with anyio.fail_after(LIVENESS), anyio.CancelScope() as scope:
        try:
            async with aiogroupq.Consumer(
                redis_url,
                queue=queue,
                handlers={"work": work},
                concurrency=width,
                grace_period=5.0,
            ):
                await all_in.wait()
                if how == "exception":
                    raise _Abort
                scope.cancel()
                await anyio.sleep_forever()
        except _Abort:
            pass
    # The server notices closed sockets asynchronously: give it a moment.
    connections_after = -1
    with anyio.move_on_after(5):
        while True:
            connections_after = len(await redis_client.client_list())
            if connections_after <= connections_before:
                break
            await anyio.sleep(0.02)
    states = await _statuses(redis_url, queue, ids)
    print(  # noqa: T201
        f"[leave by {how}] states={states} server connections "
        f"before={connections_before} after={connections_after}"
    )
    assert states == {aiogroupq.TaskState.QUEUED: len(ids)}
    assert connections_after == connections_before, "connections left open"
