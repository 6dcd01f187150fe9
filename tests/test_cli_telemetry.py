"""``aiogroupq worker``'s logs and metrics, run as real processes: ``-v``
raises only aiogroupq's level, ``--log-format json`` writes one JSON object
a line, ``--metrics-port`` answers Prometheus scrapes over HTTP."""

from __future__ import annotations

import json
import signal

import anyio
import httpx
import pytest
import redis.asyncio
from prometheus_client.parser import text_string_to_metric_families

import aiogroupq
from aiogroupq import TaskState
from aiogroupq.testing._server import free_port

from . import example_app
from ._spawn import PATIENCE, Proc, Spawn


async def enqueue(
    client: redis.asyncio.Redis, queue: str, *tasks: aiogroupq.Task
) -> list[str]:
    async with aiogroupq.Producer(client, queue=queue) as producer:
        return await producer.enqueue_many(tasks)


async def until_ended(
    client: redis.asyncio.Redis, queue: str, ids: list[str], proc: Proc
) -> None:
    terminal = {TaskState.SUCCEEDED, TaskState.DEAD}
    async with aiogroupq.Producer(client, queue=queue) as producer:
        with anyio.fail_after(PATIENCE):
            while True:
                states = {await producer.status(i) for i in ids}
                if states <= terminal:
                    return
                assert proc.alive(), proc.output
                await anyio.sleep(0.05)


async def stop(proc: Proc) -> str:
    proc.signal(signal.SIGTERM)
    assert await proc.wait() == 0, proc.output
    return proc.output


@pytest.mark.slow
async def test_verbose_lowers_only_aiogroupq_to_debug(
    redis_client: redis.asyncio.Redis, redis_url: str, spawn: Spawn
) -> None:
    queue = "cli-verbose"
    ids = await enqueue(
        redis_client, queue, aiogroupq.Task("work", example_app.Item(1))
    )
    worker = spawn(
        "worker", "tests.example_app:handlers", "--queue", queue,
        "--redis-url", redis_url, "-v",
    )  # fmt: skip
    await until_ended(redis_client, queue, ids, worker)
    await worker.wait_for_output("succeeded in")
    output = await stop(worker)
    debug = [line for line in output.splitlines() if " DEBUG " in line]
    assert any(f"task {ids[0]} (type 'work', attempt 1 of 3) started" in line
               for line in debug), output  # fmt: skip
    # asyncio's and redis-py's debug output stays out.
    strangers = [line for line in debug if "] aiogroupq." not in line]
    assert strangers == [], output


@pytest.mark.slow
async def test_json_log_lines_parse_and_carry_the_task_fields(
    redis_client: redis.asyncio.Redis, redis_url: str, spawn: Spawn
) -> None:
    queue = "cli-json"
    (failing,) = await enqueue(
        redis_client,
        queue,
        aiogroupq.Task("fail", example_app.Item(3), group="g3", max_attempts=1),
    )
    worker = spawn(
        "worker", "tests.example_app:mixed_handlers", "--queue", queue,
        "--redis-url", redis_url, "--log-format", "json",
    )  # fmt: skip
    await until_ended(redis_client, queue, [failing], worker)
    await worker.wait_for_output("dead-lettered")
    output = await stop(worker)
    lines = [json.loads(line) for line in output.splitlines() if line.strip()]
    (dead,) = [line for line in lines if line.get("task_id") == failing]
    assert dead["level"] == "ERROR"
    assert dead["logger"] == "aiogroupq.consumer"
    assert (dead["queue"], dead["task_type"], dead["group"], dead["attempt"]) == (
        queue,
        "fail",
        "g3",
        1,
    )
    assert "ValueError: item 3 failed" in dead["message"]
    assert "Traceback" in dead["exception"]
    (banner,) = [line for line in lines if "claiming from queue" in line["message"]]
    assert banner["handlers"] == ["fail", "work"]
    assert all({"time", "level", "logger", "message", "process"} <= set(line)
               for line in lines)  # fmt: skip


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Each sample of a scrape by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.slow
async def test_metrics_port_serves_the_counts_of_a_known_workload(
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    spawn: Spawn,
    free_tcp_port: int,
) -> None:
    queue = "cli-metrics"
    ids = await enqueue(
        redis_client,
        queue,
        *(aiogroupq.Task("work", example_app.Item(i), group=f"g{i}") for i in range(5)),
        aiogroupq.Task("fail", example_app.Item(9), group="bad", max_attempts=2),
    )
    worker = spawn(
        "worker", "tests.example_app:mixed_handlers", "--queue", queue,
        "--redis-url", redis_url, "--metrics-port", str(free_tcp_port),
    )  # fmt: skip
    await until_ended(redis_client, queue, ids, worker)

    def count(name: str, task_type: str) -> float:
        key = (name, frozenset({("queue", queue), ("task_type", task_type)}))
        return scraped.get(key, 0.0)

    expected = {
        ("aiogroupq_tasks_started_total", "work"): 5,
        ("aiogroupq_tasks_succeeded_total", "work"): 5,
        ("aiogroupq_tasks_started_total", "fail"): 2,
        ("aiogroupq_tasks_failed_total", "fail"): 2,
        ("aiogroupq_tasks_retried_total", "fail"): 1,
        ("aiogroupq_tasks_dead_total", "fail"): 1,
        ("aiogroupq_tasks_failed_total", "work"): 0,
        ("aiogroupq_task_duration_seconds_count", "work"): 5,
        ("aiogroupq_task_duration_seconds_count", "fail"): 2,
        ("aiogroupq_task_pickup_latency_seconds_count", "work"): 5,
        ("aiogroupq_task_pickup_latency_seconds_count", "fail"): 2,
    }
    url = f"http://127.0.0.1:{free_tcp_port}/metrics"
    scraped: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(PATIENCE):
            while True:  # outcomes are counted once Redis recorded them
                response = await http.get(url)
                assert response.status_code == 200
                scraped = samples(response.text)
                got = {key: count(*key) for key in expected}
                if got == expected:
                    break
                await anyio.sleep(0.05)
    print(f"\nscraped after the workload: {got}")  # noqa: T201
    assert "_created" not in response.text  # left out unless --metrics-created
    # The queue's counts, as gauges read from Admin.stats() every few seconds.
    dead = ("aiogroupq_queue_tasks", frozenset({("queue", queue), ("state", "dead")}))
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(PATIENCE):
            while samples((await http.get(url)).text).get(dead) != 1.0:
                await anyio.sleep(0.2)
    assert "serving Prometheus metrics on port" in await stop(worker)


def _two_free_ports() -> int:
    """A port that is free, and the next one too (the second worker's)."""
    return free_port(consecutive=2)


@pytest.mark.slow
async def test_each_worker_process_serves_its_own_port(
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    spawn: Spawn,
) -> None:
    free_tcp_port = _two_free_ports()
    queue = "cli-metrics-processes"
    ids = await enqueue(
        redis_client,
        queue,
        *(
            aiogroupq.Task("work", example_app.Item(i), group=f"g{i}")
            for i in range(20)
        ),
    )
    worker = spawn(
        "worker", "tests.example_app:handlers", "--queue", queue,
        "--redis-url", redis_url, "--processes", "2",
        "--metrics-port", str(free_tcp_port),
    )  # fmt: skip
    await until_ended(redis_client, queue, ids, worker)
    key = (
        "aiogroupq_tasks_succeeded_total",
        frozenset({("queue", queue), ("task_type", "work")}),
    )
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(PATIENCE):
            while True:
                counts = []
                for port in (free_tcp_port, free_tcp_port + 1):
                    try:
                        response = await http.get(f"http://127.0.0.1:{port}/metrics")
                    except httpx.ConnectError:  # a process still starting
                        break
                    assert response.status_code == 200
                    counts.append(samples(response.text).get(key, 0.0))
                if len(counts) == 2 and sum(counts) == len(ids):
                    break
                await anyio.sleep(0.05)
    print(f"\nsucceeded per worker process: {counts}")  # noqa: T201
    await stop(worker)
