"""The consuming side: claim tasks and run their handlers in the background."""

from __future__ import annotations

__all__ = ("Consumer",)

import functools
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
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Final, Literal, Self

import anyio
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ._inspect.views import ConsumerStats
from ._limits import DEFAULT_MAX_PAYLOAD_BYTES
from ._store import layout as _layout, validate as _validate
from ._store.assignment import DEFAULT_PARTITION_REPLICAS, check_partition_replicas
from ._store.connection import Client, RedisLike, open_client
from ._store.failures import translated_errors
from ._store.partition import Partitions, check_count
from ._store.restart_risk import restart_risk
from ._store.server_checks import check_replicas, check_server
from ._store.validate import setting_int, setting_seconds
from ._telemetry.events import Observer, Observers, check_observers
from ._work.damage import DamageWatch
from ._work.fetcher import FetchContext, Fetchers, SlotPool
from ._work.handlers import Handler, HandlerFunc, build_routes
from ._work.leases import LeaseKeeper
from ._work.outcomes import Counters, Outcomes
from ._work.runner import RetryPolicy
from ._work.schedule import Schedule, Scheduler
from ._work.share import Share
from ._work.telemetry import Telemetry
from ._work.workers import Workers
from .errors import ConfigurationError, ConsumerRunningError, PayloadTooLargeError

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from ._work.running import Running
    from .task import DeadLetter

logger: logging.Logger = logging.getLogger(__name__)

#: most tasks one claim call takes
DEFAULT_CLAIM_BATCH: Final = 32
#: random bytes in a generated consumer name: nobody can guess a live
#: consumer's name and take over its tasks by naming itself so
_NAME_RANDOM_BYTES: Final = 8


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
    :class:`~aiogroupq.ConfigurationError` when it cannot start, and
    :class:`~aiogroupq.CorruptQueueError` when a key of the queue is damaged.
    A running consumer outlives a damaged key instead: it logs an ERROR
    naming the key, claims nothing and keeps its tasks' outcomes until
    ``aiogroupq check --repair`` repaired it, then resumes by itself.

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
    :param partitions: how many partitions the queue has (None: what the
        queue stores); as for :class:`Producer`. The consumer claims from
        its share of the partitions, with one blocking connection each
    :param partition_replicas: how many live consumers serve each partition
        (r, capped by the fleet). The consumers share the partitions out
        among themselves from the consumer registry, each computing the
        same assignment: at most ``ceil(r*K/C)`` partitions each for C
        live consumers (beyond r*K consumers, the extra ones stand by); a
        consumer's death moves its partitions to the others within about a
        lease. Give every consumer of a queue the same value. A queue of
        one partition, or a fleet of at most r consumers, is served whole
        by every consumer (docs/scaling.md)
    :param durability: ``"replicated"``: a claim starts its tasks only once
        a replica acknowledged it, and a heartbeat extends leases only once
        a replica acknowledged the extension, so that a failover can neither
        run a task twice at once nor start a group's tasks out of order
        (docs/guarantees.md); ``"primary"`` (the default) does not wait
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
        partitions: int | None = None,
        durability: Literal["primary", "replicated"] = "primary",
        partition_replicas: int = DEFAULT_PARTITION_REPLICAS,
    ) -> None:
        self._parts = Partitions(queue)
        self._keys = self._parts.keys(0)
        self._requested = (
            None if partitions is None else check_count("partitions", partitions)
        )
        self._replication = _validate.durability(durability)
        self._replicas = check_partition_replicas(partition_replicas)
        self._routes = build_routes(handlers)
        observed = Observers(queue, check_observers(observers))
        setting_int("concurrency", concurrency)
        setting_int("claim_batch", claim_batch)
        self._max_payload_bytes = setting_int("max_payload_bytes", max_payload_bytes)
        _check_kinds(redis, name, on_dead, allow_eviction)
        self._allow_eviction = allow_eviction
        self._run: AbstractAsyncContextManager[Self] | None = None
        self._on_dead = on_dead
        self._scheduler = self._scheduler_for(schedules)
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
        host = socket.gethostname()
        self.name: str = name or (
            f"{host}:{os.getpid()}:{secrets.token_hex(_NAME_RANDOM_BYTES)}"
        )
        # The tasks this consumer holds (emptied as a run starts) and its
        # counters (over all its runs).
        self._running: dict[str, Running] = {}
        self._counters = Counters()
        self._leases = LeaseKeeper(
            self._parts,
            name=self.name,
            host=host,
            concurrency=concurrency,
            lease_ttl=self._lease_ttl,
            retention_ms=self._retention_ms,
            replication=self._replication,
            running=self._running,
            counters=self._counters,
        )
        self._telemetry = Telemetry(
            observed,
            lease_ttl=self._lease_ttl,
            running=lambda: list(self._running.values()),
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
        return Scheduler(self._parts, items) if items else None

    @property
    def queue(self) -> str:
        """The queue this consumer claims from."""
        return self._keys.queue

    @property
    def stats(self) -> ConsumerStats:
        """A snapshot of this consumer's counters."""
        return ConsumerStats(
            **dict(self._counters.items()),
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
        :raises CorruptQueueError: if a key of the queue is damaged (run
            ``aiogroupq check --repair``)
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
        self._running.clear()
        watch = self._leases.watch = DamageWatch(self.queue)
        share = self._leases.share = Share(self.name, self._replicas, self._lease_ttl)
        async with open_client(self._redis, retry=False) as client:
            await check_server(client, eviction=not self._allow_eviction)
            with translated_errors():
                await _layout.open_layout(client, self._parts, self._requested)
            if self._replication is not None:
                await check_replicas(client)
            if (risk := await restart_risk(client)) is not None:
                logger.warning("%s", risk)
            with translated_errors():
                await self._leases.identity.acquire(client)
            # Registered (aiogroupq consumers) before it claims anything; each
            # heartbeat renews the entry with the leases.
            try:
                await self._leases.heartbeat(client, starting=True)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._leases.release(client)
                raise
            with _collapse_excgroups():
                async with anyio.create_task_group() as outer:
                    outcomes = self._outcomes(client, outer, watch)
                    workers = Workers(
                        self._concurrency,
                        outcomes,
                        routes=self._routes,
                        policy=self._policy,
                        max_payload_bytes=self._max_payload_bytes,
                        observers=self._telemetry.observers,
                    )
                    context = self._fetch_context(workers.slots, outcomes, watch)
                    context.share = share
                    fetchers = Fetchers(self._parts, context)
                    workers.topup = functools.partial(fetchers.top_up, client)
                    outer.start_soon(outcomes.finisher.run)
                    outer.start_soon(self._leases.run, client)
                    if self._scheduler is not None:
                        await outer.start(self._scheduler.run, client)
                    outer.start_soon(self._telemetry.watchdog.run)
                    self._telemetry.banner(
                        self.name,
                        sorted(self._routes),
                        self._concurrency,
                        self._grace_period,
                    )
                    try:
                        async with anyio.create_task_group() as inner:
                            # Claims are live once this returns.
                            await inner.start(fetchers.run, client, workers.send)
                            workers.start(inner)
                            try:
                                yield self
                            finally:
                                fetchers.stop()
                                if self._scheduler is not None:
                                    self._scheduler.stop()
                                inner.cancel_scope.deadline = (
                                    anyio.current_time() + self._grace_period
                                )
                    finally:
                        # Also when the block failed: hand back what was
                        # claimed but never started, record every outcome
                        # and let go of the rest.
                        with anyio.CancelScope(shield=True):
                            workers.hand_back_unstarted()
                            await outcomes.close(timeout=10.0)
                            # The outcomes just recorded may have called
                            # on_dead: those calls finish before the side
                            # tasks are cancelled.
                            await outcomes.hooks_done(self._grace_period)
                            await self._leases.release(client)
                        outer.cancel_scope.cancel()
            logger.info("consumer %s stopped: %s", self.name, self.stats)

    # -- collaborators of one run --------------------------------------------

    def _outcomes(
        self, client: Client, side_tasks: TaskGroup, watch: DamageWatch
    ) -> Outcomes:
        return Outcomes(
            client,
            self._parts,
            running=self._running,
            counters=self._counters,
            telemetry=self._telemetry,
            on_dead=self._on_dead,
            retention_ms=self._retention_ms,
            side_tasks=side_tasks,
            watch=watch,
        )

    def _fetch_context(
        self, slots: SlotPool, outcomes: Outcomes, watch: DamageWatch
    ) -> FetchContext:
        return FetchContext(
            name=self.name,
            queue=self.queue,
            lease_ttl=self._lease_ttl,
            retention_ms=self._retention_ms,
            claim_batch=self._claim_batch,
            replication=self._replication,
            slots=slots,
            running=self._running,
            counters=self._counters,
            outcomes=outcomes,
            watch=watch,
            # Only sizes above 1 take members: a batch of one is a claim's.
            batches=tuple(
                (name, route.options.batch_size)
                for name, route in sorted(self._routes.items())
                if route.options.batch_size is not None and route.options.batch_size > 1
            ),
        )


def _check_kinds(
    redis: object, name: object, on_dead: object, allow_eviction: object
) -> None:
    """Refuse arguments of the wrong kind (the other settings are checked as
    they are read)."""
    if not isinstance(redis, str | Redis | RedisCluster):
        raise ConfigurationError(
            f"expected a redis:// URL or a redis.asyncio.Redis client, got {redis!r}"
        )
    if name is not None and (not isinstance(name, str) or not name or len(name) > 200):
        raise ConfigurationError(f"name must be 1-200 characters, got {name!r}")
    if on_dead is not None and not callable(on_dead):
        raise ConfigurationError(f"on_dead must be an async callable, got {on_dead!r}")
    if not isinstance(allow_eviction, bool):
        raise ConfigurationError(
            f"allow_eviction must be True or False, got {allow_eviction!r}"
        )


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
