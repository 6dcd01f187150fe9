"""arq: a Redis sorted set polled by the worker (``poll_delay`` 0.5 s by default)."""

from __future__ import annotations

import asyncio
from typing import Any

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.worker import Worker, func

from ._harness import Adapter, OnDone, main


class ArqAdapter(Adapter):
    label = "arq"
    distributions = ("arq", "redis", "hiredis")
    has_batch = False  # no batch enqueue API
    has_delay = True
    settings = "Worker(max_jobs=100, handle_signals=False); defaults otherwise"

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self._pool: ArqRedis | None = None
        self._queue = "arq:queue"

    async def open(self, url: str, queue: str) -> None:
        self._queue = f"arq:{queue}"
        self._pool = await create_pool(
            RedisSettings.from_dsn(url), default_queue_name=self._queue
        )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()

    async def enqueue(
        self, x: float, *, delay: float | None = None, group: str | None = None
    ) -> None:
        assert self._pool is not None
        assert group is None
        await self._pool.enqueue_job("noop", x, _defer_by=delay)

    async def serve(
        self,
        url: str,
        queue: str,
        concurrency: int,
        on_done: OnDone,
        stop: asyncio.Event,
    ) -> None:
        async def noop(ctx: dict[str, Any], x: float) -> None:
            on_done(x)

        worker = Worker(
            functions=[func(noop, name="noop")],
            queue_name=f"arq:{queue}",
            redis_settings=RedisSettings.from_dsn(url),
            max_jobs=concurrency,
            handle_signals=False,
        )
        run = asyncio.create_task(worker.async_run())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if run.done():
            stopped.cancel()
            run.result()
            return
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await worker.close()


if __name__ == "__main__":
    main(ArqAdapter, "benchmarks.peers.arq")
