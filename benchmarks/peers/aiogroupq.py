"""aiogroupq: the library under test (installed from this repository)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import aiogroupq

from ._harness import Adapter, OnDone, main


class AiogroupqAdapter(Adapter):
    label = "aiogroupq"
    distributions = ("aiogroupq", "redis", "hiredis", "msgspec", "anyio")
    has_batch = True
    has_delay = True
    has_groups = True
    has_batches = True
    settings = "Consumer(concurrency=100); defaults otherwise (claim_batch=32)"

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self._stack = AsyncExitStack()
        self._producer: aiogroupq.Producer | None = None

    async def open(self, url: str, queue: str) -> None:
        self._producer = await self._stack.enter_async_context(
            aiogroupq.Producer(url, queue=queue)
        )

    async def close(self) -> None:
        await self._stack.aclose()

    async def enqueue(
        self, x: float, *, delay: float | None = None, group: str | None = None
    ) -> None:
        assert self._producer is not None
        await self._producer.enqueue("noop", x, group=group, delay=delay)

    async def enqueue_batch(
        self, xs: Sequence[float], groups: Sequence[str | None] | None = None
    ) -> None:
        assert self._producer is not None
        if groups is None:
            tasks = [aiogroupq.Task("noop", x) for x in xs]
        else:
            tasks = [
                aiogroupq.Task("noop", x, group=g)
                for x, g in zip(xs, groups, strict=True)
            ]
        await self._producer.enqueue_many(tasks)

    async def serve(
        self,
        url: str,
        queue: str,
        concurrency: int,
        on_done: OnDone,
        stop: asyncio.Event,
    ) -> None:
        async def noop(x: float) -> None:
            on_done(x)

        async def noops(xs: list[float]) -> None:
            for x in xs:
                on_done(x)

        handler: aiogroupq.Handler = aiogroupq.Handler(noop)
        if "batch_size" in self.options:  # the grouped-batch workload
            handler = aiogroupq.Handler(
                noops, batch_size=int(self.options["batch_size"])
            )
        async with aiogroupq.Consumer(
            url, queue=queue, handlers={"noop": handler}, concurrency=concurrency
        ):
            await stop.wait()


if __name__ == "__main__":
    main(AiogroupqAdapter, "benchmarks.peers.aiogroupq")
