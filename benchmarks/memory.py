"""Server memory per task: ``python -m benchmarks.memory [--tasks N] [--url URL]``.

Starts a throwaway server (as ``python -m benchmarks`` does; or uses ``--url``,
whose database is flushed), then for each shape of work below reads
``used_memory`` from ``INFO memory`` on an empty database, enqueues or runs N
tasks, reads it again and prints the difference divided by N:

- queued, each task in a group of its own (every task is its group's head);
- queued, ungrouped;
- queued behind one busy group (every task parked in that group's list);
- delayed (ungrouped, due in an hour);
- succeeded and retained with a stored result (``store_result=True``), as kept
  for the consumer's ``retention`` window;
- succeeded and retained without a result.

Every task has the task type ``"import_rows"``, a payload of a small dict
(``{"tenant": 42, "row": i}``, 17 bytes of MessagePack) and, where grouped, a
group key like ``"tenant-000123:orders"`` (20 bytes); a stored result is
``{"rows": i, "ok": True}`` (15 bytes). Scripts are loaded and the clients'
connections closed before each reading, so only the queue's keys are counted.
Sizes scale with your own payloads, groups and task types: run it with yours.
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

QUEUE = "memory"
BATCH = 1_000


async def _used_memory(url: str) -> int:
    """``used_memory`` once the allocator has settled (read until stable)."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        last = -1
        for _ in range(50):
            await client.execute_command("MEMORY", "PURGE")
            info: Any = await client.info("memory")
            used = int(info["used_memory"])
            if used == last:
                return used
            last = used
            await anyio.sleep(0.05)
        return last
    finally:
        await client.aclose()


async def _flush(url: str) -> None:
    client = redis.asyncio.Redis.from_url(url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()


def _payload(i: int) -> dict[str, int]:
    return {"tenant": 42, "row": i}


def _group(i: int) -> str:
    return f"tenant-{i:06d}:orders"


async def _enqueue(url: str, tasks: list[aiogroupq.Task]) -> None:
    async with aiogroupq.Producer(url, queue=QUEUE) as producer:
        for start in range(0, len(tasks), BATCH):
            await producer.enqueue_many(tasks[start : start + BATCH])


async def _import_rows(payload: dict[str, int]) -> dict[str, object]:
    return {"rows": payload["row"], "ok": True}


async def _run_all(url: str, n: int, *, store_result: bool) -> None:
    """Enqueue *n* ungrouped tasks and consume them all."""
    await _enqueue(url, [aiogroupq.Task("import_rows", _payload(i)) for i in range(n)])
    handler = aiogroupq.Handler(_import_rows, store_result=store_result)
    async with aiogroupq.Consumer(
        url, queue=QUEUE, handlers={"import_rows": handler}, concurrency=100
    ) as consumer:
        deadline = time.monotonic() + 600
        while consumer.stats.succeeded < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {consumer.stats} after 600 s")
            await anyio.sleep(0.05)


def _shapes(n: int) -> dict[str, Callable[[str], Awaitable[None]]]:
    def queued(
        make: Callable[[int], aiogroupq.Task],
    ) -> Callable[[str], Awaitable[None]]:
        return lambda url: _enqueue(url, [make(i) for i in range(n)])

    return {
        "queued, each task in its own group": queued(
            lambda i: aiogroupq.Task("import_rows", _payload(i), group=_group(i))
        ),
        "queued, ungrouped": queued(
            lambda i: aiogroupq.Task("import_rows", _payload(i))
        ),
        "queued behind one busy group (parked)": queued(
            lambda i: aiogroupq.Task("import_rows", _payload(i), group=_group(0))
        ),
        "delayed (ungrouped)": queued(
            lambda i: aiogroupq.Task("import_rows", _payload(i), delay=3600.0)
        ),
        "succeeded, retained with its result": lambda url: _run_all(
            url, n, store_result=True
        ),
        "succeeded, retained without a result": lambda url: _run_all(
            url, n, store_result=False
        ),
    }


async def measure(url: str, n: int) -> list[tuple[str, int, float]]:
    """``(shape, bytes in all, bytes per task)`` for each shape."""
    # Load every script first: the script cache is not the queue's memory.
    for shape in _shapes(10).values():
        await _flush(url)
        await shape(url)
    rows = []
    for name, shape in _shapes(n).items():
        await _flush(url)
        before = await _used_memory(url)
        await shape(url)
        after = await _used_memory(url)
        rows.append((name, after - before, (after - before) / n))
    await _flush(url)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.memory",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--tasks", type=int, default=100_000, help="N (default 100,000)"
    )
    parser.add_argument("--url", help="a server to use (its database is flushed)")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.memory " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    if args.url:
        rows = anyio.run(measure, args.url, args.tasks)
        server = server_info(args.url)
    else:
        with throwaway_server() as throwaway:
            rows = anyio.run(measure, throwaway.url, args.tasks)
            server = server_info(throwaway.url)
    print(f"$ {command.strip()}")
    print(
        f"aiogroupq {aiogroupq.__version__}; {server['server']} "
        f"{server['server_version']}; N = {args.tasks:,} tasks per shape; "
        "used_memory from INFO memory"
    )
    print()
    print("| shape | bytes per task | MiB for N |")
    print("| --- | --: | --: |")
    for name, total, per_task in rows:
        print(f"| {name} | {per_task:,.0f} | {total / 2**20:,.1f} |")


if __name__ == "__main__":
    main()
