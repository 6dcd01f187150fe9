"""Throughput of one queue over a Redis Cluster of 1, 2 and 3 primaries:
``python -m benchmarks.cluster [--tasks N] [--groups G] [--partitions K]
[--masters 1,2,3] [--concurrency C]``.

For each cluster size M (a throwaway cluster on loopback ports, no
replicas), a queue of K partitions (default 24, so that the partitions
spread over 1, 2 and 3 primaries) is filled with N tasks (default
20,000) over G groups (default 2,000) plus as many ungrouped ones; then M
consumer processes (C handlers each, a no-op handler) drain it. Printed per
size: tasks/s from the moment every consumer is ready (the queue is
paused while they start) to the last task done (counted in the processes,
no Redis call), and each primary's Redis CPU (user + system, ``INFO cpu``)
spent meanwhile, per task that primary held. Figures are printed, never asserted (docs/scaling.md explains
them, and what they say about 10, 100 and 1,000 nodes).

On a machine with fewer cores than primaries plus consumer processes the
nodes share cores: throughput then stops growing with M, while CPU per task
per node (what the scaling arithmetic needs) stays meaningful.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections import Counter
from typing import Any

import anyio
import redis

import aiogroupq
from aiogroupq._store.keys import QueueKeys, id_partition
from aiogroupq.testing._cluster_server import ClusterProcess

QUEUE = "cluster-bench"
BATCH = 500


def _consume(
    url: str, concurrency: int, ready: Any, stop: Any, done: Any, slot: int
) -> None:
    count = 0

    async def noop(_: object) -> None:
        nonlocal count
        count += 1

    async def main() -> None:
        async with aiogroupq.Consumer(
            url, queue=QUEUE, handlers={"noop": noop}, concurrency=concurrency
        ):
            ready.set()
            # A multiprocessing Event cannot be awaited; polling it is cheap.
            while not stop.is_set():
                done[slot] = count  # counted here: no Redis call
                await anyio.sleep(0.02)

    anyio.run(main, backend="asyncio")


def _cpu(node_client: redis.Redis) -> float:
    info: Any = node_client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _fill(url: str, tasks: int, groups: int, partitions: int) -> Counter[int]:
    """Enqueue the backlog; return how many tasks each partition got."""
    per_partition: Counter[int] = Counter()
    async with aiogroupq.Producer(url, queue=QUEUE, partitions=partitions) as p:
        for start in range(0, tasks, BATCH):
            batch = [
                aiogroupq.Task("noop", n, group=f"g{n % groups}" if n % 2 else None)
                for n in range(start, min(tasks, start + BATCH))
            ]
            for task_id in await p.enqueue_many(batch):
                per_partition[id_partition(task_id)] += 1
    return per_partition


async def _pause(url: str, paused: bool) -> None:
    async with aiogroupq.Admin(url, queue=QUEUE) as admin:
        await (admin.pause() if paused else admin.resume())


def run_size(
    masters: int, tasks: int, groups: int, partitions: int, concurrency: int
) -> dict[str, Any]:
    """One cluster size: its figures."""
    with ClusterProcess(masters=masters) as cluster:
        url = cluster.url
        nodes = cluster.primaries()
        clients = {n.port: cluster.client(n) for n in nodes}
        fill_before = sum(_cpu(c) for c in clients.values())
        per_partition = anyio.run(_fill, url, tasks, groups, partitions)
        fill_cpu = sum(_cpu(c) for c in clients.values()) - fill_before
        owners = {
            p: cluster.primary_of(QueueKeys(QUEUE, p).prefix).port
            for p in range(partitions)
        }
        tasks_on: Counter[int] = Counter()
        for p, count in per_partition.items():
            tasks_on[owners[p]] += count
        ctx = multiprocessing.get_context("spawn")
        stop = ctx.Event()
        readies = [ctx.Event() for _ in range(masters)]
        done = ctx.Array("q", masters, lock=False)
        procs = [
            ctx.Process(
                target=_consume,
                args=(url, concurrency, r, stop, done, i),
                daemon=True,
            )
            for i, r in enumerate(readies)
        ]
        # Paused while the processes start: the clock runs from the moment
        # all of them are ready, and the queue resumes.
        anyio.run(_pause, url, True)
        for proc in procs:
            proc.start()
        try:
            while not all(r.is_set() for r in readies):
                if any(p.exitcode is not None for p in procs):
                    raise RuntimeError("a consumer process died")
                time.sleep(0.05)
            cpu_before = {port: _cpu(c) for port, c in clients.items()}
            started = time.perf_counter()
            anyio.run(_pause, url, False)
            while sum(done) < tasks:
                if any(p.exitcode is not None for p in procs):
                    raise RuntimeError("a consumer process died")
                time.sleep(0.02)
            elapsed = time.perf_counter() - started
            cpu = {port: _cpu(c) - cpu_before[port] for port, c in clients.items()}
        finally:
            stop.set()
            for proc in procs:
                proc.join(30)
        for c in clients.values():
            c.close()
    return {
        "masters": masters,
        "consumer_processes": masters,
        "tasks": tasks,
        "seconds": elapsed,
        "tasks_per_s": tasks / elapsed,
        "enqueue_cpu_us_per_task": 1e6 * fill_cpu / tasks,
        "per_node": [
            {
                "port": port,
                "tasks": tasks_on[port],
                "cpu_s": cpu[port],
                "cpu_us_per_task": 1e6 * cpu[port] / max(1, tasks_on[port]),
            }
            for port in sorted(cpu)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--groups", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--masters", default="1,2,3")
    args = parser.parse_args(argv)
    sizes = [int(m) for m in args.masters.split(",")]
    print(
        f"cluster benchmark: {args.tasks:,} no-op tasks (half in "
        f"{args.groups:,} groups), {args.partitions} partitions, "
        f"{args.concurrency} handlers per consumer process, "
        f"{os.cpu_count()} CPU cores on this machine"
    )
    print(
        "| primaries | consumer processes | tasks/s | Redis CPU per task run, "
        "per primary (us) | tasks per primary | Redis CPU per task enqueued "
        f"(us, batches of {BATCH}) |"
    )
    print("|---|---|---|---|---|---|")
    for masters in sizes:
        r = run_size(
            masters, args.tasks, args.groups, args.partitions, args.concurrency
        )
        per = ", ".join(f"{n['cpu_us_per_task']:.0f}" for n in r["per_node"])
        spread = ", ".join(f"{n['tasks']:,}" for n in r["per_node"])
        print(
            f"| {masters} | {masters} | {r['tasks_per_s']:,.0f} | {per} | {spread} "
            f"| {r['enqueue_cpu_us_per_task']:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
