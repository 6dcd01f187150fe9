"""The producing side: enqueue tasks and read their state."""

from __future__ import annotations

__all__ = ("DeadLetter", "Producer")

import time
from collections.abc import AsyncGenerator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Self

import anyio
import msgspec
from redis.asyncio import Redis

from . import _scripts, _validate
from ._codec import encode_payload, pack, unpack
from ._connection import RedisLike, open_client
from ._keys import QueueKeys
from .errors import (
    ConfigurationError,
    PayloadTooLargeError,
    UnencodablePayloadError,
    UnknownTaskTypeError,
)
from .task import Envelope, Task, TaskState, new_task_id

#: default ``max_payload_bytes``: 512 KiB of encoded MessagePack
DEFAULT_MAX_PAYLOAD_BYTES: Final = 512 * 1024
#: default ``max_attempts`` of a task
DEFAULT_MAX_ATTEMPTS: Final = 3
#: default deduplication window in seconds (SQS FIFO's)
DEFAULT_DEDUP_WINDOW: Final = 300.0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead-lettered task, as :meth:`Producer.dead_letters` returns it.

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


class Producer(anyio.AsyncContextManagerMixin):
    """Enqueues tasks to one queue; use it as ``async with Producer(...) as p``.

    :param redis: a ``redis://`` URL, or a ``redis.asyncio.Redis`` client to
        borrow (for example a web app's pool; it is never closed by us and must
        have ``decode_responses=False``)
    :param queue: the queue name: 1-128 characters of ``A-Z a-z 0-9 _ . : -``
    :param max_payload_bytes: refuse payloads larger than this once encoded
    :param task_types: if given, refuse task types not in it
        (:class:`~aiogroupq.UnknownTaskTypeError`) before any I/O
    :param default_max_attempts: ``max_attempts`` of tasks that do not set it
    :param dedup_window: seconds during which a ``dedup_key`` is remembered
    :raises ConfigurationError: if an argument is unusable
    """

    def __init__(
        self,
        redis: RedisLike,
        *,
        queue: str,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        task_types: Iterable[str] | None = None,
        default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        dedup_window: float | timedelta = DEFAULT_DEDUP_WINDOW,
    ) -> None:
        self._keys = QueueKeys(queue)
        if (
            isinstance(max_payload_bytes, bool)
            or not isinstance(max_payload_bytes, int)
            or max_payload_bytes < 1
        ):
            raise ConfigurationError(
                f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}"
            )
        if (
            isinstance(default_max_attempts, bool)
            or not isinstance(default_max_attempts, int)
            or default_max_attempts < 1
        ):
            raise ConfigurationError(
                f"default_max_attempts must be an int >= 1, got {default_max_attempts!r}"
            )
        window = (
            dedup_window.total_seconds()
            if isinstance(dedup_window, timedelta)
            else dedup_window
        )
        if (
            isinstance(window, bool)
            or not isinstance(window, int | float)
            or not (0 < window < 10**9)
        ):
            raise ConfigurationError(
                f"dedup_window must be a positive number of seconds, got {dedup_window!r}"
            )
        if not isinstance(redis, str | Redis):
            raise ConfigurationError(
                f"expected a redis:// URL or a redis.asyncio.Redis client, got {redis!r}"
            )
        self._redis = redis
        self._max_payload_bytes = max_payload_bytes
        self._task_types = None if task_types is None else frozenset(task_types)
        self._default_max_attempts = default_max_attempts
        self._dedup_window_ms = _validate.to_ms(float(window))
        self._client: Redis | None = None

    @property
    def queue(self) -> str:
        """The queue this producer enqueues to."""
        return self._keys.queue

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncGenerator[Self]:
        async with open_client(self._redis, retry=True) as client:
            self._client = client
            try:
                yield self
            finally:
                self._client = None

    def _open_client(self) -> Redis:
        if self._client is None:
            raise RuntimeError(
                "this Producer is not open: use it inside 'async with Producer(...)'"
            )
        return self._client

    async def enqueue(
        self,
        task_type: str,
        payload: Any = None,
        *,
        group: str | None = None,
        delay: float | timedelta | None = None,
        dedup_key: str | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
    ) -> str:
        """Enqueue one task and return its id.

        :param task_type: the handler's name on the consumer side
        :param payload: any MessagePack-encodable value: builtins, msgspec
            Structs, dataclasses, TypedDicts, datetimes, …
        :param group: tasks of one group run one at a time, in enqueue order;
            ``None`` runs the task in parallel with everything else
        :param delay: seconds (or a timedelta) before the task may start,
            measured on the Redis server's clock
        :param dedup_key: within the producer's ``dedup_window`` a second
            enqueue with the same key enqueues nothing and returns the first id
        :param max_attempts: runs before the task is dead-lettered
        :param timeout: seconds one attempt may run before it is cancelled and
            counted as failed
        :return: the task id (the first task's, when deduplicated)
        :raises InvalidTaskError: (or a subclass) for a bad argument; nothing
            is written to Redis
        """
        new = self._prepare(
            Task(
                task_type,
                payload,
                group=group,
                delay=delay,
                dedup_key=dedup_key,
                max_attempts=max_attempts,
                timeout=timeout,
            )
        )
        ids = await _scripts.enqueue(
            self._open_client(),
            self._keys,
            (new,),
            dedup_window_ms=self._dedup_window_ms,
        )
        return ids[0]

    async def enqueue_many(self, tasks: Iterable[Task]) -> list[str]:
        """Enqueue many tasks atomically, in one round trip; return their ids.

        Tasks of one group keep the order they have in *tasks*. Every task is
        checked before anything is sent: one bad task refuses the whole batch.

        :raises InvalidTaskError: (or a subclass) for the first bad task;
            nothing is written to Redis
        """
        client = self._open_client()
        prepared = []
        for task in tasks:
            if not isinstance(task, Task):
                raise TypeError(
                    f"enqueue_many takes aiogroupq.Task items, got {task!r}"
                )
            prepared.append(self._prepare(task))
        if not prepared:
            return []
        return await _scripts.enqueue(
            client, self._keys, prepared, dedup_window_ms=self._dedup_window_ms
        )

    def _prepare(self, task: Task) -> _scripts.NewTask:
        task_type = _validate.name("task_type", task.task_type)
        if self._task_types is not None and task_type not in self._task_types:
            raise UnknownTaskTypeError(task_type, self._task_types)
        group = _validate.group(task.group)
        delay = _validate.seconds("delay", task.delay, allow_zero=True)
        timeout = _validate.seconds("timeout", task.timeout, allow_zero=False)
        attempts = _validate.max_attempts(task.max_attempts) or (
            self._default_max_attempts
        )
        dedup_key = (
            None
            if task.dedup_key is None
            else _validate.name("dedup_key", task.dedup_key)
        )
        try:
            payload = encode_payload(task.payload)
        except (TypeError, msgspec.EncodeError, OverflowError) as exc:
            raise UnencodablePayloadError(task.payload, str(exc)) from exc
        if len(payload) > self._max_payload_bytes:
            raise PayloadTooLargeError(len(payload), self._max_payload_bytes)
        task_id = new_task_id()
        envelope = Envelope(
            id=task_id,
            type=task_type,
            payload=payload,
            group=group,
            max_attempts=attempts,
            timeout_ms=None if timeout is None else _validate.to_ms(timeout),
            enqueued_ms=time.time_ns() // 1_000_000,
        )
        return _scripts.NewTask(
            id=task_id,
            group=group,
            envelope=pack(envelope),
            delay_ms=0 if delay is None else _validate.to_ms(delay),
            max_attempts=attempts,
            dedup_key=dedup_key,
        )

    async def status(self, task_id: str) -> TaskState | None:
        """The task's state, or ``None`` for an unknown (or expired) id.

        Terminal states stay readable for the consumer's ``retention`` window
        (dead letters until purged).
        """
        if not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str, got {type(task_id).__name__}")
        state = await _scripts.task_state(self._open_client(), self._keys, task_id)
        return None if state is None else TaskState(state)

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        """The oldest *limit* dead-lettered tasks of the queue, oldest first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        rows = await _scripts.dead_rows(self._open_client(), self._keys, limit)
        return [_dead_letter(row) for row in rows]


def _dead_letter(row: _scripts.DeadRow) -> DeadLetter:
    envelope: Envelope | None = None
    payload: Any = None
    try:
        envelope = unpack(row.envelope)
        payload = msgspec.msgpack.decode(envelope.payload)
    except msgspec.DecodeError:
        pass  # a corrupt envelope is itself a reason to have been dead-lettered
    return DeadLetter(
        id=row.id,
        type=envelope.type if envelope else "?",
        group=envelope.group if envelope else None,
        payload=payload,
        reason=row.reason,
        traceback=row.traceback,
        attempts=row.attempts,
        dead_at=row.dead_at_ms / 1000,
    )
