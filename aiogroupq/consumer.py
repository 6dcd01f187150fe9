"""The consuming side: claim tasks and run their handlers in the background."""

from __future__ import annotations

__all__ = ("Consumer", "ConsumerStats")

import contextlib
import logging
import os
import secrets
import socket
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from redis.asyncio import Redis
from redis.exceptions import RedisError

from . import _scripts
from ._connection import (
    RedisLike,
    check_server,
    open_client,
    socket_timeout,
    translated_errors,
)
from ._finisher import Finisher
from ._handlers import Handler, HandlerFunc, build_routes
from ._identity import Identity
from ._keys import QueueKeys
from ._observer import EventKind, Observer, Observers, check_observers
from ._registry import leave_registry
from ._runner import RetryPolicy, Running, run_task
from ._schedule import Schedule, Scheduler
from ._telemetry import Telemetry
from ._validate import setting_int, setting_seconds
from .errors import (
    ConfigurationError,
    ConsumerRunningError,
    PayloadTooLargeError,
    QueueFullError,
)
from .producer import DEFAULT_MAX_PAYLOAD_BYTES

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from .task import DeadLetter

logger: logging.Logger = logging.getLogger(__name__)

#: longest a fetcher blocks on the wake list before it claims anyway
MAX_BLOCK: Final = 1.0
#: most tasks one claim call takes
DEFAULT_CLAIM_BATCH: Final = 32
#: slack for the server's cron tick, on which blocking pops time out
_SERVER_TICK: Final = 0.25
#: Redis errors after which the fetcher backs off and tries again
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 5.0
#: random bytes in a generated consumer name: nobody can guess a live
#: consumer's name and take over its tasks by naming itself so
_NAME_RANDOM_BYTES: Final = 8


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """Counters of one consumer since it was created, over all its runs
    (see :attr:`Consumer.stats`).

    ``loop_blocked`` counts the times the event loop did not run for a third
    of ``lease_ttl`` (at most 1 s) or longer: a handler blocked it.
    """

    claimed: int
    succeeded: int
    retried: int
    dead: int
    cancelled: int
    handed_back: int
    lease_lost: int
    running: int
    loop_blocked: int = 0


class Consumer:
    """Runs handlers in the background while its ``async with`` block is open.

    Entering starts claiming (claims are live when the block begins). Leaving
    stops claiming, gives running handlers ``grace_period`` seconds, cancels
    what is still running and hands every unfinished task back to the front of
    its group, without counting the attempt. A Consumer may be entered again
    after its block ended (a fresh run under the same name); entering it
    while it runs raises :class:`~aiogroupq.ConsumerRunningError`.

    Entering checks the server (version, eviction policy, credentials) and
    takes the consumer's name: it raises :class:`~aiogroupq.RedisUnavailableError`,
    :class:`~aiogroupq.AuthenticationError` or a
    :class:`~aiogroupq.ConfigurationError` when it cannot start.

    :param redis: a ``redis://`` URL, or a ``redis.asyncio.Redis`` client to
        borrow (never closed by us; must have ``decode_responses=False``)
    :param queue: the queue name
    :param handlers: task type -> ``async def handler(payload)``. An annotated
        payload parameter gets the payload decoded into that type (msgspec
        Struct, dataclass, TypedDict, builtins); unannotated gets builtins
    :param concurrency: handlers running at once in this consumer
    :param lease_ttl: seconds a silent consumer keeps its tasks and groups;
        heartbeats renew it every third of that while handlers run
    :param name: the consumer's identity in Redis (default: host, pid and 64
        random bits). A name is held by one live consumer at a time, generated
        names included
    :param grace_period: seconds running handlers get to finish on exit
    :param retention: seconds a succeeded or cancelled task's state (and
        stored result) stays readable; at least 60 are kept, so that a re-sent
        acknowledgement is recognised
    :param retry_backoff: seconds before the first retry of a failed task
        (doubling per attempt, with jitter)
    :param retry_backoff_max: cap of the retry delay in seconds
    :param claim_batch: most tasks claimed per round trip
    :param on_dead: ``async def on_dead(letter)`` called after a task of this
        consumer is dead-lettered (for alerts or a failure pipeline); its
        errors are logged and do not affect the task
    :param max_payload_bytes: a claimed task whose stored payload is larger
        (checked before decoding) is dead-lettered with reason
        ``PayloadTooLarge: …``; keep it at least the producers' limit
    :param schedules: periodic tasks this consumer enqueues, racing every
        other consumer that has them: exactly one enqueue per tick
        (see :class:`Schedule`)
    :param allow_eviction: accept a server whose ``maxmemory-policy`` may
        evict keys (and so lose tasks); by default entering refuses it
    :param observers: instances of :class:`~aiogroupq.Observer` that
        receive this consumer's events and wrap its handler runs (metrics,
        traces)
    :raises ConfigurationError: if an argument is unusable
    :raises PayloadTooLargeError: if a schedule's payload is over
        *max_payload_bytes*
    """

    def __init__(
        self,
        redis: RedisLike,
        *,
        queue: str,
        handlers: Mapping[str, HandlerFunc | Handler],
        concurrency: int = 64,
        lease_ttl: float | timedelta = 30.0,
        name: str | None = None,
        grace_period: float | timedelta = 30.0,
        retention: float | timedelta = 3600.0,
        retry_backoff: float | timedelta = 1.0,
        retry_backoff_max: float | timedelta = 300.0,
        claim_batch: int = DEFAULT_CLAIM_BATCH,
        on_dead: Callable[[DeadLetter], Awaitable[None]] | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        schedules: Iterable[Schedule] = (),
        allow_eviction: bool = False,
        observers: Sequence[Observer] = (),
    ) -> None:
        self._keys = QueueKeys(queue)
        self._routes = build_routes(handlers)
        observed = Observers(queue, check_observers(observers))
        setting_int("concurrency", concurrency)
        setting_int("claim_batch", claim_batch)
        self._max_payload_bytes = setting_int("max_payload_bytes", max_payload_bytes)
        if not isinstance(redis, str | Redis):
            raise ConfigurationError(
                f"expected a redis:// URL or a redis.asyncio.Redis client, got {redis!r}"
            )
        if name is not None and (
            not isinstance(name, str) or not name or len(name) > 200
        ):
            raise ConfigurationError(f"name must be 1-200 characters, got {name!r}")
        if on_dead is not None and not callable(on_dead):
            raise ConfigurationError(
                f"on_dead must be an async callable, got {on_dead!r}"
            )
        if not isinstance(allow_eviction, bool):
            raise ConfigurationError(
                f"allow_eviction must be True or False, got {allow_eviction!r}"
            )
        self._allow_eviction = allow_eviction
        self._run: AbstractAsyncContextManager[Self] | None = None
        self._on_dead = on_dead
        self._scheduler = self._scheduler_for(schedules)
        self._dead_notices: dict[str, DeadLetter] = {}
        self._side_tasks: TaskGroup | None = None
        self._finisher: Finisher
        self._redis = redis
        self._concurrency = concurrency
        self._claim_batch = claim_batch
        self._lease_ttl = setting_seconds("lease_ttl", lease_ttl, minimum=0.1)
        self._grace_period = setting_seconds("grace_period", grace_period)
        self._retention_ms = round(setting_seconds("retention", retention) * 1000)
        self._policy = RetryPolicy(
            setting_seconds("retry_backoff", retry_backoff),
            setting_seconds("retry_backoff_max", retry_backoff_max),
        )
        self._host = socket.gethostname()
        self.name: str = name or (
            f"{self._host}:{os.getpid()}:{secrets.token_hex(_NAME_RANDOM_BYTES)}"
        )
        # Every name is held while its consumer runs, a generated one too:
        # else a consumer named (by mistake or malice) like a live one would
        # take over its running tasks at start, and a group would run twice.
        self._identity = Identity(self._keys, self.name, self._lease_ttl)
        self._running: dict[str, Running] = {}
        self._free = concurrency
        self._free_changed = anyio.Event()
        self._stopping = False
        self._block_scope: anyio.CancelScope | None = None
        self._telemetry = Telemetry(
            observed,
            lease_ttl=self._lease_ttl,
            running=lambda: list(self._running.values()),
        )
        self._counts = dict.fromkeys(
            (
                "claimed",
                "succeeded",
                "retried",
                "dead",
                "cancelled",
                "handed_back",
                "lease_lost",
            ),
            0,
        )

    def _scheduler_for(self, schedules: Iterable[Schedule]) -> Scheduler | None:
        if isinstance(schedules, Schedule | str) or not isinstance(schedules, Iterable):
            raise ConfigurationError(
                f"schedules must be a list of aiogroupq.Schedule, got {schedules!r}"
            )
        items = list(schedules)
        names: set[str] = set()
        for schedule in items:
            if not isinstance(schedule, Schedule):
                raise ConfigurationError(
                    f"schedules must hold aiogroupq.Schedule items, got {schedule!r}"
                )
            if schedule.name in names:
                raise ConfigurationError(
                    f"two schedules are named {schedule.name!r}: names identify "
                    "a schedule's ticks in the queue"
                )
            names.add(schedule.name)
            if schedule.task_type not in self._routes:
                raise ConfigurationError(
                    f"schedule {schedule.name!r} runs task type "
                    f"{schedule.task_type!r}, which has no handler here"
                )
            if len(schedule._encoded) > self._max_payload_bytes:
                raise PayloadTooLargeError(
                    len(schedule._encoded), self._max_payload_bytes
                )
        return Scheduler(self._keys, items) if items else None

    @property
    def queue(self) -> str:
        """The queue this consumer claims from."""
        return self._keys.queue

    @property
    def stats(self) -> ConsumerStats:
        """A snapshot of this consumer's counters."""
        return ConsumerStats(
            **self._counts,
            running=len(self._running),
            loop_blocked=self._telemetry.blocked,
        )

    def _observe(self, observer: Observer) -> None:
        """Add *observer* before the consumer is entered (the worker's
        metrics, for a Consumer that a factory made)."""
        self._telemetry.observers.add(observer)

    # -- lifecycle ---------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Check the server, take the consumer's name and start claiming.

        :raises ConsumerRunningError: if this Consumer is already running
        :raises ConfigurationError: for a server older than Redis 7.0, an
            eviction policy other than ``noeviction`` (unless
            ``allow_eviction=True``), a bad URL or database number, or a name
            another live consumer holds (after waiting 1.5 x ``lease_ttl``)
        :raises AuthenticationError: if Redis refuses the credentials
        :raises PermissionDeniedError: if the Redis user may not use this queue
        :raises RedisUnavailableError: if Redis does not answer within 5 s
        """
        # Like anyio's AsyncContextManagerMixin, written out to refuse a
        # second entry with a typed error, and already while the first one is
        # still starting (the mixin only knows once it has started).
        if self._run is not None:
            raise ConsumerRunningError(self.name)
        run = self._run = self.__asynccontextmanager__()
        try:
            return await run.__aenter__()
        except BaseException:
            self._run = None
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        """Stop claiming, let running handlers finish and hand back the rest."""
        if (run := self._run) is None:
            raise RuntimeError("this Consumer has not been entered")
        try:
            return await run.__aexit__(exc_type, exc, traceback)
        finally:
            self._run = None  # only now: the run has wound down

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncGenerator[Self]:
        # A fresh run: nothing of a previous one may leak into it.
        self._stopping = False
        self._running = {}
        self._free = self._concurrency
        self._free_changed = anyio.Event()
        self._block_scope = None
        self._dead_notices = {}
        async with open_client(self._redis, retry=False) as client:
            await check_server(client, eviction=not self._allow_eviction)
            with translated_errors():
                await self._identity.acquire(client)
            # Registered (aiogroupq consumers) before it claims anything; each
            # heartbeat renews the entry with the leases.
            await self._heartbeat(client)
            finisher = self._finisher = Finisher(
                client,
                self._keys,
                retention_ms=self._retention_ms,
                on_done=self._recorded,
            )
            send, receive = anyio.create_memory_object_stream[Running](
                self._concurrency
            )
            with _collapse_excgroups():
                async with anyio.create_task_group() as outer:
                    self._side_tasks = outer
                    outer.start_soon(finisher.run)
                    outer.start_soon(self._heartbeat_loop, client)
                    if self._scheduler is not None:
                        await outer.start(self._scheduler.run, client)
                    outer.start_soon(self._telemetry.watchdog.run)
                    try:
                        async with anyio.create_task_group() as inner:
                            await inner.start(self._fetch_loop, client, send)
                            for _ in range(self._concurrency):
                                inner.start_soon(
                                    self._work_loop, receive.clone(), finisher
                                )
                            try:
                                yield self
                            finally:
                                self._stop_claiming()
                                inner.cancel_scope.deadline = (
                                    anyio.current_time() + self._grace_period
                                )
                    finally:
                        with anyio.CancelScope(shield=True):
                            await self._wind_down(client, send, receive, finisher)
                        outer.cancel_scope.cancel()
            logger.info("consumer %s stopped: %s", self.name, self.stats)

    async def _wind_down(
        self,
        client: Redis,
        send: MemoryObjectSendStream[Running],
        receive: MemoryObjectReceiveStream[Running],
        finisher: Finisher,
    ) -> None:
        """Hand back what was claimed but never started, and record every
        outcome (runs shielded, also when the block failed)."""
        send.close()
        # Each hand-back goes to the front: reversed, they keep claim order.
        for running in reversed(_drain(receive)):
            self._hand_back(running, finisher)
        receive.close()
        left = await finisher.close(timeout=10.0)
        if left:
            logger.warning(
                "%d outcomes could not be recorded; their tasks will be "
                "recovered when their leases expire",
                left,
            )
        # A claim cancelled after the server ran it left tasks we never saw in
        # our recovery key: give them back now, not at lease expiry.
        with contextlib.suppress(RedisError, OSError):
            given_back, _ = await _scripts.recover(
                client,
                self._keys,
                self.name,
                counted=False,
                retention_ms=self._retention_ms,
                keep=list(self._running),
            )
            if given_back:
                logger.info("gave back %d tasks claimed while stopping", given_back)
        with contextlib.suppress(RedisError, OSError):
            await self._identity.release(client)
        # A clean exit: out of the registry rather than listed as gone.
        with contextlib.suppress(RedisError, OSError):
            await leave_registry(client, self._keys, self.name)

    def _stop_claiming(self) -> None:
        self._stopping = True
        if self._scheduler is not None:
            self._scheduler.stop()
        if self._block_scope is not None:
            self._block_scope.cancel()
        self._free_changed.set()

    # -- claiming ----------------------------------------------------------

    async def _fetch_loop(
        self,
        client: Redis,
        send: MemoryObjectSendStream[Running],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        block_cap = MAX_BLOCK
        if (limit := socket_timeout(client)) is not None:
            # A blocking pop longer than the socket timeout would be cut off.
            block_cap = max(0.05, min(MAX_BLOCK, limit - 0.5, limit / 2))
        lease_ms = round(self._lease_ttl * 1000)
        backoff = _BACKOFF_FIRST
        # A previous incarnation with our name may have died holding tasks:
        # they go back to the front of their groups now, not at lease expiry.
        reconcile: bool | None = True
        self._telemetry.banner(
            self.name, sorted(self._routes), self._concurrency, self._grace_period
        )
        task_status.started()
        async with send:
            while not self._stopping:
                if reconcile is not None:
                    try:
                        given_back, dead = await _scripts.recover(
                            client,
                            self._keys,
                            self.name,
                            counted=reconcile,
                            retention_ms=self._retention_ms,
                            keep=list(self._running),
                        )
                    except (RedisError, OSError) as exc:
                        logger.warning(
                            "recovery failed (%s); retrying in %.2fs", exc, backoff
                        )
                        await self._block(None, backoff)
                        backoff = min(backoff * 2, _BACKOFF_MAX)
                        continue
                    self._dead_elsewhere(client, dead)
                    if given_back:
                        logger.warning(
                            "consumer %s gave back %d tasks it held but was not "
                            "running (%s)",
                            self.name,
                            given_back,
                            "previous incarnation" if reconcile else "lost reply",
                        )
                    reconcile = None
                if self._free == 0:
                    self._free_changed = anyio.Event()
                    await self._free_changed.wait()
                    continue
                k = min(self._free, self._claim_batch)
                sent_at = anyio.current_time()
                try:
                    reply = await _scripts.claim(
                        client,
                        self._keys,
                        self.name,
                        k=k,
                        lease_ms=lease_ms,
                        scan_limit=k + 64,
                        retention_ms=self._retention_ms,
                    )
                except (RedisError, OSError, QueueFullError) as exc:
                    # QueueFullError: Redis is out of memory and refused the
                    # claim before it ran; work in flight can still finish.
                    logger.warning("claim failed (%s); retrying in %.2fs", exc, backoff)
                    # The script may have run and its reply been lost: what it
                    # claimed sits in our recovery key; give it back first.
                    reconcile = False
                    await self._block(None, backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX)
                    continue
                backoff = _BACKOFF_FIRST
                for problem in reply.problems:
                    logger.error(
                        "damaged key in queue %r: %s; run 'aiogroupq check --repair'",
                        self.queue,
                        problem,
                    )
                self._dead_elsewhere(client, reply.dead)
                for task_id in reply.expired:
                    self._telemetry.emit(EventKind.EXPIRED, None, task_id=task_id)
                deadline = sent_at + self._local_lease()
                for claimed in reply.tasks:
                    running = Running(claimed)
                    running.lease_scope.deadline = deadline
                    self._running[claimed.id] = running
                    self._free -= 1
                    send.send_nowait(running)
                self._counts["claimed"] += len(reply.tasks)
                if len(reply.tasks) == k or reply.more:
                    continue
                # A pop ends up to a server tick (~100 ms) after its timeout:
                # a task due within a tick past the cap gets the timer too.
                due = 0 <= reply.wait_ms < (block_cap + _SERVER_TICK) * 1000
                timeout = reply.wait_ms / 1000 if due else block_cap
                await self._block(client, timeout, due=due)

    async def _block(
        self, client: Redis | None, timeout: float, *, due: bool = False
    ) -> None:
        """Wait up to *timeout* for a wake token (or just sleep without client).

        With *due*, a delayed task falls due when *timeout* ends. The server
        ends blocking pops on its cron tick (10 per second by default), too
        coarse for that, so a local timer pushes a token at the precise time.
        """
        with anyio.CancelScope() as scope:
            self._block_scope = scope
            if self._stopping:
                scope.cancel()
            if client is None:
                await anyio.sleep(timeout)
                return
            async with anyio.create_task_group() as tg:
                if due:
                    tg.start_soon(self._poke, client, timeout)
                try:
                    await client.blpop(
                        [self._keys.wake], timeout=max(timeout, 0.01) + 0.1
                    )
                except (RedisError, OSError) as exc:
                    logger.warning("waiting for work failed (%s)", exc)
                    await anyio.sleep(_BACKOFF_FIRST)
                tg.cancel_scope.cancel()
        self._block_scope = None

    async def _poke(self, client: Redis, delay: float) -> None:
        await anyio.sleep(delay)
        # On failure the pop's own timeout wakes us a little later.
        with contextlib.suppress(RedisError, OSError):
            await client.rpush(self._keys.wake, "1")

    def _local_lease(self) -> float:
        # Stop a little before the server would recover the task.
        return self._lease_ttl - min(1.0, self._lease_ttl * 0.1)

    # -- running -----------------------------------------------------------

    async def _work_loop(
        self, receive: MemoryObjectReceiveStream[Running], finisher: Finisher
    ) -> None:
        async with receive:
            async for running in receive:
                if self._stopping:
                    self._hand_back(running, finisher)
                    continue
                try:
                    await run_task(
                        running,
                        self._routes,
                        self._policy,
                        self._submit,
                        max_payload_bytes=self._max_payload_bytes,
                        observers=self._telemetry.observers,
                    )
                finally:
                    if running.lost:
                        self._forget(running.claimed.id, running.claimed.token)
                        self._counts["lease_lost"] += 1
                        self._telemetry.emit(EventKind.LEASE_LOST, running)
                    self._free += 1
                    self._free_changed.set()

    def _hand_back(self, running: Running, finisher: Finisher) -> None:
        claimed = running.claimed
        finisher.submit(_scripts.Outcome(claimed.id, claimed.token, "back"))

    def _submit(self, outcome: _scripts.Outcome, notice: DeadLetter | None) -> None:
        if notice is not None and self._on_dead is not None:
            self._dead_notices[outcome.id] = notice
        self._finisher.submit(outcome)

    def _dead_elsewhere(self, client: Redis, ids: Sequence[str]) -> None:
        """Call on_dead for tasks a script dead-lettered on its own (a lease
        that expired on the last attempt, damaged keys)."""
        self._telemetry.dead_elsewhere(ids)
        if ids and self._on_dead is not None and self._side_tasks is not None:
            self._side_tasks.start_soon(self._notify_dead, client, ids)

    async def _notify_dead(self, client: Redis, ids: Sequence[str]) -> None:
        from .producer import _dead_letter

        try:
            rows = await _scripts.dead_rows_by_id(client, self._keys, ids)
        except (RedisError, OSError) as exc:
            logger.warning("could not read dead letters %s for on_dead: %s", ids, exc)
            return
        for row in rows:
            await self._call_on_dead(_dead_letter(row))

    async def _call_on_dead(self, notice: DeadLetter) -> None:
        assert self._on_dead is not None
        try:
            await self._on_dead(notice)
        except Exception:
            logger.exception("on_dead callback failed for task %s", notice.id)

    def _forget(self, task_id: str, token: int) -> None:
        # Only the attempt this token belongs to: the outcome of an earlier
        # attempt may be recorded after the same task was claimed again.
        running = self._running.get(task_id)
        if running is not None and running.claimed.token == token:
            del self._running[task_id]

    def _recorded(self, outcome: _scripts.Outcome, code: int) -> None:
        running = self._running.get(outcome.id)
        if running is not None and running.claimed.token != outcome.token:
            running = None  # a later attempt's: not the one this is about
        self._forget(outcome.id, outcome.token)
        notice = self._dead_notices.pop(outcome.id, None)
        if notice is not None and code == _scripts.APPLIED and self._side_tasks:
            self._side_tasks.start_soon(self._call_on_dead, notice)
        if code == _scripts.LEASE_LOST:
            self._counts["lease_lost"] += 1
            self._telemetry.refused(outcome.kind, outcome.id, running)
            return
        kind = outcome.kind
        if code in (_scripts.GROUP_DAMAGED, _scripts.TASK_DAMAGED):
            logger.error(
                "outcome %r of task %s: %s; run 'aiogroupq check --repair'",
                outcome.kind,
                outcome.id,
                "a key of its group is damaged, so the task ended alone"
                if code == _scripts.GROUP_DAMAGED
                else "its hash is damaged, so nothing was recorded",
                extra=self._telemetry.extra(outcome.id, running),
            )
            if code == _scripts.TASK_DAMAGED:
                return
            if kind not in ("ok", "cancel"):
                kind = "dead"  # dead-lettered as corrupt
        elif code == _scripts.APPLIED_AS_CANCEL:
            # The server turns a retry or hand-back into a cancel when one was
            # requested; count what was applied.
            kind = "cancel"
        key = _COUNTED[kind]
        self._counts[key] += 1
        self._telemetry.emit(EventKind(key), running, task_id=outcome.id)

    # -- leases ------------------------------------------------------------

    async def _heartbeat_loop(self, client: Redis) -> None:
        while True:
            await anyio.sleep(self._lease_ttl / 3)
            await self._heartbeat(client)

    def _registration(self, in_flight: int) -> list[tuple[str, EncodableT]]:
        return [
            ("host", self._host),
            ("pid", os.getpid()),
            ("c", self._concurrency),
            ("n", in_flight),
            *self._counts.items(),
        ]

    async def _heartbeat(self, client: Redis) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self._identity.renew(client)
        snapshot = list(self._running.values())
        sent_at = anyio.current_time()
        try:
            alive = await _scripts.heartbeat(
                client,
                self._keys,
                [(r.claimed.id, r.claimed.token) for r in snapshot],
                lease_ms=round(self._lease_ttl * 1000),
                consumer=self.name,
                registration=self._registration(len(snapshot)),
            )
        except (RedisError, OSError) as exc:
            # Each handler stops by itself at its local lease deadline.
            logger.warning("heartbeat failed (%s)", exc)
            return
        deadline = sent_at + self._local_lease()
        for running, code in zip(snapshot, alive, strict=True):
            if self._running.get(running.claimed.id) is not running:
                continue  # finished while the heartbeat was in flight
            if code == _scripts.LOST:
                running.lost = True
                running.lease_scope.cancel()
                continue
            running.lease_scope.deadline = deadline
            if code == _scripts.CANCEL_REQUESTED and not running.cancel_requested:
                running.cancel_requested = True
                running.lease_scope.cancel()


_COUNTED: Final = {
    "ok": "succeeded",
    "retry": "retried",
    "dead": "dead",
    "halt": "dead",
    "cancel": "cancelled",
    "back": "handed_back",
}


def _drain(receive: MemoryObjectReceiveStream[Running]) -> list[Running]:
    items = []
    while True:
        try:
            items.append(receive.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return items


@contextmanager
def _collapse_excgroups() -> Generator[None]:
    """Surface a lone exception from a task group as itself (starlette's way)."""
    try:
        yield
    except BaseExceptionGroup as group:
        exc: BaseException = group
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if exc is group:
            raise
        raise exc from None
