"""Claiming: one fetcher per partition of the queue, sharing the consumer's
free handler slots.

Each fetcher blocks on its own partition's wake list (``BLPOP`` cannot span
cluster slots, so one connection each), claims with ``claim.lua`` whenever it
is woken, and hands what it claimed to the consumer's workers. The free slots
are a :class:`SlotPool`: a fetcher reserves slots before it claims (so that
fetchers claiming at once never hand out more tasks than there are slots),
gives back what it did not fill, and waits its turn when there are none: the
fetcher that waited longest is served first, so a partition with a deep
backlog cannot starve the others.

:class:`Fetchers` runs one fetcher per partition of the consumer's share
(``share.py``: every partition of a queue of one, or of a fleet no larger
than ``partition_replicas``) and follows the layout and the share: a
repartition, a consumer that joins or leaves, adds or retires fetchers. At
start, every partition of the layout gives back what a previous incarnation
of our name held there (served or not); a fetcher that retires gives back
first what a lost reply may have claimed.

A claim refused for a damaged queue key (``damage.py``) changes nothing: the
fetcher tries again every :data:`~.damage.PROBE` seconds until the key is
repaired. At start, a damaged key refuses the consumer instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
from redis.asyncio.cluster import RedisCluster

from .._limits import START_WINDOW
from .._store import layout as _layout, scripts as _scripts
from .._store.connection import REDIS_FAILURES, socket_timeout
from .._store.wrongtype import is_wrong_type
from ..errors import ConfigurationError, CorruptQueueError, QueueFullError
from .damage import PROBE, DamageWatch
from .leases import local_lease
from .running import Running
from .share import Share, trim_idle

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .._store.connection import Client
    from .._store.keys import QueueKeys
    from .._store.partition import Partitions
    from .handoff import Handoff
    from .outcomes import Counters, Outcomes

logger = logging.getLogger("aiogroupq.consumer")

T = TypeVar("T")

#: seconds between two reads of the queue's partition layout (a repartition
#: reaches every consumer within this)
LAYOUT_POLL: Final = 1.0
#: longest a fetcher blocks on the wake list before it claims anyway
MAX_BLOCK: Final = 1.0
#: slack for the server's cron tick, on which blocking pops time out
_SERVER_TICK: Final = 0.25
#: what a blocking pop waits beyond its timeout: the pop's own timeout
#: wakes us, not the server's cron tick cutting a shorter one off
_POP_SLACK: Final = 0.1
#: Redis errors after which the fetcher backs off and tries again
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 5.0


class SlotPool:
    """A consumer's free handler slots, handed to its fetchers in turn."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.closed = False
        self._waiters: deque[asyncio.Event] = deque()

    async def take(self, most: int) -> int:
        """Reserve between 1 and *most* slots, waiting for one to be free and
        for the fetchers that asked earlier; 0 once the pool is closed."""
        if self._is_closed():
            return 0
        if self.free > 0 and not self._waiters:
            return self._grab(most)
        event = asyncio.Event()
        self._waiters.append(event)
        try:
            await event.wait()
        except BaseException:
            self._waiters.remove(event)
            self._pass_on()  # it may have been this one's turn
            raise
        self._waiters.remove(event)
        if self._is_closed():
            return 0
        return self._grab(most)

    def give(self, n: int) -> None:
        """Return *n* slots (a task ended, or a claim filled fewer)."""
        self.free += n
        self._pass_on()

    def close(self) -> None:
        """Stop handing out slots: every waiting and later take gets 0."""
        self.closed = True
        for event in self._waiters:
            event.set()

    def _is_closed(self) -> bool:
        return self.closed

    def _grab(self, most: int) -> int:
        n = min(self.free, most)
        self.free -= n
        self._pass_on()
        return n

    def _pass_on(self) -> None:
        if self.free > 0 and self._waiters and not self._waiters[0].is_set():
            self._waiters[0].set()


class Outage:
    """Whether the fetchers of one run are cut off from Redis, and since
    when: each failure is logged where it happens (as a warning, again at
    every try), and the end of the outage once, here, by whichever fetcher
    gets through first."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        #: when the first failure of the current outage happened (monotonic)
        self.since: float | None = None

    def failed(self) -> None:
        """A call to Redis failed (not a refusal: the server did not answer)."""
        if self.since is None:
            self.since = time.monotonic()

    def succeeded(self) -> None:
        """A call to Redis succeeded: an outage, if any, is over."""
        if self.since is not None:
            logger.info(
                "Redis reachable again after %.1f s", time.monotonic() - self.since
            )
            self.since = None


@dataclass(slots=True)
class FetchContext:
    """What the fetchers of one consumer's run share."""

    name: str
    queue: str
    lease_ttl: float
    retention_ms: int
    claim_batch: int
    replication: _scripts.Replication | None
    slots: SlotPool
    running: dict[str, Running]
    counters: Counters
    #: takes claimed tasks that will not run here: handed back unstarted (a
    #: claim no replica acknowledged), expired, dead-lettered by a script
    outcomes: Outcomes
    #: the run's damaged keys
    watch: DamageWatch
    #: the task types of batch handlers and their sizes (claim.lua takes a
    #: batch's members with its head); empty: no batch handler
    batches: tuple[tuple[str, int], ...] = ()
    #: whether Redis answers the fetchers (one "reachable again" an outage)
    outage: Outage = field(default_factory=Outage)
    #: the consumer's share of the partitions (None: every partition)
    share: Share | None = None

    def local_lease(self) -> float:
        """Seconds a claim or heartbeat keeps a handler running."""
        return local_lease(self.lease_ttl)


class Fetchers:
    """One run's fetchers, one per partition of the consumer's share
    (:class:`~.share.Share`; without one, of the queue's layout).

    :param parts: the queue's partitions, whose layout they follow
    :param ctx: what the fetchers share
    """

    def __init__(self, parts: Partitions, ctx: FetchContext) -> None:
        self.ctx = ctx
        self._parts = parts
        self._fetchers: dict[int, Fetcher] = {}
        self._stopped = asyncio.Event()

    async def top_up(
        self, client: Client, head: Running, task_type: str, most: int
    ) -> int:
        """Add up to *most* tasks of *head*'s group's line to its batch
        (``batch_extend.lua``), held and leased as claimed ones; return how
        many, or -1 when the batch must not grow any more (see
        :data:`~.batch.TopUp`).

        A call that failed (or was cancelled) may have run and its reply been
        lost: members we do not know may be claimed for the batch. The batch
        is then abandoned unstarted (:meth:`~.runner.Running.abandon`): no
        outcome, no renewal; its leases expire and recovery brings it back
        whole, in order."""
        ctx = self.ctx
        keys = self._parts.of_id(head.claimed.id)
        sent_at = anyio.current_time()
        try:
            added = await _scripts.batch_extend(
                client,
                keys,
                ctx.name,
                head.claimed,
                task_type,
                most=most,
                lease_ms=round(ctx.lease_ttl * 1000),
                replication=ctx.replication,
            )
        except Exception as exc:  # noqa: BLE001 - any failure: the reply is lost
            logger.warning(
                "could not top up the batch of %s (%s); the batch is abandoned "
                "unstarted and comes back when its leases expire",
                head.claimed.id,
                exc,
            )
            head.abandon()
            return -1
        except BaseException:  # the shutdown's cancellation: as lost a reply
            head.abandon()
            raise
        deadline = sent_at + ctx.local_lease()
        members = []
        for claimed in added.tasks:
            running = Running(claimed, deadline=deadline, start_by=head.start_by)
            running.head = head
            ctx.running[claimed.id] = running
            members.append(running)
        ctx.counters.claimed += len(members)
        if not added.replicated:
            # Not started: a failover could lose the claim (as a claim's).
            # The batch runs as it is: a next top-up could take tasks behind
            # these before their hand-back is recorded.
            for running in reversed(members):
                ctx.outcomes.hand_back(running)
            return -1
        head.members = [*head.members, *members]
        return len(members)

    def _alone(self) -> bool:
        return self._parts.layout.count == 1

    def stop(self) -> None:
        """Stop claiming: close the slots and wake every fetcher."""
        self.ctx.slots.close()
        self._stopped.set()
        for fetcher in self._fetchers.values():
            fetcher.wake()

    async def run(
        self,
        client: Client,
        send: Handoff,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run one fetcher per partition served, claiming when this reports
        started; follow the layout and the share until stopped; close
        *send* once every fetcher is done (the workers end then)."""
        try:
            await self._run(client, send, task_status)
        finally:
            send.close()

    async def _run(
        self, client: Client, send: Handoff, task_status: TaskStatus[None]
    ) -> None:
        share = self.ctx.share
        async with anyio.create_task_group() as tg:

            async def follow(*, starting: bool = False) -> bool:
                """Start and retire fetchers to match the layout and the
                share; whether any retired. Starting, a partition outside
                the share gets a fetcher that only recovers, then ends."""
                count = self._parts.layout.count
                serve = (
                    frozenset(range(count)) if share is None else await share.of(count)
                )
                for partition in range(count):
                    if partition in self._fetchers or not (
                        starting or partition in serve
                    ):
                        continue
                    fetcher = Fetcher(
                        self.ctx,
                        self._parts.keys(partition),
                        starting=starting,
                        alone=self._alone,
                    )
                    if partition in serve:
                        self._fetchers[partition] = fetcher
                    else:
                        fetcher.retired = True
                    await tg.start(fetcher.run, client, send)
                retired = [p for p in self._fetchers if p not in serve]
                for partition in retired:
                    self._fetchers.pop(partition).retire()
                if share is not None:
                    share.record(frozenset(self._fetchers), count)
                return bool(retired)

            # A queue of one partition is served by every consumer: no
            # registry read at start, nor while it stays one.
            if share is not None and self._parts.layout.count > 1:
                await share.read(client, self._parts.keys(0))
            await follow(starting=True)
            task_status.started()
            await self._follow_until_stopped(client, share, follow)

    async def _follow_until_stopped(
        self,
        client: Client,
        share: Share | None,
        follow: Callable[[], Coroutine[Any, Any, bool]],
    ) -> None:
        """Re-read the layout every :data:`LAYOUT_POLL` seconds and the
        registry every third of the lease, following both, until stopped;
        close the idle connections a shrunk share left (a tick later, once
        the retired fetchers let go of theirs)."""
        queue = self.ctx.queue
        registry_read = anyio.current_time()
        trim = False
        while True:
            with anyio.move_on_after(LAYOUT_POLL):
                await self._stopped.wait()
            if self._stopped.is_set():
                break
            if trim:
                await trim_idle(client)
            changed = False
            if (
                share is not None
                and self._parts.layout.count > 1
                and anyio.current_time() - registry_read >= share.every
            ):
                registry_read = anyio.current_time()
                changed = await share.read(client, self._parts.keys(0))
            try:
                if await _layout.refresh(client, self._parts):
                    logger.info(
                        "queue %r: partition layout is now %s",
                        queue,
                        self._parts.layout.text(),
                    )
                    changed = True
                self.ctx.watch.succeeded("layout")
            except REDIS_FAILURES as exc:
                logger.debug("could not read the partition layout: %s", exc)
            except CorruptQueueError as exc:  # conf is damaged: keep ours
                keys = self._parts.keys(0)
                self.ctx.watch.refused("layout", exc, leases=keys.leases)
            except ConfigurationError as exc:  # a damaged layout: keep ours
                logger.error(
                    "queue %r: %s; going on with the layout %s",
                    queue,
                    exc,
                    self._parts.layout.text(),
                )
            trim = await follow() if changed else False


class Fetcher:
    """Claims from one partition until the pool closes or :meth:`retire`.

    :param starting: the consumer is starting: a damaged key met by the
        first call raises :class:`~aiogroupq.CorruptQueueError` out of
        :meth:`run` before it reports started
    """

    def __init__(
        self,
        ctx: FetchContext,
        keys: QueueKeys,
        *,
        starting: bool = False,
        alone: Callable[[], bool] = lambda: True,
    ) -> None:
        self.ctx = ctx
        self.keys = keys
        #: whether this fetcher's partition is its queue's only one now
        self.alone = alone
        self._lease_ms = round(ctx.lease_ttl * 1000)
        self.retired = False
        self._starting = starting
        self._who = f"fetch:{keys.partition}"
        # The task blocked in _block, which wake() cancels; whether it did.
        self._blocked: asyncio.Task[Any] | None = None
        self._woken = False
        # Wake tokens being pushed for a delayed task falling due.
        self._pokes: set[asyncio.Future[None]] = set()

    def wake(self) -> None:
        """Cut a blocking wait short (stopping, or retiring)."""
        if self._blocked is not None and not self._woken:
            self._woken = True
            self._blocked.cancel()

    def retire(self) -> None:
        """Stop after the current claim (the partition left the layout)."""
        self.retired = True
        self.wake()

    async def run(
        self,
        client: Client,
        send: Handoff,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        ctx, keys = self.ctx, self.keys
        block_cap = MAX_BLOCK
        if (limit := socket_timeout(client)) is not None:
            # A blocking pop longer than the socket timeout would be cut off.
            block_cap = max(0.05, min(MAX_BLOCK, limit - 0.5, limit / 2))
        backoff = _BACKOFF_FIRST
        # A previous incarnation with our name may have died holding tasks:
        # they go back to the front of their groups now, not at lease expiry.
        reconcile: bool | None = True
        # Also the start's check of the queue's keys: a damaged one refuses
        # the consumer (CorruptQueueError) rather than leave it started and
        # claiming nothing.
        if self._starting and await self._recover(client, True, backoff, strict=True):
            reconcile = None
        task_status.started()
        watch = ctx.watch
        # The wait for work before the next claim: its timeout in seconds,
        # and whether a delayed task falls due when it ends (None: claim now).
        wait: tuple[float, bool] | None = None
        while not ctx.slots.closed and not self.retired:
            if watch.holds_claims():
                # Leases wait to be set again (damage.py): a claim now
                # would recover them first.
                wait = None
                await self._block(None, PROBE)
                continue
            if reconcile is not None:
                wait = None
                if not await self._recover(client, reconcile, backoff):
                    backoff = await self._back_off(backoff, self._pause(backoff))
                    continue
                reconcile = None
            if wait is not None and not self._pops_with_claim(client, wait[0]):
                await self._block(client, wait[0], due=wait[1])
                wait = None
                continue
            k = await ctx.slots.take(ctx.claim_batch)
            if k == 0:
                continue  # closed
            sent_at = anyio.current_time()
            try:
                if wait is None:
                    reply = await self._claim(client, k)
                else:
                    # Written behind the wait for work, on one connection:
                    # the server claims the moment a wake token comes.
                    claimed = await self._waiting(
                        client, wait[0], wait[1], self._claim(client, k, pop=wait[0])
                    )
                    if claimed is None:
                        # Stopping: what the claim may have taken is given
                        # back as the consumer stops (leases.py, release).
                        ctx.slots.give(k)
                        continue
                    reply = claimed[0]
            except CorruptQueueError as exc:  # refused before writing
                ctx.slots.give(k)
                wait = None
                watch.refused(self._who, exc, leases=keys.leases)
                backoff = await self._back_off(backoff, min(backoff, PROBE))
                continue
            except (*REDIS_FAILURES, QueueFullError) as exc:
                ctx.slots.give(k)
                wait = None
                if not isinstance(exc, QueueFullError):
                    ctx.outage.failed()
                # QueueFullError: Redis is out of memory and refused the
                # claim before it ran; work in flight can still finish.
                logger.warning("claim failed (%s); retrying in %.2fs", exc, backoff)
                # The script may have run and its reply been lost: what it
                # claimed sits in our recovery key; give it back first.
                reconcile = False
                backoff = await self._back_off(backoff)
                continue
            wait = None
            ctx.outage.succeeded()
            # A batch's members come with their head, in its handler slot.
            heads = sum(not claimed.member for claimed in reply.tasks)
            ctx.slots.give(k - heads)
            watch.succeeded(self._who)
            backoff = _BACKOFF_FIRST
            self._hand_out(reply, sent_at, send)
            if reply.pop_error is not None:
                await self._pop_failed(reply.pop_error)
            if not reply.replicated:
                ctx.slots.give(heads)
                # Not started: a failover now could lose the claim, and
                # the task would run twice at once. Wait for a replica.
                logger.warning(
                    "no replica acknowledged a claim of %d tasks in time; "
                    "handed back unstarted, retrying in %.2fs",
                    len(reply.tasks),
                    backoff,
                )
                backoff = await self._back_off(backoff)
                continue
            if heads == k or reply.more:
                continue
            # A pop ends up to a server tick (~100 ms) after its timeout:
            # a task due within a tick past the cap gets the timer too.
            due = 0 <= reply.wait_ms < (block_cap + _SERVER_TICK) * 1000
            wait = (reply.wait_ms / 1000 if due else block_cap, due)
            if heads:
                # Nothing more to claim now: the workers start what was
                # handed out before the wait for work is written, whose
                # sending would otherwise come first (an idle pickup's
                # handler started about 0.3 ms after the claim's reply).
                await asyncio.sleep(0)
        if self.retired and reconcile is not None and not ctx.slots.closed:
            # Leaving the partition: what a lost reply claimed goes back now,
            # not when its lease ends (stopping, the release gives it back).
            await self._recover(client, reconcile, backoff)

    async def _back_off(self, backoff: float, pause: float | None = None) -> float:
        """The one way a fetcher backs off after a failed or refused call:
        wait *pause* (default: *backoff*) unless woken, and return the
        next backoff, doubled up to its cap."""
        await self._block(None, backoff if pause is None else pause)
        return min(backoff * 2, _BACKOFF_MAX)

    async def _claim(
        self, client: Client, k: int, *, pop: float | None = None
    ) -> _scripts.ClaimReply:
        ctx = self.ctx
        return await _scripts.claim(
            client,
            self.keys,
            ctx.name,
            k=k,
            lease_ms=self._lease_ms,
            scan_limit=k + 64,
            retention_ms=ctx.retention_ms,
            replication=ctx.replication,
            batches=ctx.batches,
            pop=None if pop is None else _pop_timeout(pop),
        )

    def _pops_with_claim(self, client: Client, timeout: float) -> bool:
        """Whether the next claim can be written behind a wait for work of
        *timeout*: a plain client, no replicas to wait for, the queue's only
        partition (the claim holds its slots while it waits, which no other
        fetcher of this consumer needs then), and a wait short beside the
        lease and the start window, both counted from before the wait."""
        ctx = self.ctx
        return (
            self.alone()
            and ctx.replication is None
            and not isinstance(client, RedisCluster)
            and _pop_timeout(timeout) <= min(ctx.local_lease() / 4, START_WINDOW / 2)
        )

    async def _recover(
        self, client: Client, counted: bool, backoff: float, *, strict: bool = False
    ) -> bool:
        """Give back what our name holds but does not run (counting the
        attempt when a previous incarnation ran it); False if Redis failed
        or refused (with *strict*, a refusal raises)."""
        ctx = self.ctx
        try:
            done = await _scripts.recover_reasons(
                client,
                self.keys,
                ctx.name,
                counted=counted,
                retention_ms=ctx.retention_ms,
                keep=[i for i in ctx.running if self.keys.owns(i)],
            )
        except CorruptQueueError as exc:
            if strict:
                raise
            ctx.watch.refused(self._who, exc, leases=self.keys.leases)
            return False
        except REDIS_FAILURES as exc:
            logger.warning("recovery failed (%s); retrying in %.2fs", exc, backoff)
            ctx.outage.failed()
            return False
        ctx.outage.succeeded()
        ctx.watch.succeeded(self._who)
        given_back = done.given_back
        ctx.outcomes.dead_elsewhere(done.dead, done.reasons)
        if given_back:
            logger.warning(
                "consumer %s gave back %d tasks it held but was not running (%s)",
                ctx.name,
                given_back,
                "previous incarnation" if counted else "lost reply",
            )
        return True

    def _hand_out(
        self,
        reply: _scripts.ClaimReply,
        sent_at: float,
        send: Handoff,
    ) -> None:
        """Pass a claim sent at *sent_at* to the workers, leased from then
        and to start within its start window (or back, unstarted, when no
        replica acknowledged the claim); report what else the claim found."""
        ctx = self.ctx
        for problem in reply.problems:
            logger.error(
                "queue %r is damaged: %s; run 'aiogroupq check --repair'",
                ctx.queue,
                problem,
            )
        ctx.outcomes.dead_elsewhere(reply.dead, reply.reasons)
        if reply.expired:
            ctx.outcomes.expired(reply.expired)
        # From when the claim was sent: the server claimed after that, so
        # neither the lease nor the start window is counted from too late.
        deadline = sent_at + ctx.local_lease()
        start_by = sent_at + START_WINDOW
        held, replicated = ctx.running, reply.replicated
        heads: list[Running] = []
        for claimed in reply.tasks:
            running = Running(claimed, deadline=deadline, start_by=start_by)
            held[claimed.id] = running
            if claimed.member and heads:
                running.head = heads[-1]
                heads[-1].members = [*heads[-1].members, running]
            else:
                heads.append(running)
        for running in heads:
            if replicated:
                send.put(running)
            else:
                ctx.outcomes.hand_back(running)
        ctx.counters.claimed += len(reply.tasks)

    async def _block(
        self, client: Client | None, timeout: float, *, due: bool = False
    ) -> None:
        """Wait up to *timeout* for a wake token (or just sleep without client)."""
        if client is None:
            await self._waiting(None, timeout, due, asyncio.sleep(timeout))
        else:
            await self._waiting(client, timeout, due, self._pop(client, timeout))

    async def _waiting(
        self,
        client: Client | None,
        timeout: float,
        due: bool,
        waiting: Coroutine[Any, Any, T],
    ) -> tuple[T] | None:
        """Run *waiting*, a wait for work of up to *timeout*; return its
        result, or None when :meth:`wake` cut it short (or the fetcher was
        stopped before it began: *waiting* is then closed unstarted).

        With *due*, a delayed task falls due when *timeout* ends. The server
        ends blocking pops on its cron tick (10 per second by default), too
        coarse for that, so a local timer pushes a token at the precise time.
        """
        if self.ctx.slots.closed or self.retired:
            waiting.close()
            return None
        # Plain asyncio (no cancel scope, no task group): this is on the way
        # from a wake token to the claim, the idle pickup's latency.
        task = asyncio.current_task()
        assert task is not None
        self._blocked, self._woken = task, False
        poke = None
        if due and client is not None:
            poke = task.get_loop().call_later(timeout, self._start_poke, client)
        try:
            return (await waiting,)
        except asyncio.CancelledError:
            # Our wake() alone is taken back; anything else (the consumer's
            # cancellation) goes on.
            if not self._woken or task.uncancel() > 0:
                raise
            return None
        finally:
            self._blocked, self._woken = None, False
            if poke is not None:
                poke.cancel()
            for pushing in self._pokes:  # as the wait itself, over
                pushing.cancel()

    async def _pop(self, client: Client, timeout: float) -> None:
        try:
            await client.blpop([self.keys.wake], timeout=_pop_timeout(timeout))
        except REDIS_FAILURES as exc:
            await self._pop_failed(exc)

    async def _pop_failed(self, exc: Exception) -> None:
        if is_wrong_type(exc):
            # The wake list holds another type: the next claim is refused
            # too, and says the same.
            damage = CorruptQueueError(self.keys.wake, str(exc))
            self.ctx.watch.refused(self._who, damage, leases=self.keys.leases)
            await asyncio.sleep(PROBE)
        else:
            logger.warning("waiting for work failed (%s)", exc)
            self.ctx.outage.failed()
            await asyncio.sleep(_BACKOFF_FIRST)

    def _pause(self, backoff: float) -> float:
        """How long to wait before trying again: *backoff*, or at most
        :data:`~.damage.PROBE` while a key is damaged (to resume soon after
        the repair)."""
        return min(backoff, PROBE) if self.ctx.watch.damaged else backoff

    def _start_poke(self, client: Client) -> None:
        poke = asyncio.ensure_future(self._poke(client))
        self._pokes.add(poke)
        poke.add_done_callback(self._pokes.discard)

    async def _poke(self, client: Client) -> None:
        # On failure the pop's own timeout wakes us a little later.
        with contextlib.suppress(*REDIS_FAILURES):
            await client.rpush(self.keys.wake, "1")


def _pop_timeout(timeout: float) -> float:
    """The ``BLPOP`` timeout of a wait for work of *timeout* seconds."""
    return max(timeout, 0.01) + _POP_SLACK
