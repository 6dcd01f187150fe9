"""``aiogroupq.otel``: an enqueue's span and its handler's span are one
trace, with the SDK's in-memory exporter."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator

import anyio
import pytest
import redis.asyncio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

import aiogroupq
from aiogroupq import TaskState
from aiogroupq.otel import TracingObserver

QUEUE = "otel"
PATIENCE = 30.0


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


async def settle(producer: aiogroupq.Producer, ids: list[str]) -> None:
    terminal = {TaskState.SUCCEEDED, TaskState.DEAD}
    with anyio.fail_after(PATIENCE):
        for task_id in ids:
            while await producer.status(task_id) not in terminal:
                await anyio.sleep(0.01)


async def test_a_request_trace_continues_in_the_handler(
    redis_client: redis.asyncio.Redis,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    tracer = provider.get_tracer("test")
    observer = TracingObserver(tracer_provider=provider)

    async def work(n: int) -> None:
        with tracer.start_as_current_span("inside the handler"):
            pass

    async with aiogroupq.Producer(
        redis_client, queue=QUEUE, observers=[observer]
    ) as producer:
        with tracer.start_as_current_span("request"):
            task_id = await producer.enqueue("work", 1, group="tenant-7")
        async with aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers={"work": work}, observers=[observer]
        ):
            await settle(producer, [task_id])
            with anyio.fail_after(PATIENCE):
                while not named(exporter, f"process {QUEUE}"):
                    await anyio.sleep(0.01)
    (request,) = named(exporter, "request")
    (send,) = named(exporter, f"send {QUEUE}")
    (process,) = named(exporter, f"process {QUEUE}")
    (inside,) = named(exporter, "inside the handler")
    trace_id = request.context.trace_id
    assert {s.context.trace_id for s in (send, process, inside)} == {trace_id}
    assert send.parent is not None
    assert send.parent.span_id == request.context.span_id
    assert process.parent is not None
    assert process.parent.span_id == send.context.span_id
    assert inside.parent is not None
    assert inside.parent.span_id == process.context.span_id
    assert (send.kind, process.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    assert dict(send.attributes or {}) == {
        "messaging.system": "aiogroupq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": QUEUE,
        "messaging.message.id": task_id,
        "aiogroupq.task.type": "work",
        "aiogroupq.task.group": "tenant-7",
    }
    assert dict(process.attributes or {}) == {
        "messaging.system": "aiogroupq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": QUEUE,
        "messaging.message.id": task_id,
        "aiogroupq.task.type": "work",
        "aiogroupq.task.group": "tenant-7",
        "aiogroupq.task.attempt": 1,
    }
    assert process.status.status_code is StatusCode.UNSET


async def test_failed_and_timed_out_runs_are_error_spans(
    redis_client: redis.asyncio.Redis,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    observer = TracingObserver(tracer_provider=provider)

    async def broken(n: int) -> None:
        raise ValueError("no")

    async def slow(n: int) -> None:
        await anyio.sleep(PATIENCE)

    async with aiogroupq.Producer(
        redis_client, queue=QUEUE, observers=[observer]
    ) as producer:
        ids = await producer.enqueue_many(
            [
                aiogroupq.Task("broken", 1, max_attempts=1),
                aiogroupq.Task("slow", 2, max_attempts=1, timeout=0.05),
            ]
        )
        async with aiogroupq.Consumer(
            redis_client,
            queue=QUEUE,
            handlers={"broken": broken, "slow": slow},
            observers=[observer],
        ):
            await settle(producer, ids)
    (send,) = named(exporter, f"send {QUEUE}")
    assert (send.attributes or {})["messaging.batch.message_count"] == 2
    assert "messaging.message.id" not in (send.attributes or {})
    assert "aiogroupq.task.type" not in (send.attributes or {})  # two types
    processes = {
        (span.attributes or {})["aiogroupq.task.type"]: span
        for span in named(exporter, f"process {QUEUE}")
    }
    assert processes["broken"].status.status_code is StatusCode.ERROR
    assert [e.name for e in processes["broken"].events] == ["exception"]
    assert processes["slow"].status.status_code is StatusCode.ERROR
    assert processes["slow"].status.description == "the handler was cancelled"
    for span in processes.values():
        assert span.parent is not None
        assert span.parent.span_id == send.context.span_id


async def test_a_task_without_headers_starts_a_trace_of_its_own(
    redis_client: redis.asyncio.Redis,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    tracer = provider.get_tracer("test")

    async def work(n: int) -> None:
        pass

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("work", 1)
        # Entered inside a span: the handler's trace must not hang under it.
        with tracer.start_as_current_span("consumer's surroundings"):
            async with aiogroupq.Consumer(
                redis_client,
                queue=QUEUE,
                handlers={"work": work},
                observers=[TracingObserver(tracer_provider=provider)],
            ):
                await settle(producer, [task_id])
    (process,) = named(exporter, f"process {QUEUE}")
    assert process.parent is None


def test_without_the_api_the_import_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.delitem(sys.modules, "aiogroupq.otel")
    with pytest.raises(aiogroupq.MissingExtraError, match=r"aiogroupq\[otel\]"):
        importlib.import_module("aiogroupq.otel")
