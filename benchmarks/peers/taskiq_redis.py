"""taskiq with taskiq-redis: ``--option broker=list`` or ``--option broker=stream``.

The list broker LPUSHes and BRPOPs: a message is gone from Redis once popped,
so a worker that dies loses what it held (no acknowledgement). The stream
broker reads with XREADGROUP and XACKs after the task (``ack_type`` default
``when_saved``); unacknowledged messages are reclaimed after ``idle_timeout``.
Neither broker delays tasks: that takes taskiq's separate scheduler process.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskiq import AsyncBroker
from taskiq.receiver import Receiver
from taskiq_redis import ListQueueBroker, RedisStreamBroker

from ._harness import Adapter, OnDone, main

#: set in the worker process before the receiver starts
_on_done: OnDone = lambda x: None


def _make_broker(kind: str, url: str, queue: str) -> tuple[AsyncBroker, Any]:
    broker: AsyncBroker
    if kind == "list":
        broker = ListQueueBroker(url, queue_name=queue)
    else:
        # consumer_id="0": the group reads the stream from its start, so tasks
        # queued before the first worker started are delivered too (the default
        # "$" skips them).
        broker = RedisStreamBroker(url, queue_name=queue, consumer_id="0")

    async def noop(x: float) -> None:
        _on_done(x)

    task = broker.task(task_name="noop")(noop)
    return broker, task


class TaskiqAdapter(Adapter):
    distributions = ("taskiq", "taskiq-redis", "redis", "hiredis")
    has_batch = False
    has_delay = False

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.kind = options.get("broker", "list")
        if self.kind not in ("list", "stream"):
            raise ValueError(f"broker must be list or stream, got {self.kind!r}")
        self.label = f"taskiq-redis ({self.kind})"
        self.settings = (
            "ListQueueBroker"
            if self.kind == "list"
            else "RedisStreamBroker(consumer_id='0')"
        ) + ", Receiver(max_async_tasks=100); defaults otherwise"
        self._broker: AsyncBroker | None = None
        self._task: Any = None

    async def open(self, url: str, queue: str) -> None:
        self._broker, self._task = _make_broker(self.kind, url, queue)
        await self._broker.startup()

    async def close(self) -> None:
        if self._broker is not None:
            await self._broker.shutdown()

    async def enqueue(
        self, x: float, *, delay: float | None = None, group: str | None = None
    ) -> None:
        assert delay is None
        assert group is None
        await self._task.kiq(x)

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
        broker, _ = _make_broker(self.kind, url, queue)
        broker.is_worker_process = True
        with ThreadPoolExecutor(max_workers=4) as pool:
            receiver = Receiver(broker, executor=pool, max_async_tasks=concurrency)
            try:
                await receiver.listen(stop)
            finally:
                await broker.shutdown()


if __name__ == "__main__":
    main(TaskiqAdapter, "benchmarks.peers.taskiq_redis")
