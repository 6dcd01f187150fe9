"""A journal of handler runs, shared by every process of a test, and its checker.

Handlers call :meth:`Journal.run` around their body. Each start and each end is
ONE atomic Redis call (a small Lua script): ``INCR`` a clock key and append
``<clock> <record>`` to a list. The clock therefore orders every event of every
process on one timeline, the Redis server's, with no reliance on local clocks.

Why this timeline can be trusted to judge the queue: a handler's start event
is written after its task was claimed and its end event before the handler
returns, i.e. before its acknowledgement is sent. So if the library keeps a
group exclusive and ordered, the journal can never show an overlap or an
inversion; one the journal shows did happen.

The keys live outside the queue's prefix (``test:journal…``), so the queue's
own scripts never see them, and the per-test ``flushdb`` clears them.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

import anyio
import msgspec
import redis.asyncio
import redis.exceptions
from redis.asyncio.cluster import RedisCluster

import aiogroupq
from aiogroupq._store.connection import cluster_glitches
from aiogroupq.testing._journal import GroupWatch

JOURNAL_KEY = "test:journal"
#: sends of one record before its error stands (see Journal.record)
_RECORD_TRIES = 5

# KEYS: clock, journal list, set of task numbers whose handler returned.
# ARGV: the record (JSON without the clock), the task number to add to the
# "done" set ("" for none). Returns the clock value of this event.
_APPEND_LUA = """
if ARGV[3] and redis.call('SADD', KEYS[4], ARGV[3]) == 0 then
  return -1
end
local clock = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], clock .. ' ' .. ARGV[1])
if ARGV[2] ~= '' then redis.call('SADD', KEYS[3], ARGV[2]) end
return clock
"""

# KEYS: clock, list of marks. ARGV: the mark's label. Returns its clock value.
_MARK_LUA = """
local clock = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], clock .. ' ' .. ARGV[1])
return clock
"""

EventKind = Literal["start", "end"]


class Job(msgspec.Struct, frozen=True):
    """The payload of every journaled task.

    :ivar n: unique number of the task within the test
    :ivar group: the group it was enqueued with (``None``: ungrouped)
    :ivar seq: its position in its group's enqueue order, from 0
    :ivar sleep_ms: how long the handler sleeps, so that runs overlap in time
    :ivar fail_until: the handler raises while its attempt is below this
    """

    n: int
    group: str | None
    seq: int
    sleep_ms: float = 0.0
    fail_until: int = 0


class _Record(msgspec.Struct, array_like=True, frozen=True):
    event: EventKind
    n: int
    group: str | None
    seq: int
    pid: int
    attempt: int
    meta_group: str | None  # what aiogroupq.current_task() said
    ok: bool  # end events: did the handler body return normally?
    task_id: str
    started_ms: int = 0  # the claim's server time (current_task().started_at)
    token: int = 0  # the claim's fencing token: claims are ordered by it


@dataclass(frozen=True, slots=True)
class Entry:
    """One journal event, as read back."""

    clock: int
    event: EventKind
    n: int
    group: str | None
    seq: int
    pid: int
    attempt: int
    meta_group: str | None
    ok: bool
    task_id: str
    started_ms: int = 0
    token: int = 0


class HandlerFailure(Exception):
    """Raised on purpose by a handler whose job says it must fail."""


Client = redis.asyncio.Redis | RedisCluster


def client_for(url: str) -> Client:
    """A client of *url*: a ``redis+cluster://`` URL gives a cluster client
    (seeded with its first node). On a cluster, give the journal a key with a
    hash tag (``{test:journal}``), so that its keys share one slot."""
    if url.startswith("redis+cluster://"):
        first = url.removeprefix("redis+cluster://").split("/")[0].split(",")[0]
        return RedisCluster.from_url(f"redis://{first}/0")
    return redis.asyncio.Redis.from_url(url)


class Journal:
    """Writes and reads the journal through one ``redis.asyncio`` client."""

    def __init__(self, client: Client, *, key: str = JOURNAL_KEY):
        self._client = client
        self._keys = (f"{key}:clock", key, f"{key}:done", f"{key}:ids")
        self._marks_key = f"{key}:marks"
        self._append = client.register_script(_APPEND_LUA)
        self._mark = client.register_script(_MARK_LUA)

    async def mark(self, label: str) -> int:
        """Put a named point on the journal's timeline (e.g. "paused");
        returns its clock value."""
        return int(
            await self._mark(keys=(self._keys[0], self._marks_key), args=(label,))
        )

    async def marks(self) -> dict[str, int]:
        """Every mark, label -> clock value."""
        out = {}
        for line in await self._client.lrange(self._marks_key, 0, -1):
            assert isinstance(line, bytes)  # the client does not decode replies
            clock, _, label = line.partition(b" ")
            out[label.decode()] = int(clock)
        return out

    async def record(
        self,
        event: EventKind,
        job: Job,
        *,
        ok: bool = True,
        info: aiogroupq.TaskInfo | None = None,
    ) -> int:
        """Append one event for the task whose handler runs in this context,
        or for *info*'s (a task of a batch other than its first)."""
        info = info or aiogroupq.current_task()
        record = _Record(
            event=event,
            n=job.n,
            group=job.group,
            seq=job.seq,
            pid=os.getpid(),
            attempt=info.attempt,
            meta_group=info.group,
            ok=ok,
            task_id=info.id,
            started_ms=round(info.started_at * 1000),
            token=info.fencing_token,
        )
        done = str(job.n) if event == "end" and ok else ""
        # A unique id per record: a client that sends the script again after
        # a lost reply (redis-py's cluster client re-sends after a connection
        # error) must not journal one start twice.
        args = (msgspec.json.encode(record), done, secrets.token_hex(8))
        # A cluster client may close a connection this call is writing to
        # (redis-py re-initialising its nodes); on Python 3.13 that write
        # fails inside asyncio, out of redis-py's own retry. The id makes a
        # re-send harmless; a lost record would read as a run with no end.
        for attempt in range(_RECORD_TRIES):
            try:
                with cluster_glitches():
                    return int(await self._append(keys=self._keys, args=args))
            except redis.exceptions.ConnectionError:
                if attempt == _RECORD_TRIES - 1:
                    raise
                await anyio.sleep(0.05)
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def run(self, job: Job) -> AsyncIterator[aiogroupq.TaskInfo]:
        """Journal a start, run the body, journal an end (even on error)."""
        # Shielded: cancelled while awaiting the reply, the start would be in
        # the journal with no end ever written (the Lua ran, we just did not
        # hear back). Shielded, the cancellation lands in the body instead,
        # and the end below is written.
        with anyio.CancelScope(shield=True):
            await self.record("start", job)
        ok = False
        try:
            yield aiogroupq.current_task()
            ok = True
        finally:
            # Shielded: a cancelled handler (shutdown, lost lease) still
            # closes its interval, or the checker would see a run that never
            # ends and count every later start of its group as an overlap.
            with anyio.CancelScope(shield=True):
                await self.record("end", job, ok=ok)

    async def done_count(self) -> int:
        """How many distinct tasks had a handler return normally."""
        return int(await self._client.scard(self._keys[2]))

    async def wait_done(self, total: int, *, poll: float = 0.02) -> None:
        """Wait until *total* distinct tasks are done (callers bound the wait)."""
        # The done set lives in Redis and is filled by other processes too:
        # there is no local event to wait on, so poll it.
        while True:
            if await self.done_count() >= total:
                return
            await anyio.sleep(poll)

    async def entries(self) -> list[Entry]:
        """Every event so far, in clock order."""
        out = []
        for line in await self._client.lrange(self._keys[1], 0, -1):
            assert isinstance(line, bytes)  # the client does not decode replies
            clock, _, body = line.partition(b" ")
            r = msgspec.json.decode(body, type=_Record)
            out.append(
                Entry(
                    int(clock),
                    r.event,
                    r.n,
                    r.group,
                    r.seq,
                    r.pid,
                    r.attempt,
                    r.meta_group,
                    r.ok,
                    r.task_id,
                    r.started_ms,
                    r.token,
                )
            )
        out.sort(key=lambda e: e.clock)  # already in order; cheap insurance
        return out


def make_handlers(journal: Journal) -> dict[str, Callable[[Job], Awaitable[None]]]:
    """The standard handler: journal the run, sleep as told, fail as told."""

    async def work(job: Job) -> None:
        async with journal.run(job) as info:
            if job.sleep_ms > 0:
                await anyio.sleep(job.sleep_ms / 1000)
            if info.attempt < job.fail_until:
                raise HandlerFailure(f"task {job.n} fails attempt {info.attempt}")

    return {"work": work}


@dataclass(frozen=True, slots=True)
class Figures:
    """What the journal says about the invariants (see :func:`check`).

    :ivar tasks: tasks the test expected to run
    :ivar started: distinct expected tasks that started at least once
    :ivar starts: start events in all
    :ivar started_more_than_once: tasks with more than one start event
    :ivar never_run: expected tasks that never started
    :ivar unexpected: start events of tasks the test did not enqueue
    :ivar unfinished: start events without a matching end event
    :ivar failed_runs: runs whose handler raised
    :ivar order_violations: grouped starts out of enqueue order (see check)
    :ivar overlaps: starts while another run of the same group was running
    :ivar meta_mismatches: runs where current_task().group != enqueued group
    :ivar max_group_concurrency: most runs of one group at once (must be 1)
    :ivar max_ungrouped_concurrency: most ungrouped runs at once
    :ivar max_concurrency: most runs at once, all tasks together
    :ivar groups: distinct groups that started
    :ivar processes: distinct processes that ran handlers
    """

    tasks: int
    started: int
    starts: int
    started_more_than_once: int
    never_run: int
    unexpected: int
    unfinished: int
    failed_runs: int
    order_violations: int
    overlaps: int
    meta_mismatches: int
    max_group_concurrency: int
    max_ungrouped_concurrency: int
    max_concurrency: int
    groups: int
    processes: int


def check(entries: Iterable[Entry], expected: Mapping[int, Job]) -> Figures:
    """Turn the journal into figures.

    Group order: per group, a start must be either a re-start of the group's
    current task (a retry, which must come before any later task) or the
    start of the next task in enqueue order. Anything else (a later task
    overtaking, a skipped task, an older task coming back after a later one
    started) counts as one violation.

    Overlap: a start of a group's task while a run of that group has started
    and not yet ended.

    Both are followed with the library's own checker
    (:class:`aiogroupq.testing._journal.GroupWatch`), as the demo and
    ``assert_group_order`` follow them.
    """
    starts_of: Counter[int] = Counter()
    # A run is one claim in one process: an end closes the run of its task,
    # attempt and process.
    watch: GroupWatch[tuple[int, int, int], Entry] = GroupWatch()
    starts = unexpected = failed = order_violations = overlaps = mismatches = 0
    max_group = max_ungrouped = max_all = 0
    groups: set[str] = set()
    pids: set[int] = set()
    for e in sorted(entries, key=lambda e: e.clock):
        run_key = (e.n, e.attempt, e.pid)
        if e.event == "end":
            # (an end without a start is not a run we can place)
            if watch.close(e.group, run_key) is not None and not e.ok:
                failed += 1
            continue
        starts += 1
        starts_of[e.n] += 1
        pids.add(e.pid)
        if e.n not in expected:
            unexpected += 1
        if e.meta_group != e.group:
            mismatches += 1
        others = watch.open(e.group, run_key, e)
        max_all = max(max_all, watch.open_count)
        if e.group is None:
            max_ungrouped = max(max_ungrouped, len(others) + 1)
            continue
        groups.add(e.group)
        if others:
            overlaps += 1
        max_group = max(max_group, len(others) + 1)
        reached = watch.place(e.group, e.seq, e)
        current = -1 if reached is None else reached.position
        if e.seq not in (current, current + 1):  # neither a retry nor the next
            order_violations += 1
    started = sum(1 for n in expected if starts_of.get(n, 0) > 0)
    return Figures(
        tasks=len(expected),
        started=started,
        starts=starts,
        started_more_than_once=sum(1 for c in starts_of.values() if c > 1),
        never_run=len(expected) - started,
        unexpected=unexpected,
        unfinished=watch.open_count,
        failed_runs=failed,
        order_violations=order_violations,
        overlaps=overlaps,
        meta_mismatches=mismatches,
        max_group_concurrency=max_group,
        max_ungrouped_concurrency=max_ungrouped,
        max_concurrency=max_all,
        groups=len(groups),
        processes=len(pids),
    )


# -- consumer processes -------------------------------------------------------


class Flag(Protocol):
    """The part of ``multiprocessing.synchronize.Event`` used here."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Options:
    """More settings of a journaling consumer process (picklable)."""

    partitions: int | None = None
    durability: Literal["primary", "replicated"] = "primary"
    journal_key: str = JOURNAL_KEY
    lease_ttl: float = 30.0


def consume_in_process(
    url: str,
    queue: str,
    concurrency: int,
    ready: Flag,
    stop: Flag,
    retry_backoff: float = 1.0,
    options: Options = Options(),
) -> None:
    """Target of a ``spawn`` child: consume *queue* until *stop* is set.

    *ready* is set once the consumer is claiming, so the parent can enqueue
    knowing every process competes for the tasks from the start.
    """
    anyio.run(
        _consume,
        url,
        queue,
        concurrency,
        ready,
        stop,
        retry_backoff,
        options,
        backend="asyncio",
    )


async def _consume(
    url: str,
    queue: str,
    concurrency: int,
    ready: Flag,
    stop: Flag,
    retry_backoff: float,
    options: Options,
) -> None:
    client = client_for(url)
    try:
        journal = Journal(client, key=options.journal_key)
        async with aiogroupq.Consumer(
            url,
            queue=queue,
            handlers=make_handlers(journal),
            concurrency=concurrency,
            grace_period=10.0,
            retry_backoff=retry_backoff,
            partitions=options.partitions,
            durability=options.durability,
            lease_ttl=options.lease_ttl,
        ):
            ready.set()
            # A multiprocessing Event cannot be awaited; polling it is cheap.
            while True:
                if stop.is_set():
                    break
                await anyio.sleep(0.05)
    finally:
        await client.aclose()


@asynccontextmanager
async def spawned(
    target: Callable[..., None],
    args: Callable[[Flag, Flag], tuple[object, ...]],
    processes: int,
) -> AsyncIterator[list[multiprocessing.process.BaseProcess]]:
    """*processes* ``spawn`` children running ``target(*args(ready, stop))``,
    each having set its *ready* when the block begins; *stop* set after,
    and each joined (killed after 30 s). Neither outlives a crashed test."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    readies = [ctx.Event() for _ in range(processes)]
    procs = [
        ctx.Process(target=target, args=args(ready, stop), daemon=True)
        for ready in readies
    ]
    for proc in procs:
        proc.start()
    try:
        with anyio.fail_after(60):
            while not all(ready.is_set() for ready in readies):
                if any(p.exitcode is not None for p in procs):
                    raise RuntimeError("a consumer process died while starting")
                await anyio.sleep(0.02)
        yield list(procs)
    finally:
        stop.set()
        for proc in procs:
            await anyio.to_thread.run_sync(proc.join, 30)
            if proc.is_alive():
                proc.kill()


@asynccontextmanager
async def consumer_processes(
    url: str,
    queue: str,
    *,
    processes: int = 3,
    concurrency: int = 8,
    retry_backoff: float = 1.0,
    options: Options = Options(),
) -> AsyncIterator[list[multiprocessing.process.BaseProcess]]:
    """*processes* spawned consumer processes journaling their runs, all
    claiming when the block begins; stopped (and checked to exit 0) after."""

    def args(ready: Flag, stop: Flag) -> tuple[object, ...]:
        return (url, queue, concurrency, ready, stop, retry_backoff, options)

    async with spawned(consume_in_process, args, processes) as procs:
        yield procs
    assert [p.exitcode for p in procs] == [0] * processes
