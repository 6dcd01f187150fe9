"""Exceptions raised by aiogroupq.

The hierarchy::

    AiogroupqError
    ├── ConfigurationError          a Producer/Consumer argument or client is unusable
    │   ├── AuthenticationError     Redis refused the user name or password
    │   └── PermissionDeniedError   the Redis user may not run a command or touch a key
    ├── ConsumerRunningError        a Consumer was entered while already running
    ├── InvalidTaskError            a task is refused before anything is written
    │   ├── InvalidGroupError       empty, too long or not a string
    │   ├── PayloadTooLargeError    encoded payload over the producer's limit
    │   ├── UnencodablePayloadError MessagePack cannot encode the payload
    │   └── UnknownTaskTypeError    not among the producer's declared task types
    ├── TaskNotFoundError           no task with that id (or it expired)
    ├── TaskFailedError             the awaited task was dead-lettered
    ├── TaskCancelledError          the awaited task was cancelled
    ├── NoResultError               the awaited task's type stores no result
    ├── QueueFullError              Redis is out of memory and refused new work
    └── RedisUnavailableError       Redis could not be reached within the budget

:class:`Retry` is not an error: a handler raises it to ask for another attempt.
"""

from __future__ import annotations

__all__ = (
    "AiogroupqError",
    "AuthenticationError",
    "ConfigurationError",
    "ConsumerRunningError",
    "InvalidGroupError",
    "InvalidTaskError",
    "NoResultError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QueueFullError",
    "RedisUnavailableError",
    "Retry",
    "TaskCancelledError",
    "TaskFailedError",
    "TaskNotFoundError",
    "UnencodablePayloadError",
    "UnknownTaskTypeError",
)

from datetime import timedelta


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
    (an ACL ``NOPERM`` reply); see "Running with least privilege" in
    docs/guarantees.md for the rule a queue's user needs."""

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


class RedisUnavailableError(AiogroupqError, ConnectionError):
    """Redis could not be reached, or did not answer, within the budget (see
    "Errors" in docs/usage.md)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"Redis is unreachable or not answering ({detail})")
        self.detail = detail


class Retry(Exception):  # a control-flow signal, like anyio's WouldBlock
    """Raised by a handler to ask for another attempt after *delay* seconds.

    The attempt counts towards ``max_attempts``. For a grouped task the group
    stays held until the retry runs, so no later task of the group overtakes it.

    :param delay: seconds (or a :class:`~datetime.timedelta`) before the next
        attempt; ``None`` uses the consumer's backoff policy
    """

    def __init__(self, delay: float | timedelta | None = None) -> None:
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if delay is not None and not delay >= 0:
            raise ValueError(f"Retry delay must be >= 0 seconds, got {delay!r}")
        super().__init__(delay)
        self.delay: float | None = delay
