"""``aiogroupq demo``: a mixed workload, consumed by worker processes, verified.

The parent enqueues the plan (a few hot groups holding a large share, many
small groups, ungrouped tasks) and runs ``aiogroupq worker
aiogroupq._cli.demo:worker --processes N``. Every handler journals its start and
end in one Lua call that takes a number from a global logical clock (``INCR``)
and the server's ``TIME``. The parent reads the journal after the workers have
stopped and checks, without trusting the library's own bookkeeping: each task
started once and ended once, a group's tasks started in enqueue order, and no
task of a group started while another one of it was running. It also checks
that every task's state is ``succeeded`` (read in pipelines, with progress).

It says what it does before each step (starting the server, starting the
worker processes, enqueueing), then shows progress: while no task has started
yet, that the workers are still starting; at the end, once every task left
belongs to a few groups (the hot ones), that these run one task at a time by
design, which is why the rate drops. Progress is redrawn in place on a
terminal and printed as plain lines once a second otherwise. SIGINT (Ctrl-C), SIGTERM and SIGHUP (a closed terminal)
stop the run within about a second: the workers are stopped (killed if
they linger), the throwaway server is stopped and the temporary files are
removed; the exit status is 128 + the signal number.
"""

from __future__ import annotations

__all__ = (
    "Job",
    "Remaining",
    "Verdict",
    "make_plan",
    "progress_line",
    "run_demo",
    "tail_line",
    "verify",
    "worker",
)

import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import ExitStack, asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

import anyio
import msgspec
import redis.asyncio
from anyio.abc import Process
from redis.exceptions import RedisError

import aiogroupq

from .._store.keys import QueueKeys
from ..testing._journal import GroupWatch
from ..testing._server import ServerProcess, ServerStartError
from .demo_console import Console, Interrupted, StopSignals

#: tasks per ``enqueue_many`` round trip
BATCH: Final = 1_000
#: give up when no task completes for this long (a lost task would hang us)
STALL_TIMEOUT: Final = 60.0
#: the plan's hot groups: how many, and how their names end
HOT_GROUPS: Final = 3
_HOT_SUFFIX: Final = ":bulk-import"

# One atomic step: a clock tick, the server time, and the record. Its keys
# share a hash tag outside the queue's own ``{aiogroupq:<queue>}`` prefix.
_JOURNAL_LUA: Final = """
local clock = redis.call('INCR', KEYS[1])
local now = redis.call('TIME')
redis.call('RPUSH', KEYS[2], clock .. ' ' .. now[1] .. ' ' .. now[2] .. ' ' .. ARGV[1])
if ARGV[2] == 'e' then redis.call('INCR', KEYS[3]) end
return clock
"""


class Job(msgspec.Struct, array_like=True, frozen=True):
    """A demo task's payload.

    :ivar i: the task's index in the enqueue plan
    :ivar group: its group, or ``None``
    :ivar seq: its position among its group's tasks, from 0 (0 if ungrouped)
    :ivar work_us: simulated work in microseconds (0: just yield once)
    :ivar type: its task type
    """

    i: int
    group: str | None
    seq: int
    work_us: int
    type: str


def journal_keys(queue: str) -> tuple[str, str, str]:
    """The clock, journal and done-counter keys of a demo queue."""
    tag = f"{{aiogroupq-demo:{queue}}}"
    return f"{tag}:clock", f"{tag}:journal", f"{tag}:done"


@asynccontextmanager
async def worker(
    *, redis_url: str, queue: str | None, concurrency: int
) -> AsyncIterator[aiogroupq.Consumer]:
    """The demo's Consumer factory for ``aiogroupq worker``.

    :param redis_url: the server
    :param queue: the demo queue (required)
    :param concurrency: handlers at once
    """
    if queue is None:
        raise aiogroupq.ConfigurationError("the demo worker needs --queue")
    keys = journal_keys(queue)
    client = redis.asyncio.Redis.from_url(redis_url)
    journal = client.register_script(_JOURNAL_LUA)

    async def record(event: str, job: Job) -> None:
        attempt = aiogroupq.current_task().attempt
        entry = f"{event} {job.i} {job.seq} {attempt} {job.group or '-'}"
        await journal(keys=keys, args=[entry, event])

    async def handle(job: Job) -> None:
        await record("s", job)
        # Mostly instant, a few take up to 2 ms: like real I/O-bound jobs.
        await anyio.sleep(job.work_us / 1_000_000)
        await record("e", job)

    handlers = {"import_rows": handle, "send_mail": handle, "resize_image": handle}
    try:
        yield aiogroupq.Consumer(
            redis_url,
            queue=queue,
            handlers=handlers,
            concurrency=concurrency,
            grace_period=10.0,
        )
    finally:
        await client.aclose()


# -- the workload ---------------------------------------------------------------


def make_plan(tasks: int, groups: int, rng: random.Random) -> tuple[list[Job], str]:
    """Draw the workload: 3 hot groups of 5 % each, 20 % ungrouped, the rest
    spread over the other groups, all shuffled together; return it in enqueue
    order, and its description.

    :param tasks: how many tasks
    :param groups: how many groups
    :param rng: the random source
    """
    ungrouped = tasks // 5
    grouped = tasks - ungrouped
    hot_groups = min(HOT_GROUPS, groups)
    hot_each = min(tasks // 20, grouped // hot_groups)
    hot = [f"tenant-{k:04d}{_HOT_SUFFIX}" for k in range(hot_groups)]
    cold = [f"tenant-{k:04d}:orders" for k in range(hot_groups, groups)]
    cold_tasks = grouped - hot_groups * hot_each
    labels: list[str | None] = [g for g in hot for _ in range(hot_each)]
    spread = cold or hot  # with 3 groups or fewer, everything is hot
    labels += spread[: min(cold_tasks, len(spread))]  # each group at least once
    labels += rng.choices(spread, k=cold_tasks - min(cold_tasks, len(spread)))
    labels += [None] * ungrouped
    rng.shuffle(labels)
    seqs: Counter[str] = Counter()
    jobs = []
    for i, group in enumerate(labels):
        seq = 0
        if group is not None:
            seq = seqs[group]
            seqs[group] += 1
        work = rng.randint(0, 2_000) if rng.random() < 0.05 else 0
        kind = "import_rows" if group else rng.choice(("send_mail", "resize_image"))
        jobs.append(Job(i, group, seq, work, kind))
    hot_part = f"{hot_groups} hot groups x {hot_each:,}, " if hot_each else ""
    return jobs, (
        f"{tasks:,} tasks: {hot_part}{cold_tasks:,} over "
        f"{min(cold_tasks, len(spread)):,} groups, {ungrouped:,} ungrouped"
    )


def is_hot(group: str) -> bool:
    """Whether *group* is one of the plan's hot groups."""
    return group.endswith(_HOT_SUFFIX)


# -- progress ------------------------------------------------------------------


class Remaining:
    """The tasks left to run, followed from the journal as it grows: whether
    any task has started yet, and whether every task left belongs to a few
    groups (the tail, where the rate drops because a group runs one task at
    a time).

    :param jobs: the plan, in enqueue order
    """

    def __init__(self, jobs: Sequence[Job]) -> None:
        self._jobs = jobs
        self._left: Counter[str | None] = Counter(job.group for job in jobs)
        self._ended = bytearray(len(jobs))
        #: a task has started (the journal is not empty)
        self.started = False

    def feed(self, records: Iterable[bytes | str]) -> None:
        """Take journal records (``clock sec usec event i ...``) in order."""
        for raw in records:
            self.started = True
            text = raw.decode() if isinstance(raw, bytes) else raw
            event, index = text.split(" ", 5)[3:5]
            i = int(index)
            # A repeated end or a record the plan does not know is verify()'s
            # to report; here it must not skew the counts.
            if event != "e" or not 0 <= i < len(self._jobs) or self._ended[i]:
                continue
            self._ended[i] = 1
            group = self._jobs[i].group
            self._left[group] -= 1
            if not self._left[group]:
                del self._left[group]

    @property
    def left(self) -> int:
        """Tasks not ended yet."""
        return self._left.total()

    def tail(self) -> list[str] | None:
        """The groups of the tasks left, when at most :data:`HOT_GROUPS` of
        them hold all of those (no ungrouped task left); else ``None``."""
        if not self._left or len(self._left) > HOT_GROUPS or None in self._left:
            return None
        return sorted(group for group in self._left if group is not None)


def progress_line(
    done: int, total: int, rate: float, *, started: bool, tail: Sequence[str] | None
) -> str:
    """The progress line: the count and the rate, or why there is no rate
    yet, and in the tail how many groups are left."""
    line = f"  running: {done:,}/{total:,} done"
    if not started:
        return f"{line}, waiting for the worker processes to start"
    line += f", {rate:,.0f} tasks/s"
    if tail:
        each = "one task at a time" if len(tail) == 1 else "one task at a time each"
        line += f" ({_groups(tail)} left, {each})"
    return line


def tail_line(left: int, tail: Sequence[str]) -> str:
    """Say once why the end is slower: the tasks left are a few groups'."""
    hot = "hot " if all(is_hot(group) for group in tail) else ""
    return (
        f"tail:     the last {left:,} tasks all belong to the {_groups(tail, hot)} "
        f"({', '.join(tail)}), and a group runs its tasks one at a time, by "
        f"design: the rate drops to what {len(tail)} "
        f"task{'s' if len(tail) > 1 else ''} at a time allow"
    )


def _groups(tail: Sequence[str], adjective: str = "") -> str:
    return f"{len(tail)} {adjective}group{'s' if len(tail) > 1 else ''}"


# -- verification --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the journal shows.

    :ivar ran: tasks that started at least once
    :ivar ran_twice: tasks that started more than once
    :ivar never_ran: tasks that never started
    :ivar unfinished: tasks whose starts and ends do not pair up
    :ivar order_violations: starts of a group's task after a later task of the
        group had started (or journal records that do not match the plan)
    :ivar overlaps: starts of a group's task while another one of it ran
    :ivar span_s: first start to last end, on the server's clock
    """

    ran: int
    ran_twice: int
    never_ran: int
    unfinished: int
    order_violations: int
    overlaps: int
    span_s: float

    @property
    def ok(self) -> bool:
        """Every task ran exactly once, in order, one at a time per group."""
        counts = (self.ran_twice, self.never_ran, self.unfinished)
        return not any((*counts, self.order_violations, self.overlaps))


def verify(jobs: Sequence[Job], journal: Sequence[bytes | str]) -> Verdict:
    """Check the journal against the plan.

    :param jobs: the plan, in enqueue order
    :param journal: records ``clock sec usec event i seq attempt group``
    """
    starts: Counter[int] = Counter()
    ends: Counter[int] = Counter()
    order = overlaps = 0
    watch: GroupWatch[int, int] = GroupWatch()
    first_us = last_us = 0
    records = [
        (raw.decode() if isinstance(raw, bytes) else raw).split(" ", 7)
        for raw in journal
    ]
    for _clock, sec, usec, event, i_, seq_, _attempt, group_ in sorted(
        records, key=lambda r: int(r[0])
    ):
        i, seq, at_us = int(i_), int(seq_), int(sec) * 1_000_000 + int(usec)
        group = None if group_ == "-" else group_
        if not 0 <= i < len(jobs) or (jobs[i].group, jobs[i].seq) != (group, seq):
            order += 1  # a record the plan does not know: a corrupt payload
            continue
        if event == "e":
            ends[i] += 1
            last_us = max(last_us, at_us)
            if group is not None:
                watch.close(group, i)
            continue
        starts[i] += 1
        first_us = at_us if not first_us else min(first_us, at_us)
        if group is None:
            continue
        if watch.open(group, i, i):
            overlaps += 1
        reached = watch.place(group, seq, i)
        if reached is not None and seq < reached.position:
            order += 1
    return Verdict(
        ran=len(starts),
        ran_twice=sum(1 for n in starts.values() if n > 1),
        never_ran=len(jobs) - len(starts),
        unfinished=sum(1 for i in range(len(jobs)) if starts[i] != ends[i]),
        order_violations=order,
        overlaps=overlaps,
        span_s=max(0, last_us - first_us) / 1_000_000,
    )


# -- the run ---------------------------------------------------------------------


#: how long workers get to stop after an interrupt before they are killed
_INTERRUPT_PATIENCE: Final = 0.5
#: task states read per pipeline by the verification
_STATE_CHUNK: Final = 2_000


def run_demo(
    *,
    redis_url: str | None,
    tasks: int,
    groups: int,
    processes: int,
    concurrency: int,
    seed: int | None = None,
) -> int:
    """Run the demo; return 0 if verification passed, 1 if not, 2 on setup
    errors, 128 + the signal number when stopped by SIGINT, SIGTERM or SIGHUP.

    On a stop signal the workers get half a second to stop, then are told to
    cancel their handlers, then killed; the throwaway server is stopped and
    the temporary files are removed.

    :param redis_url: the server to use; ``None`` starts a throwaway one
    :param tasks: how many tasks to enqueue
    :param groups: over how many groups
    :param processes: worker processes
    :param concurrency: handlers at once per process
    :param seed: the workload's random seed (default: random)
    """
    seed = random.randrange(2**32) if seed is None else seed
    jobs, description = make_plan(tasks, groups, random.Random(seed))
    console = Console()
    queue = f"demo-{secrets.token_hex(4)}"
    console.say(f"workload: {description} (seed {seed})")
    console.say(
        f"workers:  {processes} processes x {concurrency} concurrency, queue {queue}"
    )
    with StopSignals(console) as stop:
        try:
            with ExitStack() as stack:
                throwaway = redis_url is None
                if redis_url is None:
                    console.say(
                        "server:   starting a throwaway server "
                        "(give --redis-url to use yours)"
                    )
                    try:
                        with stop.raising():
                            server = stack.enter_context(ServerProcess())
                    except ServerStartError as exc:
                        console.say(f"aiogroupq demo: error: {exc}", err=True)
                        return 2
                    redis_url = server.url
                    console.say(f"server:   {server.binary} (throwaway) at {redis_url}")
                tmp = stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="aiogroupq-demo-")
                )
                log_path = Path(tmp) / "workers.log"
                with open(log_path, "wb") as log:
                    run = _Run(redis_url, queue, jobs, log, console, stop, throwaway)
                    code = anyio.run(run.main, processes, concurrency)
                if code == 1:
                    console.say("worker log (last lines):", err=True)
                    lines = log_path.read_text(errors="replace").splitlines()[-20:]
                    console.say("\n".join(lines), err=True)
                if stop.signum is None:
                    return code
        except Interrupted:
            stop.announce()
        assert stop.signum is not None
        console.say(f"aiogroupq demo: stopped by {stop.signum.name}", err=True)
        return 128 + stop.signum


@dataclass
class _Run:
    """One demo run inside the event loop."""

    url: str
    queue: str
    jobs: list[Job]
    log: IO[bytes]
    console: Console
    stop: StopSignals
    throwaway: bool

    async def main(self, processes: int, concurrency: int) -> int:
        with anyio.CancelScope() as scope, self.stop.cancels(scope):
            return await self._drive(processes, concurrency)
        return 128 + (self.stop.signum or signal.SIGINT)

    async def _drive(self, processes: int, concurrency: int) -> int:
        say = self.console.say
        keys = journal_keys(self.queue)
        try:
            client = redis.asyncio.Redis.from_url(self.url)
        except ValueError as exc:
            say(f"aiogroupq demo: error: {exc}", err=True)
            return 2
        async with client:
            try:
                await client.ping()
            except (RedisError, OSError) as exc:
                say(f"aiogroupq demo: error: cannot reach the server: {exc}", err=True)
                return 2
            say(
                f"workers:  starting {processes} worker processes: aiogroupq "
                f"worker {__name__}:worker --queue {self.queue} "
                f"--processes {processes}"
            )
            process = await self._start_workers(processes, concurrency)
            try:
                say(
                    f"enqueue:  {len(self.jobs):,} tasks in batches of {BATCH:,}, "
                    "while the workers start"
                )
                started = anyio.current_time()
                ids = await self._enqueue(client, started)
                finished = await self._follow(client, keys, len(ids), process)
                elapsed = anyio.current_time() - started
                self.console.progress("stopping the workers", final=True)
                await _stop(process, patience=60.0)
                journal = await client.lrange(keys[1], 0, -1)
                self.console.progress(
                    f"verifying: {len(journal):,} journal records read", final=True
                )
                states = await self._states(client, ids)
            finally:
                with anyio.CancelScope(shield=True):
                    interrupted = self.stop.signum is not None
                    await _stop(
                        process, patience=_INTERRUPT_PATIENCE if interrupted else 60.0
                    )
                    if not self.throwaway:  # a throwaway server goes as a whole
                        with anyio.move_on_after(10):
                            await self._clean_up(client)
        checks = (
            (finished, "the workers exited or stalled before the end"),
            (process.returncode == 0, f"workers' exit status {process.returncode}"),
        )
        return self._conclude(journal, states, elapsed, checks)

    async def _start_workers(self, processes: int, concurrency: int) -> Process:
        """``aiogroupq worker`` on the demo's queue, its output in the log."""
        argv = [sys.executable, "-m", "aiogroupq", "worker", f"{__name__}:worker"]
        argv += ["--queue", self.queue, "--redis-url", self.url]
        argv += ["--processes", str(processes), "--concurrency", str(concurrency)]
        argv += ["--parent-pid", str(os.getpid())]
        # A session of its own: a Ctrl-C reaches only us; we stop the workers.
        return await anyio.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )

    async def _enqueue(self, client: redis.asyncio.Redis, started: float) -> list[str]:
        """Enqueue the plan in batches of :data:`BATCH`; return the ids."""
        jobs = self.jobs
        async with aiogroupq.Producer(client, queue=self.queue) as producer:
            ids: list[str] = []
            for at in range(0, len(jobs), BATCH):
                ids += await producer.enqueue_many(
                    aiogroupq.Task(job.type, job, group=job.group)
                    for job in jobs[at : at + BATCH]
                )
        took = anyio.current_time() - started
        self.console.say(
            f"enqueued: {len(ids):,} tasks in {took:.2f} s "
            f"({len(ids) / took:,.0f} tasks/s, batches of {BATCH:,})"
        )
        return ids

    def _conclude(
        self,
        journal: Sequence[bytes | str],
        states: Counter[str],
        elapsed: float,
        checks: Sequence[tuple[bool, str]],
    ) -> int:
        """Verify the journal, print the figures and the result; return the
        exit status (0 if every check holds)."""
        verdict = verify(self.jobs, journal)
        _report(verdict, len(self.jobs), states, elapsed, self.console.say)
        problems = [
            text
            for ok, text in (
                *checks,
                (verdict.ok, "the journal shows violations"),
                (states == {"succeeded": len(self.jobs)}, "not every task succeeded"),
            )
            if not ok
        ]
        self.console.say(
            "result:   " + ("FAILED: " + "; ".join(problems) if problems else "OK")
        )
        return 1 if problems else 0

    async def _follow(
        self,
        client: redis.asyncio.Redis,
        keys: tuple[str, str, str],
        total: int,
        process: Process,
    ) -> bool:
        """Show progress until every task ended; False on a stall. The
        journal's new records tell whether a task has started yet and what
        is left (read with the done counter, in one round trip)."""
        _clock, journal_key, done_key = keys
        remaining = Remaining(self.jobs)
        read = 0  # journal records taken so far
        told_tail = False
        window: deque[tuple[float, int]] = deque()
        last_change, last_done = anyio.current_time(), -1
        while True:
            async with client.pipeline(transaction=False) as pipe:
                pipe.get(done_key)
                pipe.lrange(journal_key, read, -1)
                counter, records = await pipe.execute()
            done = int(counter or 0)
            read += len(records)
            remaining.feed(records)
            tail = remaining.tail()
            if tail and not told_tail:
                told_tail = True
                self.console.say(tail_line(remaining.left, tail))
            now = anyio.current_time()
            window.append((now, done))
            while now - window[0][0] > 1.0:
                window.popleft()
            span = now - window[0][0]
            rate = (done - window[0][1]) / span if span > 0 else 0.0
            end = done >= total
            stalled = (
                process.returncode is not None or now - last_change > STALL_TIMEOUT
            )
            self.console.progress(
                progress_line(done, total, rate, started=remaining.started, tail=tail),
                final=end or stalled,
            )
            if end:
                return True
            if done != last_done:
                last_change, last_done = now, done
            if stalled:
                return False
            await anyio.sleep(0.1)

    async def _states(
        self, client: redis.asyncio.Redis, ids: Sequence[str]
    ) -> Counter[str]:
        """Every task's state, read in pipelines of :data:`_STATE_CHUNK`.

        (Reads the task hashes' state field as ``Producer.status`` does; a
        batched status call of the library would replace this.)
        """
        keys = QueueKeys(self.queue)
        states: Counter[str] = Counter()
        for at in range(0, len(ids), _STATE_CHUNK):
            part = ids[at : at + _STATE_CHUNK]
            async with client.pipeline(transaction=False) as pipe:
                for task_id in part:
                    pipe.hget(keys.task(task_id), "s")
                for state in await pipe.execute():
                    states["unknown" if state is None else state.decode()] += 1
            self.console.progress(
                f"verifying: {at + len(part):,}/{len(ids):,} task states read",
                final=at + len(part) == len(ids),
            )
        return states

    async def _clean_up(self, client: redis.asyncio.Redis) -> None:
        """Delete the demo's keys from a server that is not ours to drop."""
        await client.delete(*journal_keys(self.queue))
        deleted = 0
        batch: list[bytes] = []
        async for key in client.scan_iter(
            match=QueueKeys(self.queue).pattern(), count=1000
        ):
            batch.append(key)
            if len(batch) == 1000:
                deleted += await client.unlink(*batch)
                batch.clear()
                self.console.progress(f"cleaning up: {deleted:,} keys deleted")
        if batch:
            deleted += await client.unlink(*batch)
        self.console.progress(f"cleaning up: {deleted:,} keys deleted", final=True)


async def _stop(process: Process, *, patience: float) -> None:
    """Stop the workers: SIGTERM (the supervisor forwards it and each worker
    finishes its running handlers), again after *patience* (they cancel
    them), then SIGKILL."""
    for signum in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        if process.returncode is not None:
            return
        with suppress(ProcessLookupError):
            process.send_signal(signum)
        with anyio.move_on_after(patience):
            await process.wait()
            return
        patience = 1.0
    await process.wait()


def _report(
    verdict: Verdict,
    total: int,
    states: Counter[str],
    elapsed: float,
    say: Callable[[str], None],
) -> None:
    rate = verdict.ran / verdict.span_s if verdict.span_s else 0.0
    span = f"{verdict.span_s:.2f} s"
    for label, value in (
        ("tasks run", f"{verdict.ran:,} of {total:,}"),
        ("tasks run more than once", f"{verdict.ran_twice:,}"),
        ("tasks never run", f"{verdict.never_ran:,}"),
        ("unfinished runs", f"{verdict.unfinished:,}"),
        ("order violations", f"{verdict.order_violations:,}"),
        ("overlapping runs", f"{verdict.overlaps:,}"),
        ("final states", ", ".join(f"{k} {n:,}" for k, n in sorted(states.items()))),
        ("throughput", f"{rate:,.0f} tasks/s (first start to last end: {span})"),
        ("elapsed", f"{elapsed:.2f} s (first enqueue to last end)"),
    ):  # fmt: skip
        say(f"{label + ':':<26}{value}")
