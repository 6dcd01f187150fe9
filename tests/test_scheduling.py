"""Group scheduling: fairness between groups and the group controls.

Fairness is checked twice: exactly, with the scripts alone (a new group
waits for at most one turn of each group already waiting), and across
consumer processes from the journal. Each control (concurrency, rate limit,
pause, max size, priority, expiry, unique dedup) runs against real consumer
processes, judged by counts over the journal's timeline, never by elapsed
time (timeouts are liveness bounds only).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence

import anyio
import pytest
import redis.asyncio
from hypothesis import HealthCheck, given, settings, strategies as st

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.replies import FinishCode
from aiogroupq._work.handlers import build_routes
from aiogroupq._work.runner import RetryPolicy, run_task
from aiogroupq._work.running import Running

from ._journal import Entry, Job, Journal, check, consumer_processes, make_handlers
from ._tasks import envelope_of

LIVENESS = 60.0


def _show(name: str, **figures: object) -> None:
    print(f"[{name}] " + " ".join(f"{k}={v}" for k, v in figures.items()))  # noqa: T201


def _starts(entries: Sequence[Entry]) -> list[Entry]:
    return [e for e in entries if e.event == "start"]


async def _enqueue(
    producer: aiogroupq.Producer, jobs: Sequence[Job], **options: object
) -> list[str]:
    tasks = [
        aiogroupq.Task("work", job, group=job.group, **options)  # type: ignore[arg-type]
        for job in jobs
    ]
    ids: list[str] = []
    for start in range(0, len(tasks), 500):
        ids += await producer.enqueue_many(tasks[start : start + 500])
    return ids


def _backlog(groups: Sequence[str], per_group: int, start: int = 0) -> list[Job]:
    """*per_group* jobs of each group, interleaved, numbered from *start*."""
    jobs = []
    n = start
    for seq in range(per_group):
        for g in groups:
            jobs.append(Job(n=n, group=g, seq=seq, sleep_ms=2))
            n += 1
    return jobs


# -- fairness, exactly: the scripts alone ----------------------------------------

FAIR = QueueKeys("fair")


async def _simulate(
    client: redis.asyncio.Redis,
    backlogs: Sequence[int],
    slots: int,
    warmup: int,
    *,
    drain: bool = False,
) -> tuple[int, int]:
    """Groups with *backlogs* served by *slots* handlers that finish in claim
    order; after *warmup* finishes a new group's task arrives. Returns (tasks
    of other groups claimed between its arrival and its claim, groups that
    still had work at its arrival)."""
    await client.flushdb()
    await _scripts.control(
        client, FAIR, "queue", "drain" if drain else "", "", "", "", ""
    )
    ids = itertools.count()

    def new(group: str) -> _scripts.NewTask:
        task_id = f"t{next(ids):05d}"
        return _scripts.NewTask(task_id, group, envelope_of(task_id), 0, 1, None)

    left = {f"g{i}": n for i, n in enumerate(backlogs)}
    batch = [new(g) for g, n in left.items() for _ in range(n)]
    await _scripts.enqueue(client, FAIR, batch, dedup_window_ms=60_000)
    running: list[_scripts.Claimed] = []
    finished = 0
    arrival: str | None = None
    waited = ahead = 0
    while True:
        if arrival is None and (finished >= warmup or (not running and finished)):
            ahead = sum(1 for n in left.values() if n > 0)
            task = new("newcomer")
            arrival = task.id
            await _scripts.enqueue(client, FAIR, [task], dedup_window_ms=60_000)
        free = slots - len(running)
        if free:
            reply = await _scripts.claim(
                client, FAIR, "c", k=free, lease_ms=600_000, scan_limit=100
            )
            for claimed in reply.tasks:
                if claimed.id == arrival:
                    return waited, ahead
                if arrival is not None:
                    waited += 1
            running += reply.tasks
        assert running, "nothing runnable, yet the newcomer never started"
        done = running.pop(0)
        codes = await _scripts.finish(
            client, FAIR, [_scripts.Outcome(done.id, done.token, "ok")], retention_ms=0
        )
        assert codes == [FinishCode.APPLIED]
        finished += 1
        group: bytes = await client.hget(FAIR.task(done.id), "g") or b""  # type: ignore[assignment]
        left[group.decode()] -= 1


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    backlogs=st.lists(st.integers(1, 12), min_size=1, max_size=7),
    slots=st.integers(1, 4),
    warmup=st.integers(0, 15),
)
async def test_a_new_group_waits_at_most_one_turn_of_each_waiting_group(
    redis_client: redis.asyncio.Redis,
    backlogs: list[int],
    slots: int,
    warmup: int,
) -> None:
    """Round-robin: whatever the backlogs and the number of handlers, a group
    arriving later starts after at most one task of each group that had work
    when it arrived."""
    waited, ahead = await _simulate(redis_client, backlogs, slots, warmup)
    assert waited <= ahead, (waited, ahead)


async def test_drain_finishes_busy_groups_first(
    redis_client: redis.asyncio.Redis,
) -> None:
    """fairness="drain" keeps the old order: a group's next task goes first,
    so a newcomer waits behind whole backlogs (the trade-off it documents)."""
    round_robin = await _simulate(redis_client, [10, 10, 10, 10], 1, 3)
    drain = await _simulate(redis_client, [10, 10, 10, 10], 1, 3, drain=True)
    _show("fairness", round_robin_waited=round_robin[0], drain_waited=drain[0])
    assert round_robin[0] <= 4
    assert drain[0] >= 10


# -- fairness across processes ----------------------------------------------------


@pytest.mark.slow
async def test_newcomer_starts_within_a_turn_across_processes(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """3 processes x 2 handlers drain 8 busy groups; a group enqueued midway
    starts after at most one task of each busy group plus the runs already
    being claimed when it arrived (one per handler)."""
    queue, busy = "fair-mp", [f"b{i}" for i in range(8)]
    journal = Journal(redis_client)
    jobs = _backlog(busy, 40)
    newcomer = Job(n=len(jobs), group="newcomer", seq=0)
    async with (
        consumer_processes(redis_url, queue, processes=3, concurrency=2),
        aiogroupq.Producer(redis_url, queue=queue) as producer,
    ):
        await _enqueue(producer, jobs)
        with anyio.fail_after(LIVENESS):
            while await journal.done_count() < len(jobs) // 5:
                await anyio.sleep(0.01)
            await journal.mark("arrival")
            await producer.enqueue("work", newcomer, group="newcomer")
            await journal.wait_done(len(jobs) + 1)
    entries = await journal.entries()
    arrival = (await journal.marks())["arrival"]
    start = next(e.clock for e in _starts(entries) if e.n == newcomer.n)
    waited = sum(1 for e in _starts(entries) if arrival < e.clock < start)
    figures = check(entries, {j.n: j for j in [*jobs, newcomer]})
    _show("fairness-mp", waited=waited, busy_groups=len(busy), handlers=6)
    assert figures.order_violations == figures.overlaps == 0
    assert waited <= len(busy) + 6


# -- group concurrency --------------------------------------------------------------


@pytest.mark.slow
async def test_group_concurrency_is_never_exceeded_and_starts_stay_in_order(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "conc"
    limits = {"two": 2, "three": 3, "one": 1}
    async with aiogroupq.Admin(redis_url, queue=queue) as admin:
        for group, limit in limits.items():
            await admin.set_group(group, concurrency=limit)
    journal = Journal(redis_client)
    jobs = [
        Job(n=n, group=g, seq=seq, sleep_ms=15)
        for n, (seq, g) in enumerate(itertools.product(range(30), limits))
    ]
    async with (
        consumer_processes(redis_url, queue, processes=3, concurrency=8),
        aiogroupq.Producer(redis_url, queue=queue) as producer,
    ):
        await _enqueue(producer, jobs)
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(len(jobs))
    entries = await journal.entries()
    most: dict[str, int] = defaultdict(int)
    running: dict[str, int] = defaultdict(int)
    for e in entries:
        assert e.group is not None
        running[e.group] += 1 if e.event == "start" else -1
        most[e.group] = max(most[e.group], running[e.group])
    # Claims are ordered by their fencing tokens (a handler may journal its
    # start after one claimed later by another process does).
    order_violations = 0
    for group in limits:
        seqs = [
            e.seq
            for e in sorted(_starts(entries), key=lambda e: e.token)
            if e.group == group
        ]
        order_violations += sum(1 for a, b in itertools.pairwise(seqs) if b != a + 1)
    _show("concurrency", most=dict(most), order_violations=order_violations)
    assert order_violations == 0
    assert dict(most) == limits  # reached, never exceeded


# -- rate limits ---------------------------------------------------------------------


@pytest.mark.slow
async def test_rate_is_never_exceeded_in_any_window_and_others_run_meanwhile(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """3 starts per 300 ms for group "slow", none for the others: counted on
    the server's clock at each claim, no window of 300 ms holds 4 starts,
    and unlimited work enqueued behind it finishes while it waits."""
    queue, limit, period = "rate", 3, 0.3
    async with aiogroupq.Admin(redis_url, queue=queue) as admin:
        await admin.set_group("slow", rate=aiogroupq.Rate(limit, period))
    journal = Journal(redis_client)
    slow = [Job(n=n, group="slow", seq=n) for n in range(15)]
    free = [Job(n=100 + n, group=f"f{n}", seq=0) for n in range(60)]
    async with (
        consumer_processes(redis_url, queue, processes=3, concurrency=4),
        aiogroupq.Producer(redis_url, queue=queue) as producer,
    ):
        await _enqueue(producer, slow)
        await _enqueue(producer, free)
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(len(slow) + len(free))
    entries = await journal.entries()
    times = sorted(e.started_ms for e in _starts(entries) if e.group == "slow")
    worst = max(
        sum(1 for t in times if start <= t < start + period * 1000) for start in times
    )
    slow_starts = [e.clock for e in _starts(entries) if e.group == "slow"]
    free_ends = [e.clock for e in entries if e.event == "end" and e.n >= 100]
    _show("rate", starts=len(times), most_in_a_window=worst, limit=limit)
    assert len(times) == len(slow)
    assert worst <= limit
    assert check(entries, {j.n: j for j in [*slow, *free]}).order_violations == 0
    # Not blocked: the free groups were done long before the slow one was.
    assert max(free_ends) < slow_starts[2 * limit]


# -- pause and resume ----------------------------------------------------------------


@pytest.mark.slow
async def test_paused_group_starts_nothing_and_resumes_in_order(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "pause"
    journal = Journal(redis_client)
    held = [Job(n=n, group="held", seq=n, sleep_ms=5) for n in range(20)]
    other = [Job(n=100 + n, group=f"o{n % 5}", seq=n // 5) for n in range(40)]
    async with (
        aiogroupq.Admin(redis_url, queue=queue) as admin,
        consumer_processes(redis_url, queue, processes=2, concurrency=4),
        aiogroupq.Producer(redis_url, queue=queue) as producer,
    ):
        await _enqueue(producer, held)
        with anyio.fail_after(LIVENESS):
            while await journal.done_count() < 3:
                await anyio.sleep(0.005)
        await admin.pause_group("held")
        paused = await journal.mark("paused")
        assert (await admin.group_settings("held")).paused
        await _enqueue(producer, other)
        with anyio.fail_after(LIVENESS):
            while await journal.done_count() < len(other) + 3:
                await anyio.sleep(0.01)
        await anyio.sleep(0.2)  # time for a wrongly started task to show
        resumed = await journal.mark("resumed")
        await admin.resume_group("held")
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(len(held) + len(other))
    entries = await journal.entries()
    # Exact: pause_group returns once no task of the group can start, not
    # even one its consumer claimed just before the pause.
    late = [
        e for e in _starts(entries) if e.group == "held" and paused < e.clock < resumed
    ]
    figures = check(entries, {j.n: j for j in [*held, *other]})
    _show("pause", started_while_paused=len(late))
    assert late == []
    assert figures.order_violations == figures.overlaps == 0
    assert figures.started == len(held) + len(other)


async def test_a_grouped_claim_starts_within_its_window_or_goes_back() -> None:
    # What makes a pause exact: a pause waits out the start window of the
    # group's claims, and a task not started within it never starts.
    started: list[str] = []
    submitted: list[_scripts.Outcome] = []

    async def handler() -> None:
        started.append(aiogroupq.current_task().id)

    routes = build_routes({"t": handler})
    past = anyio.current_time() - 0.001
    for task_id, group in (("grouped", "g"), ("alone", None)):
        claimed = _scripts.Claimed(task_id, envelope_of(task_id, group), 1, 1)
        await run_task(
            Running(claimed, start_by=past),
            routes,
            RetryPolicy(1.0, 1.0),
            lambda outcome, _notice: submitted.append(outcome),
            max_payload_bytes=1024,
        )
    # Handed back unstarted, its attempt uncounted; an ungrouped task has no
    # pause to wait for it and runs.
    assert [(o.id, o.kind) for o in submitted] == [("grouped", "back"), ("alone", "ok")]
    assert started == ["alone"]


@pytest.mark.slow
async def test_paused_queue_starts_nothing(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "qpause"
    journal = Journal(redis_client)
    jobs = [Job(n=n, group=None, seq=0) for n in range(30)]
    async with (
        aiogroupq.Admin(redis_url, queue=queue) as admin,
        consumer_processes(redis_url, queue, processes=2, concurrency=4),
        aiogroupq.Producer(redis_url, queue=queue) as producer,
    ):
        await admin.pause()
        assert (await admin.settings()).paused
        await _enqueue(producer, jobs)
        await anyio.sleep(1.5)  # more than a blocked fetcher's timeout
        assert await journal.entries() == []
        await admin.resume()
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(len(jobs))


# -- max group size ------------------------------------------------------------------


async def test_group_over_its_max_size_is_refused_and_nothing_is_written(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "cap"
    async with (
        aiogroupq.Admin(redis_url, queue=queue) as admin,
        aiogroupq.Producer(redis_url, queue=queue) as producer,
    ):
        await admin.set_group("capped", max_size=3)
        for n in range(3):
            await producer.enqueue("work", n, group="capped")
        before = await redis_client.dbsize()
        with pytest.raises(aiogroupq.GroupFullError) as info:
            await producer.enqueue("work", 3, group="capped")
        assert (info.value.group, info.value.size, info.value.cap) == ("capped", 3, 3)
        assert isinstance(info.value, aiogroupq.QueueFullError)
        # A batch that would cross the cap is refused whole.
        with pytest.raises(aiogroupq.GroupFullError):
            await producer.enqueue_many(
                [
                    aiogroupq.Task("work", "free", group="other"),
                    aiogroupq.Task("work", 4, group="capped", delay=60),
                ]
            )
        assert await redis_client.dbsize() == before
        await producer.enqueue("work", "free", group="other")  # others unaffected
        assert (await admin.group_settings("capped")).max_size == 3


# -- priorities ----------------------------------------------------------------------


async def test_higher_priority_heads_start_first_and_groups_stay_fifo(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """One handler at a time, so the start order is the claim order: every
    priority-9 head before priority 5 before 0, FIFO within a level, and a
    group's tasks in enqueue order whatever their priorities."""
    queue = "prio"
    journal = Journal(redis_client)
    plan = [
        (Job(n=0, group=None, seq=0), 0),
        (Job(n=1, group=None, seq=0), 9),
        (Job(n=2, group="g", seq=0), 0),
        (Job(n=3, group="g", seq=1), 9),  # behind n=2 whatever its priority
        (Job(n=4, group=None, seq=0), 5),
        (Job(n=5, group=None, seq=0), 9),
    ]
    async with aiogroupq.Producer(redis_url, queue=queue) as producer:
        for job, priority in plan:
            await producer.enqueue("work", job, group=job.group, priority=priority)
    async with aiogroupq.Consumer(
        redis_url, queue=queue, handlers=make_handlers(journal), concurrency=1
    ):
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(len(plan))
    order = [e.n for e in _starts(await journal.entries())]
    _show("priorities", order=order)
    # 1 and 5 (9) first in order, then 4 (5), then the 0s: 0, then g's head 2,
    # and g's second task 3 (priority 9) only after its head, at once.
    assert order == [1, 5, 4, 0, 2, 3]


async def test_priority_aging_lets_old_low_priority_tasks_through(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "aging"
    journal = Journal(redis_client)
    async with (
        aiogroupq.Admin(redis_url, queue=queue) as admin,
        aiogroupq.Producer(redis_url, queue=queue) as producer,
    ):
        await admin.configure(priority_aging=0.05)
        assert (await admin.settings()).priority_aging == 0.05
        await producer.enqueue("work", Job(n=0, group=None, seq=0), priority=0)
        await anyio.sleep(0.3)  # the old task has aged past 5 levels
        await producer.enqueue("work", Job(n=1, group=None, seq=0), priority=5)
    async with aiogroupq.Consumer(
        redis_url, queue=queue, handlers=make_handlers(journal), concurrency=1
    ):
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(2)
    assert [e.n for e in _starts(await journal.entries())] == [0, 1]


# -- expiry --------------------------------------------------------------------------


@pytest.mark.slow
async def test_expired_tasks_never_start_and_their_group_moves_on(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "expiry"
    journal = Journal(redis_client)
    blocker = Job(n=0, group="g", seq=0, sleep_ms=600)
    doomed = [Job(n=1 + n, group="g", seq=1 + n) for n in range(5)]
    last = Job(n=10, group="g", seq=6)
    async with (
        consumer_processes(redis_url, queue, processes=2, concurrency=4),
        aiogroupq.Producer(redis_url, queue=queue) as producer,
        aiogroupq.Admin(redis_url, queue=queue) as admin,
    ):
        # Held until the doomed are past their expiry, however slow the
        # machine (the blocker alone held them only for its 600 ms).
        await admin.pause_group("g")
        await producer.enqueue("work", blocker, group="g")
        doomed_ids = await _enqueue(producer, doomed, expires=0.2)
        await producer.enqueue("work", last, group="g", expires=3600)
        await anyio.sleep(0.3)  # only that 0.2 s have passed, on any machine
        await admin.resume_group("g")
        with anyio.fail_after(LIVENESS):
            await journal.wait_done(2)
            states = [await producer.status(i) for i in doomed_ids]
        with pytest.raises(aiogroupq.TaskExpiredError):
            await producer.result(doomed_ids[0], timeout=1)
    started = {e.n for e in _starts(await journal.entries())}
    _show("expiry", started=sorted(started), states=[str(s) for s in states])
    assert started == {0, 10}
    assert states == [aiogroupq.TaskState.EXPIRED] * len(doomed)


# -- unique while queued -------------------------------------------------------------


async def test_unique_dedup_key_holds_until_the_task_ends(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "unique"
    journal = Journal(redis_client)
    async with aiogroupq.Producer(redis_url, queue=queue, dedup_window=0.05) as p:
        first = await p.enqueue(
            "work", Job(n=0, group=None, seq=0), dedup_key="k", unique=True
        )
        await anyio.sleep(0.2)  # past the dedup window: unique ignores it
        again = await p.enqueue(
            "work", Job(n=1, group=None, seq=0), dedup_key="k", unique=True
        )
        assert again == first
        async with aiogroupq.Consumer(
            redis_url, queue=queue, handlers=make_handlers(journal), concurrency=1
        ):
            with anyio.fail_after(LIVENESS):
                await journal.wait_done(1)
                while await p.status(first) is not aiogroupq.TaskState.SUCCEEDED:
                    await anyio.sleep(0.01)
        later = await p.enqueue(
            "work", Job(n=2, group=None, seq=0), dedup_key="k", unique=True
        )
        assert later != first
        with pytest.raises(aiogroupq.InvalidTaskError):
            await p.enqueue("work", 1, unique=True)  # unique by what?
