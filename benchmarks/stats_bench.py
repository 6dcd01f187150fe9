"""What the operator views cost on a large queue:
``python -m benchmarks.stats_bench [--tasks N] [--groups G] [--url URL]``.

Builds a queue of N tasks (default 1,000,000) spread over G groups (default
100,000; each group's head ready, the rest in its line), with some tasks
running, retrying, halted, delayed and dead, then times each view many
times: the round trip seen by the client and the server's own time per call
(``INFO commandstats``), and checks that ``stats()`` answers in one round
trip. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import redis.asyncio

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from benchmarks._runner import server_info, throwaway_server

QUEUE = "stats-bench"
KEYS = QueueKeys(QUEUE)
BATCH = 1_000
#: calls per view measured
CALLS = 200


async def _build(client: redis.asyncio.Redis, tasks: int, groups: int) -> float:
    """The queue: task n in group n % groups; returns the seconds it took."""
    started = time.perf_counter()
    async with aiogroupq.Producer(client, queue=QUEUE) as producer:
        for start in range(0, tasks, BATCH):
            await producer.enqueue_many(
                aiogroupq.Task("noop", n, group=f"g{n % groups}")
                for n in range(start, min(tasks, start + BATCH))
            )
        await producer.enqueue_many(
            aiogroupq.Task("later", n, delay=3600) for n in range(BATCH)
        )
    # Some of every state: running, waiting for a retry, halted, dead.
    reply = await _scripts.claim(
        client, KEYS, "bench", k=400, lease_ms=3_600_000, scan_limit=500
    )
    ends: list[tuple[str, str | int]] = [
        ("retry", 3_600_000),
        ("halt", "Boom"),
        ("dead", "Boom"),
    ]
    outcomes = [
        _scripts.Outcome(t.id, t.token, kind, arg1, "")
        for t, (kind, arg1) in zip(reply.tasks[:300], ends * 100, strict=True)
    ]
    await _scripts.finish(client, KEYS, outcomes, retention_ms=60_000)
    await _scripts.heartbeat(
        client,
        KEYS,
        [],
        lease_ms=3_600_000,
        consumer="bench",
        registration=[("host", "bench"), ("pid", 1), ("c", 400), ("n", 100)],
    )
    return time.perf_counter() - started


async def _server_usec(
    client: redis.asyncio.Redis, command: str = "evalsha"
) -> tuple[int, int]:
    """(calls, µs) of *command* so far, from INFO commandstats. A script's
    time includes the commands it calls, which are also counted on their
    own: only EVALSHA is read for the scripts."""
    info: Any = await client.info("commandstats")
    stat = info.get(f"cmdstat_{command}", {"calls": 0, "usec": 0})
    return int(stat["calls"]), int(stat["usec"])


async def _time(
    client: redis.asyncio.Redis, label: str, call: Callable[[], Awaitable[object]]
) -> dict[str, Any]:
    await call()  # loads the script
    before = await _server_usec(client)
    seconds = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        await call()
        seconds.append(time.perf_counter() - t0)
    after = await _server_usec(client)
    calls = after[0] - before[0]
    seconds.sort()
    return {
        "view": label,
        "median_ms": statistics.median(seconds) * 1000,
        "p99_ms": seconds[int(len(seconds) * 0.99) - 1] * 1000,
        "max_ms": seconds[-1] * 1000,
        "server_us_per_call": (after[1] - before[1]) / CALLS,
        "round_trips_per_call": calls / CALLS,
    }


async def measure(
    url: str, tasks: int, groups: int
) -> tuple[float, list[dict[str, Any]], aiogroupq.QueueStats]:
    client = redis.asyncio.Redis.from_url(url)
    await client.flushdb()
    build = await _build(client, tasks, groups)
    memory: Any = await client.info("memory")
    rows = []
    async with (
        aiogroupq.Admin(client, queue=QUEUE) as admin,
        aiogroupq.Producer(client, queue=QUEUE) as producer,
    ):
        stats = await admin.stats()
        deep: Any = await client.lindex(KEYS.parked("g77"), -1)
        deep_id = bytes(deep).decode()
        halted = (await admin.groups(sort="halted", limit=1)).groups[0].group
        ready: list[Any] = await client.lrange(KEYS.ready, 0, 19_999)
        ids = [bytes(i).decode() for i in ready]
        views: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("stats()", admin.stats),
            ("group_info(a group with a line)", lambda: admin.group_info("g77")),
            ("group_info(a halted group)", lambda: admin.group_info(halted)),
            ("groups(busiest, limit=20)", lambda: admin.groups(limit=20)),
            ("groups(oldest, limit=100)", lambda: admin.groups(sort="oldest", limit=100)),
            (
                "groups(busiest, page 500 of 20)",
                lambda: admin.groups(limit=20, cursor=10_000),
            ),
            ("task() of a task at the end of its line", lambda: admin.task(deep_id)),
            ("consumers()", admin.consumers),
        ]  # fmt: skip
        empty = await client.script_load("#!lua flags=no-writes\nreturn 1")
        views.insert(
            0, ("(an empty script, for scale)", lambda: client.evalsha(empty, 0))
        )
        for label, call in views:
            rows.append(await _time(client, label, call))
        # status_many: fewer calls, each one pipeline of script calls.
        await producer.status_many(ids[:1])  # loads the script
        before = await _server_usec(client)
        seconds = []
        for _ in range(10):
            t0 = time.perf_counter()
            await producer.status_many(ids)
            seconds.append(time.perf_counter() - t0)
        after = await _server_usec(client)
        seconds.sort()
        rows.append(
            {
                "view": f"status_many({len(ids):,} ids), one pipeline",
                "median_ms": statistics.median(seconds) * 1000,
                "p99_ms": seconds[-1] * 1000,
                "max_ms": seconds[-1] * 1000,
                "server_us_per_call": (after[1] - before[1]) / 10,
                "round_trips_per_call": (after[0] - before[0]) / 10,
            }
        )
    stats_used = memory.get("used_memory_human", "?")
    rows.append({"view": f"(server memory: {stats_used})"})
    await client.aclose()
    return build, rows, stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stats_bench")
    parser.add_argument("--tasks", type=int, default=1_000_000, help="(1,000,000)")
    parser.add_argument("--groups", type=int, default=100_000, help="(100,000)")
    parser.add_argument("--url", help="a server to use (its database is flushed)")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.stats_bench " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    if args.url:
        build, rows, stats = anyio.run(measure, args.url, args.tasks, args.groups)
        server = server_info(args.url)
    else:
        with throwaway_server() as throwaway:
            build, rows, stats = anyio.run(
                measure, throwaway.url, args.tasks, args.groups
            )
            server = server_info(throwaway.url)
    print(f"$ {command.strip()}")
    print(
        f"aiogroupq {aiogroupq.__version__}; {server['server']} "
        f"{server['server_version']}; {args.tasks:,} tasks over {args.groups:,} "
        f"groups, built in {build:.1f} s; {CALLS} calls per view"
    )
    print(
        f"stats(): ready {stats.ready:,}, parked {stats.parked:,}, running "
        f"{stats.running:,}, delayed {stats.delayed:,}, dead {stats.dead:,}, "
        f"groups {stats.groups:,} ({stats.groups_waiting:,} with a line, "
        f"{stats.groups_halted:,} halted)"
    )
    print()
    print(
        "| view | median (ms) | p99 (ms) | max (ms) | server µs/call | scripts/call |"
    )
    print("| --- | --: | --: | --: | --: | --: |")
    for row in rows:
        if "median_ms" not in row:
            continue
        print(
            f"| {row['view']} | {row['median_ms']:.2f} | {row['p99_ms']:.2f} | "
            f"{row['max_ms']:.2f} | {row['server_us_per_call']:.0f} | "
            f"{row['round_trips_per_call']:,.0f} |"
        )
    for row in rows:
        if "median_ms" not in row:
            print(f"\n{row['view']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
