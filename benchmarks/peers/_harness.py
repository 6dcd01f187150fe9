"""The part of the benchmark every peer shares: workloads, clocks and counters.

This module runs inside each library's own virtual environment, so it uses the
standard library only (the peers pin conflicting redis-py versions). An adapter
(``benchmarks/peers/<library>.py``) subclasses :class:`Adapter` with the
library's producer and worker calls and hands it to :func:`main`; the same file
is then both the *driver* (enqueues, measures, writes a JSON result) and the
*worker* (``<module> worker CONFIG``: one process running the library's own
worker, as its users would run it).

Payloads are one float ``x`` that the no-op handler passes to :meth:`Probe.done`:
``0.0`` a drain task (its completion time is recorded), ``> 0`` a latency probe
(``x`` is the monotonic send or due time: the handler records ``now - x``),
``< 0`` a task that is not measured (the 1,000,000-task backlog). Clocks:
``time.monotonic`` is ``CLOCK_MONOTONIC``, one clock for every process on the
machine, so a worker can compare it with the driver's.

Worker processes report through a small shared file (``mmap``): a stop flag
written by the driver, and per worker a ready flag and a completion counter that
a 5 ms watcher task copies there. The full record (completion times, latencies,
CPU time) is written to a JSON file when the driver asks the workers to stop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import mmap
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

#: one completion callback: the float payload of a finished task
OnDone = Callable[[float], None]

_WATCH_INTERVAL = 0.005
_POLL_INTERVAL = 0.01
_SLOT_FILE_SIZE = 4096
_MAX_WORKERS = 64


def log(message: str) -> None:
    """Progress goes to stderr; results go to the JSON file."""
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the adapter interface ---------------------------------------------------------


class Adapter:
    """One library's producer and worker calls. Subclass it in ``peers/<lib>.py``.

    Producer methods run in the driver process between :meth:`open` and
    :meth:`close`; :meth:`serve` runs in each worker process.
    """

    #: the row label in the tables
    label: str = "?"
    #: distributions whose versions are reported
    distributions: tuple[str, ...] = ()
    #: whether :meth:`enqueue_batch` is the library's own batch API
    has_batch: bool = False
    #: whether :meth:`enqueue` accepts ``delay``
    has_delay: bool = False
    #: whether :meth:`enqueue` accepts ``group`` (group-serial execution)
    has_groups: bool = False
    #: whether :meth:`serve` runs batches of a group's tasks when its options
    #: say ``batch_size`` (the grouped-batch workload)
    has_batches: bool = False
    #: settings that differ from the library's defaults, for the report
    settings: str = ""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    def versions(self) -> dict[str, str]:
        """The versions the report names: :attr:`distributions`' by default."""
        return _versions(self.distributions)

    async def open(self, url: str, queue: str) -> None:
        """Connect the producer side."""
        raise NotImplementedError

    async def close(self) -> None:
        """Disconnect the producer side."""
        raise NotImplementedError

    async def enqueue(
        self, x: float, *, delay: float | None = None, group: str | None = None
    ) -> None:
        """Enqueue one no-op task with payload *x*."""
        raise NotImplementedError

    async def enqueue_batch(
        self, xs: Sequence[float], groups: Sequence[str | None] | None = None
    ) -> None:
        """Enqueue many tasks with the library's own batch API (only called
        when :attr:`has_batch`)."""
        raise NotImplementedError(f"{self.label} has no batch enqueue")

    async def serve(
        self,
        url: str,
        queue: str,
        concurrency: int,
        on_done: OnDone,
        stop: asyncio.Event,
    ) -> None:
        """Run the library's worker with a no-op handler calling ``on_done(x)``
        until *stop* is set, then shut it down."""
        raise NotImplementedError


# -- a minimal RESP client for INFO and FLUSHALL (no redis-py needed) ---------------


class Resp:
    """Blocking RESP2 client for the driver's own bookkeeping commands."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        self._sock = socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=60
        )
        self._file = self._sock.makefile("rb")

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def call(self, *args: str | int) -> Any:
        out = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self._sock.sendall(b"".join(out))
        return self._read()

    def _read(self) -> Any:
        line = self._file.readline()
        if not line:
            raise ConnectionError("server closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self._file.read(size + 2)
            return data[:-2]
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._read() for _ in range(size)]
        raise RuntimeError(f"unexpected reply {line!r}")

    def info(self, section: str) -> dict[str, str]:
        text: bytes = self.call("INFO", section)
        fields = {}
        for row in text.decode().splitlines():
            if row and not row.startswith("#") and ":" in row:
                key, value = row.split(":", 1)
                fields[key] = value
        return fields


#: commands the driver itself sends; left out of the per-task counts
_OWN_COMMANDS = frozenset({"info", "flushall", "dbsize"})


@dataclass(frozen=True, slots=True)
class ServerSnapshot:
    """The server's CPU time and command counters at one moment."""

    cpu: float
    commands: dict[str, tuple[int, int]]  # name -> (calls, usec)
    used_memory: int

    @classmethod
    def take(cls, resp: Resp) -> ServerSnapshot:
        cpu = resp.info("cpu")
        commands: dict[str, tuple[int, int]] = {}
        for key, value in resp.info("commandstats").items():
            name = key.removeprefix("cmdstat_")
            parts = dict(p.split("=", 1) for p in value.split(","))
            commands[name] = (int(parts["calls"]), int(float(parts["usec"])))
        memory = int(resp.info("memory")["used_memory"])
        return cls(
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            commands,
            memory,
        )


def server_cost(
    before: ServerSnapshot, after: ServerSnapshot, tasks: int
) -> dict[str, Any]:
    """Per-task server cost between two snapshots.

    ``redis_cpu_us``: the server's own CPU time (user + sys, ``INFO cpu``);
    ``commands``: every command call in ``INFO commandstats``, those run inside
    Lua scripts and MULTI/EXEC included; ``script_us``: the time commandstats
    records for EVAL/EVALSHA/FCALL/EXEC (which contains the commands they ran).
    """
    calls: dict[str, int] = {}
    usec: dict[str, int] = {}
    for name, (n, us) in after.commands.items():
        if name in _OWN_COMMANDS:
            continue
        n0, us0 = before.commands.get(name, (0, 0))
        if n > n0:
            calls[name] = n - n0
            usec[name] = us - us0
    scripted = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}
    per = max(tasks, 1)
    return {
        "tasks": tasks,
        "redis_cpu_us": (after.cpu - before.cpu) * 1e6 / per,
        "commands": sum(calls.values()) / per,
        "script_us": sum(usec[n] for n in calls if n in scripted | {"exec"}) / per,
        "by_command": {
            name: {"calls": calls[name] / per, "usec": usec[name] / per}
            for name in sorted(calls, key=lambda c: -calls[c])
        },
    }


# -- other load on the machine ------------------------------------------------------


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat
    (NaN where there is none)."""
    try:
        with open("/proc/stat") as stat:
            first = stat.readline().split()
    except OSError:
        return math.nan, math.nan
    ticks = [
        int(v) for v in first[1:9]
    ]  # user nice system idle iowait irq softirq steal
    hz = os.sysconf("SC_CLK_TCK")
    total = sum(ticks) / hz
    return total - (ticks[3] + ticks[4]) / hz, total


class CpuWatch:
    """The share of the machine's CPU that neither this driver, its (waited-for)
    worker processes nor the server used while a measurement ran: other work
    competing for the same cores, which skews every figure."""

    def __init__(
        self, resp: Resp, own: Callable[[], float] = time.process_time
    ) -> None:
        self._resp = resp
        self._own = own
        self._start = self._sample()

    def _sample(self) -> tuple[float, float]:
        """(CPU seconds others used, CPU seconds the machine had) so far."""
        busy, total = machine_cpu()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        ours = children.ru_utime + children.ru_stime + self._own()
        cpu = self._resp.info("cpu")
        server = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        return busy - ours - server, total

    def share(self) -> float:
        foreign0, total0 = self._start
        foreign1, total1 = self._sample()
        if math.isnan(total1) or total1 <= total0:
            return math.nan
        return max(0.0, (foreign1 - foreign0) / (total1 - total0))


async def wait_quiet(limit: float, threshold: float = 0.10) -> None:
    """Wait up to *limit* seconds for the machine to be *threshold* idle or more."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        busy0, total0 = machine_cpu()
        await asyncio.sleep(1.0)
        busy1, total1 = machine_cpu()
        if (
            math.isnan(total1)
            or (busy1 - busy0) / max(total1 - total0, 1e-9) < threshold
        ):
            return


# -- statistics ---------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def drain_rates(times: Sequence[float], start: float) -> dict[str, float]:
    """Jobs/s from *start* to the last completion, and the steady rate between
    the 10th and 90th percentile completions (no start-up, no tail)."""
    ordered = sorted(times)
    n = len(ordered)
    if n < 10:
        return {"jobs_per_s": math.nan, "steady_per_s": math.nan, "seconds": math.nan}
    lo, hi = n // 10, (9 * n) // 10 - 1
    steady_span = ordered[hi] - ordered[lo]
    total = ordered[-1] - start
    return {
        "jobs_per_s": n / total,
        "steady_per_s": (hi - lo) / steady_span if steady_span > 0 else math.nan,
        "seconds": total,
        "first_after_s": ordered[0] - start,
    }


# -- worker processes ---------------------------------------------------------------


class Slots:
    """The shared file: stop flag at offset 0, per worker (ready, count)."""

    def __init__(self, path: Path, *, create: bool = False) -> None:
        if create:
            path.write_bytes(b"\0" * _SLOT_FILE_SIZE)
        self._file = path.open("r+b")
        self._map = mmap.mmap(self._file.fileno(), _SLOT_FILE_SIZE)

    def close(self) -> None:
        self._map.close()
        self._file.close()

    def _offset(self, index: int) -> int:
        return 64 + 16 * index

    def request_stop(self) -> None:
        struct.pack_into("q", self._map, 0, 1)

    def _read(self, offset: int) -> int:
        value: int = struct.unpack_from("q", self._map, offset)[0]
        return value

    def stop_requested(self) -> bool:
        return self._read(0) == 1

    def set_ready(self, index: int) -> None:
        struct.pack_into("q", self._map, self._offset(index), 1)

    def ready(self, index: int) -> bool:
        return self._read(self._offset(index)) == 1

    def set_count(self, index: int, count: int) -> None:
        struct.pack_into("q", self._map, self._offset(index) + 8, count)

    def count(self, index: int) -> int:
        return self._read(self._offset(index) + 8)


@dataclass
class Probe:
    """What the no-op handler records."""

    times: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    unmeasured: int = 0

    def done(self, x: float) -> None:
        if x < 0:
            self.unmeasured += 1
            return
        now = time.monotonic()
        self.times.append(now)
        if x > 0:
            self.latencies.append(now - x)


async def _worker(adapter: Adapter, config: dict[str, Any]) -> None:
    slots = Slots(Path(config["slots"]))
    index: int = config["index"]
    probe = Probe()
    stop = asyncio.Event()
    t_start, cpu_start = time.monotonic(), time.process_time()

    async def watch() -> None:
        seen, cpu_last = -1, cpu_start
        slots.set_ready(index)
        while not slots.stop_requested():
            count = len(probe.times)
            if count != seen:
                seen, cpu_last = count, time.process_time()
                slots.set_count(index, count)
            await asyncio.sleep(_WATCH_INTERVAL)
        result = {
            "t_start": t_start,
            "cpu_s": cpu_last - cpu_start,
            "times": probe.times,
            "latencies": probe.latencies,
            "unmeasured": probe.unmeasured,
        }
        _write_json(config["result"], result)
        stop.set()

    async def serve() -> None:
        await adapter.serve(
            config["url"], config["queue"], config["concurrency"], probe.done, stop
        )
        if not stop.is_set():
            raise RuntimeError("the library's worker stopped by itself")

    async with asyncio.TaskGroup() as tg:
        tg.create_task(watch())
        tg.create_task(serve())
    slots.close()


def _write_json(path: str, data: object) -> None:
    Path(path).write_text(json.dumps(data))


@dataclass
class WorkerResult:
    """One worker process's record."""

    t_start: float
    cpu_s: float
    times: list[float]
    latencies: list[float]
    unmeasured: int


class Workers:
    """Worker processes of one library, started and stopped together."""

    def __init__(self, driver: Driver, processes: int = 1) -> None:
        if not 1 <= processes <= _MAX_WORKERS:
            raise ValueError(f"1..{_MAX_WORKERS} worker processes")
        self._driver = driver
        self._n = processes
        self._dir = Path(tempfile.mkdtemp(prefix="bench-workers-", dir=driver.tmp))
        self._slots = Slots(self._dir / "slots", create=True)
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        d = self._driver
        for i in range(self._n):
            config = {
                "url": d.url,
                "queue": d.queue,
                "concurrency": d.concurrency,
                "slots": str(self._dir / "slots"),
                "index": i,
                "result": str(self._dir / f"result-{i}.json"),
                "options": d.options,
            }
            log_file = (self._dir / f"worker-{i}.log").open("wb")
            argv = [*d.worker_prefix, *d.worker_argv(json.dumps(config))]
            self._procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=d.root,
                )
            )
            log_file.close()

    def _check_alive(self) -> None:
        for i, proc in enumerate(self._procs):
            if proc.poll() is not None:
                tail = (self._dir / f"worker-{i}.log").read_text(errors="replace")
                raise RuntimeError(
                    f"worker {i} exited with {proc.returncode}:\n{tail[-4000:]}"
                )

    def count(self) -> int:
        return sum(self._slots.count(i) for i in range(self._n))

    async def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(self._slots.ready(i) for i in range(self._n)):
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("workers did not start")
            await asyncio.sleep(_POLL_INTERVAL)

    async def wait_count(self, target: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.count() < target:
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {self.count()} of {target} tasks done after {timeout}s"
                )
            await asyncio.sleep(_POLL_INTERVAL)

    def stop(self, timeout: float = 60.0) -> list[WorkerResult]:
        self._slots.request_stop()
        results = []
        for i, proc in enumerate(self._procs):
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log(f"worker {i} did not stop in {timeout}s: killed")
                proc.kill()
                proc.wait()
            path = self._dir / f"result-{i}.json"
            if not path.exists():
                tail = (self._dir / f"worker-{i}.log").read_text(errors="replace")
                raise RuntimeError(f"worker {i} left no result:\n{tail[-4000:]}")
            results.append(WorkerResult(**json.loads(path.read_text())))
        self._slots.close()
        return results

    def kill(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# -- the driver: workloads ----------------------------------------------------------


@dataclass
class Sizes:
    """How big each workload is (``--quick`` shrinks them)."""

    drain: int = 20_000
    enqueue_sequential: int = 5_000
    enqueue_batch: int = 20_000
    batch_size: int = 1_000
    in_flight: int = 100
    probes: int = 500
    delayed: int = 200
    interval: float = 0.020
    delay: float = 1.0
    warmup: int = 5
    backlog: int = 1_000_000
    processes: tuple[int, ...] = (1, 2, 4)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            drain=500,
            enqueue_sequential=200,
            enqueue_batch=500,
            batch_size=100,
            probes=30,
            delayed=20,
            backlog=5_000,
            processes=(1, 2),
        )


class Driver:
    """Runs every workload for one library and collects the figures."""

    def __init__(
        self,
        adapter: Adapter,
        module: str,
        *,
        url: str,
        sizes: Sizes,
        concurrency: int,
        options: dict[str, Any],
        worker_prefix: Sequence[str] = (),
        workloads: Sequence[str] = (),
        retries: int = 0,
        contended: float = 0.15,
    ) -> None:
        self.adapter = adapter
        self.module = module
        self.url = url
        self.sizes = sizes
        self.concurrency = concurrency
        self.options = options
        self.worker_prefix = list(worker_prefix)
        self.workloads = set(workloads)
        self.retries = retries
        self.contended = contended
        self.queue = "bench"
        self.root = str(Path(__file__).resolve().parents[2])
        self.tmp = tempfile.mkdtemp(prefix="bench-")
        self.resp = Resp(url)

    def wants(self, workload: str) -> bool:
        return not self.workloads or workload in self.workloads

    def flush(self) -> None:
        # SYNC: Valkey frees a lazily flushed keyspace in a background thread,
        # which would compete with the next measurement for the CPU.
        self.resp.call("FLUSHALL", "SYNC")

    async def guarded(
        self, name: str, measure: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Run *measure*; while other processes took more than ``contended`` of
        the CPU meanwhile, run it again (``retries`` times at most) and keep
        the least disturbed result. Each result records that share."""
        best: dict[str, Any] | None = None
        for attempt in range(self.retries + 1):
            watch = CpuWatch(self.resp, self.own_cpu)
            result = await measure()
            share = result["foreign_cpu_share"] = watch.share()
            if best is None or share < best["foreign_cpu_share"]:
                best = result
            if not share > self.contended:
                break
            if attempt < self.retries:
                log(f"{name}: other processes took {share:.0%} of the CPU; again")
                await wait_quiet(60)
        assert best is not None
        return best

    def snapshot(self) -> ServerSnapshot:
        return ServerSnapshot.take(self.resp)

    # -- what a driver in another language changes (benchmarks/peers/bullmq.py) --

    def worker_argv(self, config: str) -> list[str]:
        """The command of one worker process, given its JSON config."""
        return [sys.executable, "-m", self.module, "worker", config]

    def producer_cpu(self) -> float:
        """CPU seconds the producer has used so far (it enqueues in this
        process unless a subclass says otherwise)."""
        return time.process_time()

    def own_cpu(self) -> float:
        """CPU seconds this driver and its producer have used so far."""
        return time.process_time()

    @contextmanager
    def workers(self, processes: int = 1) -> Iterator[Workers]:
        group = Workers(self, processes)
        try:
            group.start()
            yield group
        finally:
            group.kill()

    # -- enqueue ------------------------------------------------------------------

    async def enqueue_sequential(self, n: int) -> float:
        enqueue = self.adapter.enqueue
        t0 = time.perf_counter()
        for _ in range(n):
            await enqueue(0.0)
        return n / (time.perf_counter() - t0)

    async def enqueue_concurrent(
        self, n: int, groups: Callable[[int], str | None] | None = None
    ) -> float:
        """*n* single enqueues with ``in_flight`` awaits outstanding at once."""
        enqueue = self.adapter.enqueue
        lanes = self.sizes.in_flight
        counter = iter(range(n))

        async def lane() -> None:
            for i in counter:
                await enqueue(0.0, group=None if groups is None else groups(i))

        t0 = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(lanes)))
        return n / (time.perf_counter() - t0)

    async def enqueue_batches(
        self,
        n: int,
        *,
        x: float = 0.0,
        groups: Callable[[int], str | None] | None = None,
        in_flight: int = 1,
    ) -> float:
        """*n* tasks through the batch API, ``batch_size`` a call, *in_flight* calls
        outstanding at once."""
        size = self.sizes.batch_size
        starts = iter(range(0, n, size))
        batch = self.adapter.enqueue_batch

        async def lane() -> None:
            for start in starts:
                stop = min(start + size, n)
                xs = [x] * (stop - start)
                gs = None if groups is None else [groups(i) for i in range(start, stop)]
                await batch(xs, gs)

        t0 = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(in_flight)))
        return n / (time.perf_counter() - t0)

    async def fill(self, n: int, groups: Callable[[int], str | None] | None) -> None:
        """Queue *n* drain tasks as fast as the library allows (not measured)."""
        if self.adapter.has_batch:
            await self.enqueue_batches(n, groups=groups, in_flight=2)
        else:
            await self.enqueue_concurrent(n, groups)

    # -- drains -------------------------------------------------------------------

    async def drain(self, n: int, processes: int = 1) -> dict[str, Any]:
        """Start *processes* workers on *n* queued tasks; time them to the end."""
        before = self.snapshot()
        with self.workers(processes) as group:
            await group.wait_count(n, timeout=max(120.0, n / 200))
            results = group.stop()
        after = self.snapshot()
        times = [t for r in results for t in r.times]
        start = min(r.t_start for r in results)
        figures: dict[str, Any] = {**drain_rates(times, start)}
        figures["worker_cpu_us"] = sum(r.cpu_s for r in results) * 1e6 / n
        figures["server"] = server_cost(before, after, n)
        figures["unmeasured_done"] = sum(r.unmeasured for r in results)
        figures["processes"] = processes
        return figures

    async def workload_enqueue(self) -> dict[str, Any]:
        """Sequential awaits, then the batch API where the library has one."""
        s = self.sizes
        self.flush()
        seq = await self.enqueue_sequential(s.enqueue_sequential)
        log(f"enqueue, sequential awaits: {seq:,.0f}/s")
        out: dict[str, Any] = {"sequential_per_s": seq}
        if self.adapter.has_batch:
            self.flush()
            before = self.snapshot()
            cpu0 = self.producer_cpu()
            batch = await self.enqueue_batches(s.enqueue_batch)
            out["batch"] = {
                "per_s": batch,
                "producer_cpu_us": (self.producer_cpu() - cpu0) * 1e6 / s.enqueue_batch,
                "server": server_cost(before, self.snapshot(), s.enqueue_batch),
            }
            log(f"enqueue, batch API ({s.batch_size} a call): {batch:,.0f}/s")
        self.flush()
        return out

    async def workload_drain(self) -> dict[str, Any]:
        """Enqueue N with 100 in flight (timed, costed), then drain them."""
        n = self.sizes.drain
        self.flush()
        before = self.snapshot()
        cpu0 = self.producer_cpu()
        rate = await self.enqueue_concurrent(n)
        producer_cpu = (self.producer_cpu() - cpu0) * 1e6 / n
        enqueue_cost = server_cost(before, self.snapshot(), n)
        log(f"enqueued {n} (100 in flight): {rate:,.0f}/s; draining")
        figures = await self.drain(n)
        figures["enqueue"] = {
            "per_s": rate,
            "producer_cpu_us": producer_cpu,
            "server": enqueue_cost,
        }
        log(
            f"drain: {figures['jobs_per_s']:,.0f} jobs/s, "
            f"steady {figures['steady_per_s']:,.0f}/s"
        )
        return figures

    async def workload_grouped_drain(self) -> dict[str, Any]:
        """Like :meth:`workload_drain`, every task in a group of its own."""
        n = self.sizes.drain
        self.flush()
        before = self.snapshot()
        cpu0 = self.producer_cpu()
        rate = await self.enqueue_concurrent(n, groups=lambda i: f"g{i}")
        producer_cpu = (self.producer_cpu() - cpu0) * 1e6 / n
        enqueue_cost = server_cost(before, self.snapshot(), n)
        log(f"enqueued {n} grouped (100 in flight): {rate:,.0f}/s; draining")
        figures = await self.drain(n)
        figures["enqueue"] = {
            "per_s": rate,
            "producer_cpu_us": producer_cpu,
            "server": enqueue_cost,
        }
        log(
            f"grouped drain: {figures['jobs_per_s']:,.0f} jobs/s, "
            f"steady {figures['steady_per_s']:,.0f}/s"
        )
        return figures

    async def workload_backlog(self) -> dict[str, Any]:
        """One group holds a huge backlog; N tasks of distinct groups are timed."""
        n, backlog = self.sizes.drain, self.sizes.backlog
        self.flush()
        memory0 = self.snapshot().used_memory
        t0 = time.perf_counter()
        await self.enqueue_batches(backlog, x=-1.0, groups=lambda _: "hot", in_flight=2)
        fill_s = time.perf_counter() - t0
        log(f"backlog of {backlog:,} in one group queued in {fill_s:.1f}s")
        await self.enqueue_batches(n, groups=lambda i: f"g{i}", in_flight=2)
        memory = self.snapshot().used_memory
        figures = await self.drain(n)
        figures["backlog"] = backlog
        figures["backlog_fill_s"] = fill_s
        figures["server_memory_mb"] = memory / 2**20
        figures["backlog_memory_mb"] = (memory - memory0) / 2**20
        log(
            f"drain beside the backlog: {figures['jobs_per_s']:,.0f} jobs/s, "
            f"steady {figures['steady_per_s']:,.0f}/s; "
            f"{figures['unmeasured_done']} backlog tasks ran meanwhile"
        )
        self.flush()
        return figures

    async def workload_grouped_batch(self) -> dict[str, Any]:
        """N tasks in 100 groups (N/100 each), drained one task a handler
        call, then again by a batch handler (``batch_size`` 50)."""
        n, groups, size = self.sizes.drain, 100, 50
        out: dict[str, Any] = {"groups": groups, "batch_size": size}
        for key, options in (("single", {}), ("batch", {"batch_size": str(size)})):

            async def once(options: dict[str, str] = options) -> dict[str, Any]:
                self.flush()
                await self.fill(n, groups=lambda i: f"g{i % groups}")
                saved = self.options
                self.options = {**saved, **options}
                try:
                    return await self.drain(n)
                finally:
                    self.options = saved

            out[key] = await self.guarded(f"grouped {key} drain", once)
        log(
            f"{groups} groups, one task a call: {out['single']['jobs_per_s']:,.0f} "
            f"jobs/s; batch_size={size}: {out['batch']['jobs_per_s']:,.0f} jobs/s"
        )
        return out

    async def workload_processes(self) -> dict[str, Any]:
        """Grouped drain by 1, 2, 4 worker processes (each at full concurrency)."""
        n = self.sizes.drain
        out: dict[str, Any] = {}
        for processes in self.sizes.processes:

            async def once(processes: int = processes) -> dict[str, Any]:
                self.flush()
                await self.fill(n, groups=lambda i: f"g{i}")
                return await self.drain(n, processes)

            figures = await self.guarded(f"{processes} process(es)", once)
            out[str(processes)] = figures
            log(
                f"{processes} process(es): {figures['jobs_per_s']:,.0f} jobs/s, "
                f"steady {figures['steady_per_s']:,.0f}/s"
            )
        return out

    # -- latency ------------------------------------------------------------------

    async def _paced(self, count: int, send: Callable[[], Awaitable[None]]) -> None:
        interval = self.sizes.interval
        t0 = time.monotonic()
        for i in range(count):
            await send()
            pause = t0 + (i + 1) * interval - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)

    async def warm_up(self, count: int) -> None:
        """*count* unmeasured probes 50 ms apart, before the measured ones."""
        for _ in range(count):
            await self.adapter.enqueue(time.monotonic())
            await asyncio.sleep(0.05)

    async def send_probes(self, count: int, delay: float | None = None) -> None:
        """*count* probes, one every ``interval``; each one's payload is its
        send time, or with *delay* its due time, read just before the call."""
        enqueue = self.adapter.enqueue

        async def send() -> None:
            if delay is None:
                await enqueue(time.monotonic())
            else:
                await enqueue(time.monotonic() + delay, delay=delay)

        await self._paced(count, send)

    async def workload_latency(self) -> dict[str, Any]:
        """Idle pickup latency, then delayed-task lateness, on one idle worker."""
        s = self.sizes
        out: dict[str, Any] = {}
        self.flush()
        with self.workers(1) as group:
            await group.wait_ready()
            await self.warm_up(s.warmup)
            await group.wait_count(s.warmup, timeout=60)
            await asyncio.sleep(0.2)
            await self.send_probes(s.probes)
            await group.wait_count(s.warmup + s.probes, timeout=60)
            expected = s.warmup + s.probes
            if self.adapter.has_delay and (
                self.wants("delayed") or self.wants("latency")
            ):
                await asyncio.sleep(0.2)
                await self.send_probes(s.delayed, s.delay)
                expected += s.delayed
                await group.wait_count(expected, timeout=60)
            [result] = group.stop()
        lat = result.latencies
        pickups = lat[s.warmup : s.warmup + s.probes]
        out["pickup_ms"] = {
            "p50": percentile(pickups, 50) * 1e3,
            "p99": percentile(pickups, 99) * 1e3,
            "max": max(pickups) * 1e3,
            "samples": len(pickups),
        }
        log(
            f"idle pickup: p50 {out['pickup_ms']['p50']:.2f} ms, "
            f"p99 {out['pickup_ms']['p99']:.2f} ms"
        )
        if len(lat) > s.warmup + s.probes:
            late = lat[s.warmup + s.probes :]
            out["delayed_ms"] = {
                "p50": percentile(late, 50) * 1e3,
                "p99": percentile(late, 99) * 1e3,
                "min": min(late) * 1e3,
                "max": max(late) * 1e3,
                "samples": len(late),
            }
            log(
                f"delayed lateness: p50 {out['delayed_ms']['p50']:.2f} ms, "
                f"p99 {out['delayed_ms']['p99']:.2f} ms"
            )
        return out

    # -- all ----------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        s, a = self.sizes, self.adapter
        result: dict[str, Any] = {
            "label": a.label,
            "versions": a.versions(),
            "settings": a.settings,
            "has_batch": a.has_batch,
            "has_delay": a.has_delay,
            "has_groups": a.has_groups,
            "concurrency": self.concurrency,
            "sizes": {k: v for k, v in vars(s).items() if not k.startswith("_")},
        }
        await a.open(self.url, self.queue)
        try:
            if self.wants("enqueue"):
                enqueue = await self.guarded("enqueue", self.workload_enqueue)
                result["enqueue_sequential_per_s"] = enqueue["sequential_per_s"]
                result["enqueue_foreign_cpu_share"] = enqueue["foreign_cpu_share"]
                if "batch" in enqueue:
                    result["enqueue_batch"] = enqueue["batch"]
            if self.wants("drain"):
                result["drain"] = await self.guarded("drain", self.workload_drain)
            if self.wants("latency") or self.wants("delayed"):
                result["latency"] = await self.guarded("latency", self.workload_latency)
            if a.has_groups:
                if self.wants("grouped"):
                    result["grouped_drain"] = await self.guarded(
                        "grouped drain", self.workload_grouped_drain
                    )
                if self.wants("backlog"):
                    result["backlog_drain"] = await self.guarded(
                        "backlog drain", self.workload_backlog
                    )
                if self.wants("processes"):
                    result["processes"] = await self.workload_processes()
                if a.has_batches and self.wants("grouped-batch"):
                    result["grouped_batch"] = await self.workload_grouped_batch()
        finally:
            await a.close()
            self.flush()
            self.resp.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
        return result


def _versions(distributions: Sequence[str]) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in distributions:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "?"
    return out


# -- entry point ----------------------------------------------------------------------


def _loop_factory(
    options: Mapping[str, Any],
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop the ``loop`` option asks for (``None``: asyncio's)."""
    if options.get("loop", "asyncio") == "asyncio":
        return None
    import uvloop

    return uvloop.new_event_loop


def main(
    factory: Callable[[dict[str, Any]], Adapter],
    module: str,
    driver_class: type[Driver] = Driver,
) -> None:
    """``<module> drive --url URL --out FILE [...]`` or ``<module> worker CONFIG``.

    *driver_class* is for a library whose producer and workers are not Python
    (BullMQ): its driver changes how they are started and timed."""
    if len(sys.argv) >= 3 and sys.argv[1] == "worker":
        config = json.loads(sys.argv[2])
        worker_options = config.get("options", {})
        with asyncio.Runner(loop_factory=_loop_factory(worker_options)) as runner:
            runner.run(_worker(factory(worker_options), config))
        return
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("mode", choices=["drive"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--workloads", default="", help="comma-separated subset")
    parser.add_argument("--drain", type=int, help="override N")
    parser.add_argument("--backlog", type=int, help="override the backlog size")
    parser.add_argument("--processes", help="override the process counts (1,2,4)")
    parser.add_argument(
        "--worker-prefix", default="", help="command to wrap workers in (profiling)"
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=0,
        help="measure a workload again (at most this often) while other processes "
        "took more than --contended of the CPU",
    )
    parser.add_argument("--contended", type=float, default=0.15)
    args = parser.parse_args()
    options = dict(item.split("=", 1) for item in args.option)
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.drain:
        sizes.drain = args.drain
    if args.backlog:
        sizes.backlog = args.backlog
    if args.processes:
        sizes.processes = tuple(int(p) for p in args.processes.split(","))
    driver = driver_class(
        factory(options),
        module,
        url=args.url,
        sizes=sizes,
        concurrency=args.concurrency,
        options=options,
        worker_prefix=args.worker_prefix.split(),
        workloads=[w for w in args.workloads.split(",") if w],
        retries=args.retries,
        contended=args.contended,
    )
    with asyncio.Runner(loop_factory=_loop_factory(options)) as runner:
        result = runner.run(driver.run())
    result["loop"] = options.get("loop", "asyncio")
    args.out.write_text(json.dumps(result, indent=1))
