"""A worker through a Redis outage, as an operator sees it: the metrics say
Redis is out (``aiogroupq_queue_up 0``, the queue's last values dropped, so
that the documented alerts fire) and the log says when it is back, once."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aiogroupq.testing._server import ServerProcess

from ._spawn import PATIENCE, Spawn

QUEUE = "outage"


def scraped(text: str) -> dict[str, float]:
    """The queue's samples by name (labels other than ``queue`` dropped)."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("queue") == QUEUE and "state" not in sample.labels
    }


@pytest.mark.slow
async def test_metrics_and_log_through_an_outage(
    tmp_path: Path, spawn: Spawn, free_tcp_port: int
) -> None:
    server = ServerProcess(workdir=tmp_path)
    server.start()
    try:
        worker = spawn(
            "worker", "tests.example_app:handlers", "--queue", QUEUE,
            "--redis-url", server.url, "--metrics-port", str(free_tcp_port),
        )  # fmt: skip
        url = f"http://127.0.0.1:{free_tcp_port}/metrics"

        async def until(name: str, want: float) -> dict[str, float]:
            async with httpx.AsyncClient() as http:
                with anyio.fail_after(PATIENCE):
                    while True:
                        assert worker.alive(), worker.output
                        try:
                            response = await http.get(url)
                        except httpx.TransportError:  # not serving yet
                            response = None
                        if response is not None:
                            got = scraped(response.text)
                            if got.get(name) == want:
                                return got
                        await anyio.sleep(0.2)

        got = await until("aiogroupq_queue_consumers_alive", 1.0)
        assert got["aiogroupq_queue_up"] == 1.0
        assert got["aiogroupq_queue_last_read_timestamp_seconds"] > 0
        server.stop()
        got = await until("aiogroupq_queue_up", 0.0)
        # The last values are gone, not shown as current: an alert on
        # consumers_alive == 0 or on up == 0 fires, none stays quiet on a
        # stale 1.
        assert "aiogroupq_queue_consumers_alive" not in got, got
        assert "aiogroupq_queue_groups" not in got, got
        assert got["aiogroupq_queue_last_read_timestamp_seconds"] > 0
        await worker.wait_for_output("claim failed")
        assert "reachable again" not in worker.output
        server.start()  # the same port
        await until("aiogroupq_queue_up", 1.0)
        await worker.wait_for_output("Redis reachable again after")
        worker.signal(signal.SIGTERM)
        assert await worker.wait() == 0, worker.output
    finally:
        server.stop()
    # One line for the outage, however many fetchers and tries met it.
    assert worker.output.count("Redis reachable again after") == 1, worker.output
