"""Prometheus metrics: ``pip install 'aiogroupq[prometheus]'``.

:class:`PrometheusObserver` counts what producers and consumers do and times
handlers; :meth:`PrometheusObserver.watch_queue` keeps gauges of a queue's
task counts; :func:`serve` answers scrapes over HTTP (``aiogroupq worker
--metrics-port`` does all three for a worker). Every metric is labelled with
``queue``, and those about tasks with ``task_type`` too (``"unknown"`` when a
task's envelope could not be read).
"""

from __future__ import annotations

__all__ = ("MetricsServer", "PrometheusObserver", "serve")

import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Final
from weakref import WeakKeyDictionary

import anyio

from ._telemetry.events import EventKind, Observer, TaskEvent
from .errors import MissingExtraError

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
except ImportError as _missing:
    raise MissingExtraError(__name__, "prometheus", "prometheus-client") from _missing

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

logger: logging.Logger = logging.getLogger(__name__)

#: buckets of the pickup latency histogram, in seconds
LATENCY_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
#: buckets of the handler duration histogram, in seconds
DURATION_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip

#: the events counted per task, and the help text of their counters
_COUNTED: Final = {
    EventKind.ENQUEUED: "Tasks written by producers (deduplicated ones excluded).",
    EventKind.STARTED: "Handler attempts started.",
    EventKind.FAILED: "Handler attempts that raised, timed out or outlived "
    "their lease (each is then retried or dead-lettered).",
    EventKind.SUCCEEDED: "Tasks whose handler returned (recorded).",
    EventKind.RETRIED: "Retries recorded (after a failure, or asked by Retry).",
    EventKind.DEAD: "Tasks dead-lettered.",
    EventKind.CANCELLED: "Tasks cancelled while running, on request.",
    EventKind.HANDED_BACK: "Tasks handed back unfinished at shutdown.",
    EventKind.EXPIRED: "Tasks that expired before they started (ended by a claim).",
    EventKind.LEASE_LOST: "Attempts whose lease was lost (handler cancelled "
    "or outcome refused).",
}
#: events that end an attempt that ran: the handler's duration is observed
_ENDS: Final = frozenset(
    {
        EventKind.SUCCEEDED,
        EventKind.RETRIED,
        EventKind.DEAD,
        EventKind.CANCELLED,
        EventKind.LEASE_LOST,
    }
)


class _Metrics:
    """The metrics of one registry (one set, however many observers)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("queue", "task_type")
        self.counters = {
            kind: Counter(
                f"aiogroupq_tasks_{kind.value}",
                text,
                labels,
                registry=registry,
            )
            for kind, text in _COUNTED.items()
        }
        self.duration = Histogram(
            "aiogroupq_task_duration_seconds",
            "Seconds a handler attempt ran.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.latency = Histogram(
            "aiogroupq_task_pickup_latency_seconds",
            "Seconds from a task becoming runnable to its claim (Redis server clock).",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.blocked = Counter(
            "aiogroupq_loop_blocked",
            "Stalls of a consumer's event loop (a blocking handler).",
            ("queue",),
            registry=registry,
        )
        self.blocked_seconds = Counter(
            "aiogroupq_loop_blocked_seconds",
            "Seconds consumers' event loops were blocked, in all.",
            ("queue",),
            registry=registry,
        )
        self.queue_tasks = Gauge(
            "aiogroupq_queue_tasks",
            "Tasks of a queue by state, as last read from Redis.",
            ("queue", "state"),
            registry=registry,
        )


_BY_REGISTRY: Final[WeakKeyDictionary[CollectorRegistry, _Metrics]] = (
    WeakKeyDictionary()
)
_LOCK: Final = threading.Lock()


def _metrics(registry: CollectorRegistry) -> _Metrics:
    with _LOCK:
        found = _BY_REGISTRY.get(registry)
        if found is None:
            found = _BY_REGISTRY[registry] = _Metrics(registry)
        return found


class PrometheusObserver(Observer):
    """Counts tasks and times handlers in Prometheus metrics.

    Pass it to producers and consumers (``observers=[...]``); several
    observers on one registry share its metrics.

    Counters ``aiogroupq_tasks_<event>_total`` (``enqueued``, ``started``,
    ``failed``, ``succeeded``, ``retried``, ``dead``, ``cancelled``,
    ``handed_back``, ``lease_lost``), histograms
    ``aiogroupq_task_duration_seconds`` and
    ``aiogroupq_task_pickup_latency_seconds``, counters
    ``aiogroupq_loop_blocked_total`` and
    ``aiogroupq_loop_blocked_seconds_total``, and the gauge
    ``aiogroupq_queue_tasks`` (see :meth:`watch_queue`).

    :param registry: where the metrics live (default: prometheus_client's
        global registry, which :func:`serve` and most frameworks expose)
    """

    def __init__(self, *, registry: CollectorRegistry | None = None) -> None:
        self.registry: CollectorRegistry = (
            prometheus_client.REGISTRY if registry is None else registry
        )
        self._metrics = _metrics(self.registry)

    def on_event(self, event: TaskEvent) -> None:
        """Count *event* (see :class:`~aiogroupq.Observer`)."""
        metrics = self._metrics
        kind = event.kind
        if kind is EventKind.LOOP_BLOCKED:
            metrics.blocked.labels(event.queue).inc()
            metrics.blocked_seconds.labels(event.queue).inc(event.duration or 0.0)
            return
        task_type = event.task_type or "unknown"
        metrics.counters[kind].labels(event.queue, task_type).inc()
        if kind in _ENDS and event.duration is not None:
            metrics.duration.labels(event.queue, task_type).observe(event.duration)
        elif kind is EventKind.STARTED and event.latency is not None:
            metrics.latency.labels(event.queue, task_type).observe(event.latency)

    async def watch_queue(
        self,
        queue: str,
        read: Callable[[], Awaitable[Mapping[str, int]]],
        *,
        interval: float = 5.0,
    ) -> None:
        """Keep ``aiogroupq_queue_tasks{queue, state}`` up to date until
        cancelled: every *interval* seconds, ``await read()`` gives the
        count of each state. A state missing from a later reading drops to
        0; a failed reading is logged and leaves the gauges as they were.

        :param queue: the queue's name, for the label
        :param read: an async callable returning state -> count
        :param interval: seconds between readings
        """
        gauge = self._metrics.queue_tasks
        seen: set[str] = set()
        while True:
            try:
                counts = await read()
            except Exception as exc:  # noqa: BLE001 - any reader, any failure
                logger.warning("could not read the counts of queue %r: %s", queue, exc)
            else:
                for state in seen - set(counts):
                    gauge.labels(queue, state).set(0)
                for state, count in counts.items():
                    gauge.labels(queue, state).set(count)
                seen |= set(counts)
            await anyio.sleep(interval)


class MetricsServer:
    """A metrics endpoint that :func:`serve` started."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The TCP port it listens on."""
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve(
    port: int, *, addr: str = "0.0.0.0", registry: CollectorRegistry | None = None
) -> MetricsServer:
    """Answer Prometheus scrapes on ``http://addr:port/metrics`` from a
    background thread, until :meth:`MetricsServer.close`.

    :param port: the TCP port (0: a free one, see :attr:`MetricsServer.port`)
    :param addr: the address to listen on
    :param registry: what to expose (default: the global registry)
    :raises OSError: if the port cannot be bound
    """
    server, thread = prometheus_client.start_http_server(
        port,
        addr=addr,
        registry=prometheus_client.REGISTRY if registry is None else registry,
    )
    return MetricsServer(server, thread)
