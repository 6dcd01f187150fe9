"""``python -m benchmarks.functions``: the server's cost of a task's life
by each way a script call takes: ``FCALL`` of the package's functions
library (``aiogroupq/_store/functions.py``), or ``EVALSHA`` of its scripts.

The same calls of the package's own (``_store.scripts``: enqueue by 1,000
or one at a time, claim by 20 and finish by 10 with about 100 tasks in
flight, as a consumer with concurrency 100 keeps them coming; and an idle
pickup, one task enqueued, claimed and finished at a time), once by each
way, alternating, on one server; the server's CPU and script time per task
read between the stages (``INFO cpu`` and ``INFO commandstats``, as the
main benchmark does). Ungrouped, then every task in a group of its own.

Standalone, the run starts a throwaway server pinned to the first core (as
``python -m benchmarks.floor`` does); with ``--url`` it uses that one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import redis.asyncio

from aiogroupq._store import functions as _functions, scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from benchmarks._report import table, us
from benchmarks.peers._harness import Resp, ServerSnapshot, server_cost
from benchmarks.script_ab import IN_FLIGHT, claim_all, finish_all, new_task

WAYS = ("evalsha", "fcall")
STAGES = ("enqueue_many", "claim", "finish", "enqueue", "idle_pickup")


async def _round(
    url: str, way: str, n: int, lone: int, grouped: bool
) -> dict[str, dict[str, Any]]:
    """One round by *way*: each stage's cost."""
    resp = Resp(url)
    client = redis.asyncio.Redis.from_url(url)
    if way == "evalsha":
        _functions.settle(client, fcall=False)
    keys = QueueKeys("functions")
    costs: dict[str, dict[str, Any]] = {}
    try:
        resp.call("FLUSHDB")
        # Every script once before the snapshots: loading is not a task's cost.
        warm = [new_task(i, grouped) for i in range(-2, 0)]
        await _scripts.enqueue(client, keys, warm[:1], dedup_window_ms=60_000)
        await _scripts.enqueue(client, keys, warm[1:], dedup_window_ms=60_000)
        await finish_all(client, keys, await claim_all(client, keys, 2, 20), 10)
        resp.call("FLUSHDB")

        async def stage(name: str, tasks: int, work: Any) -> Any:
            before = ServerSnapshot.take(resp)
            out = await work
            costs[name] = server_cost(before, ServerSnapshot.take(resp), tasks)
            return out

        tasks = [new_task(i, grouped) for i in range(n)]
        batches = [
            stage_enq
            for i in range(0, n, 1000)
            for stage_enq in [
                _scripts.enqueue(
                    client, keys, tasks[i : i + 1000], dedup_window_ms=60_000
                )
            ]
        ]
        await stage("enqueue_many", n, _sequence(batches))
        claimed = await stage("claim", n, claim_all(client, keys, n, 20))
        await stage("finish", n, finish_all(client, keys, claimed, 10))
        if sorted(t.id for t in claimed) != sorted(t.id for t in tasks):
            raise RuntimeError("the drain did not return every task once")

        singles = [new_task(n + i, grouped) for i in range(lone)]
        await stage(
            "enqueue",
            lone,
            _sequence(
                [
                    _scripts.enqueue(client, keys, [t], dedup_window_ms=60_000)
                    for t in singles
                ]
            ),
        )
        await finish_all(client, keys, await claim_all(client, keys, lone, 20), 10)

        async def pickups() -> None:
            for i in range(lone):
                task = new_task(n + lone + i, grouped)
                await _scripts.enqueue(client, keys, [task], dedup_window_ms=60_000)
                got = await claim_all(client, keys, 1, 1)
                await finish_all(client, keys, got, 1)

        await stage("idle_pickup", lone, pickups())
        return costs
    finally:
        await client.aclose()
        resp.close()


async def _sequence(calls: Sequence[Any]) -> None:
    for call in calls:
        await call


def measure(url: str, n: int, lone: int, rounds: int) -> dict[str, Any]:
    """Per variant (ungrouped, own groups) and transport, each stage's
    server CPU and script time per task: medians of *rounds*, the two
    transports alternating."""
    out: dict[str, Any] = {}
    for grouped in (False, True):
        variant = "own_groups" if grouped else "ungrouped"
        runs: dict[str, list[dict[str, dict[str, Any]]]] = {w: [] for w in WAYS}
        for _ in range(rounds):
            for way in WAYS:
                runs[way].append(asyncio.run(_round(url, way, n, lone, grouped)))
        out[variant] = {
            way: {
                stage: {
                    f: statistics.median(r[stage][f] for r in runs[way])
                    for f in ("redis_cpu_us", "script_us")
                }
                for stage in STAGES
            }
            for way in WAYS
        }
    return out


#: a task's life: its enqueue's stage, then the drain's
LIVES = {
    "life, enqueue_many()": ("enqueue_many", "claim", "finish"),
    "life, enqueue()": ("enqueue", "claim", "finish"),
}


def report(figures: dict[str, Any]) -> str:
    """Stage x variant: server CPU per task, EVALSHA against FCALL."""
    rows = []

    def cpu(variant: str, way: str, stages: Sequence[str]) -> float:
        return float(sum(figures[variant][way][s]["redis_cpu_us"] for s in stages))

    for label, stages in [*((s, (s,)) for s in STAGES), *LIVES.items()]:
        row = [label.replace("_", " ")]
        for variant in ("ungrouped", "own_groups"):
            old, new = cpu(variant, "evalsha", stages), cpu(variant, "fcall", stages)
            row += [us(old), us(new), f"{new / old:.2f}x"]
        rows.append(row)
    headers = ["server CPU per task (µs)"]
    for variant in ("ungrouped", "own groups"):
        headers += [f"{variant}: EVALSHA", f"{variant}: FCALL", f"{variant}: ratio"]
    return table(headers, rows)


def main(argv: list[str] | None = None) -> None:
    """Measure both transports and print the table."""
    from benchmarks._runner import server_info, throwaway_server
    from benchmarks.floor import pin_server

    parser = argparse.ArgumentParser(prog="python -m benchmarks.functions")
    parser.add_argument("-n", "--tasks", type=int, default=20_000)
    parser.add_argument(
        "--lone", type=int, default=2_000, help="lone enqueues and pickups"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="use this server instead of starting one")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        pinned = "not pinned (--url)"
        if args.url:
            url = args.url
        else:
            server = stack.enter_context(throwaway_server())
            url = server.url
            if server.pid is not None:
                pinned = pin_server(server.pid)
        info = server_info(url)
        figures = measure(url, args.tasks, args.lone, args.rounds)
    print(
        f"{info['server']} {info['server_version']}, {pinned}; N = {args.tasks:,} "
        f"(enqueue by 1,000, claim by 20, finish by 10, {IN_FLIGHT} in flight), "
        f"{args.lone:,} lone enqueues and idle pickups; medians of {args.rounds} "
        "alternating rounds.\n"
    )
    print(report(figures))


if __name__ == "__main__":
    main(sys.argv[1:])
