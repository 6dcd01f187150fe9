"""streaq: Redis streams with consumer groups (coredis), a 0.5 s delay scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import anyio
from streaq import Worker

from ._harness import Adapter, OnDone, main

#: set in the worker process before the worker starts
_on_done: OnDone = lambda x: None


def _make_worker(url: str, queue: str, concurrency: int) -> tuple[Worker[Any], Any]:
    worker: Worker[Any] = Worker(
        redis_url=url, queue_name=queue, concurrency=concurrency, handle_signals=False
    )

    async def noop(x: float) -> None:
        _on_done(x)

    task = worker.task(name="noop")(noop)
    return worker, task


class StreaqAdapter(Adapter):
    label = "streaq"
    distributions = ("streaq", "coredis")
    has_batch = True  # Worker.enqueue_many: one pipeline
    has_delay = True
    settings = "Worker(concurrency=100, handle_signals=False); defaults otherwise"

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self._stack = AsyncExitStack()
        self._worker: Worker[Any] | None = None
        self._task: Any = None

    async def open(self, url: str, queue: str) -> None:
        self._worker, self._task = _make_worker(url, queue, 100)
        await self._stack.enter_async_context(self._worker)

    async def close(self) -> None:
        await self._stack.aclose()

    async def enqueue(
        self, x: float, *, delay: float | None = None, group: str | None = None
    ) -> None:
        assert group is None
        if delay:
            await self._task.enqueue(x).start(delay=delay)
        else:
            await self._task.enqueue(x)

    async def enqueue_batch(
        self, xs: Sequence[float], groups: Sequence[str | None] | None = None
    ) -> None:
        assert self._worker is not None
        assert groups is None
        await self._worker.enqueue_many([self._task.enqueue(x) for x in xs])

    async def serve(
        self,
        url: str,
        queue: str,
        concurrency: int,
        on_done: OnDone,
        stop: asyncio.Event,
    ) -> None:
        global _on_done
        _on_done = on_done
        worker, _ = _make_worker(url, queue, concurrency)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run_async)
            await stop.wait()
            tg.cancel_scope.cancel()


if __name__ == "__main__":
    main(StreaqAdapter, "benchmarks.peers.streaq")
