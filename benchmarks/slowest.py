"""The longest any script holds the server, under a deep backlog:
``python -m benchmarks.slowest [--backlog N] [--url URL]``.

A Lua script runs atomically, so while it runs the server answers nobody: the
time of the slowest call is the longest pause every client of the server may
see. This starts a throwaway server (or uses ``--url``, whose database is
flushed), asks its SLOWLOG to record every call over 1 ms, builds a queue with
one group holding a backlog of N tasks (default 1,000,000) beside 20,000
other tasks, then exercises every operation on it:

- ``enqueue_many`` at its largest batch (1,000 tasks), single enqueues;
- a consumer draining the other tasks while the hot group runs too;
- cancelling a task deep in the hot group's line;
- dead-lettering 5,000 tasks, then requeueing and purging them all;
- group settings, pause and resume of the hot group;
- the consistency check (``aiogroupq check``) of the whole queue;

and prints, per script (or command), how many calls went over 1 ms and the
slowest one, in ms, from the server's own timing. The target is under 20 ms.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from typing import Any

import anyio
import redis.asyncio

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.lua import library
from benchmarks._runner import server_info, throwaway_server

QUEUE = "slowest"
BATCH = 1_000
OTHERS = 20_000
DEAD = 5_000


def _names() -> dict[str, str]:
    return {script.sha: script.name for script in _scripts.ALL_SCRIPTS}


async def _build(url: str, backlog: int) -> None:
    async with aiogroupq.Producer(url, queue=QUEUE) as producer:
        hot = [aiogroupq.Task("noop", i, group="hot") for i in range(BATCH)]
        for _ in range(backlog // BATCH):
            await producer.enqueue_many(hot)
        others = [
            aiogroupq.Task("noop", i, group=None if i % 2 else f"g{i}")
            for i in range(BATCH)
        ]
        for _ in range(OTHERS // BATCH):
            await producer.enqueue_many(others)
        doomed = [aiogroupq.Task("fail", i, max_attempts=1) for i in range(BATCH)]
        for _ in range(DEAD // BATCH):
            await producer.enqueue_many(doomed)
        for i in range(100):
            await producer.enqueue("noop", i, group=f"single{i}")


async def _exercise(url: str, backlog: int) -> dict[str, float]:
    seconds: dict[str, float] = {}
    done = 0
    drained = anyio.Event()

    async def noop(n: int) -> None:
        nonlocal done
        done += 1
        if done >= OTHERS + 100:
            drained.set()

    async def fail(n: int) -> None:
        raise ValueError(n)

    client = redis.asyncio.Redis.from_url(url)
    async with (
        aiogroupq.Producer(client, queue=QUEUE) as producer,
        aiogroupq.Admin(client, queue=QUEUE) as admin,
    ):
        t0 = time.perf_counter()
        async with aiogroupq.Consumer(
            client,
            queue=QUEUE,
            handlers={"noop": noop, "fail": fail},
            concurrency=64,
        ):
            await drained.wait()
            await _dead_letters(admin)
            seconds["drain of the other tasks (s)"] = time.perf_counter() - t0
            # A task deep in the hot line: its cancel searches the line.
            deep: Any = await client.lindex(
                f"{{aiogroupq:{QUEUE}}}:park:hot", backlog // 2
            )
            await producer.cancel(bytes(deep).decode())
            await admin.set_group("hot", concurrency=2)
            await admin.pause_group("hot")
            await admin.resume_group("hot")
            await admin.set_group("hot")
        dead = [letter.id for letter in await admin.dead_letters(limit=DEAD)]
        t0 = time.perf_counter()
        await admin.requeue_dead(*dead)
        seconds["requeue 5,000 dead letters (s)"] = time.perf_counter() - t0
        async with aiogroupq.Consumer(
            client, queue=QUEUE, handlers={"noop": noop, "fail": fail}
        ):
            await _dead_letters(admin)
        t0 = time.perf_counter()
        await admin.purge_dead(all=True)
        seconds["purge 5,000 dead letters (s)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    problems = await aiogroupq.check_queue(client, QUEUE)
    seconds["check of the whole queue (s)"] = time.perf_counter() - t0
    seconds["problems found by check"] = len(problems)
    await client.aclose()
    return seconds


async def _dead_letters(admin: aiogroupq.Admin) -> None:
    """Wait until every doomed task is dead-lettered (other consumers'
    outcomes: nothing here to be notified by, so poll)."""
    while len(await admin.dead_letters(limit=DEAD)) < DEAD:  # noqa: ASYNC110
        await anyio.sleep(0.05)


async def measure(
    url: str, backlog: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    client = redis.asyncio.Redis.from_url(url)
    await client.flushdb()
    await client.config_set("slowlog-log-slower-than", 1000)  # µs
    await client.config_set("slowlog-max-len", 100_000)
    await client.slowlog_reset()
    await _build(url, backlog)
    seconds = await _exercise(url, backlog)
    entries: Any = await client.slowlog_get(100_000)
    await client.aclose()
    names = _names()
    slow: dict[str, list[float]] = defaultdict(list)
    for entry in entries:
        words = [bytes(w).decode(errors="replace") for w in entry["command"].split()]
        name = words[0].upper() if words else "?"
        if name in ("EVALSHA", "EVAL") and len(words) > 1:
            sha = words[1] if name == "EVALSHA" else ""
            name = f"{names.get(sha, 'script')}.lua"
        elif name == "FCALL" and len(words) > 1:  # <library>_<script>
            name = f"{words[1].removeprefix(library().name + '_')}.lua"
        slow[name].append(entry["duration"] / 1000)
    return slow, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.slowest")
    parser.add_argument(
        "--backlog", type=int, default=1_000_000, help="hot group backlog (1,000,000)"
    )
    parser.add_argument("--url", help="a server to use (its database is flushed)")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.slowest " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    if args.url:
        slow, seconds = anyio.run(measure, args.url, args.backlog)
        server = server_info(args.url)
    else:
        with throwaway_server() as throwaway:
            slow, seconds = anyio.run(measure, throwaway.url, args.backlog)
            server = server_info(throwaway.url)
    print(f"$ {command.strip()}")
    print(
        f"aiogroupq {aiogroupq.__version__}; {server['server']} "
        f"{server['server_version']}; hot group backlog {args.backlog:,}; "
        "SLOWLOG threshold 1 ms"
    )
    print()
    print("| script or command | calls over 1 ms | slowest (ms) |")
    print("| --- | --: | --: |")
    for name, times in sorted(slow.items(), key=lambda kv: -max(kv[1])):
        print(f"| {name} | {len(times):,} | {max(times):.2f} |")
    if not slow:
        print("| (none) | 0 | < 1 |")
    worst = max((max(t) for t in slow.values()), default=0.0)
    print()
    for label, value in seconds.items():
        print(f"- {label}: {value:,.2f}")
    print(f"- slowest call: {worst:.2f} ms (target: under 20 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
