"""The producing side: enqueue tasks and read their state."""

from __future__ import annotations

__all__ = ("Producer",)

import time
from collections.abc import AsyncGenerator, Iterable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, Final, Self

import anyio
import msgspec
from redis.asyncio import Redis

from . import _scripts, _validate
from ._codec import encode_payload, pack, payload_decoder, unpack
from ._connection import (
    RedisLike,
    check_server,
    open_client,
    socket_timeout,
    unavailable_as_error,
)
from ._keys import QueueKeys
from .errors import (
    ConfigurationError,
    InvalidGroupError,
    NoResultError,
    PayloadTooLargeError,
    TaskCancelledError,
    TaskFailedError,
    TaskNotFoundError,
    UnencodablePayloadError,
    UnknownTaskTypeError,
)
from .task import DeadLetter, Envelope, Task, TaskState, new_task_id

#: default ``max_payload_bytes``: 512 KiB of encoded MessagePack
DEFAULT_MAX_PAYLOAD_BYTES: Final = 512 * 1024
#: default ``max_attempts`` of a task
DEFAULT_MAX_ATTEMPTS: Final = 3
#: default deduplication window in seconds (SQS FIFO's)
DEFAULT_DEDUP_WINDOW: Final = 300.0
#: default retention of succeeded and cancelled tasks' states, in seconds
DEFAULT_RETENTION: Final = 3600.0


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
    :param retention: seconds a task cancelled through this producer stays
        readable (at least 60)
    :param allow_eviction: accept a server whose ``maxmemory-policy`` may
        evict keys (and so lose tasks); by default entering refuses it
    :raises ConfigurationError: if an argument is unusable

    Entering checks the server: its version and its eviction policy
    (:class:`~aiogroupq.ConfigurationError`), the credentials
    (:class:`~aiogroupq.AuthenticationError`) and that it answers
    (:class:`~aiogroupq.RedisUnavailableError`). With a client made from a
    URL, each Redis round trip of a call, re-sends included, gets 5 seconds
    before the call raises :class:`~aiogroupq.RedisUnavailableError`; a
    borrowed client keeps its own timeouts and retry policy.
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
        retention: float | timedelta = DEFAULT_RETENTION,
        allow_eviction: bool = False,
    ) -> None:
        self._keys = QueueKeys(queue)
        _validate.setting_int("max_payload_bytes", max_payload_bytes)
        _validate.setting_int("default_max_attempts", default_max_attempts)
        window = _validate.setting_seconds("dedup_window", dedup_window, minimum=0.001)
        if not isinstance(redis, str | Redis):
            raise ConfigurationError(
                f"expected a redis:// URL or a redis.asyncio.Redis client, got {redis!r}"
            )
        self._redis = redis
        self._max_payload_bytes = max_payload_bytes
        self._task_types = None if task_types is None else frozenset(task_types)
        self._default_max_attempts = default_max_attempts
        self._dedup_window_ms = _validate.to_ms(window)
        self._retention_ms = _validate.to_ms(
            _validate.setting_seconds("retention", retention)
        )
        if not isinstance(allow_eviction, bool):
            raise ConfigurationError(
                f"allow_eviction must be True or False, got {allow_eviction!r}"
            )
        self._allow_eviction = allow_eviction
        self._client: Redis | None = None

    @property
    def queue(self) -> str:
        """The queue this producer enqueues to."""
        return self._keys.queue

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncGenerator[Self]:
        async with open_client(self._redis, retry=True) as client:
            await check_server(client, eviction=not self._allow_eviction)
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

    @unavailable_as_error
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
        run_at: datetime | None = None,
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
        :param run_at: an aware datetime before which the task may not start
            (instead of *delay*); compared with the Redis server's clock
        :return: the task id (the first task's, when deduplicated)
        :raises InvalidTaskError: (or a subclass) for a bad argument; nothing
            is written to Redis
        :raises QueueFullError: if Redis is out of memory; nothing is written
        :raises RedisUnavailableError: if Redis stayed unreachable through
            about 5 seconds of retries (a re-sent enqueue never duplicates a
            task: ids are made here)
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
                run_at=run_at,
            )
        )
        ids = await _scripts.enqueue(
            self._open_client(),
            self._keys,
            (new,),
            dedup_window_ms=self._dedup_window_ms,
        )
        return ids[0]

    @unavailable_as_error
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
            run_at_ms=_validate.run_at(task.run_at, delay),
        )

    @unavailable_as_error
    async def status(self, task_id: str) -> TaskState | None:
        """The task's state, or ``None`` for an unknown (or expired) id.

        Terminal states stay readable for the consumer's ``retention`` window
        (dead letters until purged).
        """
        state = await _scripts.task_state(
            self._open_client(), self._keys, _validate.task_id(task_id)
        )
        return None if state is None else TaskState(state)

    @unavailable_as_error
    async def cancel(self, task_id: str) -> bool:
        """Cancel a task wherever it waits (ready, behind its group, delayed).

        A running task cannot be stopped from here: its consumer is asked to
        cancel the handler, which happens at its next heartbeat
        (``lease_ttl / 3``), and the task then ends ``cancelled``.

        :return: True if the task is now cancelled or will be, False if it had
            already finished
        :raises TaskNotFoundError: for an unknown (or expired) id
        """
        code = await _scripts.cancel(
            self._open_client(),
            self._keys,
            _validate.task_id(task_id),
            retention_ms=self._retention_ms,
        )
        if code == _scripts.NOT_FOUND:
            raise TaskNotFoundError(task_id)
        return code != _scripts.FINISHED

    @unavailable_as_error
    async def result(
        self,
        task_id: str,
        *,
        timeout: float | timedelta | None = None,
        result_type: Any = Any,
    ) -> Any:
        """Wait for a task to end and return its handler's return value.

        Only task types whose handler is registered with
        ``aiogroupq.Handler(..., store_result=True)`` store results. Waiting
        blocks on a per-task list that the task's end feeds; it does not poll.

        :param timeout: seconds to wait (None: forever)
        :param result_type: decode the result into this type (default builtins)
        :raises TimeoutError: if the task has not ended within *timeout*
        :raises TaskNotFoundError: for an unknown (or expired) id
        :raises TaskFailedError: if the task was dead-lettered
        :raises TaskCancelledError: if it was cancelled
        :raises NoResultError: if it succeeded but stored no result
        """
        limit = _validate.seconds("timeout", timeout, allow_zero=True)
        client = self._open_client()
        block_cap = 1.0
        if (socket_limit := socket_timeout(client)) is not None:
            block_cap = max(0.05, min(1.0, socket_limit / 2))
        state, result, reason = await _scripts.wait_done(
            client,
            self._keys,
            _validate.task_id(task_id),
            timeout=float("inf") if limit is None else limit,
            block_cap=block_cap,
        )
        if state is None:
            raise TaskNotFoundError(task_id)
        if state == TaskState.SUCCEEDED:
            if result is None:
                raise NoResultError(task_id)
            return payload_decoder(result_type).decode(result)
        if state == TaskState.DEAD:
            raise TaskFailedError(task_id, reason)
        if state == TaskState.CANCELLED:
            raise TaskCancelledError(task_id)
        raise TimeoutError(f"task {task_id!r} is still {state} after {limit}s")

    @unavailable_as_error
    async def requeue_dead(self, *task_ids: str) -> int:
        """Run dead-lettered tasks again, each at the front of its group with a
        fresh set of attempts (a group halted by it resumes with it).

        :return: how many of *task_ids* were dead and were requeued
        """
        ids = [_validate.task_id(t) for t in task_ids]
        return await _scripts.dead_action(
            self._open_client(), self._keys, "requeue", ids
        )

    @unavailable_as_error
    async def purge_dead(self, *task_ids: str, all: bool = False) -> int:
        """Delete the given dead letters, or every one with ``all=True``.

        With no ids and no ``all=True`` nothing is deleted: an id list that
        happens to be empty must not wipe the queue's dead letters.
        A group halted by a purged task passes on to its next task.

        :param all: delete every dead letter of the queue (no ids then)
        :return: how many dead letters were deleted
        :raises ConfigurationError: for task ids together with ``all=True``
        """
        if not isinstance(all, bool):
            raise ConfigurationError(f"all must be True or False, got {all!r}")
        if task_ids and all:
            raise ConfigurationError(
                f"purge_dead got {len(task_ids)} task ids and all=True: pass "
                "either the ids to delete or all=True, not both"
            )
        client = self._open_client()
        if not all:
            ids = [_validate.task_id(t) for t in task_ids]
            return await _scripts.dead_action(client, self._keys, "purge", ids)
        total = 0
        while batch := await _scripts.dead_ids(client, self._keys, 500):
            total += await _scripts.dead_action(client, self._keys, "purge", batch)
        return total

    @unavailable_as_error
    async def release_group(self, group: str) -> bool:
        """Let a group halted by a dead-lettered task (``on_dead="halt"``)
        continue with its next task; the dead task stays dead.

        :return: False if the group was not halted
        """
        checked = _validate.group(group)
        if checked is None:
            raise InvalidGroupError(group, "is None; name the halted group")
        done = await _scripts.dead_action(
            self._open_client(), self._keys, "release", [checked]
        )
        return done == 1

    @unavailable_as_error
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
