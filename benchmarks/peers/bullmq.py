"""BullMQ (Node.js): the same workloads, run by ``node`` with ``bullmq.mjs``.

The producer is one long-lived Node process (``bullmq.mjs producer``) that
runs each enqueue workload's loop itself and replies with its rate, so no pipe
round trip is timed; its CPU time (``process.cpuUsage``) is the producer CPU.
Each worker process is ``node bullmq.mjs worker CONFIG``: one BullMQ
``Worker`` with a no-op ``async`` processor, reporting through the harness's
shared slots file and result JSON like the Python workers. The server's cost
is read by this driver (``INFO`` before and after), as for every peer.

BullMQ's open-source edition has no groups (BullMQ Pro has), so it runs the
ungrouped workloads only: enqueue (sequential ``add``, 100 ``add`` in flight,
``addBulk`` of 1,000), drain, idle pickup and delayed lateness.

Run by the runner with its own interpreter (this module uses the standard
library only) and ``--option node=... --option node_dir=...`` from
``benchmarks/_node.py``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._harness import Adapter, Driver, OnDone, main

SCRIPT = Path(__file__).resolve().with_suffix(".mjs")


class BullmqAdapter(Adapter):
    label = "BullMQ"
    has_batch = True  # Queue.addBulk
    has_delay = True
    settings = (
        "Node.js; one Queue, Worker(concurrency=100); defaults otherwise "
        "(completed jobs are kept: removeOnComplete is off by default)"
    )

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.node: str = options.get("node", "node")
        self.node_dir = Path(options.get("node_dir", "."))
        self._proc: asyncio.subprocess.Process | None = None
        #: the producer's CPU seconds at its last reply (cumulative)
        self.cpu_s = 0.0

    def versions(self) -> dict[str, str]:
        out = {}
        try:
            out["node"] = subprocess.run(
                [self.node, "--version"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            out["node"] = "?"
        for name in ("bullmq", "ioredis"):
            meta = self.node_dir / "node_modules" / name / "package.json"
            try:
                out[name] = json.loads(meta.read_text())["version"]
            except (OSError, ValueError, KeyError):
                out[name] = "?"
        return out

    async def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """One command to the Node producer; its reply (raises on an error)."""
        proc = self._proc
        assert proc is not None
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        await proc.stdin.drain()
        line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the BullMQ producer exited ({op}): see its stderr")
        reply: dict[str, Any] = json.loads(line)
        self.cpu_s = float(reply["cpu_s"])
        if not reply["ok"]:
            raise RuntimeError(f"BullMQ producer, {op}: {reply['error']}")
        return reply

    async def open(self, url: str, queue: str) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            self.node,
            str(SCRIPT),
            "producer",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        await self.call("open", url=url, queue=queue, node_dir=str(self.node_dir))

    async def close(self) -> None:
        if self._proc is None:
            return
        try:
            await self.call("close")
        finally:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            # Waited for, so that its CPU time counts as this run's own.
            await self._proc.wait()
            self._proc = None

    async def enqueue(
        self, x: float, *, delay: float | None = None, group: str | None = None
    ) -> None:
        # Not on any timed path (those run their loops in Node); a pipe round
        # trip per call.
        assert group is None
        await self.call("enqueue", x=x, delay=delay)

    async def serve(
        self,
        url: str,
        queue: str,
        concurrency: int,
        on_done: OnDone,
        stop: asyncio.Event,
    ) -> None:
        raise NotImplementedError("BullMQ's workers are Node processes (bullmq.mjs)")


class BullmqDriver(Driver):
    """The harness's driver, with BullMQ's producer loops and workers in Node."""

    @property
    def bullmq(self) -> BullmqAdapter:
        assert isinstance(self.adapter, BullmqAdapter)
        return self.adapter

    def worker_argv(self, config: str) -> list[str]:
        return [self.bullmq.node, str(SCRIPT), "worker", config]

    def producer_cpu(self) -> float:
        return self.bullmq.cpu_s

    def own_cpu(self) -> float:
        return super().own_cpu() + self.bullmq.cpu_s

    async def enqueue_sequential(self, n: int) -> float:
        reply = await self.bullmq.call("sequential", n=n)
        return float(reply["per_s"])

    async def enqueue_concurrent(
        self, n: int, groups: Callable[[int], str | None] | None = None
    ) -> float:
        assert groups is None, "BullMQ (open source) has no groups"
        reply = await self.bullmq.call("concurrent", n=n, lanes=self.sizes.in_flight)
        return float(reply["per_s"])

    async def enqueue_batches(
        self,
        n: int,
        *,
        x: float = 0.0,
        groups: Callable[[int], str | None] | None = None,
        in_flight: int = 1,
    ) -> float:
        assert groups is None, "BullMQ (open source) has no groups"
        reply = await self.bullmq.call(
            "batch", n=n, size=self.sizes.batch_size, in_flight=in_flight, x=x
        )
        return float(reply["per_s"])

    async def warm_up(self, count: int) -> None:
        await self.bullmq.call("paced", count=count, interval=0.05, delay=None)

    async def send_probes(self, count: int, delay: float | None = None) -> None:
        await self.bullmq.call(
            "paced", count=count, interval=self.sizes.interval, delay=delay
        )


if __name__ == "__main__":
    main(BullmqAdapter, "benchmarks.peers.bullmq", BullmqDriver)
