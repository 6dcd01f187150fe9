"""Prometheus metrics: ``pip install 'aiogroupq[prometheus]'``.

:class:`PrometheusObserver` counts what producers and consumers do and times
handlers; :meth:`PrometheusObserver.watch_queue` keeps gauges of a queue's
state (task counts, the oldest waiting work, halted and paused groups, live
consumers); :func:`serve` answers scrapes over HTTP (``aiogroupq worker
--metrics-port`` does all three for a worker). Every metric is labelled with
``queue``, and those about tasks with ``task_type`` too (``"unknown"`` when a
task's envelope could not be read).
"""

from __future__ import annotations

__all__ = ("MetricsServer", "PrometheusObserver", "serve")

import contextlib
import copy
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Final
from weakref import WeakKeyDictionary

import anyio

from ._telemetry.events import EventKind, Observer, TaskEvent
from .errors import MissingExtraError

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.registry import Collector
except ImportError as _missing:
    raise MissingExtraError(__name__, "prometheus", "prometheus-client") from _missing

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

    from ._inspect.views import QueueStats

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
#: the other gauges of a reading: name -> (help, its value); what alerts are
#: written on (work waiting too long, a halted group, no live consumer)
_STATS_GAUGES: Final[dict[str, tuple[str, Callable[[QueueStats], float]]]] = {
    "aiogroupq_queue_oldest_waiting_seconds": (
        (
            "Seconds the longest-waiting work has waited to start: the ready "
            "queue's head, or the group whose line is oldest (0: nothing waits)."
        ),
        lambda stats: stats.oldest_waiting or 0.0,
    ),
    "aiogroupq_queue_paused": (
        "1 while the whole queue is paused (nothing starts), else 0.",
        lambda stats: float(stats.paused),
    ),
    "aiogroupq_queue_groups": (
        "Groups with live tasks (or halted).",
        lambda stats: stats.groups,
    ),
    "aiogroupq_queue_groups_waiting": (
        "Groups with tasks in line behind their running ones.",
        lambda stats: stats.groups_waiting,
    ),
    "aiogroupq_queue_groups_halted": (
        (
            "Groups halted behind a dead task: nothing of theirs starts until "
            "an operator requeues, purges or releases it."
        ),
        lambda stats: stats.groups_halted,
    ),
    "aiogroupq_queue_groups_paused": (
        "Groups paused by an operator.",
        lambda stats: stats.groups_paused,
    ),
    "aiogroupq_queue_groups_rate_limited": (
        "Groups waiting for their rate limit.",
        lambda stats: stats.groups_rate_limited,
    ),
    "aiogroupq_queue_consumers_alive": (
        "Consumers that sent a heartbeat within their lease.",
        lambda stats: stats.consumers_alive,
    ),
    "aiogroupq_queue_consumers_gone": (
        "Consumers that stopped sending heartbeats without leaving (recently).",
        lambda stats: stats.consumers_gone,
    ),
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
            "Seconds from a task becoming runnable (a retry: the end of its "
            "backoff) to its claim (Redis server clock).",
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
        self.queue_gauges = {
            name: Gauge(name, text, ("queue",), registry=registry)
            for name, (text, _) in _STATS_GAUGES.items()
        }
        self.queue_up = Gauge(
            "aiogroupq_queue_up",
            "1 when the last reading of the queue from Redis succeeded, 0 when "
            "it failed (Redis down, refusing or too slow): the other "
            "aiogroupq_queue_* gauges are then dropped, not kept at their last "
            "values.",
            ("queue",),
            registry=registry,
        )
        self.queue_read_at = Gauge(
            "aiogroupq_queue_last_read_timestamp_seconds",
            "Unix time of the last successful reading of the queue from Redis.",
            ("queue",),
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
    ``handed_back``, ``expired``, ``lease_lost``), histograms
    ``aiogroupq_task_duration_seconds`` and
    ``aiogroupq_task_pickup_latency_seconds``, counters
    ``aiogroupq_loop_blocked_total`` and
    ``aiogroupq_loop_blocked_seconds_total``, and the ``aiogroupq_queue_*``
    gauges (see :meth:`watch_queue`).

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
        read: Callable[[], Awaitable[Mapping[str, int] | QueueStats]],
        *,
        interval: float = 5.0,
    ) -> None:
        """Keep the queue's gauges up to date until cancelled: every
        *interval* seconds, ``await read()``.

        ``aiogroupq_queue_up{queue}`` is 1 after a successful reading, 0
        after a failed one, and
        ``aiogroupq_queue_last_read_timestamp_seconds{queue}`` is the Unix
        time of the last successful one. A failed reading is logged and
        drops every other gauge of the queue until a reading succeeds
        again: a value read before Redis went down (``consumers_alive 1``)
        is not shown as if it were current.

        A reading that is a :class:`~aiogroupq.QueueStats` (pass
        ``admin.stats``) sets ``aiogroupq_queue_tasks{queue, state}`` for
        ``ready``, ``parked``, ``held``, ``delayed``, ``running`` and
        ``dead``, and the gauges alerts are written on:
        ``aiogroupq_queue_oldest_waiting_seconds`` (0 when nothing waits),
        ``aiogroupq_queue_paused`` (1 or 0),
        ``aiogroupq_queue_groups``, ``aiogroupq_queue_groups_waiting``,
        ``aiogroupq_queue_groups_halted``, ``aiogroupq_queue_groups_paused``,
        ``aiogroupq_queue_groups_rate_limited``,
        ``aiogroupq_queue_consumers_alive`` and
        ``aiogroupq_queue_consumers_gone``. A reading that is a mapping of
        state -> count sets ``aiogroupq_queue_tasks`` alone.

        A state missing from a later reading drops to 0.

        :param queue: the queue's name, for the label
        :param read: an async callable returning a ``QueueStats``, or a
            mapping of state -> count
        :param interval: seconds between readings
        """
        seen: set[str] = set()
        metrics = self._metrics
        while True:
            try:
                reading = await read()
            except Exception as exc:  # noqa: BLE001 - any reader, any failure
                logger.warning("could not read the counts of queue %r: %s", queue, exc)
                metrics.queue_up.labels(queue).set(0)
                self._drop(queue, seen)
            else:
                if isinstance(reading, Mapping):
                    counts = dict(reading)
                else:
                    counts = _task_counts(reading)
                    for name, (_, figure) in _STATS_GAUGES.items():
                        metrics.queue_gauges[name].labels(queue).set(figure(reading))
                self._set_counts(queue, counts, seen)
                metrics.queue_up.labels(queue).set(1)
                metrics.queue_read_at.labels(queue).set_to_current_time()
            await anyio.sleep(interval)

    def _drop(self, queue: str, seen: set[str]) -> None:
        """Remove the queue's gauges of the last reading, until the next
        reading sets them again (a state of *seen* missing from it at 0)."""
        metrics = self._metrics
        labelled: list[tuple[Gauge, tuple[str, ...]]] = [
            (g, (queue,)) for g in metrics.queue_gauges.values()
        ]
        labelled += [(metrics.queue_tasks, (queue, state)) for state in seen]
        for gauge, labels in labelled:
            with contextlib.suppress(KeyError):  # never set: nothing to drop
                gauge.remove(*labels)

    def _set_counts(
        self, queue: str, counts: Mapping[str, int], seen: set[str]
    ) -> None:
        """Set the task counts of one reading; *seen* holds the states set
        so far, and those missing now drop to 0."""
        gauge = self._metrics.queue_tasks
        for state in seen - set(counts):
            gauge.labels(queue, state).set(0)
        for state, count in counts.items():
            gauge.labels(queue, state).set(count)
        seen |= set(counts)


def _task_counts(stats: QueueStats) -> dict[str, int]:
    """The task states of a reading, as ``aiogroupq_queue_tasks{state}``."""
    return {
        "ready": stats.ready,
        "parked": stats.parked,
        "held": stats.held,
        "delayed": stats.delayed,
        "running": stats.running,
        "dead": stats.dead,
    }


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


class _WithoutCreated(Collector):
    """What *registry* exposes (only the metrics *names* when given), less
    the ``<name>_created`` samples that prometheus_client adds to each
    counter, histogram and summary: one series more per labelled child,
    which alerts and dashboards rarely use.

    Only this view drops them: prometheus_client's own switch for it
    (``disable_created_metrics()``) is global to the process, which may hold
    the application's metrics too.
    """

    def __init__(
        self, registry: CollectorRegistry, names: Iterable[str] | None = None
    ) -> None:
        self._registry = registry
        self._names = None if names is None else tuple(names)

    def collect(self) -> Iterable[Metric]:
        if self._names is None:
            return _without_created(self._registry.collect())
        restricted = self._registry.restricted_registry(self._names)
        return _without_created(restricted.collect())

    def restricted_registry(self, names: Iterable[str]) -> _WithoutCreated:
        """The same view of some metrics only (a scrape with ``name[]``)."""
        return _WithoutCreated(self._registry, names)


def _without_created(metrics: Iterable[Metric]) -> Iterator[Metric]:
    for metric in metrics:
        created = f"{metric.name}_created"
        if not any(sample.name == created for sample in metric.samples):
            yield metric
            continue
        kept = copy.copy(metric)
        kept.samples = [sample for sample in metric.samples if sample.name != created]
        yield kept


def serve(
    port: int,
    *,
    addr: str = "0.0.0.0",
    registry: CollectorRegistry | None = None,
    created: bool = False,
) -> MetricsServer:
    """Answer Prometheus scrapes on ``http://addr:port/metrics`` from a
    background thread, until :meth:`MetricsServer.close`.

    :param port: the TCP port (0: a free one, see :attr:`MetricsServer.port`)
    :param addr: the address to listen on
    :param registry: what to expose (default: the global registry)
    :param created: also expose the ``*_created`` series prometheus_client
        keeps for each counter, histogram and summary (the time each
        labelled series was created); left out by default
    :raises OSError: if the port cannot be bound
    """
    chosen = prometheus_client.REGISTRY if registry is None else registry
    exposed: Collector = chosen if created else _WithoutCreated(chosen)
    server, thread = prometheus_client.start_http_server(
        port, addr=addr, registry=exposed
    )
    return MetricsServer(server, thread)
