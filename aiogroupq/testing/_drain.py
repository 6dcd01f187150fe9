"""An in-process consumer that runs a queue until it is idle and reports
what became of each task it touched."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

import anyio

from .._store import layout as _layout
from .._store.connection import Client, RedisLike, node_of, open_client
from .._store.partition import Partitions
from .._work.handlers import Handler, HandlerFunc, build_routes
from ..consumer import Consumer
from ..task import DeadLetter, TaskInfo, TaskState
from ._errors import DrainTimeoutError
from ._outcome import TaskOutcome
from ._wrap import wrap_handler

if TYPE_CHECKING:
    from .._store.keys import QueueKeys

_TERMINAL: Final = frozenset({TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED})


@dataclass(slots=True)
class _Seen:
    id: str
    type: str
    group: str | None
    attempts: int = 0
    result: Any = None
    error: BaseException | None = None
    notice: DeadLetter | None = None
    state: TaskState | None = None
    stored_reason: str | None = None

    def outcome(self) -> TaskOutcome:
        reason = None
        if self.state == TaskState.DEAD:
            reason = self.notice.reason if self.notice else self.stored_reason
        return TaskOutcome(
            id=self.id,
            type=self.type,
            group=self.group,
            state=self.state,
            attempts=self.attempts,
            result=self.result,
            error=self.error,
            reason=reason,
        )


@dataclass(slots=True)
class _Recorder:
    """The drain's own records: fed by the wrapped handlers and ``on_dead``."""

    seen: dict[str, _Seen] = field(default_factory=dict)
    unsettled: set[str] = field(default_factory=set)

    def _get(self, task_id: str, type_: str, group: str | None) -> _Seen:
        if (record := self.seen.get(task_id)) is None:
            record = self.seen[task_id] = _Seen(task_id, type_, group)
        self.unsettled.add(task_id)
        return record

    def started(self, info: TaskInfo) -> None:
        record = self._get(info.id, info.type, info.group)
        record.attempts = max(record.attempts, info.attempt)

    def ended(self, info: TaskInfo, result: Any, error: BaseException | None) -> None:
        record = self.seen[info.id]
        record.result, record.error = result, error

    def dead(self, letter: DeadLetter) -> None:
        record = self._get(letter.id, letter.type, letter.group)
        record.notice = letter
        record.attempts = max(record.attempts, letter.attempts)

    def settle(self, states: Mapping[str, tuple[TaskState | None, str | None]]) -> None:
        for task_id, (state, reason) in states.items():
            record = self.seen[task_id]
            record.state, record.stored_reason = state, reason
            if state is None or state in _TERMINAL:
                self.unsettled.discard(task_id)

    def outcomes(self) -> list[TaskOutcome]:
        return [record.outcome() for record in self.seen.values()]


async def drain(
    redis: RedisLike,
    *,
    queue: str,
    handlers: Mapping[str, HandlerFunc | Handler],
    timeout: float = 30.0,
    wait_delayed: bool = False,
    concurrency: int = 16,
    lease_ttl: float | timedelta = 30.0,
    retry_backoff: float | timedelta = 1.0,
    retry_backoff_max: float | timedelta = 300.0,
    grace_period: float | timedelta = 1.0,
    on_dead: Callable[[DeadLetter], Awaitable[None]] | None = None,
    poll_interval: float = 0.01,
) -> list[TaskOutcome]:
    """Consume *queue* in this process until it is idle; return what became of
    every task this drain touched, in the order it first saw them.

    Idle means: nothing ready to run, nothing running (on any consumer),
    no delayed task due, and every task this drain ran has reached a terminal
    state (a retry waiting out its backoff is still work). Delayed tasks that
    are not yet due are left alone unless *wait_delayed*. A task waiting behind
    a group halted by a dead letter (``on_dead="halt"``) will never run, so it
    does not keep the queue busy.

    :param redis: a ``redis://`` URL or a ``redis.asyncio.Redis`` to borrow
    :param queue: the queue name
    :param handlers: as for :class:`aiogroupq.Consumer`
    :param timeout: seconds until :class:`DrainTimeoutError`
    :param wait_delayed: also wait until every delayed task has run
    :param concurrency: handlers at once
    :param lease_ttl: as for :class:`aiogroupq.Consumer`
    :param retry_backoff: as for :class:`aiogroupq.Consumer` (a small value
        such as ``0.01`` makes tests of retries fast)
    :param retry_backoff_max: as for :class:`aiogroupq.Consumer`
    :param grace_period: seconds running handlers get when the drain times out
    :param on_dead: also called for each task this drain dead-letters
    :param poll_interval: seconds between two checks for idleness
    :return: one :class:`TaskOutcome` per task whose handler ran or that was
        dead-lettered here
    :raises DrainTimeoutError: if the queue is not idle after *timeout*
    :raises aiogroupq.ConfigurationError: for an unusable argument
    """
    parts = Partitions(queue)
    build_routes(handlers)  # refuse bad handlers with the consumer's own errors
    recorder = _Recorder()
    wrapped = {name: wrap_handler(h, recorder) for name, h in handlers.items()}

    async def dead(letter: DeadLetter) -> None:
        recorder.dead(letter)
        if on_dead is not None:
            await on_dead(letter)

    async with open_client(redis, retry=False) as client:
        consumer = Consumer(
            client,
            queue=queue,
            handlers=wrapped,
            concurrency=concurrency,
            lease_ttl=lease_ttl,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
            grace_period=grace_period,
            on_dead=dead,
        )
        async with consumer:
            await _until_idle(
                client, parts, recorder, timeout, wait_delayed, poll_interval
            )
        if recorder.unsettled:
            # A dead letter whose state the idle check read before its
            # on_dead ran (the consumer calls it once the outcome is
            # recorded): the consumer is closed now, every call made.
            backlog = await _backlog(client, parts, recorder.unsettled)
            recorder.settle(backlog.states)
    return recorder.outcomes()


async def _until_idle(
    client: Client,
    parts: Partitions,
    recorder: _Recorder,
    timeout: float,
    wait_delayed: bool,
    poll_interval: float,
) -> None:
    deadline = anyio.current_time() + timeout
    while True:
        await _layout.refresh(client, parts)
        backlog = await _backlog(client, parts, recorder.unsettled)
        recorder.settle(backlog.states)
        if backlog.idle(wait_delayed=wait_delayed) and not recorder.unsettled:
            return
        if anyio.current_time() >= deadline:
            raise DrainTimeoutError(
                timeout, backlog.describe(len(recorder.unsettled)), recorder.outcomes()
            )
        await anyio.sleep(poll_interval)


@dataclass(frozen=True, slots=True)
class _Backlog:
    ready: int
    running: int
    due: int
    delayed: int
    states: dict[str, tuple[TaskState | None, str | None]]

    def idle(self, *, wait_delayed: bool) -> bool:
        return not (
            self.ready or self.running or self.due or (wait_delayed and self.delayed)
        )

    def describe(self, unsettled: int) -> str:
        return (
            f"{self.ready} ready, {self.running} running, {self.due} delayed and "
            f"due, {self.delayed} delayed in all; {unsettled} tasks that ran here "
            "not finished"
        )


async def _backlog(
    client: Client, parts: Partitions, task_ids: Collection[str]
) -> _Backlog:
    """The queue's backlog over its partitions (see :func:`_part_backlog`)."""
    ids: dict[QueueKeys, list[str]] = {keys: [] for keys in parts.all()}
    for task_id in task_ids:
        ids.setdefault(parts.of_id(task_id), []).append(task_id)
    total = _Backlog(0, 0, 0, 0, {})
    for keys, mine in ids.items():
        one = await _part_backlog(client, keys, mine)
        total = _Backlog(
            total.ready + one.ready,
            total.running + one.running,
            total.due + one.due,
            total.delayed + one.delayed,
            {**total.states, **one.states},
        )
    return total


async def _part_backlog(
    client: Client, keys: QueueKeys, task_ids: Collection[str]
) -> _Backlog:
    """The only place that reads the queue's keys (port it with the layout).

    One MULTI, so that the counts are one consistent snapshot: a task moves
    between the ready list (``ready``, or ``pready`` once priorities are
    used), leases and delayed only inside a script, so it is counted exactly
    once. Tasks in a group's line need no scan: a group has a line only while
    all its slots are taken by tasks ready, running or delayed (counted
    here), or while it is paused or halted (which nothing will run until an
    operator acts); a group out of its rate has a wake-up in ``delayed``.
    """
    seconds, micros = await client.time(**node_of(client, keys.ready))
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    ids = list(task_ids)
    async with client.pipeline(transaction=True) as pipe:
        pipe.llen(keys.ready)
        pipe.zcard(keys.pready)
        pipe.zcard(keys.leases)
        pipe.zcount(keys.delayed, "-inf", now_ms)
        pipe.zcard(keys.delayed)
        for task_id in ids:
            # s: state, x: last error (the dead-letter reason of a dead task)
            pipe.hmget(keys.task(task_id), "s", "x")
        ready, pready, running, due, delayed, *fields = await pipe.execute()
    ready = int(ready) + int(pready)
    states: dict[str, tuple[TaskState | None, str | None]] = {}
    for task_id, (state, reason) in zip(ids, fields, strict=True):
        states[task_id] = (
            None if state is None else TaskState(bytes(state).decode()),
            None if reason is None else bytes(reason).decode(errors="replace"),
        )
    return _Backlog(int(ready), int(running), int(due), int(delayed), states)
