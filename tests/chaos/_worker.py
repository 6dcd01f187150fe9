"""One consumer process of the chaos tests.

    python -m tests.chaos._worker QUEUE_URL JOURNAL_URL QUEUE NAME WORKDIR
        [--lease-ttl S] [--concurrency N] [--grace S] [--retention S]

It consumes ``job`` tasks (see :class:`Job`) until SIGTERM or SIGINT, then
leaves its ``async with Consumer`` block (grace period, hand-back) and writes
its counters to ``WORKDIR/stats-<pid>.json``. Each handler journals its start
and its end (or failure, or cancellation) with :class:`JournalWriter`, on a
connection of its own straight to the server: the queue's traffic may go
through the chaos proxy, the journal's never does.

``WORKDIR/ready-<pid>`` appears once the consumer claims, so the harness never
signals a process that cannot yet handle SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import msgspec
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

import aiogroupq

from ._journal import JournalWriter


class Job(msgspec.Struct, frozen=True):
    """The payload of every chaos task.

    :ivar seq: unique number of the task in the run
    :ivar group: its group (``None``: ungrouped)
    :ivar gseq: its position in its group's enqueue order, from 0
    :ivar sleep_ms: how long the handler works
    :ivar fail_attempts: the handler raises on attempts up to this one
    """

    seq: int
    group: str | None
    gseq: int
    sleep_ms: int
    fail_attempts: int = 0


class _Counting(logging.Handler):
    """Counts log records by level and keeps the first few warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.levels: Counter[str] = Counter()
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.levels[record.levelname] += 1
        if len(self.samples) < 20:
            self.samples.append(f"{record.levelname} {record.getMessage()[:300]}")


def make_handler(journal: JournalWriter, name: str) -> Callable[[Job], Awaitable[None]]:
    pid = os.getpid()

    async def job(payload: Job) -> None:
        info = aiogroupq.current_task()
        token = str(info.fencing_token)
        tail = (
            f"{pid} {name} {info.id} {payload.seq} {payload.group or '-'} "
            f"{payload.gseq} {info.attempt} {token}"
        )

        async def write(kind: str) -> None:
            await journal.write(
                f"{kind} {tail}", task_id=info.id, group=payload.group, token=token
            )

        try:
            await write("S")
            await anyio.sleep(payload.sleep_ms / 1000)
            if info.attempt <= payload.fail_attempts:
                await write("F")
                raise RuntimeError(f"planned failure of attempt {info.attempt}")
            await write("E")
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                await write("C")
            raise

    return job


async def _serve(args: argparse.Namespace) -> None:
    counting = _Counting()
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger().addHandler(counting)
    workdir = Path(args.workdir)
    journal_client = redis.asyncio.Redis.from_url(
        args.journal_url,
        socket_timeout=5,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 0),
    )
    journal = JournalWriter(journal_client, args.queue)
    stop = anyio.Event()
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

        async def watch() -> None:
            async for _ in signals:
                stop.set()
                return

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            consumer = aiogroupq.Consumer(
                args.url,
                queue=args.queue,
                handlers={"job": make_handler(journal, args.name)},
                concurrency=args.concurrency,
                lease_ttl=args.lease_ttl,
                name=args.name,
                grace_period=args.grace,
                retention=args.retention,
                retry_backoff=0.05,
                retry_backoff_max=0.5,
            )
            # As 'aiogroupq worker' does: a consumer (re)started while Redis
            # restarts or its connection drops waits for it instead of exiting.
            while not stop.is_set():
                try:
                    async with consumer:
                        (workdir / f"ready-{os.getpid()}").touch()
                        await stop.wait()
                except aiogroupq.RedisUnavailableError:
                    logging.getLogger(__name__).warning("Redis unreachable at start")
                    with anyio.move_on_after(0.5):
                        await stop.wait()
            tg.cancel_scope.cancel()
    stats = {
        "pid": os.getpid(),
        "name": args.name,
        **dataclasses.asdict(consumer.stats),
        "log_levels": dict(counting.levels),
        "log_samples": counting.samples,
    }
    (workdir / f"stats-{os.getpid()}.json").write_text(json.dumps(stats))
    await journal_client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("journal_url")
    parser.add_argument("queue")
    parser.add_argument("name")
    parser.add_argument("workdir")
    parser.add_argument("--lease-ttl", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--retention", type=float, default=3600.0)
    anyio.run(_serve, parser.parse_args())


if __name__ == "__main__":
    main()
