"""What group scheduling costs: ``python -m benchmarks.scheduling [--tasks N]``.

Drains the same grouped workload (N no-op tasks over N/10 groups, 10 tasks a
group, enqueued interleaved) with one consumer of concurrency 100, once per
variant, in one run against one throwaway server (or ``--url``, whose
database is flushed):

- plain: groups of concurrency 1, round-robin (the defaults);
- drain fairness (``configure(fairness="drain")``);
- group concurrency 4 (``configure(group_concurrency=4)``);
- a rate limit on half the groups (``set_group(rate=Rate(10_000, 1.0))``: high
  enough never to hold a group back, so what is measured is its bookkeeping);
- 3 priority levels (tasks of priority 0, 4 and 9, in turn);
- weight 3 on half the groups (``set_group(weight=3)``);
- exclusive ordering on half the groups (``set_group(ordering="exclusive")``).

After one uncounted warm-up drain, ``--rounds`` rounds (default 3) each
drain every variant in turn; the best drain rate of each is kept,
and Redis CPU per task comes from ``INFO cpu`` around that drain. The target:
each variant within 15 % of the plain drain.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import redis.asyncio

import aiogroupq
from benchmarks._runner import server_info, throwaway_server

QUEUE = "sched-bench"
GROUP_SIZE = 10

Setup = Callable[[aiogroupq.Admin, int], Awaitable[None]]


async def _nothing(admin: aiogroupq.Admin, groups: int) -> None:
    return None


async def _drain_fairness(admin: aiogroupq.Admin, groups: int) -> None:
    await admin.configure(fairness="drain")


async def _concurrency(admin: aiogroupq.Admin, groups: int) -> None:
    await admin.configure(group_concurrency=4)


async def _rates(admin: aiogroupq.Admin, groups: int) -> None:
    for g in range(0, groups, 2):
        await admin.set_group(f"g{g}", rate=aiogroupq.Rate(10_000, 1.0))


async def _weights(admin: aiogroupq.Admin, groups: int) -> None:
    for g in range(0, groups, 2):
        await admin.set_group(f"g{g}", weight=3)


async def _exclusive(admin: aiogroupq.Admin, groups: int) -> None:
    for g in range(0, groups, 2):
        await admin.set_group(f"g{g}", ordering="exclusive")


VARIANTS: list[tuple[str, Setup, bool]] = [
    ("plain (round-robin, concurrency 1)", _nothing, False),
    ("fairness drain", _drain_fairness, False),
    ("group concurrency 4", _concurrency, False),
    ("rate limit on half the groups", _rates, False),
    ("3 priority levels", _nothing, True),
    ("weight 3 on half the groups", _weights, False),
    ("exclusive ordering on half the groups", _exclusive, False),
]


async def _server_cpu(client: redis.asyncio.Redis) -> float:
    info: Any = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def _once(
    url: str, n: int, setup: Setup, priorities: bool
) -> tuple[float, float]:
    """One drain: (tasks per second, Redis CPU µs per task)."""
    client = redis.asyncio.Redis.from_url(url)
    await client.flushdb()
    groups = n // GROUP_SIZE
    async with (
        aiogroupq.Admin(client, queue=QUEUE) as admin,
        aiogroupq.Producer(client, queue=QUEUE) as producer,
    ):
        await setup(admin, groups)
        tasks = [
            aiogroupq.Task(
                "noop",
                i,
                group=f"g{i % groups}",
                priority=(0, 4, 9)[i % 3] if priorities else None,
            )
            for i in range(n)
        ]
        for start in range(0, n, 1000):
            await producer.enqueue_many(tasks[start : start + 1000])
    done = 0
    finished = anyio.Event()

    async def noop(x: int) -> None:
        nonlocal done
        done += 1
        if done == n:
            finished.set()

    cpu0 = await _server_cpu(client)
    t0 = time.perf_counter()
    async with aiogroupq.Consumer(
        url, queue=QUEUE, handlers={"noop": noop}, concurrency=100
    ):
        await finished.wait()
        elapsed = time.perf_counter() - t0
    cpu = await _server_cpu(client) - cpu0
    await client.aclose()
    return n / elapsed, cpu * 1e6 / n


async def measure(url: str, n: int, rounds: int) -> list[tuple[str, float, float]]:
    # One uncounted drain warms the server and the interpreter; rounds go
    # through every variant in turn, so a slow spell of the machine is shared
    # out rather than landing on one variant.
    await _once(url, n, _nothing, False)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in VARIANTS}
    for _ in range(rounds):
        for name, setup, priorities in VARIANTS:
            runs[name].append(await _once(url, n, setup, priorities))
    rows = []
    for name, results in runs.items():
        best = max(results, key=lambda r: r[0])
        print(f"  {name}: {best[0]:,.0f}/s", file=sys.stderr)
        rows.append((name, *best))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scheduling")
    parser.add_argument("--tasks", type=int, default=20_000, help="N (20,000)")
    parser.add_argument("--rounds", type=int, default=3, help="drains per variant")
    parser.add_argument("--url", help="a server to use (its database is flushed)")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.scheduling " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    if args.url:
        rows = anyio.run(measure, args.url, args.tasks, args.rounds)
        server = server_info(args.url)
    else:
        with throwaway_server() as throwaway:
            rows = anyio.run(measure, throwaway.url, args.tasks, args.rounds)
            server = server_info(throwaway.url)
    plain = rows[0][1]
    print(f"$ {command.strip()}")
    print(
        f"aiogroupq {aiogroupq.__version__}; {server['server']} "
        f"{server['server_version']}; {args.tasks:,} tasks over "
        f"{args.tasks // GROUP_SIZE:,} groups; one consumer, concurrency 100; "
        f"best of {args.rounds}"
    )
    print()
    print("| variant | drain (tasks/s) | vs plain | Redis CPU (µs/task) |")
    print("| --- | --: | --: | --: |")
    for name, rate, cpu in rows:
        print(f"| {name} | {rate:,.0f} | {rate / plain:.0%} | {cpu:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
