"""The chaos harness: a Redis server, consumer processes, an optional proxy,
a producer, fault injectors, and the final judgement of a run.

A :class:`Cluster` is used as ``async with Cluster(...) as cluster``: it
starts the server (with AOF when asked), the proxy (when asked) and the
consumer processes; :meth:`Cluster.produce` enqueues a workload at a steady
rate; the fault methods (:meth:`kill`, :meth:`stall`, :meth:`terminate`,
:meth:`restart_redis`, :meth:`drop`, :meth:`flush_caches`) inject one fault
each and journal it; :meth:`Cluster.settle` waits until every task is
terminal, stops the consumers gracefully and judges the journal
(:func:`._oracle.judge`) and the queue's keys (``aiogroupq._check.check.examine``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Self

import anyio
import anyio.to_thread
import redis.asyncio
from anyio.abc import TaskGroup
from redis.exceptions import RedisError

import aiogroupq
from aiogroupq._store.keys import QueueKeys
from aiogroupq.testing._server import ServerProcess

from . import _oracle
from ._journal import JOURNAL, JournalWriter
from ._proxy import ChaosProxy
from ._worker import Job

ROOT: Final = Path(__file__).resolve().parents[2]
QUEUE: Final = "chaos"
#: attempts per task: room for every kill, stall and planned failure
MAX_ATTEMPTS: Final = 50
#: most tasks enqueued per second by drive(): what 4 consumers on 2 cores
#: keep up with, journal included
MAX_RATE: Final = 350.0
#: the liveness bound added to lease_ttl: recovery after a kill must be
#: faster than lease_ttl + this (generous: a loaded 2-core CI machine)
RECOVERY_BOUND: Final = 5.0


@dataclass(frozen=True, slots=True)
class Scale:
    """How big a chaos run is (``AIOGROUPQ_CHAOS_SCALE``)."""

    name: str
    tasks: int  # per fault type
    kills: int
    stalls: int
    terms: int
    drops: int
    restarts: int
    flushes: int


SCALES: Final = {
    # CI: a few minutes on 2 cores
    "small": Scale("small", 3000, 12, 5, 5, 30, 4, 60),
    # the documented figures: >= 20,000 tasks and >= 50 kills
    "full": Scale("full", 20_000, 60, 15, 15, 100, 20, 300),
}


def chaos_scale() -> Scale:
    """The scale named by ``AIOGROUPQ_CHAOS_SCALE`` (default ``small``)."""
    name = os.environ.get("AIOGROUPQ_CHAOS_SCALE", "small")
    if name not in SCALES:
        raise ValueError(f"AIOGROUPQ_CHAOS_SCALE must be one of {sorted(SCALES)}")
    return SCALES[name]


def chaos_seed() -> int:
    """``AIOGROUPQ_CHAOS_SEED``, or a fresh one (printed with the figures)."""
    explicit = os.environ.get("AIOGROUPQ_CHAOS_SEED")
    return int(explicit) if explicit else random.randrange(1 << 32)


def workload(
    n: int,
    rng: random.Random,
    *,
    groups: int | None = None,
    ungrouped: float = 0.15,
    long_fraction: float = 0.03,
    long_ms: tuple[int, int] = (300, 1000),
    fail_fraction: float = 0.03,
) -> list[Job]:
    """*n* jobs over Zipf-skewed groups (one hot group with a long backlog),
    some ungrouped, mostly short, a few long, a few failing once."""
    count = groups or max(8, n // 40)
    names = [f"g{i:04d}" for i in range(count)]
    weights = [1 / (i + 1) ** 0.5 for i in range(count)]
    next_gseq: Counter[str] = Counter()
    jobs = []
    for seq in range(n):
        group = None if rng.random() < ungrouped else rng.choices(names, weights)[0]
        gseq = 0
        if group is not None:
            gseq = next_gseq[group]
            next_gseq[group] += 1
        r = rng.random()
        if r < long_fraction:
            sleep_ms = rng.randint(*long_ms)
        elif r < 0.3:
            sleep_ms = rng.randint(30, 120)
        else:
            sleep_ms = rng.randint(2, 30)
        fail = 1 if rng.random() < fail_fraction else 0
        jobs.append(Job(seq, group, gseq, sleep_ms, fail))
    return jobs


@dataclass(eq=False)
class Worker:
    """One consumer process."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    url: str
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Result:
    """A judged run: the oracle's verdict plus what the harness saw."""

    fault: str
    seed: int
    verdict: _oracle.Verdict
    problems: list[str]
    crashes: list[str]
    stats: dict[str, int]
    noscript: int
    producer_errors: int
    seconds: float
    lease_ttl: float
    extra: dict[str, Any] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        """The figures printed per fault type (one JSON line)."""
        v = self.verdict
        rec = v.recovery
        return {
            "fault": self.fault,
            "seed": self.seed,
            "enqueued": v.enqueued,
            "faults": dict(v.faults),
            "lost": len(v.lost),
            "order_violations": len(v.order),
            # Unfenced overlaps, and handlers not stopped in time after
            # their group moved on; fenced ones are listed apart.
            "overlaps": len(v.overlaps) + len(v.late_ends),
            "fenced_overlaps": dict(v.fenced_overlaps),
            "duplicates_unexplained": len(v.duplicates),
            "reruns_explained": dict(v.reruns),
            "attempt_anomalies": len(v.attempts),
            "journal_anomalies": len(v.journal),
            "journal_lines_lost": v.lost_lines,
            "fsck_problems": len(self.problems),
            "consumer_crashes": len(self.crashes),
            "runs": v.runs,
            "stale_writes_refused": v.stale_writes,
            "interrupted_by_kill": v.interrupted,
            "resumed_first": v.resumed_first,
            "attempt_plus_one": v.attempt_plus_one,
            "recovery_p50_s": _pct(rec, 50),
            "recovery_max_s": max(rec) if rec else None,
            "recovery_same_name_p50_s": _pct(v.recovery_same, 50),
            "recovery_same_name_max_s": max(v.recovery_same, default=None),
            "recovery_new_name_p50_s": _pct(v.recovery_new, 50),
            "recovery_new_name_max_s": max(v.recovery_new, default=None),
            "stalled_runs": v.stalled_runs,
            "stalled_taken_over": v.stalled_taken_over,
            "stalled_cancelled": v.stalled_cancelled,
            "stalled_late_write_refused": v.stalled_refused,
            "cancel_after_sigcont_p50_ms": _pct(v.cancel_after_cont_ms, 50),
            "cancel_after_sigcont_max_ms": max(v.cancel_after_cont_ms, default=None),
            "terminated_with_runs_open": v.terminated_open,
            "handed_back": v.handed_back,
            "finished_in_grace": v.finished_in_grace,
            "late_acks_refused": self.stats.get("lease_lost", 0),
            "user_visible_noscript": self.noscript,
            "producer_errors_retried": self.producer_errors,
            "seconds": round(self.seconds, 1),
            "lease_ttl": self.lease_ttl,
            **self.extra,
        }

    def summary(self) -> str:
        f = self.figures()
        return (
            f"[{self.fault}] tasks lost: {f['lost']} of {f['enqueued']} under "
            f"{sum(f['faults'].values())} fault marks {f['faults']}; order "
            f"violations {f['order_violations']}; overlaps {f['overlaps']} "
            f"(fenced {sum(f['fenced_overlaps'].values())}); unexplained "
            f"duplicates {f['duplicates_unexplained']}; re-runs {f['reruns_explained']}"
            f"; recovery p50/max {f['recovery_p50_s']}/{f['recovery_max_s']} s"
        )

    def assert_clean(self) -> None:
        """Every invariant held (the caller adds its liveness bound)."""
        details = [
            *self.verdict.violations,
            *(f"fsck: {p}" for p in self.problems),
            *(f"crash: {c}" for c in self.crashes),
        ]
        if self.noscript:
            details.append(f"NOSCRIPT reached a consumer {self.noscript} times")
        assert not details, (
            f"{len(details)} violations (seed {self.seed}):\n" + "\n".join(details[:40])
        )


def _pct(values: Sequence[float], p: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[p - 1], 3)


class Cluster:
    """One chaos run's moving parts (use ``async with``)."""

    def __init__(
        self,
        workdir: Path,
        *,
        seed: int,
        workers: int = 4,
        concurrency: int = 16,
        lease_ttl: float = 1.0,
        grace: float = 5.0,
        retention: float = 3600.0,
        appendonly: bool = False,
        appendfsync: str = "always",
        proxy: bool = False,
    ) -> None:
        self.workdir = workdir
        self.seed = seed
        self.rng = random.Random(seed)
        self.n_workers = workers
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.grace = grace
        self.retention = retention
        aof = {"appendonly": "yes", "appendfsync": appendfsync} if appendonly else {}
        # Fsynced once a second, a restart may lose the journal's last lines.
        self.lossy_restarts = appendonly and appendfsync != "always"
        self.server = ServerProcess(workdir=workdir, config=aof)
        self.proxy_wanted = proxy
        self.proxy: ChaosProxy | None = None
        self.workers: list[Worker] = []
        self.retired: list[Worker] = []
        self.crashes: list[str] = []
        self.producer_errors = 0
        self.specs: dict[int, _oracle.Spec] = {}
        self._names = 0
        self._expected_exit: set[int] = set()
        self.client: redis.asyncio.Redis
        self.journal: JournalWriter
        self.started = time.monotonic()

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await anyio.to_thread.run_sync(self.server.start)
        self.producer_url = self.server.url
        if self.proxy_wanted:
            # The port is known once the server runs (restarts keep it).
            self.proxy = ChaosProxy(self.server.port)
            self.proxy.start()
            self.producer_url = self.proxy.add_link()
        self.client = redis.asyncio.Redis.from_url(self.server.url)
        self.journal = JournalWriter(self.client, QUEUE)
        for _ in range(self.n_workers):
            await self.spawn(self.new_name())
        await self.wait_ready(self.workers)
        self.started = time.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
        for w in [*self.workers, *self.retired]:
            await anyio.to_thread.run_sync(w.proc.wait)
        if self.proxy is not None:
            self.proxy.stop()
        await self.client.aclose()
        await anyio.to_thread.run_sync(self.server.stop)

    def new_name(self) -> str:
        self._names += 1
        return f"chaos-{self._names}"

    async def spawn(self, name: str) -> Worker:
        # Through the proxy, each consumer gets a link of its own, so that a
        # fault can cut off one consumer alone (a partition).
        url = self.proxy.add_link() if self.proxy else self.server.url
        log = (
            self.workdir / f"worker-{name}-{len(self.retired) + len(self.workers)}.log"
        )
        with log.open("ab") as out:
            # (fork + exec returns at once: not worth a thread)
            proc = subprocess.Popen(  # noqa: ASYNC220
                [
                    sys.executable,
                    "-m",
                    "tests.chaos._worker",
                    url,
                    self.server.url,
                    QUEUE,
                    name,
                    str(self.workdir),
                    "--lease-ttl",
                    str(self.lease_ttl),
                    "--concurrency",
                    str(self.concurrency),
                    "--grace",
                    str(self.grace),
                    "--retention",
                    str(self.retention),
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        worker = Worker(name, proc, log, url)
        self.workers.append(worker)
        await self.journal.mark("N", proc.pid, name)
        return worker

    async def wait_ready(self, workers: Sequence[Worker], timeout: float = 60) -> None:
        with anyio.fail_after(timeout):
            for w in workers:
                while not (self.workdir / f"ready-{w.pid}").exists():
                    if w.proc.poll() is not None:
                        raise RuntimeError(
                            f"worker {w.name} exited at start: {_tail(w.log)}"
                        )
                    await anyio.sleep(0.05)

    def ready(self, w: Worker) -> bool:
        return (self.workdir / f"ready-{w.pid}").exists() and w.proc.poll() is None

    async def watch(self) -> None:
        """Replace consumers that exit on their own (and report them)."""
        while True:
            await anyio.sleep(0.2)
            for w in list(self.workers):
                if w.proc.poll() is not None and w.pid not in self._expected_exit:
                    self.crashes.append(
                        f"{w.name} (pid {w.pid}) exited with {w.proc.returncode}: "
                        f"{_tail(w.log)}"
                    )
                    self.workers.remove(w)
                    self.retired.append(w)
                    await self.spawn(self.new_name())

    # -- workload ----------------------------------------------------------------

    async def produce(
        self, jobs: Sequence[Job], seconds: float, *, batch: int = 25
    ) -> None:
        """Enqueue *jobs* in order, spread over about *seconds*. A batch that
        fails is sent again (its tasks' dedup keys make that safe)."""
        async with aiogroupq.Producer(self.producer_url, queue=QUEUE) as producer:
            start = time.monotonic()
            per_batch = seconds * batch / max(1, len(jobs))
            for i in range(0, len(jobs), batch):
                chunk = jobs[i : i + batch]
                tasks = [
                    aiogroupq.Task(
                        "job",
                        job,
                        group=job.group,
                        dedup_key=f"job-{job.seq}",
                        max_attempts=MAX_ATTEMPTS,
                    )
                    for job in chunk
                ]
                while True:
                    try:
                        ids = await producer.enqueue_many(tasks)
                        break
                    except (
                        aiogroupq.RedisUnavailableError,
                        RedisError,
                        OSError,
                    ):
                        self.producer_errors += 1
                        await anyio.sleep(0.1)
                for job, task_id in zip(chunk, ids, strict=True):
                    self.specs[job.seq] = _oracle.Spec(task_id, job.group, job.gseq)
                due = start + (i // batch + 1) * per_batch
                await anyio.sleep(max(0.0, due - time.monotonic()))

    async def wait_started(self, seqs: set[int], timeout: float = 30) -> dict[int, int]:
        """Until the journal shows a start of each of *seqs*; return the pid
        that started each."""
        with anyio.fail_after(timeout):
            while True:
                lines: list[bytes | str] = await self.client.lrange(JOURNAL, 0, -1)
                found = {}
                for event in _oracle.parse(lines):
                    if event.kind == "S" and int(event.fields[3]) in seqs:
                        found[int(event.fields[3])] = event
                if found.keys() == seqs:
                    return {seq: event.pid for seq, event in found.items()}
                await anyio.sleep(0.05)

    def worker(self, pid: int) -> Worker:
        """The live consumer with this pid."""
        return next(w for w in self.workers if w.pid == pid)

    async def states(self) -> dict[str, tuple[str | None, str | None]]:
        """Each enqueued task's (state, applied token), straight from Redis."""
        keys = QueueKeys(QUEUE)
        ids = [spec.task_id for spec in self.specs.values()]
        out: dict[str, tuple[str | None, str | None]] = {}
        for i in range(0, len(ids), 2000):
            async with self.client.pipeline(transaction=False) as pipe:
                for task_id in ids[i : i + 2000]:
                    pipe.hmget(keys.task(task_id), "s", "f")
                rows: list[Any] = await pipe.execute()
            for task_id, (state, token) in zip(ids[i : i + 2000], rows, strict=True):
                out[task_id] = (
                    state.decode() if state else None,
                    token.decode() if token else None,
                )
        return out

    async def wait_terminal(self, timeout: float) -> None:
        """Until every enqueued task is terminal (or *timeout*)."""
        with anyio.move_on_after(timeout):
            while True:
                try:
                    states = await self.states()
                except (RedisError, OSError):
                    await anyio.sleep(0.5)
                    continue
                if all(
                    s in ("succeeded", "dead", "cancelled") for s, _ in states.values()
                ):
                    return
                await anyio.sleep(0.5)

    # -- faults --------------------------------------------------------------------

    def pick(self, *, ready: bool = False) -> Worker | None:
        """A random live consumer (a started one, with *ready*)."""
        live = [
            w
            for w in self.workers
            if w.pid not in self._expected_exit and (not ready or self.ready(w))
        ]
        return self.rng.choice(live) if live else None

    async def kill(self, w: Worker, *, same_name: bool) -> Worker:
        """``kill -9`` a consumer, then start a replacement at once: with the
        same name (it resumes the dead one's tasks) or a new one."""
        self._expected_exit.add(w.pid)
        w.proc.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(w.proc.wait)
        await self.journal.mark("K", w.pid, "same" if same_name else "new")
        self.workers.remove(w)
        self.retired.append(w)
        return await self.spawn(w.name if same_name else self.new_name())

    async def stall(self, w: Worker, seconds: float) -> None:
        """SIGSTOP a consumer for *seconds*, then SIGCONT it."""
        self._expected_exit.add(w.pid)  # may not answer the watch meanwhile
        w.proc.send_signal(signal.SIGSTOP)
        await self.journal.mark("P", w.pid)
        await anyio.sleep(seconds)
        await self.journal.mark("Q", w.pid)
        w.proc.send_signal(signal.SIGCONT)
        self._expected_exit.discard(w.pid)

    async def terminate(self, w: Worker, *, replace: bool = True) -> int:
        """SIGTERM a consumer, wait for its graceful exit; return its code.
        (Without *replace*, the end of a run: not counted as a fault.)"""
        self._expected_exit.add(w.pid)
        await self.journal.mark("T", w.pid, "fault" if replace else "final")
        w.proc.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(_wait, w.proc, self.grace + 30)
        await self.journal.mark("X", w.pid, str(code))
        self.workers.remove(w)
        self.retired.append(w)
        if replace:
            await self.spawn(self.new_name())
        return code

    async def restart_redis(self, down: float = 0.0) -> None:
        """``kill -9`` the server and start it again on the same port and
        directory (AOF replays)."""
        await self.journal.mark("RD")
        await anyio.to_thread.run_sync(self.server.kill)
        if down:
            await anyio.sleep(down)
        await anyio.to_thread.run_sync(self.server.start)
        await self.journal.mark("RU")

    async def freeze_redis(self, seconds: float) -> None:
        """SIGSTOP the server for *seconds* (a stand-in for a stalled or
        partitioned primary: commands hang, then run late, all at once)."""
        assert self.server.running()
        await self.journal.mark("RD", "-", "stop")
        self.server.freeze()
        await anyio.sleep(seconds)
        self.server.thaw()
        await self.journal.mark("RU", "-", "cont")

    async def drop(self, how: str) -> None:
        """A network fault through the proxy: ``reset`` every connection,
        ``cut`` one reply mid-way (on a random consumer's or the producer's
        link), ``partition`` one consumer from Redis for 1.5 x lease_ttl, or
        ``pause`` all traffic as long."""
        assert self.proxy is not None
        if how == "reset":
            self.proxy.reset()
        elif how == "cut":
            links = [w.url for w in self.workers] + [self.producer_url]
            self.proxy.cut_next_reply(self.rng.choice(links))
        else:
            seconds = self.lease_ttl * 1.5
            target = None
            if how == "partition":
                w = self.pick()
                if w is None:
                    return
                target = w.url
            self.proxy.pause(seconds, target)
            await self.journal.mark("D", "-", how)
            await anyio.sleep(seconds)
        await self.journal.mark("D", "-", how)

    async def flush_caches(self) -> None:
        # Both at once, the worst case: a call that finds the library gone
        # is sent again by EVALSHA, and meets NOSCRIPT.
        await self.client.function_flush()
        await self.client.script_flush()
        await self.journal.mark("FL")

    # -- judgement -------------------------------------------------------------------

    async def settle(self, fault: str, *, timeout: float = 300) -> Result:
        """Wait for the queue to drain, stop every consumer gracefully, then
        judge the journal and the queue's keys."""
        await self.wait_terminal(timeout)
        stats: Counter[str] = Counter()
        for w in list(self.workers):
            code = await self.terminate(w, replace=False)
            if code != 0:
                self.crashes.append(
                    f"{w.name} exited {code} on SIGTERM: {_tail(w.log)}"
                )
        for path in self.workdir.glob("stats-*.json"):
            data = json.loads(path.read_text())
            for key, value in data.items():
                if isinstance(value, int) and key != "pid":
                    stats[key] += value
        noscript = sum(
            w.log.read_text(errors="replace").count("NOSCRIPT")
            + w.log.read_text(errors="replace").count("NoScript")
            for w in self.retired
        )
        states = await self.states()
        finals: dict[str, _oracle.Outcome] = {}
        async with aiogroupq.Producer(self.server.url, queue=QUEUE) as producer:
            ids = [spec.task_id for spec in self.specs.values()]
            # (at most 50 at once: a client's pool refuses its 101st connection)
            for i in range(0, len(ids), 50):
                chunk = ids[i : i + 50]
                found: dict[str, aiogroupq.TaskState | None] = {}

                async def one(task_id: str, found: dict[str, Any] = found) -> None:
                    found[task_id] = await producer.status(task_id)

                async with anyio.create_task_group() as tg:
                    for task_id in chunk:
                        tg.start_soon(one, task_id)
                for task_id in chunk:
                    state = found[task_id]
                    finals[task_id] = _oracle.Outcome(
                        None if state is None else state.value, states[task_id][1]
                    )
        lines: list[bytes | str] = await self.client.lrange(JOURNAL, 0, -1)
        # Kept for post-mortems, with what was enqueued and how it ended.
        (self.workdir / "journal.txt").write_bytes(
            b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines)
        )
        (self.workdir / "tasks.json").write_text(
            json.dumps(
                {
                    seq: [spec.task_id, spec.group, spec.gseq, *states[spec.task_id]]
                    for seq, spec in self.specs.items()
                }
            )
        )
        verdict = _oracle.judge(
            lines, self.specs, finals, lossy_restarts=self.lossy_restarts
        )
        from aiogroupq._check.check import examine

        problems = [
            f"{p.kind} {p.task_id} {p.group}: {p.detail}"
            for p in (await examine(self.client, QueueKeys(QUEUE))).problems
        ]
        return Result(
            fault,
            self.seed,
            verdict,
            problems,
            list(self.crashes),
            dict(stats),
            noscript,
            self.producer_errors,
            time.monotonic() - self.started,
            self.lease_ttl,
        )


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -999


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def drive(
    cluster: Cluster,
    jobs: Sequence[Job],
    seconds: float,
    inject: Callable[[], Awaitable[object]],
    *,
    times: int,
    interval: tuple[float, float],
) -> int:
    """Produce *jobs* over *seconds* (or longer: at most MAX_RATE a second)
    while injecting a fault every U(*interval*) seconds, at least *times*
    times; return how many."""
    seconds = max(seconds, len(jobs) / MAX_RATE)
    count = 0
    produced = anyio.Event()
    done = anyio.Event()

    async def faults() -> None:
        nonlocal count
        while not (produced.is_set() and count >= times):
            await anyio.sleep(cluster.rng.uniform(*interval))
            await inject()
            count += 1
        done.set()

    async with running(cluster, faults):
        await cluster.produce(jobs, seconds)
        produced.set()
        await done.wait()
    return count


@asynccontextmanager
async def running(
    cluster: Cluster, *faults: Callable[[], Coroutine[Any, Any, object]]
) -> AsyncIterator[TaskGroup]:
    """Run the cluster's watch and the given fault coroutines in a task group
    that is cancelled when the block ends."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(cluster.watch)
        for fault in faults:
            tg.start_soon(fault)
        yield tg
        tg.cancel_scope.cancel()
