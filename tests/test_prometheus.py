"""``aiogroupq.prometheus``: each event moves its metric, a producer and a
consumer count a real workload, queue gauges follow a reader, the endpoint
answers over HTTP, and a missing prometheus-client is a clear error."""

from __future__ import annotations

import importlib
import sys
from collections import Counter

import anyio
import httpx
import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

import aiogroupq
from aiogroupq import EventKind, TaskEvent, TaskState
from aiogroupq.prometheus import PrometheusObserver, serve

QUEUE = "prom"
PATIENCE = 30.0


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    "kind",
    [kind for kind in EventKind if kind is not EventKind.LOOP_BLOCKED],
)
def test_each_task_event_counts_in_its_own_counter(kind: EventKind) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    observer.on_event(TaskEvent(kind=kind, queue="q", task_type="t"))
    observer.on_event(TaskEvent(kind=kind, queue="q", task_type="t"))
    observer.on_event(TaskEvent(kind=kind, queue="q"))  # type unknown
    name = f"aiogroupq_tasks_{kind.value}_total"
    assert value(registry, name, queue="q", task_type="t") == 2
    assert value(registry, name, queue="q", task_type="unknown") == 1
    others = [
        f"aiogroupq_tasks_{other.value}_total"
        for other in EventKind
        if other not in (kind, EventKind.LOOP_BLOCKED)
    ]
    assert [value(registry, n, queue="q", task_type="t") for n in others] == [0] * len(
        others
    )


def test_durations_latencies_and_stalls() -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    for kind in (
        EventKind.SUCCEEDED,
        EventKind.RETRIED,
        EventKind.DEAD,
        EventKind.CANCELLED,
        EventKind.LEASE_LOST,
    ):
        observer.on_event(TaskEvent(kind=kind, queue="q", task_type="t", duration=0.2))
    # Ended without running (handed back unstarted, dead by recovery): no time.
    observer.on_event(TaskEvent(kind=EventKind.DEAD, queue="q", task_type="t"))
    observer.on_event(
        TaskEvent(kind=EventKind.HANDED_BACK, queue="q", task_type="t", duration=5.0)
    )
    observer.on_event(
        TaskEvent(kind=EventKind.STARTED, queue="q", task_type="t", latency=0.003)
    )
    observer.on_event(
        TaskEvent(kind=EventKind.LOOP_BLOCKED, queue="q", task_type="t", duration=2.5)
    )
    observer.on_event(TaskEvent(kind=EventKind.LOOP_BLOCKED, queue="q", duration=0.5))
    labels = {"queue": "q", "task_type": "t"}
    assert value(registry, "aiogroupq_task_duration_seconds_count", **labels) == 5
    assert value(registry, "aiogroupq_task_duration_seconds_sum", **labels) == (
        pytest.approx(1.0)
    )
    assert value(registry, "aiogroupq_task_pickup_latency_seconds_count", **labels) == 1
    assert (
        value(
            registry,
            "aiogroupq_task_pickup_latency_seconds_bucket",
            le="0.005",
            **labels,
        )
        == 1
    )
    assert value(registry, "aiogroupq_loop_blocked_total", queue="q") == 2
    assert value(registry, "aiogroupq_loop_blocked_seconds_total", queue="q") == 3.0


def test_observers_on_one_registry_share_its_metrics() -> None:
    registry = CollectorRegistry()
    first = PrometheusObserver(registry=registry)
    second = PrometheusObserver(registry=registry)  # no "duplicated timeseries"
    for observer in (first, second):
        observer.on_event(TaskEvent(kind=EventKind.STARTED, queue="q", task_type="t"))
    assert (
        value(registry, "aiogroupq_tasks_started_total", queue="q", task_type="t") == 2
    )


async def test_a_producer_and_a_consumer_count_a_workload(
    redis_client: redis.asyncio.Redis,
) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry=registry)

    async def ok(n: int) -> None:
        pass

    async def flaky(n: int) -> None:
        if aiogroupq.current_task().attempt == 1:
            raise RuntimeError("first attempt fails")

    async with aiogroupq.Producer(
        redis_client, queue=QUEUE, observers=[observer]
    ) as producer:
        ids = await producer.enqueue_many(
            [aiogroupq.Task("ok", i, group=f"g{i % 3}") for i in range(6)]
            + [aiogroupq.Task("flaky", 1, group="f")]
        )
        await producer.enqueue("ok", 0, dedup_key="dup")
        await producer.enqueue("ok", 0, dedup_key="dup")  # deduplicated
        async with aiogroupq.Consumer(
            redis_client,
            queue=QUEUE,
            handlers={"ok": ok, "flaky": flaky},
            observers=[observer],
            retry_backoff=0.01,
        ) as consumer:
            with anyio.fail_after(PATIENCE):
                for task_id in ids:
                    while await producer.status(task_id) != TaskState.SUCCEEDED:
                        await anyio.sleep(0.01)
                while consumer.stats.running:
                    await anyio.sleep(0.01)
    ok_, flaky_ = (
        {"queue": QUEUE, "task_type": "ok"},
        {"queue": QUEUE, "task_type": "flaky"},
    )
    got = {
        "enqueued ok": value(registry, "aiogroupq_tasks_enqueued_total", **ok_),
        "enqueued flaky": value(registry, "aiogroupq_tasks_enqueued_total", **flaky_),
        "started ok": value(registry, "aiogroupq_tasks_started_total", **ok_),
        "succeeded ok": value(registry, "aiogroupq_tasks_succeeded_total", **ok_),
        "started flaky": value(registry, "aiogroupq_tasks_started_total", **flaky_),
        "failed flaky": value(registry, "aiogroupq_tasks_failed_total", **flaky_),
        "retried flaky": value(registry, "aiogroupq_tasks_retried_total", **flaky_),
        "succeeded flaky": value(registry, "aiogroupq_tasks_succeeded_total", **flaky_),
        "durations ok": value(registry, "aiogroupq_task_duration_seconds_count", **ok_),
        "latencies ok": value(
            registry, "aiogroupq_task_pickup_latency_seconds_count", **ok_
        ),
    }
    assert got == {
        "enqueued ok": 7,
        "enqueued flaky": 1,
        "started ok": 7,
        "succeeded ok": 7,
        "started flaky": 2,
        "failed flaky": 1,
        "retried flaky": 1,
        "succeeded flaky": 1,
        "durations ok": 7,
        "latencies ok": 7,
    }


async def test_queue_gauges_follow_the_reader(
    redis_client: redis.asyncio.Redis,
) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = [await producer.enqueue("t", i) for i in range(3)]
        ids.append(await producer.enqueue("t", 9, delay=600))
        readings = 0

        async def read() -> dict[str, int]:
            """Counts by state, from Redis."""
            nonlocal readings
            readings += 1
            if readings == 2:
                raise ConnectionError("a failed reading drops the gauges")
            states = Counter([str(await producer.status(i)) for i in ids])
            return dict(states)

        def gauge(state: str) -> float | None:
            return registry.get_sample_value(
                "aiogroupq_queue_tasks", {"queue": QUEUE, "state": state}
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: observer.watch_queue(QUEUE, read, interval=0.01))
            with anyio.fail_after(PATIENCE):
                while gauge("queued") != 3:
                    await anyio.sleep(0.01)
            assert gauge("delayed") == 1
            assert await producer.cancel(ids[3])
            with anyio.fail_after(PATIENCE):
                while gauge("delayed") != 0:  # a state gone from the reading
                    await anyio.sleep(0.01)
            assert gauge("cancelled") == 1
            tg.cancel_scope.cancel()
    assert readings >= 3


async def test_a_retry_pickup_latency_leaves_out_its_backoff(
    redis_client: redis.asyncio.Redis,
) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    backoff = 1.0

    async def again(n: int) -> None:
        if aiogroupq.current_task().attempt == 1:
            raise aiogroupq.Retry(backoff)

    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers={"again": again}, observers=[observer]
        ),
    ):
        task_id = await producer.enqueue("again", 1, group="g")
        with anyio.fail_after(PATIENCE):
            while await producer.status(task_id) != TaskState.SUCCEEDED:
                await anyio.sleep(0.01)
    labels = {"queue": QUEUE, "task_type": "again"}
    count = value(registry, "aiogroupq_task_pickup_latency_seconds_count", **labels)
    total = value(registry, "aiogroupq_task_pickup_latency_seconds_sum", **labels)
    # Two pickups: the first attempt's, and the retry's from the end of its
    # backoff (counted from the enqueue, it alone would exceed the backoff).
    assert count == 2
    assert total < backoff


async def test_a_failed_reading_says_so_and_drops_the_last_values(
    redis_client: redis.asyncio.Redis,
) -> None:
    # With Redis down the gauges kept their last values (consumers_alive 1):
    # an alert on them could not fire. Now up says 0, and they are gone
    # until a reading succeeds again.
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    down = False

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, {"queue": QUEUE})

    async with (
        aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        anyio.create_task_group() as tg,
    ):
        await producer.enqueue("t", 1, group="g")

        async def read() -> aiogroupq.QueueStats:
            if down:
                raise aiogroupq.RedisUnavailableError("127.0.0.1:1: timed out")
            return await admin.stats()

        async def until(name: str, want: float | None) -> None:
            with anyio.fail_after(PATIENCE):
                while value(name) != want:
                    await anyio.sleep(0.01)

        tg.start_soon(lambda: observer.watch_queue(QUEUE, read, interval=0.01))
        await until("aiogroupq_queue_groups", 1.0)
        assert value("aiogroupq_queue_up") == 1.0
        read_at = value("aiogroupq_queue_last_read_timestamp_seconds")
        assert read_at is not None
        assert read_at > 0
        down = True
        await until("aiogroupq_queue_up", 0.0)
        assert value("aiogroupq_queue_groups") is None
        assert value("aiogroupq_queue_consumers_alive") is None
        tasks = {"queue": QUEUE, "state": "parked"}
        assert registry.get_sample_value("aiogroupq_queue_tasks", tasks) is None
        assert value("aiogroupq_queue_last_read_timestamp_seconds") is not None
        down = False
        await until("aiogroupq_queue_up", 1.0)
        await until("aiogroupq_queue_groups", 1.0)
        tg.cancel_scope.cancel()


async def test_queue_gauges_from_admin_stats(
    redis_client: redis.asyncio.Redis,
) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    release = anyio.Event()

    async def block(n: int) -> None:
        await release.wait()

    async def fail(n: int) -> None:
        raise RuntimeError("dead at once")

    handlers = {
        "block": aiogroupq.Handler(block),
        "fail": aiogroupq.Handler(fail, on_dead="halt"),
    }
    async with (
        aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
    ):
        await admin.pause_group("p")
        await producer.enqueue("block", 0, group="p")
        async with aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers=handlers, concurrency=1
        ):
            # Group h halts behind its dead task, one task waits behind the
            # busy consumer, and p stays paused.
            dead = await producer.enqueue("fail", 0, group="h", max_attempts=1)
            await producer.enqueue("fail", 1, group="h")
            with anyio.fail_after(PATIENCE):
                while await producer.status(dead) != TaskState.DEAD:
                    await anyio.sleep(0.01)
            busy = await producer.enqueue("block", 1)
            with anyio.fail_after(PATIENCE):
                while await producer.status(busy) != TaskState.RUNNING:
                    await anyio.sleep(0.01)
            await producer.enqueue("block", 2)

            def gauge(name: str, **labels: str) -> float | None:
                return registry.get_sample_value(name, {"queue": QUEUE, **labels})

            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: observer.watch_queue(QUEUE, admin.stats, interval=0.01)
                )
                with anyio.fail_after(PATIENCE):
                    while (
                        not (gauge("aiogroupq_queue_oldest_waiting_seconds") or 0) > 0
                    ):
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
            got = {
                name: gauge(f"aiogroupq_queue_{name}")
                for name in (
                    "paused",
                    "groups_halted",
                    "groups_paused",
                    "consumers_alive",
                    "consumers_gone",
                )
            }
            tasks = {
                state: gauge("aiogroupq_queue_tasks", state=state)
                for state in ("ready", "running", "dead")
            }
            release.set()
    assert got == {
        "paused": 0,
        "groups_halted": 1,
        "groups_paused": 1,
        "consumers_alive": 1,
        "consumers_gone": 0,
    }
    assert tasks == {"ready": 1, "running": 1, "dead": 1}


async def _scrape(registry: CollectorRegistry, query: str = "", **serving: bool) -> str:
    server = serve(0, addr="127.0.0.1", registry=registry, **serving)
    try:
        async with httpx.AsyncClient() as http:
            url = f"http://127.0.0.1:{server.port}/metrics{query}"
            response = await http.get(url)
    finally:
        server.close()
    assert response.status_code == 200
    return response.text


async def test_served_metrics_have_no_created_series_unless_asked() -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    observer.on_event(
        TaskEvent(kind=EventKind.STARTED, queue="q", task_type="t", latency=0.01)
    )
    observer.on_event(
        TaskEvent(kind=EventKind.SUCCEEDED, queue="q", task_type="t", duration=0.5)
    )
    assert any(
        sample.name.endswith("_created")
        for metric in registry.collect()
        for sample in metric.samples
    )  # what prometheus_client keeps, and serve leaves out
    text = await _scrape(registry)
    assert 'aiogroupq_tasks_started_total{queue="q",task_type="t"} 1.0' in text
    assert (
        'aiogroupq_task_pickup_latency_seconds_count{queue="q",task_type="t"}' in text
    )
    assert "_created" not in text
    some = (
        "?name[]=aiogroupq_tasks_started_total&name[]=aiogroupq_tasks_started_created"
    )
    assert "_created" not in await _scrape(registry, some)
    kept = await _scrape(registry, created=True)
    assert 'aiogroupq_tasks_started_created{queue="q",task_type="t"}' in kept


async def test_serve_answers_scrapes_over_http() -> None:
    registry = CollectorRegistry()
    PrometheusObserver(registry=registry).on_event(
        TaskEvent(kind=EventKind.SUCCEEDED, queue="q", task_type="t")
    )
    server = serve(0, addr="127.0.0.1", registry=registry)
    try:
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.close()
    assert response.status_code == 200
    assert (
        'aiogroupq_tasks_succeeded_total{queue="q",task_type="t"} 1.0' in response.text
    )


def test_without_prometheus_client_the_import_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "aiogroupq.prometheus")
    with pytest.raises(aiogroupq.MissingExtraError) as caught:
        importlib.import_module("aiogroupq.prometheus")
    assert "pip install 'aiogroupq[prometheus]'" in str(caught.value)
    assert caught.value.extra == "prometheus"
    assert isinstance(caught.value, ImportError)
