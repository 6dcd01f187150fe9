"""Tasks as users write them (:class:`Task`), see them (:class:`TaskState`,
:class:`TaskInfo`) and as Redis stores them (:class:`Envelope`)."""

from __future__ import annotations

__all__ = ("DeadLetter", "Task", "TaskInfo", "TaskState", "current_task")

import contextvars
import enum
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

import msgspec


class TaskState(enum.StrEnum):
    """Where a task is in its life. The last four are terminal."""

    #: waiting to run: in the ready list or behind a busy group
    QUEUED = "queued"
    #: waiting for its due time (a delayed task, a retry's backoff, or its
    #: group's rate limit)
    DELAYED = "delayed"
    #: claimed by a consumer whose handler is running it
    RUNNING = "running"
    #: the handler returned
    SUCCEEDED = "succeeded"
    #: dead-lettered: bad input, or failed on its last attempt
    DEAD = "dead"
    #: cancelled before it completed
    CANCELLED = "cancelled"
    #: not started before its ``expires`` time: it never ran
    EXPIRED = "expired"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """One task for :meth:`Producer.enqueue_many`: the same fields as ``enqueue``.

    :param task_type: routes the task to a consumer's handler
    :param payload: any MessagePack-encodable value (builtins, msgspec Structs,
        dataclasses, …)
    :param group: tasks sharing a group run one at a time, in enqueue order
    :param delay: seconds (or a timedelta) before the task may start (at
        most 365 days)
    :param dedup_key: a second enqueue with this key within the window returns the
        first task's id
    :param max_attempts: attempts before the task is dead-lettered (default 3)
    :param timeout: seconds a single attempt may run
    :param run_at: an aware datetime before which the task may not start
        (instead of *delay*)
    :param priority: 0 (the default) to 9: a runnable task of a higher
        priority starts before lower ones; within a group order stays FIFO
    :param expires: seconds (or a timedelta, or an aware datetime) within
        which the task must start, else it ends ``expired`` without running
    :param unique: with *dedup_key*: the key blocks duplicates until this
        task ends, instead of for the producer's dedup window
    :param dedup_scope: where *dedup_key* holds: ``"group"``, among the
        tasks of *group* (without a group: queue-wide); ``"queue"``, across
        the queue; ``None`` (the default): the producer's ``dedup_scope``
    """

    task_type: str
    payload: Any = None
    group: str | None = None
    delay: float | timedelta | None = None
    dedup_key: str | None = None
    max_attempts: int | None = None
    timeout: float | timedelta | None = None
    run_at: datetime | None = None
    priority: int | None = None
    expires: float | timedelta | datetime | None = None
    unique: bool = False
    dedup_scope: Literal["group", "queue"] | None = None

    def __init__(  # positional task_type and payload, like enqueue()
        self,
        task_type: str,
        payload: Any = None,
        *,
        group: str | None = None,
        delay: float | timedelta | None = None,
        dedup_key: str | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        expires: float | timedelta | datetime | None = None,
        unique: bool = False,
        dedup_scope: Literal["group", "queue"] | None = None,
    ) -> None:
        object.__setattr__(self, "task_type", task_type)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "delay", delay)
        object.__setattr__(self, "dedup_key", dedup_key)
        object.__setattr__(self, "max_attempts", max_attempts)
        object.__setattr__(self, "timeout", timeout)
        object.__setattr__(self, "run_at", run_at)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "expires", expires)
        object.__setattr__(self, "unique", unique)
        object.__setattr__(self, "dedup_scope", dedup_scope)


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """What a handler can learn about the task it runs (see :func:`current_task`).

    :ivar id: the task id ``enqueue`` returned
    :ivar type: the task type
    :ivar group: the group key, or ``None``
    :ivar attempt: 1 on the first run, 2 on the first retry, …
    :ivar max_attempts: attempts allowed before dead-lettering
    :ivar fencing_token: increases with every claim of the queue; pass it to
        external systems to refuse writes from a consumer that lost its lease
    :ivar enqueued_at: producer's wall clock at enqueue (Unix seconds)
    :ivar started_at: when this attempt was claimed, on the Redis server's
        clock (Unix seconds): the moment rate limits count
    :ivar due_at: when the task became runnable, on the server's clock: its
        enqueue, the end of its delay, or the moment its group gave it a slot
    :ivar headers: what the producer's observers attached to the task (the
        trace context of :mod:`aiogroupq.otel`); empty without them
    """

    id: str
    type: str
    group: str | None
    attempt: int
    max_attempts: int
    fencing_token: int
    enqueued_at: float
    started_at: float = 0.0
    due_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead-lettered task, as :meth:`Admin.dead_letters` returns it.

    :ivar id: the task id
    :ivar type: the task type
    :ivar group: its group key, or ``None``
    :ivar payload: the payload, decoded as builtins (``None`` if undecodable)
    :ivar reason: why it was dead-lettered (error type and message)
    :ivar traceback: the handler's traceback, or ``""``
    :ivar attempts: attempts that ran
    :ivar dead_at: when, in Unix seconds (Redis server clock)
    """

    id: str
    type: str
    group: str | None
    payload: Any
    reason: str
    traceback: str
    attempts: int
    dead_at: float


#: the task whose handler runs in this context (set by the consumer and
#: ``testing.run_inline`` around a handler call; not exported)
CURRENT_TASK: Final[contextvars.ContextVar[TaskInfo]] = contextvars.ContextVar(
    "aiogroupq_current_task"
)


def current_task() -> TaskInfo:
    """Return the metadata of the task whose handler is running in this context.

    :raises RuntimeError: when called outside a handler
    """
    try:
        return CURRENT_TASK.get()
    except LookupError:
        raise RuntimeError(
            "aiogroupq.current_task() was called outside a task handler"
        ) from None


#: each task of the batch whose handler runs in this context, in order
CURRENT_BATCH: Final[contextvars.ContextVar[list[TaskInfo]]] = contextvars.ContextVar(
    "aiogroupq_current_batch"
)


def current_batch() -> list[TaskInfo]:
    """Return the metadata of each task of the batch whose handler is running
    in this context (``Handler(batch_size=N)``), in the order the handler
    receives their payloads; :func:`current_task` is the first one's.

    :raises RuntimeError: when called outside a batch handler
    """
    try:
        return list(CURRENT_BATCH.get())
    except LookupError:
        raise RuntimeError(
            "aiogroupq.current_batch() was called outside a batch handler"
        ) from None


class Envelope(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One task as stored in Redis: MessagePack, positional.

    Append-only schema: never reorder or remove a field; a new field goes last and
    has a default, so old and new consumers read each other's tasks.
    """

    id: str
    type: str
    payload: msgspec.Raw  # still encoded: decoded into the handler's declared type
    group: str | None = None
    max_attempts: int = 3
    timeout_ms: int | None = None
    enqueued_ms: int = 0
    # What observers attached (a trace context); None when there is none.
    headers: dict[str, str] | None = None


def new_task_id() -> str:
    """A 28-character hex id: milliseconds since the epoch, then 64 random bits.

    Ids sort by creation time (to the millisecond) and are made client-side, so a
    re-sent enqueue finds its own task instead of creating a second one. The
    module-level generator is reseeded in forked children, so processes differ.
    """
    return f"{time.time_ns() // 1_000_000:012x}{random.getrandbits(64):016x}"
