"""Hooks for metrics and traces: :class:`Observer`, the events it receives
(:class:`TaskEvent`), and the dispatch that producers and consumers call.

The core depends on nothing here: :mod:`aiogroupq.prometheus` and
:mod:`aiogroupq.otel` are observers, as is anything a user writes.
"""

from __future__ import annotations

__all__ = ("EventKind", "Observer", "TaskEvent")

import contextlib
import enum
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Final

import msgspec

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..task import Task, TaskInfo

logger: logging.Logger = logging.getLogger("aiogroupq.observer")

#: most bytes the headers observers attach may take in a task's envelope
#: (MessagePack); a trace context needs about 70
MAX_HEADERS_BYTES: Final = 256


class EventKind(enum.StrEnum):
    """What happened; the ``kind`` of a :class:`TaskEvent`."""

    #: a producer wrote a new task (a deduplicated enqueue writes none)
    ENQUEUED = "enqueued"
    #: a handler started an attempt (``latency`` is the pickup latency)
    STARTED = "started"
    #: an attempt raised, timed out or could not renew its lease; a
    #: ``RETRIED`` or ``DEAD`` event follows once the outcome is recorded
    FAILED = "failed"
    #: recorded: the handler returned
    SUCCEEDED = "succeeded"
    #: recorded: the task will run again (a failure, or ``Retry``)
    RETRIED = "retried"
    #: recorded: the task was dead-lettered (also by a recovery that found
    #: its last attempt's lease expired: then only ``task_id`` is known)
    DEAD = "dead"
    #: recorded: the task ended cancelled on request
    CANCELLED = "cancelled"
    #: recorded: the consumer stopped and gave the task back, uncounted
    HANDED_BACK = "handed_back"
    #: the consumer lost the task's lease: its handler was cancelled, or its
    #: outcome was refused
    LEASE_LOST = "lease_lost"
    #: recorded: a claim found the task past its ``expires`` time, never
    #: started, and ended it (only ``task_id`` is known)
    EXPIRED = "expired"
    #: the event loop did not run for ``duration`` seconds; ``task_type`` and
    #: ``task_id`` name the handler that held it, when it was one
    LOOP_BLOCKED = "loop_blocked"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskEvent:
    """One event, as :meth:`Observer.on_event` receives it.

    :ivar kind: what happened
    :ivar queue: the queue's name
    :ivar task_id: the task, when the event is about one
    :ivar task_type: its type, when known (a task whose envelope does not
        decode has none)
    :ivar group: its group key, or ``None``
    :ivar attempt: the attempt's number, when known
    :ivar duration: seconds the handler ran (events of an attempt that ran),
        or that the loop was blocked (``LOOP_BLOCKED``)
    :ivar latency: pickup latency in seconds, on the Redis server's clock:
        the claim's time minus the moment the task became runnable (its
        enqueue, its group's turn, or the end of its delay or of its retry's
        backoff: a backoff is not counted) (``STARTED`` only)
    :ivar error: what the handler raised (``FAILED`` only; a timeout or an
        unrenewed lease is a :class:`TimeoutError`)
    """

    kind: EventKind
    queue: str
    task_id: str | None = None
    task_type: str | None = None
    group: str | None = None
    attempt: int | None = None
    duration: float | None = None
    latency: float | None = None
    error: BaseException | None = None


class Observer:
    """Receives what producers and consumers do, for metrics and traces.

    Subclass it, override the hooks you need and pass instances as
    ``Producer(..., observers=[...])`` and ``Consumer(..., observers=[...])``.
    Hooks run inline on the event loop: keep them fast and never block. An
    exception raised by a hook is logged and ignored; observers never change
    what happens to a task, and a context manager's ``__exit__`` cannot
    swallow the error it sees.
    """

    def on_event(self, event: TaskEvent) -> None:
        """Called for each :class:`TaskEvent` (by default does nothing)."""

    def enqueue_context(
        self, queue: str, tasks: Sequence[Task]
    ) -> AbstractContextManager[Mapping[str, str] | None] | None:
        """A context manager to enter around one ``enqueue`` or
        ``enqueue_many`` call's write, or ``None``.

        It is entered after the tasks were checked and left when the write
        ended (with its exception, if it failed). The mapping it yields is
        stored with every task of the call (its headers, seen by the
        consumer as ``TaskInfo.headers``): a trace context. Headers past
        256 bytes are dropped, with a warning.

        :param queue: the producer's queue
        :param tasks: the tasks, as given to ``enqueue_many`` (or built by
            ``enqueue``)
        """
        return None

    def handler_context(
        self, queue: str, task: TaskInfo
    ) -> AbstractContextManager[None] | None:
        """A context manager to enter around each handler run, or ``None``.

        It is entered in the handler's own context (a context variable it
        sets is seen by the handler) and left with whatever the handler
        raised, the cancellation of a timeout or lost lease included.

        :param queue: the consumer's queue
        :param task: the task, as :func:`~aiogroupq.current_task` gives it
        """
        return None


def check_observers(observers: Iterable[Observer]) -> tuple[Observer, ...]:
    """The observers as a tuple.

    :raises ConfigurationError: for anything that is not an :class:`Observer`
    """
    if isinstance(observers, Observer | str | bytes):
        raise ConfigurationError(
            f"observers must be a sequence of aiogroupq.Observer, got {observers!r}"
        )
    try:
        checked = tuple(observers)
    except TypeError:
        raise ConfigurationError(
            f"observers must be a sequence of aiogroupq.Observer, got {observers!r}"
        ) from None
    for observer in checked:
        if not isinstance(observer, Observer):
            raise ConfigurationError(
                f"observers must be aiogroupq.Observer instances, got {observer!r}"
            )
    return checked


class _Guarded(AbstractContextManager[object]):
    """An observer's context manager whose failures are logged, not raised."""

    __slots__ = ("_inner", "_observer")

    def __init__(
        self, inner: AbstractContextManager[object] | None, observer: Observer
    ) -> None:
        self._inner = inner
        self._observer = observer

    def __enter__(self) -> object:
        if self._inner is None:
            return None
        try:
            return self._inner.__enter__()
        except Exception:
            logger.exception("observer %r failed on entering", self._observer)
            self._inner = None
            return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._inner is not None:
            try:
                self._inner.__exit__(exc_type, exc, tb)
            except Exception:
                logger.exception("observer %r failed on leaving", self._observer)


class Observers:
    """The observers of one producer or consumer: the hooks' dispatch.

    Without observers each call returns at once, so the hot path pays
    nothing for the feature.
    """

    __slots__ = ("_all", "queue")

    def __init__(self, queue: str, observers: tuple[Observer, ...] = ()) -> None:
        self.queue = queue
        self._all = observers

    def __bool__(self) -> bool:
        return bool(self._all)

    def add(self, observer: Observer) -> None:
        """Observe with *observer* too."""
        self._all = (*self._all, *check_observers([observer]))

    def emit(
        self,
        kind: EventKind,
        *,
        task_id: str | None = None,
        task_type: str | None = None,
        group: str | None = None,
        attempt: int | None = None,
        duration: float | None = None,
        latency: float | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Send one event to every observer."""
        if not self._all:
            return
        event = TaskEvent(
            kind=kind,
            queue=self.queue,
            task_id=task_id,
            task_type=task_type,
            group=group,
            attempt=attempt,
            duration=duration,
            latency=latency,
            error=error,
        )
        for observer in self._all:
            try:
                observer.on_event(event)
            except Exception:
                logger.exception("observer %r failed on %s", observer, kind)

    def enqueue(
        self, tasks: Sequence[Task]
    ) -> AbstractContextManager[dict[str, str] | None]:
        """Every observer's enqueue context in one; it yields the merged
        headers (``None`` when there are none)."""
        return self._enqueue(tasks) if self._all else _NO_HEADERS

    def handler(self, task: TaskInfo) -> AbstractContextManager[None]:
        """Every observer's handler context in one, around a handler run."""
        return self._handler(task) if self._all else _NOTHING

    @contextlib.contextmanager
    def _enqueue(self, tasks: Sequence[Task]) -> Iterator[dict[str, str] | None]:
        with contextlib.ExitStack() as stack:
            headers: dict[object, object] = {}
            for observer in self._all:
                try:
                    made = observer.enqueue_context(self.queue, tasks)
                except Exception:
                    logger.exception("observer %r failed on enqueue", observer)
                    continue
                given = stack.enter_context(_Guarded(made, observer))
                if isinstance(given, Mapping):
                    headers.update(given)
            yield _fitting(headers)

    @contextlib.contextmanager
    def _handler(self, task: TaskInfo) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for observer in self._all:
                try:
                    made = observer.handler_context(self.queue, task)
                except Exception:
                    logger.exception("observer %r failed on a handler", observer)
                    continue
                stack.enter_context(_Guarded(made, observer))
            yield


_NO_HEADERS: Final = contextlib.nullcontext(None)
_NOTHING: Final = contextlib.nullcontext()


def _fitting(headers: Mapping[object, object]) -> dict[str, str] | None:
    """*headers* without the entries that are not strings or do not fit."""
    kept: dict[str, str] = {}
    dropped = []
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            dropped.append(key)
            continue
        kept[key] = value
        if len(msgspec.msgpack.encode(kept)) > MAX_HEADERS_BYTES:
            del kept[key]
            dropped.append(key)
    if dropped:
        logger.warning(
            "task headers %r dropped: not strings, or over %d bytes in all",
            dropped,
            MAX_HEADERS_BYTES,
        )
    return kept or None
