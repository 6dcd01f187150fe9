"""OpenTelemetry traces: ``pip install 'aiogroupq[otel]'``.

:class:`TracingObserver` opens a ``send <queue>`` span (kind PRODUCER) around
each ``enqueue``/``enqueue_many`` and stores its trace context with the
tasks; each handler run gets a ``process <queue>`` span (kind CONSUMER)
whose parent is that send span, so a request's trace continues in the
worker, and spans the handler opens are its children. The context travels
with the global propagator (W3C ``traceparent`` by default). Only the
OpenTelemetry API is needed here; the application sets up the SDK.
"""

from __future__ import annotations

__all__ = ("TracingObserver",)

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from . import __version__
from ._telemetry.events import EventKind, Observer, TaskEvent
from .errors import MissingExtraError

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as _missing:
    raise MissingExtraError(__name__, "otel", "opentelemetry-api") from _missing

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from .task import Task, TaskInfo

#: ``messaging.system`` of every span
SYSTEM: Final = "aiogroupq"

# The send span of a one-task enqueue, while it is open: the task's id is
# known only once it is written.
_SINGLE_SEND: Final[contextvars.ContextVar[trace.Span | None]] = contextvars.ContextVar(
    "aiogroupq_single_send", default=None
)


class TracingObserver(Observer):
    """Traces enqueues and handler runs with OpenTelemetry.

    Pass the same kind of observer to producers and consumers
    (``observers=[TracingObserver()]``).

    :param tracer_provider: where spans go (default: the global provider)
    """

    def __init__(self, *, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(
            "aiogroupq", __version__, tracer_provider=tracer_provider
        )

    def enqueue_context(
        self, queue: str, tasks: Sequence[Task]
    ) -> contextlib.AbstractContextManager[Mapping[str, str] | None]:
        """A ``send <queue>`` span; yields its trace context as headers."""
        return self._send(queue, tasks)

    def handler_context(
        self, queue: str, task: TaskInfo
    ) -> contextlib.AbstractContextManager[None]:
        """A ``process <queue>`` span, child of the task's send span."""
        return self._process(queue, task)

    def on_event(self, event: TaskEvent) -> None:
        """Name the task on its send span once it is written (its id is made
        then); a single task's is the span's ``messaging.message.id``."""
        if event.kind is EventKind.ENQUEUED and event.task_id is not None:
            span = _SINGLE_SEND.get()
            if span is not None:
                span.set_attribute("messaging.message.id", event.task_id)

    @contextlib.contextmanager
    def _send(self, queue: str, tasks: Sequence[Task]) -> Iterator[dict[str, str]]:
        attributes: dict[str, AttributeValue] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "enqueue",
            "messaging.destination.name": queue,
        }
        if len(tasks) > 1:
            attributes["messaging.batch.message_count"] = len(tasks)
        types = {task.task_type for task in tasks}
        if len(types) == 1:
            attributes["aiogroupq.task.type"] = types.pop()
        groups = {task.group for task in tasks}
        if len(groups) == 1 and (group := groups.pop()) is not None:
            attributes["aiogroupq.task.group"] = group
        with self._tracer.start_as_current_span(
            f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            headers: dict[str, str] = {}
            propagate.inject(headers)
            token = _SINGLE_SEND.set(span if len(tasks) == 1 else None)
            try:
                yield headers
            finally:
                _SINGLE_SEND.reset(token)

    @contextlib.contextmanager
    def _process(self, queue: str, task: TaskInfo) -> Iterator[None]:
        attributes: dict[str, AttributeValue] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": task.id,
            "aiogroupq.task.type": task.type,
            "aiogroupq.task.attempt": task.attempt,
        }
        if task.group is not None:
            attributes["aiogroupq.task.group"] = task.group
        # Without headers this starts a new trace, whatever context the
        # consumer itself was entered in.
        parent = propagate.extract(dict(task.headers))
        with self._tracer.start_as_current_span(
            f"process {queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        ) as span:
            try:
                yield
            except BaseException as exc:
                if not isinstance(exc, Exception):  # recorded by the span
                    # A timeout, a lost lease or the consumer's shutdown.
                    span.set_status(
                        Status(StatusCode.ERROR, "the handler was cancelled")
                    )
                raise
