"""saq: a Redis list popped with BLMOVE, job hashes, a 1 s scheduler for delays."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from saq import Queue, Worker
from saq.types import Context

from ._harness import Adapter, OnDone, main


class SaqAdapter(Adapter):
    label = "saq"
    distributions = ("saq", "redis", "hiredis")
    has_batch = False  # Queue.map() is asyncio.gather over enqueue(), not a batch
    has_delay = True
    settings = "Worker(concurrency=100); defaults otherwise"

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self._queue: Queue | None = None

    async def open(self, url: str, queue: str) -> None:
        self._queue = Queue.from_url(url, name=queue)
        await self._queue.connect()

    async def close(self) -> None:
        if self._queue is not None:
            await self._queue.disconnect()

    async def enqueue(
        self, x: float, *, delay: float | None = None, group: str | None = None
    ) -> None:
        assert self._queue is not None
        assert group is None
        if delay:
            # ``scheduled`` is epoch seconds; saq compares it as a float.
            await self._queue.enqueue("noop", x=x, scheduled=time.time() + delay)
        else:
            await self._queue.enqueue("noop", x=x)

    async def serve(
        self,
        url: str,
        queue: str,
        concurrency: int,
        on_done: OnDone,
        stop: asyncio.Event,
    ) -> None:
        async def noop(ctx: Context, *, x: float) -> None:
            on_done(x)

        q = Queue.from_url(url, name=queue)
        await q.connect()
        worker = Worker(q, functions=[("noop", noop)], concurrency=concurrency)
        run = asyncio.create_task(worker.start())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if run.done():
            stopped.cancel()
            run.result()
            return
        await worker.stop()
        await asyncio.gather(run, return_exceptions=True)
        await q.disconnect()


if __name__ == "__main__":
    main(SaqAdapter, "benchmarks.peers.saq")
