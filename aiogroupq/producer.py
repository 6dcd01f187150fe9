"""The producing side: enqueue tasks and read their state."""

from __future__ import annotations

__all__ = ("Producer",)

import dataclasses
import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, Literal, Self, TypeVar, overload

import anyio
import msgspec

from ._inspect.aggregate import statuses
from ._inspect.reads import id_list
from ._limits import (
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_RETENTION,
    MAX_BATCH,
)
from ._store import routing as _routing, scripts as _scripts, validate as _validate
from ._store.coalesce import Coalescer, Refusal, SendElsewhere, Sender
from ._store.codec import EncodeFailure, decode_result, encode_payload, identity, pack
from ._store.connection import (
    RedisLike,
    open_client,
    sees_every_try,
    socket_timeout,
)
from ._store.failures import outcome_of, unavailable_as_error
from ._store.handle import QueueHandle
from ._store.held import HeldConnection
from ._store.partition import in_partition
from ._store.queries import task_state
from ._store.replies import (
    CancelCode,
    GroupFullRefusal,
    NotReplicatedRefusal,
    StaleLayoutRefusal,
    public_error,
)
from ._store.server_checks import check_replicas, check_server
from ._telemetry.events import EventKind, Observer, Observers, check_observers
from .errors import (
    AiogroupqError,
    BatchTooLargeError,
    ConfigurationError,
    CorruptTaskError,
    InvalidTaskError,
    NoResultError,
    PayloadTooLargeError,
    TaskCancelledError,
    TaskExpiredError,
    TaskFailedError,
    TaskNotFoundError,
    UnencodablePayloadError,
    UnknownTaskTypeError,
)
from .task import Envelope, Task, TaskState, new_task_id

T = TypeVar("T")


class Producer(QueueHandle, anyio.AsyncContextManagerMixin):
    """Enqueues tasks to one queue and reads their state and results; use it
    as ``async with Producer(...) as p``. Dead letters, settings and the
    views of the queue are :class:`~aiogroupq.Admin`'s.

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
    :param observers: instances of :class:`~aiogroupq.Observer` that see
        each enqueue (metrics) and may attach headers to its tasks (a trace
        context)
    :param partitions: how many partitions the queue has (docs/scaling.md):
        ``None`` uses what the queue stores (1 if nothing); a number creates
        the layout on a queue that holds no task, and must match the stored
        one otherwise (:class:`~aiogroupq.ConfigurationError` on entering)
    :param durability: ``"primary"`` (the default): an enqueue returns once
        the primary wrote it; ``"replicated"``: once a replica acknowledged
        it too (``WAIT``), else :class:`~aiogroupq.NotReplicatedError`, so
        that a failover cannot lose it (docs/guarantees.md)
    :param max_batch_bytes: refuse an ``enqueue_many`` of more than one task
        whose encoded tasks add up to more than this
        (:class:`~aiogroupq.BatchTooLargeError`; 8 MiB by default), so that
        its atomic script does not hold Redis long
    :param dedup_scope: where a task's ``dedup_key`` holds when the task
        does not say: ``"group"`` (the default): among the tasks of its
        group (a task without a group: queue-wide); ``"queue"``: across the
        whole queue, whatever the group (what every key did before this
        option existed)
    :raises ConfigurationError: if an argument is unusable

    Entering checks the server: its version and its eviction policy
    (:class:`~aiogroupq.ConfigurationError`), the credentials
    (:class:`~aiogroupq.AuthenticationError`) and that it answers
    (:class:`~aiogroupq.RedisUnavailableError`). With a client made from a
    URL, each Redis round trip of a call, re-sends included, gets 5 seconds
    before the call raises :class:`~aiogroupq.RedisUnavailableError`; a
    borrowed client keeps its own timeouts and retry policy. An enqueue
    whose request may have reached Redis without a reply coming back raises
    its subclass :class:`~aiogroupq.OutcomeUnknownError` instead: its tasks
    may have been written.
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
        observers: Sequence[Observer] = (),
        partitions: int | None = None,
        durability: Literal["primary", "replicated"] = "primary",
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        dedup_scope: Literal["group", "queue"] = "group",
    ) -> None:
        super().__init__(redis, queue, partitions)
        self._replication = _validate.durability(durability)
        self._observers = Observers(queue, check_observers(observers))
        _validate.setting_int("max_payload_bytes", max_payload_bytes)
        _validate.setting_int("default_max_attempts", default_max_attempts)
        _validate.setting_int("max_batch_bytes", max_batch_bytes)
        self._max_batch_bytes = max_batch_bytes
        self._dedup_scope = _validate.setting_dedup_scope(dedup_scope)
        window = _validate.setting_seconds("dedup_window", dedup_window, minimum=0.001)
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
        #: the send lane's own connection (None: the client's pool is used)
        self._held: HeldConnection | None = None
        self._lane = Coalescer(
            self._send_now,
            self._refused,
            max_tasks=MAX_BATCH,
            max_bytes=max_batch_bytes,
            direct=self._direct,
        )

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncGenerator[Self]:
        async with open_client(self._redis, retry=True) as client:
            await check_server(client, eviction=not self._allow_eviction)
            await self._open_layout(client)
            if self._replication is not None:
                await check_replicas(client)
            self._client = client
            self._held = HeldConnection.of(client)
            try:
                yield self
            finally:
                try:
                    await self._lane.aclose()
                finally:
                    self._client = None
                    if self._held is not None:
                        await self._held.aclose()
                        self._held = None

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
        priority: int | None = None,
        expires: float | timedelta | datetime | None = None,
        unique: bool = False,
        dedup_scope: Literal["group", "queue"] | None = None,
    ) -> str:
        """Enqueue one task and return its id.

        :param task_type: the handler's name on the consumer side
        :param payload: any MessagePack-encodable value: builtins, msgspec
            Structs, dataclasses, TypedDicts, datetimes, …
        :param group: tasks of one group run one at a time, in enqueue order;
            ``None`` runs the task in parallel with everything else
        :param delay: seconds (or a timedelta) before the task may start,
            measured on the Redis server's clock; at most 365 days
        :param dedup_key: within the producer's ``dedup_window`` a second
            enqueue with the same key (in the same group, see *dedup_scope*)
            enqueues nothing and returns the first id
        :param max_attempts: runs before the task is dead-lettered
        :param timeout: seconds one attempt may run before it is cancelled and
            counted as failed
        :param run_at: an aware datetime before which the task may not start
            (instead of *delay*); compared with the Redis server's clock; at
            most 365 days ahead
        :param priority: 0 to 9; a runnable task of higher priority starts
            before lower ones (``None``: the group's default priority, else 0).
            Within a group, tasks still start in enqueue order
        :param expires: seconds (or a timedelta, or an aware datetime) within
            which the task must start; if it has not by then, it ends
            :attr:`TaskState.EXPIRED` without running and its group moves on
        :param unique: with *dedup_key*: the key blocks duplicates for as long
            as this task has not ended, instead of for the dedup window
        :param dedup_scope: where *dedup_key* holds: ``"group"``, among the
            tasks of *group* (without a group: queue-wide); ``"queue"``,
            across the queue; ``None``: the producer's ``dedup_scope``
        :return: the task id (the first task's, when deduplicated)
        :raises InvalidTaskError: (or a subclass) for a bad argument; nothing
            is written to Redis
        :raises QueueFullError: if Redis is out of memory; nothing is written
        :raises GroupFullError: if the group is at its ``max_size``; nothing
            is written
        :raises OutcomeUnknownError: if the enqueue may have reached Redis
            and no reply came within the budget: the task may have been
            written (``task_ids`` holds its id)
        :raises RedisUnavailableError: if Redis stayed unreachable through
            about 5 seconds of retries; nothing is written (a re-sent enqueue
            never duplicates a task: ids are made here)
        """
        task = Task(
            task_type,
            payload,
            group=group,
            delay=delay,
            dedup_key=dedup_key,
            max_attempts=max_attempts,
            timeout=timeout,
            run_at=run_at,
            priority=priority,
            expires=expires,
            unique=unique,
            dedup_scope=dedup_scope,
        )
        # Before the send lane, whose futures belong to the loop that opened it.
        self._open_client()
        ids = await self._enqueue([task], [self._prepare(task)])
        return ids[0]

    @unavailable_as_error
    async def enqueue_many(self, tasks: Iterable[Task]) -> list[str]:
        """Enqueue many tasks atomically, in one round trip; return their ids.

        Tasks of one group keep the order they have in *tasks*. Every task is
        checked before anything is sent: one bad task refuses the whole batch.
        One call takes at most 1,000 tasks and, with more than one task, at
        most ``max_batch_bytes`` of encoded tasks (8 MiB by default), so that
        the atomic script stays short. Split larger batches into several
        calls, each atomic on its own ("Limits" in docs/queueing.md shows how).

        :raises InvalidTaskError: (or a subclass) for the first bad task;
            nothing is written to Redis
        :raises BatchTooLargeError: for more than 1,000 tasks, or more bytes
            than ``max_batch_bytes``; nothing is written
        :raises GroupFullError: if a group would exceed its ``max_size``;
            nothing is written
        :raises OutcomeUnknownError: if the batch may have reached Redis and
            no reply came within the budget: all its tasks were written or
            none (in a partitioned queue: all or none of each partition's)
        """
        self._open_client()
        items = list(tasks)
        if len(items) > MAX_BATCH:
            raise BatchTooLargeError(len(items), MAX_BATCH)
        prepared = []
        for task in items:
            if not isinstance(task, Task):
                raise TypeError(
                    f"enqueue_many takes aiogroupq.Task items, got {task!r}"
                )
            prepared.append(self._prepare(task))
        if not prepared:
            return []
        if len(prepared) > 1:
            # What the script call carries, envelopes first: its cost.
            size = sum(len(new.envelope) + len(new.identity) for _, new in prepared)
            if size > self._max_batch_bytes:
                raise BatchTooLargeError(size, self._max_batch_bytes, unit="bytes")
        return await self._enqueue(items, prepared)

    async def _enqueue(
        self, tasks: list[Task], prepared: list[tuple[Envelope, _scripts.NewTask]]
    ) -> list[str]:
        if self._observers:
            return await self._enqueue_observed(tasks, prepared)
        return await self._send([new for _, new in prepared])

    async def _enqueue_observed(
        self, tasks: list[Task], prepared: list[tuple[Envelope, _scripts.NewTask]]
    ) -> list[str]:
        with self._observers.enqueue(tasks) as headers:
            news = [new for _, new in prepared]
            if headers is not None:
                news = [
                    dataclasses.replace(
                        new,
                        envelope=pack(
                            msgspec.structs.replace(envelope, headers=headers)
                        ),
                    )
                    for envelope, new in prepared
                ]
            ids = await self._send(news)
            # Inside the observers' contexts: a send span learns the ids.
            for task, new, task_id in zip(tasks, news, ids, strict=True):
                if task_id == new.id:  # not deduplicated
                    self._observers.emit(
                        EventKind.ENQUEUED,
                        task_id=task_id,
                        task_type=task.task_type,
                        group=task.group,
                    )
        return ids

    async def _send(self, news: list[_scripts.NewTask]) -> list[str]:
        # Sent at once when nothing is in flight, else with the calls that
        # queue up meanwhile (_store/coalesce.py).
        return await self._lane.submit(news)

    def _direct(self) -> Sender | None:
        """The lane's sender for a lone call in its caller's task: the held
        connection, where it carries the call (see ``_store/coalesce.py``)."""
        if (
            self._held is None
            or self._parts.partitioned
            or self._replication is not None
        ):
            return None
        return self._send_held

    async def _send_held(self, news: Sequence[_scripts.NewTask]) -> list[str]:
        try:
            return await self._send_now(news, held_only=True)
        except StaleLayoutRefusal:  # nothing written: the lane sends it
            raise SendElsewhere from None

    async def _send_now(
        self, news: Sequence[_scripts.NewTask], *, held_only: bool = False
    ) -> list[str]:
        """One script call (per partition) carrying *news*; refusals are
        raised as they come, with their index into *news*. *held_only*: on
        the held connection or not at all (StaleLayoutRefusal)."""
        client = self._open_client()

        def certain() -> bool:
            # Only a plain client of ours shows every try; the parts of a
            # partitioned queue (known once the call ends: it may have just
            # read a new layout) go at once, and some may have been written.
            return sees_every_try(client) and not self._parts.partitioned

        with outcome_of([new.id for new in news], certain=certain):
            if held_only:
                assert self._held is not None
                return await _routing.send_held(
                    client,
                    self._parts,
                    news,
                    dedup_window_ms=self._dedup_window_ms,
                    held=self._held,
                )
            return await _routing.send(
                client,
                self._parts,
                news,
                dedup_window_ms=self._dedup_window_ms,
                replication=self._replication,
                held=self._held,
            )

    def _refused(
        self, refusal: Refusal, news: Sequence[_scripts.NewTask]
    ) -> AiogroupqError:
        """The public error of a refusal of *news* (its index is into them)."""
        if isinstance(refusal, NotReplicatedRefusal):
            assert self._replication is not None
            return public_error(refusal, replicas=self._replication.replicas)
        group = news[refusal.index].group or ""
        if isinstance(refusal, GroupFullRefusal):
            return public_error(refusal, group)
        return public_error(refusal, self._parts.of_group(group)[0].group(group))

    def _prepare(self, task: Task) -> tuple[Envelope, _scripts.NewTask]:
        task_type = _validate.name("task_type", task.task_type)
        if self._task_types is not None and task_type not in self._task_types:
            raise UnknownTaskTypeError(task_type, self._task_types)
        group = _validate.group(task.group)
        delay = _validate.delay(task.delay)
        timeout = _validate.seconds("timeout", task.timeout, allow_zero=False)
        attempts = _validate.max_attempts(task.max_attempts) or (
            self._default_max_attempts
        )
        dedup_key = (
            None
            if task.dedup_key is None
            else _validate.name("dedup_key", task.dedup_key)
        )
        priority = _validate.priority(task.priority)
        expires_ms, expire_at_ms = _validate.expires(task.expires)
        if not isinstance(task.unique, bool):
            raise InvalidTaskError("unique", f"expected a bool, got {task.unique!r}")
        if task.unique and dedup_key is None:
            raise InvalidTaskError("unique", "needs a dedup_key to be unique by")
        scope = _validate.dedup_scope(task.dedup_scope) or self._dedup_scope
        try:
            payload = encode_payload(task.payload)
        except EncodeFailure as exc:
            raise UnencodablePayloadError(task.payload, str(exc)) from exc
        if len(payload) > self._max_payload_bytes:
            raise PayloadTooLargeError(len(payload), self._max_payload_bytes)
        task_id = in_partition(new_task_id(), self._parts.place(group, dedup_key, None))
        envelope = Envelope(
            id=task_id,
            type=task_type,
            payload=payload,
            group=group,
            max_attempts=attempts,
            timeout_ms=None if timeout is None else _validate.to_ms(timeout),
            enqueued_ms=time.time_ns() // 1_000_000,
        )
        return envelope, _scripts.NewTask(
            id=task_id,
            group=group,
            envelope=pack(envelope),
            delay_ms=0 if delay is None else _validate.to_ms(delay),
            max_attempts=attempts,
            dedup_key=dedup_key,
            run_at_ms=_validate.run_at(task.run_at, delay),
            unique=task.unique,
            priority=priority,
            expires_ms=expires_ms,
            expire_at_ms=expire_at_ms,
            identity=identity(envelope),
            dedup_in_group=scope == "group",
        )

    @unavailable_as_error
    async def status(self, task_id: str) -> TaskState | None:
        """The task's state, or ``None`` for an unknown (or expired) id.

        Terminal states stay readable for the consumer's ``retention`` window
        (dead letters until purged).

        :raises CorruptTaskError: if the stored state is not one of
            :class:`TaskState` (the task hash was written by something else)
        """
        checked = _validate.task_id(task_id)
        state = await task_state(
            self._open_client(), self._parts.of_id(checked), checked
        )
        return None if state is None else _state(task_id, state)

    @unavailable_as_error
    async def status_many(self, task_ids: Sequence[str]) -> list[TaskState | None]:
        """The state of each task, ``None`` for an unknown (or expired) id, in
        one round trip (a pipeline of script calls of 500 ids each, so that
        none holds the server long).

        :raises CorruptTaskError: if a stored state is not one of
            :class:`TaskState`
        """
        ids = [_validate.task_id(t) for t in id_list(task_ids)]
        return await statuses(self._open_client(), self._parts, ids)

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
        checked = _validate.task_id(task_id)
        code = await _scripts.cancel(
            self._open_client(),
            self._parts.of_id(checked),
            checked,
            retention_ms=self._retention_ms,
        )
        if (error := public_error(code, task_id)) is not None:
            raise error
        return code is not CancelCode.FINISHED

    # Typed like msgspec's decode(): a class gives its instances, anything
    # else that msgspec decodes into (a union, an Annotated type) gives Any.
    @overload
    async def result(
        self, task_id: str, *, timeout: float | timedelta | None = None
    ) -> Any: ...

    @overload
    async def result(
        self,
        task_id: str,
        *,
        timeout: float | timedelta | None = None,
        result_type: type[T],
    ) -> T: ...

    @overload
    async def result(
        self,
        task_id: str,
        *,
        timeout: float | timedelta | None = None,
        result_type: Any,
    ) -> Any: ...

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
        :param result_type: decode the result into this type (default
            builtins); type checkers then see that type as the return type
        :raises TimeoutError: if the task has not ended within *timeout*
        :raises TaskNotFoundError: for an unknown (or expired) id
        :raises TaskFailedError: if the task was dead-lettered
        :raises TaskCancelledError: if it was cancelled
        :raises TaskExpiredError: if it expired before it started
        :raises NoResultError: if it succeeded but stored no result
        :raises InvalidResultError: if the stored result does not decode into
            *result_type*
        :raises CorruptTaskError: if the stored state is not one of
            :class:`TaskState`
        """
        limit = _validate.seconds("timeout", timeout, allow_zero=True)
        client = self._open_client()
        block_cap = 1.0
        if (socket_limit := socket_timeout(client)) is not None:
            block_cap = max(0.05, min(1.0, socket_limit / 2))
        checked = _validate.task_id(task_id)
        state, result, reason = await _scripts.wait_done(
            client,
            self._parts.of_id(checked),
            checked,
            timeout=float("inf") if limit is None else limit,
            block_cap=block_cap,
        )
        if state is None:
            raise TaskNotFoundError(task_id)
        if _state(task_id, state) == TaskState.SUCCEEDED:
            if result is None:
                raise NoResultError(task_id)
            return decode_result(task_id, result, result_type)
        if state == TaskState.DEAD:
            raise TaskFailedError(task_id, reason)
        if state == TaskState.CANCELLED:
            raise TaskCancelledError(task_id)
        if state == TaskState.EXPIRED:
            raise TaskExpiredError(task_id)
        raise TimeoutError(f"task {task_id!r} is still {state} after {limit}s")


def _state(task_id: str, state: str) -> TaskState:
    try:
        return TaskState(state)
    except ValueError:
        raise CorruptTaskError(task_id, f"unknown state {state!r}") from None
