"""Exceptions raised by aiogroupq.

The hierarchy::

    AiogroupqError
    ├── ConfigurationError          a Producer/Consumer argument or client is unusable
    │   ├── AuthenticationError     Redis refused the user name or password
    │   └── PermissionDeniedError   the Redis user may not run a command or touch a key
    ├── ConsumerRunningError        a Consumer was entered while already running
    ├── NotOpenError                a Producer/Admin used outside async with, or on another loop
    ├── InvalidTaskError            a task is refused before anything is written
    │   ├── BatchTooLargeError      more tasks, or bytes, in one enqueue_many than allowed
    │   ├── InvalidGroupError       empty, too long or not a string
    │   ├── PayloadTooLargeError    encoded payload over the producer's limit
    │   ├── UnencodablePayloadError MessagePack cannot encode the payload
    │   └── UnknownTaskTypeError    not among the producer's declared task types
    ├── TaskNotFoundError           no task with that id (or it expired)
    ├── TaskFailedError             the awaited task was dead-lettered
    ├── TaskCancelledError          the awaited task was cancelled
    ├── TaskExpiredError            the awaited task expired before it started
    ├── NoResultError               the awaited task's type stores no result
    ├── InvalidResultError          a stored result does not decode into result_type
    ├── QueueFullError              Redis is out of memory and refused new work
    │   └── GroupFullError          a group is at its max_size
    ├── CorruptQueueError           a key of the queue holds something no script wrote
    │   └── CorruptTaskError        a task's stored fields are not what aiogroupq writes
    ├── RedisUnavailableError       Redis could not be reached within the budget
    │   └── OutcomeUnknownError     an enqueue was sent but no reply came: written or not
    ├── NotReplicatedError          written on the primary, not acknowledged by a replica
    └── MissingExtraError           an optional module's package is not installed

:class:`~aiogroupq.Retry` is not an error: a handler raises it to ask for another attempt.
"""

from __future__ import annotations

__all__ = (
    "AiogroupqError",
    "AuthenticationError",
    "BatchTooLargeError",
    "ConfigurationError",
    "ConsumerRunningError",
    "CorruptQueueError",
    "CorruptTaskError",
    "GroupFullError",
    "InvalidGroupError",
    "InvalidResultError",
    "InvalidTaskError",
    "MissingExtraError",
    "NoResultError",
    "NotOpenError",
    "NotReplicatedError",
    "OutcomeUnknownError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QueueFullError",
    "RedisUnavailableError",
    "Retry",
    "TaskCancelledError",
    "TaskExpiredError",
    "TaskFailedError",
    "TaskNotFoundError",
    "UnencodablePayloadError",
    "UnknownTaskTypeError",
)

import math
from datetime import timedelta
from typing import Literal

from ._limits import MAX_DELAY


class AiogroupqError(Exception):
    """Base class of every error aiogroupq raises."""


class ConfigurationError(AiogroupqError, ValueError):
    """A constructor argument, a borrowed Redis client, or the Redis server's
    configuration cannot be used."""


class AuthenticationError(ConfigurationError):
    """Redis refused the credentials (wrong password, unknown or disabled user,
    or none given to a server that requires them).

    Not retried: a wrong password does not get better by waiting.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"Redis refused the credentials ({detail}): check the user name and "
            "password in the URL (redis://user:password@host:port/db) or the client"
        )
        self.detail = detail


class PermissionDeniedError(ConfigurationError):
    """The Redis user may not run a command or touch a key the queue needs
    (an ACL ``NOPERM`` reply); the operations page of the docs gives the
    exact rule a queue's user needs.

    :ivar detail: what was refused; a reply of the server comes with its
        error code first (``NOPERM ...``: its wording differs between Redis
        and Valkey versions)
    """

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"Redis denied access ({detail}): the user needs the commands and the "
            "key pattern ~{aiogroupq:<queue>}:* of this queue"
        )
        self.detail = detail


class ConsumerRunningError(AiogroupqError, RuntimeError):
    """A :class:`~aiogroupq.Consumer` was entered while it was already running
    (or starting). Leave its ``async with`` block first, or use another
    Consumer."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"consumer {name!r} is already running: leave its 'async with' block "
            "before entering it again, or create another Consumer"
        )
        self.name = name


class NotOpenError(AiogroupqError, RuntimeError):
    """A :class:`~aiogroupq.Producer` or :class:`~aiogroupq.Admin` was used
    outside its ``async with`` block, or on another event loop than the one
    that entered it (its connections belong to that loop).

    :ivar other_loop: whether it is open, on another event loop
    """

    def __init__(self, name: str, *, other_loop: bool) -> None:
        if other_loop:
            message = (
                f"this {name} was opened on another event loop: use it on the loop "
                f"that entered its 'async with {name}(...)' block, or open one on "
                "this loop (with pytest-asyncio: give the fixture that opens it the "
                "loop_scope of the tests that use it)"
            )
        else:
            message = f"this {name} is not open: use it inside 'async with {name}(...)'"
        super().__init__(message)
        self.other_loop = other_loop


class InvalidTaskError(AiogroupqError, ValueError):
    """A task was refused before any I/O: nothing was written to Redis.

    :ivar field: the offending parameter (``"group"``, ``"delay"``, …)
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"invalid {field}: {message}")
        self.field = field


class InvalidGroupError(InvalidTaskError):
    """The group key is not a non-empty string of at most the documented size."""

    def __init__(self, group: object, reason: str) -> None:
        super().__init__("group", f"{group!r} {reason}")
        self.group = group


class BatchTooLargeError(InvalidTaskError):
    """``enqueue_many`` got more tasks, or more bytes of encoded tasks, than
    one atomic call may carry: split the batch.

    :ivar size: how many tasks (or bytes) the call held
    :ivar limit: how many it may hold
    :ivar unit: ``"tasks"`` or ``"bytes"``
    """

    def __init__(
        self, size: int, limit: int, *, unit: Literal["tasks", "bytes"] = "tasks"
    ) -> None:
        if unit == "bytes":
            detail = (
                f"{size} bytes of encoded tasks in one enqueue_many; at most "
                f"{limit} are enqueued atomically (one script call must stay "
                "short): split the batch, or raise Producer(max_batch_bytes=...)"
            )
        else:
            detail = (
                f"{size} tasks in one enqueue_many; at most {limit} are enqueued "
                "atomically (one script call must stay short): split the batch"
            )
        super().__init__("tasks", detail)
        self.size = size
        self.limit = limit
        self.unit = unit


class PayloadTooLargeError(InvalidTaskError):
    """The encoded payload is larger than the producer's ``max_payload_bytes``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            "payload",
            f"encoded size {size} bytes exceeds the limit of {limit} bytes "
            "(raise Producer(max_payload_bytes=...) or store the data elsewhere "
            "and enqueue a reference)",
        )
        self.size = size
        self.limit = limit


class UnencodablePayloadError(InvalidTaskError):
    """MessagePack cannot encode the payload (e.g. an arbitrary object)."""

    def __init__(self, payload: object, reason: str) -> None:
        super().__init__(
            "payload",
            f"cannot encode a {type(payload).__name__} as MessagePack: {reason}",
        )


class UnknownTaskTypeError(InvalidTaskError):
    """The task type is not among those the producer was told about."""

    def __init__(self, task_type: str, known: frozenset[str]) -> None:
        super().__init__(
            "task_type",
            f"{task_type!r} is not one of the declared task types {sorted(known)!r}",
        )
        self.task_type = task_type


class TaskNotFoundError(AiogroupqError, LookupError):
    """No task with this id exists in the queue (never enqueued, or expired)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task {task_id!r} in this queue (unknown or expired)")
        self.task_id = task_id


class TaskFailedError(AiogroupqError):
    """The task whose result was awaited was dead-lettered.

    :ivar reason: the dead-letter reason (error type and message)
    """

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"task {task_id!r} was dead-lettered: {reason}")
        self.task_id = task_id
        self.reason = reason


class TaskCancelledError(AiogroupqError):
    """The task whose result was awaited was cancelled."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} was cancelled")
        self.task_id = task_id


class TaskExpiredError(AiogroupqError):
    """The task whose result was awaited expired before it started."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} expired before it started")
        self.task_id = task_id


class NoResultError(AiogroupqError):
    """The task succeeded but its type stores no result."""

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"task {task_id!r} succeeded but stored no result: give its handler "
            "aiogroupq.Handler(..., store_result=True) on the consumer"
        )
        self.task_id = task_id


class QueueFullError(AiogroupqError):
    """Redis is over ``maxmemory`` and refused to take new work; nothing was
    written. Tasks already queued keep draining, so retrying later works."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"Redis refused new tasks: it is out of memory ({detail}); nothing "
            "was written. Retry later, or raise maxmemory"
        )


class GroupFullError(QueueFullError):
    """Enqueueing would take a group over its ``max_size``; nothing was written.

    :ivar group: the full group
    :ivar size: its live tasks (queued, delayed or running) before this call
    :ivar cap: its ``max_size``
    """

    def __init__(self, group: str, size: int, cap: int) -> None:
        AiogroupqError.__init__(
            self,
            f"group {group!r} holds {size} live tasks and its max_size is {cap}; "
            "nothing was written. Retry when it has drained, or raise its cap "
            "with set_group()",
        )
        self.group = group
        self.size = size
        self.cap = cap


class CorruptQueueError(AiogroupqError):
    """A key of the queue holds something no aiogroupq script wrote (a wrong
    type, a value that is not a number); the script refused before writing.

    :ivar key: the damaged key
    """

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(
            f"key {key!r} of the queue is damaged ({detail}); nothing was "
            "written. Run 'aiogroupq check --repair' on the queue"
        )
        self.key = key


class RedisUnavailableError(AiogroupqError, ConnectionError):
    """Redis could not be reached, or did not answer, within the budget (see
    "Errors" in docs/failures.md).

    :ivar detail: where and why, without credentials: ``127.0.0.1:6379:
        connection refused; gave up after 5.0 s of retries`` when the re-sends
        ran out of time, ``127.0.0.1:6379: no reply within 5.0 s`` for a
        server that accepts connections and never answers
    """

    def __init__(self, detail: str) -> None:
        super().__init__(f"Redis is unreachable or not answering ({detail})")
        self.detail = detail


class OutcomeUnknownError(RedisUnavailableError):
    """An enqueue was sent to Redis and no reply came within the budget (the
    reply was lost, or the server was still running the script, or frozen):
    its tasks may have been written or not. Each call's tasks are written
    atomically, all or none (per partition, in a partitioned queue). A
    :class:`RedisUnavailableError` that is not this one means that nothing
    was written.

    Enqueueing the same tasks again would give them new ids, and so could
    write them twice: first ask :meth:`~aiogroupq.Producer.status_many` for
    ``task_ids`` once Redis answers (``None``: not written), or give the
    tasks a ``dedup_key``, which makes a second enqueue return the first ids.

    :ivar task_ids: the ids the tasks were sent with, in the call's order
    :ivar detail: where and why, as for :class:`RedisUnavailableError`
    """

    def __init__(self, task_ids: list[str], detail: str) -> None:
        shown = ", ".join(task_ids[:5]) + (" ..." if len(task_ids) > 5 else "")
        # Its own message, not RedisUnavailableError's ("unreachable").
        AiogroupqError.__init__(
            self,
            f"outcome unknown: {len(task_ids)} tasks ({shown}) may have "
            f"reached Redis and no reply came ({detail}); they were either "
            "all written or none: check Producer.status_many(error.task_ids) "
            "before enqueueing them again",
        )
        self.detail = detail
        self.task_ids = task_ids


class NotReplicatedError(AiogroupqError):
    """With ``durability="replicated"``: the tasks were written on the
    primary, but fewer replicas than asked acknowledged them in time. They
    are enqueued as long as that primary does not fail; if it fails before
    its replica receives them, they may be lost (replication is
    asynchronous). Enqueueing them again is safe: check their
    :meth:`~aiogroupq.Producer.status` or re-send the same tasks, which
    deduplicate only with a ``dedup_key``.

    :ivar task_ids: the ids of the tasks concerned, in the call's order
    :ivar acknowledged: how many replicas acknowledged (the fewest over the
        partitions written)
    :ivar required: how many were asked for
    """

    def __init__(self, task_ids: list[str], acknowledged: int, required: int) -> None:
        shown = ", ".join(task_ids[:5]) + (" ..." if len(task_ids) > 5 else "")
        super().__init__(
            f"{len(task_ids)} tasks ({shown}) were written on the primary but "
            f"acknowledged by {acknowledged} replicas, not {required}: a failover "
            "now could lose them"
        )
        self.task_ids = task_ids
        self.acknowledged = acknowledged
        self.required = required


class Retry(Exception):  # a control-flow signal, like anyio's WouldBlock
    """Raised by a handler to ask for another attempt after *delay* seconds.

    The attempt counts towards ``max_attempts``. For a grouped task the group
    stays held until the retry runs, so no later task of the group overtakes it.

    :param delay: seconds (or a :class:`~datetime.timedelta`) before the next
        attempt, at most 365 days; ``None`` uses the
        consumer's backoff policy
    :raises ValueError: for a negative, infinite or longer delay (raised in
        the handler, it fails the attempt like any other error)
    """

    def __init__(self, delay: float | timedelta | None = None) -> None:
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        # A grouped task holds its group until its retry runs: an endless
        # delay would hold it for good (and inf cannot become server ms).
        if delay is not None and not (math.isfinite(delay) and 0 <= delay <= MAX_DELAY):
            raise ValueError(
                f"Retry delay must be from 0 to {MAX_DELAY:.0f} seconds (365 days), "
                f"got {delay!r}"
            )
        super().__init__(delay)
        self.delay: float | None = delay


class BatchFailed(Exception):  # a control-flow signal, like Retry
    """Raised by a batch handler (``Handler(batch_size=N)``) to report how far
    its batch got: the first *done* tasks succeeded, the next one failed with
    *error* (retried with its backoff as usual, or dead-lettered on its last
    attempt or for a ``no_retry`` type), and the tasks after it go back to the
    front of their group's line, their attempt not counted.

    :param done: how many tasks of the batch, from its start, succeeded;
        ``done`` equal to the batch's size, or beyond it, means they all did
        (*error* is then ignored)
    :param error: what the task after them failed with (a :class:`Retry`
        asks for its retry, with its delay)
    :raises ValueError: for a *done* that is not an int >= 0
    :raises TypeError: for an *error* that is not an exception (either,
        raised in the handler, fails the whole batch)
    """

    def __init__(self, done: int, error: BaseException) -> None:
        if isinstance(done, bool) or not isinstance(done, int) or done < 0:
            raise ValueError(f"BatchFailed done must be an int >= 0, got {done!r}")
        if not isinstance(error, Exception):
            raise TypeError(f"BatchFailed error must be an exception, got {error!r}")
        super().__init__(done, error)
        self.done: int = done
        self.error: Exception = error

    def __str__(self) -> str:
        return f"batch failed after {self.done} tasks: {self.error!r}"


class InvalidResultError(AiogroupqError, ValueError):
    """The awaited task succeeded, but its stored result does not decode into
    the ``result_type`` asked for (or its bytes are not valid MessagePack).

    :ivar task_id: the task
    :ivar reason: what the decoder said
    """

    def __init__(self, task_id: str, result_type: object, reason: str) -> None:
        shown = getattr(result_type, "__name__", None) or repr(result_type)
        super().__init__(
            f"the result of task {task_id!r} does not decode into {shown}: {reason}"
        )
        self.task_id = task_id
        self.reason = reason


class CorruptTaskError(CorruptQueueError):
    """A task's stored fields are not something aiogroupq writes (for example
    an unknown state): the task hash was changed by something else.

    :ivar task_id: the task
    :ivar detail: what was found
    """

    def __init__(self, task_id: str, detail: str) -> None:
        AiogroupqError.__init__(
            self,
            f"task {task_id!r} has corrupt stored data: {detail}; run "
            "'aiogroupq check --repair' on the queue",
        )
        self.key = task_id
        self.task_id = task_id
        self.detail = detail


class MissingExtraError(AiogroupqError, ImportError):
    """An optional module of aiogroupq needs a package that is not installed.

    :ivar module: the module that was imported (``"aiogroupq.prometheus"``)
    :ivar extra: the extra that installs what it needs
    :ivar package: the missing distribution
    """

    def __init__(self, module: str, extra: str, package: str) -> None:
        super().__init__(
            f"{module} needs {package!r}, which is not installed: "
            f"pip install 'aiogroupq[{extra}]'"
        )
        self.module = module
        self.extra = extra
        self.package = package
