"""The consuming side: claim tasks and run their handlers in the background."""

from __future__ import annotations

__all__ = ("Consumer",)

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
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Final, Literal, Self

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ._inspect.views import ConsumerStats
from ._store import layout as _layout, scripts as _scripts, validate as _validate
from ._store.codec import dead_letter
from ._store.connection import (
    REDIS_FAILURES,
    Client,
    RedisLike,
    check_replicas,
    check_server,
    open_client,
    translated_errors,
)
from ._store.defaults import DEFAULT_MAX_PAYLOAD_BYTES
from ._store.fanout import by_partition, each_partition
from ._store.partition import Partitions, check_count
from ._store.registry import leave_registry
from ._store.validate import setting_int, setting_seconds
from ._telemetry.consumer import Telemetry
from ._telemetry.events import EventKind, Observer, Observers, check_observers
from ._work.fetcher import FetchContext, Fetcher, SlotPool, local_lease
from ._work.finisher import Finisher
from ._work.handlers import Handler, HandlerFunc, build_routes
from ._work.identity import Identity
from ._work.runner import RetryPolicy, Running, run_task
from ._work.schedule import Schedule, Scheduler
from .errors import (
    ConfigurationError,
    ConsumerRunningError,
    PayloadTooLargeError,
)

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from ._store.keys import QueueKeys
    from .task import DeadLetter

logger: logging.Logger = logging.getLogger(__name__)

#: most tasks one claim call takes
DEFAULT_CLAIM_BATCH: Final = 32
#: seconds between two reads of the queue's partition layout (a repartition
#: reaches every consumer within this)
LAYOUT_POLL: Final = 1.0
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
    :param partitions: how many partitions the queue has (None: what the
        queue stores); as for :class:`Producer`. The consumer claims from
        every partition, with one blocking connection per partition
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
    ) -> None:
        self._parts = Partitions(queue)
        self._keys = self._parts.keys(0)
        self._requested = (
            None if partitions is None else check_count("partitions", partitions)
        )
        self._replication = _validate.durability(durability)
        self._routes = build_routes(handlers)
        observed = Observers(queue, check_observers(observers))
        setting_int("concurrency", concurrency)
        setting_int("claim_batch", claim_batch)
        self._max_payload_bytes = setting_int("max_payload_bytes", max_payload_bytes)
        if not isinstance(redis, str | Redis | RedisCluster):
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
        self._slots = SlotPool(concurrency)
        self._stopped = anyio.Event()
        self._fetchers: dict[int, Fetcher] = {}
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
        return Scheduler(self._parts, items) if items else None

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
        self._running = {}
        self._slots = SlotPool(self._concurrency)
        self._stopped = anyio.Event()
        self._fetchers = {}
        self._dead_notices = {}
        async with open_client(self._redis, retry=False) as client:
            await check_server(client, eviction=not self._allow_eviction)
            with translated_errors():
                await _layout.open_layout(client, self._parts, self._requested)
            if self._replication is not None:
                await check_replicas(client)
            with translated_errors():
                await self._identity.acquire(client)
            # Registered (aiogroupq consumers) before it claims anything; each
            # heartbeat renews the entry with the leases.
            await self._heartbeat(client)
            finisher = self._finisher = Finisher(
                client,
                self._parts,
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
                            await inner.start(self._fetch_all, client, send)
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
        client: Client,
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
        async def recover(keys: QueueKeys) -> int:
            with contextlib.suppress(*REDIS_FAILURES):
                given_back, _ = await _scripts.recover(
                    client,
                    keys,
                    self.name,
                    counted=False,
                    retention_ms=self._retention_ms,
                    keep=[i for i in self._running if keys.owns(i)],
                )
                return given_back
            return 0

        given_back = sum(await each_partition(self._parts.all(), recover))
        if given_back:
            logger.info("gave back %d tasks claimed while stopping", given_back)
        with contextlib.suppress(*REDIS_FAILURES):
            await self._identity.release(client)
        # A clean exit: out of the registry rather than listed as gone.
        with contextlib.suppress(*REDIS_FAILURES):
            await leave_registry(client, self._keys, self.name)

    def _stop_claiming(self) -> None:
        self._slots.close()
        self._stopped.set()
        if self._scheduler is not None:
            self._scheduler.stop()
        for fetcher in self._fetchers.values():
            fetcher.wake()

    # -- claiming ----------------------------------------------------------

    async def _fetch_all(
        self,
        client: Client,
        send: MemoryObjectSendStream[Running],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run one fetcher per partition, claiming when this returns; follow
        the queue's layout (a repartition adds or retires partitions)."""
        ctx = FetchContext(
            name=self.name,
            queue=self.queue,
            lease_ttl=self._lease_ttl,
            retention_ms=self._retention_ms,
            claim_batch=self._claim_batch,
            replication=self._replication,
            slots=self._slots,
            running=self._running,
            counts=self._counts,
            dead_elsewhere=self._dead_elsewhere,
            expired=self._expired,
            hand_back=lambda running: self._hand_back(running, self._finisher),
        )
        self._telemetry.banner(
            self.name, sorted(self._routes), self._concurrency, self._grace_period
        )
        async with send, anyio.create_task_group() as tg:

            async def follow() -> None:
                for partition in range(self._parts.layout.count):
                    if partition not in self._fetchers:
                        fetcher = Fetcher(ctx, self._parts.keys(partition))
                        self._fetchers[partition] = fetcher
                        await tg.start(fetcher.run, client, send.clone())
                for partition, fetcher in list(self._fetchers.items()):
                    if partition >= self._parts.layout.count:
                        fetcher.retire()
                        del self._fetchers[partition]

            await follow()
            task_status.started()
            while True:
                with anyio.move_on_after(LAYOUT_POLL):
                    await self._stopped.wait()
                if self._stopped.is_set():
                    break
                try:
                    if await _layout.refresh(client, self._parts):
                        logger.info(
                            "queue %r: partition layout is now %s",
                            self.queue,
                            self._parts.layout.text(),
                        )
                        await follow()
                except REDIS_FAILURES as exc:
                    logger.debug("could not read the partition layout: %s", exc)
                except ConfigurationError as exc:  # a damaged layout: keep ours
                    logger.error(
                        "queue %r: %s; going on with the layout %s",
                        self.queue,
                        exc,
                        self._parts.layout.text(),
                    )

    # -- running -----------------------------------------------------------

    async def _work_loop(
        self, receive: MemoryObjectReceiveStream[Running], finisher: Finisher
    ) -> None:
        async with receive:
            async for running in receive:
                if self._slots.closed:
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
                    self._slots.give(1)

    def _hand_back(self, running: Running, finisher: Finisher) -> None:
        claimed = running.claimed
        finisher.submit(_scripts.Outcome(claimed.id, claimed.token, "back"))

    def _submit(self, outcome: _scripts.Outcome, notice: DeadLetter | None) -> None:
        if notice is not None and self._on_dead is not None:
            self._dead_notices[outcome.id] = notice
        self._finisher.submit(outcome)

    def _expired(self, ids: Sequence[str]) -> None:
        for task_id in ids:
            self._telemetry.emit(EventKind.EXPIRED, None, task_id=task_id)

    def _dead_elsewhere(self, client: Client, ids: Sequence[str]) -> None:
        """Call on_dead for tasks a script dead-lettered on its own (a lease
        that expired on the last attempt, damaged keys)."""
        self._telemetry.dead_elsewhere(ids)
        if ids and self._on_dead is not None and self._side_tasks is not None:
            self._side_tasks.start_soon(self._notify_dead, client, ids)

    async def _notify_dead(self, client: Client, ids: Sequence[str]) -> None:

        try:
            rows = []
            for keys, mine in by_partition(self._parts, ids).items():
                rows += await _scripts.dead_rows_by_id(client, keys, mine)
        except REDIS_FAILURES as exc:
            logger.warning("could not read dead letters %s for on_dead: %s", ids, exc)
            return
        for row in rows:
            await self._call_on_dead(dead_letter(row))

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

    async def _heartbeat_loop(self, client: Client) -> None:
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

    async def _heartbeat(self, client: Client) -> None:
        with contextlib.suppress(*REDIS_FAILURES):
            await self._identity.renew(client)
        snapshot = list(self._running.values())
        # One call per partition holding leases; partition 0 (the registry's)
        # always, to keep this consumer registered.
        mine: dict[QueueKeys, list[Running]] = {self._keys: []}
        for running in snapshot:
            mine.setdefault(self._parts.of_id(running.claimed.id), []).append(running)

        async def renew(keys: QueueKeys) -> None:
            await self._renew(client, keys, mine[keys], len(snapshot))

        await each_partition(list(mine), renew)

    async def _renew(
        self, client: Client, keys: QueueKeys, snapshot: list[Running], total: int
    ) -> None:
        sent_at = anyio.current_time()
        registry = keys.partition == 0
        extended = True
        try:
            alive = await _scripts.heartbeat(
                client,
                keys,
                [(r.claimed.id, r.claimed.token) for r in snapshot],
                lease_ms=round(self._lease_ttl * 1000),
                consumer=self.name if registry else None,
                registration=self._registration(total) if registry else (),
                replication=self._replication,
            )
        except _scripts.NotReplicatedRefusal as refusal:
            # The server's answers stand (a lost lease is lost), but a
            # failover now could take the extension back: keep the deadlines.
            logger.warning("no replica acknowledged a heartbeat in time")
            alive, extended = [int(code) for code in refusal.ids], False
        except REDIS_FAILURES as exc:
            # Each handler stops by itself at its local lease deadline.
            logger.warning("heartbeat failed (%s)", exc)
            return
        deadline = sent_at + local_lease(self._lease_ttl)
        for running, code in zip(snapshot, alive, strict=True):
            if self._running.get(running.claimed.id) is not running:
                continue  # finished while the heartbeat was in flight
            if code == _scripts.LOST:
                running.lost = True
                running.lease_scope.cancel()
                continue
            if extended:
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
